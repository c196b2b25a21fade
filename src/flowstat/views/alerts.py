"""The five alert conditions, defined once: Grafana's provisioned rules and ElastAlert2's rules are
generated from them, and ``evaluate`` applies them to a run file (the report, the tests' oracle).

Each condition is computed per group (a node, or an agent) over a window that ends at the time of
evaluation, as a few quantities (``Quantity``) combined by a condition in disjunctive normal form:
any of (all of (quantity > threshold)).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from flowstat import schema

from .panels import AGENT, NODE

QUANTITIES = ("count", "last", "rise", "slope_per_min", "slope_buckets")
SLOPE_BUCKET_S = 10  # the slope is taken between 10 s means (GROUP BY time(10s) in InfluxQL)
EVALUATE_EVERY_S = 10  # Grafana's group interval, and how often ``evaluate`` looks


@dataclass(frozen=True)
class Quantity:
    """A number per group over the window: ``count`` of samples, ``last`` value, ``rise`` (last
    minus first), ``slope_per_min`` (the mean of the per-minute derivative of 10 s means), or
    ``slope_buckets`` (how many 10 s buckets that mean is over: how much of the window it covers)."""

    ref: str
    kind: str
    field: str
    where: tuple[tuple[str, object], ...] = ()  # samples with field == value (all of them)
    any_of: tuple[tuple[str, object], ...] = ()  # ... and with at least one of these field == value

    def __post_init__(self) -> None:
        if self.kind not in QUANTITIES:
            raise ValueError(f"quantity {self.ref}: kind {self.kind!r} is not one of {QUANTITIES}")

    def matches(self, sample: dict) -> bool:
        return (all(sample.get(k) == v for k, v in self.where)
                and (not self.any_of or any(sample.get(k) == v for k, v in self.any_of)))


@dataclass(frozen=True)
class Above:
    ref: str
    threshold: float


@dataclass(frozen=True)
class Alert:
    uid: str
    title: str
    summary: str  # what it means, for the notification
    why: str  # why this threshold (docs/dashboards.md)
    source: str  # NODE or AGENT
    group: tuple[str, ...]
    window_s: int
    for_s: int
    quantities: tuple[Quantity, ...]
    condition: tuple[tuple[Above, ...], ...]  # any of (all of)

    def quantity(self, ref: str) -> Quantity:
        return next(q for q in self.quantities if q.ref == ref)

    def holds(self, values: dict[str, float]) -> bool:
        """The condition on one group's quantities (a missing one is no data: never above)."""
        return any(all(a.ref in values and values[a.ref] > a.threshold for a in conj) for conj in self.condition)


ALERTS: tuple[Alert, ...] = (
    Alert("flowstat-buffer-overload", "Buffer overloaded",
          "{{ $labels.node_id }} of run {{ $labels.run_id }}: its send or receive buffer was overloaded "
          "in the last minute",
          "Any overload: the thesis's first sign of a pipeline at its limit (section 5.1). A producer's send "
          "flag means a send was refused by a full buffer; a merger's receive flag that it had a full batch "
          "waiting at a read.",
          NODE, ("run_id", "node_id", "agent"), 60, 0,
          (Quantity("A", "count", "node_state",
                    any_of=(("send_buffer_overloaded", True), ("receive_buffer_overloaded", True))),),
          ((Above("A", 0),),)),
    Alert("flowstat-merger-behind", "Merger falling behind",
          "{{ $labels.node_id }} of run {{ $labels.run_id }} is falling behind: its input latency p99 is over "
          "1 s and rising, or the objects in flight to it grow",
          "1 s is the online verdict's latency bound (docs/harness.md); rising, because a high but falling "
          "latency is a merger catching up. In flight growing by more than 1,000 objects in 30 s is a queue "
          "building faster than 33 objects/s.",
          NODE, ("run_id", "node_id", "agent"), 30, 30,
          (Quantity("A", "last", "input_latency_p99_ms", where=(("role", "merger"),)),
           Quantity("B", "rise", "input_latency_p99_ms", where=(("role", "merger"),)),
           Quantity("C", "rise", "objects_in_flight", where=(("role", "merger"),))),
          ((Above("A", 1000.0), Above("B", 0.0)), (Above("C", 1000.0),))),
    Alert("flowstat-vmrss-growing", "Memory growing",
          "{{ $labels.node_id }} of run {{ $labels.run_id }}: VmRSS grew over 10 MB/min over the last 5 minutes",
          "The thesis's failure mode at 425 and 500 producers: a merger whose memory grows until it is killed. "
          "10 MB/min is the online verdict's memory bound (docs/harness.md). Over at least half the "
          "window (15 slopes between 10 s means): a process's first seconds, or a series that has just "
          "begun, give a slope from two buckets that a single step dominates.",
          NODE, ("run_id", "node_id", "agent"), 300, 0,
          (Quantity("A", "slope_per_min", "vmrss_kb"), Quantity("B", "slope_buckets", "vmrss_kb")),
          ((Above("A", 10 * 1024.0), Above("B", 14)),)),
    Alert("flowstat-node-down", "Node gone",
          "{{ $labels.node_id }} of run {{ $labels.run_id }} is gone (DOWN) before its run ended",
          "A node the agents saw vanish before the harness announced the run's end (an orderly end is "
          "reported STOPPED): a crash, a kill, the OOM killer.",
          NODE, ("run_id", "node_id", "agent"), 60, 0,
          (Quantity("A", "count", "node_state", where=(("node_state", schema.STATE_DOWN),)),),
          ((Above("A", 0),),)),
    Alert("flowstat-agent-spooling", "Agent cannot deliver",
          "agent {{ $labels.agent }} on {{ $labels.host }} cannot deliver: its spool grew in the last minute",
          "Samples waiting on disk for a sink that does not take them; they are resent when it does, and "
          "dropped once the spool is full.",
          # The run too: an agent the harness starts lives for one run, and a series spanning two
          # agents' spools (one ended full, the next starting) would rise or fall for no reason.
          AGENT, ("run_id", "host", "agent"), 60, 0,
          (Quantity("A", "last", "spooled_samples"), Quantity("B", "rise", "spooled_samples")),
          ((Above("A", 0), Above("B", 0)),)),
)


# -- offline evaluation -------------------------------------------------------------------------

@dataclass(frozen=True)
class Span:
    """When an alert condition held for a group, having held ``for`` first (start and end in epoch s)."""

    alert: Alert
    labels: dict[str, str]
    start: float
    end: float


def _seconds(sample: dict) -> float:
    return schema.time_ns(sample["time"]) / 1e9


class _Series:
    """One group's samples that a quantity takes (time-sorted arrays), cut into windows by bisection."""

    def __init__(self, q: Quantity, rows: Sequence[tuple[float, dict]]):
        picked = [(t, s[q.field]) for t, s in rows if q.matches(s) and s.get(q.field) is not None]
        self.kind = q.kind
        self.t = np.array([t for t, _ in picked], dtype=float)
        self.v = np.array([float(v) for _, v in picked], dtype=float) if q.kind != "count" else self.t

    def value(self, start: float, end: float) -> float | None:
        """Over start <= time <= end (InfluxQL's $timeFilter is inclusive at both ends); None: no data."""
        lo, hi = np.searchsorted(self.t, start, "left"), np.searchsorted(self.t, end, "right")
        if hi <= lo:
            return None
        if self.kind == "count":
            return float(hi - lo)
        if self.kind == "last":
            return float(self.v[hi - 1])
        if self.kind == "rise":
            return float(self.v[hi - 1] - self.v[lo])
        # InfluxDB also reads the bucket before the range, so that the first bucket has a derivative.
        first_bucket = math.floor(start / SLOPE_BUCKET_S)
        before = np.searchsorted(self.t, (first_bucket - 1) * SLOPE_BUCKET_S, "left")
        slopes = slopes_per_min(self.t[before:hi], self.v[before:hi], first_bucket)
        if self.kind == "slope_buckets":
            return float(len(slopes)) if len(slopes) else None  # InfluxDB's count() of nothing: no row
        return float(slopes.mean()) if len(slopes) else None


def slopes_per_min(t: np.ndarray, v: np.ndarray, first_bucket: int) -> np.ndarray:
    """Over consecutive non-empty 10 s buckets (aligned to the epoch), the change of the bucket
    means per minute, for the buckets from ``first_bucket`` on (each against the bucket before it,
    which may be the one before the range): InfluxQL's derivative(mean(v), 1m) ... GROUP BY time(10s)."""
    buckets = np.floor(t / SLOPE_BUCKET_S)
    keys, first = np.unique(buckets, return_index=True)
    means = np.add.reduceat(v, first) / np.diff(np.append(first, len(v))) if len(v) else v
    return (np.diff(means) / (np.diff(keys) * SLOPE_BUCKET_S / 60))[keys[1:] >= first_bucket]


def values_at(alert: Alert, groups: dict[tuple, list[_Series]], end: float) -> dict[tuple, dict[str, float]]:
    """Each group's quantities over the window ending at ``end``; groups without data are left out."""
    out = {}
    for key, series in groups.items():
        vals = {q.ref: v for q, s in zip(alert.quantities, series)
                if (v := s.value(end - alert.window_s, end)) is not None}
        if vals:
            out[key] = vals
    return out


def _groups(alert: Alert, samples: Sequence[dict]) -> tuple[dict[tuple, list[_Series]], float, float]:
    rows: dict[tuple, list[tuple[float, dict]]] = defaultdict(list)
    for s in samples:
        rows[tuple(str(s.get(k, "")) for k in alert.group)].append((_seconds(s), s))
    times = [t for r in rows.values() for t, _ in r]
    groups = {}
    for key, r in rows.items():
        r.sort(key=lambda ts: ts[0])
        groups[key] = [_Series(q, r) for q in alert.quantities]
    return groups, min(times, default=0.0), max(times, default=0.0)


def evaluate(node_samples: Sequence[dict], agent_samples: Sequence[dict] = (), *,
             every_s: float = EVALUATE_EVERY_S) -> list[Span]:
    """Where each alert would have fired over these samples: evaluated every ``every_s`` (at whole
    multiples of it) from the first sample to one window past the last, as Grafana evaluates a rule
    group; a span starts once its condition has held for the alert's ``for``."""
    spans: list[Span] = []
    for alert in ALERTS:
        samples = agent_samples if alert.source == AGENT else node_samples
        if not samples:
            continue
        groups, first, last = _groups(alert, samples)
        since: dict[tuple, float] = {}  # group -> the first evaluation at which its condition held
        firing: dict[tuple, Span] = {}
        t = math.ceil(first / every_s) * every_s
        while t <= last + alert.window_s + every_s:
            values = values_at(alert, groups, t)
            for key in list(since) + [k for k in values if k not in since]:
                if key in values and alert.holds(values[key]):
                    since.setdefault(key, t)
                    if t - since[key] >= alert.for_s:
                        begun = firing.get(key)
                        firing[key] = Span(alert, dict(zip(alert.group, key)), begun.start if begun else t, t)
                else:
                    since.pop(key, None)
                    if key in firing:
                        spans.append(firing.pop(key))
            t += every_s
        spans.extend(firing.values())
    return spans
