"""Which node holds a pipeline's flow back (issue 46), judged from the nodes' time accounting.

In a chain the symptom shows upstream and the cause downstream: a slow node is busy all the time, the
objects waiting at its input wait longer and longer, and the nodes feeding it find their sends blocked
or refused (backpressured). Flink colours its tasks the same way (busy, backpressured and idle time per
second; OK up to 10%, LOW up to 50%, HIGH above); ``held_back_by`` names the nodes that are the cause.

Pure: it reads only the points and edges given, never a clock, a file or a store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from flowstat.schema.sample import STATE_DOWN, STATE_STOPPED, STATE_UP, time_ns

# The window judged: ten samples at the default 1 Hz, long enough that a pause (a GC, a burst of
# large objects) averages out, short enough that the verdict follows a change within seconds.
WINDOW_S: Final = 10.0
# The shares (busy, backpressured) are judged over the window's last 5 s, the latency's trend over
# all of it: a slowdown shows in the shares at once but a mean over 10 s reaches 90% busy only 9 s
# after it began (9 readings at 1 Hz); over 5 s it names the node within 5 s (issue 46's target: 10).
SHARE_WINDOW_S: Final = 5.0
# Busy at least 90% of the time: a node that is the pipeline's limit has no idle time left (Flink's
# HIGH starts above 50%, but a node half busy still has room); the tenth left allows for the time
# between a node's polls that its accounting counts as idle even when input waits.
BUSY_HIGH: Final = 0.90
# Backpressured at most 10% is Flink's OK: a node whose own sends block more than that is held back
# itself (the cause is further down), and an upstream node blocked more than that is the symptom.
# (With shares adding up to 1, busy >= 0.90 leaves at most 0.10 backpressured: the node's own check
# bites only on reported ratios that do not add up exactly, and keeps the rule whole if BUSY_HIGH moves.)
BACKPRESSURE_OK: Final = 0.10
# Input latency growing by half over the window: a queue building up in front of the node (a node
# keeping up holds its latency steady, within jitter far below half).
LATENCY_GROWTH: Final = 1.5
# ...and by at least 10 ms: sub-millisecond latencies double on noise alone (0.2 -> 0.4 ms says nothing).
LATENCY_GROWTH_MIN_MS: Final = 10.0
# How often a store's runs are judged (flowstat verdict's default interval): the alert "pipeline
# held back" counts on this many verdicts a minute (flowstat.views.alerts).
VERDICT_EVERY_S: Final = 5

# At least three accounted samples in the shares' window: fewer show a single interval, not a share
# (and no trend); its 5 s hold 3 at a sampling interval of up to 2 s.
MIN_POINTS: Final = 3
# A node reporting one of these has ended: it holds nothing back any more.
FINAL_STATES: Final = frozenset({STATE_STOPPED, STATE_DOWN})

# Shares are rounded to 9 decimals, so that a mean of equal ratios is that ratio (a float sum would
# put 0.9 + 0.9 + 0.9 a hair off 3 x 0.9), and thresholds hold exactly at their edges.
_SHARE_DIGITS = 9

Kind = Literal["held_back", "none", "unknown"]


@dataclass(frozen=True)
class Point:
    """One sample of one node: its time (Unix seconds), the shares of the interval before it spent
    busy, backpressured and idle (0..1; None when the node does not account its time), the median
    input latency (ms) and its state."""

    t: float
    busy: float | None
    backpressured: float | None
    idle: float | None
    input_latency_ms: float | None
    state: str = "RUNNING"


@dataclass(frozen=True)
class Verdict:
    """``kind``: held_back (``nodes`` hold the flow back, most busy first), none (every node keeps
    up) or unknown (the evidence is missing; ``evidence`` says what). ``evidence`` is one line;
    ``at`` the window's end."""

    kind: Kind
    nodes: tuple[str, ...]
    evidence: str
    at: float


@dataclass(frozen=True)
class _Shares:
    busy: float
    backpressured: float


def held_back_by(
    series: Mapping[str, Sequence[Point]],
    upstream: Mapping[str, Sequence[str]],
    at: float,
    window_s: float = WINDOW_S,
) -> Verdict:
    """Which nodes hold the flow back in the window ``at - window_s < t <= at``.

    ``series``: each node's points (any order); ``upstream``: each node's feeders (the nodes it
    takes from). A node holds the flow back when its busy share is at least BUSY_HIGH, its own
    backpressured share at most BACKPRESSURE_OK, and either its input latency grows over the window
    (the last p50 at least LATENCY_GROWTH times the first, and by LATENCY_GROWTH_MIN_MS) or one of
    its upstream nodes is backpressured more than BACKPRESSURE_OK. A share is the mean of a node's
    ratios over its accounted points in the window's last SHARE_WINDOW_S seconds, and exists only
    for MIN_POINTS of them or more (upstream nodes included). A node without upstream (a source) is
    never named.

    Ended nodes: a node whose latest point at or before ``at`` is in a final state (STOPPED, DOWN)
    has ended; it is neither named nor asked for evidence, and its backpressure is no evidence
    against a node it fed. Points in a final state are ignored everywhere.

    held_back: at least one node named (with ``; not judged: ...`` appended when other nodes fed by
    another lack evidence: a node named is a cause whatever the others do). none: every node fed by
    another that runs has enough evidence and keeps up (the evidence names the busiest of them).
    unknown, the evidence saying why: no edges; no node running (every node that reported has
    ended); no samples in the window; no node fed by another is running; or nothing named while a
    node fed by another has points without time accounting, or too few accounted points (no points
    in the window at all count as 0 of MIN_POINTS).
    """
    feeds = {node: tuple(sorted(set(ups) - {node})) for node, ups in upstream.items()}
    if not any(feeds.values()):
        return Verdict("unknown", (), "no edges: the nodes did not say who feeds them", at)
    nodes = sorted(set(series) | set(feeds) | {u for ups in feeds.values() for u in ups})
    ended = {node for node in nodes if _ended(series.get(node, ()), at)}
    windows = {node: _window(series.get(node, ()), at, window_s) for node in nodes if node not in ended}
    if not any(windows.values()):
        reason = "no node running" if ended else f"no samples in the last {window_s:g} s"
        return Verdict("unknown", (), reason, at)
    candidates = [node for node in windows if feeds.get(node)]
    if not candidates:
        return Verdict("unknown", (), "no node fed by another is running", at)

    recent = {node: [p for p in points if p.t > at - min(SHARE_WINDOW_S, window_s)] for node, points in windows.items()}
    shares = {node: s for node, points in recent.items() if (s := _shares(points)) is not None}
    unaccounted = [node for node in candidates if windows[node] and not any(map(_accounted, windows[node]))]
    too_few = [
        (node, sum(map(_accounted, recent[node])))
        for node in candidates
        if node not in shares and node not in unaccounted
    ]
    judged = sorted((node for node in candidates if node in shares), key=lambda n: (-shares[n].busy, n))

    lines = []
    for node in judged:
        own = shares[node]
        if own.busy < BUSY_HIGH or own.backpressured > BACKPRESSURE_OK:
            continue
        latency = _latencies(windows[node])
        pushed = sorted(
            ((u, shares[u].backpressured) for u in feeds[node] if u in shares),
            key=lambda ub: (-ub[1], ub[0]),
        )
        pushed = [(u, bp) for u, bp in pushed if bp > BACKPRESSURE_OK]
        if pushed or (len(latency) >= 2 and _grows(latency[0], latency[-1])):
            lines.append((node, _line(node, own, latency, pushed)))

    missing = []
    if unaccounted:
        missing.append("no time accounting from " + ", ".join(unaccounted))
    if too_few:
        counts = ", ".join(f"{node} has {n} of {MIN_POINTS}" for node, n in too_few)
        missing.append(f"too few samples: {counts} in the last {min(SHARE_WINDOW_S, window_s):g} s")

    if lines:
        evidence = "; ".join(line for _, line in lines)
        if missing:
            evidence += "; not judged: " + "; ".join(missing)
        return Verdict("held_back", tuple(node for node, _ in lines), evidence, at)
    if missing:
        return Verdict("unknown", (), "; ".join(missing), at)
    busiest = judged[0]
    return Verdict("none", (), f"every node keeps up (busiest: {busiest} busy {_pct(shares[busiest].busy)})", at)


def points_from_samples(samples: Iterable[Mapping[str, Any]]) -> dict[str, list[Point]]:
    """Each node's points, in time order, from samples as run files and stores hold them (the sample
    schema's keys: ``time`` an ISO-8601 string with a zone or Unix seconds, ``busy_ratio``,
    ``backpressured_ratio``, ``idle_ratio``, ``input_latency_p50_ms``, ``node_state``).

    Samples without a node_id are skipped. A time that is neither raises ValueError naming the
    sample's node and time; so does a ratio or latency that is not a number.
    """
    found: dict[str, list[Point]] = {}
    for sample in samples:
        node_id = sample.get("node_id")
        if node_id is None or node_id == "":
            continue
        node = str(node_id)
        t = epoch_seconds(sample.get("time"), f"sample of {node}")
        found.setdefault(node, []).append(
            Point(
                t=t,
                busy=_number(sample, "busy_ratio", node),
                backpressured=_number(sample, "backpressured_ratio", node),
                idle=_number(sample, "idle_ratio", node),
                input_latency_ms=_number(sample, "input_latency_p50_ms", node),
                state=str(sample.get("node_state") or STATE_UP),
            )
        )
    for points in found.values():
        points.sort(key=lambda p: p.t)
    return found


# -- the parts ----------------------------------------------------------------------------------------
def _ended(points: Sequence[Point], at: float) -> bool:
    """Whether the node's latest point at or before ``at`` says it has ended (of points at the same
    time, one in a final state wins: the order points come in does not matter)."""
    before = [(p.t, p.state in FINAL_STATES) for p in points if p.t <= at]
    return bool(before) and max(before)[1]


def _window(points: Sequence[Point], at: float, window_s: float) -> list[Point]:
    """The node's points in the window, not in a final state, in time order."""
    inside = [p for p in points if at - window_s < p.t <= at and p.state not in FINAL_STATES]
    return sorted(inside, key=lambda p: p.t)


def _accounted(point: Point) -> bool:
    return _finite(point.busy) and _finite(point.backpressured)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _shares(points: Sequence[Point]) -> _Shares | None:
    """Mean busy and backpressured shares over the accounted points, or None for too few of them."""
    accounted = [p for p in points if _accounted(p)]
    if len(accounted) < MIN_POINTS:
        return None
    return _Shares(
        busy=_mean(p.busy for p in accounted),
        backpressured=_mean(p.backpressured for p in accounted),
    )


def _mean(values: Iterable[float | None]) -> float:
    xs = [x for x in values if x is not None]
    return round(math.fsum(xs) / len(xs), _SHARE_DIGITS)


def _latencies(points: Sequence[Point]) -> list[float]:
    """The input latencies (p50, ms) of the points, in their order."""
    return [p.input_latency_ms for p in points if p.input_latency_ms is not None and math.isfinite(p.input_latency_ms)]


def _grows(first: float, last: float) -> bool:
    return last >= LATENCY_GROWTH * first and last - first >= LATENCY_GROWTH_MIN_MS


def _line(node: str, own: _Shares, latency: list[float], pushed: list[tuple[str, float]]) -> str:
    parts = [f"{node}: busy {_pct(own.busy)}"]
    if len(latency) >= 2:
        parts.append(f"input latency {_ms(latency[0])}->{_ms(latency[-1])} ms")
    else:
        parts.append(f"input latency {_ms(latency[0])} ms" if latency else "no input latency")
    if pushed:
        (first, bp), *others = pushed
        parts.append(f"upstream {first} backpressured {_pct(bp)}")
        parts.extend(f"{u} backpressured {_pct(b)}" for u, b in others)
    else:
        parts.append("upstream not backpressured")
    return ", ".join(parts)


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def _ms(value: float) -> str:
    """Whole milliseconds, or two significant digits below 10 ms (latencies are often sub-ms)."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def epoch_seconds(value: object, what: str) -> float:
    """Unix seconds from a stored document's time: a number, a string of one, or ISO 8601 with a
    zone; ValueError naming ``what`` (e.g. "sample of merger-0") and the time otherwise."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            try:
                return time_ns(value) / 1e9
            except ValueError as e:
                raise ValueError(f"{what}: bad time {value!r} ({e})") from None
    else:
        raise ValueError(f"{what}: bad time {value!r} (ISO 8601 with a zone, or Unix seconds)")
    if not math.isfinite(seconds):
        raise ValueError(f"{what}: bad time {value!r} (not finite)")
    return seconds


def _number(sample: Mapping[str, Any], key: str, node: str) -> float | None:
    value = sample.get(key)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"sample of {node} at {sample.get('time')!r}: {key} is not a number: {value!r}")
