"""The pipeline graph on the report's first screen (issue 46: which node holds the flow back?): a
run's nodes and who feeds whom, as an SVG written here (no plot library: it shows at once).

**Nodes**: every node of the run file and of endpoints.json but the agents, in columns by their depth
from the sources (a node's column: the longest path to it from a node nobody feeds), sources left,
sinks right; in a column, in the order of the boxes they feed, then by name. More than HANDFUL (8)
siblings of one role in one column are one box, "producers ×500": their shares averaged over those
that account their time, their arrows' rates summed.

**A box**: the node's id, and a bar of where its time went over the steady window
(figures.steady_window), as Flink colours a task: busy (red-orange), backpressured (purple), idle
(light blue). The shares: the increases of busy_seconds, backpressured_seconds and idle_seconds
from the node's first sample in the window to its last (a decrease, a restart, skipped), over their
sum: exact, whatever the sampling. A node with the ratios but not the counters: the mean of its
busy_ratio, backpressured_ratio and idle_ratio over its samples in the window. A node with neither
(an older run, a node that does not account its time) is grey, "no accounting".

**Arrows** (endpoints.json's ``upstream``: the nodes that feed each one): width and label the
objects/s flowing over the steady window:

- from a node with one downstream node: its objects_sent's rate (all it sent went there);
- otherwise (a node feeding several, or one without objects_sent): the downstream node's
  objects_received rate, less what the feeders of the first kind bring it, split evenly among its
  other feeders, labelled "≈" (nodes count per node, not per edge: the split is a guess);
- neither: a thin dashed grey arrow without a label; an arrow of several edges some of whose rates
  are unknown is labelled "≥" its known part.

A counter's rate: its increases from sample to sample in the window (a decrease skipped) over the
time they span.

**No overlap, nothing outside the picture**: a text's width is estimated from its characters with
conservative widths (DejaVu Sans', Debian's default font and among the widest); boxes and the gaps
between columns are sized from their texts. An arrow's label goes above its line, at its start (at
its end for one of a node's several arrows into a box they alone enter), on a white halo; one that
would still touch another text or leave the picture at both ends is left to the arrow's tooltip.

**The verdict** (flowstat.flow.held_back_by over the whole steady window, when the run's samples there
are at most POINT_BUDGET): the nodes it names get a thick outline and the caption names them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import numpy as np

from flowstat.flow import Point, Verdict, held_back_by
from flowstat.schema import endpoints as endpoints_schema
from flowstat.schema import sample as sample_schema

from .figures import HANDFUL, Window, natural
from .load import Run

ENDPOINTS = "endpoints.json"
NOT_DRAWN = frozenset({"agent"})  # roles that are no part of the pipeline
NO_EDGES = "this run's nodes did not say who feeds them"
KINDS = ("busy", "backpressured", "idle")
COLOURS = {"busy": "#e4572e", "backpressured": "#6a3d9a", "idle": "#8fb9da"}
NO_ACCOUNTING = "#bdbdbd"
ARROW, ARROW_UNKNOWN, HELD = "#555555", "#aaaaaa", "#111111"
POINT_BUDGET = 50_000  # samples in the window up to which the verdict is worked out (a Python object each)

FONT, SMALL = 12.0, 10.0  # px: a node's id; its shares, the arrows' labels, the legend
ASCENT, DESCENT = 0.95, 0.26  # a text's extent about its baseline, in font sizes (DejaVu Sans: 0.93, 0.24)
PAD, MARGIN, VGAP = 6.0, 8.0, 10.0
BAR_H, BOX_H = 9.0, 50.0
MIN_BOX_W, MIN_GAP, HEAD = 110.0, 48.0, 9.0  # HEAD: an arrowhead's length
LABEL_CHARS = 26  # a longer node id is cut (whole in the box's tooltip)
_WIDE = frozenset("mwMW%@×≈≥…—")


def text_width(text: str, size: float, bold: bool = False) -> float:
    """A text's width at least (px): 1 em for the widest characters, 0.8 for capitals, 0.66 for the
    rest (DejaVu Sans: digits 0.64, most lower case 0.6 or less), a tenth more in bold."""
    em = sum(1.0 if c in _WIDE else 0.8 if c.isupper() else 0.66 for c in text)
    return em * size * (1.1 if bold else 1.0)


def text_box(x: float, y: float, text: str, size: float, anchor: str = "start", bold: bool = False) -> tuple:
    """The box (x0, y0, x1, y1) a text drawn at (x, y), its baseline, takes at most."""
    w = text_width(text, size, bold)
    x0 = x - w if anchor == "end" else x - w / 2 if anchor == "middle" else x
    return (x0, y - ASCENT * size, x0 + w, y + DESCENT * size)


def overlap(a: tuple, b: tuple) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


# -- what each node did over the steady window --------------------------------------------------------


@dataclass(frozen=True)
class Shares:
    busy: float
    backpressured: float
    idle: float

    def of(self, kind: str) -> float:
        return float(getattr(self, kind))

    def text(self) -> str:
        return f"busy {self.busy:.0%} bp {self.backpressured:.0%} idle {self.idle:.0%}"


@dataclass(frozen=True)
class NodeFlow:
    """A node over the steady window: where its time went (None: it does not account it), and the
    objects/s it sent and received (None: no such counter there)."""

    node_id: str
    role: str
    shares: Shares | None
    sent: float | None
    received: float | None


def rate(t: np.ndarray, y: np.ndarray) -> float | None:
    """A counter's increase per second over samples in time order (NaN: none there), decreases skipped."""
    has = ~np.isnan(y)
    t, y = t[has], y[has]
    if len(y) < 2:
        return None
    dy, dt = np.diff(y), np.diff(t)
    ok = (dy >= 0) & (dt > 0)
    span = float(dt[ok].sum())
    return float(dy[ok].sum()) / span if span > 0 else None


def _columns(run: Run, rows: np.ndarray, names: Iterable[str]) -> np.ndarray | None:
    """The samples' values of the fields, a row per sample that has all of them (None: a field the
    run's sample schema does not have)."""
    cols = [run.values.get(n) for n in names]
    if any(c is None for c in cols):
        return None
    m = np.column_stack([c[rows] for c in cols if c is not None])
    return m[~np.isnan(m).any(axis=1)]


def shares(run: Run, rows: np.ndarray) -> Shares | None:
    """Where a node's time went over its samples ``rows`` (in time order): see the module's doc."""
    seconds = _columns(run, rows, (f"{k}_seconds" for k in KINDS))
    if seconds is not None and len(seconds) >= 2:
        step = np.diff(seconds, axis=0)
        total = step[(step >= 0).all(axis=1)].sum(axis=0)
        if total.sum() > 0:
            return Shares(*(float(x) for x in total / total.sum()))
    ratios = _columns(run, rows, (f"{k}_ratio" for k in KINDS))
    if ratios is not None and len(ratios):
        mean = ratios.mean(axis=0)
        if mean.sum() > 0:
            return Shares(*(float(x) for x in mean / mean.sum()))
    return None


def window_rows(run: Run, lo: int, hi: int, window: Window) -> np.ndarray:
    rows = np.arange(lo, hi)
    return rows[(run.t[rows] >= window.lo) & (run.t[rows] <= window.hi)]


def node_flows(run: Run, window: Window) -> dict[str, NodeFlow]:
    """Each node of the run file (but the agents) over the steady window."""
    out = {}
    none = np.full(len(run.t), np.nan)
    for s in run.series:
        if s.role in NOT_DRAWN:
            continue
        rows = window_rows(run, s.lo, s.hi, window)
        t = run.t[rows]
        out[s.node_id] = NodeFlow(
            s.node_id,
            s.role,
            shares(run, rows),
            rate(t, run.values.get("objects_sent", none)[rows]),
            rate(t, run.values.get("objects_received", none)[rows]),
        )
    return out


def read_upstream(run_dir: Path) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Who feeds whom, from the run directory's endpoints.json: each node that says its ``upstream``,
    and every node's role there. Empty for a run without the file, or one that cannot be read."""
    path = (run_dir if run_dir.is_dir() else run_dir.parent) / ENDPOINTS
    try:
        _, nodes, _ = endpoints_schema.read(path)
    except (OSError, ValueError):
        return {}, {}
    upstream = {n["node_id"]: tuple(n["upstream"]) for n in nodes if isinstance(n.get("upstream"), list)}
    return upstream, {n["node_id"]: n["role"] for n in nodes if isinstance(n.get("role"), str)}


# -- the graph: boxes in columns, arrows between them --------------------------------------------------


@dataclass
class Box:
    """A node, or siblings collapsed into one, and where it is drawn."""

    key: str
    label: str
    role: str
    depth: int
    members: tuple[str, ...]
    shares: Shares | None
    accounted: int  # members that account their time
    sent: float | None
    received: float | None
    held: bool = False
    x: float = 0.0
    y: float = 0.0
    w: float = MIN_BOX_W
    h: float = BOX_H

    @property
    def collapsed(self) -> bool:
        return len(self.members) > 1


@dataclass
class Arrow:
    """The edges from the nodes of one box to those of another: the objects/s they carry (None: not
    known), ``how`` it is known (sent, split, partial or unknown: see the module's doc)."""

    src: Box
    dst: Box
    rate: float | None
    how: str
    edges: int
    label: str = ""
    width: float = 1.5  # of its line: 1.5 to 6 px, by its rate against the graph's largest
    shown: bool = False  # the label drawn (else in the tooltip only), its baseline starting at ``at``
    at: tuple[float, float] = (0.0, 0.0)
    start: tuple[float, float] = (0.0, 0.0)
    end: tuple[float, float] = (0.0, 0.0)


@dataclass
class Graph:
    boxes: list[Box]
    arrows: list[Arrow]
    width: float = 0.0
    height: float = 0.0
    legend: list[tuple[str, str, float, float]] = field(default_factory=list)  # (text, colour, x, baseline)


def depths(nodes: Iterable[str], feeders: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Each node's longest path from a source (a node nobody feeds). A node on a cycle: one past the
    deepest of its feeders that are not (a cycle has no longest path)."""
    nodes = list(nodes)
    ups = {n: set(feeders.get(n, ())) & set(nodes) for n in nodes}
    downs: dict[str, list[str]] = defaultdict(list)
    for n, us in ups.items():
        for u in us:
            downs[u].append(n)
    waiting = {n: len(us) for n, us in ups.items()}
    ready = [n for n in nodes if not waiting[n]]
    depth = {n: 0 for n in ready}
    while ready:
        n = ready.pop()
        for d in downs[n]:
            depth[d] = max(depth.get(d, 0), depth[n] + 1)
            waiting[d] -= 1
            if not waiting[d]:
                ready.append(d)
    for n in sorted((n for n in nodes if n not in depth), key=natural):  # on a cycle
        depth[n] = 1 + max((depth[u] for u in ups[n] if u in depth), default=-1)
    return depth


def edge_rates(edges: set[tuple[str, str]], flows: Mapping[str, NodeFlow]) -> dict[tuple[str, str], tuple]:
    """Each edge's objects/s and how it is known: (rate, "sent"), (rate, "split") or (None, "unknown")."""
    downs: dict[str, set[str]] = defaultdict(set)
    ups: dict[str, set[str]] = defaultdict(set)
    for u, d in edges:
        downs[u].add(d)
        ups[d].add(u)
    out: dict[tuple[str, str], tuple] = {}
    for u, d in edges:
        sent = flows[u].sent if u in flows else None
        if len(downs[u]) == 1 and sent is not None:
            out[(u, d)] = (sent, "sent")
    for d, feeders in ups.items():
        rest = sorted(u for u in feeders if (u, d) not in out)
        got = flows[d].received if d in flows else None
        if not rest:
            continue
        if got is None:
            out.update({(u, d): (None, "unknown") for u in rest})
            continue
        left = max(0.0, got - sum(out[(u, d)][0] for u in feeders if (u, d) in out))
        out.update({(u, d): (left / len(rest), "split") for u in rest})
    return out


def _mean_shares(members: list[NodeFlow]) -> Shares | None:
    got = [m.shares for m in members if m.shares is not None]
    if not got:
        return None
    return Shares(*(math.fsum(s.of(k) for s in got) / len(got) for k in KINDS))


def _total(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return math.fsum(got) if got else None


def build(
    flows: Mapping[str, NodeFlow],
    upstream: Mapping[str, Iterable[str]],
    roles: Mapping[str, str] | None = None,
    held: Iterable[str] = (),
) -> Graph | None:
    """The graph of the nodes ``flows`` (and those ``upstream`` names), laid out; None when no node
    says who feeds it (no edges)."""
    roles = roles or {}

    def role(n: str) -> str:
        return flows[n].role if n in flows else roles.get(n, "other")

    edges = {(u, d) for d, us in upstream.items() for u in us if u != d}
    edges = {(u, d) for u, d in edges if role(u) not in NOT_DRAWN and role(d) not in NOT_DRAWN}
    if not edges:
        return None
    nodes = sorted({n for n in flows if role(n) not in NOT_DRAWN} | {n for e in edges for n in e}, key=natural)
    feeders: dict[str, set[str]] = defaultdict(set)
    for u, d in edges:
        feeders[d].add(u)
    depth = depths(nodes, feeders)
    held = set(held)
    siblings: dict[tuple[int, str], list[str]] = defaultdict(list)
    for n in nodes:
        siblings[(depth[n], role(n))].append(n)
    box_of: dict[str, Box] = {}
    boxes = []
    for (level, r), members in sorted(siblings.items(), key=lambda kv: (kv[0][0], natural(kv[0][1]))):
        groups = [members] if len(members) > HANDFUL else [[m] for m in members]
        for group in groups:
            measured = [flows[m] for m in group if m in flows]
            box = Box(
                key=f"{r}@{level}" if len(group) > 1 else group[0],
                label=f"{r}s ×{len(group)}" if len(group) > 1 else _cut(group[0]),
                role=r,
                depth=level,
                members=tuple(group),
                shares=_mean_shares(measured),
                accounted=sum(f.shares is not None for f in measured),
                sent=_total(f.sent for f in measured),
                received=_total(f.received for f in measured),
                held=bool(held & set(group)),
            )
            boxes.append(box)
            box_of.update({m: box for m in group})
    rates = edge_rates(edges, flows)
    joined: dict[tuple[str, str], list[tuple]] = defaultdict(list)
    for (u, d), edge in rates.items():
        if box_of[u] is not box_of[d]:
            joined[(box_of[u].key, box_of[d].key)].append(edge)
    by_key = {b.key: b for b in boxes}
    arrows = []
    for (a, b), each in sorted(joined.items()):
        known = [r for r, _ in each if r is not None]
        hows = {h for _, h in each}
        how = "unknown" if not known else "partial" if "unknown" in hows else "split" if "split" in hows else "sent"
        arrows.append(Arrow(by_key[a], by_key[b], math.fsum(known) if known else None, how, len(each)))
    graph = Graph(boxes, arrows)
    _lay_out(graph)
    return graph


def _cut(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"


def rate_text(r: float) -> str:
    return f"{r:,.0f}/s" if r >= 10 else f"{r:.2g}/s"


def _lay_out(g: Graph) -> None:
    """Box sizes from their texts, columns right to left (each in the order of what it feeds), gaps
    from the arrows' labels, then the labels that fit."""
    columns: dict[int, list[Box]] = defaultdict(list)
    for b in g.boxes:
        b.w = max(MIN_BOX_W, text_width(b.label, FONT, bold=True), text_width(_share_text(b), SMALL)) + 2 * PAD
        columns[b.depth].append(b)
    pitch = BOX_H + VGAP
    tall = max(len(c) for c in columns.values()) * pitch - VGAP
    feeds: dict[str, list[Box]] = defaultdict(list)
    for a in g.arrows:
        feeds[a.src.key].append(a.dst)
    for d in sorted(columns, reverse=True):  # sinks first: a column in the order of the boxes it feeds
        col = columns[d]
        col.sort(key=lambda b: (min((x.y for x in feeds[b.key] if x.depth > d), default=math.inf), natural(b.label)))
        top = MARGIN + (tall - len(col) * pitch + VGAP) / 2
        for j, b in enumerate(col):
            b.y = top + j * pitch
    top = max((a.rate for a in g.arrows if a.rate is not None), default=0.0)
    for a in g.arrows:
        a.label = (
            ""
            if a.rate is None
            else ("≥" if a.how == "partial" else "≈" if a.how == "split" else "") + rate_text(a.rate)
        )
        a.width = 1.5 + 4.5 * a.rate / top if a.rate is not None and top > 0 else 1.5
    x = right = MARGIN
    for d in sorted(columns):
        col = columns[d]
        width = max(b.w for b in col)
        for b in col:
            b.x, b.w = x, width
        right = x + width
        # the gap after the column: room for the labels of the arrows leaving it and of those entering
        # the next (a label is at one end or the other), and for the arrowheads
        near = [a for a in g.arrows if a.src.depth == d or a.dst.depth == d + 1]
        x = right + max([MIN_GAP] + [text_width(a.label, SMALL) + 8 + HEAD + 6 for a in near])
    _ends(g)
    # the legend, below
    items = [(k if k != "backpressured" else "backpressured (bp)", COLOURS[k]) for k in KINDS]
    items.append(("no accounting", NO_ACCOUNTING))
    if any(b.held for b in g.boxes):
        items.append(("holds the flow back", HELD))
    base = MARGIN + tall + 12 + ASCENT * SMALL
    lx = MARGIN
    for text, colour in items:
        g.legend.append((text, colour, lx, base))
        lx += 12 + 4 + text_width(text, SMALL) + 14
    g.width = max(right + MARGIN, lx - 14 + MARGIN)
    g.height = base + DESCENT * SMALL + MARGIN
    # the arrows' labels, above the line at its start (at its end for one of several arrows leaving a
    # box into a box they alone enter: a fan-out's labels, one a row), else at the other end, else none
    taken = [t for b in g.boxes for t in _box_texts(b)] + [
        text_box(x + 16, y, text, SMALL) for text, _, x, y in g.legend
    ]
    leaving: dict[str, int] = defaultdict(int)
    entering: dict[str, int] = defaultdict(int)
    for a in g.arrows:
        leaving[a.src.key] += 1
        entering[a.dst.key] += 1
    for a in sorted(g.arrows, key=lambda a: (a.src.x, a.start[1])):
        if not a.label:
            continue
        lift = a.width / 2 + 2 + DESCENT * SMALL
        at_start = (a.start[0] + 4, a.start[1] - lift)
        at_end = (a.end[0] - 3 - text_width(a.label, SMALL), a.end[1] - lift)
        fan_out = leaving[a.src.key] > 1 and entering[a.dst.key] == 1
        for at in (at_end, at_start) if fan_out else (at_start, at_end):
            box = text_box(*at, a.label, SMALL)
            inside = box[0] >= 0 and box[1] >= 0 and box[2] <= g.width and box[3] <= g.height
            if inside and not any(overlap(box, t) for t in taken):
                a.shown, a.at = True, at
                taken.append(box)
                break


def _ends(g: Graph) -> None:
    """Where each arrow leaves its box (its right side, spread for several) and enters the other's."""
    out: dict[str, list[Arrow]] = defaultdict(list)
    into: dict[str, list[Arrow]] = defaultdict(list)
    for a in g.arrows:
        out[a.src.key].append(a)
        into[a.dst.key].append(a)
    for group in out.values():
        group.sort(key=lambda a: (a.dst.y, a.dst.x))
        for k, a in enumerate(group):
            a.start = (a.src.x + a.src.w, a.src.y + a.src.h * (k + 1) / (len(group) + 1))
    for group in into.values():
        group.sort(key=lambda a: (a.src.y, a.src.x))
        for k, a in enumerate(group):
            a.end = (a.dst.x - HEAD, a.dst.y + a.dst.h * (k + 1) / (len(group) + 1))


def _share_text(b: Box) -> str:
    return b.shares.text() if b.shares is not None else "no accounting"


def _id_at(b: Box) -> tuple[float, float]:
    return b.x + PAD, b.y + PAD + ASCENT * FONT


def _bar_at(b: Box) -> tuple[float, float, float]:
    """The bar's left, top and width."""
    return b.x + PAD, b.y + PAD + (ASCENT + DESCENT) * FONT + 3, b.w - 2 * PAD


def _shares_at(b: Box) -> tuple[float, float]:
    _, top, _ = _bar_at(b)
    return b.x + PAD, top + BAR_H + 3 + ASCENT * SMALL


def _box_texts(b: Box) -> list[tuple]:
    return [text_box(*_id_at(b), b.label, FONT, bold=True), text_box(*_shares_at(b), _share_text(b), SMALL)]


# -- the SVG ---------------------------------------------------------------------------------------------


def _f(x: float) -> str:
    return f"{x:.1f}"


def _text(
    x: float, y: float, text: str, size: float, cls: str, bold: bool = False, fill: str = "#222", halo: bool = False
) -> str:
    """A text at (x, y), its baseline's start (``halo``: a white outline, readable over lines)."""
    weight = ' font-weight="bold"' if bold else ""
    outline = ' stroke="#fff" stroke-width="3" stroke-linejoin="round" paint-order="stroke"' if halo else ""
    return (
        f'<text class="{cls}" x="{_f(x)}" y="{_f(y)}" font-size="{size:g}" text-anchor="start"{weight} '
        f'fill="{fill}"{outline}>{escape(text)}</text>'
    )


def _node_title(b: Box) -> str:
    who = (
        f"{b.label}: {', '.join(b.members[:3])} … {b.members[-1]}"
        if b.collapsed and len(b.members) > 4
        else f"{', '.join(b.members)} ({b.role})"
    )
    if b.shares is None:
        time = "no time accounting"
    else:
        time = ", ".join(f"{k} {b.shares.of(k):.1%}" for k in KINDS) + " of the time in the steady state"
        if b.collapsed:
            time += f" (mean of the {b.accounted} of {len(b.members)} that account their time)"
    flow = "; ".join(
        f"{what} {rate_text(r)}{' in all' if b.collapsed else ''}"
        for what, r in (("sent", b.sent), ("received", b.received))
        if r is not None
    )
    return "; ".join(x for x in (who, time, flow, "holds the flow back (the verdict)" if b.held else "") if x)


def _box_svg(b: Box) -> str:
    attrs = f' data-node="{escape(b.key)}" data-members="{len(b.members)}" data-role="{escape(b.role)}"'
    if b.shares is not None:
        attrs += "".join(f' data-{k}="{b.shares.of(k):.4f}"' for k in KINDS)
    if b.held:
        attrs += ' data-held="true"'
    stroke = f'stroke="{HELD}" stroke-width="3"' if b.held else 'stroke="#999" stroke-width="1"'
    out = [
        f'<g class="node"{attrs}><title>{escape(_node_title(b))}</title>',
        f'<rect class="box" x="{_f(b.x)}" y="{_f(b.y)}" width="{_f(b.w)}" height="{_f(b.h)}" rx="4" '
        f'fill="#fff" {stroke}/>',
        _text(*_id_at(b), b.label, FONT, "id", bold=True),
    ]
    left, top, width = _bar_at(b)
    if b.shares is None:
        out.append(
            f'<rect class="share" data-share="none" x="{_f(left)}" y="{_f(top)}" width="{_f(width)}" '
            f'height="{BAR_H:g}" fill="{NO_ACCOUNTING}"/>'
        )
    else:
        at = left
        for k in KINDS:
            w = width * b.shares.of(k)
            out.append(
                f'<rect class="share" data-share="{k}" x="{at:.2f}" y="{_f(top)}" width="{w:.2f}" '
                f'height="{BAR_H:g}" fill="{COLOURS[k]}"/>'
            )
            at += w
    out.append(_text(*_shares_at(b), _share_text(b), SMALL, "shares", fill="#444"))
    return "".join(out) + "</g>"


def _arrow_svg(a: Arrow, marker: str) -> str:
    (x1, y1), (x2, y2) = a.start, a.end
    dx = max(20.0, (x2 - x1) / 2)
    path = f"M{_f(x1)},{_f(y1)} C{_f(x1 + dx)},{_f(y1)} {_f(x2 - dx)},{_f(y2)} {_f(x2)},{_f(y2)}"
    known = a.rate is not None
    how = {
        "sent": "what the upstream sent",
        "split": "the downstream's received, split evenly among its feeders",
        "partial": "the edges whose rate is known",
        "unknown": "no objects counter",
    }[a.how]
    title = (
        f"{a.src.label} → {a.dst.label}: {a.label or 'objects/s not known'} ({how}"
        f"{f'; {a.edges} edges' if a.edges > 1 else ''})"
    )
    dash = "" if known else ' stroke-dasharray="4 3"'
    out = (
        f'<path class="edge" data-from="{escape(a.src.key)}" data-to="{escape(a.dst.key)}" '
        f'data-rate="{a.rate if known else ""}" data-how="{a.how}" d="{path}" fill="none" '
        f'stroke="{ARROW if known else ARROW_UNKNOWN}" stroke-width="{a.width:.2f}"{dash} '
        f'marker-end="url(#{marker}-{"k" if known else "u"})"><title>{escape(title)}</title></path>'
    )
    return out


def svg(g: Graph, index: int = 0, title: str = "") -> str:
    """The graph as an inline SVG (its markers' ids made unique in the page by ``index``)."""
    marker = f"fs-arrow-{index}"
    heads = "".join(
        f'<marker id="{marker}-{k}" viewBox="0 0 10 10" refX="0" refY="5" markerWidth="{HEAD:g}" '
        f'markerHeight="{HEAD:g}" markerUnits="userSpaceOnUse" orient="auto">'
        f'<path d="M0,0L10,5L0,10z" fill="{colour}"/></marker>'
        for k, colour in (("k", ARROW), ("u", ARROW_UNKNOWN))
    )
    legend = "".join(
        f'<rect x="{_f(x)}" y="{_f(y - 9)}" width="12" height="10" '
        + (f'fill="#fff" stroke="{colour}" stroke-width="3"/>' if colour == HELD else f'fill="{colour}"/>')
        + _text(x + 16, y, text, SMALL, "legend", fill="#444")
        for text, colour, x, y in g.legend
    )
    return (
        f'<svg class="pipeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_f(g.width)} {_f(g.height)}" '
        f'width="{_f(g.width)}" height="{_f(g.height)}" role="img" font-family="system-ui, sans-serif">'
        f"<title>{escape(title or 'the pipeline graph')}</title><defs>{heads}</defs>"
        + "".join(_arrow_svg(a, marker) for a in g.arrows)
        + "".join(_text(*a.at, a.label, SMALL, "rate", fill="#333", halo=True) for a in g.arrows if a.shown)
        + "".join(_box_svg(b) for b in g.boxes)
        + legend
        + "</svg>"
    )


# -- on the first screen -------------------------------------------------------------------------------


def verdict(run: Run, window: Window, upstream: Mapping[str, Iterable[str]]) -> Verdict | None:
    """flowstat.flow.held_back_by over the whole steady window (None: no window, or more than
    POINT_BUDGET samples in it)."""
    if window.hi <= window.lo or not upstream:
        return None
    picked = [(s.node_id, window_rows(run, s.lo, s.hi, window)) for s in run.series if s.role not in NOT_DRAWN]
    if sum(len(rows) for _, rows in picked) > POINT_BUDGET:
        return None
    none = np.full(len(run.t), np.nan)
    fields = ("busy_ratio", "backpressured_ratio", "idle_ratio", "input_latency_p50_ms")
    columns = [run.values.get(f, none) for f in fields]
    states = sample_schema.NODE_STATES
    start = run.start_ns / 1e9
    series = {}
    for node, rows in picked:
        values = [[None if math.isnan(x) else float(x) for x in c[rows]] for c in columns]
        series[node] = [
            Point(start + float(t), b, p, i, lat, states[k] if 0 <= k < len(states) else sample_schema.STATE_UP)
            for t, b, p, i, lat, k in zip(run.t[rows], *values, run.state[rows], strict=True)
        ]
    ups = {n: tuple(us) for n, us in upstream.items()}
    return held_back_by(series, ups, start + window.hi + 1e-6, window_s=window.hi - window.lo)


def _named(nodes: tuple[str, ...], most: int = 3) -> str:
    return ", ".join(nodes[:most]) + (f" and {len(nodes) - most} more" if len(nodes) > most else "")


def section(index: int, run: Run, window: Window) -> str:
    """The run's pipeline graph with its one-line caption, or a note when its nodes did not say who
    feeds them."""
    upstream, roles = read_upstream(run.path)
    flows = node_flows(run, window)
    graph = build(flows, upstream, roles)
    if graph is None:
        return (
            f'<p class="graph-note note" data-graph="none">Pipeline graph: {escape(NO_EDGES, quote=False)} '
            f"(no <code>upstream</code> in its {ENDPOINTS}).</p>"
        )
    found = verdict(run, window, upstream)
    if found is not None and found.kind == "held_back":
        graph = build(flows, upstream, roles, found.nodes) or graph
    said = {
        None: "",
        "held_back": f" Held back by {_named(found.nodes if found else ())}.",
        "none": " Every node keeps up.",
        "unknown": " No verdict on what holds it back (hover for why).",
    }[found.kind if found else None]
    caption = (
        f'<figcaption title="{escape(found.evidence if found else "")}" '
        f'data-flow-verdict="{found.kind if found else ""}">Where each node\'s time went in the steady state; '
        f"arrows: objects/s.{escape(said)}</figcaption>"
    )
    title = f"the pipeline of {run.name}: {len(graph.boxes)} boxes, {len(graph.arrows)} arrows"
    return f'<figure class="pipeline" id="graph-{index}">{caption}{svg(graph, index, title)}</figure>'
