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

from dataclasses import dataclass

import numpy as np

from flowstat.harness.online import startup_s
from flowstat.schema import run as run_schema

from .load import Run

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


def parameters() -> list[Parameter]:
    """What was run: the run schema's parameters (the object's shape, an array, follows from its type and
    size), and the machine's CPUs."""
    return [Parameter(leaf.path, leaf.name, leaf.unit, leaf.default) for leaf in run_schema.leaves()
            if (leaf.path[0] == "parameters" and leaf.type != "array") or leaf.path == ("machine", "cpus")]


def titled(name: str, unit: str | None) -> str:
    """A name with its unit, without the unit's explanation ("Hz (10^6 = one full core)" -> Hz)."""
    return f"{name} ({unit.split(' (')[0]})" if unit else name


def value(doc: dict, path: tuple[str, ...]):
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def varying(runs: list[Run]) -> list[Parameter]:
    """The parameters whose values differ between the runs (none for one run)."""
    return [p for p in parameters() if len({p.of(r.doc) for r in runs}) > 1]  # 0 == 0.0: the same
