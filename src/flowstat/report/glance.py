"""The report's first screen: per run, the verdicts (no loss, online, alerts), the pipeline graph
(graph.py: who feeds whom, where each node's time went, objects/s along the edges), the key figures
(figures.KEYS: merged/s, merge time, input latency p99, CPU and memory per role, buffer overloads)
each with a sparkline of its course over the run and the worst node; the detail follows below.

Plain HTML and inline SVG (no plot library): it is on screen at once, before any plot is drawn.
"""

from __future__ import annotations

from collections import Counter
from html import escape

import numpy as np

from flowstat.views.labels import LABELS

from .figures import KeyValue, Window
from .load import Run

SPARK_W, SPARK_H = 150, 26


def _fmt(x: float | None) -> str:
    """A figure for people: three significant digits, thousands separated."""
    if x is None or not np.isfinite(x):
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) >= 0.01 or x == 0 else f"{x:.2g}"


def sparkline(k: KeyValue, span: tuple[float, float], window: Window) -> str:
    """The figure's course over the run, the steady window shaded; its title (shown on hover) gives
    the lowest and highest point."""
    lab = LABELS[k.key.field]
    has = ~np.isnan(k.spark_y)
    t, y = k.spark_t[has], k.spark_y[has]
    if not len(y):
        return ""
    lo, hi = span
    ymin, ymax = float(y.min()), float(y.max())
    sx = (SPARK_W - 2) / (hi - lo) if hi > lo else 1.0
    sy = (SPARK_H - 4) / (ymax - ymin) if ymax > ymin else 0.0
    pts = " ".join(
        f"{1 + (a - lo) * sx:.1f},{SPARK_H - 2 - (b - ymin) * sy if sy else SPARK_H / 2:.1f}"
        for a, b in zip(t, y, strict=False)
    )
    x0, x1 = 1 + (max(window.lo, lo) - lo) * sx, 1 + (min(window.hi, hi) - lo) * sx
    what = "per second" if lab.kind == "counter" else ""
    top = int(np.argmax(y))
    title = (
        f"{lab.label} {what} ({lab.unit}), {'sum over' if k.key.total else 'mean of'} the {k.role}s: "
        f"lowest {_fmt(ymin)}, highest {_fmt(ymax)} at {t[top]:.0f} s"
    )
    return (
        f'<svg class="spark" width="{SPARK_W}" height="{SPARK_H}" viewBox="0 0 {SPARK_W} {SPARK_H}" role="img">'
        f"<title>{escape(title)}</title>"
        f'<rect x="{x0:.1f}" y="0" width="{max(0.0, x1 - x0):.1f}" height="{SPARK_H}" fill="#2ca02c" '
        f'fill-opacity="0.1"/><polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
        + (f'<circle cx="{1 + (t[0] - lo) * sx:.1f}" cy="{SPARK_H / 2}" r="2" fill="#1f77b4"/>' if len(y) == 1 else "")
        + "</svg>"
    )


def _verdict(name: str, ok: bool | None, yes: str, no: str, unknown: str = "no verdict", why: str = "") -> str:
    cls, word = ("ok", yes) if ok else ("none", unknown) if ok is None else ("bad", no)
    return (
        f'<span class="badge {cls}" data-verdict="{escape(name)}" title="{escape(why)}">'
        f"{escape(name)}: {escape(word)}</span>"
    )


def verdicts(run: Run, spans: list) -> str:
    """No loss, online and the alerts that held, as badges."""
    v = run.doc.get("verdict") or {}
    s = run.doc.get("summary") or {}
    loss_why = (
        f"sent {s.get('objects_sent', '?'):,} = received {s.get('objects_received', '?'):,}"
        if isinstance(s.get("objects_sent"), int) and isinstance(s.get("objects_received"), int)
        else ""
    )
    behind = "; ".join(v.get("not_online") or [])
    out = [
        _verdict("No loss", v.get("ok"), "OK", "FAILED", why=loss_why),
        _verdict("Online", v.get("online"), "ONLINE", "NOT ONLINE", why=behind),
    ]
    held = Counter(sp.alert.title for sp in spans)
    nodes = {t: len({tuple(sorted(sp.labels.items())) for sp in spans if sp.alert.title == t}) for t in held}
    text = ", ".join(f"{t} ({nodes[t]} node{'s' if nodes[t] != 1 else ''})" for t in held)
    out.append(_verdict("Alerts", not held, "none held", text or "held"))
    return " ".join(out)


def _label(k: KeyValue) -> str:
    """The figure's label and role; how it is taken over the role's nodes on hover (and in docs/report.md)."""
    lab = LABELS[k.key.field]
    if k.key.over == "run":
        how = f"total since the start, summed over the {k.role}'s {k.nodes} node(s)"
    elif k.key.total:
        how = f"each {k.role}'s mean over the steady state, summed over the {k.nodes}"
    else:
        how = f"each {k.role}'s mean over the steady state" + (f", averaged over the {k.nodes}" if k.nodes > 1 else "")
    return f'<td title="{escape(how)}">{escape(lab.label)} <span class="role">{escape(k.role)}</span></td>'


def _value(k: KeyValue) -> str:
    lab = LABELS[k.key.field]
    unit = lab.amount_unit if k.key.over == "run" else lab.unit
    extra = " in all" if k.key.total and k.key.over != "run" and k.nodes > 1 else ""
    value = f'<span class="big">{escape(_fmt(k.value))}</span>'
    return f'<td class="num">{value} <span class="unit">{escape(unit + extra)}</span></td>'


def card(i: int, run: Run, window: Window, keys: list[KeyValue], spans: list, graph: str = "") -> str:
    """One run's first-screen card (``graph``: its pipeline graph's HTML, under the verdicts)."""
    label = run.doc.get("label") or ""
    label = label.split(" | ", 1)[-1] if " | " in label else label
    rows = []
    for k in keys:
        worst = (
            f"{escape(k.worst)}: {escape(_fmt(k.worst_value))}"
            if k.worst
            else '<span class="note">one node</span>'
            if k.nodes == 1
            else '<span class="note">all alike</span>'
        )
        rows.append(
            f'<tr data-key="{escape(k.key.field)}" data-role="{escape(k.role)}" '
            f'data-panel="{escape(k.key.panel)}">{_label(k)}{_value(k)}'
            f"<td>{sparkline(k, run.span, window)}</td><td>{worst}</td></tr>"
        )
    return (
        f'<section class="card" id="glance-{i}"><h2 class="run-name"><a href="#run-{i}">{escape(run.name)}</a>'
        f'</h2><p class="what">{escape(label)}; steady state {escape(window.text())} s</p>'
        f'<p class="verdicts">{verdicts(run, spans)}</p>{graph}'
        '<table class="keys"><tr><th>figure</th><th>value</th><th>over the run</th><th>worst node</th></tr>'
        + "".join(rows)
        + '</table><p class="note small">Values: the steady state (overloads: the whole run); '
        "hover a figure for how it is taken, a sparkline for its range.</p></section>"
    )


def first_screen(
    runs: list[Run],
    windows: list[Window],
    keys: list[list[KeyValue]],
    spans: list[list],
    graphs: list[str] | None = None,
) -> str:
    graphs = graphs or [""] * len(runs)
    return (
        '<div class="glance">'
        + "".join(
            card(i, r, w, k, s, g)
            for i, (r, w, k, s, g) in enumerate(zip(runs, windows, keys, spans, graphs, strict=False))
        )
        + "</div>"
    )
