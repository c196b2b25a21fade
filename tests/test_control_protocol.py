import json
import os
import signal
import subprocess

import numpy as np
import pytest
import zmq

from flowstat.agent.control import ControlPool
from flowstat.harness import wire
from flowstat.harness.qcobjects import Kind, make_desc
from flowstat.node.protocol import MAX_REQUEST_BYTES, ControlClient, parse_request
from flowstat.node.rates import RateTracker
from flowstat.schema.sample import time_ns
from support.agents import Device, wait_until
from support.common import C_AGENT


def test_parse_request_accepts_known_commands():
    for command in ("check-state", "get-metrics"):
        assert parse_request(json.dumps({"command": command}).encode())[2] is None


def test_parse_request_errors_are_texts():
    assert "not JSON" in parse_request(b"\xff\xfe garbage")[2]
    assert "expected a JSON object" in parse_request(b"[1, 2]")[2]
    assert "missing" in parse_request(b'{"cmd": "x"}')[2]
    command, _, error = parse_request(b'{"command": "reboot"}')
    assert command == "reboot" and "unknown command" in error
    assert "exceeds" in parse_request(b" " * 70_000)[2]


def test_rates_and_overload_episodes_are_per_client():
    tracker = RateTracker()
    tracker.interval(b"a", 0)
    tracker.interval(b"b", 0)
    a = tracker.interval(b"a", 1000, (3, 1))
    b = tracker.interval(b"b", 1000, (3, 1))
    # each client sees the 1000 merged objects and the overload episodes since its own previous request
    assert a.merged_per_second > 0 and b.merged_per_second > 0
    assert (a.send_overloads, a.receive_overloads) == (b.send_overloads, b.receive_overloads) == (3, 1)
    again = tracker.interval(b"a", 1000, (5, 1))
    assert again.merged_per_second == 0.0 and (again.send_overloads, again.receive_overloads) == (2, 0)


# -- over a real socket, against a real node ------------------------------------------------------
# A merger process started as the orchestrator starts it; its downstream is a PULL socket here.


@pytest.fixture
def merger():
    ctx = zmq.Context()
    downstream = ctx.socket(zmq.PULL)
    port = downstream.bind_to_random_port("tcp://127.0.0.1")
    node = Device(
        "merger",
        {
            "node_id": "merger-0",
            "run_id": "ctl",
            "index": 0,
            "producers": [0, 1],
            "buffer_size": 100,
            "send_buffer": 100,
            "downstream_endpoint": f"tcp://127.0.0.1:{port}",
        },
    )
    client = ControlClient(node.ready["control"], ctx)
    yield node, client, downstream
    client.close()
    node.close()
    downstream.close(0)
    ctx.term()


def request_of(size: int, command: str = "check-state") -> bytes:
    """A well-formed request of exactly ``size`` bytes (its padding is a field the node ignores)."""
    bare = json.dumps({"command": command, "pad": ""}).encode()
    payload = json.dumps({"command": command, "pad": "x" * (size - len(bare))}).encode()
    assert len(payload) == size
    return payload


def test_a_request_of_exactly_the_limit_is_answered(merger):
    _, client, _ = merger
    reply = json.loads(client.request_raw(request_of(MAX_REQUEST_BYTES)))
    assert "error" not in reply, reply
    assert reply["command"] == "check-state" and reply["node_state"] == "RUNNING"


def test_one_byte_over_the_limit_gets_an_error_reply_and_the_node_keeps_answering(merger):
    node, client, _ = merger
    reply = json.loads(client.request_raw(request_of(MAX_REQUEST_BYTES + 1)))
    assert reply["error"] == f"request of {MAX_REQUEST_BYTES + 1} bytes exceeds {MAX_REQUEST_BYTES}"
    assert reply["node_id"] == "merger-0" and reply["command"] is None
    assert client.request("check-state")["node_state"] == "RUNNING"
    assert client.request("get-metrics")["control_errors"] == 1
    assert node.proc.poll() is None


def test_a_late_reply_to_a_timed_out_request_is_not_taken_for_the_next_one(merger):
    """The agent's pool asks over a DEALER socket: a reply that missed its deadline stays queued
    and comes before the next one. The node is frozen (SIGSTOP) to make its reply late."""
    node, _, _ = merger
    endpoint = node.ready["control"]
    pool = ControlPool(timeout_s=0.25)
    try:
        assert pool.query([endpoint])[endpoint]["id"] == 1  # connected, answering
        os.kill(node.proc.pid, signal.SIGSTOP)
        try:
            assert pool.query([endpoint]) == {} and pool.errors == 1  # request 2 timed out
        finally:
            os.kill(node.proc.pid, signal.SIGCONT)
        wait_until(lambda: pool.sockets[endpoint].poll(0, zmq.POLLIN), "the late reply to request 2")
        reply = pool.query([endpoint])[endpoint]
        assert reply["id"] == 3 and reply["command"] == "get-metrics"
        assert pool.errors == 1
    finally:
        pool.close()


def test_stop_ends_the_node_with_exit_code_0_and_its_final_counters(merger):
    node, client, downstream = merger
    desc = make_desc("TH1F_0", Kind.TH1F, (10,))
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(node.ready["data"])
    ones = np.ones(10, np.float32)
    for source, seq in ((0, 0), (1, 0), (0, 1)):  # a merge of two, then one held
        push.send_multipart(wire.encode(desc, ones, source=source, seq=seq, entries=10.0))
    push.close(linger=5000)
    wait_until(lambda: client.request("get-metrics")["objects_received"] == 3, "the merger to take 3 objects")
    reply = client.request("stop")
    assert reply["command"] == "stop" and reply["node_id"] == "merger-0"
    final = node.event("final")
    assert node.proc.wait(30) == 0, node.stderr()
    # what it held is merged at the end (a merge of one), and its end of stream says 2 merges
    assert (final["objects_received"], final["objects_merged"], final["merges"], final["objects_held"]) == (3, 3, 2, 0)
    assert final["per_producer"] == {
        "producer": [0, 1],
        "received": [2, 1],
        "merged_in": [2, 1],
        "declared_sent": [None, None],
    }
    assert final["sequence_gaps"] == 0 and final["eos_received"] == 0
    got = []
    while downstream.poll(5000):
        got.append(wire.decode_header(downstream.recv_multipart()[0]))
        if got[-1].flags & wire.FLAG_EOS:
            break
    assert [(h.seq, h.n_inputs, bool(h.flags & wire.FLAG_EOS)) for h in got] == [
        (0, 2, False),
        (1, 1, False),
        (2, 0, True),
    ]


def complete_lines(path) -> list[dict]:
    """What an agent wrote to a file sink so far, its last line only once it is whole."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines(keepends=True) if x.endswith("\n")]


@pytest.mark.skipif(not C_AGENT.exists(), reason="run `make c-agent` (make test does)")
def test_the_c_agent_takes_no_late_reply_for_a_later_round(merger, tmp_path):
    """The node is frozen (SIGSTOP) for a few rounds of the C agent, whose requests then get their
    replies late, queued ahead of the next rounds' replies. A round that took one of those would
    carry a request_timestamp older than the round itself."""
    node, _, _ = merger
    endpoints, out = tmp_path / "endpoints.json", tmp_path / "c.json"
    endpoints.write_text(
        json.dumps(
            {
                "run_id": "ctl",
                "nodes": [
                    {"node_id": "merger-0", "role": "merger", "pid": node.proc.pid, "control": node.ready["control"]}
                ],
            }
        )
    )
    agent = subprocess.Popen(
        [
            str(C_AGENT),
            "--endpoints",
            str(endpoints),
            "--interval",
            "0.2",
            "--control-timeout",
            "0.1",
            "--self-interval",
            "0",
            "--sink",
            f"file://{out}?format=json",
            "--quiet",
        ]
    )
    answered = lambda: [s for s in complete_lines(out) if "request_timestamp" in s]
    try:
        wait_until(lambda: len(answered()) >= 2, "two answered rounds")
        os.kill(node.proc.pid, signal.SIGSTOP)
        try:
            before = len(complete_lines(out))
            wait_until(lambda: len(complete_lines(out)) >= before + 3, "three rounds while the node is frozen")
        finally:
            os.kill(node.proc.pid, signal.SIGCONT)
        frozen = len(answered())
        wait_until(lambda: len(answered()) >= frozen + 5, "five answered rounds after the node thawed")
    finally:
        agent.terminate()
        assert agent.wait(30) == 0
    samples = complete_lines(out)
    assert "request_timestamp" not in samples[before + 1]  # unanswered while frozen: the test made late replies
    for s in answered():
        # the node receives a round's request after the round began (its stamp): never 50 ms before
        assert time_ns(s["request_timestamp"]) >= time_ns(s["time"]) - 50_000_000, s
