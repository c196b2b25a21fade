"""Putting a report together: read the runs, work out their figures, draw, write the page."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from html import escape
from pathlib import Path

from . import _alerts, figures
from .load import Run, load_run


@dataclass(frozen=True)
class Made:
    """What a report holds: the file, the runs (as read) and how many plots it draws."""

    path: Path
    runs: list[Run]
    plots: int


def _load_bokeh() -> None:
    """Import what draws (Bokeh: a second of start-up) while other processes read a large run file
    and this one would only wait."""
    from . import page, plots  # noqa: F401


def write_report(paths: list[Path], out: Path) -> Made:
    """Read the run directories ``paths`` and write their report to ``out``; ReportError names a run
    that cannot be read."""
    runs = [load_run(p, meanwhile=_load_bokeh) for p in paths]
    from . import page  # loaded by now (_load_bokeh)

    windows = [figures.steady_window(r) for r in runs]
    stats = [figures.steady_stats(r, w) for r, w in zip(runs, windows)]
    doc = page.Page("flowstat report: " + ", ".join(r.name for r in runs))
    page.header(doc, runs)
    _side_by_side(doc, runs, windows, stats)
    _each_run(doc, runs, windows)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc.write(out)
    return Made(out, runs, len(doc.jobs))


def _side_by_side(doc, runs: list[Run], windows: list[figures.Window], stats: list[dict]) -> None:
    """The thesis-style table, and the rate against each parameter that differs between the runs."""
    from . import page, plots

    differ = figures.varying(runs)
    page.thesis_table(doc, runs, windows, stats, differ)
    doc.html('<div class="side-by-side">')
    for param in differ:
        doc.plot(partial(plots.rate_plot, param, runs, [s[figures.RATE] for s in stats]))
    doc.html("</div>")


def _each_run(doc, runs: list[Run], windows: list[figures.Window]) -> None:
    """Per run: its parameters and verdicts, the alerts, and every metric per role (the page's data
    budget shared out among all the runs' plots)."""
    from . import page, plots

    todo = [plots.plans(r) for r in runs]
    budget = plots.DATA_BUDGET // max(1, sum(len(ps) for by_role in todo for ps in by_role.values()))
    for i, (run, window, by_role) in enumerate(zip(runs, windows, todo)):
        page.run_section(doc, i, run, window)
        page.alerts_section(doc, run, _alerts.evaluate(run))
        for role, role_plans in by_role.items():
            nodes = len(role_plans[0].role.series) if role_plans else 0
            doc.html(f'<h3 id="run-{i}-{escape(role)}">{escape(role)}: {nodes} node(s), {len(role_plans)} metrics</h3>')
            for plan in role_plans:
                doc.plot(partial(plots.plot, run, plan, window, budget))
