"""The report's Bokeh plots: per role, the Run view's panels (flowstat.views.panels: the same
fields, titles and units as Grafana's and Kibana's) and the other fields of the sample schema, each
as people read it (flowstat.views.labels: human units, counters as rates); and a figure of several
runs against the one parameter they differ in.

A role of a handful of nodes (figures.HANDFUL) gets a coloured line per node; more nodes, a heat map
(node x time), so 500 producers are one picture. Points are reduced before they go into the page
(reduce.py: each time bucket's lowest and highest sample, so every peak stays; a heat map's cell is
the node's highest value in its time slice): the whole report's data is held to DATA_BUDGET values,
shared out evenly among its plots. Arrays go in as float32 numpy arrays, which Bokeh writes as
base64; Bokeh's cost is per model and per array, so a plot holds few of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from bokeh.models import (
    BasicTickFormatter,
    ColumnDataSource,
    CustomJSHover,
    DataRange1d,
    FixedTicker,
    Grid,
    HBar,
    HoverTool,
    Image,
    Line,
    LinearAxis,
    LinearColorMapper,
    PanTool,
    Plot,
    Range1d,
    ResetTool,
    Toolbar,
    WheelZoomTool,
)

# The annotations from their own module: bokeh.models re-exports them, but its type stubs do not say so.
from bokeh.models.annotations import BoxAnnotation, ColorBar, Legend, LegendItem, Title, Whisker
from bokeh.models.renderers import GlyphRenderer
from bokeh.palettes import Category10_10, Viridis256
from bokeh.plotting import figure

from flowstat.views.labels import LABELS, shown_fields
from flowstat.views.panels import NODE, RUN_VIEW, Panel

from . import figures
from .figures import HANDFUL, Role, Stat, Window
from .load import Run
from .reduce import minmax, on_spans

BUCKETS = 600  # about a plot's width in pixels (two plots a row): a lowest and a highest point per pixel
HEAT_BUCKETS = 300  # time slices of a heat map at most
DATA_BUDGET = 1_200_000  # float32 values in the whole report (6.4 MB as base64), shared out among its plots
MIN_NODE_BUCKETS = 16
HEIGHT = 240
TOOLS = "pan,wheel_zoom,reset"  # the sweep plots' (the time plots build theirs: _figure)
STEADY_COLOUR, FLAG_COLOUR, DOT_COLOUR = "#2ca02c", "#d62728", "#1f77b4"
DASHES = ("solid", "dashed", "dotted")


@dataclass(frozen=True)
class Plan:
    """One plot to draw: fields of the nodes of one role, as the Run view's panel ``panel`` shows them
    (None: a field no dashboard panel shows), drawn as ``kind``: lines, heatmap or timeline."""

    title: str
    panel: str | None
    fields: tuple[tuple[str, str], ...]  # (field, its name in the plot: the panel's metric label, or "")
    kind: str
    role: Role


@dataclass(frozen=True)
class Constant:
    """A field that kept one value over the run in every node of a role: a table row, not a flat line."""

    field: str
    value: float


def _panels(role: str) -> list[Panel]:
    """The Run view's node panels the report draws for a role (a panel for mergers only, for mergers)."""
    return [
        p
        for p in RUN_VIEW.panels()
        if p.source == NODE
        and p.in_report
        and p.group == ("node_id",)
        and all(v == role for k, v in p.where if k == "role")
    ]


@dataclass(frozen=True)
class RolePlan:
    """What a role's part of the report shows: the plots of the Run view's panels, the fields that
    stayed constant (a table), and the fields no panel shows (a table of their steady state)."""

    role: Role
    plots: list[Plan]
    constants: list[Constant]
    others: list[str]


def plans(run: Run) -> list[RolePlan]:
    """Per role, what it shows. Every labelled field any of the role's nodes reported is in one of
    the three (a flag never true, and a counter that never moved, are constants too; a flag true at
    any sample is drawn)."""
    out = []
    for role in figures.roles(run):
        has = {
            f
            for f in shown_fields()
            if LABELS[f].kind != "state" and f in run.values and not np.isnan(run.values[f][role.rows]).all()
        }
        # a flag true at some sample is drawn as its spans, even if it was true at every one
        consts = {
            f: c
            for f in has
            if (c := figures.constant(run, role, f)) is not None and not (LABELS[f].kind == "flag" and c)
        }
        moving = has - set(consts)
        many = len(role.series) > HANDFUL
        todo: list[Plan] = []
        placed: set[str] = set()
        for panel in _panels(role.name):
            fields = tuple((m.field, m.label if len(panel.metrics) > 1 else "") for m in panel.metrics)
            placed |= {f for f, _ in fields}
            fields = tuple((f, name) for f, name in fields if f in moving)
            if not fields:
                continue
            kind = "timeline" if LABELS[fields[0][0]].kind == "flag" else "heatmap" if many else "lines"
            if kind == "lines":
                todo.append(Plan(panel.title, panel.title, fields, kind, role))
            else:
                todo += [
                    Plan(panel.title + (f": {name}" if name else ""), panel.title, ((f, name),), kind, role)
                    for f, name in fields
                ]
        out.append(
            RolePlan(
                role,
                todo,
                [Constant(f, consts[f]) for f in shown_fields() if f in consts],
                [f for f in shown_fields() if f in moving and f not in placed],
            )
        )
    return out


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _figure(title: str, run: Run, window: Window, y_label: str, height: int = HEIGHT, y_grid: bool = True) -> Plot:
    """A plot over the run's time (all plots of a run span the same time), the steady state shaded.
    Built from its parts rather than by bokeh.plotting.figure: half the models, half the time."""
    lo, hi = run.span
    x_axis = LinearAxis(axis_label="s since the run's start")
    y_axis = LinearAxis(axis_label=y_label, formatter=BasicTickFormatter(use_scientific=False))  # 320000, not 3.2e+5
    p = Plot(
        title=Title(text=title, text_font_size="13px"),
        height=height,
        sizing_mode="stretch_width",
        x_range=Range1d(start=lo, end=hi),
        y_range=DataRange1d(),
        output_backend="canvas",
        toolbar=Toolbar(tools=[PanTool(), WheelZoomTool(), ResetTool()]),
        min_border_right=10,
    )
    p.add_layout(x_axis, "below")
    p.add_layout(y_axis, "left")
    p.add_layout(Grid(dimension=0, ticker=x_axis.ticker))
    if y_grid:
        p.add_layout(Grid(dimension=1, ticker=y_axis.ticker))
    p.add_layout(
        BoxAnnotation(left=window.lo, right=window.hi, fill_color=STEADY_COLOUR, fill_alpha=0.07, line_alpha=0)
    )
    return p


def _node_name(names: list[str], rounded: bool = False) -> CustomJSHover:
    """Hover: a sample's node, from its node number (one number a point is cheaper than a name)."""
    return CustomJSHover(
        args={"names": names}, code="return names[Math.round(value)] || ''" if rounded else "return names[value]"
    )


def _y_label(fields: tuple[tuple[str, str], ...]) -> str:
    units = {LABELS[f].unit for f, _ in fields}
    return units.pop() if len(units) == 1 else ", ".join(LABELS[f].titled() for f, _ in fields)


def _title(plan: Plan) -> str:
    n = len(plan.role.series)
    who = f"{plan.role.name} {plan.role.series[0].node_id}" if n == 1 else f"{plan.role.name}, {n} nodes"
    units = sorted({LABELS[f].unit for f, _ in plan.fields} - {""})
    units = [u for u in units if u not in plan.title]
    rate = ", rate of a counter" if any(LABELS[f].kind == "counter" for f, _ in plan.fields) else ""
    return plan.title + (f" ({', '.join(units)}{rate})" if units else "") + f": {who}"


def line_plot(run: Run, plan: Plan, window: Window, budget: int) -> Plot:
    """Fields of a role's few nodes over time: a coloured line per node (a dash per field)."""
    series, n = plan.role.series, len(plan.role.series)
    buckets = max(MIN_NODE_BUCKETS, min(BUCKETS, budget // (4 * n * len(plan.fields))))
    p = _figure(_title(plan), run, window, _y_label(plan.fields))
    legend = Legend(
        location="top_left",
        click_policy="hide",
        label_text_font_size="11px",
        spacing=0,
        padding=4,  # type: ignore[arg-type]  # bokeh's stubs: Padding is typed as a Property of itself
        margin=4,
        background_fill_alpha=0.6,
    )
    lines: list[GlyphRenderer[Any]] = []
    items: list[LegendItem] = []
    for j, (field, name) in enumerate(plan.fields):
        t, y, node = figures.shown(run, plan.role, field)
        keep = minmax(t, y, *run.span, buckets, node)
        for i, s in enumerate(series):
            mine = keep[node[keep] == i]
            if not len(mine):
                continue
            label = " ".join(x for x in (s.node_id if n > 1 else "", name) if x)
            lines.append(
                p.add_glyph(
                    ColumnDataSource({"t": _f32(t[mine]), "y": _f32(y[mine])}),
                    Line(
                        x="t",
                        y="y",
                        line_color=Category10_10[i % 10],
                        line_width=1.5,
                        line_dash=DASHES[j % len(DASHES)],
                    ),
                    name=" ".join(x for x in (s.node_id, name) if x),
                )
            )
            if label:
                items.append(LegendItem(label=label, renderers=[lines[-1]]))
    if items:
        legend.items = items
        p.add_layout(legend)
    unit = _y_label(plan.fields)
    p.add_tools(
        HoverTool(
            renderers=[*lines],  # a list of DataRenderer, as bokeh's stubs want it
            mode="vline",
            tooltips=[("node", "$name"), ("t", "@t{0.0} s"), ("value", f"@y{{0,0.[000]}} {unit}")],
        )
    )
    return p


def heatmap_plot(run: Run, plan: Plan, window: Window, budget: int) -> Plot:
    """A field of a role's many nodes as a heat map: a row per node, a column per time slice, the
    colour the node's highest value in it (every peak shows; a slice without a sample is blank)."""
    ((field, _),) = plan.fields
    lab, names = LABELS[field], plan.role.names
    n = len(names)
    t, y, node = figures.shown(run, plan.role, field)
    # at most a slice per sample of a node (a cell per sample: no empty columns between them)
    buckets = max(4, min(HEAT_BUCKETS, budget // n, int(np.bincount(node).max()) if len(node) else 4))
    lo, hi = run.span
    width = (hi - lo) / buckets if hi > lo else 1.0
    b = np.clip(((t - lo) / width).astype(np.int64), 0, buckets - 1)
    cells = np.full(n * buckets, -np.inf)
    np.maximum.at(cells, node.astype(np.int64) * buckets + b, y)
    cells[np.isinf(cells)] = np.nan
    image = _f32(cells.reshape(n, buckets))
    p = _figure(
        f"{_title(plan)} (colour: highest per time slice)",
        run,
        window,
        "node",
        height=min(420, max(HEIGHT, 60 + 2 * n)),
        y_grid=False,
    )
    finite = y[np.isfinite(y)]
    mapper = LinearColorMapper(
        palette=Viridis256,
        low=float(finite.min()) if len(finite) else 0,
        high=float(finite.max()) if len(finite) else 1,
        nan_color=(0, 0, 0, 0),
    )
    img = p.add_glyph(
        ColumnDataSource({"image": [image]}), Image(image="image", x=lo, y=-0.5, dw=hi - lo, dh=n, color_mapper=mapper)
    )
    p.add_layout(
        ColorBar(
            color_mapper=mapper,
            width=10,
            title=lab.unit,
            title_text_font_size="11px",
            formatter=BasicTickFormatter(use_scientific=False),
        ),
        "right",
    )
    _node_axis(p, names)
    p.add_tools(
        HoverTool(
            renderers=[img],
            tooltips=[("node", "$y{custom}"), ("t", "$x{0.0} s"), ("highest", f"@image{{0,0.[000]}} {lab.unit}")],
            formatters={"$y": _node_name(names, rounded=True)},
        )
    )
    return p


def _node_axis(p: Plot, names: list[str]) -> None:
    """The nodes on the y axis, the first on top (at most about 30 names written)."""
    step = max(1, len(names) // 30)
    p.yaxis.ticker = FixedTicker(ticks=list(range(0, len(names), step)))
    p.yaxis.major_label_overrides = {i: names[i] for i in range(0, len(names), step)}
    p.y_range = Range1d(start=len(names) - 0.5, end=-0.5)


def timeline_plot(run: Run, plan: Plan, window: Window, budget: int) -> Plot:
    """A flag of a role's nodes as a state timeline: a row per node, a bar while it was true."""
    ((field, _),) = plan.fields
    series = plan.role.series
    buckets = max(MIN_NODE_BUCKETS, min(BUCKETS, budget // (3 * len(series))))
    gap = (run.span[1] - run.span[0]) / buckets
    left, right, row = [], [], []
    for i, s in enumerate(series):
        t, y = run.of(field, s)
        start, end = on_spans(t, y > 0, gap)
        left.append(start)
        right.append(end)
        row.append(np.full(len(start), i, dtype=np.int32))
    spans = sum(map(len, left))
    n = len(series)
    who = f"{plan.role.name} {series[0].node_id}" if n == 1 else f"{plan.role.name}, {n} nodes"
    p = _figure(
        f"{plan.title}: {who} - a bar while true ({spans:,} spans)",
        run,
        window,
        "node",
        height=min(420, max(150, 60 + 14 * n)),
        y_grid=False,
    )
    p.add_glyph(
        ColumnDataSource(
            {"row": np.concatenate(row), "left": _f32(np.concatenate(left)), "right": _f32(np.concatenate(right))}
        ),
        HBar(y="row", left="left", right="right", height=0.8, fill_color=FLAG_COLOUR, line_color=None),
    )
    _node_axis(p, plan.role.names)
    p.add_tools(
        HoverTool(
            tooltips=[("node", "@row{custom}"), ("from", "@left{0.0} s"), ("to", "@right{0.0} s")],
            formatters={"@row": _node_name(plan.role.names)},
        )
    )
    return p


def plot(run: Run, plan: Plan, window: Window, budget: int) -> Plot:
    draw = {"lines": line_plot, "heatmap": heatmap_plot, "timeline": timeline_plot}[plan.kind]
    p = draw(run, plan, window, budget)
    p.tags = [{"panel": plan.panel, "fields": [f for f, _ in plan.fields], "role": plan.role.name, "kind": plan.kind}]
    return p


def sweep_plot(field: str, sweep: figures.Sweep, runs: list[Run], stats: list[dict[str, Stat]]) -> figure:
    """A figure of runs that differ in one parameter alone (figures.sweeps) against that parameter: each
    run's mean over its mergers' steady samples, and a whisker of one standard deviation (as the
    thesis's figure 29)."""
    lab, param = LABELS[field], sweep.parameter
    chosen = [runs[i] for i in sweep.runs]
    st = [stats[i][field] for i in sweep.runs]
    xs = [param.of(r.doc) for r in chosen]
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    kw: dict[str, Any] = {} if numeric else {"x_range": [param.text(x) for x in xs]}
    p = figure(  # type: ignore[call-arg]  # bokeh's stubs: figure takes tools and active_scroll
        title=f"{lab.label} in the steady state against {param.label} ({len(chosen)} runs, all else equal)",
        height=300,
        sizing_mode="stretch_width",
        tools=TOOLS,
        active_scroll=None,
        **kw,
    )
    # (run, mean, std) of the runs with figures (a Stat has a std when it has a mean)
    known = [(i, s.mean, s.std) for i, s in enumerate(st) if s.mean is not None and s.std is not None]
    scale = lab.scale
    top = max(((mean + std) * scale for _, mean, std in known), default=1.0)
    p.y_range = Range1d(start=0, end=top * 1.1 or 1.0)  # the whiskers, which the automatic range leaves out
    src = ColumnDataSource(
        {
            "x": [xs[i] if numeric else param.text(xs[i]) for i, _, _ in known],
            "mean": [mean * scale for _, mean, _ in known],
            "low": [(mean - std) * scale for _, mean, std in known],
            "high": [(mean + std) * scale for _, mean, std in known],
            "std": [std * scale for _, _, std in known],
            "run": [chosen[i].name for i, _, _ in known],
        }
    )
    dots = p.scatter(x="x", y="mean", source=src, size=9, color=DOT_COLOUR)
    p.add_layout(Whisker(base="x", lower="low", upper="high", source=src))
    p.xaxis.axis_label = param.heading()
    p.yaxis.axis_label = f"per merger: mean ± std ({lab.unit})"
    p.add_tools(
        HoverTool(
            renderers=[dots],
            tooltips=[("run", "@run"), (param.label, "@x"), (lab.label, f"@mean{{0,0.0}} ± @std{{0,0.0}} {lab.unit}")],
        )
    )
    p.tags = [{"sweep": param.name, "field": field, "runs": [r.name for r in chosen]}]
    return p
