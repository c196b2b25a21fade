"""The report's Bokeh plots: every metric of the sample schema over time, per role, and the rate of
several runs against what differs between them.

Points are reduced before they go into the page (reduce.py: each time bucket's lowest and highest
sample, so every peak stays): the whole report's data is held to DATA_BUDGET values, shared out
evenly among its plots. A role with many nodes is drawn as its envelope (the lowest and highest
value any of its nodes took in each bucket, at full resolution) over every node's own series
(coarser when the budget asks it), all in one grey line broken between nodes; a role with a few
nodes, one coloured line per node with a legend. Arrays go in as float32 numpy arrays, which Bokeh
writes as base64; Bokeh's cost is per model and per array, so a plot holds few of each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from bokeh.models import (BasicTickFormatter, BoxAnnotation, ColumnDataSource, CustomJSHover, CustomJSTickFormatter,
                          DataRange1d, FixedTicker, Grid, HBar, HoverTool, Legend, LegendItem, Line, LinearAxis,
                          PanTool, Plot, Range1d, ResetTool, Title, Toolbar, VArea, WheelZoomTool, Whisker)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from flowstat import schema

from .figures import RATE, Parameter, Stat, Window, titled
from .load import Metric, Run, Series, metrics
from .reduce import envelope, minmax, on_spans

BUCKETS = 1000  # about a plot's width in pixels: a lowest and a highest point per pixel
ENVELOPE_FROM = 11  # nodes of one role from which the role's envelope is drawn
DATA_BUDGET = 1_200_000  # float32 values in the whole report (6.4 MB as base64), shared out among its plots
MIN_NODE_BUCKETS = 16
HEIGHT = 230
TOOLS = "pan,wheel_zoom,reset"  # the rate plots' (the time plots build theirs: _figure)
ENVELOPE_COLOUR, NODE_COLOUR, STEADY_COLOUR, FLAG_COLOUR = "#1f77b4", "#7f7f7f", "#2ca02c", "#d62728"
_CORE = re.compile(r"10\^(\d+) = one full core")  # the schema's CPU unit: "Hz (10^6 = one full core)"


@dataclass(frozen=True)
class Role:
    """The nodes of one role in a run, and where their samples are (worked out once for all the role's
    plots): rows of the Run's arrays, node after node, their times and their node's number."""

    name: str
    series: tuple[Series, ...]
    rows: np.ndarray
    t: np.ndarray
    node: np.ndarray


@dataclass(frozen=True)
class Plan:
    """One plot to draw: a metric of the nodes of one role."""

    metric: Metric
    role: Role

    def samples(self, run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The role's samples of the metric: times, values and node numbers, where there is a value."""
        y = run.values[self.metric.name][self.role.rows]
        has = ~np.isnan(y)
        return self.role.t[has], y[has], self.role.node[has]


def _roles(run: Run) -> list[Role]:
    """The run's roles, in pipeline order (schema.ROLES), then any other."""
    present = {s.role for s in run.series}
    out = []
    for name in [r for r in schema.ROLES if r in present] + sorted(present - set(schema.ROLES)):
        series = tuple(s for s in run.series if s.role == name)
        rows = np.concatenate([np.arange(s.lo, s.hi) for s in series])
        out.append(Role(name, series, rows, run.t[rows], np.repeat(np.arange(len(series)), [s.hi - s.lo for s in series])))
    return out


def plans(run: Run) -> dict[str, list[Plan]]:
    """Per role, a plot of each metric any of its nodes reported."""
    return {role.name: [Plan(m, role) for m in metrics() if not np.isnan(run.values[m.name][role.rows]).all()]
            for role in _roles(run)}


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _figure(title: str, run: Run, window: Window, y_label: str, height: int = HEIGHT, y_grid: bool = True) -> Plot:
    """A plot over the run's time (all plots of a run span the same time), the steady state shaded.
    Built from its parts rather than by bokeh.plotting.figure: half the models, half the time."""
    lo, hi = run.span
    x_axis = LinearAxis(axis_label=f"s since the run's start (shaded: the steady state, {window.text()} s)")
    y_axis = LinearAxis(axis_label=y_label, formatter=BasicTickFormatter(use_scientific=False))  # 320000, not 3.2e+5
    p = Plot(title=Title(text=title, text_font_size="13px"), height=height, sizing_mode="stretch_width",
             x_range=Range1d(start=lo, end=hi), y_range=DataRange1d(), output_backend="canvas",
             toolbar=Toolbar(tools=[PanTool(), WheelZoomTool(), ResetTool()]))
    p.add_layout(x_axis, "below")
    p.add_layout(y_axis, "left")
    p.add_layout(Grid(dimension=0, ticker=x_axis.ticker))
    if y_grid:
        p.add_layout(Grid(dimension=1, ticker=y_axis.ticker))
    p.add_layout(BoxAnnotation(left=window.lo, right=window.hi, fill_color=STEADY_COLOUR, fill_alpha=0.07,
                               line_alpha=0))
    return p


def _core_axis(p: Plot, unit: str | None) -> None:
    """CPU clock: a second axis in % of one core, from the unit the schema gives (10^N Hz = one core)."""
    match = _CORE.search(unit or "")
    if match:
        per_percent = 10 ** int(match.group(1)) / 100
        p.add_layout(LinearAxis(axis_label="% of one core", formatter=CustomJSTickFormatter(
            code=f"return (+(tick / {per_percent:g}).toPrecision(3)) + '%'")), "right")


def _node_name(series: tuple[Series, ...]) -> CustomJSHover:
    """Hover: a sample's node, from its node number (one number a point is cheaper than a name)."""
    return CustomJSHover(args={"names": [s.node_id for s in series]}, code="return names[value]")


def line_plot(run: Run, plan: Plan, window: Window, budget: int) -> Plot:
    """A metric of a role's nodes over time: one line per node, and the envelope of many."""
    m, series = plan.metric, plan.role.series
    n = len(series)
    many = n >= ENVELOPE_FROM
    per_point = 3 if many else 2  # values a point costs: time, value (and the node's number)
    buckets = max(MIN_NODE_BUCKETS, min(BUCKETS, (budget - (3 * BUCKETS if many else 0)) // (2 * per_point * n)))
    t, y, node = plan.samples(run)
    keep = minmax(t, y, *run.span, buckets, node)
    title = f"{m.name}: {plan.role.name}"
    if many:
        title += f" - {n} nodes: blue band = lowest to highest of any node; grey = each node ({buckets} buckets)"
    elif n == 1:
        title += f" {series[0].node_id}"
    p = _figure(title, run, window, titled(m.name, m.unit))
    _core_axis(p, m.unit)
    value_tip = (m.name, "@y{0,0.[000]}")
    if many:
        cut = np.flatnonzero(np.diff(node[keep])) + 1  # a NaN between nodes breaks the line
        src = ColumnDataSource({"t": _f32(np.insert(t[keep], cut, np.nan)), "y": _f32(np.insert(y[keep], cut, np.nan)),
                                "node": np.insert(node[keep], cut, 0).astype(np.int32)})
        lines = [p.add_glyph(src, Line(x="t", y="y", line_color=NODE_COLOUR, line_alpha=0.35))]
        _envelope(p, run, t, y)
        tips = [("node", "@node{custom}"), ("t", "@t{0.0} s"), value_tip]
        formatters = {"@node": _node_name(series)}
    else:
        legend = Legend(location="top_left", click_policy="hide", label_text_font_size="11px")
        lines = []
        for i, s in enumerate(series):
            mine = keep[node[keep] == i]
            lines.append(p.add_glyph(ColumnDataSource({"t": _f32(t[mine]), "y": _f32(y[mine])}),
                                     Line(x="t", y="y", line_color=Category10_10[i % 10], line_width=1.5),
                                     name=s.node_id))
            legend.items.append(LegendItem(label=s.node_id, renderers=[lines[-1]]))
        if n > 1:
            p.add_layout(legend, "right")
        tips, formatters = [("node", "$name"), ("t", "@t{0.0} s"), value_tip], {}
    p.add_tools(HoverTool(renderers=lines, tooltips=tips, formatters=formatters))
    return p


def _envelope(p: Plot, run: Run, t: np.ndarray, y: np.ndarray) -> None:
    """The role's lowest and highest value per bucket, over all its nodes."""
    env = envelope(t, y, *run.span, BUCKETS)
    src = ColumnDataSource({"t": _f32(env.t), "low": _f32(env.low), "high": _f32(env.high)})
    p.add_glyph(src, VArea(x="t", y1="low", y2="high", fill_color=ENVELOPE_COLOUR, fill_alpha=0.3))
    top = p.add_glyph(src, Line(x="t", y="high", line_color=ENVELOPE_COLOUR, line_width=1))  # the peaks, hovered
    p.add_tools(HoverTool(renderers=[top], mode="vline", tooltips=[
        ("t", "@t{0.0} s"), ("lowest", "@low{0,0.[000]}"), ("highest", "@high{0,0.[000]}")]))


def timeline_plot(run: Run, plan: Plan, window: Window, budget: int) -> Plot:
    """A flag of a role's nodes as a state timeline: a row per node, a bar while it was true."""
    m, series = plan.metric, plan.role.series
    buckets = max(MIN_NODE_BUCKETS, min(BUCKETS, budget // (3 * len(series))))
    gap = (run.span[1] - run.span[0]) / buckets
    left, right, row = [], [], []
    for i, s in enumerate(series):
        t, y = run.of(m.name, s)
        start, end = on_spans(t, y > 0, gap)
        left.append(start)
        right.append(end)
        row.append(np.full(len(start), i, dtype=np.int32))
    spans = sum(map(len, left))
    p = _figure(f"{m.name}: {plan.role.name} - a bar while true ({spans:,} spans)", run, window, "node",
                height=min(600, max(HEIGHT, 40 + 14 * len(series))), y_grid=False)
    p.add_glyph(ColumnDataSource({"row": np.concatenate(row), "left": _f32(np.concatenate(left)),
                                  "right": _f32(np.concatenate(right))}),
                HBar(y="row", left="left", right="right", height=0.8, fill_color=FLAG_COLOUR, line_color=None))
    step = max(1, len(series) // 40)  # at most about 40 names on the axis
    p.yaxis.ticker = FixedTicker(ticks=list(range(0, len(series), step)))
    p.yaxis.major_label_overrides = {i: series[i].node_id for i in range(0, len(series), step)}
    p.y_range = Range1d(start=len(series) - 0.5, end=-0.5)  # the first node on top; set, as there may be no bar
    p.add_tools(HoverTool(tooltips=[("node", "@row{custom}"), ("from", "@left{0.0} s"), ("to", "@right{0.0} s")],
                          formatters={"@row": _node_name(series)}))
    return p


def plot(run: Run, plan: Plan, window: Window, budget: int) -> Plot:
    draw = timeline_plot if plan.metric.type == "boolean" else line_plot
    return draw(run, plan, window, budget)


def rate_plot(param: Parameter, runs: list[Run], stats: list[Stat]) -> figure:
    """The runs' steady merged objects/s (mean, and a whisker of one standard deviation) against a
    parameter that differs between them (as the thesis's figure 29)."""
    xs = [param.of(r.doc) for r in runs]
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    kw = {} if numeric else {"x_range": sorted({str(x) for x in xs})}
    p = figure(title=f"{RATE} in the steady state against {param.label}", height=300, width=640, tools=TOOLS,
               active_scroll=None, **kw)
    known = [i for i, s in enumerate(stats) if s.mean is not None]
    top = max((stats[i].mean + stats[i].std for i in known), default=1.0)
    p.y_range = Range1d(start=0, end=top * 1.1 or 1.0)  # the whiskers, which the automatic range leaves out
    src = ColumnDataSource({
        "x": [xs[i] if numeric else str(xs[i]) for i in known], "mean": [stats[i].mean for i in known],
        "low": [stats[i].mean - stats[i].std for i in known], "high": [stats[i].mean + stats[i].std for i in known],
        "std": [stats[i].std for i in known], "run": [runs[i].name for i in known]})
    dots = p.scatter(x="x", y="mean", source=src, size=9, color=ENVELOPE_COLOUR)
    p.add_layout(Whisker(base="x", lower="low", upper="high", source=src))
    p.xaxis.axis_label = titled(param.label, param.unit)
    p.yaxis.axis_label = titled("per merger: mean ± std", next(m.unit for m in metrics() if m.name == RATE))
    p.add_tools(HoverTool(renderers=[dots], tooltips=[("run", "@run"), (param.label, "@x"),
                                                       (RATE, "@mean{0,0.0} ± @std{0,0.0}")]))
    return p
