"""Plain SVG line plots for the Markdown tables: a file anyone's browser (and GitHub) shows, with
no JavaScript and no plotting library."""

from __future__ import annotations

import math
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

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="11">',
        *([f"<!-- {escape(note)} -->"] if note else []),
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
    ]
    for t in _ticks(0, y_hi):
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e5e5e5"/>'
            f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{_label(t)}</text>'
        )
    x_ticks: list[tuple[float, str]]  # position, label
    if categories:
        x_ticks = [(i, c) for i, c in enumerate(categories)]
    elif log_x:
        x_ticks = [
            (10**e, _label(10**e)) for e in range(math.floor(x_lo), math.ceil(x_hi) + 1) if x_lo <= e <= x_hi
        ] or [(v, _label(v)) for v in sorted({v for ln in lines for v in ln.x})]
    else:
        x_ticks = [(t, _label(t)) for t in _ticks(x_lo, x_hi, 8)]
    for v, text in x_ticks:
        out.append(f'<text x="{px(v):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{escape(str(text))}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 10}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(
        f'<text transform="translate(14,{TOP + ph / 2}) rotate(-90)" text-anchor="middle">' f"{escape(y_label)}</text>"
    )
    for i, ln in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        # whole pixels: a tenth of one is invisible at 640 x 320, and a 300 s series is a third smaller
        pts = " ".join(f"{px(x):.0f},{py(y):.0f}" for x, y in zip(ln.x, ln.y, strict=False))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        if ln.err is not None or len(ln.x) <= 12:
            for x, y in zip(ln.x, ln.y, strict=False):
                out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        for x, y, e in zip(ln.x, ln.y, ln.err or [], strict=False):
            out.append(
                f'<line x1="{px(x):.1f}" x2="{px(x):.1f}" y1="{py(max(0.0, y - e)):.1f}" '
                f'y2="{py(y + e):.1f}" stroke="{colour}"/>'
            )
        ly = TOP + 12 + i * 16
        out.append(
            f'<line x1="{LEFT + pw + 10}" x2="{LEFT + pw + 28}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"/><text x="{LEFT + pw + 32}" y="{ly}">'
            f"{escape(ln.name[:22])}</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
