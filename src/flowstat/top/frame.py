"""One frame of ``flowstat top``, drawn from fixed inputs (pure: no clock, no terminal): the
verdict on top, a status line, what went wrong with the agents, then the pipeline from its sources
down, one line a node, each line at most ``width`` cells.

The rows go in pipeline order: a node comes after every node that feeds it, indented by its depth
(the longest path from a source); a node fed by several comes once, after the last of them. More
than COLLAPSE_OVER siblings of one role (the same depth, feeders and consumers) are one line,
``producer ×500``, with their summed objects/s and mean shares; a node the verdict names is never
folded into one. Rows past the screen's height are cut with ``… N more``, and scroll.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.text import Text

from flowstat.flow import BACKPRESSURE_OK, BUSY_HIGH, Verdict

from .watch import NodeView

COLLAPSE_OVER = 8  # siblings of one role shown one by one; more are one line
LOW = 0.50  # Flink's backpressure levels: OK up to BACKPRESSURE_OK (10%), LOW up to 50%, HIGH above
VERDICT_LINES = 3  # the verdict and its evidence, wrapped to at most this many lines
PROBLEM_LINES = 3  # agents' problems shown, then "... N more"
BAR = 6  # cells of the busy/backpressured/idle bar
MIN_NODE = 14  # the node column's least width (the bar goes first on a narrow screen)
MAX_NODE = 36  # ... and its most (a wide screen leaves the rest blank)

KIND_STYLE = {"held_back": "bold red", "none": "bold green", "unknown": "bold yellow"}
KIND_WORD = {"held_back": "HELD BACK", "none": "FLOWING", "unknown": "UNKNOWN"}
STATE_STYLE = {"RUNNING": "green", "DOWN": "bold red", "STOPPED": "dim", "LEFT_TOP": "dim"}
BAR_PARTS = (("█", "red"), ("▓", "magenta"), ("░", "blue"))  # busy, backpressured, idle (Flink's red/black/blue)


@dataclass(frozen=True)
class TreeRow:
    """One line of the graph: a node, or several siblings folded into one (``count``)."""

    label: str
    depth: int
    role: str
    state: str | None
    in_rate: float | None
    busy: float | None
    backpressured: float | None
    idle: float | None
    latency_ms: float | None
    count: int = 1
    held: bool = False
    reported: bool = True


@dataclass
class Frame:
    """What one frame shows. ``agents``: each agent's URL and what went wrong with it (None: it
    answered); ``upstream``: who feeds whom; ``at``: the latest scrape (Unix s; None: none yet).
    ``samples``: the one "agent" is a samples file (--samples; its errors name it), not an agent."""

    verdict: Verdict | None
    views: Sequence[NodeView]
    upstream: Mapping[str, Sequence[str]]
    agents: Sequence[tuple[str, str | None]]
    interval_s: float = 1.0
    at: float | None = None
    notes: Sequence[str] = field(default_factory=list)  # the endpoints' problems
    hint: str = ""  # said after an "unknown" verdict's evidence (what would help)
    keys: bool = True  # say which keys work (a live view)
    samples: bool = False


# -- the rows -----------------------------------------------------------------------------------------
def _natural(text: str) -> tuple[object, ...]:
    """worker-2 before worker-10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def order(ids: Sequence[str], upstream: Mapping[str, Sequence[str]]) -> tuple[list[str], dict[str, int]]:
    """The nodes in pipeline order (each after its feeders: post-order from the sinks, feeders in
    natural order) and each node's depth (the longest path from a source; a cycle is cut where it
    is found)."""
    known = set(ids)
    ups = {n: sorted({u for u in upstream.get(n, ()) if u in known and u != n}, key=_natural) for n in ids}
    downs: dict[str, list[str]] = {n: [] for n in ids}
    for n in ids:
        for u in ups[n]:
            downs[u].append(n)

    depth: dict[str, int] = {}

    def depth_of(n: str, path: frozenset[str]) -> int:
        if n not in depth:
            feeders = [u for u in ups[n] if u not in path]
            depth[n] = 1 + max((depth_of(u, path | {n}) for u in feeders), default=-1)
        return depth[n]

    out: list[str] = []
    done: set[str] = set()

    def visit(n: str) -> None:
        if n in done:
            return
        done.add(n)
        for u in ups[n]:
            visit(u)
        out.append(n)

    for n in sorted((n for n in ids if not downs[n]), key=_natural):
        visit(n)
    for n in sorted(ids, key=_natural):  # what a cycle left
        visit(n)
    for n in ids:
        depth_of(n, frozenset())
    return out, depth


def rows(views: Sequence[NodeView], upstream: Mapping[str, Sequence[str]], held: Sequence[str] = ()) -> list[TreeRow]:
    """The graph's lines: every node in pipeline order, siblings of a role past COLLAPSE_OVER folded."""
    by_id = {v.node_id: v for v in views}
    ids = list(by_id)
    if not any(upstream.get(n) for n in ids):  # no edges: by role, then id
        ids.sort(key=lambda n: (by_id[n].role, _natural(n)))
        ordered, depth = ids, dict.fromkeys(ids, 0)
    else:
        ordered, depth = order(ids, upstream)
    downs: dict[str, list[str]] = {n: [] for n in ids}
    for n in ids:
        for u in upstream.get(n, ()):
            if u in downs:
                downs[u].append(n)

    key = {n: (depth[n], by_id[n].role, tuple(sorted(upstream.get(n, ()))), tuple(sorted(downs[n]))) for n in ids}
    out: list[TreeRow] = []
    i = 0
    while i < len(ordered):
        j = i + 1
        while j < len(ordered) and key[ordered[j]] == key[ordered[i]]:
            j += 1
        group = [by_id[n] for n in ordered[i:j]]
        named = [v for v in group if v.node_id in held]
        rest = [v for v in group if v.node_id not in held]
        if len(rest) > COLLAPSE_OVER:
            out += [_row(v, depth[v.node_id], True) for v in named]
            out.append(_folded(rest, depth[ordered[i]]))
        else:
            out += [_row(v, depth[v.node_id], v.node_id in held) for v in group]
        i = j
    return out


def _row(v: NodeView, depth: int, held: bool) -> TreeRow:
    return TreeRow(
        v.node_id, depth, v.role, v.state, v.in_rate, v.busy, v.backpressured, v.idle, v.latency_ms,
        held=held, reported=v.reported,
    )  # fmt: skip


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [x for x in values if x is not None]
    return sum(xs) / len(xs) if xs else None


def _folded(group: Sequence[NodeView], depth: int) -> TreeRow:
    states = Counter(v.state for v in group)
    state = next(iter(states)) if len(states) == 1 else "mixed"
    rates = [v.in_rate for v in group if v.in_rate is not None]
    return TreeRow(
        f"{group[0].role or 'node'} ×{len(group)}",
        depth,
        group[0].role,
        state,
        sum(rates) if rates else None,
        _mean([v.busy for v in group]),
        _mean([v.backpressured for v in group]),
        _mean([v.idle for v in group]),
        _mean([v.latency_ms for v in group]),
        count=len(group),
        reported=any(v.reported for v in group),
    )


# -- the figures ------------------------------------------------------------------------------------
def rate(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if value < 10:
        return f"{value:.1f}"
    if value < 1e4:
        return f"{value:.0f}"
    if value < 1e6:
        return f"{value / 1e3:.1f}k" if value < 1e5 else f"{value / 1e3:.0f}k"
    return f"{value / 1e6:.1f}M"


def pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f}%"


def ms(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1e3:.0f} µs"
    if value < 10:
        return f"{value:.1f} ms"
    if value < 1e4:
        return f"{value:.0f} ms"
    return f"{value / 1e3:.0f} s"


def level(share: float | None) -> str:
    """Flink's backpressure level of a share: OK, LOW or HIGH ('' when unknown)."""
    if share is None:
        return ""
    return "OK" if share <= BACKPRESSURE_OK else "LOW" if share <= LOW else "HIGH"


def backpressure_style(share: float | None) -> str:
    return {"OK": "green", "LOW": "yellow", "HIGH": "bold red"}.get(level(share), "dim")


def busy_style(share: float | None) -> str:
    if share is None:
        return "dim"
    return "bold red" if share >= BUSY_HIGH else "yellow" if share > LOW else ""


def bar(busy: float | None, backpressured: float | None, idle: float | None, cells: int = BAR) -> Text:
    """The shares as a bar of ``cells``: busy █, backpressured ▓, idle ░ (coloured too)."""
    if busy is None or backpressured is None:
        return Text(" " * cells)
    shares = [busy, backpressured, idle if idle is not None else max(0.0, 1 - busy - backpressured)]
    counts = [round(s * cells) for s in shares]
    while sum(counts) > cells:
        counts[counts.index(max(counts))] -= 1
    counts[2] += cells - sum(counts)
    out = Text()
    for n, (char, style) in zip(counts, BAR_PARTS, strict=True):
        out.append(char * n, style=style)
    return out


# -- the frame --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Columns:
    node: int
    bar: int
    ROLE = 8
    STATE = 8
    IN = 7
    BUSY = 5
    BACKPR = 6
    IDLE = 5
    LAT = 8

    @classmethod
    def fit(cls, width: int) -> _Columns:
        fixed = 1 + cls.ROLE + 1 + cls.STATE + 1 + cls.IN + 1 + cls.BUSY + 1 + cls.BACKPR + 1 + cls.IDLE + 1 + cls.LAT
        with_bar = width - fixed - (BAR + 1)
        if with_bar >= MIN_NODE:
            return cls(min(with_bar, MAX_NODE), BAR)
        return cls(max(MIN_NODE, width - fixed), 0)


def _cell(text: str, width: int, right: bool = False) -> str:
    if cell_len(text) > width:
        text = _cut(text, width)
    pad = " " * (width - cell_len(text))
    return pad + text if right else text + pad


def _cut(text: str, width: int) -> str:
    while text and cell_len(text) > width - 1:
        text = text[:-1]
    return text + "…" if width > 0 else ""


def _header(c: _Columns) -> Text:
    parts = [
        _cell(" NODE", c.node),
        _cell("ROLE", c.ROLE),
        _cell("STATE", c.STATE),
        _cell("IN/s", c.IN, True),
        _cell("BUSY", c.BUSY, True),
        _cell("BACKPR", c.BACKPR, True),
        _cell("IDLE", c.IDLE, True),
    ]
    if c.bar:
        parts.append(" " * c.bar)
    parts.append(_cell("LAT p50", c.LAT, True))
    return Text(" ".join(parts), style="bold reverse")


def _line(row: TreeRow, c: _Columns) -> Text:
    indent = "" if row.depth == 0 else "  " * min(row.depth - 1, 6) + "└ "
    gutter = "▶" if row.held else " "
    out = Text(no_wrap=True)
    out.append(gutter, style="bold red")
    out.append(_cell(indent + row.label, c.node - 1), style="bold red" if row.held else "bold" if row.count > 1 else "")
    out.append(" ")
    out.append(_cell(row.role, c.ROLE), style="cyan")
    out.append(" ")
    out.append(
        _cell(row.state or "—", c.STATE), style=STATE_STYLE.get(row.state or "", "yellow" if row.state else "dim")
    )
    out.append(" ")
    out.append(_cell(rate(row.in_rate), c.IN, True))
    out.append(" ")
    out.append(_cell(pct(row.busy), c.BUSY, True), style=busy_style(row.busy))
    out.append(" ")
    out.append(_cell(pct(row.backpressured), c.BACKPR, True), style=backpressure_style(row.backpressured))
    out.append(" ")
    out.append(_cell(pct(row.idle), c.IDLE, True), style="dim" if row.idle is None else "blue")
    if c.bar:
        out.append(" ")
        out.append_text(bar(row.busy, row.backpressured, row.idle, c.bar))
    out.append(" ")
    out.append(_cell(ms(row.latency_ms), c.LAT, True))
    if not row.reported:
        out.stylize("dim")
    return out


def verdict_lines(verdict: Verdict | None, width: int, waiting_for: int | str = 1, hint: str = "") -> list[Text]:
    """The verdict, in its colour, then its evidence: wrapped to at most VERDICT_LINES lines.
    ``waiting_for``: how many agents, or what (before the first round)."""
    if verdict is None:
        what = waiting_for if isinstance(waiting_for, str) else f"the first scrape of {waiting_for} agent(s)"
        word, kind, rest = "WAITING", "unknown", f"for {what}"
    else:
        word, kind = KIND_WORD[verdict.kind], verdict.kind
        if verdict.kind == "held_back":
            word += " by " + ", ".join(verdict.nodes)
        rest = verdict.evidence + (f" ({hint})" if hint and verdict.kind == "unknown" else "")
    head = f"{word} — "
    wrapped = textwrap.wrap(
        head + rest, width=max(10, width), max_lines=VERDICT_LINES, placeholder=" …", subsequent_indent="  "
    )
    out = []
    for k, line in enumerate(wrapped):
        text = Text(line, no_wrap=True)
        if k == 0:
            text.stylize(KIND_STYLE[kind], 0, min(len(line), len(head) - 1))
        out.append(text)
    return out


def render(frame: Frame, width: int, height: int | None = None, offset: int = 0) -> tuple[list[Text], int]:
    """The frame's lines, each at most ``width`` cells; ``height``: the screen's lines (None: as
    many as it takes, every node shown). Returns the lines and the offset used (the scroll,
    clamped to what there is to show)."""
    waiting = "the first read of the samples" if frame.samples else len(frame.agents)
    top = verdict_lines(frame.verdict, width, waiting, frame.hint)
    answering = sum(1 for _, error in frame.agents if error is None)
    clock = time.strftime("%H:%M:%S", time.localtime(frame.at)) if frame.at is not None else "--:--:--"
    source = (
        f"samples of {', '.join(url for url, _ in frame.agents)}"
        if frame.samples
        else f"{answering}/{len(frame.agents)} agents answering"
    )
    status = f"{len(frame.views)} nodes · {source} · every {frame.interval_s:g} s · {clock}"
    gap = width - cell_len(status) - len("q quits")
    top.append(Text(status + " " * gap + "q quits" if frame.keys and gap >= 1 else status, style="dim"))
    failed = [(url, error) for url, error in frame.agents if error is not None]
    for url, error in failed[:PROBLEM_LINES]:
        top.append(Text(error if frame.samples else f"agent {url}: {error}", style="bold red"))
    if len(failed) > PROBLEM_LINES:
        top.append(Text(f"… {len(failed) - PROBLEM_LINES} more agents not answering", style="bold red"))
    for note in frame.notes[:2]:
        top.append(Text(note, style="yellow"))
    if len(frame.notes) > 2:
        top.append(Text(f"… {len(frame.notes) - 2} more problems with the endpoints", style="yellow"))

    columns = _Columns.fit(width)
    held = frame.verdict.nodes if frame.verdict else ()
    graph = rows(frame.views, frame.upstream, held)
    room = None if height is None else max(1, height - len(top) - 1)
    if room is not None and len(graph) > room:
        shown = max(1, room - 1)
        offset = max(0, min(offset, len(graph) - shown))
        below = len(graph) - offset - shown
        more = f"… {below} more" if below else "… end"
        if offset:
            more += f" ({offset} above)"
        more += " · ↑↓ PgUp PgDn scroll" if frame.keys else ""
        body = [_line(r, columns) for r in graph[offset : offset + shown]] + [Text(more, style="dim")]
    else:
        offset = 0
        body = [_line(r, columns) for r in graph]
    lines = top + [_header(columns)] + body
    for line in lines:
        line.no_wrap = True
        line.truncate(width, overflow="ellipsis")
    return lines, offset
