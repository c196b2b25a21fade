"""Both agents against real UDP and TCP receivers, and at their shortest interval (10 ms; how well
they keep time there is a benchmark: benchmarks/bench_agents.py, interval_10ms)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from flowstat.schema import sample as sample_schema
from support.agents import HttpReceiver, SocketReceiver, agent_args, sleeper, wait_until
from support.common import ROOT

C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
AGENTS = {
    "c": [str(C_AGENT)],
    "py": [sys.executable, "-m", "flowstat.cli", "agent"],
    "c-asan": [str(C_AGENT) + "-asan"],
}  # AddressSanitizer + leak check: exits non-zero on an error


def run(agent: str, *args) -> subprocess.CompletedProcess:
    """An agent run to its end; no self-samples: the node samples are what these tests count."""
    if agent.startswith("c") and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    return subprocess.run(
        [*AGENTS[agent], "--self-interval", "0", *map(str, args)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("agent", ["c", "py"])
@pytest.mark.parametrize("kind,fmt", [("udp", "line"), ("tcp", "line"), ("tcp", "json")])
def test_socket_sinks_deliver_every_sample(agent, kind, fmt):
    receiver = SocketReceiver(kind)
    procs = [sleeper(), sleeper()]
    try:
        sink = f"{kind}://127.0.0.1:{receiver.port}" + ("?format=json" if fmt == "json" else "")
        out = run(agent, *agent_args([p.pid for p in procs], interval=0.05, count=20, quiet=True, sink=sink))
        assert out.returncode == 0, out.stderr
        # the last datagrams may still be in flight on loopback
        wait_until(lambda: len(receiver.lines()) >= 40, timeout=5, what=f"40 samples at the {kind} receiver")
    finally:
        receiver.close()
        for p in procs:
            p.kill()
    lines = receiver.lines()
    assert len(lines) == 40
    if fmt == "json":
        docs = [json.loads(x) for x in lines]
        assert all(sample_schema.validate(d) == [] for d in docs)
        assert sorted(d["seq"] for d in docs if d["pid"] == procs[0].pid) == list(range(20))
    else:
        assert all(x.startswith("flowstat_node,") for x in lines)
        assert sum(f"pid={procs[1].pid}i" in x for x in lines) == 20


@pytest.mark.parametrize("agent", ["c", "py"])
def test_sinks_take_a_host_name(agent):
    """In compose the stack's servers are names (tcp://logstash:5044, http://telegraf:8186/write):
    each agent resolves a sink's host and tries its addresses in turn."""
    tcp, http = SocketReceiver("tcp"), HttpReceiver()
    proc = sleeper()
    try:
        sinks = [f"tcp://localhost:{tcp.port}?format=json", f"http://localhost:{http.port}/write"]
        out = run(agent, *agent_args(proc.pid, interval=0.05, count=10, quiet=True, sink=sinks))
        wait_until(
            lambda: len(tcp.lines()) >= 10, timeout=5, what="10 samples at the TCP receiver"
        )  # the last may be on its way
    finally:
        tcp.close()
        http.stop()
        proc.kill()
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(x)["seq"] for x in tcp.lines()) == list(range(10))
    assert sorted(int(x.split("seq=")[1].split("i")[0]) for x in http.lines()) == list(range(10))


@pytest.mark.parametrize("agent", ["c", "py"])
def test_a_host_name_that_does_not_resolve_is_said_so(agent):
    """A mistyped service name: the sink is down, and the log says the name did not resolve (the C
    agent said "Invalid argument", a stale errno, as getaddrinfo sets none)."""
    proc = sleeper()
    try:
        sink = "tcp://no-such-host.invalid:5044?format=json"
        out = run(agent, *agent_args(proc.pid, interval=0.05, count=1, quiet=True, drain_timeout=0, sink=sink))
    finally:
        proc.kill()
    down = [line for line in out.stderr.splitlines() if "no-such-host.invalid" in line and "is down" in line]
    assert down, out.stderr
    assert re.search(r"(?i)name|resolution", down[0]) and "Invalid argument" not in down[0], down[0]


@pytest.mark.parametrize("agent", ["c", "py"])
def test_ten_millisecond_interval_delivers_every_sample_in_order(agent, tmp_path):
    """At the shortest interval every round is taken and delivered, each at a later millisecond
    than the one before."""
    proc = sleeper()
    stats = tmp_path / "stats.json"
    try:
        sink = f"file://{tmp_path}/s.json?format=json"
        out = run(agent, *agent_args(proc.pid, interval=0.01, count=100, quiet=True, stats=stats, sink=sink))
    finally:
        proc.kill()
    assert out.returncode == 0, out.stderr
    docs = [json.loads(x) for x in open(tmp_path / "s.json")]
    assert [d["seq"] for d in docs] == list(range(100))
    stamps = [sample_schema.time_ns(d["time"]) for d in docs]
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False))
    assert json.loads(stats.read_text())["samples"] == 100


def spooled_samples(folder) -> int:
    """Samples waiting in an agent's spool (both agents name a batch NNNNNNNNNNNN-COUNT.batch)."""
    return sum(int(f.stem.split("-")[1]) for f in folder.rglob("*.batch"))


@pytest.mark.parametrize("agent", ["c", "py"])
def test_a_sink_down_at_exit_is_given_the_drain_timeout_to_come_back(agent, tmp_path):
    """A store restarting just as a run ends: what the agent spooled goes out once it is back."""
    if agent == "c" and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    receiver = HttpReceiver()
    receiver.stop()  # down before the first sample
    proc = sleeper()
    url = f"http://127.0.0.1:{receiver.port}/write"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    args = agent_args(
        proc.pid,
        self_interval=0,
        interval=0.05,
        count=20,
        quiet=True,
        sink=url,
        spool_dir=spool,
        stats=stats,
        drain_timeout=60,
    )
    agent_proc = subprocess.Popen([*AGENTS[agent], *args], stderr=subprocess.PIPE, text=True)
    try:
        # every round is taken and waits on disk
        wait_until(
            lambda: spooled_samples(spool) >= 20 or agent_proc.poll() is not None, timeout=30, what="20 samples spooled"
        )
        assert agent_proc.poll() is None, "the agent left without waiting for its sink"
        receiver.start()  # back on the same port, while the agent is draining
        assert agent_proc.wait(30) == 0, agent_proc.stderr.read()
    finally:
        proc.kill()
        agent_proc.kill()
    seqs = [int(line.split("seq=")[1].split("i")[0]) for line in receiver.lines()]
    assert sorted(seqs) == list(range(20))  # every sample, once (those since the outage first: test_c_agent_delivery)
    sink = json.loads(stats.read_text())["sinks"][url]
    assert sink["delivered"] == 20 and sink["spooled"] == 0 and sink["lost"] == 0


@pytest.mark.parametrize("agent", ["c", "c-asan", "py"])
def test_a_sink_still_down_after_the_drain_timeout_keeps_its_spool(agent, tmp_path):
    receiver = HttpReceiver()
    receiver.stop()  # never comes back
    proc = sleeper()
    url = f"http://127.0.0.1:{receiver.port}/write"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    args = agent_args(
        proc.pid, interval=0.05, count=10, quiet=True, sink=url, spool_dir=spool, stats=stats, drain_timeout=1
    )
    try:
        out = run(agent, *args)
    finally:
        proc.kill()
    assert out.returncode == 0, out.stderr  # nothing lost: it waits on disk for the next start
    sink = json.loads(stats.read_text())["sinks"][url]
    assert sink["delivered"] == 0 and sink["lost"] == 0 and sink["spooled"] > 0
    assert spooled_samples(spool) == 10
