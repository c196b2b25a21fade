"""flowstat report: runs made by the harness here, their report opened in a real browser (Debian's
chromium, headless, driven by Selenium through the Debian chromedriver), its thesis table checked
against numpy over the run files, bad input named, and the reduction keeping every peak."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from flowstat import cli
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.topology import from_dict
from flowstat.report import _alert_spans, figures, load
from flowstat.report.build import write_report
from flowstat.report.load import load_run
from flowstat.report.reduce import envelope, minmax, on_spans
from flowstat.schema import runfile
from flowstat.schema import sample as sample_schema
from flowstat.views import alerts
from flowstat.views.labels import LABELS
from flowstat.views.panels import RUN_VIEW
from flowstat_lab import screenshots as shots
from support import fixture_runs as fx
from support.common import ROOT, topology_dict

ARTIFACTS = ROOT / ".cache" / "test-artifacts" / "report"
THESIS = ("cpu_clock_hz", "vmrss_kb", "average_merge_time_ms", "merged_objects_per_second")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A healthy run (2 mergers keep up with 8 paced producers) and one whose producers overload a
    buffer of one message (fx.OVERLOAD: 12,000/s offered to a merger that takes at most
    1,000/s on any machine, and sets their pace)."""
    d = tmp_path_factory.mktemp("runs")
    healthy = run_topology(
        from_dict(topology_dict(run_id="healthy", duration=8, mergers=2, producers={"count": 8, "rate": 100})),
        runs_dir=d,
    )
    overload = run_topology(from_dict(topology_dict(**{**fx.OVERLOAD, "run_id": "overload"})), runs_dir=d)
    assert healthy["ok"] and overload["ok"]
    return {"healthy": Path(healthy["run_dir"]), "overload": Path(overload["run_dir"])}


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium at a laptop's screen, 1366 x 768 CSS pixels (flowstat_lab.screenshots: the
    docs' screenshots are taken by the same code)."""
    with shots.browser(shots.LAPTOP) as driver:
        yield driver


def open_report(driver, path: Path, plots: int, deadline_s: float = 60) -> dict:
    """Load a report, wait until Bokeh has drawn as many plots as the report says it made (or the
    deadline); what the page drew, logged and requested."""
    return shots.open_report(driver, path, plots, deadline_s)


def screenshot(driver, name: str, scroll_to: str | None = None) -> Path:
    path = shots.screenshot(driver, ARTIFACTS / f"{name}.webp", scroll_to)
    print(f"screenshot: {path}")
    return path


def reads_well(driver, runs_shown: list[Path]) -> None:
    """What a person sees at a laptop's width: nothing wider than the page (no sideways scroll, no
    element past its edge, no box scrolling sideways), each run's three verdicts on the first screen
    as its run.json says them, and values on hover over a plot."""
    assert shots.overflow(driver) == []
    badges = shots.verdicts_above_fold(driver)
    for run_dir in runs_shown:
        doc = json.loads((run_dir / "run.json").read_text())
        mine = [b for b in badges if b["run"] == doc["run_id"]]
        assert [b["verdict"].split(":")[0] for b in mine] == ["No loss", "Online", "Alerts"]
        assert all(b["visible"] for b in mine), mine
        v = doc["verdict"]
        assert mine[0]["verdict"] == "No loss: " + ("OK" if v["ok"] else "FAILED")
        assert mine[1]["verdict"] == "Online: " + ("ONLINE" if v["online"] else "NOT ONLINE")
    tip = shots.hover(driver, 0)
    assert re.search(r"node:\s*\S+", tip) and re.search(r"value:\s*[\d,.]+ \S", tip), tip


def no_network_references(html: str) -> list[str]:
    """What in the page would reach the network: scripts, styles, fonts, images from a URL."""
    return re.findall(
        r"""<(?:script|link|img|iframe)[^>]+(?:src|href)\s*=\s*["']?(?:https?:)?//[^\s"'>]+"""
        r"""|@import[^;]*|url\(\s*["']?(?:https?:)?//[^)]*\)""",
        html,
        flags=re.I,
    )


PLOTTED = """
return [...Bokeh.index.all_views()].filter(v => v.model instanceof Bokeh.Models.get('Plot') && v.model.tags.length)
  .map(v => ({...v.model.tags[0], title: v.model.title.text,
              bars: v.model.renderers.length ? (v.model.renderers[0].data_source.data.left || []).length : 0}));
"""


def where_shown(driver) -> dict:
    """Where the page shows each (role, field): 'plot' (with the panel it draws), 'constant' or 'other'
    (a table row under the role's heading)."""
    out = {}
    for p in driver.execute_script(PLOTTED):
        for f in p.get("fields", []):
            out[(p["role"], f)] = ("plot", p["panel"])
    rows = driver.execute_script("""
        return [...document.querySelectorAll('h3[id^="run-0-"]')].flatMap(h => {
          const role = h.id.slice('run-0-'.length), out = [];
          for (let e = h.nextElementSibling; e && e.tagName !== 'H3' && e.tagName !== 'H2'; e = e.nextElementSibling)
            for (const c of e.querySelectorAll('[data-field]'))
              out.push([role, c.dataset.field, e.classList.contains('constants') ? 'constant' : 'other']);
          return out;});""")
    for role, f, where in rows:
        out.setdefault((role, f), (where, None))
    return out


def test_an_overloaded_run_s_report_draws_every_plot_offline_in_a_browser(runs, browser, tmp_path):
    out = tmp_path / "overload.html"
    made = write_report([runs["overload"]], out)
    html = out.read_text()
    assert no_network_references(html) == [] and "bokeh-widgets" not in html
    page = open_report(browser, out, made.plots)
    assert page["severe"] == []
    assert page["plots"] == page["drawn"] == made.plots >= 12
    assert [u for u in page["requests"] if u.startswith(("http:", "https:", "ws:", "wss:"))] == []
    reads_well(browser, [runs["overload"]])
    screenshot(browser, "overload-top")
    # every labelled field a role's nodes reported is shown, from the run file: a field that changed is
    # plotted, in the Run view's panel that holds it (the dashboards' definition) when one does; one that
    # kept a single value all run (the same in every node of the role) is a constant's row, but for a
    # flag true all along, drawn as its spans
    _, nodes, _ = fx.samples(runs["overload"])
    shown_agent = made.runs[0].agent
    values: dict[tuple, set] = {}
    for sm in nodes:
        if sm["agent"] == shown_agent:
            for f in LABELS:
                if f in sm and LABELS[f].kind != "state":
                    values.setdefault((sm["role"], f), set()).add(sm[f])
    where = where_shown(browser)
    panels = {m.field: p.title for p in RUN_VIEW.panels() if p.in_report and p.source == "node" for m in p.metrics}
    assert set(where) == set(values)
    for (role, f), seen in values.items():
        if len(seen) == 1 and not (LABELS[f].kind == "flag" and True in seen):
            assert where[(role, f)][0] == "constant", (role, f)
        elif f in panels and all(v == role for k, v in panel_where(panels[f]) if k == "role"):
            assert where[(role, f)] == ("plot", panels[f]), (role, f)
        else:
            assert where[(role, f)][0] == "other", (role, f)
    # the producers' buffer overloads: bars on their state timeline, as the run file says they were
    flags = [
        json.loads(line).get("send_buffer_overloaded")
        for line in (runs["overload"] / "samples.ndjson").open()
        if '"role":"producer"' in line
    ]
    bars = next(
        p["bars"]
        for p in browser.execute_script(PLOTTED)
        if p["role"] == "producer" and p["fields"] == ["send_buffer_overloaded"]
    )
    assert any(flags) and bars >= 1
    screenshot(browser, "overload-merger-plots", scroll_to="run-0-merger")
    text = browser.find_element("tag name", "body").text
    assert "No loss: OK" in text and "Online (steady state): NOT ONLINE" in text
    assert "its producers' sends were refused" in text  # the merger's why, from the run
    # the alerts' own section: the overload alert held, for the producers, as flowstat.views.alerts says
    _, nodes, agents = fx.samples(runs["overload"])
    shown = [s for s in nodes if s["agent"] == made.runs[0].agent]  # the agent whose samples the report shows
    spans = [sp for sp in alerts.evaluate(shown, agents) if sp.alert.uid == "flowstat-buffer-overload"]
    assert "Which alert conditions held and when" in text and spans
    assert text.count("flowstat-buffer-overload") == len(spans)
    # and its first screen says it: the alert held, on the nodes it held for
    held = len({tuple(sorted(sp.labels.items())) for sp in spans})
    assert f"Alerts: Buffer overloaded ({held} node{'s' if held > 1 else ''})" in text


def panel_where(title: str) -> tuple:
    return next(p.where for p in RUN_VIEW.panels() if p.title == title)


def test_the_browser_checks_fail_on_a_report_that_breaks_them(runs, browser, tmp_path):
    """Each check of reads_well, on the real report made wrong one way at a time: a wide table, the
    first screen pushed down by a tall header, a plot without its hover tool, a plot that cannot draw."""
    made = write_report([runs["healthy"]], tmp_path / "ok.html")
    html = made.path.read_text()

    def broken(name: str, text: str) -> Path:
        assert text != html, name
        path = tmp_path / f"{name}.html"
        path.write_text(text)
        return path

    wide = broken("wide", html.replace('<table class="keys">', '<table class="keys" style="min-width: 1800px">'))
    open_report(browser, wide, made.plots)
    assert any("table.keys" in x for x in shots.overflow(browser))
    # the table of old: in a box of the page's width that scrolls sideways (its right part off screen)
    boxed = broken(
        "boxed",
        html.replace(
            "<section class='alerts'>",
            "<div style='overflow-x: auto'><table><tr>"
            + "<td style='white-space: nowrap'>a long cell</td>" * 60
            + "</tr></table></div><section class='alerts'>",
            1,
        ),
    )
    open_report(browser, boxed, made.plots)
    assert [x for x in shots.overflow(browser) if "scrolls sideways" in x]
    tall = broken("tall", html.replace("<p class='lead'>", "<p class='lead' style='height: 700px'>"))
    open_report(browser, tall, made.plots)
    assert [b["visible"] for b in shots.verdicts_above_fold(browser)] == [False] * 3
    with pytest.raises(AssertionError):
        reads_well(browser, [runs["healthy"]])
    open_report(browser, made.path, made.plots)
    assert shots.hover(browser, 0) != ""
    browser.execute_script("""  // the plots' hover tools taken off
        const hover = Bokeh.Models.get('HoverTool');
        for (const v of Bokeh.index.all_views())
          if (v.model instanceof Bokeh.Models.get('Plot'))
            v.model.toolbar.tools = v.model.toolbar.tools.filter(t => !(t instanceof hover));""")
    assert shots.hover(browser, 0) == ""
    with pytest.raises(AssertionError, match="did not draw|drawn"):
        page = open_report(
            browser,
            broken("undrawn", html.replace('<div class="plot" id="plot-0"></div>', "", 1)),
            made.plots,
            deadline_s=5,
        )
        assert page["drawn"] == made.plots, "drawn"


def spans_of(spans) -> list[tuple]:
    return [(sp.alert.uid, sp.labels, sp.start, sp.end) for sp in spans]


@pytest.mark.parametrize("name", ["overload", "behind", "killed", "spooling"])
def test_the_report_finds_the_alerts_the_run_file_s_samples_give(request, name, monkeypatch):
    """The report evaluates the alerts on its arrays (a million samples as documents would take a
    minute): the same spans as on the run file's documents, by the agent the report shows; and the
    same where each condition held at all (no `for`), which on these runs is never nothing. (Whether
    a held condition lasts its `for` in a 12 s run depends on where the 10 s evaluation grid falls.)"""
    run_dir = request.getfixturevalue("fixture_runs")[name]
    run = load_run(run_dir)
    _, nodes, agents = fx.samples(run_dir)
    shown = [s for s in nodes if s["agent"] == run.agent]
    assert spans_of(_alert_spans.evaluate(run)) == spans_of(alerts.evaluate(shown, agents))
    monkeypatch.setattr(alerts, "ALERTS", tuple(dataclasses.replace(a, for_s=0) for a in alerts.ALERTS))
    want = alerts.evaluate(shown, agents)
    assert want, f"no alert condition held on the {name} run"
    assert spans_of(_alert_spans.evaluate(run)) == spans_of(want)


def steady(run_dir: Path, metric: str) -> tuple[float, float, int]:
    """mean, std and count of a metric over the mergers' samples of the steady state, worked out
    here from the run file: start-up max(3 s, 10% of the duration) after run.json's start, to the
    stop signal (summary.seconds after it)."""

    def ms(stamp: str) -> int:
        return round(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)

    doc = json.loads((run_dir / "run.json").read_text())
    start = ms(doc["started"])
    lo, hi = max(3.0, 0.1 * doc["parameters"]["duration_s"]) * 1000, doc["summary"]["seconds"] * 1000
    lines = [json.loads(line) for line in (run_dir / "samples.ndjson").open()]
    agent = lines[0]["flowstat_run"]["agent"]
    values = [
        s[metric]
        for s in lines[1:]
        if s.get("role") == "merger" and s["agent"] == agent and metric in s and lo <= ms(s["time"]) - start <= hi
    ]
    return float(np.mean(values)), float(np.std(values)), len(values)


def test_a_report_of_several_runs_has_the_thesis_table_numpy_agrees_with(runs, browser, tmp_path):
    out = tmp_path / "both.html"
    order = [runs["healthy"], runs["overload"]]
    made = write_report(order, out)
    page = open_report(browser, out, made.plots)
    assert page["severe"] == [] and page["plots"] == page["drawn"] == made.plots
    reads_well(browser, order)
    table = browser.execute_script("""
        const rows = [...document.querySelectorAll('table.thesis tr')].slice(1);
        return rows.map(r => ({run: r.cells[0].textContent,
            stats: [...r.querySelectorAll('[data-metric]')].map(
                s => [s.dataset.metric, +s.dataset.mean, +s.dataset.std]),
            cells: [...r.cells].map(c => c.textContent)}));""")
    head = browser.execute_script(
        "return [...document.querySelectorAll('table.thesis th')].map(c => c.dataset.param || c.textContent)"
    )
    assert [row["run"] for row in table] == [d.name for d in order]
    for row, run_dir in zip(table, order, strict=False):
        assert [m for m, _, _ in row["stats"]] == list(THESIS)
        for metric, mean, std in row["stats"]:
            want_mean, want_std, n = steady(run_dir, metric)
            # at least two: a standard deviation (the overloaded merger, which burns its CPU on purpose,
            # answers the agent late on a loaded machine: its samples then hold no figures of its own)
            assert n >= 2 and mean == pytest.approx(want_mean, rel=1e-9) and std == pytest.approx(want_std, rel=1e-9)
        params = json.loads((run_dir / "run.json").read_text())["parameters"]
        for key in ("buffer_size", "mergers", "producers"):  # what differs between the two runs
            column = head.index(key)
            assert row["cells"][column] == f"{params[key]:,}"
        # the human figures in the cells are the raw ones in human units (VmRSS kB -> MB, CPU Hz -> %)
        for metric, mean, _ in row["stats"]:
            shown = row["cells"][head.index(LABELS[metric].titled())]
            assert float(shown.split(" ± ")[0].replace(",", "")) == pytest.approx(mean * LABELS[metric].scale, rel=1e-3)
    # the two runs differ in every parameter at once: no plot against any one of them, and the page
    # says why, naming each (producers, rate, buffer size, mergers, kernel buffers, merge cost per object)
    sweeps = [p for p in browser.execute_script(PLOTTED) if "sweep" in p]
    assert sweeps == []
    note = browser.execute_script("return document.querySelector('p.no-sweep').dataset.params").split(",")
    assert sorted(note) == sorted(p.name for p in figures.varying(made.runs)) and len(note) == 6
    screenshot(browser, "two-runs-table", scroll_to="thesis")


def sweep_copy(source: Path, folder: Path, run_id: str, **params) -> Path:
    """A copy of a run under another run id whose run document says other parameters (what the
    report compares runs by)."""
    out = folder / run_id
    shutil.copytree(source, out)
    old = json.loads((source / "run.json").read_text())["run_id"]
    text = (out / "samples.ndjson").read_text()
    (out / "samples.ndjson").write_text(text.replace(f'"{old}"', f'"{run_id}"'))
    doc = json.loads((out / "run.json").read_text())
    doc["run_id"] = run_id
    doc["parameters"].update(params)
    (out / "run.json").write_text(json.dumps(doc))
    return out


def test_a_figure_is_plotted_against_a_parameter_only_for_runs_that_differ_in_it_alone(runs, browser, tmp_path):
    """Three runs that differ in the buffer size alone, and one that differs in everything: merged
    objects/s against the buffer size for the three, and the others' parameters named as not plotted."""
    swept = [sweep_copy(runs["healthy"], tmp_path, f"sweep-{b}", buffer_size=b) for b in (1000, 10, 100)]
    made = write_report([*swept, runs["overload"]], tmp_path / "sweep.html")
    assert [sw.parameter.name for sw in figures.sweeps(made.runs)] == ["buffer_size"]
    page = open_report(browser, made.path, made.plots)
    assert page["plots"] == page["drawn"] == made.plots
    plotted = [p for p in browser.execute_script(PLOTTED) if "sweep" in p]
    assert [(p["sweep"], p["field"], p["runs"]) for p in plotted] == [
        ("buffer_size", "merged_objects_per_second", ["sweep-10", "sweep-100", "sweep-1000"])
    ]
    note = browser.execute_script("return document.querySelector('p.no-sweep').dataset.params").split(",")
    assert "buffer_size" not in note and {"producers", "mergers", "rate_per_producer"} <= set(note)
    assert shots.overflow(browser) == []


def test_a_run_of_500_producers_is_one_picture_a_role(runs, browser, tmp_path):
    """500 producer nodes: a heat map a field (a row per node), not 500 lines; drawn, no wider than the
    page, a node named on hover."""
    many = shots.many_producers(runs["healthy"], tmp_path / "healthy-500", producers=500)
    made = write_report([many], tmp_path / "many.html")
    page = open_report(browser, made.path, made.plots)
    assert page["severe"] == [] and page["plots"] == page["drawn"] == made.plots
    print(f"500 producers: {made.plots} plots drawn {page['drawn_ms']} ms after navigation start")
    plotted = browser.execute_script(PLOTTED)
    producer = [p for p in plotted if p["role"] == "producer"]
    assert producer and {p["kind"] for p in producer} <= {"heatmap", "timeline"}
    assert {p["kind"] for p in plotted if p["role"] == "merger"} <= {"lines", "timeline"}  # two mergers
    rows = browser.execute_script("""
        const v = [...Bokeh.index.all_views()].find(v => v.model instanceof Bokeh.Models.get('Plot')
            && v.model.tags.length && v.model.tags[0].kind === 'heatmap');
        const img = v.model.renderers.find(r => r.data_source.data.image).data_source.data.image[0];
        return img.shape ? img.shape[0] : img.length;""")
    assert rows == 500
    assert shots.overflow(browser) == []
    heat = next(i for i, p in enumerate(plotted) if p["kind"] == "heatmap")
    assert re.search(r"node:\s*producers-0~\d+", shots.hover(browser, heat)), "no node on hover"
    screenshot(browser, "500-producers", scroll_to="run-0-producer")


# -- bad input -------------------------------------------------------------------------------------
def report(capsys, *args: str) -> tuple[int, str, str]:
    status = cli.main(["report", *args])
    got = capsys.readouterr()
    return status, got.out, got.err


def test_a_missing_run_dir_or_run_file_is_named(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    status, _, err = report(capsys, str(missing))
    assert status == 2 and f"{missing}: no such run directory" in err
    empty = tmp_path / "empty-run"
    empty.mkdir()
    (empty / "run.json").write_text("{}")
    status, _, err = report(capsys, str(empty))
    assert status == 2 and f"{empty}: not a run directory: it has no run file (samples.ndjson)" in err
    garbage = tmp_path / "garbage-run"
    garbage.mkdir()
    (garbage / "samples.ndjson").write_text("{not json\n[1, 2]\n")
    status, _, err = report(capsys, str(garbage))
    assert status == 2 and f"{garbage / 'samples.ndjson'}: no sample could be read (line 1: not JSON" in err
    assert not (garbage / "report.html").exists()


def test_a_truncated_run_file_is_reported_by_line_and_its_good_lines_kept(runs, tmp_path, capsys):
    run_dir = tmp_path / runs["healthy"].name
    shutil.copytree(runs["healthy"], run_dir)
    path = run_dir / "samples.ndjson"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # cut in the middle of the last line
    status, out, err = report(capsys, str(run_dir), "-o", str(tmp_path / "r.html"))
    assert status == 1
    assert f"{path}:{len(lines)}: truncated line" in err
    kept = sum(not line.startswith(b'{"flowstat_agent"') for line in lines[1:-1])  # not the header, nor the cut line
    assert f"{path}: {kept:,} samples" in out
    assert f"{path}:{len(lines)}: truncated line" in (tmp_path / "r.html").read_text()


def test_a_run_file_read_in_parts_reads_as_one(runs, tmp_path, monkeypatch):
    """A large run file is read by several processes, each a span of whole lines: the samples, the
    bad lines (by their number in the whole file) and the header are as if read at once."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs["healthy"], run_dir)
    path = run_dir / "samples.ndjson"
    lines = path.read_bytes().splitlines(keepends=True)
    for at in (len(lines) - 5, len(lines) // 2 + 1, 7):  # bad lines in both halves
        lines.insert(at, b'{"not": "a sample"}\n')
    path.write_bytes(b"".join(lines))
    whole = load_run(run_dir)
    monkeypatch.setattr(load, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(load.os, "sched_getaffinity", lambda pid: {0, 1, 2})  # three parts
    parts = load_run(run_dir)
    assert len(runfile.spans(path, 3)) == 3
    selves = sum(line.startswith(b'{"flowstat_agent"') for line in lines)
    assert parts.file.good == whole.file.good == len(lines) - 4 - selves and parts.file.header == whole.file.header
    assert selves and parts.file.self_samples == whole.file.self_samples and len(whole.file.self_samples) == selves
    inserted = [n for n, line in enumerate(lines, 1) if line.startswith(b'{"not"')]
    assert parts.file.bad == whole.file.bad == [(n, "field 'not': not in the schema") for n in inserted]
    assert parts.series == whole.series and np.array_equal(parts.t, whole.t)
    for name, values in whole.values.items():
        assert np.array_equal(parts.values[name], values, equal_nan=True), name


def test_one_agent_s_samples_make_one_series_per_node(runs, tmp_path):
    """A run file with two agents' samples of the same nodes: the report takes those of the agent its
    header names (the Python agent, which recorded it) and says how many it left out."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs["healthy"], run_dir)
    path = run_dir / "samples.ndjson"
    lines = path.read_text().splitlines()
    # more of them than of the Python agent's: the header decides, not the count
    other = [
        json.dumps({**json.loads(line), "agent": "flowstat-agent-c", "vmrss_kb": 1, "seq": 2 * i + k})
        for i, line in enumerate(lines[1:])
        if '"vmrss_kb"' in line
        for k in (0, 1)
    ]
    path.write_text("\n".join(lines + other) + "\n")
    run = load_run(run_dir)
    assert run.agent == "flowstat-agent-py" and run.left_out == len(other)
    assert len(run.series) == len({json.loads(line).get("node_id") for line in lines[1:]} - {None})
    assert np.nanmin(run.values["vmrss_kb"]) > 1
    assert f"{len(other):,} samples of other agents than flowstat-agent-py left out" in run.notes[0]


def test_the_command_explains_itself(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["report", "--help"])
    text = capsys.readouterr().out
    assert exit_.value.code == 0 and "-o FILE" in text and "RUN_DIR/report.html" in text and "steady state" in text


# -- the reduction ---------------------------------------------------------------------------------
def test_the_reduction_keeps_every_single_sample_spike():
    rng = np.random.default_rng(7)
    n, buckets = 200_000, 500
    t = np.sort(rng.uniform(0, 3600, n))
    y = rng.normal(100, 5, n)
    bucket = np.minimum((t / 3600 * buckets).astype(int), buckets - 1)
    # one spike in each of 60 buckets: a single sample far above (or below) the rest
    spikes = np.array([rng.choice(np.flatnonzero(bucket == b)) for b in rng.choice(buckets, 60, replace=False)])
    y[spikes[:30]] += rng.uniform(50, 500, 30)
    y[spikes[30:]] -= rng.uniform(50, 500, 30)
    keep = minmax(t, y, 0, 3600, buckets)
    assert len(keep) <= 2 * buckets and set(spikes) <= set(keep)
    assert np.all(np.diff(t[keep]) >= 0)  # still in time order
    # and in general: each bucket keeps its own highest and lowest sample
    for b in rng.choice(buckets, 50):
        mine = bucket == b
        kept = keep[bucket[keep] == b]
        assert y[kept].max() == y[mine].max() and y[kept].min() == y[mine].min()
    # many series at once, one after the other, each over the whole hour: each keeps its own spikes
    series = np.repeat(np.arange(4), n // 4)
    each = np.concatenate([np.sort(rng.uniform(0, 3600, n // 4)) for _ in range(4)])
    keep = minmax(each, y, 0, 3600, 100, series)
    assert len(keep) <= 4 * 200
    cell = series * 100 + np.minimum((each / 36).astype(int), 99)  # (series, bucket)
    for i in spikes:  # the spike, or a bigger one beside it in its series and bucket, is kept
        mine, kept = cell == cell[i], keep[cell[keep] == cell[i]]
        assert y[kept].max() == y[mine].max() >= y[i] and y[kept].min() == y[mine].min() <= y[i]
    # the envelope of many series: the bucket holding a spike reaches it
    env = envelope(t, y, 0, 3600, buckets)
    centre = {round(c, 6): i for i, c in enumerate(env.t)}
    for i in spikes:
        at = centre[round((bucket[i] + 0.5) * 3600 / buckets, 6)]
        assert y[i] in (env.low[at], env.high[at])


def test_a_flag_true_in_one_sample_still_shows_and_close_runs_are_joined():
    t = np.arange(0.0, 100.0)
    on = np.zeros(100, bool)
    on[[10, 14, 50, 51, 53, 90]] = True
    start, end = on_spans(t, on, min_gap=3)  # 11 -> 14: 3 s apart, two spans; 52 -> 53: one
    assert list(zip(start, end, strict=False)) == [(10, 11), (14, 15), (50, 54), (90, 91)]
    assert on_spans(t, np.zeros(100, bool), 3)[0].size == 0


def test_every_figure_is_traced_to_a_dashboard_panel_and_its_label():
    """The first screen's key figures read the field of the Run view's panel they name; the panels of
    one field are titled with its label (flowstat.views.labels, the one definition the report reads
    too); a panel that scales a field scales it as the report does (the CPU's % of one core)."""
    panels = {p.title: p for p in RUN_VIEW.panels()}
    for key in figures.KEYS:
        assert key.field in {m.field for m in panels[key.panel].metrics}, key
    for p in RUN_VIEW.panels():
        if p.source == "node" and len(p.metrics) == 1:
            assert p.title.startswith(LABELS[p.metrics[0].field].label), p.title
        for m in p.metrics:
            if m.scale != 1.0:
                assert m.scale == pytest.approx(LABELS[m.field].scale)
    assert {f for f, lab in LABELS.items()} <= {f.name for f in sample_schema.fields()}
    assert LABELS["vmrss_kb"].unit == "MB" and LABELS["cpu_clock_hz"].unit == "% of one core"
    assert LABELS["objects_sent"].unit == "objects/s" and LABELS["bytes_sent"].unit == "MB/s"
