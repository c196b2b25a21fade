"""A campaign as Markdown: the thesis-style table and SVG plots beside it (DIR/<name>.md,
DIR/<name>/*.svg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowstat.proc.machine import Machine
from flowstat.report.figures import THESIS_METRICS, Stat

from . import svg
from .results import ResultRow
from .spec import Campaign

TITLES = {
    "cpu_clock_hz": ("CPU clock", "Hz"),
    "vmrss_kb": ("VmRSS", "kB"),
    "average_merge_time_ms": ("average merge time", "ms"),
    "merged_objects_per_second": ("merged objects/s", "objects/s"),
}


def titled(metric: str) -> str:
    """A metric's name with its unit ("VmRSS (kB)"; "merged objects/s" says its own)."""
    name, unit = TITLES[metric]
    return name if name.endswith(unit) else f"{name} ({unit})"


def fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100 or digits == 0:  # three significant digits and more: whole numbers
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def stat_text(s: Stat | None) -> str:
    if s is None or s.mean is None:
        return "-"
    digits = 3 if abs(s.mean) < 1000 else 0
    return f"{fmt(s.mean, digits)} ± {fmt(s.std, digits if s.std is not None and s.std < 1000 else 0)}"


def _yes_no(v: bool | None, yes: str, no: str) -> str:
    return "-" if v is None else yes if v else no


def cells(campaign: Campaign, rows: list[ResultRow]) -> tuple[list[str], list[list[str]]]:
    """The table's header and its rows, as text (a failed configuration: its label and why)."""
    head = [
        campaign.parameter_label,
        *(titled(m) for m in THESIS_METRICS),
        "offered objects/s",
        "input latency p99, worst second (ms)",
        "VmRSS slope (MB/min)",
        "overloads",
        "online",
        "no loss",
    ]
    body = []
    for r in rows:
        if r.status == "failed":
            body.append([r.label, f"failed: {(r.error or '').splitlines()[0][:160]}"] + [""] * (len(head) - 2))
            continue
        body.append(
            [
                r.label,
                *(stat_text(r.stats.get(m)) for m in THESIS_METRICS),
                fmt(r.offered_per_s, 3),
                fmt(r.latency_p99_ms, 3),
                fmt(r.vmrss_slope_mb_per_min, 2),
                fmt(r.overloads),
                "no verdict" if r.online is None else "online" if r.online else (r.online_state or "not online"),
                _yes_no(r.conserved, "yes", "LOST"),
            ]
        )
    return head, body


def table(campaign: Campaign, rows: list[ResultRow]) -> list[str]:
    head, body = cells(campaign, rows)
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(b) + " |" for b in body]


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plots(campaign: Campaign, rows: list[ResultRow], folder: Path) -> list[tuple[str, str]]:
    """Write the SVGs; (caption, file name relative to the Markdown) of each."""
    folder.mkdir(parents=True, exist_ok=True)
    measured = [r for r in rows if r.stats]
    values = [r.value for r in measured]
    numeric = _numeric(values)
    log_x = numeric and min(values, default=0) > 0 and max(values) / min(values) >= 50
    made = []
    for metric in THESIS_METRICS:
        name = TITLES[metric][0]
        known = [r for r in measured if r.stats[metric].mean is not None]
        xs = [float(r.value) for r in known] if numeric else [float(i) for i, r in enumerate(measured) if r in known]
        stats = [r.stats[metric] for r in known]  # each with a mean, so with a std (Stat: both or neither)
        means = [s.mean for s in stats if s.mean is not None]
        line = svg.Line("mean ± std", xs, means, [s.std for s in stats if s.std is not None])
        text = svg.plot(
            f"{name}, steady state, all mergers",
            campaign.parameter_label,
            titled(metric),
            [line],
            None if numeric else [r.label for r in measured],
            log_x=log_x,
            note=WRITTEN_BY,
        )
        file = f"{metric}-vs-{campaign.parameter.replace('.', '-')}.svg"
        (folder / file).write_text(text)
        made.append((f"{name} against {campaign.parameter_label}", f"{folder.name}/{file}"))
        lines = [
            svg.Line(r.label, list(map(float, r.series[metric][0])), list(map(float, r.series[metric][1])))
            for r in measured
            if len(r.series.get(metric, ((), ()))[0])
        ]
        text = svg.plot(
            f"{name} over time, all mergers", "seconds since the start", titled(metric), lines, note=WRITTEN_BY
        )
        file = f"{metric}-over-time.svg"
        (folder / file).write_text(text)
        made.append((f"{name} over time, one line per configuration", f"{folder.name}/{file}"))
    return made


WRITTEN_BY = "Written by `flowstat campaign` (in the repository: make bench, benchmarks/run_campaigns.py): do not edit."


def write(campaign: Campaign, rows: list[ResultRow], out_dir: Path, command: str, facts: Machine) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / f"{campaign.name}.md"
    figures = plots(campaign, rows, out_dir / campaign.name)
    m = facts
    text = [f"<!-- {WRITTEN_BY} -->", f"# {campaign.title}", ""]
    if campaign.description:
        text += [campaign.description, ""]
    text += [
        "Made by:",
        "",
        "```console",
        f"$ {command}",
        "```",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu_model'] or 'model unknown'}), Linux {m['kernel']}, Python "
        f"{m['python']}, flowstat {m['flowstat_version']}. Each configuration ran {campaign.duration:g} s, "
        "sampled every "
        f"second by the agents; pinned as the campaign file says ({campaign.source}).",
        "",
        "Every figure is over the steady state (from the end of start-up, max(3 s, 10% of the run), to the stop "
        "signal: the final drain is left out) and over all the mergers together: each second their CPU clock, "
        "VmRSS and merged objects/s summed, their merge times averaged; mean ± standard deviation over those "
        "seconds. CPU clock: 10^6 Hz is one full core. Offered: what the producers sent the mergers per second "
        "in the steady state. Latency: the p99 of an object's wait between its producer's send and its "
        "merger's take, in the worst second. Definitions: docs/campaigns.md.",
        "",
    ]
    text += table(campaign, rows) + [""]
    for caption, file in figures:
        text += [f"![{caption}]({file})", ""]
    failed = [(r, r.error) for r in rows if r.status != "ok" and r.error]
    if failed:
        text += ["Configurations that did not end cleanly:", ""]
        text += [f"- {r.label} ({r.status}): {error.splitlines()[0][:400]}" for r, error in failed] + [""]
    md.write_text("\n".join(text))
    return md
