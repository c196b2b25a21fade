"""The report's numbers: the steady window of a run, and the thesis-style table over it.

The steady state is the online verdict's (flowstat.harness.online): it begins when start-up ends,
max(3 s, 10% of the run's duration) after the run's start (run.json ``started``: the producers'
start command), and ends at the stop signal, ``summary.seconds`` after the start; the final drain,
after the stop signal, is left out. A run file recorded outside the harness has no stop signal:
its window ends at its last sample, and its duration is taken as that long.

The table: per run, the mean and the standard deviation (numpy's, ddof 0) of each of THESIS_METRICS
over every merger sample taken in the window (bounds included), all mergers pooled, as the
thesis's tables give them per merger.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowstat.schema import run as run_schema
from flowstat.schema import sample as sample_schema
from flowstat.schema.run import startup_s
from flowstat.units import format_size
from flowstat.views.labels import HUMAN_UNITS, LABELS, parameter_label

from .load import Run, Series

THESIS_METRICS = ("cpu_clock_hz", "vmrss_kb", "average_merge_time_ms", "merged_objects_per_second")
TABLE_ROLE = "merger"
RATE = "merged_objects_per_second"  # plotted against the parameter that differs between runs


@dataclass(frozen=True)
class Window:
    """The steady state, in seconds since the run's start."""

    lo: float
    hi: float

    def text(self) -> str:
        return f"{self.lo:.1f} - {self.hi:.1f}"


def steady_window(run: Run) -> Window:
    params, summary = run.doc.get("parameters") or {}, run.doc.get("summary") or {}
    end = summary.get("seconds")
    if end is None:
        end = float(run.t.max()) if len(run.t) else 0.0
    duration = params.get("duration_s", end)
    return Window(startup_s(duration), end)


@dataclass(frozen=True)
class Stat:
    mean: float | None
    std: float | None
    n: int


def steady_stats(run: Run, window: Window) -> dict[str, Stat]:
    """THESIS_METRICS over the mergers' samples in the window."""
    rows = np.concatenate([np.arange(s.lo, s.hi) for s in run.series if s.role == TABLE_ROLE] or [np.empty(0, int)])
    rows = rows[(run.t[rows] >= window.lo) & (run.t[rows] <= window.hi)]
    out = {}
    for name in THESIS_METRICS:
        y = run.values[name][rows]
        y = y[~np.isnan(y)]
        out[name] = Stat(float(y.mean()), float(y.std()), len(y)) if len(y) else Stat(None, None, 0)
    return out


@dataclass(frozen=True)
class Parameter:
    """A run parameter as the report shows it: its path in the run document, label and unit."""

    path: tuple[str, ...]
    label: str
    unit: str | None
    default: object = None  # what the run document's absence of it means

    def of(self, doc: dict):
        """Its value in a run document (its default where the document has none)."""
        got = value(doc, self.path)
        return self.default if got is None else got

    @property
    def name(self) -> str:
        """Its name in the run document (producers, buffer_size)."""
        return self.path[-1]

    def heading(self) -> str:
        """Its label with its unit in human terms ("rate per producer (objects/s)"); a size has its
        unit in each value instead (1 kB)."""
        if self.unit == "bytes" or not self.unit:
            return self.label
        return f"{self.label} ({HUMAN_UNITS.get(self.unit, (self.unit,))[0]})"

    def text(self, x) -> str:
        """A value of it as people read it."""
        if x is None:
            return "-"
        if self.unit == "bytes" and isinstance(x, (int, float)):
            return format_size(x)
        if isinstance(x, float) and x.is_integer():
            x = int(x)
        return f"{x:,}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def parameters() -> list[Parameter]:
    """What was run: the run schema's parameters (the object's shape, an array, follows from its type and
    size), and the machine's CPUs."""
    return [
        Parameter(leaf.path, parameter_label(leaf.name, leaf.path), leaf.unit, leaf.default)
        for leaf in run_schema.leaves()
        if (leaf.path[0] == "parameters" and leaf.type != "array") or leaf.path == ("machine", "cpus")
    ]


def titled(name: str, unit: str | None) -> str:
    """A name with its unit, without the unit's explanation ("Hz (10^6 = one full core)" -> Hz)."""
    return f"{name} ({unit.split(' (')[0]})" if unit else name


def value(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def varying(runs: list[Run]) -> list[Parameter]:
    """The parameters whose values differ between the runs (none for one run)."""
    return [p for p in parameters() if len({p.of(r.doc) for r in runs}) > 1]  # 0 == 0.0: the same


# -- the series a figure is drawn from ----------------------------------------------------------------

HANDFUL = 8  # nodes of a role up to which each node is drawn as its own line; more: a heat map (node x time)


@dataclass(frozen=True)
class Role:
    """The nodes of one role in a run, and where their samples are (worked out once for all the role's
    figures): rows of the Run's arrays, node after node, their times and their node's number."""

    name: str
    series: tuple[Series, ...]
    rows: np.ndarray
    t: np.ndarray
    node: np.ndarray

    @property
    def names(self) -> list[str]:
        return [s.node_id for s in self.series]


def roles(run: Run) -> list[Role]:
    """The run's roles: the harness's in pipeline order (sample_schema.PIPELINE_ROLES), then any
    other (the default, other, among them) sorted."""
    present = {s.role for s in run.series}
    out = []
    pipeline = sample_schema.PIPELINE_ROLES
    for name in [r for r in pipeline if r in present] + sorted(present - set(pipeline)):
        series = tuple(sorted((s for s in run.series if s.role == name), key=lambda s: natural(s.node_id)))
        rows = np.concatenate([np.arange(s.lo, s.hi) for s in series])
        out.append(
            Role(name, series, rows, run.t[rows], np.repeat(np.arange(len(series)), [s.hi - s.lo for s in series]))
        )
    return out


def natural(name: str) -> tuple:
    """A node's place in order: its numbers as numbers (producers~2 before producers~10)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))


def raw(run: Run, role: Role, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A field of the role's nodes as recorded: times, values and node numbers, where there is a value."""
    y = run.values[field][role.rows]
    has = ~np.isnan(y)
    return role.t[has], y[has], role.node[has]


def shown(run: Run, role: Role, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A field as people read it (flowstat.views.labels): in its human unit, and a counter as its rate,
    the increase per second from each sample of a node to its next (at the later one's time; a counter
    that went down, a restarted node, gives no rate there)."""
    lab = LABELS[field]
    t, y, node = raw(run, role, field)
    if lab.kind == "counter":
        same = node[1:] == node[:-1]
        dt = np.diff(t)
        ok = same & (dt > 0) & (np.diff(y) >= 0)
        t, y, node = t[1:][ok], np.diff(y)[ok] / dt[ok], node[1:][ok]
    return t, y * lab.scale, node


def constant(run: Run, role: Role, field: str) -> float | None:
    """The field's value when every sample of every node of the role has the same one (as recorded:
    a counter that never moved, a flag never true), else None."""
    y = run.values[field][role.rows]
    y = y[~np.isnan(y)]
    return float(y[0]) if len(y) and y.min() == y.max() else None


def per_node_steady(run: Run, role: Role, field: str, window: Window) -> np.ndarray:
    """Each node's mean of the field (as shown) over the steady window, NaN for a node without a sample there."""
    t, y, node = shown(run, role, field)
    inside = (t >= window.lo) & (t <= window.hi)
    n = len(role.series)
    count = np.bincount(node[inside], minlength=n)
    total = np.bincount(node[inside], weights=y[inside], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


# -- the first screen's key figures -------------------------------------------------------------------

SPARK_BUCKETS = 60  # points of a sparkline over the run


@dataclass(frozen=True)
class Key:
    """A key figure of the first screen: one field (its label and unit from flowstat.views.labels), read
    from the same samples as the Run view's panel ``panel``, for the nodes of each role in ``roles``
    (all roles that report it when empty)."""

    field: str
    panel: str  # the Run view's panel (flowstat.views.panels) that shows the same field
    roles: tuple[str, ...] = ()
    total: bool = False  # the role's figure: the sum over its nodes (else the mean per node)
    over: str = "steady"  # "steady": each node's mean over the steady window; "run": a counter's total


KEYS = (
    Key("merged_objects_per_second", "Merged objects/s", ("merger",), total=True),
    Key("average_merge_time_ms", "Average merge time", ("merger",)),
    Key("input_latency_p99_ms", "Input latency p99", ("merger",)),
    Key("cpu_clock_hz", "CPU, % of one core"),
    Key("vmrss_kb", "VmRSS"),
    Key("send_overload_events", "Buffer overload events", total=True, over="run"),
    Key("receive_overload_events", "Buffer overload events", total=True, over="run"),
)


@dataclass(frozen=True)
class KeyValue:
    """A key figure of one role of a run: the figure, the worst node, and its course over the run."""

    key: Key
    role: str
    nodes: int
    value: float | None
    worst: str | None  # the node furthest on the bad side (None when one node, or none has a value)
    worst_value: float | None
    spark_t: np.ndarray  # bucket centres, s since the start
    spark_y: np.ndarray  # the figure per bucket (NaN: no sample); a counter's: its rate


def _per_bucket(
    t: np.ndarray, y: np.ndarray, node: np.ndarray, n: int, lo: float, hi: float, total: bool, buckets: int
) -> np.ndarray:
    """Per bucket: each node's mean there, summed over the nodes (``total``) or averaged."""
    width = (hi - lo) / buckets if hi > lo else 1.0
    b = np.clip(((t - lo) / width).astype(np.int64), 0, buckets - 1)
    cell = node.astype(np.int64) * buckets + b
    count = np.bincount(cell, minlength=n * buckets).reshape(n, buckets)
    sums = np.bincount(cell, weights=y, minlength=n * buckets).reshape(n, buckets)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / count
        if total:
            out = np.nansum(means, axis=0)
            out[(count == 0).all(axis=0)] = np.nan
            return out
        return np.nanmean(np.where(count > 0, means, np.nan), axis=0)


def key_figures(run: Run, window: Window) -> list[KeyValue]:
    """The run's key figures, role by role (a role that does not report a key's field is left out)."""
    import warnings

    out = []
    lo, hi = run.span
    for key in KEYS:
        lab = LABELS[key.field]
        for role in roles(run):
            if key.roles and role.name not in key.roles:
                continue
            t, y, node = shown(run, role, key.field)
            if not len(y):
                continue
            n = len(role.series)
            if key.over == "run":  # a counter: its total since each node started (its last value)
                _, last, last_node = raw(run, role, key.field)
                per_node = np.full(n, np.nan)
                per_node[last_node] = last  # in time order: each node's last sample wins
            else:
                per_node = per_node_steady(run, role, key.field, window)
            # a point per bucket, about one sample of a node's each (a node is sampled about once a second)
            buckets = int(min(SPARK_BUCKETS, max(4, np.bincount(node).max() * 0.9)))
            width = (hi - lo) / buckets if hi > lo else 1.0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a bucket without a sample
                spark = _per_bucket(t, y, node, n, lo, hi, key.total, buckets)
            has = ~np.isnan(per_node)
            value = None if not has.any() else float(per_node[has].sum() if key.total else per_node[has].mean())
            worst = worst_value = None
            if has.sum() > 1 and np.nanmin(per_node) != np.nanmax(per_node):  # a worst one stands out
                pick = np.nanargmin if lab.lower_is_worse else np.nanargmax
                i = int(pick(per_node))
                worst, worst_value = role.series[i].node_id, float(per_node[i])
            out.append(
                KeyValue(key, role.name, n, value, worst, worst_value, lo + (np.arange(buckets) + 0.5) * width, spark)
            )
    return out


# -- comparisons along a sweep ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """Runs that differ in one parameter alone (a campaign's configurations): a figure can be drawn
    against it, every other parameter being the same."""

    parameter: Parameter
    runs: tuple[int, ...]  # indices into the report's runs, by the parameter's value


def sweeps(runs: list[Run]) -> list[Sweep]:
    """For each parameter that differs between the runs, the largest set of runs (at least two values
    of it) whose other parameters are all equal; none where the runs differ in others too."""
    params = parameters()
    out = []
    for p in varying(runs):
        others = [q for q in params if q.path != p.path]
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(runs):
            groups.setdefault(tuple(repr(q.of(r.doc)) for q in others), []).append(i)
        best = max(groups.values(), key=lambda g: (len({repr(p.of(runs[i].doc)) for i in g}), len(g)))
        if len({repr(p.of(runs[i].doc)) for i in best}) >= 2:
            out.append(Sweep(p, tuple(sorted(best, key=lambda i: _order(p.of(runs[i].doc))))))
    return out


def _order(x) -> tuple:
    return (0, x, "") if isinstance(x, (int, float)) and not isinstance(x, bool) else (1, 0, str(x))
