"""flowstat.node, the Python node library (issue 26): a user's own node answers the control protocol
with what it was told, survives bad clients, announces itself in an endpoints directory; both agents
watch the directory, take nodes as they come, and tell a clean stop (STOPPED) from a death (DOWN)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from flowstat.node import ControlClient, Node, curve
from flowstat.node.announce import file_name
from flowstat.node.protocol import ControlError
from flowstat.proc.procfs import status_fields
from flowstat.schema import endpoints
from support.agents import wait_until
from support.common import ROOT
from support.nodes import agent_edge_counts, agent_samples, assert_rate_within, stop_agent, timed, watching_agent
from support.user_runs import free_port_block

EXAMPLE = ROOT / "examples" / "python-pipeline" / "pipeline.py"


# -- the protocol, in one process ------------------------------------------------------------------
def test_a_node_answers_get_metrics_with_what_it_was_told():
    with Node("m-0", "merger", run_id="r1", receive_buffer_size=10, send_buffer_size=20) as node:
        now = time.time()
        for _ in range(300):
            node.received(1, 100, sent_at=now - 0.050)  # each waited 50 ms
        node.received(2, 7)  # no stamp: counted, no latency
        node.received(3, 30, sent_at=[now - 0.050] * 3)  # a batch read at once, stamps in a list
        node.received(4, 40, sent_at=np.full(4, now - 0.050))  # a vectorised node's
        for ms in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12):  # the last ten average 7.5 ms
            node.merged(5, ms / 1e3)
        node.sent(3, 30)
        reply = ControlClient(node.endpoint).request("get-metrics")
    assert (reply["node_id"], reply["role"], reply["run_id"], reply["node_state"]) == ("m-0", "merger", "r1", "RUNNING")
    assert reply["PID"] == os.getpid()
    assert (reply["receive_buffer_size"], reply["send_buffer_size"]) == (10, 20)
    assert (reply["objects_received"], reply["bytes_received"]) == (309, 30_000 + 7 + 30 + 40)
    assert (reply["objects_sent"], reply["bytes_sent"], reply["merges"], reply["objects_merged"]) == (3, 30, 12, 60)
    assert reply["average_merge_time"] == pytest.approx(7.5)
    assert reply["merged_objects_per_second"] > 0 and reply["cpu_clock"] >= 0 and reply["VmRSS"] > 1000
    assert reply["input_latency_objects"] == 307
    # told at most a few ms after the stamp: within the buckets' 1% and the loop's time
    assert 50 * 0.99 <= reply["input_latency_p50_ms"] <= 50 * 1.01 + 20
    assert reply["input_latency_p99_ms"] <= reply["input_latency_max_ms"] + 1e-9
    assert reply["send_buffer_overloaded"] is False and reply["send_overload_events"] == 0
    assert reply["request_timestamp"].endswith("Z") and reply["control_errors"] == 0


def test_latency_every_measures_the_stamps_of_one_stamped_call_in_n_however_told():
    """Stamp i waited i seconds; with latency_every=3 the stamped calls 0, 3, 6, 9 are measured, all
    of each call's stamps, whether one, a list or a numpy array; calls without stamps do not count."""
    with Node("w-0", "worker", latency_every=3) as node:
        now = time.time()
        stamps = [now - i for i in range(40)]
        for stamp in stamps[:7]:  # calls 0-6
            node.received(1, 1, sent_at=stamp)
            node.received(1, 1)  # no stamp: counted, not a stamped call
        node.received(5, 5, sent_at=stamps[7:12])  # call 7
        node.received(1, 1, sent_at=stamps[12])  # call 8
        node.received(27, 27, sent_at=np.array(stamps[13:40]))  # call 9, measured
        waits = sorted(round(w) for w in node.received.__self__.waits)  # the first tally's, not yet bucketed
        reply = ControlClient(node.endpoint).request("get-metrics")
    assert waits == [0, 3, 6, *range(13, 40)]
    assert reply["objects_received"] == 47 and reply["input_latency_objects"] == 30
    assert 39e3 <= reply["input_latency_max_ms"] <= 39e3 + 1e3
    with pytest.raises(ValueError, match="latency_every"):
        Node("w-1", latency_every=0)


def _voluntary_switches(tid: int) -> int:
    return int(status_fields(f"self/task/{tid}")["voluntary_ctxt_switches"])


def _once_asleep(threads: list[threading.Thread], quiet: float = 0.5, timeout: float = 10.0) -> list[int]:
    """The threads' wake-up counts once none changed for `quiet` seconds. A client that goes away
    wakes them a few times (libzmq ends its pipes inside poll()), a little after its close: counted
    in the window, those made a sleeping thread look woken 4 times on a loaded machine."""
    deadline = time.monotonic() + timeout
    counts = [_voluntary_switches(t.native_id) for t in threads]
    while True:
        time.sleep(quiet)  # the quiet stretch itself: there is no event for "nothing happened"
        now = [_voluntary_switches(t.native_id) for t in threads]
        if now == counts:
            return now
        assert time.monotonic() < deadline, f"never {quiet:g} s without a wake-up in {timeout:g} s: on a timer?"
        counts = now


@pytest.mark.parametrize("secured", [False, True], ids=["plain", "curve"])
def test_an_idle_node_s_threads_sleep_until_asked_and_close_wakes_them(tmp_path, secured):
    """The control thread (and the CURVE guard's) blocks until a request or close() comes: a thread
    woken on a timer, 10 times a second, cost an idle node 1.5 ms of CPU a second, 1% of a node
    taking 100,000 messages a second. Counted in the kernel's wake-ups of each thread, not in time."""
    keys = curve.create_run_keys(tmp_path) if secured else None
    node = Node("idle", curve_keys=keys)
    keyed = (node.curve_server_key, curve.client_keys(keys / "client.key_secret")) if keys else None
    client = ControlClient(node.endpoint, curve=keyed)
    client.request("check-state")  # the threads up, past a first request
    client.close()
    threads = [node._thread] + ([node._guard._thread] if secured else [])
    before = _once_asleep(threads)
    time.sleep(2.0)  # the window counted: a thread on a 100 ms timer wakes 20 times in it
    woke = [_voluntary_switches(t.native_id) - b for t, b in zip(threads, before, strict=True)]
    node.close()
    assert max(woke) <= 2, woke  # asleep: none, or a straggler; a 100 ms timer: 20 each
    assert not any(t.is_alive() for t in threads)


def test_a_node_that_merges_nothing_reports_no_merge_figures():
    with Node("src", "producer") as node:
        node.sent(5, 50)
        reply = ControlClient(node.endpoint).request("get-metrics")
    assert reply["average_merge_time"] is None and reply["merged_objects_per_second"] is None
    assert reply["input_latency_objects"] == 0 and reply["input_latency_p50_ms"] is None


def test_each_client_has_its_own_interval_and_sees_each_overload_once():
    with Node("m", "merger") as node:
        a, b = ControlClient(node.endpoint), ControlClient(node.endpoint)
        a.request("get-metrics"), b.request("get-metrics")
        node.send_refused(), node.send_refused()  # one episode, however many refusals
        node.sent(1, 1)  # over: the flag now is down
        assert a.request("check-state")["send_buffer_overloaded"] is False
        first_a = a.request("get-metrics")
        assert first_a["send_buffer_overloaded"] is True and first_a["send_overload_events"] == 1
        assert a.request("get-metrics")["send_buffer_overloaded"] is False  # told once to a ...
        b0 = timed(b)
        assert b0[1]["send_buffer_overloaded"] is True  # ... and once to b
        node.input_backlog(True), node.input_backlog(True), node.input_backlog(False), node.input_backlog(True)
        a0 = timed(a)
        assert a0[1]["receive_overload_events"] == 2 and a0[1]["receive_buffer_overloaded"] is True
        node.merged(40, 0.001)
        time.sleep(0.2)
        a1 = timed(a)
        time.sleep(0.2)
        b1 = timed(b)
    # the same 40 over each client's own interval: b's began before a's and ends after it
    assert_rate_within(a0, a1, 40)
    assert_rate_within(b0, b1, 40)


def test_threads_count_on_their_own_tallies_and_the_node_sums_them():
    with Node("w", "worker") as node:
        tallies = [node.tally() for _ in range(4)]

        def work(t):
            for _ in range(10_000):
                t.received(1, 3)

        import threading

        threads = [threading.Thread(target=work, args=(t,)) for t in tallies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        node.received(5, 5)
        reply = ControlClient(node.endpoint).request("get-metrics")
    assert (reply["objects_received"], reply["bytes_received"]) == (40_005, 120_005)


def test_objects_are_counted_by_the_upstream_node_that_sent_them_across_threads(caplog):
    """received(source=...): a PULL taking from several nodes counts each edge apart (get-metrics'
    received_from, summed over the threads' tallies); past MAX_SOURCES, in the totals only."""
    from flowstat.node import node as node_module

    with Node("sink", "worker", upstream=["w-0", "w-1"]) as node:
        other = node.tally()
        node.received(3, 30, source="w-0")
        other.received(2, 20, source="w-0")
        other.received(7, 70, source="w-1")
        node.received(4, 40)  # no source said: the totals only
        first = ControlClient(node.endpoint).request("get-metrics")
        with pytest.raises(ValueError, match="upstream node"):
            node.received(1, source="")
        for i in range(node_module.MAX_SOURCES):
            other.received(1, source=f"s{i}")
        reply = ControlClient(node.endpoint).request("get-metrics")
    assert first["received_from"] == {"w-0": 5, "w-1": 7}
    assert first["objects_received"] == 16
    got = reply["received_from"]
    assert len(got) == node_module.MAX_SOURCES and got["w-1"] == 7  # w-0, w-1 and the first 254 new ones
    assert reply["objects_received"] == 16 + 1 + node_module.MAX_SOURCES  # the refused ones still count
    assert sum(1 for r in caplog.records if "past 256 sources" in r.getMessage()) == 1


def test_a_node_told_no_source_sends_no_received_from():
    with Node("n", "worker") as node:
        node.received(1, 1)
        assert "received_from" not in ControlClient(node.endpoint).request("get-metrics")


def test_bad_requests_get_errors_are_counted_and_a_client_that_never_reads_stalls_nothing():
    with Node("n", "worker") as node:
        ctx = zmq.Context.instance()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(node.endpoint)
        bad = [b"\xff\xfe", b"[1, 2]", b'{"no": "command"}', b'{"command": "self-destruct"}', b"{" + b" " * 100_000]
        for payload in bad:
            dealer.send(payload)
        errors = []
        for _ in bad:
            assert dealer.poll(5000), "no reply to a bad request"
            errors.append(json.loads(dealer.recv())["error"])
        assert "not JSON" in errors[0] and "JSON object" in errors[1] and '"command"' in errors[2]
        assert "unknown command 'self-destruct'" in errors[3] and "exceeds 65536" in errors[4]
        # a client that sends thousands of requests and reads no reply
        for _ in range(5000):
            dealer.send(b'{"command": "get-metrics"}')
        node.received(1, 1)
        t0 = time.monotonic()
        reply = ControlClient(node.endpoint, timeout_s=10).request("get-metrics")
        assert time.monotonic() - t0 < 10 and reply["objects_received"] == 1
        assert reply["control_errors"] == len(bad)
        dealer.close(0)


def test_a_node_that_cannot_bind_says_why_and_counts_on(caplog):
    with Node("first", "worker") as first:
        with caplog.at_level(logging.WARNING, logger="flowstat.node"):
            second = Node("second", "worker", bind=first.endpoint)
        assert second.endpoint is None and second.endpoint_file is None
        assert any(
            "second" in r.message and first.endpoint in r.message and "unmonitored" in r.message for r in caplog.records
        )
        second.received(3, 3)
        assert second.counters()["objects_received"] == 3
        second.close()


def test_a_state_outside_the_protocols_is_refused():
    with Node("n") as node:
        node.state = "DRAINING"
        assert ControlClient(node.endpoint).request("check-state")["node_state"] == "DRAINING"
        with pytest.raises(ValueError, match="one of STARTING"):
            node.state = "FINE"


def test_stop_from_a_monitor_reaches_the_node():
    stopped = []
    with Node("n", on_stop=lambda: stopped.append(True)) as node:
        reply = ControlClient(node.endpoint).request("stop")
        assert reply["command"] == "stop" and node.wait_for_stop(5)
    assert node.stop_requested and stopped == [True]


def test_close_after_the_control_thread_ended_first():
    """close() sets _closing, then wakes the thread: a thread awake for a request in between sees
    _closing and closes its end of the wake pair first. close() has then nothing to wake (it once
    raised zmq.Again there: test_stop_from_a_monitor_reaches_the_node, one run in many)."""
    node = Node("n")
    node._closing.set()  # the moment inside close(), held open
    assert ControlClient(node.endpoint).request("check-state")["node_state"] == "RUNNING"
    node._thread.join(5)
    assert not node._thread.is_alive()
    node.close()
    assert node._wake is None and node._thread is None


# -- endpoint files ----------------------------------------------------------------------------------
NODE_PROGRAM = textwrap.dedent(
    """
    import sys, time
    from flowstat.node import Node
    node = Node(sys.argv[1], sys.argv[2], run_id="user-run", endpoints_dir=sys.argv[3])
    print(node.endpoint, flush=True)
    while not node.stop_requested:
        node.received(1, 10, sent_at=time.time() - 0.01)
        node.sent(1, 10)
        time.sleep(0.01)
    node.close()
    """
)


STARTED: list[subprocess.Popen] = []  # processes a test started: none outlives it, passed or failed


@pytest.fixture(autouse=True)
def _reap_started():
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.terminate()  # the example passes SIGTERM on to its stages
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait(10)


def start_node(node_id: str, role: str, folder: Path, keys: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, curve.ENV_KEYS: str(keys)} if keys else None
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE_PROGRAM, node_id, role, str(folder)], stdout=subprocess.PIPE, text=True, env=env
    )
    STARTED.append(proc)
    assert proc.stdout.readline().startswith("tcp://127.0.0.1:")
    return proc


def test_the_endpoint_file_names_the_node_and_is_withdrawn_on_a_clean_stop_but_left_by_a_kill(tmp_path):
    folder = tmp_path / "endpoints"  # made by the node
    clean, killed = start_node("w/0", "worker", folder), start_node("w-1", "worker", folder)
    files = sorted(p.name for p in folder.iterdir())
    assert files == sorted([file_name("w/0", clean.pid), file_name("w-1", killed.pid)])
    assert file_name("w/0", clean.pid) == f"w_0.{clean.pid}.json"  # no path out of the folder
    run_id, nodes, bad = endpoints.read(folder / file_name("w/0", clean.pid))
    assert (run_id, bad) == ("user-run", [])
    assert nodes[0]["pid"] == clean.pid and nodes[0]["role"] == "worker" and nodes[0]["node_id"] == "w/0"
    assert ControlClient(nodes[0]["control"]).request("check-state")["node_id"] == "w/0"
    ControlClient(nodes[0]["control"]).request("stop")
    assert clean.wait(10) == 0
    killed.kill()
    killed.wait(10)
    assert sorted(p.name for p in folder.iterdir()) == [file_name("w-1", killed.pid)]


# -- both agents on a directory -------------------------------------------------------------------------
def start_agent(agent_command, folder: Path, out: Path, *extra: str, rescan: str = "0.2") -> subprocess.Popen:
    proc = watching_agent(agent_command, folder, out, *extra, rescan=rescan)
    STARTED.append(proc)
    return proc


def test_an_agent_takes_late_nodes_and_reports_a_kill_down_a_clean_stop_stopped(agent_command, tmp_path):
    folder, out = tmp_path / "endpoints", tmp_path / "samples.ndjson"
    folder.mkdir()
    early = start_node("early", "worker", folder)
    # no periodic search in the test's time: the late node is taken because the directory changed
    agent = start_agent(agent_command, folder, out, rescan="3600")
    try:
        wait_until(lambda: any(s["node_id"] == "early" for s in agent_samples(out)), "the early node sampled")
        late = start_node("late", "sink", folder)  # after the agent's first scan
        wait_until(
            lambda: sum(s["node_id"] == "late" and s["node_state"] == "RUNNING" for s in agent_samples(out)) >= 3,
            "the late node sampled",
        )
        early.kill()
        ControlClient(json.loads(next(folder.glob("late.*.json")).read_text())["nodes"][0]["control"]).request("stop")
        assert late.wait(10) == 0 and early.wait(10) == -signal.SIGKILL
        wait_until(
            lambda: {s["node_id"] for s in agent_samples(out) if s["node_state"] in ("DOWN", "STOPPED")}
            == {"early", "late"},
            "both ends reported",
        )
    finally:
        err = stop_agent(agent)
    samples = agent_samples(out)
    last = {s["node_id"]: s for s in samples}
    assert last["early"]["node_state"] == "DOWN" and last["late"]["node_state"] == "STOPPED", err
    running = [s for s in samples if s["node_id"] == "late" and s["node_state"] == "RUNNING"]
    assert {s["role"] for s in running} == {"sink"} and {s["run_id"] for s in running} == {"user-run"}
    assert all(s["input_latency_p50_ms"] >= 9.9 for s in running if s.get("input_latency_objects"))
    assert any(s.get("input_latency_objects") for s in running)


FINAL_COUNTS_PROGRAM = textwrap.dedent(
    """
    import sys, time
    from flowstat.node import Node
    node = Node("ending", "sink", endpoints_dir=sys.argv[1])
    print(node.endpoint, flush=True)
    while not node.stop_requested:
        node.received(1, 10, source="up-0")  # its replies carry received_from: the agents take the rest
        node.sent(1, 10)
        time.sleep(0.01)
    node.sent(1000, 10_000)  # counted after the last request the agent made while it ran
    node.close()
    print(node.counters()["objects_sent"], flush=True)
    """
)


def test_a_node_that_closes_tells_an_agent_its_final_counts_with_its_stopped_state(agent_command, tmp_path):
    folder, out = tmp_path / "endpoints", tmp_path / "samples.ndjson"
    proc = subprocess.Popen(
        [sys.executable, "-c", FINAL_COUNTS_PROGRAM, str(folder)], stdout=subprocess.PIPE, text=True
    )
    STARTED.append(proc)
    control = proc.stdout.readline().strip()
    agent = start_agent(agent_command, folder, out)
    try:
        wait_until(lambda: sum(s["node_id"] == "ending" for s in agent_samples(out)) >= 3, "the node sampled")
        ControlClient(control).request("stop")
        final = int(proc.stdout.readline())
        assert proc.wait(10) == 0
        wait_until(lambda: any(s["node_state"] == "STOPPED" for s in agent_samples(out)), "the end reported")
    finally:
        err = stop_agent(agent)
    counted = [s for s in agent_samples(out) if "objects_sent" in s]
    assert counted[-1]["objects_sent"] == final and counted[-1]["node_state"] == "STOPPED", (final, counted[-1], err)
    assert counted[-1]["objects_received"] == final - 1000


def test_junk_stale_and_unreadable_files_are_said_once_and_the_good_nodes_taken(agent_command, tmp_path):
    folder, out = tmp_path / "endpoints", tmp_path / "samples.ndjson"
    folder.mkdir()
    (folder / "junk.json").write_text("not json")
    dead = subprocess.Popen(["true"])
    dead.wait()
    (folder / f"gone.{dead.pid}.json").write_text(json.dumps({"nodes": [{"node_id": "gone", "pid": dead.pid}]}))
    (folder / "dangling.json").symlink_to(folder / "nowhere")
    os.mkfifo(folder / "fifo.json")
    (folder / ".half-written.json.tmp").write_text("{")
    (folder / "notes.txt").write_text("not an endpoints file")
    good = start_node("good", "worker", folder)
    agent = start_agent(agent_command, folder, out)
    try:
        wait_until(
            lambda: sum(s["node_id"] == "good" for s in agent_samples(out)) >= 10,
            "ten samples of the good node (many rescans)",
        )
    finally:
        err = stop_agent(agent)
        ControlClient(json.loads(next(folder.glob("good.*.json")).read_text())["nodes"][0]["control"]).request("stop")
        good.wait(10)
    assert {s["node_id"] for s in agent_samples(out)} == {"good"}
    for name in ("junk.json", f"gone.{dead.pid}.json", "dangling.json", "fifo.json"):
        said = [line for line in err.splitlines() if name in line]
        assert len(said) == 1, (name, said, err[-2000:])
    assert "half-written" not in err and "notes.txt" not in err


# -- the example pipeline ---------------------------------------------------------------------------
def start_example(folder: Path, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLE),
            "all",
            "--endpoints-dir",
            str(folder),
            "--base-port",
            str(free_port_block()),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.append(proc)
    return proc


def test_both_agents_see_the_example_pipelines_merges_rates_latency_and_overloads(agent_command, tmp_path):
    """The pyzmq example, made slow and overloaded by construction: merges of 10 objects at 2 ms of
    CPU each (20 ms a merge: the merger merges at most 500 objects/s of the 1,000/s offered), and a
    sink that sleeps 200 ms per merged object of 64 kB (5/s) behind queues of 5 messages and kernel
    buffers of 64 kB: the merger's sends are refused as soon as it merges more than 5 a second, which
    takes a tenth of its 50/s, so the overload holds on a machine loaded enough to slow the merger."""
    folder, out = tmp_path / "endpoints", tmp_path / "samples.ndjson"
    folder.mkdir()
    agent = start_agent(agent_command, folder, out)
    example = start_example(
        folder,
        *("--objects", "600", "--rate", "1000", "--size", "65536", "--merge-every", "10", "--merge-cost-us", "2000"),
        *("--sink-delay-ms", "200", "--hwm", "5", "--tcp-buffer-kb", "64", "--keep-running"),
    )
    try:
        assert example.stdout.readline().strip() == "sink: 60 merged objects", example.stderr.read()[-3000:]

        def last(node_id: str) -> dict:
            return [s for s in agent_samples(out) if s["node_id"] == node_id][-1]

        wait_until(lambda: last("merger").get("objects_merged") == 600, "the merger's 600 objects sampled")
        wait_until(lambda: last("sink").get("objects_received") == 60, "the sink's 60 sampled")
    finally:
        example.send_signal(signal.SIGTERM)
        example.wait(60)
    try:
        wait_until(
            lambda: {s["node_id"] for s in agent_samples(out) if s["node_state"] == "STOPPED"} == set(STAGES),
            "every stage's clean stop reported",
        )
    finally:
        err = stop_agent(agent)
    by_node: dict[str, list[dict]] = {}
    for s in agent_samples(out):
        by_node.setdefault(s["node_id"], []).append(s)
    assert set(by_node) == set(STAGES), err[-2000:]
    for node_id, role in STAGES.items():
        assert {s["role"] for s in by_node[node_id]} == {role}
        assert by_node[node_id][-1]["node_state"] == "STOPPED"  # withdrawn, not DOWN
    merger = [s for s in by_node["merger"] if s["node_state"] == "RUNNING"]
    times = [s["average_merge_time_ms"] for s in merger if s.get("average_merge_time_ms") is not None]
    assert times and all(20 * 0.95 <= t < 200 for t in times), times  # 10 objects x 2 ms of CPU, in ms
    rates = [s["merged_objects_per_second"] for s in merger if s.get("merged_objects_per_second")]
    assert rates and max(rates) <= 500 * 1.5, rates  # its merges allow 500/s (an interval may end between merges)
    assert any(s["send_buffer_overloaded"] for s in merger), "the merger's sends were never refused"
    assert max(s.get("send_overload_events") or 0 for s in merger) >= 1
    sink = [s for s in by_node["sink"] if s.get("input_latency_objects")]
    assert sink and max(s["input_latency_p99_ms"] for s in sink) > 200, "a queue before a 200 ms sink waits"
    worker = [s for s in by_node["worker-0"] if s["node_state"] == "RUNNING"]
    assert (
        max(s["objects_received"] for s in worker)
        + max(s["objects_received"] for s in by_node["worker-1"] if s["node_state"] == "RUNNING")
        == 600
    )
    # each edge into a PULL fed by several, counted where it arrives (received(source=...))
    edges = agent_edge_counts(out)
    assert set(edges) == {
        ("source-0", "worker-0"),
        ("source-0", "worker-1"),
        ("worker-0", "merger"),
        ("worker-1", "merger"),
    }
    assert edges[("worker-0", "merger")] + edges[("worker-1", "merger")] == 600
    for w in ("worker-0", "worker-1"):
        assert edges[("source-0", w)] == max(s.get("objects_received", 0) for s in by_node[w]) > 0


STAGES = {"source-0": "producer", "worker-0": "worker", "worker-1": "worker", "merger": "merger", "sink": "sink"}


def test_requests_too_deep_or_with_numbers_too_long_for_python_are_refused_not_raised():
    from flowstat.node.protocol import parse_request

    for payload in (b"[" * 50_000, b'{"command": "check-state", "id": ' + b"9" * 5000 + b"}"):
        command, request, error = parse_request(payload)
        assert error is not None and error.startswith("malformed request: not JSON"), error


# -- CURVE (issue 30) -------------------------------------------------------------------------------
def test_a_secured_node_answers_the_runs_key_only_and_says_its_first_refusal_once(tmp_path, caplog):
    keys = curve.create_run_keys(tmp_path)
    assert oct(keys.stat().st_mode & 0o777) == "0o700"
    modes = {p.name: p.stat().st_mode & 0o777 for p in keys.iterdir()}
    assert modes == {"node.key": 0o644, "node.key_secret": 0o600, "client.key": 0o644, "client.key_secret": 0o600}
    client = curve.client_keys(keys / "client.key_secret")
    stopped = []
    with caplog.at_level(logging.WARNING, logger="flowstat.curve"):
        with Node("n", curve_keys=keys, endpoints_dir=tmp_path / "ep", on_stop=lambda: stopped.append(1)) as node:
            server = node.curve_server_key
            assert server == curve.read_key_file(keys / "node.key")[0].decode()
            announced = json.loads(next((tmp_path / "ep").iterdir()).read_text())["nodes"][0]
            assert announced["curve_server_key"] == server and not endpoints.validate({"nodes": [announced]})
            strangers = {
                "no CURVE": None,
                "another client key": (server, zmq.curve_keypair()),
                "another run's node key": (zmq.curve_keypair()[0], client),
            }
            for why, keyed in strangers.items():
                # refused in the handshake: the request goes unanswered, or (the handshake failed
                # before it was sent, as a loaded machine may order them) never leaves the client
                with pytest.raises(ControlError, match="no reply|could not send"):
                    ControlClient(node.endpoint, timeout_s=0.3, curve=keyed).request("stop")
                assert not stopped and node.state == "RUNNING", why
            assert ControlClient(node.endpoint, curve=(server, client)).request("check-state")["node_id"] == "n"
            ControlClient(node.endpoint, curve=(server, client)).request("stop")
            assert stopped == [1]
            told = [r.message for r in caplog.records if "refused" in r.message]
            assert len(told) == 1 and "further refusals are counted" in told[0], told
    assert any("refused in all" in r.message for r in caplog.records)
    assert not any(k.decode() in r.message for r in caplog.records for k in client)  # no key is logged


def test_a_node_given_unreadable_keys_runs_unmonitored_never_in_the_clear(tmp_path, caplog):
    keys = curve.create_run_keys(tmp_path)
    (keys / "node.key_secret").write_text('curve\n    secret-key = "short"\n')
    with caplog.at_level(logging.WARNING, logger="flowstat.node"):
        with Node("n", curve_keys=keys) as node:
            assert node.endpoint is None
            node.received(2, 2)
            assert node.counters()["objects_received"] == 2
    assert any("node.key_secret" in r.message and "unmonitored" in r.message for r in caplog.records)


def test_an_agent_asks_a_secured_node_with_the_runs_key_and_without_it_samples_proc_only(agent_command, tmp_path):
    folder, theirs = tmp_path / "endpoints", tmp_path / "another-run"
    keys = curve.create_run_keys(folder)  # folder/keys: where an agent of the folder looks by default
    start_node("secured", "worker", folder, keys=keys)
    keyed, keyless = tmp_path / "keyed.ndjson", tmp_path / "keyless.ndjson"
    agents = [
        start_agent(agent_command, folder, keyed),
        start_agent(agent_command, folder, keyless, "--curve-client-key", str(theirs / "client.key_secret")),
    ]
    try:
        wait_until(
            lambda: sum(bool(s.get("objects_received")) for s in agent_samples(keyed)) >= 3, "the keyed agent's figures"
        )
        wait_until(lambda: len(agent_samples(keyless)) >= 3, "the keyless agent's samples")
    finally:
        logs = [stop_agent(a) for a in agents]
    received = [s["objects_received"] for s in agent_samples(keyed) if s.get("objects_received")]
    assert received == sorted(received) and received[-1] > received[0] > 0
    assert all(s["node_state"] == "RUNNING" for s in agent_samples(keyed))
    assert not any("objects_received" in s for s in agent_samples(keyless))  # /proc's figures only
    assert all(s["vmrss_kb"] > 0 for s in agent_samples(keyless))
    told = [line for line in logs[1].splitlines() if "secured" in line and "client key" in line]
    assert len(told) == 1 and str(theirs / "client.key_secret") in told[0], logs[1]
