"""Real topologies: separate processes, real ZeroMQ sockets on loopback, a few seconds each."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import uproot

from flowstat.harness.orchestrator import Orchestrator, run_topology
from flowstat.harness.topology import from_dict
from flowstat.node import curve
from flowstat.node.protocol import ControlClient
from flowstat.proc.machine import host_identity
from support import fixture_runs
from support.common import ROOT, TOPOLOGIES, pid_alive, topology_dict
from support.runs import assert_no_loss, wait_for_file

pytestmark = pytest.mark.integration


def test_small_run_loses_nothing_and_writes_root(runs_dir):
    topo = from_dict(
        topology_dict(duration=3, object={"type": "TH1F", "size": "1kB"}, producers={"count": 4, "rate": 200})
    )
    s = run_topology(topo, runs_dir=runs_dir)
    assert_no_loss(s)
    # (whether the pacing holds the rate is a benchmark's figure: offered_to_nominal in
    # benchmarks/run_benchmarks.py; here, only that nothing was lost)
    merger = next(n for n in s["nodes"] if n["role"] == "merger")
    assert merger["merges"] * 4 >= merger["objects_merged"] - 3
    with uproot.open(s["viewer_output"]) as f:
        h = f["TH1F_0"]
        assert f.classnames()["TH1F_0;1"] == "TH1F"
        values = h.values(flow=True)
        # the latest merged object: up to 4 producers x 1000 Gaussian entries (the end-of-run flush
        # may merge a partial group), peaked at 0
        assert values.sum() in (1000, 2000, 3000, 4000)
        assert values[len(values) // 2] > values[5]
    assert json.loads((runs_dir / s["run_id"] / "summary.json").read_text())["ok"]


def test_every_run_is_monitored_and_recorded(runs_dir):
    from flowstat.schema import agent as agent_schema
    from flowstat.schema import sample as sample_schema

    topo = from_dict(topology_dict(duration=3, producers={"count": 2, "rate": 100}, mergers=1))
    s = run_topology(topo, runs_dir=runs_dir)
    assert_no_loss(s)
    lines = (runs_dir / s["run_id"] / "samples.ndjson").read_text().splitlines()
    header = json.loads(lines[0])["flowstat_run"]
    assert header["run_id"] == s["run_id"] and header["parameters"]["producers"] == 2
    # unpinned: each process may run where flowstat run may, and the run document says so
    run_doc = json.loads((runs_dir / s["run_id"] / "run.json").read_text())
    assert "cpus" not in run_doc["parameters"]
    assert {a["node_id"]: a["cpus"] for a in run_doc["affinity"]} == {
        n: sorted(os.sched_getaffinity(0)) for n in ("viewer", "merger-0", "producers-0", "agent-py", "agent-c")
    }
    docs = [json.loads(line) for line in lines[1:]]
    samples = [d for d in docs if "flowstat_agent" not in d]
    selves = [d["flowstat_agent"] for d in docs if "flowstat_agent" in d]
    assert s["agent"]["agent-py"]["samples"] == len(samples)
    # its self-samples are in the run file too: one at least (at exit), each valid, seq from 0
    assert s["agent"]["agent-py"]["self_samples"] == len(selves) >= 1 and docs[-1] == {"flowstat_agent": selves[-1]}
    assert [d["seq"] for d in selves] == list(range(len(selves))) and all(
        agent_schema.validate(d) == [] for d in selves
    )
    assert selves[-1]["samples"] == len(samples) and selves[-1]["run_id"] == s["run_id"]
    c_lines = (runs_dir / s["run_id"] / "samples-agent-c.lp").read_text().splitlines()
    c_samples = [x for x in c_lines if x.startswith("flowstat_node,")]
    assert s["agent"]["agent-c"]["samples"] == len(c_samples) > 0  # the C agent watched the run too
    assert s["agent"]["agent-c"]["self_samples"] == len(c_lines) - len(c_samples) >= 1
    assert c_lines[-1].startswith(f"flowstat_agent,agent=flowstat-agent-c,host={header['host']},run_id={s['run_id']} ")
    for sample in samples:
        assert sample_schema.validate(sample) == [], sample
    nodes = {n["node_id"] for n in s["nodes"]}
    for node in nodes:  # the run ended in order: every node's last sample says it stopped with it (both agents)
        mine = [x for x in samples if x["node_id"] == node]
        assert [x["seq"] for x in mine] == list(range(len(mine))) and len(mine) >= 3
        assert mine[-1]["node_state"] == "STOPPED" and "DOWN" not in [x["node_state"] for x in mine]
        c_states = [x.split('node_state="')[1].split('"')[0] for x in c_samples if f",node_id={node}," in x]
        assert c_states[-1] == "STOPPED" and "DOWN" not in c_states
    merger = [x for x in samples if x["node_id"] == "merger-0" and x["node_state"] == "RUNNING"]
    assert merger and all("average_merge_time_ms" in x and x["vmrss_kb"] > 0 for x in merger)
    assert max(x["objects_merged"] for x in merger) > 0


def test_buffer_of_one_overloads_and_still_loses_nothing(runs_dir):
    # 12,000/s offered to a merger that takes at most 1,000/s on any machine: refusals by construction
    topo = from_dict(topology_dict(**{**fixture_runs.OVERLOAD, "duration": 3}))
    s = run_topology(topo, runs_dir=runs_dir)
    assert_no_loss(s)
    producers = [n for n in s["nodes"] if n["role"] == "producer"]
    assert sum(p["send_overload_events"] for p in producers) > 0


def data_connections(port: int) -> dict[str, dict[str, int]]:
    """The established TCP connections to or from ``port`` as `ss -tmn` shows them, by
    "local->peer": each one's skmem (rb: receive buffer, tb: send buffer, in bytes)."""
    out = subprocess.run(
        ["ss", "-tmnH", "state", "established", f"( sport = :{port} or dport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.findall(r"(\S+)\s+(\S+)\s*\n\s*skmem:\(([^)]*)\)", out)
    return {
        f"{local}->{peer}": {m[0]: int(m[1]) for m in re.findall(r"([a-z]+)(\d+)", skmem)}
        for local, peer, skmem in found
    }


def watch_data_connections(run_dir, want: int, ended: threading.Event, seen: dict) -> None:
    """Until ``want`` producer->merger connections show both their ends (2 x want sockets), or the
    run ends: keep what `ss` shows of them in ``seen``."""
    endpoints = run_dir / "endpoints.json"
    while not ended.is_set():
        if endpoints.exists():
            nodes = json.loads(endpoints.read_text())["nodes"]
            port = int(next(n["data"] for n in nodes if n["role"] == "merger").rsplit(":", 1)[1])
            seen.update(port=port, sockets=data_connections(port))
            if len(seen["sockets"]) >= 2 * want:
                return
        ended.wait(0.05)  # re-reading what the kernel shows while the run starts


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_kernel_buffer_size_sets_both_ends_of_every_data_connection(runs_dir):
    topo = from_dict(topology_dict(duration=3, kernel_buffer_size=6000, producers={"count": 4, "rate": 100}))
    ended, seen = threading.Event(), {}
    watcher = threading.Thread(target=watch_data_connections, args=(runs_dir / "kbuf", 4, ended, seen))
    watcher.start()
    try:
        s = run_topology(topo, run_id="kbuf", runs_dir=runs_dir)
    finally:
        ended.set()
        watcher.join()
    assert_no_loss(s)
    port, sockets = seen["port"], seen["sockets"]
    # Linux doubles what is set (the other half is for its bookkeeping): 6000 -> 12000
    producer_ends = {k: v for k, v in sockets.items() if k.endswith(f":{port}")}
    merger_ends = {k: v for k, v in sockets.items() if k.split("->")[0].endswith(f":{port}")}
    assert len(producer_ends) == len(merger_ends) == 4, sockets
    assert all(v["tb"] == 12000 for v in producer_ends.values()), producer_ends  # SO_SNDBUF of the producers
    assert all(v["rb"] == 12000 for v in merger_ends.values()), merger_ends  # SO_RCVBUF of the merger
    doc = json.loads((runs_dir / "kbuf" / "run.json").read_text())
    assert doc["parameters"]["kernel_buffer_bytes"] == 6000


@pytest.mark.parametrize("kind", ["TH2F", "TH3F", "THnF", "TTree"])
def test_every_object_type_runs_without_loss(runs_dir, kind):
    topo = from_dict(
        topology_dict(duration=2, object={"type": kind, "size": "20kB"}, producers={"count": 3, "rate": 50})
    )
    s = run_topology(topo, runs_dir=runs_dir)
    assert_no_loss(s)
    with uproot.open(s["viewer_output"]) as f:
        obj = f[f"{kind}_0"]
        if kind == "TTree":
            assert obj.num_entries > 0 and len(obj.keys()) == 11
        else:
            assert obj.values(flow=True).sum() > 0


def test_large_objects_take_the_zero_copy_path(runs_dir):
    topo = from_dict(
        topology_dict(duration=2, object={"type": "TH1F", "size": "500kB"}, producers={"count": 2, "rate": 20})
    )
    s = run_topology(topo, runs_dir=runs_dir)
    assert_no_loss(s)
    merger = next(n for n in s["nodes"] if n["role"] == "merger")
    assert merger["bytes_received"] >= 500_000 * merger["objects_received"]


def test_producers_split_over_explicit_mergers(runs_dir):
    topo = from_dict(
        topology_dict(
            duration=2,
            producers={"count": 6, "rate": 100, "processes": 2},
            mergers=[{"id": "left", "producers": "0-3"}, {"id": "right", "producers": "4-5"}],
        )
    )
    s = run_topology(topo, runs_dir=runs_dir)
    assert_no_loss(s)
    mergers = {n["node_id"]: n for n in s["nodes"] if n["role"] == "merger"}
    assert set(mergers) == {"left", "right"}
    # each merger merges groups as large as its own producer count
    assert mergers["left"]["objects_merged"] / mergers["left"]["merges"] == pytest.approx(4, rel=0.05)


def test_five_hundred_producers_on_one_merger_lose_nothing_and_merge_in_groups_of_500(runs_dir):
    """How many objects 500 producers get through in the run is a benchmark's figure
    (scale_500_producers_1_merger in benchmarks/run_benchmarks.py): here, that all of them are
    accounted for, each producer on its own."""
    topo = from_dict(topology_dict(duration=5, buffer_size=100000, producers={"count": 500, "rate": 100}))
    s = run_topology(topo, runs_dir=runs_dir)
    assert_no_loss(s)
    c = s["conservation"]
    assert c["producers"] == 500 and c["producers_not_conserved"] == []
    merger = next(n for n in s["nodes"] if n["role"] == "merger")
    # a merge every 500 objects of its one name, and the end-of-run flush merges the rest
    assert merger["merges"] == -(-merger["objects_merged"] // 500) == c["merged_objects"]


class TestControlChannel:
    @pytest.fixture
    def running(self, runs_dir):
        topo = from_dict(topology_dict(duration=30, producers={"count": 2, "rate": 100}))
        orch = Orchestrator(topo, "ctl-test", runs_dir / "ctl-test")
        orch.start()
        yield orch
        orch.stop()
        orch.kill_all()
        orch.close()

    def merger_client(self, orch):
        return ControlClient(next(d for d in orch.devices if d.role == "merger").ready["control"])

    def test_check_state_and_get_metrics_fields(self, running):
        client = self.merger_client(running)
        state = client.request("check-state")
        for key in (
            "command",
            "node_id",
            "node_state",
            "PID",
            "request_timestamp",
            "response_timestamp",
            "receive_buffer_size",
            "receive_buffer_overloaded",
            "send_buffer_size",
            "send_buffer_overloaded",
        ):
            assert key in state
        assert state["command"] == "check-state" and state["node_state"] == "RUNNING"
        assert isinstance(state["PID"], int) and isinstance(state["receive_buffer_overloaded"], bool)
        assert state["receive_buffer_size"] == 100
        assert state["request_timestamp"].endswith("Z") and len(state["request_timestamp"]) == 24
        client.request("get-metrics")
        # wait for real merges rather than for a fixed time
        deadline = time.monotonic() + 10
        while (m := client.request("get-metrics"))["objects_merged"] < 100 and time.monotonic() < deadline:
            running.wakeup.wait(0.2)
        assert m["objects_merged"] >= 100
        assert m["VmRSS"] > 1000 and isinstance(m["VmRSS"], int)
        assert m["cpu_clock"] > 0 and m["merged_objects_per_second"] > 0
        assert isinstance(m["average_merge_time"], float) and m["average_merge_time"] > 0
        assert m["PID"] == next(d for d in running.devices if d.role == "merger").proc.pid
        for key in (
            "objects_received",
            "objects_merged",
            "bytes_received",
            "objects_held",
            "sequence_gaps",
            "send_overload_events",
            "merges",
        ):
            assert isinstance(m[key], int)
        client.close()

    def test_bad_requests_get_json_errors_and_the_node_keeps_running(self, running):
        client = self.merger_client(running)
        for raw in (b"not json", b"[]", b'{"command": 5}', b'{"command": "self-destruct"}', b"\xff" * 100):
            reply = json.loads(client.request_raw(raw))
            assert "error" in reply and reply["node_id"]
        assert client.request("check-state")["node_state"] == "RUNNING"
        assert client.request("get-metrics")["control_errors"] == 5
        client.close()

    def test_garbage_on_the_data_socket_is_counted(self, running):
        import zmq

        merger = next(d for d in running.devices if d.role == "merger")
        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(merger.ready["data"])
        for blob in (b"junk", os.urandom(300), b"FSQ1" + bytes(40)):
            push.send(blob)
        push.close()
        client = self.merger_client(running)
        deadline = time.monotonic() + 10
        while (m := client.request("get-metrics"))["malformed_messages"] < 3 and time.monotonic() < deadline:
            running.wakeup.wait(0.1)
        assert m["malformed_messages"] == 3 and m["node_state"] == "RUNNING"
        client.close()


def run_cli(args, **kw):
    return subprocess.run([sys.executable, "-m", "flowstat.cli", *args], capture_output=True, text=True, **kw)


def test_malformed_topology_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_id: x\nobject: {type: TH1F, size: 1kB}\nproducers: {count: 2}\nmergers: 5\n")
    result = run_cli(["run", str(bad), "--runs-dir", str(tmp_path / "runs")], timeout=60)
    assert result.returncode == 2
    assert "mergers: expected 1 to 2 mergers" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_json_summary(tmp_path):
    result = run_cli(
        ["run", str(TOPOLOGIES / "smoke.yaml"), "--duration", "2", "--json", "--runs-dir", str(tmp_path)], timeout=120
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert_no_loss(summary)


def start_background_run(tmp_path, run_id, *extra):
    """A `flowstat run` of the smoke topology in the background; returns it and its nodes once running."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "run",
            str(TOPOLOGIES / "smoke.yaml"),
            "--duration",
            "60",
            "--run-id",
            run_id,
            "--runs-dir",
            str(tmp_path),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    endpoints = tmp_path / run_id / "endpoints.json"
    wait_for_file(endpoints, proc)
    return proc, json.loads(endpoints.read_text())["nodes"]


def wait_for_samples(run, proc, node: str) -> None:
    """Until both agents have written a sample of the node (the Python one in the run file)."""
    for path in (run / "samples.ndjson", run / "samples-agent-c.lp"):
        wait_for_file(path, proc)
        deadline = time.monotonic() + 30
        while not any(mark in path.read_text() for mark in (f'"node_id":"{node}"', f",node_id={node},")):
            assert time.monotonic() < deadline, f"no sample of {node} in {path}"
            time.sleep(0.05)  # polling what a real agent writes


def node_states(run, node: str) -> tuple[list[str], list[str]]:
    """The node's states in its samples, in order: the Python agent's (run file), the C agent's."""
    py = [
        d["node_state"]
        for d in map(json.loads, (run / "samples.ndjson").read_text().splitlines()[1:])
        if d.get("node_id") == node
    ]
    c = [
        x.split('node_state="')[1].split('"')[0]
        for x in (run / "samples-agent-c.lp").read_text().splitlines()
        if x.startswith("flowstat_node,") and f",node_id={node}," in x
    ]
    return py, c


def test_ctrl_c_stops_everything_cleanly(tmp_path):
    """An orderly end too: the agents get the run-ending notice, and every node ends STOPPED."""
    proc, nodes = start_background_run(tmp_path, "int", "--json")
    pids = [n["pid"] for n in nodes]
    for node in nodes:
        wait_for_samples(tmp_path / "int", proc, node["node_id"])
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1  # interrupted runs are not clean runs
    summary = json.loads(out)
    assert "interrupted by the user" in summary["failures"]
    # the graceful stop still drained everything: nothing lost
    assert summary["conservation"]["ok"], summary["conservation"]
    assert not any(pid_alive(p) for p in pids)
    for node in nodes:
        for states in node_states(tmp_path / "int", node["node_id"]):
            assert states[-1] == "STOPPED" and "DOWN" not in states, (node, states)


def test_a_crashed_device_stops_the_run_and_leaves_no_orphans(tmp_path):
    """And the node killed mid-run is reported DOWN by both agents: a run broken by a crash gives
    them no run-ending notice."""
    proc, nodes = start_background_run(tmp_path, "crash", "--json")
    merger = next(n for n in nodes if n["role"] == "merger")
    run = tmp_path / "crash"
    wait_for_samples(run, proc, "merger-0")
    os.kill(merger["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    summary = json.loads(out)
    assert any("merger-0" in f and "code -9" in f for f in summary["failures"]), summary["failures"]
    assert not any(pid_alive(n["pid"]) for n in nodes)
    for states in node_states(run, "merger-0"):
        assert states[-1] == "DOWN" and "STOPPED" not in states, states


def test_killing_the_orchestrator_leaves_no_orphans(tmp_path):
    """Nor agents: the orchestrator is killed as they start, before they can ask the kernel to stop
    them with it (the Python agent is still importing): they see it is gone and stop."""
    from flowstat.proc.procfs import descendants

    proc, nodes = start_background_run(tmp_path, "orphan", "--quiet")
    agents = 2 if (ROOT / "collectors" / "c" / "build" / "flowstat-agent").exists() else 1
    deadline = time.monotonic() + 10
    while len(descendants(proc.pid)) < len(nodes) + agents and time.monotonic() < deadline:
        time.sleep(0.01)  # the agents are forked right after endpoints.json is written
    pids = descendants(proc.pid)
    assert len(pids) >= len(nodes) + agents
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)  # waiting on the kernel to deliver SIGTERM and the devices to drain
    assert not any(pid_alive(p) for p in pids)


def test_default_relative_runs_directory(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "run",
            str(TOPOLOGIES / "smoke.yaml"),
            "--duration",
            "2",
            "--run-id",
            "rel",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    run = tmp_path / "runs" / "rel"
    assert (run / "samples.ndjson").exists() and (run / "samples-agent-py.lp").stat().st_size > 0


def test_a_run_whose_merger_got_garbage_says_why_it_failed(tmp_path):
    import zmq

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "run",
            str(TOPOLOGIES / "smoke.yaml"),
            "--duration",
            "3",
            "--run-id",
            "garbage",
            "--runs-dir",
            str(tmp_path),
            "--json",
            "--no-agent",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    endpoints = tmp_path / "garbage" / "endpoints.json"
    wait_for_file(endpoints, proc)
    merger = next(n for n in json.loads(endpoints.read_text())["nodes"] if n["role"] == "merger")
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(merger["data"])
    for blob in (b"junk", b"FSQ1" + bytes(40)):
        push.send(blob)
    push.close()
    out, _ = proc.communicate(timeout=120)
    summary = json.loads(out)
    assert proc.returncode == 1 and not summary["ok"]
    assert [name for name, passed in summary["conservation"]["checks"].items() if not passed] == [
        "no_malformed_messages"
    ]
    log = tmp_path / "garbage" / "logs" / "merger-0.log"
    assert summary["failures"] == [
        f"no-loss check failed: no_malformed_messages: malformed messages dropped: "
        f"merger-0 2 (each node's log names the socket and what was wrong: {log})"
    ]
    verdict = json.loads((tmp_path / "garbage" / "run.json").read_text())["verdict"]
    assert verdict == {
        "ok": False,
        "conserved": False,
        "failed_checks": ["no_malformed_messages"],
        "failures": summary["failures"],
        "flow": "unknown",  # issue 46: which node held the flow back: a run too short to say
        "held_back_by": [],
        "flow_evidence": "no verdict: fewer than 3 readings after the first 3 s of start-up (the run was too short)",
    }


def test_a_run_whose_producer_was_killed_is_not_conserved_and_names_its_producers(runs_dir):
    """SIGKILL one of two producer processes once the merger has objects from the run: the victim's
    totals and end-of-stream markers never come, so the no-loss check must fail, naming its producers."""
    topo = from_dict(topology_dict(duration=30, producers={"count": 4, "rate": 100, "processes": 2}))
    victim, survivor = topo.producer_groups()
    killed = []

    def kill_producers_0(elapsed, duration, metrics, verdicts, flow):
        merger = next(r for r in metrics if r["node_id"] == "merger-0")
        if not killed and merger["objects_received"] > 0:  # mid-stream: the merger holds some of its objects
            pid = next(r["PID"] for r in metrics if r["node_id"] == "producers-0")
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    s = run_topology(topo, runs_dir=runs_dir, on_progress=kill_producers_0)
    assert killed, "the run ended before the merger received anything"
    c = s["conservation"]
    assert c["ok"] is False and not s["ok"]
    # Only the victim's producers are unaccounted for: it sent no totals and no end of stream. The
    # survivors were stopped as at a run's end (their merger is alive), delivered and declared all.
    assert c["producers_not_conserved"] == sorted(victim) and not set(survivor) & set(c["producers_not_conserved"])
    assert f"for producers {sorted(victim)}" in c["failed_checks"]["every_producer_sent_eq_received_eq_merged"]
    assert sorted(c["failed_checks"]) == [
        "entries_conserved_in_every_layer",
        "entries_sent_eq_entries_at_viewer",
        "every_producer_sent_eq_received_eq_merged",
        "viewer_inputs_eq_objects_sent",
    ]
    assert c["mergers_entries_not_conserved"] == ["merger-0"]
    # what was sent is the survivor's alone; the merger received the victim's objects too
    survivor_sent = next(n["objects_sent"] for n in s["nodes"] if n["node_id"] == "producers-1")
    assert c["objects_sent"] == survivor_sent < c["objects_received"] == c["objects_merged_in"]
    assert c["sequence_gaps"] == 0 and c["reordered_objects"] == 0  # lost at the tail: no gap to see
    assert s["failures"][0].startswith(
        f"producers-0 (producer) on {host_identity()} exited with code -9 during the run"
    ), s["failures"]
    assert s["failures"][1:] == [f"no-loss check failed: {name}: {why}" for name, why in c["failed_checks"].items()]


def test_a_merger_stopped_from_outside_ends_the_run_then_not_at_its_duration(runs_dir):
    """SIGTERM from someone else (Slurm's at scancel is one): the merger ends well, code 0 with its
    final report, which no device does on its own mid-run; the run must stop there and say so."""
    topo = from_dict(topology_dict(duration=120))
    stopped = []

    def stop_merger(elapsed, duration, metrics, verdicts, flow):
        merger = next((r for r in metrics if r["node_id"] == "merger-0"), None)  # None once it ended
        if not stopped and merger and merger["objects_received"] > 0:
            os.kill(merger["PID"], signal.SIGTERM)
            stopped.append(elapsed)

    s = run_topology(topo, runs_dir=runs_dir, on_progress=stop_merger)
    assert stopped, "the run ended before the merger received anything"
    assert s["failures"][0].startswith(
        f"merger-0 (merger) on {host_identity()} was stopped from outside (it ended well"
    ), s["failures"]
    assert s["seconds"] < 60 and not s["ok"], s["seconds"]  # not the 120 s it was to last
    merger = next(n for n in s["nodes"] if n["node_id"] == "merger-0")
    assert merger["objects_received"] > 0  # its final report was kept


def test_the_summary_says_how_to_send_what_is_still_spooled():
    from flowstat.harness.summary import format_summary

    s = {
        "run_id": "x",
        "run_dir": "runs/x",
        "seconds": 1.0,
        "nodes": [],
        "conservation": {},
        "failures": [],
        "parameters": {
            "producers": 1,
            "rate_per_producer": 1.0,
            "object_type": "TH1F",
            "object_bytes": 1000,
            "buffer_size": 1,
            "mergers": 1,
        },
        "agent": {
            "agent-c": {"samples": 3, "sinks": {"http://a/write": {"delivered": 1, "spooled": 2}}},
            "run_file": "runs/x/samples.ndjson",
        },
    }
    assert "still spooled:  2 batches" in format_summary(s)
    assert "flowstat agent --flush-spool runs/x/spool" in format_summary(s)
    s["agent"]["agent-c"]["sinks"]["http://a/write"]["spooled"] = 0
    assert "still spooled" not in format_summary(s)


def test_a_secured_run_answers_its_keys_only_and_loses_nothing(tmp_path):
    """security: CURVE on control and data sockets (forced: the run binds loopback). A stranger's
    `stop` changes nothing; `flowstat ctl --keys` and the agents are answered; nothing is lost."""
    topo = tmp_path / "secured.yaml"
    topo.write_text(json.dumps(topology_dict(duration=15, security={"control": "curve", "data": "curve"})))
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowstat.cli", "run", str(topo), "--run-id", "sec", "--runs-dir", str(tmp_path)]
        + ["--json", "--agent-interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = tmp_path / "sec"
    wait_for_file(run / "endpoints.json", proc)
    nodes = {n["node_id"]: n for n in json.loads((run / "endpoints.json").read_text())["nodes"]}
    merger = nodes["merger-0"]
    assert merger["curve_server_key"] == (run / "keys" / "node.key").read_text().split('"')[1]
    stranger = run_cli(["ctl", merger["control"], "stop", "--timeout", "0.5"], timeout=30)
    assert stranger.returncode == 1 and "no reply" in stranger.stderr
    # one who knows the nodes' public key (endpoints.json is readable) but holds another client key
    other = curve.create_run_keys(tmp_path / "other")
    shutil.copy(run / "keys" / "node.key", other / "node.key")
    stranger = run_cli(["ctl", merger["control"], "stop", "--timeout", "0.5", "--keys", str(other)], timeout=30)
    assert stranger.returncode == 1 and "no reply" in stranger.stderr
    keyed = run_cli(  # an answer is what counts, not its speed: a loaded machine may take seconds
        ["ctl", merger["control"], "check-state", "--keys", str(run / "keys"), "--timeout", "20"], timeout=60
    )
    assert keyed.returncode == 0 and json.loads(keyed.stdout)["node_state"] == "RUNNING", keyed.stderr
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert_no_loss(summary)  # the stranger's stop did not stop the merger
    assert {p.name: p.stat().st_mode & 0o777 for p in (run / "keys").glob("*secret")} == {
        "node.key_secret": 0o600,
        "client.key_secret": 0o600,
    }
    told = [line for line in (run / "logs" / "merger-0.log").read_text().splitlines() if "refused" in line]
    assert len(told) >= 1 and "further refusals are counted" in told[0], told
    assert sum("further refusals are counted" in line for line in told) == 1
    samples = [json.loads(line) for line in (run / "samples.ndjson").read_text().splitlines()[1:]]
    figures = [s["objects_received"] for s in samples if s.get("node_id") == "merger-0" and "objects_received" in s]
    final = next(n for n in summary["nodes"] if n["node_id"] == "merger-0")["objects_received"]
    assert figures == sorted(figures) and 0 < figures[-1] <= final  # the agent asked it over CURVE
    c_lines = [x for x in (run / "samples-agent-c.lp").read_text().splitlines() if ",node_id=merger-0," in x]
    assert any("objects_received=" in x for x in c_lines), c_lines[-3:]  # the C agent too
