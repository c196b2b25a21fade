"""Putting a report together: read the runs, work out their figures, draw, write the page."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from html import escape
from pathlib import Path

from . import _alert_spans, figures, graph
from .load import Run, load_run


@dataclass(frozen=True)
class BuiltReport:
    """What a report holds: the file, the runs (as read) and how many plots it draws."""

    path: Path
    runs: list[Run]
    plots: int


def _load_bokeh() -> None:
    """Import what draws (Bokeh: a second of start-up) while other processes read a large run file
    and this one would only wait."""
    from . import page, plots  # noqa: F401


def write_report(paths: list[Path], out: Path) -> BuiltReport:
    """Read the run directories ``paths`` and write their report to ``out``; ReportError names a run
    that cannot be read."""
    runs = [load_run(p, meanwhile=_load_bokeh) for p in paths]
    from . import glance, page  # loaded by now (_load_bokeh)

    windows = [figures.steady_window(r) for r in runs]
    stats = [figures.steady_stats(r, w) for r, w in zip(runs, windows, strict=False)]
    spans = [_alert_spans.evaluate(r) for r in runs]
    doc = page.Page("flowstat report: " + ", ".join(r.name for r in runs))
    page.header(doc, runs)
    keys = [figures.key_figures(r, w) for r, w in zip(runs, windows, strict=False)]
    graphs = [graph.section(i, r, w) for i, (r, w) in enumerate(zip(runs, windows, strict=False))]
    doc.html(glance.first_screen(runs, windows, keys, spans, graphs))
    if len(runs) > 1:
        _side_by_side(doc, runs, windows, stats)
    _each_run(doc, runs, windows, spans)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc.write(out)
    return BuiltReport(out, runs, len(doc.jobs))


def _side_by_side(doc, runs: list[Run], windows: list[figures.Window], stats: list[dict]) -> None:
    """The thesis-style table, and the figures against each parameter that some runs differ in alone."""
    from . import page, plots

    differ = figures.varying(runs)
    page.thesis_table(doc, runs, windows, stats, differ)
    found = figures.sweeps(runs)
    page.sweeps_section(doc, runs, differ, found)
    doc.html('<div class="plots">')
    for sweep in found:
        doc.plot(partial(plots.sweep_plot, figures.RATE, sweep, runs, stats))
    doc.html("</div>")


def _each_run(doc, runs: list[Run], windows: list[figures.Window], spans: list[list]) -> None:
    """Per run: its parameters and verdicts, the alerts, and per role its constants and plots (the
    page's data budget shared out among all the runs' plots)."""
    from . import page, plots

    todo = [plots.plans(r) for r in runs]
    count = sum(len(rp.plots) for by_role in todo for rp in by_role)
    budget = plots.DATA_BUDGET // max(1, count)
    doc.html(f"<p class='note'>{escape(page.HOW_TO_READ.format(handful=figures.HANDFUL))}</p>")
    for i, (run, window, by_role, run_spans) in enumerate(zip(runs, windows, todo, spans, strict=False)):
        page.run_section(doc, i, run, window)
        page.alerts_section(doc, run, run_spans)
        for rp in by_role:
            page.role_section(doc, i, run, window, rp)
            doc.html('<div class="plots">')
            for plan in rp.plots:
                doc.plot(partial(plots.plot, run, plan, window, budget))
            doc.html("</div>")
