"""endpoints.json, the contract between flowstat run and the agents (flowstat/schema/endpoints.schema.json):
what the harness writes conforms, and both agents take exactly the nodes that conform."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from flowstat.harness.topology import from_dict
from flowstat.schema import endpoints
from support.agents import sleeper


def test_a_run_s_endpoints_file_conforms_and_names_every_node(runs_dir):
    from flowstat.harness.agents import AgentOptions
    from flowstat.harness.orchestrator import run_topology
    from support.common import topology_dict

    summary = run_topology(from_dict(topology_dict(duration=1)), runs_dir=runs_dir, agent=AgentOptions(enabled=False))
    doc = json.loads((runs_dir / summary["run_id"] / "endpoints.json").read_text())
    assert endpoints.validate(doc) == []
    assert doc["run_id"] == summary["run_id"]
    assert {n["node_id"] for n in doc["nodes"]} == {n["node_id"] for n in summary["nodes"]}
    assert all(n["control"].startswith("tcp://127.0.0.1:") for n in doc["nodes"])
    # issue 46: the edges, from the sources to the viewer: a tree of the run's own nodes
    feeds = {n["node_id"]: n["upstream"] for n in doc["nodes"] if n["role"] != "agent"}
    roles = {n["node_id"]: n["role"] for n in doc["nodes"]}
    assert all(feeds[p] == [] for p in feeds if roles[p] == "producer")
    assert feeds["viewer"] and all(roles[m] == "merger" for m in feeds["viewer"])
    fed_by = [u for ups in feeds.values() for u in ups]
    assert sorted(fed_by) == sorted(n for n in feeds if n != "viewer")  # each node feeds exactly one


@pytest.fixture
def targets():
    procs = [sleeper() for _ in range(2)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()


def test_both_agents_take_exactly_the_nodes_that_conform(tmp_path, agent_command, targets):
    ok, also_ok = targets
    nodes = [
        {"node_id": "good", "role": "merger", "pid": ok},
        {"node_id": "extra-field", "pid": also_ok, "cluster": "n1"},  # fields beyond the schema's: taken
        {"node_id": "here", "pid": also_ok, "host": socket.gethostname()},
        {"node_id": "elsewhere", "pid": ok, "host": "another-host"},  # conforms; another host's agent's
        {"node_id": "host-number", "pid": ok, "host": 7},
        {"node_id": "no-pid", "role": "merger"},
        {"pid": ok, "role": "merger"},  # no node_id
        {"node_id": "pid-text", "pid": str(ok)},
        {"node_id": "pid-zero", "pid": 0},
        {"node_id": "pid-fraction", "pid": ok + 0.5},
        {"node_id": "pid-too-big", "pid": 4194305},
        {"node_id": "role-number", "pid": ok, "role": 3},
        {"node_id": "control-null", "pid": ok, "control": None},
        {"node_id": "curve-key-number", "pid": ok, "curve_server_key": 7},  # issue 30
        {"node_id": "curve-key-short", "pid": ok, "curve_server_key": "short"},
        {"node_id": "fed", "pid": ok, "upstream": ["good", "here"]},  # issue 46: the pipeline's edges
        {"node_id": "upstream-text", "pid": ok, "upstream": "good"},
        {"node_id": "upstream-numbers", "pid": ok, "upstream": ["good", 3]},
        "not a node",
    ]
    doc = {"run_id": "ends", "nodes": nodes}
    conforming = {n["node_id"] for n in nodes if isinstance(n, dict) and not endpoints.validate({"nodes": [n]})}
    assert conforming == {"good", "extra-field", "here", "elsewhere", "fed"}  # the schema's own verdict, node by node
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps(doc))
    out = subprocess.run(
        [
            *agent_command,
            "--endpoints",
            str(path),
            "--count",
            "1",
            "--interval",
            "0.1",
            "--self-interval",
            "0",
            "--sink",
            "stdout://?format=json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    sampled = {json.loads(line)["node_id"] for line in out.stdout.splitlines() if line.strip()}
    assert sampled == conforming - {"elsewhere"}
    assert all(json.loads(line)["run_id"] == "ends" for line in out.stdout.splitlines() if line.strip())


@pytest.mark.parametrize("how", ["--host-name", "SLURMD_NODENAME"], ids=["option", "slurm"])
def test_an_agent_takes_its_host_s_nodes_by_the_name_given_or_slurm_s_not_the_hostname(
    tmp_path, agent_command, targets, how
):
    """Hosts of a cluster often share one hostname: an agent on node n2 takes the nodes the endpoints
    file puts on n2 and tags its samples with n2, whatever gethostname() says."""
    mine, theirs = targets
    nodes = [
        {"node_id": "on-n2", "pid": mine, "host": "n2"},
        {"node_id": "on-n3", "pid": theirs, "host": "n3"},
        {"node_id": "on-hostname", "pid": theirs, "host": socket.gethostname()},
    ]
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"run_id": "hosts", "nodes": nodes}))
    given = ["--host-name", "n2"] if how == "--host-name" else []
    env = {**os.environ, "SLURMD_NODENAME": "n3" if given else "n2"}  # the option wins over Slurm's name
    out = subprocess.run(
        [*agent_command, "--endpoints", str(path), "--count", "1", "--interval", "0.1", "--self-interval", "0"]
        + [*given, "--sink", "stdout://?format=json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    samples = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert [(s["node_id"], s["host"]) for s in samples] == [("on-n2", "n2")]


def test_a_file_that_is_no_endpoints_document_is_said_and_nothing_taken(tmp_path):
    path = tmp_path / "endpoints.json"
    for text in ("[]", '{"nodes": 3}', "not json"):
        path.write_text(text)
        with pytest.raises(ValueError):
            endpoints.read(path)
    path.write_text(json.dumps({"nodes": [{"node_id": "a", "pid": 1}, {"node_id": "b"}]}))
    run_id, good, bad = endpoints.read(path)
    assert (run_id, [n["node_id"] for n in good]) == ("", ["a"]) and bad == ["nodes[1].pid: required field is missing"]
