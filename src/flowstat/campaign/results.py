"""A campaign's figures, one row per configuration, read back from its recorded runs.

Every figure is over the run's steady state (flowstat.report.figures.steady_window: start-up and
the final drain left out) and over all the run's mergers together, as the thesis's section 5.5
gives them for several mergers: each second, the mergers' CPU clock, VmRSS and merged objects/s
are summed and their average merge times averaged (a second counts when every merger was sampled
in it); a column's mean and standard deviation are over those seconds. With one merger this is the
thesis's per-merger figure. Beside them:

- offered objects/s: what the producers sent the mergers over the steady state (the online
  verdict's totals, divided by its span), what the merged rate is to be compared with;
- input latency p99: the worst second's p99 of the time an object waited between its producer's
  send and its merger's take, worst merger;
- VmRSS slope: least-squares slope of the mergers' summed VmRSS over the steady state, MB/min (the
  thesis's "memory growing");
- online: every merger kept up (flowstat.harness.online), else the worst state;
- overloads: the producers' refused sends (a full buffer) over the whole run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flowstat.proc.machine import Machine
from flowstat.report.figures import THESIS_METRICS, Stat, steady_window
from flowstat.report.load import ReportError, Run, load_run

from .runner import ConfigurationOutcome
from .spec import Campaign

SUMMED = ("cpu_clock_hz", "vmrss_kb", "merged_objects_per_second")  # averaged: average_merge_time_ms


@dataclass
class ResultRow:
    key: str
    value: Any
    label: str
    status: str
    run_id: str
    run_dir: str | None
    error: str | None = None
    stats: dict[str, Stat] = field(default_factory=dict)
    offered_per_s: float | None = None
    latency_p99_ms: float | None = None
    vmrss_slope_mb_per_min: float | None = None
    online: bool | None = None
    online_state: str | None = None
    overloads: int | None = None
    conserved: bool | None = None
    seconds: float | None = None
    window: tuple[float, float] | None = None
    # per metric: (seconds since the start, the mergers' figure that second), for the plots
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("series")
        out["stats"] = {k: {"mean": s.mean, "std": s.std, "seconds": s.n} for k, s in self.stats.items()}
        return out


def per_second(
    run: Run, metric: str, nodes: list[str], lo: float = -np.inf, hi: float = np.inf
) -> tuple[np.ndarray, np.ndarray]:
    """The nodes' ``metric`` each second of the run, summed (SUMMED) or averaged, from the samples
    taken in [lo, hi] (seconds since the start); a second counts when every node has a sample in
    it (a node sampled twice in one second counts once: its last sample)."""
    series = [s for s in run.series if s.node_id in nodes]
    if not series:
        return np.empty(0), np.empty(0)
    by_node: list[dict[int, float]] = []
    for s in series:
        t, y = run.of(metric, s)
        keep = (t >= lo) & (t <= hi)
        by_node.append(dict(zip(np.floor(t[keep]).astype(int).tolist(), y[keep].tolist(), strict=False)))
    secs = sorted(set.intersection(*(set(d) for d in by_node)))
    combine = np.sum if metric in SUMMED else np.mean
    return np.array(secs, float), np.array([combine([d[k] for d in by_node]) for k in secs], float)


def _slope_mb_per_min(t: np.ndarray, kb: np.ndarray) -> float | None:
    if len(t) < 3 or np.ptp(t) == 0:
        return None
    return float(np.polyfit(t, kb / 1024, 1)[0] * 60)


def _stat(y: np.ndarray) -> Stat:
    return Stat(float(y.mean()), float(y.std()), len(y)) if len(y) else Stat(None, None, 0)


def _online(verdicts: dict[str, dict]) -> tuple[bool | None, str | None]:
    if not verdicts or any(v.get("online") is None for v in verdicts.values()):
        return None, "no verdict"
    bad = [f"{m}: {v['state']}" for m, v in verdicts.items() if not v["online"]]
    return not bad, "; ".join(bad) or "online"


def _mergers(run: Run) -> list[str]:
    return sorted({s.node_id for s in run.series if s.role == "merger"})


def _relative(text: str | None, base: Path) -> str | None:
    """What went wrong, in a line (the cause, the last line of a log's tail, beside it), with paths
    under the campaign's directory written from it: results say where a run is, not where the
    campaign ran (the log it names has the rest)."""
    if not text:
        return text
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[0] if len(lines) == 1 else f"{lines[0]} ({lines[-1]})"  # what, and the cause its log ends with
    for prefix in (str(base.resolve()), str(base), str(Path.cwd())):  # the longest first
        line = line.replace(prefix + "/", "")
    return line


def row(campaign: Campaign, outcome: ConfigurationOutcome, base: Path) -> ResultRow:
    """``base``: the campaign's directory."""
    c = outcome.config
    r = ResultRow(
        c.key,
        c.value,
        c.label,
        outcome.status,
        campaign.run_id(c),
        _relative(str(outcome.run_dir), base) if outcome.run_dir else None,
        _relative(outcome.error, base),
    )
    if outcome.run_dir is None or outcome.status == "failed":  # nothing was measured
        return r
    summary = json.loads((outcome.run_dir / "summary.json").read_text())
    verdicts = summary.get("online") or {}
    upper = {n["node_id"] for n in summary["nodes"] if n["role"] == "merger" and (n.get("layer") or 1) > 1}
    # What the producers offered: to the first layer (an upper layer is offered what was merged below)
    first = [v for m, v in verdicts.items() if m not in upper]
    r.offered_per_s = (
        round(sum(v["offered_per_second"] for v in first), 1)
        if first and all("offered_per_second" in v for v in first)
        else None
    )
    worst = [
        v["latency_p99_ms_worst_second"] for v in verdicts.values() if v.get("latency_p99_ms_worst_second") is not None
    ]
    r.latency_p99_ms = max(worst) if worst else None
    r.online, r.online_state = _online(verdicts)
    r.overloads = sum((n.get("send_overload_events") or 0) for n in summary["nodes"] if n["role"] == "producer")
    r.conserved = bool(summary.get("conservation", {}).get("ok"))
    r.seconds = summary["seconds"]
    try:
        run = load_run(outcome.run_dir)
    except ReportError as exc:
        r.error = (r.error + "; " if r.error else "") + f"no samples: {exc}"
        return r
    window = steady_window(run)
    r.window = (window.lo, window.hi)
    mergers = _mergers(run)
    first_layer = [m for m in mergers if m not in upper]
    for metric in THESIS_METRICS:
        # Objects merged by an upper layer were merged once already: the rate is the first layer's.
        nodes = first_layer if metric == "merged_objects_per_second" else mergers
        r.series[metric] = per_second(run, metric, nodes)  # the whole run, for the plots
        t, y = per_second(run, metric, nodes, window.lo, window.hi)
        r.stats[metric] = _stat(y)
        if metric == "vmrss_kb":
            r.vmrss_slope_mb_per_min = _slope_mb_per_min(t, y)
    return r


def rows(campaign: Campaign, outcomes: list[ConfigurationOutcome], base: Path) -> list[ResultRow]:
    return [row(campaign, o, base) for o in outcomes]


def write_json(campaign: Campaign, table: list[ResultRow], path: Path, command: str, machine: Machine) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "campaign": campaign.name,
                "title": campaign.title,
                "source": campaign.source,
                "command": command,
                "duration_s": campaign.duration,
                "parameter": campaign.parameter,
                "machine": machine,
                "configurations": [r.to_json() for r in table],
            },
            indent=1,
            default=_jsonable,
        )
    )


def _jsonable(x: Any) -> Any:
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    raise TypeError(f"not JSON: {type(x).__name__}")
