"""A campaign as one self-contained HTML page (flowstat report's page and Bokeh): the table, each
metric against the swept parameter, and each metric over time, one line per configuration."""

from __future__ import annotations

from functools import partial
from html import escape
from pathlib import Path
from typing import Any

from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.models.annotations import Whisker  # bokeh.models has it too, its type stubs do not say so
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from flowstat.proc.machine import Machine
from flowstat.report import page
from flowstat.report.figures import THESIS_METRICS

from .markdown import TITLES, cells, titled
from .results import ResultRow
from .spec import Campaign

TOOLS = "pan,wheel_zoom,reset"


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def against_parameter(campaign: Campaign, rows: list[ResultRow], metric: str):
    name = TITLES[metric][0]
    # (row, mean, std) of the rows with figures (a Stat has a std when it has a mean)
    known = [
        (r, s.mean, s.std) for r in rows if r.stats and (s := r.stats[metric]).mean is not None and s.std is not None
    ]
    numeric = _numeric([r.value for r, _, _ in known])
    kw: dict[str, Any] = {} if numeric else {"x_range": [r.label for r, _, _ in known]}
    p = figure(  # type: ignore[call-arg]  # bokeh's stubs: figure takes tools and active_scroll
        title=f"{name} against {campaign.parameter_label} (steady state, all mergers)",
        height=300,
        width=620,
        tools=TOOLS,
        active_scroll=None,
        **kw,
    )
    src = ColumnDataSource(
        {
            "x": [r.value if numeric else r.label for r, _, _ in known],
            "mean": [mean for _, mean, _ in known],
            "std": [std for _, _, std in known],
            "low": [mean - std for _, mean, std in known],
            "high": [mean + std for _, mean, std in known],
            "config": [r.key for r, _, _ in known],
        }
    )
    top = max((mean + std for _, mean, std in known), default=1.0)
    p.y_range = Range1d(
        start=0, end=top * 1.1 or 1.0
    )  # from 0, and the whiskers in (the automatic range leaves them out)
    dots = p.scatter(x="x", y="mean", source=src, size=9)
    p.add_layout(Whisker(base="x", lower="low", upper="high", source=src))
    p.xaxis.axis_label = campaign.parameter_label
    p.yaxis.axis_label = f"{titled(metric)}: mean ± std"
    p.add_tools(
        HoverTool(renderers=[dots], tooltips=[("configuration", "@config"), (name, "@mean{0,0.000} ± @std{0,0.000}")])
    )
    return p


def over_time(rows: list[ResultRow], metric: str):
    name = TITLES[metric][0]
    p = figure(  # type: ignore[call-arg]  # bokeh's stubs: figure takes tools and active_scroll
        title=f"{name} over time, all mergers", height=300, width=620, tools=TOOLS, active_scroll=None
    )
    for i, r in enumerate(x for x in rows if len(x.series.get(metric, ((), ()))[0])):
        t, y = r.series[metric]
        p.line(t, y, legend_label=r.label, color=Category10_10[i % 10], line_width=1.5)
    p.xaxis.axis_label = "seconds since the start"
    p.yaxis.axis_label = titled(metric)
    if p.legend:
        p.legend.click_policy = "hide"
        p.legend.label_text_font_size = "9pt"
    return p


def write(campaign: Campaign, rows: list[ResultRow], out: Path, command: str, facts: Machine) -> Path:
    doc = page.Page(f"flowstat campaign: {campaign.title}")
    head, body = cells(campaign, rows)
    doc.html(
        f"<h1>{escape(campaign.title)}</h1><p>{escape(campaign.description)}</p>"
        f"<p>Made by <code>{escape(command)}</code> on {facts['cpus']} CPUs ({escape(facts['cpu_model'])}), "
        f"Linux {escape(facts['kernel'])}; each configuration {campaign.duration:g} s. Figures: the steady "
        f"state, all mergers together (each second summed; merge time averaged); mean ± std over the seconds. "
        f"Click a legend entry to hide its line.</p>"
    )
    doc.html(page.table(head, body))
    doc.html('<div class="side-by-side">')
    for metric in THESIS_METRICS:
        doc.plot(partial(against_parameter, campaign, rows, metric))
        doc.plot(partial(over_time, rows, metric))
    doc.html(
        "</div><h2>Runs</h2><ul>"
        + "".join(
            f"<li>{escape(r.label)}: {escape(r.status)}, <code>{escape(r.run_dir or '-')}</code></li>" for r in rows
        )
        + "</ul>"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    doc.write(out)
    return out
