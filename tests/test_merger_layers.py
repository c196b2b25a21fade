"""Merger layers (merger_layers): mergers feeding mergers, as ALICE O2's later Mergers do. Real
runs: separate processes, real ZeroMQ sockets on loopback, a few seconds each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from flowstat.harness.agents import AgentOptions
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.topology import from_dict
from flowstat.node.protocol import ControlClient
from flowstat.proc.machine import host_identity
from support.common import topology_dict
from support.runs import assert_no_loss, wait_for_file

pytestmark = pytest.mark.integration


def layered_run(runs_dir, mergers, layers, producers=8):
    topo = from_dict(
        topology_dict(duration=3, producers={"count": producers, "rate": 100}, mergers=mergers, merger_layers=layers)
    )
    summary = run_topology(topo, runs_dir=runs_dir, agent=AgentOptions(enabled=False))
    run_doc = json.loads((runs_dir / summary["run_id"] / "run.json").read_text())
    return topo, summary, {n["node_id"]: n for n in summary["nodes"]}, run_doc


def assert_layers_conserved(topo, summary, nodes):
    """Every layer passed on what it merged, and the last one holds every producer's object."""
    c = summary["conservation"]
    assert c["checks"]["every_merger_sent_eq_received_eq_merged"] and c["checks"]["entries_conserved_in_every_layer"]
    layers = topo.layers()
    for below, above in zip(layers, layers[1:], strict=False):
        sent = sum(nodes[m]["objects_sent"] for m in below)
        assert (
            sent == sum(nodes[m]["objects_received"] for m in above) == sum(nodes[m]["objects_merged"] for m in above)
        )
        assert sent > 0
    assert c["merged_objects_by_layer"] == [sum(nodes[m]["merges"] for m in layer) for layer in layers]
    assert nodes["viewer"]["objects_received"] == sum(nodes[m]["merges"] for m in layers[-1]) == c["merged_objects"]


def test_two_layers_conserve_every_object_and_entry(runs_dir):
    topo, s, nodes, run_doc = layered_run(runs_dir, 4, [1])
    assert_no_loss(s)
    assert_layers_conserved(topo, s, nodes)
    c = s["conservation"]
    # the final merger merged in every first-layer merged object, and those hold every producer's object
    final = nodes["merger-l2-0"]
    assert final["layer"] == 2 and final["objects_merged"] == sum(nodes[f"merger-{i}"]["merges"] for i in range(4))
    assert sum(nodes[f"merger-{i}"]["objects_merged"] for i in range(4)) == c["objects_sent"]
    assert c["entries_sent"] == c["entries_at_viewer"] == c["objects_sent"] * 1000
    # one merge of the final merger takes one object from each of its 4 inputs (the end-of-run flush
    # may merge a partial group)
    assert final["objects_merged"] / final["merges"] == pytest.approx(4, rel=0.05)
    assert run_doc["parameters"]["mergers"] == 5 and run_doc["parameters"]["merger_layers"] == [1]
    assert run_doc["label"].endswith("4+1 mergers") and run_doc["verdict"]["conserved"]


def test_three_layers_uneven_conserve_every_object_and_entry(runs_dir):
    # 9 producers over 3 mergers, those over 2 (as producers are spread: round(1.5) = 2 inputs, then 1), those over 1
    topo, s, nodes, run_doc = layered_run(runs_dir, 3, [2, 1], producers=9)
    assert_no_loss(s)
    assert_layers_conserved(topo, s, nodes)
    assert topo.merger_inputs() == {
        "merger-l2-0": ("merger-0", "merger-1"),
        "merger-l2-1": ("merger-2",),
        "merger-l3-0": ("merger-l2-0", "merger-l2-1"),
    }
    c = s["conservation"]
    final = nodes["merger-l3-0"]
    assert final["objects_merged"] == nodes["merger-l2-0"]["merges"] + nodes["merger-l2-1"]["merges"]
    # a merger of one input passes each object on: one merge per object it received
    assert nodes["merger-l2-1"]["merges"] == nodes["merger-l2-1"]["objects_received"] == nodes["merger-2"]["merges"]
    # what the viewer got from the last merger holds every object the producers sent
    assert c["objects_sent"] == c["objects_merged_in"] == c["objects_received"] > 0.8 * 9 * 100 * 3
    assert run_doc["parameters"]["mergers"] == 6 and run_doc["parameters"]["merger_layers"] == [2, 1]
    assert run_doc["label"].endswith("3+2+1 mergers")


def test_one_layer_runs_say_so(runs_dir):
    topo, s, nodes, run_doc = layered_run(runs_dir, 2, None, producers=4)
    assert_no_loss(s)
    assert run_doc["parameters"]["merger_layers"] == [] and run_doc["label"].endswith("2 mergers")
    assert s["conservation"]["merged_objects_by_layer"] == [s["conservation"]["merged_objects"]]


def wait_for_merges(endpoint: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Until the merger has merged something: its inputs reach it and it sends downstream."""
    client = ControlClient(endpoint, timeout_s=2.0)
    deadline = time.monotonic() + timeout
    try:
        while client.request("get-metrics")["merges"] == 0:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"no merge at {endpoint}"
            time.sleep(0.05)  # polling a real process's counter
    finally:
        client.close()


def test_a_killed_first_layer_merger_fails_the_run_and_is_named(tmp_path):
    path = tmp_path / "layers.yaml"
    path.write_text(
        yaml.safe_dump(
            topology_dict(
                run_id="layers", duration=60, producers={"count": 8, "rate": 100}, mergers=4, merger_layers=[1]
            )
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "run",
            str(path),
            "--run-id",
            "kill",
            "--json",
            "--no-agent",
            "--runs-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    endpoints = tmp_path / "kill" / "endpoints.json"
    wait_for_file(endpoints, proc)
    nodes = {n["node_id"]: n for n in json.loads(endpoints.read_text())["nodes"]}
    assert nodes["merger-l2-0"]["role"] == "merger"
    wait_for_merges(nodes["merger-1"]["control"], proc)
    os.kill(nodes["merger-1"]["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    summary = json.loads(out)
    assert proc.returncode == 1 and not summary["ok"] and not summary["conservation"]["ok"]
    assert any(
        f.startswith(f"merger-1 (merger) on {host_identity()} exited with code -9") for f in summary["failures"]
    ), summary["failures"]
    # the live mergers were stopped once their input went quiet, not after the stage time-out: their
    # producers gave up on every channel, so no end-of-stream marker was coming
    assert not any("made no progress" in f for f in summary["failures"]), summary["failures"]
    # the layer above misses what merger-1 would have sent it: the check of its inputs names it
    assert summary["conservation"]["merger_inputs_not_conserved"] == ["merger-1->merger-l2-0"]
    assert any(
        "every_merger_sent_eq_received_eq_merged" in f and "merger-1->merger-l2-0" in f for f in summary["failures"]
    ), summary["failures"]
    # the others still ended in order, with their final report
    assert {n["node_id"] for n in summary["nodes"]} == set(nodes) - {"merger-1"}
