"""libflowstat-node, the C library that gives a ZeroMQ process flowstat's control channel
(collectors/c/libflowstat-node/include/flowstat/node.h), against real processes: node-probe (collectors/c/tests/
node_probe.c, a node made of library calls told what to do line by line) and the C++ example
pipeline (examples/cpp-pipeline), asked by flowstat.node.ControlClient. What the node
is told must come back exact; rates and latencies as flowstat/node/protocol.py and flowstat/node/latency.py
compute them; refusals worded as parse_request's."""

from __future__ import annotations

import calendar
import fcntl
import itertools
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
import unicodedata
from pathlib import Path

import pytest
import zmq

from flowstat.node import curve
from flowstat.node.latency import LatencyRecorder
from flowstat.node.protocol import ControlClient, ControlError, parse_request
from flowstat.schema import endpoints as endpoints_schema
from support.agents import wait_until
from support.common import C_AGENT, C_BUILD, ROOT
from support.nodes import agent_samples, assert_rate_within, stop_agent, timed, watching_agent

C_DIR = ROOT / "collectors" / "c"
PROBE = C_BUILD / "node-probe"
PROBE_ASAN = C_BUILD / "node-probe-asan"
FUZZER = C_BUILD / "fuzz_node_request"
EXAMPLE = ROOT / "examples" / "cpp-pipeline"
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

# docs/control-protocol.md: every field of a reply and its JSON type (None: null allowed).
STATE_FIELDS = {
    "command": (str,),
    "node_id": (str,),
    "node_state": (str,),
    "PID": (int,),
    "request_timestamp": (str,),
    "response_timestamp": (str,),
    "receive_buffer_size": (int, None),
    "receive_buffer_overloaded": (bool,),
    "send_buffer_size": (int, None),
    "send_buffer_overloaded": (bool,),
}
METRIC_FIELDS = {
    "average_merge_time": (float, None),
    "VmRSS": (int,),
    "cpu_clock": (float,),
    "merged_objects_per_second": (float, None),
    "input_latency_p50_ms": (float, None),
    "input_latency_p99_ms": (float, None),
    "input_latency_max_ms": (float, None),
    "input_latency_objects": (int,),
    "role": (str,),
    "run_id": (str, None),
    "uptime_s": (float,),
    "busy_seconds": (float,),
    "backpressured_seconds": (float,),
    "idle_seconds": (float,),
    "busy_ratio": (float, None),
    "backpressured_ratio": (float, None),
    "idle_ratio": (float, None),
    **{
        name: (int,)
        for name in (
            "control_errors",
            "objects_sent",
            "bytes_sent",
            "objects_received",
            "bytes_received",
            "objects_merged",
            "merges",
            "send_overload_events",
            "receive_overload_events",
        )
    },
}


def make(*targets: str, directory: Path = C_DIR, env: dict | None = None) -> subprocess.CompletedProcess:
    """make in collectors/c, one at a time however many pytest workers ask (they share build/)."""
    C_BUILD.mkdir(parents=True, exist_ok=True)
    with open(C_BUILD / ".make-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = subprocess.run(
            ["make", "-C", str(directory), *targets], capture_output=True, text=True, timeout=600, env=env
        )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def built() -> None:
    make("build/libflowstat-node.a", "build/libflowstat-node.so", "build/node-probe")


def fields_typed(reply: dict, fields: dict) -> list[str]:
    """What in reply is not as the protocol says: missing, extra or of the wrong JSON type."""
    wrong = [f"missing {k}" for k in fields if k not in reply]
    wrong += [f"extra {k}" for k in reply if k not in fields and k != "id"]
    for k, types in fields.items():
        v = reply.get(k)
        if k in reply and not ((v is None and None in types) or any(type(v) is t for t in types if t)):
            wrong.append(f"{k}={v!r}")
    return wrong


class Probe:
    """A node-probe process: each call sends it one line and returns its answer (after "ok")."""

    def __init__(self, *args: str, binary: Path = PROBE, env: dict | None = None):
        self.proc = subprocess.Popen(
            [str(binary), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        kind, _, rest = self.line().partition(" ")
        self.endpoint = rest if kind == "endpoint" and rest != "none" else None
        self.invalid = rest if kind == "invalid" else None

    def line(self, timeout: float = 10) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"node-probe said nothing in {timeout} s"
        return self.proc.stdout.readline().rstrip("\n")

    def __call__(self, command: str, timeout: float = 10) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self.line(timeout)
        assert answer.startswith("ok"), answer
        return answer[3:]

    def finish(self) -> str:
        """End it (stdin closed: it closes its node) and return what it said on stderr."""
        self.proc.stdin.close()
        assert self.proc.wait(timeout=10) == 0
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if not f.closed:
                f.close()


@pytest.fixture
def probes(built):
    started: list[Probe] = []

    def start(*args: str, **kw) -> Probe:
        p = Probe(*args, **kw)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


@pytest.fixture
def clients():
    made: list[ControlClient] = []

    def client(endpoint: str) -> ControlClient:
        c = ControlClient(endpoint, timeout_s=3)
        made.append(c)
        return c

    yield client
    for c in made:
        c.close()


# -- state fields and commands -------------------------------------------------------------------


def test_check_state_has_every_state_field_typed_as_documented(probes, clients):
    p = probes("--node-id", "merger-0", "--role", "merger", "--receive-buffer-size", "10", "--send-buffer-size", "20")
    c = clients(p.endpoint)
    before = time.time()
    r = c.request("check-state", id=5)
    assert fields_typed(r, STATE_FIELDS) == [] and r["id"] == 5
    assert (r["command"], r["node_id"], r["node_state"], r["PID"]) == ("check-state", "merger-0", "RUNNING", p.proc.pid)
    assert (r["receive_buffer_size"], r["send_buffer_size"]) == (10, 20)
    assert ISO_MS.match(r["request_timestamp"]) and ISO_MS.match(r["response_timestamp"])
    assert r["request_timestamp"] <= r["response_timestamp"]
    assert abs(calendar.timegm(time.strptime(r["request_timestamp"][:19], "%Y-%m-%dT%H:%M:%S")) - before) < 5  # UTC
    unsized = probes("--node-id", "n")
    assert (lambda s: (s["receive_buffer_size"], s["send_buffer_size"]))(
        clients(unsized.endpoint).request("check-state")
    ) == (None, None)


def test_state_start_and_stop(probes, clients):
    p = probes("--node-id", "producer-0", "--role", "producer")
    c = clients(p.endpoint)
    for state in ("STARTING", "READY"):
        p(f"state {state}")
        assert c.request("check-state")["node_state"] == state
    assert p("start?") == "0"
    assert c.request("start")["node_state"] == "RUNNING"  # a READY node starts
    assert p("start?") == "1"
    p("state DRAINING")
    assert c.request("start")["node_state"] == "DRAINING"  # only READY moves
    assert p("stop?") == "0"
    r = c.request("stop", id="s")
    assert (r["command"], r["id"], fields_typed(r, STATE_FIELDS)) == ("stop", "s", [])
    assert p("stop?") == "1"
    start = time.monotonic()
    p("close")
    assert time.monotonic() - start < 1  # the control thread hears close() within its poll


# -- get-metrics ------------------------------------------------------------------------------------


def test_get_metrics_counts_what_the_node_told_exactly(probes, clients):
    p = probes("--node-id", "viewer", "--role", "viewer", "--run-id", "run-7")
    c = clients(p.endpoint)
    r = c.request("get-metrics")
    assert fields_typed(r, {**STATE_FIELDS, **METRIC_FIELDS}) == []
    assert (r["role"], r["run_id"], r["command"]) == ("viewer", "run-7", "get-metrics")
    assert r["average_merge_time"] is None and r["merged_objects_per_second"] is None  # never merged
    assert (r["input_latency_p50_ms"], r["input_latency_max_ms"], r["input_latency_objects"]) == (None, None, 0)
    assert r["VmRSS"] > 100 and 0 <= r["uptime_s"] < 30
    p("received 3 300")
    p("received 4 1000000000000")
    p("sent 2 20")
    p("sent 1 5")
    r = c.request("get-metrics")
    assert (r["objects_received"], r["bytes_received"]) == (7, 1000000000300)
    assert (r["objects_sent"], r["bytes_sent"]) == (3, 25)
    assert (r["objects_merged"], r["merges"], r["control_errors"]) == (0, 0, 0)
    assert clients(probes("--node-id", "x").endpoint).request("get-metrics")["role"] == "other"


def test_counts_from_many_threads_add_up(probes, clients):
    """Threads past the ones with counters of their own share one, atomically: nothing is lost."""
    p = probes("--node-id", "n")
    c = clients(p.endpoint)
    p("threads 16 200000", timeout=120)
    p("threads 3 1000")  # threads come and go: new ones take the shards left, then share
    r = c.request("get-metrics")
    n = 16 * 200000 + 3 * 1000
    assert (r["objects_received"], r["bytes_received"], r["objects_sent"], r["bytes_sent"]) == (n, 2 * n, n, 3 * n)
    assert r["input_latency_objects"] == n and 0.98 <= r["input_latency_p50_ms"] < 1.1


def test_objects_are_counted_by_source_from_many_threads(probes, clients):
    """fs_node_source/fs_node_received_from: each source's objects apart (received_from), the same
    handle for the same id, atomically across threads; bad ids and handles count in the totals only."""
    p = probes("--node-id", "sink", "--upstream", "up-0,up-1")
    c = clients(p.endpoint)
    assert "received_from" not in c.request("get-metrics")
    assert p("source up-0") == "0" and p("source up-1") == "1" and p("source up-0") == "0"
    assert p("source " + "x" * 256) == "-1"
    p("from 0 5 50")
    p("from 1 2 20")
    p("from 7 3 30")  # no such handle: the totals only
    p("from -1 4 40")
    r = c.request("get-metrics")
    assert r["received_from"] == {"up-0": 5, "up-1": 2}
    assert (r["objects_received"], r["bytes_received"]) == (14, 140)
    p("fanin 12 100000", timeout=120)
    r = c.request("get-metrics")
    assert r["received_from"]["up-all"] == 12 * 100000
    assert r["received_from"]["up-0"] == 5 + 100000 and r["received_from"]["up-11"] == 100000
    assert len(r["received_from"]) == 2 + 1 + 10  # up-0, up-1, up-all, up-2 ... up-11
    assert r["objects_received"] == 14 + 2 * 12 * 100000


def test_sources_past_the_limit_count_in_the_totals_only(probes, clients):
    p = probes("--node-id", "sink")
    c = clients(p.endpoint)
    handles = [p(f"source s{i}") for i in range(257)]
    assert handles[:256] == [str(i) for i in range(256)] and handles[256] == "-1"
    p("from 255 1 1")
    r = c.request("get-metrics")
    assert len(r["received_from"]) == 256 and r["received_from"]["s255"] == 1


def test_merges_average_the_last_ten(probes, clients):
    p = probes("--node-id", "merger-0", "--role", "merger")
    c = clients(p.endpoint)
    for objects, seconds in ((4, 0.001), (4, 0.002), (5, 0.003)):
        p(f"merged {objects} {seconds}")
    r = c.request("get-metrics")
    assert (r["merges"], r["objects_merged"], r["average_merge_time"]) == (3, 13, 2.0)
    for _ in range(12):
        p("merged 1 0.005")
    assert c.request("get-metrics")["average_merge_time"] == 5.0  # the 3 first are out of the window
    p("merged 1 0.016")
    r = c.request("get-metrics")
    assert (r["merges"], r["average_merge_time"]) == (16, 6.1)


def test_merged_objects_per_second_is_each_clients_own(probes, clients):
    """Two clients asking at different moments each get objects merged / time since their own request."""
    p = probes("--node-id", "merger-0", "--role", "merger")
    a, b = clients(p.endpoint), clients(p.endpoint)
    p("merged 1 0")
    a0 = timed(a)
    time.sleep(0.3)
    p("merged 1000 0.001")
    b0 = timed(b)  # B's first: since the node started
    time.sleep(0.3)
    p("merged 600 0.001")
    a1 = timed(a)
    time.sleep(0.3)
    b1 = timed(b)
    assert_rate_within(a0, a1, 1600)
    assert_rate_within(b0, b1, 600)
    assert b0[1]["merged_objects_per_second"] >= 1001 / (b0[2] - a0[0] + 1)  # since start: all 1001


def test_cpu_clock_is_cpu_time_over_wall_time_since_the_clients_previous_request(probes, clients):
    p = probes("--node-id", "n")
    c = clients(p.endpoint)
    first = timed(c)
    p("busy 400")
    second = timed(c)
    cpu = second[1]["cpu_clock"]
    assert 0.4e6 / (second[2] - first[0]) * 0.97 <= cpu <= 0.5e6 / (second[0] - first[2]), cpu
    time.sleep(0.3)
    assert timed(c)[1]["cpu_clock"] < 0.2e6  # idle since: the interval is the client's last


# -- where the time goes (issue 46) ----------------------------------------------------------------

PHASES = ("busy", "backpressured", "idle")


def seconds_of(reply: dict) -> dict:
    return {ph: reply[f"{ph}_seconds"] for ph in PHASES}


def increases(first: dict, second: dict) -> dict:
    return {ph: second[f"{ph}_seconds"] - first[f"{ph}_seconds"] for ph in PHASES}


def check_ratios(reply: dict, increase: dict) -> None:
    """The ratios of a reply: each phase's increase over the three's (seconds rounded to 6 decimals,
    ratios to 4), summing to 1."""
    total = sum(increase.values())
    ratios = [reply[f"{ph}_ratio"] for ph in PHASES]
    assert abs(sum(ratios) - 1) <= 1e-3 and all(0 <= r <= 1 for r in ratios), reply
    for ph in PHASES:
        assert abs(reply[f"{ph}_ratio"] - increase[ph] / total) <= 1e-4 + 3e-6 / total, (ph, reply, increase)


def test_time_goes_to_the_phase_the_last_call_set(probes, clients):
    """Busy from fs_node_open, idle from waiting(), backpressured from sending() (a blocking send held
    by its downstream), busy again at sent(): each phase gets at least what the probe slept in it,
    and at most that and the time outside the sleeps (the commands' round trips, however slow)."""
    p = probes("--node-id", "n")
    c = clients(p.endpoint)
    first = timed(c)
    r0 = first[1]
    assert (r0["backpressured_seconds"], r0["idle_seconds"]) == (0.0, 0.0)  # the first thread: busy from the open
    assert abs(r0["busy_seconds"] - r0["uptime_s"]) < 0.002 and r0["busy_ratio"] == 1.0
    p("sleep 300")
    p("waiting")
    p("sleep 600")
    p("sending")
    p("sleep 100")
    p("sent 1 10")
    second = timed(c)
    r1 = second[1]
    d = increases(r0, r1)
    outside = (second[2] - first[0]) - 1.0
    for ph, slept in (("busy", 0.3), ("idle", 0.6), ("backpressured", 0.1)):
        assert slept <= d[ph] + 2e-6 <= slept + outside + 4e-6, (ph, d, outside)
    assert second[0] - first[2] - 2e-6 <= sum(d.values()) <= second[2] - first[0] + 2e-6  # one thread: wall time
    assert abs(sum(seconds_of(r1).values()) - r1["uptime_s"]) < 0.002
    check_ratios(r1, d)


def test_refused_sends_hold_the_node_until_one_goes_through_and_other_calls_keep_the_phase(probes, clients):
    """refused: backpressured until a sent(); waiting: idle until a received() (backlog and latency
    change nothing); merged: busy."""
    p = probes("--node-id", "merger-0", "--role", "merger")
    c = clients(p.endpoint)
    first = timed(c)
    script = [
        ("refused", "backpressured", 150),
        ("backlog 1", "backpressured", 100),  # the phase stays the refusal's
        ("sent 1 1", "busy", 100),
        ("waiting", "idle", 100),
        ("latency 3 0.01", "idle", 100),
        ("backlog 0", "idle", 100),
        ("received 1 1", "busy", 100),
        ("refused", "backpressured", 100),
        ("merged 1 0.001", "busy", 100),
        ("waiting", "idle", 50),
        ("merged 1 0.001", "busy", 100),
    ]
    slept = dict.fromkeys(PHASES, 0.0)
    for command, phase, ms in script:
        p(command)
        p(f"sleep {ms}")
        slept[phase] += ms / 1e3
    second = timed(c)
    d = increases(first[1], second[1])
    outside = (second[2] - first[0]) - sum(slept.values())
    for ph in PHASES:
        assert slept[ph] <= d[ph] + 2e-6 <= slept[ph] + outside + 4e-6, (ph, d, slept, outside)
    check_ratios(second[1], d)


def test_each_client_gets_the_shares_of_its_own_interval(probes, clients):
    """A asks, the node is busy 0.3 s, B asks (its first: since the node started, all busy), the node
    waits 0.6 s, both ask: A's interval holds the busy time, B's hardly any."""
    p = probes("--node-id", "n")
    a, b = clients(p.endpoint), clients(p.endpoint)
    a0 = timed(a)
    p("sleep 300")
    b0 = timed(b)
    assert (b0[1]["busy_ratio"], b0[1]["backpressured_ratio"], b0[1]["idle_ratio"]) == (1.0, 0.0, 0.0)
    p("waiting")
    p("sleep 600")
    a1, b1 = timed(a), timed(b)
    check_ratios(a1[1], increases(a0[1], a1[1]))
    check_ratios(b1[1], increases(b0[1], b1[1]))
    assert a1[1]["busy_ratio"] >= 0.3 / (a1[2] - a0[0]) - 1e-4  # at least the sleep's share of A's interval
    assert b1[1]["busy_ratio"] <= (b1[2] - b0[0] - 0.6) / (b1[0] - b0[2]) + 1e-4  # B's: all but the 0.6 s idle
    assert b1[1]["idle_ratio"] >= 0.6 / (b1[2] - b0[0]) - 1e-4
    assert b1[1]["idle_ratio"] > a1[1]["idle_ratio"]
    assert a.request("get-metrics")["idle_ratio"] == 1.0  # A again: idle since its previous request


def test_threads_past_the_seventh_count_as_one_timeline(probes, clients):
    """The main thread (the first counter set) waits; 16 threads count and end busy: 6 take the sets
    left, 10 share the eighth, which counts as one thread. 8 timelines: the seconds grow 8 times as
    fast as the wall clock, 1/8 of them idle."""
    p = probes("--node-id", "n")
    c = clients(p.endpoint)
    p("waiting")
    p("threads 16 1000")
    first = timed(c)
    time.sleep(0.4)
    second = timed(c)
    d = increases(first[1], second[1])
    assert 8 * (second[0] - first[2]) - 1e-5 <= sum(d.values()) <= 8 * (second[2] - first[0]) + 1e-5, d
    assert (second[1]["idle_ratio"], second[1]["busy_ratio"], second[1]["backpressured_ratio"]) == (0.125, 0.875, 0.0)


def test_time_totals_never_go_back_while_threads_change_phase(probes, clients):
    """10 threads go round the phases (millions of changes, 4 of them sharing the eighth counter set;
    on a machine of few cores, threads are often preempted in the middle of one) while a client asks
    as fast as it can: no total ever goes back, the shares add up to 1, and the seconds never
    exceed the timelines' wall time (no slice counted twice): the main thread's since the node
    opened, 7 more since the threads began. A reading may miss a slice that is ending; the next
    one has it, so one interval may show more than its own time, the totals never."""
    p = probes("--node-id", "n")
    c = clients(p.endpoint)
    p("waiting")
    began = time.monotonic()
    p.proc.stdin.write("phases 10 1500\n")
    p.proc.stdin.flush()
    seen = [timed(c)]
    stop = time.monotonic() + 1.3
    while time.monotonic() < stop:
        seen.append(timed(c))
    assert int(p.line(timeout=30).split()[1]) > 1000
    seen.append(timed(c))
    assert len(seen) > 50
    for before, after in itertools.pairwise(seen):
        d = increases(before[1], after[1])
        assert min(d.values()) >= 0, (before[1], after[1])
        check_ratios(after[1], d)
        timelines = after[1]["uptime_s"] + 0.0005 + 7 * (after[2] - began)
        assert sum(seconds_of(after[1]).values()) <= timelines + 1e-5, (after[1], timelines)
    assert min(seconds_of(seen[-1][1]).values()) > 0.1  # every phase had its share
    again = c.request("get-metrics")  # the threads ended waiting: the node's 8 timelines are idle
    assert again["idle_ratio"] == 1.0


def test_calls_on_a_null_node_do_nothing(probes):
    p = probes("--node-id", "n")
    p("close")  # the probe's node is NULL from here on
    for command in ("waiting", "sending", "refused", "received 1 1", "merged 1 0.1", "sent 1 1", "backlog 1"):
        p(command)
    assert int(p("phases 3 20")) > 0
    assert p.finish() == ""


# -- input latency ---------------------------------------------------------------------------------


def python_figures(ages: list[tuple[int, float]]) -> dict:
    """What flowstat/node/latency.py reports for objects of these (count, age) taken now."""
    rec = LatencyRecorder()
    now = time.time()
    rec.record([now - age for count, age in ages for _ in range(count)], now)
    return rec.interval(b"test")


def test_input_latency_percentiles_as_the_harness_computes_them(probes, clients):
    p = probes("--node-id", "viewer", "--role", "viewer")
    a, b = clients(p.endpoint), clients(p.endpoint)
    a.request("get-metrics")
    p("latency 900 0.01")
    p("latency 100 1.0")
    r = a.request("get-metrics")
    want = python_figures([(900, 0.01), (100, 1.0)])
    assert r["input_latency_objects"] == 1000
    assert r["input_latency_p50_ms"] == want["input_latency_p50_ms"]  # the same bucket, the same middle
    assert r["input_latency_p99_ms"] == want["input_latency_p99_ms"]
    assert 1000 <= r["input_latency_max_ms"] < 1010
    again = a.request("get-metrics")
    assert (again["input_latency_objects"], again["input_latency_p50_ms"], again["input_latency_max_ms"]) == (
        0,
        None,
        None,
    )
    p("latency 10 0.05")
    r = a.request("get-metrics")  # the longest wait since A's previous request, not since the start
    assert r["input_latency_objects"] == 10 and 50 <= r["input_latency_max_ms"] < 55
    assert r["input_latency_p50_ms"] == r["input_latency_max_ms"] or abs(r["input_latency_p50_ms"] - 50) < 1
    first_b = b.request("get-metrics")  # B's first request covers the node's whole life
    assert first_b["input_latency_objects"] == 1010 and first_b["input_latency_max_ms"] >= 1000


def test_waits_below_zero_count_with_a_zero_maximum(probes, clients):
    """Objects stamped after they were taken (clocks out of step) count, in the lowest bucket."""
    p = probes("--node-id", "viewer")
    c = clients(p.endpoint)
    p("latency 5 -1")
    r = c.request("get-metrics")
    assert (r["input_latency_objects"], r["input_latency_p50_ms"], r["input_latency_max_ms"]) == (5, 0.0, 0.0)


def test_forgotten_clients_start_again_from_the_nodes_start(probes, built):
    """At most 256 clients are remembered: the 257th forgets the least recent, whose next request
    then measures from the node's start again."""
    p = probes("--node-id", "n")
    ctx = zmq.Context()
    try:
        socks = []
        for i in range(258):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, f"client-{i}".encode())
            s.setsockopt(zmq.LINGER, 0)
            s.connect(p.endpoint)
            socks.append(s)

        def ask(s) -> dict:
            s.send_multipart([b"", b'{"command": "get-metrics"}'])
            assert s.poll(3000), "no reply"
            return json.loads(s.recv_multipart()[-1])

        p("latency 7 0.001")
        for s in socks[:257]:
            assert ask(s)["input_latency_objects"] == 7
        assert ask(socks[256])["input_latency_objects"] == 0  # remembered: nothing since
        assert ask(socks[0])["input_latency_objects"] == 7  # forgotten (the 257th came): from the start
        assert ask(socks[1])["input_latency_objects"] == 7  # forgotten when client-0 came back
        assert ask(socks[2])["input_latency_objects"] == 7
        assert ask(socks[256])["input_latency_objects"] == 0  # still remembered
    finally:
        ctx.destroy(linger=0)


# -- overload flags ------------------------------------------------------------------------------


def test_overload_episodes_are_told_once_to_each_client(probes, clients):
    p = probes("--node-id", "merger-0", "--role", "merger")
    a, b = clients(p.endpoint), clients(p.endpoint)
    a.request("get-metrics")
    b.request("get-metrics")
    p("refused")
    p("refused")  # the same episode
    assert a.request("check-state")["send_buffer_overloaded"] is True  # now
    p("sent 1 10")  # the episode ends
    assert a.request("check-state")["send_buffer_overloaded"] is False
    r = a.request("get-metrics")
    assert (r["send_buffer_overloaded"], r["send_overload_events"]) == (True, 1)  # latched for A
    assert a.request("get-metrics")["send_buffer_overloaded"] is False  # told once
    p("refused")
    p("sent 1 1")
    p("refused")
    p("sent 1 1")
    r = b.request("get-metrics")
    assert (r["send_buffer_overloaded"], r["send_overload_events"]) == (True, 3)
    assert b.request("get-metrics")["send_buffer_overloaded"] is False
    assert a.request("get-metrics")["send_buffer_overloaded"] is True  # A had not been told of these
    p("backlog 1")
    p("backlog 1")  # one episode: it begins on a change to true
    assert a.request("check-state")["receive_buffer_overloaded"] is True
    p("backlog 0")
    assert a.request("check-state")["receive_buffer_overloaded"] is False
    r = a.request("get-metrics")
    assert (r["receive_buffer_overloaded"], r["receive_overload_events"]) == (True, 1)
    assert a.request("get-metrics")["receive_buffer_overloaded"] is False
    assert b.request("get-metrics")["receive_buffer_overloaded"] is True


# -- bad requests and bad clients -------------------------------------------------------------------

GARBAGE = [
    b"",
    b"not json",
    b"{",
    b"[",
    b'{"a":1,}',
    b"[1,]",
    b"1 2",
    b"\n\n  x",
    b"\xff",
    b"\xe2\x82",
    b"ab\xe2\x82\xe2",
    b'{"a":"\xed\xa0"}',
    b"\xf0\x90\x80 ",
    b"\xef\xbb\xbf\xff",
    b'\xef\xbb\xbf{"a":x}',
    b'"\\x"',
    b'"\\u12"',
    b'"\\u1234',
    b'"abc',
    b'"a\nb"',
    b"-",
    b"NaN",
    b"[1 2]",
    b'{"a" 1}',
    b"{1: 2}",
    b"\xc3\xa9 x",
    b"\x00{}",
    b"[]",
    b"null",
    b'"check-state"',
    b'{"command": 3, "id": 9}',
    b'{"cmd": "check-state", "id": "abc"}',
    b'{"command": "check-state", "command": null}',
    b'{"command": "self-destruct", "id": -0}',
    b'{"command": "x\'y"}',
    b'{"command": "x\'y\\"z\\\\", "id": true}',
    b'{"command": "\\u00a0\\u0085\\ud800\\ud83d\\ude00\\t\\u007f\xc3\xa9", "id": 1.5}',
    b'{"command": "", "id": 123456789012345678901234567890}',
    b'{"command": "CHECK-STATE"}',
    b'{"command": "stop\\u0000"}',
    b'{"comm\\u0061nd": "nope", "id": "\\ud83d\\ude00"}',
    b'{"command": "get-metrics"} x',
    b"[" * 50 + b"]" * 49,
]


def check_refusal(reply: dict, payload: bytes) -> None:
    """The reply to a refused request, as the harness's parse_request words it."""
    command, request, error = parse_request(payload)
    assert error is not None
    assert (reply["command"], reply["error"], reply["node_id"]) == (command, error, "n"), payload
    if isinstance(request, dict) and isinstance(request.get("id"), (int, str)):
        assert reply["id"] == request["id"] and type(reply["id"]) is type(request["id"]), payload
    else:
        assert "id" not in reply, payload
    assert ISO_MS.match(reply["request_timestamp"]) and ISO_MS.match(reply["response_timestamp"])


def test_bad_requests_get_the_harness_refusals_and_count(probes, clients):
    p = probes("--node-id", "n")
    c = clients(p.endpoint)
    for payload in GARBAGE:
        check_refusal(json.loads(c.request_raw(payload)), payload)
    big = b'{"command": "check-state", "pad": "' + b"x" * (100 * 1024 - 37) + b'"}'
    assert len(big) == 100 * 1024
    check_refusal(json.loads(c.request_raw(big)), big)
    at_limit = b'{"command": "check-state", "pad": "' + b"x" * (64 * 1024 - 37) + b'"}'
    assert len(at_limit) == 64 * 1024 and "error" not in json.loads(c.request_raw(at_limit))
    r = c.request("get-metrics")  # the node runs on, and counted each refusal
    assert r["control_errors"] == len(GARBAGE) + 1 and r["node_state"] == "RUNNING"


def test_clock_answers_the_node_s_wall_clock_on_receipt_and_on_reply(probes, clients):
    """One round of flowstat run's NTP-style offset measurement (harness.clocks), as the Python nodes answer it."""
    c = clients(probes("--node-id", "n").endpoint)
    t1 = time.time()
    r = c.request("clock", id=7)
    t4 = time.time()
    assert (r["command"], r["node_id"], r["id"]) == ("clock", "n", 7)
    assert t1 - 0.001 <= r["received_s"] <= r["sent_s"] <= t4 + 0.001  # one host, one clock (us precision)


def mutations(rng: random.Random, n: int) -> list[bytes]:
    seeds = [
        b'{"command": "get-metrics", "id": 1, "upstream_sent": 42}',
        b'{"command":"check-state","id":"a\\u00e9\\ud83d\\ude00"}',
        b'[1, -2.5e3, "s\\n", null, true, false, {"a": [{}]}, NaN, -Infinity]',
        b'{"command": "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "id": [1]}',
        b' \t\r\n{"command" : "stop" , "id" : -0 }\n',
    ]
    alphabet = b'{}[]",:\\ntu0123456789.eE+-/ \t\n\x00\x1f\x7f\x80\xbf\xc3\xe2\xed\xef\xf0\xf4\xffabfrNI'
    out = []
    for _ in range(n):
        s = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(s) + 1)
            op = rng.random()
            if op < 0.4 and s:
                s[min(i, len(s) - 1)] = rng.choice(alphabet)
            elif op < 0.7:
                s[i:i] = bytes([rng.choice(alphabet)])
            elif op < 0.85:
                del s[i : i + rng.randint(1, 3)]
            else:
                s = s[:i]
        out.append(bytes(s))
    return out


def python_reads(payload: bytes) -> bool:
    """Whether the C node is meant to word this refusal as Python does: a UTF-8 request (Python
    would also read UTF-16 and UTF-32 ones), which Python's parse_request does not crash on, and
    whose command has no unassigned code point (repr escapes those; the C node writes them)."""
    if json.detect_encoding(payload) not in ("utf-8", "utf-8-sig"):
        return False
    try:
        command, _, _ = parse_request(payload)
    except (RecursionError, ValueError):
        return False
    return not command or all(unicodedata.category(ch) != "Cn" for ch in command)


def test_random_bad_requests_are_worded_as_the_harness_words_them(probes):
    """A differential fuzz: mutated requests through the C node and through parse_request."""
    p = probes("--node-id", "n")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(p.endpoint)
    checked = 0
    try:
        for payload in mutations(random.Random(26), 3000):
            if not python_reads(payload):
                continue
            sock.send_multipart([b"", payload])
            assert sock.poll(3000), payload
            reply = json.loads(sock.recv_multipart()[-1])
            if parse_request(payload)[2] is None:
                assert "error" not in reply and reply["command"] == parse_request(payload)[0], payload
            else:
                check_refusal(reply, payload)
            checked += 1
    finally:
        ctx.destroy(linger=0)
    assert checked > 2500


def test_any_envelope_comes_back_with_its_reply(probes):
    """A DEALER's frames before the request come back before the reply, as from serve_requests."""
    p = probes("--node-id", "n")
    ctx = zmq.Context()
    try:
        d = ctx.socket(zmq.DEALER)
        d.connect(p.endpoint)
        d.send_multipart([b"a", b"b", b'{"command": "check-state", "id": 1}'])
        assert d.poll(3000)
        *envelope, reply = d.recv_multipart()
        assert envelope == [b"a", b"b"] and json.loads(reply)["id"] == 1
        d.send(b'{"command": "check-state", "id": 2}')  # no delimiter at all
        assert d.poll(3000) and json.loads(d.recv())["id"] == 2
    finally:
        ctx.destroy(linger=0)


def test_clients_that_never_read_or_vanish_stall_nothing(probes, clients):
    """A client that asks and never reads (its kernel buffer small) is answered far more than any
    buffer holds (20,000 refusals of some 6 kB each): the node drops the replies rather than wait,
    and answers the others at once."""
    p = probes("--node-id", "n")
    ctx = zmq.Context()
    done = threading.Event()
    sent = [0]
    request = json.dumps({"command": "x" * 3000}).encode()  # unknown: each refusal is counted

    def flood() -> None:
        rude = ctx.socket(zmq.DEALER)
        rude.setsockopt(zmq.RCVHWM, 1)
        rude.setsockopt(zmq.RCVBUF, 4096)
        rude.setsockopt(zmq.LINGER, 0)
        rude.connect(p.endpoint)
        while not done.is_set():
            try:
                rude.send_multipart([b"", request], zmq.NOBLOCK)
                sent[0] += 1
            except zmq.Again:
                time.sleep(0.001)
        rude.close(0)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        for _ in range(30):  # and clients that vanish before their reply
            gone = ctx.socket(zmq.REQ)
            gone.setsockopt(zmq.LINGER, 0)
            gone.connect(p.endpoint)
            gone.send(b'{"command": "get-metrics"}')
            gone.close(0)
        c = clients(p.endpoint)
        wait_until(
            lambda: c.request("get-metrics")["control_errors"] >= 20000,
            "20,000 refusals answered",
            timeout=60,
            poll=0.2,
        )
        slowest = 0.0
        for _ in range(20):
            before, _, after = timed(c, "check-state")
            slowest = max(slowest, after - before)
        assert slowest < 1.0, slowest
        assert int(p("flood 200")) > 20000  # the node's own calls go on at full speed
    finally:
        done.set()
        thread.join(5)
        ctx.destroy(linger=0)
    assert c.request("get-metrics")["objects_received"] > 20000


# -- binding, options, the endpoints file ------------------------------------------------------------


def test_a_control_socket_that_cannot_bind_leaves_the_node_running_unmonitored(probes, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    address = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
    try:
        for bind in (address, "tcp://no-such-host.invalid:1"):
            p = probes("--node-id", "n", "--bind", bind, "--endpoints-dir", str(tmp_path / "eps"))
            assert p.endpoint is None and p("endpoint") == "none"
            p("received 5 50")
            assert int(p("flood 20")) > 0
            p("close")
            err = p.finish()
            assert bind in err and "unmonitored" in err, err
    finally:
        taken.close()
    assert not (tmp_path / "eps").exists() or not list((tmp_path / "eps").iterdir())


@pytest.mark.parametrize(
    "args, why",
    [
        ((), "node_id is required"),
        (("--node-id", ""), "node_id is required"),
        (("--node-id", "n", "--role", "Merger"), "does not match ^[a-z][a-z0-9_-]{0,31}$"),
        (("--node-id", "n", "--role", "r" * 33), "does not match"),
        (("--node-id", "n", "--bind", ""), "bind is empty"),
        (("--node-id", "n", "--curve-keys", ""), "curve_keys is empty"),
        (("--node-id", "n", "--upstream", "a,,b"), 'upstream "a,,b": node ids joined by commas, none empty'),
        (("--node-id", "n", "--upstream", ",a"), "none empty"),
        (("--node-id", "n", "--upstream", "a,"), "none empty"),
    ],
)
def test_invalid_options_are_refused_saying_why(built, args, why):
    p = Probe(*args)
    try:
        assert p.invalid is not None and why in p.invalid
        assert p.proc.wait(timeout=5) == 2
    finally:
        p.kill()


def endpoint_files(d: Path) -> list[Path]:
    return sorted(d.iterdir()) if d.exists() else []


def test_the_endpoints_file_is_written_atomically_and_removed_on_close(probes, tmp_path):
    d = tmp_path / "a" / "b"
    p = probes("--node-id", "merger 0/é", "--role", "merger", "--run-id", "r-1", "--endpoints-dir", str(d))
    files = endpoint_files(d)
    assert [f.name for f in files] == [f"merger_0___.{p.proc.pid}.json"]  # é is two bytes
    assert files[0].stat().st_mode & 0o777 == 0o644 and d.stat().st_mode & 0o777 == 0o755
    run_id, nodes, bad = endpoints_schema.read(files[0])
    assert (run_id, bad) == ("r-1", [])
    assert nodes == [
        {
            "node_id": "merger 0/é",
            "role": "merger",
            "pid": p.proc.pid,
            "host": socket.gethostname(),
            "control": p.endpoint,
        }
    ]
    assert endpoints_schema.validate(json.loads(files[0].read_text())) == []
    p("close")
    assert endpoint_files(d) == []  # a clean close: STOPPED, the file gone
    p.finish()


def test_a_node_says_who_feeds_it_in_its_endpoints_file(probes, tmp_path):
    p = probes("--node-id", "merger-0", "--upstream", 'worker-0,wörker "1"', "--endpoints-dir", str(tmp_path))
    (f,) = endpoint_files(tmp_path)
    _, nodes, bad = endpoints_schema.read(f)
    assert bad == [] and nodes[0]["upstream"] == ["worker-0", 'wörker "1"']  # issue 46: the graph's edges
    p.finish()


def test_a_node_that_closes_tells_an_agent_its_final_counts_with_its_stopped_state(probes, tmp_path, agent_command):
    folder, out = tmp_path / "endpoints", tmp_path / "samples.ndjson"
    p = probes("--node-id", "ending", "--role", "sink", "--endpoints-dir", str(folder))
    agent = watching_agent(agent_command, folder, out)
    try:
        wait_until(lambda: sum(s["node_id"] == "ending" for s in agent_samples(out)) >= 3, "the node sampled")
        p("sent 1000 10000")  # counted after the last request the agent made while it ran
        p("waiting")
        p("close")  # returns once an agent took the final counts (or two of its intervals passed)
        p.finish()
        wait_until(lambda: any(s["node_state"] == "STOPPED" for s in agent_samples(out)), "the end reported")
    finally:
        err = stop_agent(agent)
    counted = [s for s in agent_samples(out) if "objects_sent" in s]
    assert counted[-1]["objects_sent"] == 1000 and counted[-1]["node_state"] == "STOPPED", (counted[-1], err)
    last, before = counted[-1], counted[-2]  # where the time went, to the end: idle since waiting()
    assert last["idle_seconds"] > before["idle_seconds"] and last["idle_ratio"] > 0, (last, before)
    assert abs(sum(last[f"{ph}_ratio"] for ph in PHASES) - 1) <= 1e-3


def test_the_endpoints_file_stays_after_a_crash(probes, tmp_path):
    p = probes("--node-id", "viewer", "--endpoints-dir", str(tmp_path))
    (f,) = endpoint_files(tmp_path)
    doc = json.loads(f.read_text())
    assert "run_id" not in doc and doc["nodes"][0]["role"] == "other"
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait()
    assert endpoint_files(tmp_path) == [f]  # how an agent tells DOWN from STOPPED


def test_the_endpoints_directory_comes_from_the_environment_unless_given(probes, tmp_path):
    env = {**os.environ, "FLOWSTAT_ENDPOINTS_DIR": str(tmp_path / "env")}
    p = probes("--node-id", "n", env=env)
    assert [f.name for f in endpoint_files(tmp_path / "env")] == [f"n.{p.proc.pid}.json"]
    q = probes("--node-id", "m", "--endpoints-dir", str(tmp_path / "opt"), env=env)
    assert [f.name for f in endpoint_files(tmp_path / "opt")] == [f"m.{q.proc.pid}.json"]
    assert len(endpoint_files(tmp_path / "env")) == 1
    env.pop("FLOWSTAT_ENDPOINTS_DIR")
    probes("--node-id", "o", env=env)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["env", "opt"]


# -- CURVE (issue 30) ---------------------------------------------------------------------------------


def every_key(keys: Path) -> list[str]:
    """Every key of a run's keys folder, public and secret (of a damaged file too): none may be said."""
    return [k for f in keys.iterdir() for k in re.findall(r'-key = "(.{40})"', f.read_text())]


@pytest.mark.parametrize("binary", [PROBE, PROBE_ASAN], ids=["plain", "asan"])
def test_a_secured_node_answers_the_runs_client_key_only_and_says_its_first_refusal_once(probes, tmp_path, binary):
    """Clients without CURVE, with another client key (refused by ZAP) or with another run's node key
    (their handshake fails before ZAP): no answer, and their `stop` changes nothing. The run's client
    key gets every answer. One line for the first refusal, the count at close, no key anywhere."""
    if binary == PROBE_ASAN:
        make("build/node-probe-asan")
    keys = curve.create_run_keys(tmp_path)
    server = curve.read_key_file(keys / "node.key")[0]
    client = curve.client_keys(keys / "client.key_secret")
    p = probes("--node-id", "n", "--curve-keys", str(keys), "--endpoints-dir", str(tmp_path / "ep"), binary=binary)
    (announced,) = endpoint_files(tmp_path / "ep")
    doc = json.loads(announced.read_text())
    assert doc["nodes"][0]["curve_server_key"] == server.decode() and endpoints_schema.validate(doc) == []
    friend = ControlClient(p.endpoint, timeout_s=5, curve=(server, client))
    strangers = {
        "no CURVE": None,
        "another client key": (server, zmq.curve_keypair()),
        "another run's node key": (zmq.curve_keypair()[0], client),
    }
    try:
        for why, keyed in strangers.items():
            stranger = ControlClient(p.endpoint, timeout_s=0.3, curve=keyed)
            with pytest.raises(ControlError, match="no reply"):
                stranger.request("stop")
            stranger.close()
            assert p("stop?") == "0" and friend.request("check-state")["node_state"] == "RUNNING", why
        p("received 5 500")
        r = friend.request("get-metrics")
        assert (r["node_id"], r["objects_received"], r["bytes_received"], r["control_errors"]) == ("n", 5, 500, 0)
        assert friend.request("stop")["command"] == "stop" and p("stop?") == "1"
    finally:
        friend.close()
    p("close")
    err = p.finish()
    refusals = [line for line in err.splitlines() if "refused a control client" in line]
    assert len(refusals) == 1 and refusals[0].endswith("further refusals are counted, not logged"), err
    assert "whose handshake failed (no CURVE, or another run's key)" in refusals[0]  # the first stranger's
    assert re.search(r"^flowstat-node n: \d+ control clients refused in all", err, re.M), err
    assert not [k for k in every_key(keys) if k in err]
    assert "ERROR: AddressSanitizer" not in err and "runtime error" not in err, err


def damage_secret(keys: Path) -> None:
    (keys / "node.key_secret").write_text('curve\n    secret-key = "short"\n')


def only_public(keys: Path) -> None:
    shutil.copy(keys / "node.key", keys / "node.key_secret")


@pytest.mark.parametrize(
    "damage, said",
    [
        (damage_secret, "node.key_secret:2: secret-key is not a Z85 CURVE key of 40 characters"),
        (lambda keys: (keys / "node.key_secret").unlink(), "node.key_secret: cannot read the CURVE key file (No such"),
        (only_public, "node.key_secret: no secret-key (give the .key_secret file)"),
        (lambda keys: (keys / "client.key").write_text("# no key\n"), "client.key: no public-key"),
    ],
    ids=["malformed", "missing", "no-secret", "no-client-key"],
)
def test_a_node_given_keys_it_cannot_use_runs_unmonitored_never_in_the_clear(probes, tmp_path, damage, said):
    """Keys from the environment here (FLOWSTAT_CURVE_KEYS: the node's code gave none)."""
    keys = curve.create_run_keys(tmp_path)
    damage(keys)
    p = probes("--node-id", "n", "--endpoints-dir", str(tmp_path / "ep"), env={**os.environ, curve.ENV_KEYS: str(keys)})
    assert p.endpoint is None and p("endpoint") == "none"
    p("received 2 2")
    p("close")
    err = p.finish()
    assert f"flowstat-node n: cannot secure the control channel ({keys}/{said}" in err, err
    assert err.rstrip().endswith("running unmonitored"), err
    assert endpoint_files(tmp_path / "ep") == []  # nothing to announce
    assert not [k for k in every_key(keys) if k in err]


def test_a_node_without_keys_says_its_channel_is_in_the_clear_when_it_binds_beyond_loopback(probes, tmp_path):
    """Loopback (127.0.0.0/8, ipc) is quiet. The other address is one that never binds: nothing of
    the test machine is exposed, and the warning comes before the bind is tried."""
    quiet = [probes("--node-id", "n", "--bind", bind) for bind in ("tcp://127.0.0.2:*", f"ipc://{tmp_path}/n")]
    loud = probes("--node-id", "far", "--bind", "tcp://no-such-host.invalid:1")
    for p in (*quiet, loud):
        p("close")
    assert not [p for p in quiet if p.finish()]
    err = loud.finish()
    assert (
        "flowstat-node far: the control channel binds tcp://no-such-host.invalid:1 without CURVE: anyone who "
        "reaches it may ask and stop (give curve_keys, or $FLOWSTAT_CURVE_KEYS)"
    ) in err, err


# -- sanitizers, fuzzing ----------------------------------------------------------------------------


def test_clean_under_address_sanitizer(built, tmp_path):
    make("build/node-probe-asan")
    p = Probe("--node-id", "n", "--role", "merger", "--endpoints-dir", str(tmp_path), binary=PROBE_ASAN)
    try:
        c = ControlClient(p.endpoint, timeout_s=5)
        for payload in GARBAGE + [b"x" * 100_000] + mutations(random.Random(1), 300):
            json.loads(c.request_raw(payload))
        for command in ("received 5 10", "merged 2 0.001", "latency 100 0.2", "refused", "backlog 1", "sending"):
            p(command)
        for _ in range(3):
            assert c.request("get-metrics")["objects_received"] == 5
        p("phases 3 50")  # the time accounting's shared counter set, raced by the control thread
        assert c.request("get-metrics")["backpressured_seconds"] > 0
        c.close()
        p("close")
        err = p.finish()
    finally:
        p.kill()
    assert "ERROR: AddressSanitizer" not in err and "runtime error" not in err, err


@pytest.mark.skipif(shutil.which("clang") is None, reason="no clang")
def test_fuzz_the_request_reader_briefly(built, tmp_path):
    make("build/fuzz_node_request")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(GARBAGE):
        (corpus / f"seed-{i}").write_bytes(seed)
    out = subprocess.run(
        [str(FUZZER), "-max_total_time=4", "-timeout=5", "-rss_limit_mb=1024", str(corpus)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and "Done" in out.stderr, out.stderr[-3000:]


# -- installing, and the C++ example ------------------------------------------------------------------


def test_install_with_pkg_config_and_build_the_example_against_it(built, tmp_path):
    dest = tmp_path / "dest"
    make("install", "PREFIX=/usr/local", f"DESTDIR={dest}")
    usr = dest / "usr" / "local"
    for f in ("include/flowstat/node.h", "lib/libflowstat-node.a", "lib/libflowstat-node.so.0"):
        assert (usr / f).is_file(), f
    assert os.readlink(usr / "lib" / "libflowstat-node.so") == "libflowstat-node.so.0"
    pc = (usr / "lib" / "pkgconfig" / "flowstat-node.pc").read_text()
    assert "prefix=/usr/local" in pc and "Requires.private: libzmq" in pc
    env = {**os.environ, "PKG_CONFIG_PATH": str(usr / "lib" / "pkgconfig"), "PKG_CONFIG_SYSROOT_DIR": str(dest)}
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "flowstat-node"], capture_output=True, text=True, env=env
    ).stdout.split()
    assert f"-I{usr}/include" in flags and f"-L{usr}/lib" in flags and "-lflowstat-node" in flags
    example = tmp_path / "example"
    example.mkdir()
    for name in ("Makefile", "pipeline.cpp"):
        shutil.copy(EXAMPLE / name, example / name)
    out = make(directory=example, env=env)
    assert "libflowstat-node: installed" in out.stdout
    assert (
        "libflowstat-node"
        not in subprocess.run(["ldd", str(example / "pipeline")], capture_output=True, text=True).stdout
    )
    run = subprocess.run(
        [str(example / "pipeline"), "run", "--dir", str(tmp_path / "ipc"), "--count", "500", "--rate", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0 and "sink: 500 source objects arrived" in run.stdout, run.stderr


@pytest.fixture(scope="module")
def pipeline(built) -> Path:
    make(directory=EXAMPLE, env={**os.environ, "FLOWSTAT_NODE": "build"})
    return EXAMPLE / "pipeline"


class Stages:
    """Pipeline stages started one by one, each a process group of its own; their endpoints files
    in one directory."""

    def __init__(self, binary: Path, tmp: Path):
        self.binary, self.tmp = binary, tmp
        self.eps = tmp / "eps"
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str) -> subprocess.Popen:
        env = {**os.environ, "FLOWSTAT_ENDPOINTS_DIR": str(self.eps)}
        proc = subprocess.Popen(
            [str(self.binary), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.procs.append(proc)
        return proc

    def client(self, node_id: str) -> ControlClient:
        def found() -> list[Path]:
            return list(self.eps.glob(f"{node_id}.*.json")) if self.eps.exists() else []

        wait_until(lambda: found(), f"{node_id}'s endpoints file")
        return ControlClient(json.loads(found()[0].read_text())["nodes"][0]["control"], timeout_s=3)

    def stop(self) -> list[int]:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=20) for proc in self.procs]
        self.outputs = [proc.stdout.read() for proc in self.procs]
        self.errors = [proc.stderr.read() for proc in self.procs]
        for proc in self.procs:
            proc.stdout.close()
            proc.stderr.close()
        return codes


def chain(stages: Stages, at: str, source: tuple = (), merger: tuple = (), sink: tuple = (), worker: tuple = ()):
    stages.start("sink", "--pull", at + "merged", *sink)
    stages.start("merger", "--id", "merger-0", "--pull", at + "worked", "--push", at + "merged", *merger)
    for w in range(2):
        stages.start("worker", "--id", f"worker-{w}", "--pull", f"{at}work-{w}", "--push", at + "worked", *worker)
    return stages.start("source", "--push", f"{at}work-0,{at}work-1", *source)


def test_the_example_pipeline_reports_merges_and_latency_and_ends_clean(pipeline, tmp_path):
    stages = Stages(pipeline, tmp_path)
    try:
        at = f"ipc://{tmp_path}/"
        source = chain(stages, at, source=("--count", "3000", "--rate", "3000"), merger=("--batch", "2"))
        merger, sink = stages.client("merger-0"), stages.client("sink")
        seen: list[dict] = []
        wait_until(
            lambda: seen.append(merger.request("get-metrics"))
            or (seen[-1]["merges"] > 100 and seen[-1]["input_latency_objects"]),
            "merges",
        )
        m = seen[-1]
        assert m["role"] == "merger" and m["average_merge_time"] is not None and m["input_latency_objects"] > 0
        assert m["merged_objects_per_second"] > 0 and m["objects_merged"] >= 2 * m["merges"] - 2
        seen.clear()
        wait_until(lambda: seen.append(sink.request("get-metrics")) or seen[-1]["input_latency_objects"] > 0, "input")
        s = seen[-1]
        assert s["role"] == "sink" and s["input_latency_p50_ms"] is not None and s["merged_objects_per_second"] is None
        assert source.wait(timeout=30) == 0
        wait_until(lambda: all(p.poll() is not None for p in stages.procs), "the pipeline's end")
    finally:
        codes = stages.stop()
    assert codes == [0] * 5, stages.errors
    assert "sink: 3000 source objects arrived" in stages.outputs[0]
    assert endpoint_files(stages.eps) == []  # every stage closed its node cleanly


def reading_with_latencies(client) -> dict:
    """The next get-metrics answer whose interval holds input latencies. This merger tells them once
    a read cycle (up to 256 objects at 2 ms each: half a second, longer on a busy machine), so an
    interval between two readings may hold none; such an empty interval is skipped, not waited out."""
    answer: dict = {}

    def has_latencies() -> bool:
        answer.clear()
        answer.update(client.request("get-metrics"))
        return answer["input_latency_objects"] > 0

    wait_until(has_latencies, "a get-metrics interval holding input latencies", poll=0.2)
    return dict(answer)


def test_a_merger_falling_behind_shows_in_its_latency_and_backlog(pipeline, tmp_path):
    stages = Stages(pipeline, tmp_path)
    try:
        at = f"ipc://{tmp_path}/"
        chain(
            stages,
            at,
            source=("--count", "100000", "--rate", "1500"),
            merger=("--batch", "1", "--merge-cost-us", "2000"),
        )
        merger = stages.client("merger-0")
        wait_until(lambda: merger.request("get-metrics")["merges"] > 50, "merges")
        first = reading_with_latencies(merger)
        time.sleep(1.5)
        second = reading_with_latencies(merger)
        assert second["average_merge_time"] >= 2.0  # each merge spins 2 ms, more when the machine is busy
        assert 0 < second["merged_objects_per_second"] < 550  # at most one per 2 ms
        assert second["input_latency_p50_ms"] > first["input_latency_p50_ms"] > 0  # the queue grows, in time
        assert second["receive_overload_events"] >= 1 and second["receive_buffer_overloaded"] is True
    finally:
        codes = stages.stop()
    assert codes == [0] * 5, stages.errors  # SIGTERM: each stops and closes its node
    assert endpoint_files(stages.eps) == []


def test_a_full_send_buffer_is_an_overload_episode(pipeline, tmp_path):
    stages = Stages(pipeline, tmp_path)
    try:
        at = f"ipc://{tmp_path}/"
        chain(
            stages,
            at,
            source=("--count", "100000", "--rate", "0", "--size", "16384"),
            merger=("--batch", "1", "--sndhwm", "1"),
            sink=("--work-us", "3000", "--rcvhwm", "1"),
        )
        merger = stages.client("merger-0")
        wait_until(lambda: merger.request("get-metrics")["send_overload_events"] > 0, "a refused send")
        r = merger.request("get-metrics")
        assert r["send_buffer_size"] == 1 and r["send_overload_events"] >= 1
    finally:
        stages.stop()


def test_both_agents_watch_the_cpp_pipeline_through_its_endpoints_directory(pipeline, tmp_path, agent_command):
    """The C++ example, its merges made to cost 2 ms each (one object a merge) and its sink 3 ms an
    object behind buffers of one message: both agents, given only the directory, sample every stage
    with its role, merge time, latency and refused sends, and report each STOPPED after SIGTERM."""
    stages = Stages(pipeline, tmp_path)
    out = tmp_path / "samples.ndjson"
    stages.eps.mkdir()
    agent = watching_agent(agent_command, stages.eps, out)
    try:
        at = f"ipc://{tmp_path}/"
        chain(
            stages,
            at,
            source=("--count", "100000", "--rate", "1000", "--size", "16384"),
            merger=("--batch", "1", "--merge-cost-us", "2000", "--sndhwm", "1"),
            sink=("--work-us", "3000", "--rcvhwm", "1"),
        )

        def merger_samples() -> list[dict]:
            return [s for s in agent_samples(out) if s["node_id"] == "merger-0" and s["node_state"] == "RUNNING"]

        wait_until(
            lambda: any(s.get("send_buffer_overloaded") for s in merger_samples())
            and any(s.get("input_latency_objects") for s in merger_samples()),
            "the merger sampled overloaded, with latency",
        )
    finally:
        codes = stages.stop()
    try:
        wait_until(
            lambda: {s["node_id"] for s in agent_samples(out) if s["node_state"] == "STOPPED"} >= CPP_STAGES.keys(),
            "every stage STOPPED",
        )
    finally:
        err = stop_agent(agent)
    assert codes == [0] * 5, stages.errors
    samples = agent_samples(out)
    for node_id, role in CPP_STAGES.items():
        mine = [s for s in samples if s["node_id"] == node_id]
        assert mine and {s["role"] for s in mine} == {role}, (node_id, err[-2000:])
        assert mine[-1]["node_state"] == "STOPPED"
    merger = [s for s in samples if s["node_id"] == "merger-0" and s.get("average_merge_time_ms") is not None]
    assert merger and all(s["average_merge_time_ms"] >= 2.0 for s in merger)  # 2 ms of busy work a merge
    assert all(s["merged_objects_per_second"] <= 500 * 1.5 for s in merger if s.get("merged_objects_per_second"))
    assert max(s.get("send_overload_events") or 0 for s in merger) >= 1


CPP_STAGES = {"source": "producer", "worker-0": "worker", "worker-1": "worker", "merger-0": "merger", "sink": "sink"}


def test_the_verdict_names_the_cpp_pipelines_slow_stage_whose_senders_block(pipeline, tmp_path):
    """Issue 46: `pipeline run --slow merger-0` makes the merger cost 2 ms of CPU an object (500/s)
    under a source offering 2,000/s, and every send blocking: the workers wait in their sends
    (backpressured, not refused), the merger is busy. From the C agent's samples and the edges the
    stages say (--upstream, written by run), the verdict names the merger and nothing else."""
    from flowstat.flow import held_back_by, points_from_samples

    eps, out = tmp_path / "eps", tmp_path / "samples.ndjson"
    eps.mkdir()
    run = subprocess.Popen(
        [str(pipeline), "run", "--dir", str(tmp_path / "ipc"), "--count", "10000000", "--rate", "2000"]
        + ["--slow", "merger-0", "--slow-us", "2000", "--batch", "2", "--sndhwm", "50", "--rcvhwm", "50"],
        env={**os.environ, "FLOWSTAT_ENDPOINTS_DIR": str(eps)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    agent = watching_agent([str(C_AGENT)], eps, out)
    verdicts = []

    def named() -> bool:
        upstream = {}
        for f in eps.glob("*.json"):
            for node in json.loads(f.read_text())["nodes"]:
                upstream[node["node_id"]] = node.get("upstream", [])
        samples = [s for s in agent_samples(out) if s["node_id"] in upstream]
        if not samples:
            return False
        series = points_from_samples(samples)
        verdicts.append(held_back_by(series, upstream, max(p.t for ps in series.values() for p in ps)))
        return verdicts[-1].kind == "held_back"

    try:
        wait_until(named, "a verdict naming a node", timeout=60, poll=0.5)
        workers = [s for s in agent_samples(out) if s["node_id"].startswith("worker") and "backpressured_ratio" in s]
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        run.wait(timeout=30)
        err = stop_agent(agent)
    assert verdicts[-1].nodes == ("merger-0",), (verdicts[-1], err[-1000:])
    # the symptom upstream: the workers wait in blocking sends (no send of theirs is refused)
    assert max(s["backpressured_ratio"] for s in workers[-5:]) > 0.5, workers[-5:]
    assert not any(s.get("send_overload_events") for s in workers), "blocking sends, never refused"
