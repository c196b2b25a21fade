"""Plain SVG line plots for the Markdown tables: a file anyone's browser (and GitHub) shows, with
no JavaScript and no plotting library.

Written small (they are committed, a hundred of them): the grid, the whiskers and each line one
``<path>``, a line's points in whole pixels and relative to the one before (``l``, ``h``, ``v``; a
straight run of points is one step), what elements share (a colour, an anchor) said once on a ``<g>``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 320
LEFT, RIGHT, TOP, BOTTOM = 78, 150, 34, 48  # margins: the right one holds the legend
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Line:
    name: str
    x: list[float]  # positions (categorical plots: indexes of the categories)
    y: list[float]
    err: list[float] | None = None  # a whisker of +- err at each point


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _label(v: float) -> str:
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def num(v: float) -> str:
    """A coordinate to a tenth of a pixel, without a trailing .0 (78, not 78.0)."""
    text = f"{v:.1f}"
    return text[:-2] if text.endswith(".0") else text


def path(points: Iterable[tuple[int, int]]) -> str:
    """The ``d`` of a line through whole-pixel ``points``: M at the first, then each step relative
    (h or v when level or upright, l otherwise; the letter once for steps of one kind in a row).
    Steps further along the same level or upright run are one; a step of nothing is left out."""
    it = iter(points)
    first = next(it, None)
    if first is None:
        return ""
    steps: list[tuple[str, list[int]]] = []
    x0, y0 = first
    for x, y in it:
        dx, dy = x - x0, y - y0
        x0, y0 = x, y
        if dx == dy == 0:
            continue
        cmd, args = ("h", [dx]) if dy == 0 else ("v", [dy]) if dx == 0 else ("l", [dx, dy])
        if steps and cmd != "l" and steps[-1][0] == cmd and (steps[-1][1][0] > 0) == (args[0] > 0):
            steps[-1][1][0] += args[0]
        else:
            steps.append((cmd, args))
    d, last = f"M{first[0]} {first[1]}", ""
    for cmd, args in steps:
        for n in args:
            if cmd != last:
                d += cmd
                last = cmd
            elif n >= 0:
                d += " "  # no space before a minus sign: it starts a new number
            d += str(n)
    return d


def plot(
    title: str,
    x_label: str,
    y_label: str,
    lines: list[Line],
    categories: list[str] | None = None,
    log_x: bool = False,
    note: str = "",
) -> str:
    """The SVG text of ``lines`` on one pair of axes; y starts at 0. ``categories``: the x axis
    names these (lines' x are their indexes); ``note``: a comment in the file (who made it)."""
    fx = (lambda v: math.log10(v)) if log_x else (lambda v: v)
    xs = [fx(v) for ln in lines for v in ln.x] or [0.0]
    tops = [y + (e if ln.err else 0) for ln in lines for y, e in zip(ln.y, ln.err or [0] * len(ln.y), strict=False)]
    x_lo, x_hi = (min(xs), max(xs)) if not categories else (-0.5, len(categories) - 0.5)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_hi = max(tops, default=1.0) * 1.08 or 1.0
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(v: float) -> float:
        return LEFT + (fx(v) - x_lo) / (x_hi - x_lo) * pw if not categories else LEFT + (v - x_lo) / (x_hi - x_lo) * pw

    def py(v: float) -> float:
        return TOP + ph - v / y_hi * ph

    y_ticks = _ticks(0, y_hi)
    x_ticks: list[tuple[float, str]]  # position, label
    if categories:
        x_ticks = [(i, c) for i, c in enumerate(categories)]
    elif log_x:
        x_ticks = [
            (10**e, _label(10**e)) for e in range(math.floor(x_lo), math.ceil(x_hi) + 1) if x_lo <= e <= x_hi
        ] or [(v, _label(v)) for v in sorted({v for ln in lines for v in ln.x})]
    else:
        x_ticks = [(t, _label(t)) for t in _ticks(x_lo, x_hi, 8)]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="11">',
        *([f"<!-- {escape(note)} -->"] if note else []),
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
        '<path d="' + "".join(f"M{LEFT} {num(py(t))}H{LEFT + pw}" for t in y_ticks) + '" stroke="#e5e5e5"/>',
        '<g text-anchor="end">'
        + "".join(f'<text x="{LEFT - 6}" y="{num(py(t) + 4)}">{_label(t)}</text>' for t in y_ticks)
        + "</g>",
        '<g text-anchor="middle">'
        + "".join(f'<text x="{num(px(v))}" y="{TOP + ph + 16}">{escape(str(text))}</text>' for v, text in x_ticks)
        + f'<text x="{num(LEFT + pw / 2)}" y="{HEIGHT - 10}">{escape(x_label)}</text>'
        + f'<text transform="translate(14,{num(TOP + ph / 2)}) rotate(-90)">{escape(y_label)}</text></g>',
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>',
    ]
    for i, ln in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        # whole pixels: a tenth of one is invisible at 640 x 320, and a 300 s series is a third smaller
        pts = [(round(px(x)), round(py(y))) for x, y in zip(ln.x, ln.y, strict=False)]
        out.append(f'<path d="{path(pts)}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        if ln.err is not None or len(ln.x) <= 12:
            dots = "".join(
                f'<circle cx="{num(px(x))}" cy="{num(py(y))}" r="3"/>' for x, y in zip(ln.x, ln.y, strict=False)
            )
            out.append(f'<g fill="{colour}">{dots}</g>')
        whiskers = "".join(
            f"M{num(px(x))} {num(py(max(0.0, y - e)))}V{num(py(y + e))}"
            for x, y, e in zip(ln.x, ln.y, ln.err or [], strict=False)
        )
        if whiskers:
            out.append(f'<path d="{whiskers}" stroke="{colour}"/>')
        ly = TOP + 12 + i * 16
        out.append(
            f'<path d="M{LEFT + pw + 10} {ly - 4}h18" stroke="{colour}" stroke-width="2"/>'
            f'<text x="{LEFT + pw + 32}" y="{ly}">{escape(ln.name[:22])}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
