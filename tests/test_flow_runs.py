"""Which node holds the flow back, in real harness runs (issue 46): topologies whose limit is known,
made so by a CPU cost per object set on one node or two (merge_cost.nodes), never by this machine's
speed. The harness's nodes account their time (busy, backpressured, idle); the orchestrator judges
every second over the topology's edges, and the run's summary and run document name exactly the
slow nodes, or none.

The slow nodes are pinned to CPU 0 and the rest to CPU 1: a node that burns CPU on purpose is busy
all the time whatever it shares its CPU with, and the others keep a CPU of their own, so that no
node is named because the machine was full."""

from __future__ import annotations

import json
import re

import pytest

from flowstat.harness.agents import AgentOptions
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.summary import format_summary
from flowstat.harness.topology import from_dict
from support.common import topology_dict
from support.flowcases import CASES, costs, pins

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("case", list(CASES))
def test_the_verdict_names_exactly_the_slow_nodes(case, runs_dir):
    shape, slow, others = CASES[case]
    small = {"buffer_size": 20, "kernel_buffer_size": "16kB"}  # a short drain
    topo = from_dict(topology_dict(duration=10, **{**small, **shape}))
    topo = from_dict(
        topology_dict(
            duration=10,
            **{**small, **shape},
            merge_cost={"nodes": costs(slow)} if slow else None,
            cpus=pins(slow, [n for n, r in topo.node_roles().items() if r != "agent"]),
        )
    )
    s = run_topology(topo, runs_dir=runs_dir, agent=AgentOptions(enabled=False))
    flow = s["flow"]
    text = format_summary(s)
    if slow:
        assert flow["flow"] == "held_back" and sorted(flow["held_back_by"]) == sorted(slow), text
        assert "flow: held back by " + slow[0] in text or "flow: held back by " + slow[-1] in text
        for node in slow:
            # named before the run ends (10 s): the slowdown is there from the start
            assert flow["first_named_s"][node] <= 10.0, flow
        if case == "two slow mergers of four":  # its producers' sends are refused: the symptom upstream
            assert "upstream producers-0 backpressured" in flow["flow_evidence"], flow
    else:
        assert flow["flow"] == "none" and flow["held_back_by"] == [], text
        busiest = re.search(r"busiest: \S+ busy (\d+)%", flow["flow_evidence"])
        assert busiest and int(busiest.group(1)) < 50, flow  # nodes that keep up wait for input
    doc = json.loads((runs_dir / s["run_id"] / "run.json").read_text())
    assert doc["verdict"]["flow"] == flow["flow"] and doc["verdict"]["held_back_by"] == flow["held_back_by"]
    edges = {(e["from"], e["to"]) for e in doc["edges"]}
    assert {to for _, to in edges} >= {n for n in slow if n.startswith("merger")} | {"viewer"}
    assert not any(o in flow["held_back_by"] for o in others)
    assert s["ok"], text  # nothing lost: a slow node holds the flow back, it drops nothing


# -- the run's verdict from its evaluations (no processes) ------------------------------------------
def replies(busy: float, latency: float, t: float) -> list[dict]:
    """A chain source -> m: m busy ``busy``, its input latency ``latency`` ms."""
    return [
        {"node_id": "source", "busy_ratio": 0.0, "backpressured_ratio": 1.0, "idle_ratio": 0.0},
        {
            "node_id": "m",
            "busy_ratio": busy,
            "backpressured_ratio": 0.0,
            "idle_ratio": 1 - busy,
            "input_latency_p50_ms": latency,
            "node_state": "RUNNING",
        },
        {"node_id": "agent-py", "busy_ratio": 1.0},  # not a node of the pipeline: not judged
    ]


def test_start_up_s_points_are_left_out_of_the_run_s_verdict_not_of_the_live_one():
    from flowstat.harness.flowwatch import FlowWatch

    watch = FlowWatch({"source": (), "m": ("source",)}, startup_s=3.0)
    watch.add(1.0, replies(0.2, 10, 1.0))  # start-up: m waited for its first input
    lives = [watch.add(float(t), replies(0.95, 10 * t, float(t))) for t in range(2, 9)]
    # live, start-up's point keeps the busy share under 0.9 while it is in the last 5 s (to 5 s)
    assert [v.kind for v in lives] == ["unknown", "none", "none", "none", "held_back", "held_back", "held_back"]
    run = watch.run_verdict()
    assert run["flow"] == "held_back" and run["held_back_by"] == ["m"], run
    # without it: 3 and 4 s have too few points, 5 to 8 s name m (4 of 6)
    assert run["first_named_s"] == {"m": 5.0} and run["held_back_share"] == {"m": round(4 / 6, 3)}


def test_a_node_named_less_than_half_the_steady_time_is_not_the_run_s_verdict():
    from flowstat.harness.flowwatch import FlowWatch, short

    watch = FlowWatch({"source": (), "m": ("source",)}, startup_s=0.0)
    for t in range(1, 25):
        slow = t > 14  # slow from 15 s: a whole window of it only at 24 s, 1 evaluation of 24
        watch.add(float(t), replies(0.95 if slow else 0.3, 10 * t if slow else 10, float(t)))
    assert short(watch.latest()) == "held back by m"
    run = watch.run_verdict()
    assert run["flow"] == "none" and run["held_back_by"] == [], run
    assert FlowWatch({"m": ()}, startup_s=5.0).run_verdict()["flow"] == "unknown"  # too short a run


def test_the_progress_line_shows_the_verdict_the_orchestrator_gives_it():
    """`flowstat run`'s progress line judges nothing itself: it shows the orchestrator's verdict of
    the same reading (one FlowWatch a run)."""
    import io

    from flowstat.flow import Verdict
    from flowstat.harness.command import _progress_printer

    out = io.StringIO()
    show = _progress_printer(out)
    show(6.0, 10.0, [], {}, Verdict("held_back", ("merger-1",), "merger-1: busy 97%", 6.0))
    assert "held back by merger-1" in out.getvalue()
    show(12.0, 20.0, [], {}, None)  # 6 s later: a line every 5 s when not on a terminal
    assert out.getvalue().splitlines()[-1].endswith("flow: judging")
