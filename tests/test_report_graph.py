"""The report's pipeline graph (flowstat.report.graph, issue 46): runs written here by hand (a run
file of a few seconds and an endpoints.json saying who feeds whom), their graph checked as data and
as SVG (columns by depth, arrows' objects/s, siblings collapsed, bars as wide as the shares, no text
over another), then the report in headless Chromium at a laptop's screen."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from flowstat.report import figures, graph
from flowstat.report.build import write_report
from flowstat.report.load import load_run
from flowstat.timeutil import iso_utc_ms
from flowstat_lab import screenshots as shots
from support.common import ROOT

ARTIFACTS = ROOT / ".cache" / "test-artifacts" / "report-graph"
SECONDS = 20  # samples at 1 s; the steady window: 3 s (start-up) to the last sample
T0 = 1_795_000_000.0
SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class Node:
    """A node of a run written here: who feeds it (None: it does not say), the shares of its time
    (None: it does not account it), the objects/s it sends and receives."""

    node_id: str
    role: str
    upstream: tuple[str, ...] | None = ()
    busy: tuple[float, float, float] | None = (0.5, 0.0, 0.5)
    sent: float | None = 100.0
    received: float | None = 100.0
    counters: bool = True  # its time as counters (busy_seconds...) besides the ratios


def write_run(folder: Path, run_id: str, nodes: list[Node], endpoints: bool = True) -> Path:
    """A run directory: samples.ndjson (a sample a second of each node, and of an agent, for SECONDS s)
    and, with ``endpoints``, endpoints.json with each node's upstream."""
    out = folder / run_id
    out.mkdir()
    header = {"run_id": run_id, "started": iso_utc_ms(T0), "parameters": {"duration_s": SECONDS}}
    lines = [json.dumps({"flowstat_run": {**header, "agent": "flowstat-agent-py"}})]
    for k in range(1, SECONDS + 1):
        for pid, n in enumerate([*nodes, Node("agent-py", "agent", None, None, None, None)], 1000):
            s = {
                "time": iso_utc_ms(T0 + k),
                "run_id": run_id,
                "host": "h",
                "node_id": n.node_id,
                "role": n.role,
                "agent": "flowstat-agent-py",
                "seq": k,
                "pid": pid,
                "node_state": "RUNNING",
                "vmrss_kb": 1000 + pid + k,
            }
            if n.sent is not None:
                s["objects_sent"] = round(n.sent * k)
            if n.received is not None:
                s["objects_received"] = round(n.received * k)
            if n.busy is not None:
                for kind, share in zip(graph.KINDS, n.busy, strict=True):
                    s[f"{kind}_ratio"] = share
                    if n.counters:
                        s[f"{kind}_seconds"] = share * k
            lines.append(json.dumps(s))
    (out / "samples.ndjson").write_text("\n".join(lines) + "\n")
    if endpoints:
        doc = {
            "run_id": run_id,
            "nodes": [
                {"node_id": n.node_id, "role": n.role, "pid": pid}
                | ({"upstream": list(n.upstream)} if n.upstream is not None else {})
                for pid, n in enumerate(nodes, 1000)
            ],
        }
        (out / "endpoints.json").write_text(json.dumps(doc))
    return out


def chain() -> list[Node]:
    """producers-0 -> merger-0 -> viewer; the merger busy 97%, the producer backpressured half the time."""
    return [
        Node("producers-0", "producer", (), (0.2, 0.5, 0.3), sent=800.0, received=None),
        Node("merger-0", "merger", ("producers-0",), (0.97, 0.01, 0.02), sent=800.0, received=800.0),
        Node("viewer", "viewer", ("merger-0",), (0.05, 0.0, 0.95), sent=None, received=800.0),
    ]


def tree() -> list[Node]:
    """Four producers into two mergers, both into a top merger, into the viewer."""
    return [
        *(Node(f"producers-{i}", "producer", (), sent=100.0 + i, received=None) for i in range(4)),
        Node("merger-0", "merger", ("producers-0", "producers-2"), sent=202.0, received=202.0),
        Node("merger-1", "merger", ("producers-1", "producers-3"), sent=204.0, received=204.0),
        Node("merger-2", "merger", ("merger-0", "merger-1"), sent=406.0, received=406.0),
        Node("viewer", "viewer", ("merger-2",), sent=None, received=406.0),
    ]


def many(producers: int = 500) -> list[Node]:
    """``producers`` producers (each its own rate and shares) into one merger, into the viewer; a
    tenth of the producers do not account their time."""
    rates = [10.0 + k % 7 for k in range(producers)]
    return [
        *(
            Node(f"producers-{k}", "producer", (), None if k % 10 == 0 else (0.1, 0.6, 0.3), sent=r, received=None)
            for k, r in enumerate(rates)
        ),
        Node("merger-0", "merger", tuple(f"producers-{k}" for k in range(producers)), sent=sum(rates)),
        Node("viewer", "viewer", ("merger-0",), sent=None, received=sum(rates)),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("graph-runs")
    return {
        "chain": write_run(d, "chain", chain()),
        "tree": write_run(d, "tree", tree()),
        "many": write_run(d, "many", many()),
        "no-edges": write_run(d, "no-edges", [Node(n.node_id, n.role, None) for n in chain()]),
        "no-endpoints": write_run(d, "no-endpoints", chain(), endpoints=False),
    }


def graph_of(run_dir: Path) -> graph.Graph:
    run = load_run(run_dir)
    upstream, roles = graph.read_upstream(run_dir)
    g = graph.build(graph.node_flows(run, figures.steady_window(run)), upstream, roles)
    assert g is not None
    return g


def section(run_dir: Path) -> str:
    run = load_run(run_dir)
    return graph.section(0, run, figures.steady_window(run))


def svg_of(html: str) -> ET.Element:
    return ET.fromstring(html[html.index("<svg") : html.index("</svg>") + len("</svg>")])


def laid_out_well(root: ET.Element) -> None:
    """No two texts' boxes (as wide as graph.text_width makes them: conservative) overlap, and every
    text and rectangle is inside the viewBox."""
    _, _, width, height = (float(v) for v in root.get("viewBox", "").split())
    texts = []
    for t in root.iter(f"{SVG}text"):
        box = graph.text_box(
            float(t.get("x", "")),
            float(t.get("y", "")),
            t.text or "",
            float(t.get("font-size", "")),
            t.get("text-anchor", "start"),
            t.get("font-weight") == "bold",
        )
        texts.append((t.text, box))
    assert texts
    for (a, ba), (b, bb) in itertools.combinations(texts, 2):
        assert not graph.overlap(ba, bb), (a, ba, b, bb)
    for text, (x0, y0, x1, y1) in texts:
        assert 0 <= x0 and x1 <= width and 0 <= y0 and y1 <= height, (text, (x0, y0, x1, y1), width, height)
    for r in root.iter(f"{SVG}rect"):
        x, y, w, h = (float(r.get(k, "0")) for k in ("x", "y", "width", "height"))
        assert 0 <= x and x + w <= width + 1e-6 and 0 <= y and y + h <= height + 1e-6, r.attrib


def boxes(root: ET.Element) -> dict[str, ET.Element]:
    return {g.get("data-node", ""): g for g in root.iter(f"{SVG}g") if g.get("class") == "node"}


def bar(node: ET.Element) -> dict[str, float]:
    """The widths of a box's bar segments, by what they show."""
    return {r.get("data-share", ""): float(r.get("width", "")) for r in node.iter(f"{SVG}rect") if r.get("data-share")}


# -- the graph as data and as SVG ---------------------------------------------------------------------


def test_a_chain_is_three_columns_left_to_right_with_its_rates_and_the_node_holding_it_back(runs):
    g = graph_of(runs["chain"])
    by = {b.key: b for b in g.boxes}
    assert set(by) == {"producers-0", "merger-0", "viewer"}  # not the agent
    assert [by[n].depth for n in ("producers-0", "merger-0", "viewer")] == [0, 1, 2]
    assert by["producers-0"].x + by["producers-0"].w < by["merger-0"].x
    assert by["merger-0"].x + by["merger-0"].w < by["viewer"].x
    arrows = {(a.src.key, a.dst.key): a for a in g.arrows}
    assert set(arrows) == {("producers-0", "merger-0"), ("merger-0", "viewer")}
    for a in arrows.values():  # from what the upstream sent, its one downstream
        assert a.how == "sent" and a.rate == pytest.approx(800.0) and a.label == "800/s" and a.shown
    html = section(runs["chain"])
    root = svg_of(html)
    laid_out_well(root)
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "rate"] == ["800/s", "800/s"]
    # the verdict over the steady window: the merger, busy 97%, its producer backpressured 50%
    held = [k for k, e in boxes(root).items() if e.get("data-held")]
    assert held == ["merger-0"] and "Held back by merger-0." in html and 'data-flow-verdict="held_back"' in html


def test_a_two_layer_tree_is_four_columns_each_in_the_order_of_what_it_feeds(runs):
    g = graph_of(runs["tree"])
    by = {b.key: b for b in g.boxes}
    assert {k: b.depth for k, b in by.items()} == {
        **{f"producers-{i}": 0 for i in range(4)},
        "merger-0": 1,
        "merger-1": 1,
        "merger-2": 2,
        "viewer": 3,
    }
    # the producers of merger-0 above those of merger-1: no arrows crossing
    order = sorted((b for b in g.boxes if b.depth == 0), key=lambda b: b.y)
    assert [b.key for b in order] == ["producers-0", "producers-2", "producers-1", "producers-3"]
    assert by["merger-0"].y < by["merger-1"].y
    rates = {(a.src.key, a.dst.key): a.rate for a in g.arrows}
    assert rates == {
        **{(f"producers-{i}", f"merger-{i % 2}"): pytest.approx(100.0 + i) for i in range(4)},
        ("merger-0", "merger-2"): pytest.approx(202.0),
        ("merger-1", "merger-2"): pytest.approx(204.0),
        ("merger-2", "viewer"): pytest.approx(406.0),
    }
    laid_out_well(svg_of(section(runs["tree"])))


def test_500_producers_are_one_box_their_rates_summed(runs):
    g = graph_of(runs["many"])
    assert len(g.boxes) == 3 and len(g.arrows) == 2
    producers = next(b for b in g.boxes if b.role == "producer")
    assert producers.label == "producers ×500" and len(producers.members) == 500
    want = sum(10.0 + k % 7 for k in range(500))
    into_merger = next(a for a in g.arrows if a.dst.key == "merger-0")
    assert into_merger.src is producers and into_merger.edges == 500
    assert into_merger.rate == pytest.approx(want) and into_merger.how == "sent"
    # the shares: the mean of the 450 that account their time (the other 50 left out, not taken as 0)
    assert producers.accounted == 450 and producers.shares is not None
    assert [producers.shares.of(k) for k in graph.KINDS] == pytest.approx([0.1, 0.6, 0.3])
    root = svg_of(section(runs["many"]))
    laid_out_well(root)
    node = boxes(root)[producers.key]
    assert node.get("data-members") == "500"
    assert "producers ×500" in [t.text for t in root.iter(f"{SVG}text")]
    assert f"{want:,.0f}/s" in [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "rate"]
    # eight siblings are still eight boxes
    eight = graph.build(
        {f"p{k}": graph.NodeFlow(f"p{k}", "producer", None, 1.0, None) for k in range(8)},
        {"m": [f"p{k}" for k in range(8)]},
        {"m": "merger"},
    )
    assert eight is not None and len(eight.boxes) == 9


def test_a_run_whose_nodes_do_not_say_who_feeds_them_gets_a_note(runs):
    for name in ("no-edges", "no-endpoints"):
        html = section(runs[name])
        assert graph.NO_EDGES in html and "<svg" not in html, name


def test_a_node_without_accounting_is_grey_and_says_so(runs, tmp_path):
    nodes = chain()
    nodes[1] = Node("merger-0", "merger", ("producers-0",), None, sent=800.0, received=800.0)
    root = svg_of(section(write_run(tmp_path, "unaccounted", nodes)))
    merger = boxes(root)["merger-0"]
    box = next(float(r.get("width", "")) for r in merger.iter(f"{SVG}rect") if r.get("class") == "box")
    assert bar(merger) == {"none": pytest.approx(box - 2 * graph.PAD)}  # one grey segment, the whole bar
    assert next(r.get("fill") for r in merger.iter(f"{SVG}rect") if r.get("data-share")) == graph.NO_ACCOUNTING
    assert [t.text for t in merger.iter(f"{SVG}text") if t.get("class") == "shares"] == ["no accounting"]
    assert merger.get("data-busy") is None
    laid_out_well(root)


def test_the_bar_s_segments_are_as_wide_as_the_shares(runs, tmp_path):
    root = svg_of(section(runs["chain"]))
    segments = bar(boxes(root)["merger-0"])
    whole = sum(segments.values())
    assert segments["busy"] / whole == pytest.approx(0.97, abs=0.005)
    assert segments["backpressured"] / whole == pytest.approx(0.01, abs=0.005)
    assert segments["idle"] / whole == pytest.approx(0.02, abs=0.005)
    # the ratios alone (no counters) give the same shares
    nodes = [Node(n.node_id, n.role, n.upstream, n.busy, n.sent, n.received, counters=False) for n in chain()]
    ratios = bar(boxes(svg_of(section(write_run(tmp_path, "ratios", nodes))))["merger-0"])
    assert ratios == pytest.approx(segments)


def test_a_node_feeding_two_splits_what_each_received():
    flows = {
        "src": graph.NodeFlow("src", "producer", None, 300.0, None),
        "a": graph.NodeFlow("a", "viewer", None, None, 100.0),
        "b": graph.NodeFlow("b", "viewer", None, None, 200.0),
    }
    g = graph.build(flows, {"a": ["src"], "b": ["src"]})
    assert g is not None
    assert {(a.dst.key, a.rate, a.how, a.label) for a in g.arrows} == {
        ("a", 100.0, "split", "≈100/s"),
        ("b", 200.0, "split", "≈200/s"),
    }
    laid_out_well(ET.fromstring(graph.svg(g)))


# -- in a browser ---------------------------------------------------------------------------------------

IN_PAGE = """
const out = [];
for (const svg of document.querySelectorAll('svg.pipeline')) {
  const r = svg.getBoundingClientRect();
  out.push({run: svg.closest('section.card').querySelector('.run-name').textContent,
            left: r.left, right: r.right, top: r.top, width: r.width, height: r.height,
            texts: [...svg.querySelectorAll('text')].map(t => {
              const b = t.getBoundingClientRect();
              return {text: t.textContent, left: b.left, right: b.right, top: b.top, bottom: b.bottom};
            })});
}
return {graphs: out, viewport: document.documentElement.clientWidth};
"""


def test_the_graphs_read_well_in_chromium_at_a_laptop_s_screen(runs, tmp_path):
    """A report of the chain and of 500 producers side by side, and of the 500 alone: each run's graph
    on its first screen, displayed, as wide as its card at most, its texts apart (as drawn)."""
    with shots.browser(shots.LAPTOP) as driver:
        for name, shown in (("both", [runs["chain"], runs["many"]]), ("many", [runs["many"]])):
            made = write_report(shown, tmp_path / f"{name}.html")
            page = shots.open_report(driver, made.path, made.plots)
            assert page["severe"] == [] and page["drawn"] == made.plots
            print(f"screenshot: {shots.screenshot(driver, ARTIFACTS / f'{name}.webp')}")
            assert shots.overflow(driver) == []
            svgs = driver.find_elements("css selector", "svg.pipeline")
            assert len(svgs) == len(shown) and all(s.is_displayed() for s in svgs)
            got = driver.execute_script(IN_PAGE)
            assert [g["run"] for g in got["graphs"]] == [p.name for p in shown]
            for g in got["graphs"]:
                assert g["width"] > 100 and g["height"] > 40, g
                assert 0 <= g["left"] and g["right"] <= got["viewport"], g
                assert g["top"] < shots.LAPTOP[1], g  # it starts on the first screen
                texts = g["texts"]
                assert len(texts) >= 8
                for t in texts:
                    assert g["left"] <= t["left"] and t["right"] <= g["right"], (t, g)
                for a, b in itertools.combinations(texts, 2):
                    apart = a["right"] <= b["left"] or b["right"] <= a["left"]
                    assert apart or a["bottom"] <= b["top"] or b["bottom"] <= a["top"], (a, b)
            assert "producers ×500" in [t["text"] for g in got["graphs"] for t in g["texts"]]
