"""The six alert conditions, defined once: Grafana's provisioned rules and ElastAlert2's rules are
generated from them, and ``evaluate`` applies them to a run file (the report, the tests' oracle).

Each condition is computed per group (a node, an agent, or a run and the nodes holding it back) over
a window that ends at the time of evaluation, as a few quantities (``Quantity``) combined by a
condition in disjunctive normal form: any of (all of (quantity > threshold)), a quantity possibly
less another (``Above.minus``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from flowstat.flow import VERDICT_EVERY_S as FLOW_VERDICT_EVERY_S
from flowstat.flow import WINDOW_S, held_back_by, points_from_samples
from flowstat.schema import sample as sample_schema
from flowstat.timeutil import iso_utc_from_ms

from .panels import AGENT, NODE, VERDICT

QUANTITIES = ("count", "last", "rise", "slope_per_min", "slope_buckets")
SLOPE_BUCKET_S = 10  # the slope is taken between 10 s means (GROUP BY time(10s) in InfluxQL)
EVALUATE_EVERY_S = 10  # Grafana's group interval, and how often ``evaluate`` looks
# How often flowstat verdict writes a verdict per run (issue 46): the held-back alert's counts, and its
# ElastAlert rule, rest on it; verdicts_from_samples judges a run file as often.
VERDICT_EVERY_S = FLOW_VERDICT_EVERY_S


@dataclass(frozen=True)
class Quantity:
    """A number per group over the window: ``count`` of samples, ``last`` value, ``rise`` (last
    minus first), ``slope_per_min`` (the mean of the per-minute derivative of 10 s means), or
    ``slope_buckets`` (how many 10 s buckets that mean is over: how much of the window it covers).
    Per the alert's group, or per ``per`` (a part of it: the run of a group of a run and its nodes)."""

    ref: str
    kind: str
    field: str
    where: tuple[tuple[str, object], ...] = ()  # samples with field == value (all of them)
    any_of: tuple[tuple[str, object], ...] = ()  # ... and with at least one of these field == value
    at_least: tuple[tuple[str, float], ...] = ()  # ... and with field >= value (all of them)
    per: tuple[str, ...] = ()  # taken per these labels of the alert's group instead of per the group

    def __post_init__(self) -> None:
        if self.kind not in QUANTITIES:
            raise ValueError(f"quantity {self.ref}: kind {self.kind!r} is not one of {QUANTITIES}")

    def matches(self, sample: dict) -> bool:
        return (
            all(sample.get(k) == v for k, v in self.where)
            and (not self.any_of or any(sample.get(k) == v for k, v in self.any_of))
            and all(isinstance(sample.get(k), int | float) and sample[k] >= v for k, v in self.at_least)
        )


@dataclass(frozen=True)
class Above:
    ref: str
    threshold: float
    minus: str | None = None  # a quantity subtracted first: ref - minus > threshold


@dataclass(frozen=True)
class AlertRule:
    uid: str
    title: str
    summary: str  # what it means, for the notification
    why: str  # why this threshold (docs/dashboards.md)
    source: str  # NODE, AGENT or VERDICT
    group: tuple[str, ...]
    window_s: int
    for_s: int
    quantities: tuple[Quantity, ...]
    condition: tuple[tuple[Above, ...], ...]  # any of (all of)

    def quantity(self, ref: str) -> Quantity:
        return next(q for q in self.quantities if q.ref == ref)

    def holds(self, values: dict[str, float]) -> bool:
        """The condition on one group's quantities (a missing one is no data: never above)."""

        def above(a: Above) -> bool:
            if a.ref not in values or (a.minus is not None and a.minus not in values):
                return False
            return values[a.ref] - (values[a.minus] if a.minus else 0.0) > a.threshold

        return any(all(above(a) for a in conj) for conj in self.condition)


ALERTS: tuple[AlertRule, ...] = (
    AlertRule(
        "flowstat-buffer-overload",
        "Buffer overloaded",
        "{{ $labels.node_id }} of run {{ $labels.run_id }}: its send or receive buffer was overloaded "
        "in the last minute",
        "Any overload: the thesis's first sign of a pipeline at its limit (section 5.1). A producer's send "
        "flag means a send was refused by a full buffer; a merger's receive flag that it had a full batch "
        "waiting at a read.",
        NODE,
        ("run_id", "node_id", "agent"),
        60,
        0,
        (
            Quantity(
                "A",
                "count",
                "node_state",
                any_of=(("send_buffer_overloaded", True), ("receive_buffer_overloaded", True)),
            ),
        ),
        ((Above("A", 0),),),
    ),
    AlertRule(
        "flowstat-merger-behind",
        "Merger falling behind",
        "{{ $labels.node_id }} of run {{ $labels.run_id }} is falling behind: its input latency p99 is over "
        "1 s and rising, or the objects in flight to it grow",
        "1 s is the online verdict's latency bound (docs/harness.md); rising, because a high but falling "
        "latency is a merger catching up. In flight growing by more than 1,000 objects in 30 s is a queue "
        "building faster than 33 objects/s.",
        NODE,
        ("run_id", "node_id", "agent"),
        30,
        30,
        (
            Quantity("A", "last", "input_latency_p99_ms", where=(("role", "merger"),)),
            Quantity("B", "rise", "input_latency_p99_ms", where=(("role", "merger"),)),
            Quantity("C", "rise", "objects_in_flight", where=(("role", "merger"),)),
        ),
        ((Above("A", 1000.0), Above("B", 0.0)), (Above("C", 1000.0),)),
    ),
    AlertRule(
        "flowstat-vmrss-growing",
        "Memory growing",
        "{{ $labels.node_id }} of run {{ $labels.run_id }}: VmRSS grew over 10 MB/min over the last 5 minutes",
        "The thesis's failure mode at 425 and 500 producers: a merger whose memory grows until it is killed. "
        "10 MB/min is the online verdict's memory bound (docs/harness.md). Over at least half the "
        "window (15 slopes between 10 s means): a process's first seconds, or a series that has just "
        "begun, give a slope from two buckets that a single step dominates.",
        NODE,
        ("run_id", "node_id", "agent"),
        300,
        0,
        (Quantity("A", "slope_per_min", "vmrss_kb"), Quantity("B", "slope_buckets", "vmrss_kb")),
        ((Above("A", 10 * 1024.0), Above("B", 14)),),
    ),
    AlertRule(
        "flowstat-node-down",
        "Node gone",
        "{{ $labels.node_id }} of run {{ $labels.run_id }} is gone (DOWN) before its run ended",
        "A node the agents saw vanish before the harness announced the run's end (an orderly end is "
        "reported STOPPED): a crash, a kill, the OOM killer.",
        NODE,
        ("run_id", "node_id", "agent"),
        60,
        0,
        (Quantity("A", "count", "node_state", where=(("node_state", sample_schema.STATE_DOWN),)),),
        ((Above("A", 0),),),
    ),
    AlertRule(
        "flowstat-agent-spooling",
        "Agent cannot deliver",
        "agent {{ $labels.agent }} on {{ $labels.host }} cannot deliver: its spool grew in the last minute",
        "Samples waiting on disk for a sink that does not take them; they are resent when it does, and "
        "dropped once the spool is full.",
        # The run too: an agent the harness starts lives for one run, and a series spanning two
        # agents' spools (one ended full, the next starting) would rise or fall for no reason.
        AGENT,
        ("run_id", "host", "agent"),
        60,
        0,
        (Quantity("A", "last", "spooled_samples"), Quantity("B", "rise", "spooled_samples")),
        ((Above("A", 0), Above("B", 0)),),
    ),
    AlertRule(
        "flowstat-held-back",
        "Pipeline held back",
        "run {{ $labels.run_id }} is held back by {{ $labels.held_back_by }}: every verdict of the last 60 s "
        "named them",
        "flowstat verdict's judgement (issue 46): busy all the time while their input waits longer or their "
        "feeders are blocked. For 60 s: a few seconds of it (a GC pause) is no limit. Every verdict of the run "
        "in the window names them (one that does not restarts the 60 s), at least 10: 12 at the service's 5 s, "
        "two may be missing.",
        VERDICT,
        ("run_id", "held_back_by"),
        60,
        0,
        (
            Quantity("A", "count", "held", at_least=(("held", 1),)),  # the group's: verdicts naming its nodes
            Quantity("B", "count", "held", per=("run_id",)),  # every verdict of the run
        ),
        ((Above("A", 60 // VERDICT_EVERY_S - 3), Above("A", -1, minus="B")),),  # A >= 10, A - B >= 0
    ),
)


# -- offline evaluation -------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """When an alert condition held for a group, having held ``for`` first (start and end in epoch s)."""

    alert: AlertRule
    labels: dict[str, str]
    start: float
    end: float


LABELS = ("run_id", "host", "agent", "node_id", "role")  # one value for a whole series of samples
VERDICT_LABELS = ("run_id", "held_back_by")  # ... of verdicts (verdict.schema.json's tags)


def labels_of(source: str) -> tuple[str, ...]:
    return VERDICT_LABELS if source == VERDICT else LABELS


@dataclass(frozen=True)
class Columns:
    """One series of samples as arrays, in time order (a node's samples by one agent, or an agent's
    self-samples): what ``evaluate`` reads. ``labels``: the fields of LABELS the series has (one value
    for all its samples); ``fields``: per sample, a number (NaN where absent; a flag is 1 or 0) or,
    for a text field, an object array (None where absent)."""

    labels: dict[str, str]
    t: np.ndarray  # epoch seconds
    fields: dict[str, np.ndarray]


def needed_fields(source: str) -> set[str]:
    """The per-sample fields the alerts on ``source`` (NODE, AGENT or VERDICT) read."""
    return {
        k
        for a in ALERTS
        if a.source == source
        for q in a.quantities
        for k in (q.field, *(k for k, _ in q.where + q.any_of + q.at_least))
        if k not in labels_of(source)
    }


def columns(samples: Sequence[dict], source: str) -> list[Columns]:
    """Sample documents (of NODE or AGENT; or verdicts, VERDICT) as series of arrays, one per
    distinct set of labels."""
    labels = labels_of(source)
    rows: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        rows[tuple(s.get(k) for k in labels)].append(s)
    wanted = needed_fields(source)
    out = []
    for key, docs in rows.items():
        ns = [sample_schema.time_ns(d["time"]) for d in docs]
        order = sorted(range(len(docs)), key=ns.__getitem__)
        docs, ns = [docs[i] for i in order], [ns[i] for i in order]
        fields = {}
        for f in wanted:
            got = [d.get(f) for d in docs]
            if any(isinstance(x, str) for x in got):
                fields[f] = np.array(got, dtype=object)
            else:
                fields[f] = np.array([np.nan if x is None else float(x) for x in got], dtype=float)
        out.append(
            Columns(
                {k: str(v) for k, v in zip(labels, key, strict=False) if v is not None},
                np.array([n / 1e9 for n in ns], dtype=float),
                fields,
            )
        )
    return out


def _equal(c: Columns, field_: str, value: object) -> np.ndarray | bool:
    if field_ in LABELS or field_ in VERDICT_LABELS:
        return c.labels.get(field_) == value
    col = c.fields.get(field_)
    return np.zeros(len(c.t), dtype=bool) if col is None else np.asarray(col == value, dtype=bool)


def _picked(q: Quantity, c: Columns) -> tuple[np.ndarray, np.ndarray]:
    """The times and values of the samples a quantity takes: those with its field, and its matches."""
    col = c.fields.get(q.field)
    if col is None:
        return np.empty(0), np.empty(0)
    # (numpy's stubs take no None as an operand, which an object array compares with as with any value)
    keep = ~np.isnan(col) if col.dtype != object else np.not_equal(col, None)  # type: ignore[call-overload]
    for k, v in q.where:
        keep &= _equal(c, k, v)
    if q.any_of:
        keep &= np.logical_or.reduce([np.broadcast_to(_equal(c, k, v), keep.shape) for k, v in q.any_of])
    for k, v in q.at_least:
        got = c.fields.get(k)
        keep &= np.zeros(len(c.t), dtype=bool) if got is None else np.asarray(got >= v, dtype=bool)
    t = c.t[keep]
    return t, (t if q.kind == "count" else col[keep].astype(float))


class _Series:
    """One group's samples that a quantity takes (time-sorted arrays), and its value over windows
    that end at given times, all at once."""

    def __init__(self, q: Quantity, parts: Sequence[Columns]):
        picked = [_picked(q, c) for c in parts]
        t = np.concatenate([p[0] for p in picked])
        v = np.concatenate([p[1] for p in picked])
        order = np.argsort(t, kind="stable")  # a group of several series (an agent's, run after run)
        self.kind, self.t, self.v = q.kind, t[order], v[order]

    def values(self, ends: np.ndarray, window_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Over end - window_s <= time <= end (InfluxQL's $timeFilter is inclusive at both ends), for
        each end: the value, and whether there is one (no samples: no data)."""
        lo = np.searchsorted(self.t, ends - window_s, "left")
        hi = np.searchsorted(self.t, ends, "right")
        has = hi > lo
        last = np.where(has, hi - 1, 0)
        if self.kind == "count":
            return (hi - lo).astype(float), has
        if self.kind == "last":
            return (self.v[last] if len(self.v) else np.zeros(len(ends))), has
        if self.kind == "rise":
            return (self.v[last] - self.v[np.minimum(lo, last)] if len(self.v) else np.zeros(len(ends))), has
        total, n = self._slopes(ends - window_s, ends)
        has &= n > 0  # no sample in the window, or no derivative: InfluxDB gives no row
        if self.kind == "slope_buckets":
            return n.astype(float), has
        return np.divide(total, n, out=np.zeros(len(ends)), where=has), has

    def _slopes(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sum and the number of the per-minute slopes between the means of consecutive non-empty
        10 s buckets (aligned to the epoch) over each window, counting those that end in a bucket from
        the window's first on; InfluxDB also reads the bucket before the window, so that the first
        bucket has a derivative (InfluxQL's derivative(mean(v), 1m) ... GROUP BY time(10s))."""
        if not len(self.t):
            return np.zeros(len(ends)), np.zeros(len(ends), dtype=int)
        # Every bucket before the one holding a window's end is whole in it: their means, and the
        # slopes between consecutive ones, are computed once for the series.
        buckets = np.floor(self.t / SLOPE_BUCKET_S)
        keys, first = np.unique(buckets, return_index=True)
        means = np.add.reduceat(self.v, first) / np.diff(np.append(first, len(self.v)))
        pair = np.diff(means) / (np.diff(keys) * SLOPE_BUCKET_S / 60)
        summed = np.concatenate(([0.0], np.cumsum(pair)))
        below = np.floor(starts / SLOPE_BUCKET_S) - 1  # the bucket before the window's first
        last = np.floor(ends / SLOPE_BUCKET_S)  # the bucket of the window's end: only its part up to the end
        i0 = np.searchsorted(keys, below, "left")
        i1 = np.searchsorted(keys, last, "left")  # whole buckets: keys[i0:i1]
        whole = np.maximum(i1 - i0, 0)
        total = np.where(whole > 1, summed[np.maximum(i1 - 1, 0)] - summed[np.minimum(i0, len(pair))], 0.0)
        n = np.maximum(whole - 1, 0)
        # The end's own bucket, up to the end: a slope from the last whole bucket to it.
        a = np.searchsorted(self.t, last * SLOPE_BUCKET_S, "left")
        c = np.searchsorted(self.t, ends, "right")
        cum = np.concatenate(([0.0], np.cumsum(self.v)))
        tail = (c > a) & (whole > 0)
        prev = np.maximum(i1 - 1, 0)
        part_mean = np.divide(cum[c] - cum[a], c - a, out=np.zeros(len(ends)), where=c > a)
        gap = np.where(tail, last - keys[prev], 1.0) * SLOPE_BUCKET_S / 60
        return np.where(tail, total + (part_mean - means[prev]) / gap, total), n + tail


def _group_series(alert: AlertRule, parts: Sequence[Columns]) -> dict[tuple, list[_Series]]:
    """Each group's series of each quantity; a quantity taken ``per`` fewer labels is the same
    series for every group that shares them (the run's verdicts, for each set of nodes named)."""

    def key_of(c: Columns, labels: tuple[str, ...]) -> tuple:
        return tuple(c.labels.get(k, "") for k in labels)

    by_key: dict[tuple, list[Columns]] = defaultdict(list)
    for c in parts:
        by_key[key_of(c, alert.group)].append(c)
    shared: dict[tuple, _Series] = {}

    def coarse(q: Quantity, key: tuple) -> _Series:
        mine = tuple(dict(zip(alert.group, key, strict=True))[k] for k in q.per)
        if (q.ref, mine) not in shared:
            shared[(q.ref, mine)] = _Series(q, [c for c in parts if key_of(c, q.per) == mine])
        return shared[(q.ref, mine)]

    return {key: [coarse(q, key) if q.per else _Series(q, cs) for q in alert.quantities] for key, cs in by_key.items()}


def _holding(alert: AlertRule, series: list[_Series], ends: np.ndarray) -> tuple[np.ndarray, dict[str, tuple]]:
    """At each end, whether the condition holds for the group, and its quantities (values, has)."""
    got = {q.ref: s.values(ends, alert.window_s) for q, s in zip(alert.quantities, series, strict=False)}
    holds = np.zeros(len(ends), dtype=bool)
    for conj in alert.condition:
        both = np.ones(len(ends), dtype=bool)
        for a in conj:
            v, has = got[a.ref]
            if a.minus is not None:
                less, has_less = got[a.minus]
                v, has = v - less, has & has_less
            both &= has & (v > a.threshold)
        holds |= both
    return holds, got


def values_at(alert: AlertRule, samples: Sequence[dict], ends: Sequence[float]) -> list[dict[tuple, dict[str, float]]]:
    """For each end (epoch s), each group's quantities over the window ending there; groups without
    data are left out (what Grafana's reduce step is given)."""
    at = np.asarray(ends, dtype=float)
    out: list[dict[tuple, dict[str, float]]] = [{} for _ in at]
    for key, series in _group_series(alert, columns(samples, alert.source)).items():
        for q, s in zip(alert.quantities, series, strict=False):
            v, has = s.values(at, alert.window_s)
            for i in np.flatnonzero(has):
                out[i].setdefault(key, {})[q.ref] = float(v[i])
    return out


def _spans(alert: AlertRule, key: tuple, ends: np.ndarray, holds: np.ndarray) -> list[Span]:
    """Each stretch of evaluations at which the condition held, as a span from the first at which it
    had held for ``for`` to the last."""
    out = []
    edges = np.diff(np.concatenate(([0], holds.astype(np.int8), [0])))
    for i, j in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1, strict=False):
        firing = np.flatnonzero(ends[i : j + 1] - ends[i] >= alert.for_s)
        if len(firing):
            out.append(
                Span(alert, dict(zip(alert.group, key, strict=False)), float(ends[i + firing[0]]), float(ends[j]))
            )
    return out


def _as_columns(samples: Sequence[dict[str, Any]] | Sequence[Columns], source: str) -> list[Columns]:
    """Series of arrays as given, or made from sample documents (all of one kind, as the first)."""
    if not samples or isinstance(samples[0], Columns):
        return list(cast("Sequence[Columns]", samples))
    return columns(cast("Sequence[dict[str, Any]]", samples), source)


def evaluate(
    node_samples: Sequence[dict] | Sequence[Columns],
    self_samples: Sequence[dict] | Sequence[Columns] = (),
    *,
    verdicts: Sequence[dict] | Sequence[Columns] | None = None,
    every_s: float = EVALUATE_EVERY_S,
) -> list[Span]:
    """Where each alert would have fired over these samples (documents, or series of arrays from
    ``columns``): evaluated every ``every_s`` (at whole multiples of it) from the first sample to one
    window past the last, as Grafana evaluates a rule group; a span starts once its condition has
    held for the alert's ``for``. In the order of ALERTS, then of their start.

    The alerts on verdicts (held back) read ``verdicts``: verdict documents (verdict.schema.json) as
    flowstat verdict wrote them to a store, or as ``verdicts_from_samples`` judges a run file's samples
    over the run's edges. Without them those alerts are skipped: a run file holds samples, not verdicts,
    and its samples alone do not say who feeds whom."""
    given = {NODE: node_samples, AGENT: self_samples, VERDICT: verdicts or ()}
    parts = {src: _as_columns(s, src) for src, s in given.items()}
    spans: list[Span] = []
    for alert in ALERTS:
        if alert.source == VERDICT and verdicts is None:
            continue
        series = [c for c in parts[alert.source] if len(c.t)]
        if not series:
            continue
        first, last = min(c.t[0] for c in series), max(c.t[-1] for c in series)
        t0 = math.ceil(first / every_s) * every_s
        ends = t0 + every_s * np.arange(math.floor((last + alert.window_s + every_s - t0) / every_s) + 1)
        found = []
        for key, group in _group_series(alert, series).items():
            found += _spans(alert, key, ends, _holding(alert, group, ends)[0])
        spans += sorted(found, key=lambda sp: (sp.start, sorted(sp.labels.items())))
    return spans


def verdicts_from_samples(
    samples: Sequence[dict], edges: Sequence[dict], *, every_s: float = VERDICT_EVERY_S
) -> list[dict]:
    """The verdicts flowstat verdict would have written over a run's node samples (one agent's: a
    run file's) and its edges (the run document's ``edges``, each {"from", "to"}): flowstat.flow's
    held_back_by at each whole multiple of ``every_s`` from the first sample to the last, as verdict
    documents (verdict.schema.json), for ``evaluate``."""
    series = points_from_samples(samples)
    times = [p.t for points in series.values() for p in points]
    if not times:
        return []
    run_id = next(str(s["run_id"]) for s in samples if s.get("run_id"))
    upstream: dict[str, list[str]] = defaultdict(list)
    for edge in edges:
        upstream[edge["to"]].append(edge["from"])
    out = []
    for k in range(math.ceil(min(times) / every_s), math.floor(max(times) / every_s) + 1):
        verdict = held_back_by(series, upstream, k * every_s)
        doc: dict[str, Any] = {"time": iso_utc_from_ms(round(k * every_s * 1000)), "run_id": run_id}
        if verdict.nodes:
            doc["held_back_by"] = ",".join(verdict.nodes)
        doc |= {"flow": verdict.kind, "held": len(verdict.nodes), "evidence": verdict.evidence, "window_s": WINDOW_S}
        out.append(doc)
    return out
