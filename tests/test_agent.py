"""The Python agent against real processes, real sockets and real receivers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from flowstat.agent.agent import Agent, AgentConfig
from flowstat.agent.sinks import SinkURLError, open_sink
from flowstat.agent.spool import Spool
from flowstat.agent.targets import TargetSpec
from flowstat.proc.reader import ProcessGone, ProcFormatError, ProcReader, parse_stat, parse_statm
from flowstat.schema import sample as sample_schema
from support.agents import HttpReceiver, StubNode, sleeper, wait_until


def test_parse_stat_counts_fields_after_the_last_parenthesis():
    text = b"123 (we ird) (name)) S 1 2 3 4 5 6 7 8 9 10 111 222 13 14 15 16 9 0 19 20\n"
    assert parse_stat(text) == (111, 222, 9)


@pytest.mark.parametrize("bad", [b"", b"123 no paren", b"1 (x) S 1 2", b"1 (x) S " + b"a " * 30])
def test_parse_stat_rejects_garbage(bad):
    with pytest.raises(ProcFormatError):
        parse_stat(bad)


def test_parse_statm():
    assert parse_statm(b"1000 250 30 1 0 100 0\n") == 250 * os.sysconf("SC_PAGE_SIZE") // 1024
    with pytest.raises(ProcFormatError):
        parse_statm(b"17")


def test_reader_agrees_with_status_and_notices_exit():
    proc = sleeper()
    reader = ProcReader(proc.pid)
    r = reader.read()
    status = dict(line.split(":", 1) for line in open(f"/proc/{proc.pid}/status").read().splitlines())
    assert abs(r.rss_kb - int(status["VmRSS"].split()[0])) <= 8 and r.threads == 1
    proc.kill()
    proc.wait()
    with pytest.raises(ProcessGone):
        reader.read()
    reader.close()


def test_spool_is_fifo_bounded_and_persistent(tmp_path):
    sp = Spool(tmp_path, max_bytes=250)
    for i in range(3):
        sp.push(bytes([i]) * 100, count=10)
    assert sp.dropped_samples == 10 and len(sp) == 2  # the oldest went to keep under the bound
    again = Spool(tmp_path, max_bytes=250)  # a restarted agent finds what is left, in order
    assert again.peek() == (b"\x01" * 100, 10)
    again.pop()
    assert again.peek() == (b"\x02" * 100, 10) and again.samples == 10
    full = Spool(tmp_path / "full", max_bytes=200)  # exactly at its bound: nothing to drop yet
    for i in range(2):
        full.push(bytes([i]) * 100, count=10)
    assert full.dropped_samples == 0 and len(full) == 2 and len(list((tmp_path / "full").glob("*.batch"))) == 2


@pytest.mark.parametrize(
    "url",
    [
        "udp://127.0.0.1",
        "tcp://:80",
        "influxdb://127.0.0.1:8086/",
        "ftp://x:1",
        "stdout://?format=xml",
        "udp://127.0.0.1:9?format=json",
        "file://",
    ],
)
def test_bad_sink_urls(url):
    with pytest.raises(SinkURLError):
        open_sink(url)


def run_agent(tmp_path, sinks, count=None, duration=None, interval=0.05, **spec):
    """The agent in this process; no self-samples: what is checked here is the node samples."""
    cfg = AgentConfig(
        TargetSpec(**spec),
        sinks,
        interval_s=interval,
        rescan_s=0.2,
        spool_dir=str(tmp_path / "spool"),
        duration_s=duration,
        count=count,
        self_interval_s=0,
    )
    agent = Agent(cfg)
    return agent, agent.run()


def test_samples_conform_to_the_schema(tmp_path):
    proc = sleeper()
    try:
        agent, _ = run_agent(
            tmp_path,
            [f"file://{tmp_path}/s.json?format=json", f"file://{tmp_path}/s.lp"],
            count=5,
            pids=[proc.pid],
            run_id="r",
        )
    finally:
        proc.kill()
    docs = [json.loads(line) for line in open(tmp_path / "s.json")]
    assert [d["seq"] for d in docs] == [0, 1, 2, 3, 4]
    for d in docs:
        assert sample_schema.validate(d) == [], d
        assert d["pid"] == proc.pid and d["node_state"] == "UP" and d["vmrss_kb"] > 0
    lines = open(tmp_path / "s.lp").read().splitlines()
    assert lines == [sample_schema.to_line_protocol(d) for d in docs]


def test_a_target_that_exits_is_reported_down_once(tmp_path):
    proc = sleeper(1.0)
    agent, _ = run_agent(tmp_path, [f"file://{tmp_path}/s.json?format=json"], duration=2.5, pids=[proc.pid])
    proc.wait()
    docs = [json.loads(line) for line in open(tmp_path / "s.json")]
    states = [d["node_state"] for d in docs]
    assert states.count("DOWN") == 1 and states[-1] == "DOWN" and len(states) > 5
    assert agent.stats()["gone"] == 1


def test_hung_and_garbage_control_sockets_cost_a_timeout_not_a_crash(tmp_path):
    hung, garbage, ok = StubNode("hang"), StubNode("garbage"), StubNode("ok")
    procs = [sleeper(), sleeper(), sleeper()]
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps(
            {
                "run_id": "r",
                "nodes": [
                    {"node_id": f"n{i}", "role": "merger", "pid": p.pid, "control": node.endpoint}
                    for i, (p, node) in enumerate(zip(procs, (hung, garbage, ok), strict=False))
                ],
            }
        )
    )
    try:
        agent, _ = run_agent(
            tmp_path, [f"file://{tmp_path}/s.json?format=json"], count=4, interval=0.5, endpoints_files=[str(endpoints)]
        )
    finally:
        for p in procs:
            p.kill()
        for n in (hung, garbage, ok):
            n.close()
    docs = [json.loads(line) for line in open(tmp_path / "s.json")]
    by_node = {n: [d for d in docs if d["node_id"] == n] for n in ("n0", "n1", "n2")}
    assert all(len(v) == 4 for v in by_node.values())
    assert "average_merge_time_ms" not in by_node["n0"][0] and by_node["n0"][0]["vmrss_kb"] > 0
    assert "average_merge_time_ms" not in by_node["n1"][0]
    good = by_node["n2"][-1]
    assert good["average_merge_time_ms"] == 0.25 and good["send_buffer_overloaded"] is True
    assert "objects_held" not in good  # the stub sends a string there: left out, not passed on
    assert agent.control.errors >= 8  # 4 time-outs + 4 garbage replies
    # the hung node cost its time-out in each round, no more: no round was late enough to be skipped
    assert agent.rounds == 4 and agent.skipped_rounds == 0
    # a request is one frame (and the ROUTER's identity): with CURVE each frame is encrypted on its own
    assert ok.frames_per_request == {2}


def test_receiver_down_for_seconds_loses_and_duplicates_nothing(tmp_path):
    """The receiver goes down once samples flow, and comes back once more than a second of
    sampling (20 samples) waits in the spool: every sample taken arrives once (those taken since
    it came back first: test_c_agent_delivery)."""
    receiver = HttpReceiver()
    proc = sleeper()
    url = f"http://127.0.0.1:{receiver.port}/write"
    agent = Agent(
        AgentConfig(
            TargetSpec(pids=[proc.pid], run_id="r"),
            [url],
            interval_s=0.05,
            rescan_s=0.2,
            spool_dir=str(tmp_path / "spool"),
            self_interval_s=0,
        )
    )
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        wait_until(lambda: len(receiver.lines()) >= 10, timeout=30, what="the first ten samples at the receiver")
        receiver.stop()
        spool = agent.runners[0].spool
        wait_until(
            lambda: spool.samples > 20, timeout=30, what="more than 20 samples spooled while the receiver is down"
        )
        receiver.start()  # back on the same port
        wait_until(
            lambda: spool.samples == 0 and len(receiver.lines()) > 30,
            timeout=30,
            what="the spool resent, and samples taken since arriving live",
        )
    finally:
        agent.stop_event.set()
        runner.join(30)
        proc.kill()
    assert not runner.is_alive()
    seqs = [int(line.split("seq=")[1].split("i")[0]) for line in receiver.lines()]
    assert sorted(seqs) == list(range(agent.stats()["samples"]))  # every sample taken, once
    stats = agent.stats()["sinks"][url]
    assert stats["delivered"] == len(seqs) and stats["spooled"] == 0 and stats["lost"] == 0


def test_cli_refuses_no_targets_and_bad_sinks():
    run = lambda *a: subprocess.run([sys.executable, "-m", "flowstat.cli", "agent", *a], capture_output=True, text=True)
    r = run("--sink", "stdout://")
    assert r.returncode == 2 and "give at least one target" in r.stderr
    r = run("--pid", "1", "--sink", "gopher://x:1")
    assert r.returncode == 2 and "unknown sink" in r.stderr
    r = run("--pid", "1", "--sink", "stdout://", "--sink", "file:///tmp/x.lp", "--sink", "stdout://")
    assert r.returncode == 2 and "stdout://: --sink given twice" in r.stderr


def flowstat_agent(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flowstat", "agent", *map(str, args)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("agent", ["py", "c"])
def test_a_spool_left_behind_is_flushed_later_and_nothing_is_stranded(tmp_path, agent):
    from support.common import ROOT, free_port

    c_agent = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
    if agent == "c" and not c_agent.exists():
        pytest.skip("run `make c-agent` (make test does)")
    command = [str(c_agent)] if agent == "c" else [sys.executable, "-m", "flowstat", "agent"]
    port = free_port()
    url = f"http://127.0.0.1:{port}/write"
    proc = sleeper()
    try:  # the sink is down for the agent's whole life, and it gives up at once at exit
        r = subprocess.run(
            [
                *command,
                "--pid",
                str(proc.pid),
                "--count",
                "20",
                "--interval",
                "0.02",
                "--sink",
                url,
                "--self-interval",
                "0",
                "--spool-dir",
                str(tmp_path / "spool"),
                "--drain-timeout",
                "0",
                "--stats",
                str(tmp_path / "stats.json"),
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        proc.kill()
    assert r.returncode == 0, r.stderr  # nothing lost: it waits in the spool
    assert json.loads((tmp_path / "stats.json").read_text())["sinks"][url]["spooled_samples"] == 20
    (folder,) = [p.parent for p in (tmp_path / "spool").rglob("sink-url")]
    assert (folder / "sink-url").read_text() == url + "\n"

    still_down = flowstat_agent("--flush-spool", tmp_path / "spool", "--drain-timeout", 0.5)
    assert still_down.returncode == 1 and "20 batches (20 samples) still spooled" in still_down.stdout
    nowhere = tmp_path / "nowhere"
    nowhere.mkdir()
    (nowhere / "000000000000-1.batch").write_text("x\n")
    r = flowstat_agent("--flush-spool", nowhere)
    assert r.returncode == 2 and "no sink-url file says where these batches go; give --sink URL" in r.stderr

    receiver = HttpReceiver(port)
    try:
        r = flowstat_agent("--flush-spool", tmp_path / "spool")
    finally:
        receiver.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"20 samples sent to {url}, 0 refused; spool empty" in r.stdout
    seqs = [int(line.split("seq=")[1].split("i")[0]) for line in receiver.lines()]
    assert seqs == list(range(20))  # every sample, once, in order
    assert not list(folder.glob("*.batch"))


def test_spool_folders_keep_sinks_apart_and_are_named_as_the_c_agent_names_them():
    from flowstat.agent.spool import folder_name

    long = "file:///tmp/" + "x" * 100
    assert folder_name(long + "/a.lp") != folder_name(long + "/b.lp")  # the same first 64 bytes
    assert folder_name("http://127.0.0.1:8186/write") == "http___127_0_0_1_8186_write-" + "{:08x}".format(
        fnv1a(b"http://127.0.0.1:8186/write")
    )
    assert folder_name("file:///tmp/é") == "file____tmp___-" + "{:08x}".format(fnv1a("file:///tmp/é".encode()))


def fnv1a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) % 2**32
    return h


def test_the_heaps_are_trimmed_once_a_backlog_is_delivered(tmp_path, monkeypatch):
    """Issue 28: what a sink's backlog took goes back to the system once the sink has taken it
    (flowstat.agent.memory.trim): once per backlog, never while batches go straight through."""
    from flowstat.agent import memory
    from flowstat.agent.sinks import Sink, SinkDown, SinkRunner

    trims: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append(1) or True)

    class Switch(Sink):
        up = True
        taken = 0

        def encode(self, samples):
            return b"".join(b"s\n" for _ in samples)

        def send(self, payload, count):
            if not self.up:
                raise SinkDown("refused")
            self.taken += count

    sink = Switch("test://")
    spool = Spool(tmp_path / "spool")
    runner = SinkRunner(sink, spool, retry_s=0.05)
    runner.start()
    try:
        for _ in range(3):
            runner.submit([{}])
        wait_until(lambda: sink.taken == 3, "three batches sent")
        assert trims == []
        sink.up = False
        runner.submit([{}, {}])
        wait_until(lambda: runner.failing, "the sink found down")
        runner.submit([{}])
        sink.up = True
        wait_until(lambda: sink.taken == 6 and len(spool) == 0, "the backlog sent")
        wait_until(lambda: trims == [1], "the heaps trimmed")
        runner.submit([{}])
        wait_until(lambda: sink.taken == 7, "one more batch sent")
    finally:
        runner.stop()
        runner.join(10)
    assert trims == [1]


def test_glibc_mmap_threshold_is_fixed():
    from flowstat.agent import memory

    if memory._LIBC is None:
        pytest.skip("not glibc")
    assert memory.fix_mmap_threshold()


def test_a_run_document_sent_at_the_end_goes_after_the_one_still_spooled_from_the_start(tmp_path):
    """--send-run on the spool of the run's agent, whose sink was down since the run began: the run
    document sent then (verdict pending) still waits there, with samples. The same document id in
    every store: the end's must arrive after it, or the store keeps the pending one. So --send-run
    resends in order, not what was written since first (as an agent's sink back from an outage)."""
    from flowstat.agent.spool import folder_name
    from support.agents import ScriptedHttp

    server = ScriptedHttp()
    url = f"http://127.0.0.1:{server.port}/write"
    sink = open_sink(url)
    spool = Spool(tmp_path / "spool" / folder_name(url), url=url)
    run = {"run_id": "r-send-run", "started": "2026-11-27T00:00:00Z"}
    spool.push(sink.encode_run({**run, "label": "pending"}), 1)
    sample = {"run_id": run["run_id"], "node_id": "n", "seq": 0, "time": "2026-11-27T00:00:01.000Z"}
    spool.push(sink.encode([sample]), 1)
    complete = tmp_path / "run.json"
    complete.write_text(json.dumps({**run, "label": "complete"}))
    try:
        out = subprocess.run(
            [sys.executable, "-m", "flowstat.agent", "--send-run", str(complete), "--sink", url]
            + ["--spool-dir", str(tmp_path / "spool"), "--drain-timeout", "10"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    labels = [line for _, body, _ in server.requests for line in body.decode().splitlines() if "label=" in line]
    assert len(labels) == 2 and "pending" in labels[0] and "complete" in labels[1], labels


def test_the_agent_imports_no_numpy_nor_requests_until_a_node_or_a_store_needs_it():
    """Each was about half an agent's start-up CPU, though an agent whose sinks are files uses neither."""
    code = (
        "import sys, flowstat.agent.agent, flowstat.agent.sinks, flowstat.agent.command\n"
        "seen = lambda: print('numpy' in sys.modules, 'requests' in sys.modules)\n"
        "seen()\n"
        "from flowstat.node.latency import LatencyRecorder; LatencyRecorder(); seen()\n"
        "from flowstat import stores; stores.get('influxdb')('http://127.0.0.1:9', 'db'); seen()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False", "True", "False", "True", "True"], out.stderr
