"""The report's HTML: text sections (parameters, verdicts, the thesis table, alerts) written here,
every value escaped; the plots embedded by Bokeh, its JavaScript inline (only the bundles the plots
need), so the file is whole on its own and never touches the network."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
from bokeh.model import Model
from bokeh.resources import INLINE

from flowstat import __version__
from flowstat.schema.run import IN_CODE
from flowstat.timeutil import iso_utc_ms
from flowstat.units import format_size
from flowstat.views.labels import LABELS

from . import draw, figures
from .figures import HANDFUL, THESIS_METRICS, Parameter, Stat, Window, value
from .load import SHOWN_BAD_LINES, Run

_STYLE = """
*, *::before, *::after { box-sizing: border-box; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 auto; padding: .6em 1.2em; max-width: 1500px; color: #222; }
h1 { font-size: 1.3em; margin: .2em 0; } p.lead { margin: 0 0 .6em; color: #555; }
h2 { border-top: 3px solid #1f77b4; padding-top: .5em; margin-top: 1.6em; }
h3 { margin-top: 1.4em; } table { border-collapse: collapse; margin: .5em 0; max-width: 100%; }
td, th { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; } th { background: #f2f2f2; }
.ok { color: #2ca02c; font-weight: bold; } .bad { color: #d62728; font-weight: bold; }
.none { color: #7f7f7f; font-weight: bold; } .note { color: #555; }
div.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 540px), 1fr)); gap: .3em 1.2em; }
div.plot { margin: .3em 0; min-width: 0; }
section.alerts { border: 2px dashed #9467bd; padding: 0 1em .6em; margin: 1.2em 0; }
div.glance { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 560px), 1fr)); gap: .8em; }
section.card { border: 1px solid #ccc; border-radius: 6px; padding: .2em .8em .4em; min-width: 0; }
section.card h2 { border: 0; margin: .2em 0 0; padding: 0; font-size: 1.2em; }
section.card p { margin: .15em 0; } p.what { color: #555; font-size: .92em; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 10px; margin: 1px 4px 1px 0; color: #fff;
  font-weight: bold; font-size: .95em; }
.badge.ok { background: #2ca02c; color: #fff; } .badge.bad { background: #d62728; color: #fff; }
.badge.none { background: #7f7f7f; color: #fff; }
table.keys { width: 100%; margin: .3em 0 0; } table.keys td, table.keys th { padding: 1px 6px; border-color: #e3e3e3; }
table.keys td { vertical-align: middle; } table.keys .big { font-weight: bold; font-size: 1.05em; }
table.keys .role, table.keys .unit { color: #666; font-size: .88em; }
svg.spark { display: block; } p.small { font-size: .85em; }
figure.pipeline { margin: .3em 0 .2em; } figure.pipeline figcaption { color: #555; font-size: .88em; }
svg.pipeline { display: block; max-width: 100%; height: auto; }
table.thesis { width: 100%; }
"""

# The plots' documents (draw.py), each root into its <div>, once the page is there.
_EMBED = """(function () {
  const json = (id) => JSON.parse(document.getElementById(id).textContent);
  Bokeh.embed.embed_items(json("flowstat-docs"), json("flowstat-roots"));
})();"""


class Html(str):
    """Markup made here: put in a page as it is (everything else is escaped)."""


def _h(value: Any) -> str:
    return value if isinstance(value, Html) else escape(str(value))


def table(header: list[str] | None, rows: list[list[Any]], cls: str = "") -> Html:
    """A table as wide as the page at most: its cells wrap (the browser tests hold every element to
    the page's width)."""
    head = "<tr>" + "".join(f"<th>{_h(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return Html(f'<table class="{cls}">{head}{body}</table>')


def _cell(c: Any) -> str:
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return f'<td class="num">{_h(number(c))}</td>'
    return f"<td>{_h(c if c is not None else '-')}</td>"


def number(x: float | int | None) -> str:
    """A figure for people: thousands separated, four significant digits below 1,000."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if isinstance(x, int) or abs(x) >= 1000 else f"{x:.4g}"


def verdict_word(ok: bool | None, yes: str = "OK", no: str = "FAILED", unknown: str = "no verdict") -> Html:
    cls, word = ("ok", yes) if ok else ("none", unknown) if ok is None else ("bad", no)
    return Html(f'<span class="{cls}">{escape(word)}</span>')


@dataclass
class Page:
    """The page as it is put together: HTML blocks and plots (each drawn by a job), in order."""

    title: str
    blocks: list[str] = field(default_factory=list)
    jobs: list[Callable[[], Model]] = field(default_factory=list)

    def html(self, text: str) -> None:
        self.blocks.append(text)

    def plot(self, job: Callable[[], Model]) -> None:
        self.blocks.append(f'<div class="plot" id="{draw.target(len(self.jobs))}"></div>')
        self.jobs.append(job)

    def write(self, out: Path) -> None:
        """The HTML file, whole: Bokeh's JavaScript inline (its core bundle only: no widgets are used)."""
        resources = INLINE.clone(components=["bokeh"])
        drawn = draw.draw(self.jobs)
        docs = ",\n".join(f'"doc-{k}": {d.doc_json}' for k, d in enumerate(drawn))
        roots = json.dumps(
            [{"docid": f"doc-{k}", "roots": d.roots, "root_ids": list(d.roots)} for k, d in enumerate(drawn)]
        )
        out.write_text(
            f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{escape(self.title)}</title>\n{resources.render_css()}\n{resources.render_js()}\n"
            f"<style>{_STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(self.blocks)
            + f'\n<script type="application/json" id="flowstat-docs">{{{docs}}}</script>\n'
            f'<script type="application/json" id="flowstat-roots">{roots}</script>\n'
            f"<script>{_EMBED}</script>\n</body>\n</html>\n",
            encoding="utf-8",
        )


def header(page: Page, runs: list[Run]) -> None:
    page.html(
        f"<h1>{escape(page.title)}</h1><p class='lead'>{len(runs)} run(s), written {escape(iso_utc_ms())} by "
        f"flowstat {escape(__version__)}. At a glance first (each run's verdicts, its pipeline and key "
        f"figures over its steady state, shaded green in the sparklines); the detail below.</p>"
    )


HOW_TO_READ = (
    "Plots: drag to pan; zoom with the mouse wheel once the wheel-zoom tool (at each plot's right) is "
    "on; reset to come back; hover for values. A run's plots all cover its whole time; shaded green: "
    "the steady state. Every sample's peak is drawn: samples are reduced to the lowest and the highest "
    "of each time bucket (about a pixel), never dropped. Counters (objects, bytes, overloads since the "
    "node started) are drawn as their rate per second; a field that kept one value all run is a table "
    "row; a role of more than {handful} nodes is drawn as heat maps, a row per node."
)


def thesis_table(
    page: Page, runs: list[Run], windows: list[Window], stats: list[dict[str, Stat]], params: list[Parameter]
) -> None:
    """One row per run: its varying parameters, then mean ± std of THESIS_METRICS in the steady state,
    in human units (the raw figures in the cells' data attributes)."""
    head = (
        [Html("<th>run</th>")]
        + [Html(f'<th data-param="{escape(p.name)}">{escape(p.heading())}</th>') for p in params]
        + [Html(f'<th data-metric="{m}">{escape(LABELS[m].titled())}</th>') for m in THESIS_METRICS]
        + [Html("<th>merger samples</th>"), Html("<th>steady state (s)</th>")]
    )
    rows = []
    for run, window, st in zip(runs, windows, stats, strict=False):
        cells: list[Any] = [run.name] + [Html(f'<td class="num">{escape(p.text(p.of(run.doc)))}</td>') for p in params]
        cells += [_stat_cell(m, st[m]) for m in THESIS_METRICS]
        cells += [max(st[m].n for m in THESIS_METRICS), window.text()]
        rows.append(cells)
    body = "".join(
        "<tr>" + "".join(c if isinstance(c, Html) and c.startswith("<td") else _cell(c) for c in row) + "</tr>"
        for row in rows
    )
    page.html(
        '<h2 id="thesis">Runs side by side: the steady state</h2>'
        "<p>Mean ± standard deviation over every merger sample taken in the steady state (all mergers "
        "together, bounds included): from the end of start-up, max(3 s, 10% of the run's duration) after "
        "the run's start, to the stop signal; the drain after it is left out (the online verdict's window, "
        "flowstat.harness.online).</p>"
        f'<table class="thesis"><tr>{"".join(head)}</tr>{body}</table>'
    )


def _stat_cell(metric: str, s: Stat) -> Html:
    if s.mean is None or s.std is None:  # both or neither
        return Html("-")
    k = LABELS[metric].scale
    return Html(
        f'<span data-metric="{metric}" data-mean="{s.mean!r}" data-std="{s.std!r}">'
        f"{escape(number(s.mean * k))} ± {escape(number(s.std * k))}</span>"
    )


def sweeps_section(page: Page, runs: list[Run], params: list[Parameter], found: list) -> None:
    """What the plots against a parameter are drawn for (runs that differ in it alone), and why the
    others are not."""
    swept = {sw.parameter.path for sw in found}
    rest = [p for p in params if p.path not in swept]
    text = ""
    if found:
        text += (
            "<p>Plotted against a parameter: only runs that differ in that parameter alone (every other "
            "parameter equal), so that the plot shows its effect: "
            + "; ".join(
                f"{escape(sw.parameter.label)}: {', '.join(escape(runs[i].name) for i in sw.runs)}" for sw in found
            )
            + ".</p>"
        )
    if rest:
        names = ", ".join(escape(p.label) for p in rest)
        text += (
            f'<p class="no-sweep" data-params="{escape(",".join(p.name for p in rest))}">Not plotted against '
            f"{names}: no runs here differ in {'it' if len(rest) == 1 else 'one of them'} alone (these runs "
            f"differ in {len(params)} parameters at once), so a plot against any one would show the others' "
            "effect as its own. The table above compares the runs; a campaign (flowstat campaign) sweeps one "
            "parameter.</p>"
        )
    page.html(text)


def run_section(page: Page, i: int, run: Run, window: Window) -> None:
    """The run's parameters and verdicts, and what could not be read."""
    doc = run.doc
    page.html(
        f'<h2 id="run-{i}">Run {escape(run.name)}</h2>'
        + (f"<p>{escape(doc['description'])}</p>" if doc.get("description") else "")
        + table(None, _facts(run, window))
        + _conservation(run)
        + _online(run)
        + _reading_notes(run)
    )


def _facts(run: Run, window: Window) -> list[list[Any]]:
    doc, p = run.doc, run.doc.get("parameters") or {}
    obj = f"{p.get('object_type', '?')} {format_size(p['object_bytes'])}" if "object_bytes" in p else None
    rate = p.get("rate_per_producer")
    producers = (
        f"{p['producers']} x {rate:g} objects/s" + (" (as fast as they can)" if rate == 0 else "")
        if "producers" in p and rate is not None
        else None
    )
    topology = doc.get("topology")
    if topology == IN_CODE:
        topology = "built in code (no file)"
    return [
        ["run directory", str(run.path)],
        ["topology", topology],
        ["started - finished", f"{doc.get('started')} - {doc.get('finished')}"],
        ["object", obj],
        ["buffer size (messages)", p.get("buffer_size")],
        ["producers", producers],
        ["producer processes", p.get("producer_processes")],
        ["mergers", p.get("mergers")],
        ["duration (s)", p.get("duration_s")],
        ["CPUs", f"{value(doc, ('machine', 'cpus'))} on {doc.get('host')}; pinned: {p.get('cpus') or 'no'}"],
        ["steady state (s since start)", window.text()],
        ["samples", f"{run.file.good:,} of agent {run.agent}, {len(run.series)} nodes"],
    ]


def _summary_json(run: Run) -> dict:
    """The harness's summary.json beside run.json, when there is one: the per-merger figures and
    the objects merged in. Only read to show it; anything else in it is left alone."""
    try:
        doc = json.loads((run.path / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) and doc.get("run_id") == run.doc.get("run_id") else {}


def _conservation(run: Run) -> str:
    v, s = run.doc.get("verdict"), run.doc.get("summary") or {}
    if v is None:
        return (
            "<h3>No loss</h3><p class='note'>No verdict: the run document has none (a run recorded outside "
            "the harness, or one that did not finish).</p>"
        )
    merged_in = (_summary_json(run).get("conservation") or {}).get("objects_merged_in")
    counts = (
        f"sent {number(s.get('objects_sent'))} = received {number(s.get('objects_received'))} = merged-in "
        f"{number(merged_in) if merged_in is not None else '(not recorded)'}"
    )
    failures = "".join(f"<li>{escape(f)}</li>" for f in v.get("failures") or [])
    checks = ", ".join(v.get("failed_checks") or [])
    return (
        f"<h3>No loss: {verdict_word(v.get('ok'))}</h3><p>conserved: {verdict_word(v.get('conserved'), 'yes', 'no')}"
        f"; {escape(counts)}; merged objects {number(s.get('merged_objects'))}"
        + (f"; failed checks: {escape(checks)}" if checks else "")
        + "</p>"
        + (f"<ul>{failures}</ul>" if failures else "")
    )


_MERGER_FIGURES = (
    ("offered_per_second", "offered/s"),
    ("merged_per_second", "merged/s"),
    ("merged_to_offered", "merged/offered"),
    ("latency_p99_ms_worst_second", "p99 worst second (ms)"),
    ("vmrss_slope_mb_per_min", "VmRSS slope (MB/min)"),
    ("in_flight_max", "in flight max"),
    ("producer_refusals", "producer refusals"),
)
_RUN_FIGURES = (
    "steady_merged_objects_per_second",
    "steady_offered_objects_per_second",
    "objects_in_flight_max",
    "input_latency_p99_ms_worst_second",
    "merger_vmrss_slope_mb_per_min_max",
    "send_overload_events",
    "receive_overload_events",
    "sequence_gaps",
)


def _online(run: Run) -> str:
    """Per merger: online or not, and why (run.json's verdict; summary.json's figures when there)."""
    v, s = run.doc.get("verdict") or {}, run.doc.get("summary") or {}
    behind = {text.split(":")[0]: text for text in v.get("not_online") or []}
    detail = _summary_json(run).get("online") or {}
    mergers = (
        sorted(detail)
        or [a["node_id"] for a in run.doc.get("affinity") or [] if a.get("role") == "merger"]
        or [x.node_id for x in run.series if x.role == "merger"]
    )  # those the verdict judged
    rows = []
    for m in mergers:
        d = detail.get(m) or {}
        ok = d.get("online") if d else (None if v.get("online") is None else m not in behind)
        why = "; ".join(d.get("why") or []) if d else behind.get(m, "")
        rows.append(
            [m, verdict_word(ok, "ONLINE", "NOT ONLINE"), why or None] + [d.get(key) for key, _ in _MERGER_FIGURES]
        )
    figures = [[key, s[key]] for key in _RUN_FIGURES if key in s]
    return (
        f"<h3>Online (steady state): {verdict_word(v.get('online'), 'ONLINE', 'NOT ONLINE')}</h3>"
        + table(["merger", "verdict", "why"] + [label for _, label in _MERGER_FIGURES], rows)
        + (table(["run summary", "value"], figures) if figures else "")
    )


def _reading_notes(run: Run) -> str:
    bad = run.file.bad
    items = [f"{run.file.path}:{n}: {why}" for n, why in bad[:SHOWN_BAD_LINES]]
    if len(bad) > SHOWN_BAD_LINES:
        items.append(f"... and {len(bad) - SHOWN_BAD_LINES:,} more bad lines")
    items += run.file.notes + run.notes
    if not items:
        return ""
    return (
        f"<h3>Reading the run file: {len(bad):,} bad lines skipped, {run.file.good:,} samples kept</h3>"
        "<ul class='note'>" + "".join(f"<li>{escape(x)}</li>" for x in items) + "</ul>"
    )


def alerts_section(page: Page, run: Run, spans: list) -> None:
    """Which alert conditions held and when (flowstat.views.alerts; see _alert_spans.py)."""
    text = "<section class='alerts'><h3>Which alert conditions held and when</h3>"
    if not spans:
        text += "<p>No alert condition held during the run.</p>"
    else:
        start = run.start_ns / 1e9
        rows = [
            [
                sp.alert.title,
                sp.alert.uid,
                ", ".join(f"{k}={v}" for k, v in sorted(sp.labels.items())),
                f"{sp.start - start:.1f}",
                f"{sp.end - start:.1f}",
                f"{sp.end - sp.start:.1f}",
                f"{iso_utc_ms(sp.start)} - {iso_utc_ms(sp.end)}",
            ]
            for sp in spans
        ]
        text += table(["alert", "uid", "labels", "from (s)", "to (s)", "for (s)", "UTC"], rows)
    page.html(text + "</section>")


def role_section(page: Page, i: int, run: Run, window: Window, rp) -> None:
    """A role's part of a run, before its plots: the fields that kept one value all run (a table, not
    flat lines), and the fields no dashboard panel shows, over the steady state (a table)."""
    role = rp.role
    nodes = len(role.series)
    text = (
        f'<h3 id="run-{i}-{escape(role.name)}">{escape(role.name)}: {nodes} node(s), {len(rp.plots)} plots'
        + (f" (heat maps: more than {HANDFUL} nodes)" if nodes > HANDFUL else "")
        + "</h3>"
    )
    if rp.constants:
        rows: list[list[Any]] = []
        for c in rp.constants:
            lab = LABELS[c.field]
            if lab.kind == "flag":
                shown = "never"
            else:
                shown = f"{number(c.value * lab.scale)} {lab.amount_unit}".strip()
            rows.append(
                [
                    Html(f'<span data-field="{escape(c.field)}">{escape(lab.label)}</span>'),
                    shown,
                    "its total stayed at this"
                    if lab.kind == "counter"
                    else "true at no sample"
                    if lab.kind == "flag"
                    else "the same all run",
                ]
            )
        text += "<p class='note'>The same in every node of the role, from its first sample to its last:</p>" + table(
            ["field", "value", ""], rows, "constants"
        )
    if rp.others:
        rows = []
        for f in rp.others:
            lab = LABELS[f]
            per_node = figures.per_node_steady(run, role, f, window)
            has = ~np.isnan(per_node)
            if not has.any():
                rows.append([Html(f'<span data-field="{escape(f)}">{escape(lab.titled())}</span>'), None, None, None])
                continue
            lo_i, hi_i = int(np.nanargmin(per_node)), int(np.nanargmax(per_node))
            rows.append(
                [
                    Html(f'<span data-field="{escape(f)}">{escape(lab.titled())}</span>'),
                    float(np.nanmean(per_node)),
                    f"{number(float(per_node[lo_i]))} ({role.series[lo_i].node_id})",
                    f"{number(float(per_node[hi_i]))} ({role.series[hi_i].node_id})",
                ]
            )
        text += (
            "<p class='note'>Fields no dashboard panel shows: each node's mean over the steady state "
            "(counters: their rate):</p>"
            + table(["field", "mean per node", "lowest node", "highest node"], rows, "others")
        )
    page.html(text)
