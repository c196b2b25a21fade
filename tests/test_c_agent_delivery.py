"""The agents' delivery: one thread per sink (a sink that hangs never delays sampling), the store
policy (HTTP statuses, InfluxDB partial writes, Elasticsearch per-document outcomes), the spool
(its sink-url file, its bound, its resending by the next agent); for the C agent also the queue's
bound and options without silent limits. The tests of behaviour both agents share run against
each (the `agent_command` fixture of conftest.py: c, py). Real sockets on 127.0.0.1 throughout."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from flowstat.agent.spool import folder_name
from flowstat.schema import agent as agent_schema
from flowstat.schema import sample as sample_schema
from support.agents import (
    LOADED_STALL_S,
    HttpReceiver,
    ScriptedHttp,
    agent_cmd,
    assert_on_schedule,
    endpoints_file,
    run_agent,
    sink_stats,
    sleeper,
    wait_until,
)
from support.common import C_AGENT as AGENT
from support.common import C_ASAN as ASAN
from support.common import PYTHON_AGENT, free_port, needs

HAS_VALGRIND = subprocess.run(["which", "valgrind"], capture_output=True).returncode == 0


class TcpNeverReads:
    """Accepts connections and never reads: the agent's socket buffer fills, then send() waits."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited by accepted sockets
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.running = True
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while self.running:
            try:
                self.conns.append(self.sock.accept()[0])
            except (TimeoutError, OSError):
                continue

    def close(self) -> None:
        self.running = False
        self.thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


def seq_of(line: str) -> int:
    return int(line.split("seq=")[1].split("i")[0])


def lines_written(path) -> int:
    """Whole lines a file sink has written so far."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


# -- a sink that hangs does not delay sampling ---------------------------------------------------
# A sampler that waited on its sink would stop for the whole hold, 2.5-3 s here (LOADED_STALL_S: 0.5).
# Skipped rounds in the whole run: load spreads a few (6 seen in CI); a wait on the sink skips 25-30.
SKIPPED_MOST = 12


def test_an_http_sink_that_never_answers_does_not_delay_sampling(tmp_path, agent_command):
    server = ScriptedHttp(hold=True)
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    samples, stats = tmp_path / "s.json", tmp_path / "stats.json"
    agent = subprocess.Popen(
        agent_cmd(
            *("--pid", proc.pid, "--interval", 0.1, "--duration", 5, "--quiet", "--sink", url),
            *("--sink", f"file://{samples}?format=json", "--spool-dir", tmp_path / "spool", "--stats", stats),
            command=agent_command,
        ),
        stderr=subprocess.PIPE,
        text=True,
    )
    written = lambda: lines_written(samples)
    try:
        wait_until(lambda: server.requests, "the agent's first post", timeout=10)
        held_from = written()
        # 25 rounds at 10 Hz while the post is held: within the agent's 5 s HTTP time-out, past
        # which the sink thread would give up and the sink would no longer be hanging
        wait_until(lambda: written() >= held_from + 25, "25 samples written while the sink holds its post", timeout=4.5)
        assert len(server.requests) == 1  # the sink thread still waits for its answer
        server.release.set()
        assert agent.wait(30) == 0, agent.stderr.read()
    finally:
        proc.kill()
        agent.kill()
        server.close()
    assert_on_schedule(samples, 0.1, 0.1 + LOADED_STALL_S)
    everything = json.loads(stats.read_text())
    assert everything["skipped_rounds"] <= SKIPPED_MOST
    seqs = sorted(seq_of(line) for line in server.lines())
    assert seqs == list(range(everything["samples"]))  # each sample once: no gap, no duplicate
    sink = everything["sinks"][url]
    assert sink["delivered"] == everything["samples"] and sink["lost"] == 0 and sink["spooled"] == 0
    assert sink["refused"] == 0


@needs(AGENT)
def test_a_tcp_sink_that_never_reads_does_not_delay_sampling(tmp_path):
    """500 targets in JSON at 10 Hz fill the agent's socket buffer (a few MB) in seconds; sampling
    goes on through the send time-out that follows, until the test stops the agent."""
    receiver = TcpNeverReads()
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(500)]
    url = f"tcp://127.0.0.1:{receiver.port}?format=json"
    samples, stats = tmp_path / "s.json", tmp_path / "stats.json"
    pids = [arg for p in procs for arg in ("--pid", p.pid)]
    agent = subprocess.Popen(
        agent_cmd(
            *pids,
            *("--interval", 0.1, "--sink", url, "--drain-timeout", 0, "--quiet"),
            *("--sink", f"file://{samples}?format=json", "--spool-dir", tmp_path / "spool", "--stats", stats),
        ),
        stderr=subprocess.PIPE,
        text=True,
    )
    log: list[str] = []
    blocked = threading.Event()

    def read_log():
        for line in agent.stderr:
            log.append(line)
            if "timed out: the receiver does not read" in line:
                blocked.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    written = lambda: lines_written(samples)
    try:
        assert blocked.wait(60), "the socket buffer never filled:\n" + "".join(log)
        blocked_at = written()
        # sampling goes on after the send timed out: ten more rounds of 500 targets
        wait_until(
            lambda: written() >= blocked_at + 10 * 500, "ten rounds sampled after the send timed out", timeout=30
        )
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == 0, "".join(log)
    finally:
        agent.kill()
        for p in procs:
            p.kill()
            p.wait()
        receiver.close()
    reader.join(10)
    assert_on_schedule(samples, 0.1, 0.1 + LOADED_STALL_S)  # through the 3 s the sink thread waited in send()
    everything = json.loads(stats.read_text())
    # a sampling loop blocked in the 3 s send would skip 30 rounds
    assert everything["skipped_rounds"] <= SKIPPED_MOST and everything["rounds"] >= 40
    sink = everything["sinks"][url]
    # every sample is accounted for: sent, or still waiting on disk (none lost: the spool is large enough)
    assert sink["lost"] == 0 and sink["spool_dropped"] == 0 and sink["spooled_samples"] > 0
    assert sink["delivered"] + sink["spooled_samples"] == everything["samples"]


@needs(AGENT)
def test_a_full_queue_drops_its_oldest_batch_and_says_so(tmp_path):
    """The queue in front of a sink is bounded by --spool-max-mb too: past it the oldest batch goes,
    counted as lost and logged, and the agent exits non-zero."""
    server = ScriptedHttp(hold=True)
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats, log_path = tmp_path / "stats.json", tmp_path / "agent.log"
    with open(log_path, "w") as log_file:
        agent = subprocess.Popen(
            agent_cmd(
                *("--pid", proc.pid, "--interval", 0.02, "--duration", 4, "--quiet", "--sink", url),
                *("--spool-max-mb", 0.005, "--stats", stats),
            ),
            stderr=log_file,
        )
    try:
        wait_until(
            lambda: "dropped the oldest queued batch" in log_path.read_text(),
            "the queue behind the held post to overflow",
            timeout=10,
        )
        server.release.set()
        assert agent.wait(30) == 1
        log = log_path.read_text()
    finally:
        proc.kill()
        agent.kill()
        server.close()
    assert "queue is over 5242 bytes: dropped the oldest queued batch" in log
    everything = json.loads(stats.read_text())
    sink = everything["sinks"][url]
    assert sink["lost"] > 0 and sink["delivered"] + sink["lost"] == everything["samples"]
    assert len(server.lines()) == sink["delivered"]


def test_a_slow_sink_cannot_hold_the_exit(tmp_path, agent_command):
    """A sink that answers each request in 1 s, sent at most 1 KiB a request (--send-max-kb 1: a
    few batches): at exit, what is still queued gets 5 s (at least --drain-timeout) to go out,
    and the rest waits in the spool."""
    server = ScriptedHttp(lambda path, body, n: (time.sleep(1.0), (204, b""))[1])  # the scenario: 1 s per batch
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats = tmp_path / "stats.json"
    try:
        out = run_agent(
            *("--pid", proc.pid, "--interval", 0.05, "--duration", 2, "--sink", url, "--quiet"),
            *("--spool-dir", tmp_path / "spool", "--drain-timeout", 0, "--send-max-kb", 1, "--stats", stats),
            command=agent_command,
        )
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr
    assert "too slow to take what was queued before the exit: the rest is spooled" in out.stderr
    everything = json.loads(stats.read_text())
    sink = everything["sinks"][url]
    # 40 batches, a few a request at 1 s each: the 2 s run and the exit's 5 s, and one request
    # under way as each ends, then the rest is spooled
    assert 3 <= len(server.requests) <= 9, len(server.requests)
    assert all(len(body) <= 1024 or body.count(b"\n") == 1 for _, body, _ in server.requests)
    assert 0 < sink["delivered"] < everything["samples"] and sink["lost"] == 0
    assert sink["delivered"] + sink["spooled_samples"] == everything["samples"]


def one_sleeper_into(server, tmp_path, agent_command, *options) -> tuple[subprocess.CompletedProcess, dict]:
    """An agent sampling one sleeper every 50 ms into ``server`` (a ScriptedHttp, closed after),
    with ``options``: its exit (checked 0) and statistics, every sample checked delivered, none
    spooled or lost."""
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats = tmp_path / "stats.json"
    try:
        out = run_agent(
            *("--pid", proc.pid, "--interval", 0.05, "--self-interval", 0, "--quiet"),
            *("--sink", url, "--stats", stats, *options),
            command=agent_command,
        )
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr
    everything = json.loads(stats.read_text())
    sink = everything["sinks"][url]
    assert (sink["delivered"], sink["spooled_samples"], sink["lost"]) == (everything["samples"], 0, 0), sink
    return out, everything


@pytest.mark.parametrize("spool", [True, False], ids=["spool", "memory"])
def test_a_sink_slower_than_the_rounds_catches_up_a_request_at_a_time(tmp_path, agent_command, spool):
    """A sink that answers each request in 0.3 s, a round every 50 ms: one batch a request would
    fall further behind at every request (60 batches; 10 requests in the run, 16 in the exit's
    5 s). What waits, in the spool or queued in memory without one, goes together, up to
    --send-max-kb a request: every sample is delivered, once, in order, in far fewer requests
    than batches."""
    server = ScriptedHttp(lambda path, body, n: (time.sleep(0.3), (204, b""))[1])  # the scenario: a slow sink
    out, everything = one_sleeper_into(
        server, tmp_path, agent_command, "--duration", 3, *(("--spool-dir", tmp_path / "spool") if spool else ())
    )
    seqs = [seq_of(line) for line in server.lines()]
    assert seqs == list(range(everything["samples"])), seqs
    assert everything["samples"] >= 40 and len(server.requests) <= everything["samples"] // 3, len(server.requests)
    assert "too slow" not in out.stderr


@pytest.mark.parametrize("refusals", [2, 3])
def test_after_an_outage_what_was_sampled_since_goes_before_the_backlog_and_the_backlog_still_goes(
    tmp_path, agent_command, refusals
):
    """A sink down (503) for its first requests, a round every 100 ms, retried every second: at each
    refusal the batches written so far become the backlog. Once the sink takes requests, the first
    it takes holds only samples newer than any it refused (the ones written since the last
    refusal), not the oldest of the outage, however many refusals came before (an even number once
    gave the backlog the first turn): what is sampled after an outage is stored at once. The
    backlog follows whenever no live batch waits, oldest first, over several requests (small ones:
    --send-max-kb 1), and every sample arrives once."""
    server = ScriptedHttp(lambda path, body, n: (503 if n < refusals else 204, b""))
    out, everything = one_sleeper_into(
        server, tmp_path, agent_command, "--duration", 6, "--send-max-kb", 1, "--spool-dir", tmp_path / "spool"
    )
    bodies = [[seq_of(line) for line in body.decode().splitlines() if line] for _, body, _ in server.requests]
    refused, taken = bodies[:refusals], bodies[refusals:]
    assert max(max(b) for b in refused) < min(taken[0]), (refused, taken[:2])
    backlog_seen = [b for b in taken if b[0] < min(taken[0])]
    assert len(backlog_seen) >= 2 and backlog_seen[0][0] == 0, taken  # then the backlog, from its oldest
    assert [s for b in backlog_seen for s in b] == sorted(s for b in backlog_seen for s in b)
    delivered = sorted(s for b in taken for s in b)
    assert delivered == list(range(everything["samples"])), delivered


def test_live_batches_that_never_run_out_still_let_the_backlog_go(tmp_path, agent_command):
    """Down for its first two requests, then a sink that answers each request in 0.25 s while the
    agent writes a batch every 50 ms, a request holding about two (--send-max-kb 1): live batches
    wait at every turn, so the backlog goes only because it gets a request at least every 8th
    (BACKLOG_EVERY): one of the first 9 requests taken holds it, not only the end of the run."""

    def answer(path, body, n):
        if n < 2:
            return 503, b""
        time.sleep(0.25)  # the scenario: a sink slower than the batches come
        return 204, b""

    server = ScriptedHttp(answer)
    out, everything = one_sleeper_into(
        server,
        tmp_path,
        agent_command,
        *("--duration", 4, "--send-max-kb", 1, "--drain-timeout", 30, "--spool-dir", tmp_path / "spool"),
    )
    bodies = [[seq_of(line) for line in body.decode().splitlines() if line] for _, body, _ in server.requests]
    refused, taken = bodies[:2], bodies[2:]
    backlog = max(max(b) for b in refused)
    assert min(taken[0]) > backlog, taken[:2]  # live first
    assert any(min(b) <= backlog for b in taken[:9]), taken[:9]
    assert sorted(s for b in taken for s in b) == list(range(everything["samples"]))


# -- the store policy ----------------------------------------------------------------------------


def bulk_answer(seen: dict[str, int]):
    """Per document, by node: a stored (201), b refused (400), c and d refused for now (429, 503)
    the first time its _id comes, stored the second. The answer itself is a 200."""

    def answer(path, body, n):
        assert path == "/_bulk"
        lines = body.decode().splitlines()
        items = []
        for action, doc in zip(lines[::2], lines[1::2], strict=False):
            _id, node = json.loads(action)["index"]["_id"], json.loads(doc)["node_id"]
            seen[_id] = seen.get(_id, 0) + 1
            item = {"_index": "flowstat", "_id": _id, "status": 201}
            if node == "b":
                item.update(
                    status=400,
                    error={
                        "type": "mapper_parsing_exception",
                        "reason": "failed to parse field [threads] of type [long]",
                    },
                )
            elif node == "c" and seen[_id] == 1:
                item.update(status=429, error={"type": "es_rejected_execution_exception", "reason": "queue full"})
            elif node == "d" and seen[_id] == 1:
                item.update(status=503, error={"type": "unavailable_shards_exception", "reason": "primary not active"})
            items.append({"index": item})
        errors = any(i["index"]["status"] >= 300 for i in items)
        return 200, json.dumps({"took": 1, "errors": errors, "items": items}).encode()

    return answer


@pytest.mark.parametrize("build", ["plain", "asan", "valgrind", "python"])
def test_elasticsearch_documents_are_settled_one_by_one(tmp_path, build):
    if build == "valgrind" and not HAS_VALGRIND:
        pytest.skip("no valgrind")
    binary = ASAN if build == "asan" else AGENT
    if build != "python" and not binary.exists():
        pytest.skip(f"no {binary.name}: run `make c-agent` (make test does)")
    wrap = (
        ("valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=99", "--quiet")
        if build == "valgrind"
        else ()
    )
    seen: dict[str, int] = {}
    server = ScriptedHttp(bulk_answer(seen))
    proc = sleeper()
    url = f"elasticsearch://127.0.0.1:{server.port}/flowstat"
    stats = tmp_path / "stats.json"
    try:
        out = run_agent(
            "--endpoints",
            endpoints_file(tmp_path, proc.pid, nodes=("a", "b", "c", "d")),
            *("--count", 3, "--interval", 0.2, "--sink", url, "--spool-dir", tmp_path / "spool"),
            *("--drain-timeout", 20, "--stats", stats),
            binary=binary,
            command=PYTHON_AGENT if build == "python" else None,
            wrap=wrap,
            timeout=300,
        )
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr
    by_node: dict[str, list[int]] = {}
    for _id, times in seen.items():
        by_node.setdefault(_id.split("/")[-2], []).append(times)
    # only c's and d's documents come again, and only once
    assert by_node == {"a": [1] * 3, "b": [1] * 3, "c": [2] * 3, "d": [2] * 3}
    resends = [b for b in server.bodies()[1:] if b'"node_id":"a"' not in b]
    assert resends and all(body.count(b"\n") % 2 == 0 for body in resends)
    assert all(b'"node_id":"b"' not in body for body in resends)
    assert "mapper_parsing_exception" in out.stderr  # the reason of the refusal is told
    sink = sink_stats(stats, url)
    assert sink == {
        **{"delivered": 9, "refused": 3, "lost": 0, "spooled": 0, "spooled_samples": 0, "spool_dropped": 0},
        "failovers": 0,
    }


@pytest.mark.parametrize("scheme", ["influxdb", "http"])
def test_an_influxdb_partial_write_stores_the_rest_and_resends_nothing(tmp_path, scheme, agent_command):
    conflict = (
        b'{"error":"partial write: field type conflict: input field \\"threads\\" on measurement '
        b'\\"flowstat_node\\" is type float, already exists as type integer dropped=1"}'
    )
    server = ScriptedHttp(lambda path, body, n: (400, conflict) if n == 0 else (204, b""))
    proc = sleeper()
    url = f"{scheme}://127.0.0.1:{server.port}/" + ("flowstat" if scheme == "influxdb" else "write")
    stats = tmp_path / "stats.json"
    try:
        out = run_agent(
            "--endpoints",
            endpoints_file(tmp_path, proc.pid),
            *("--count", 4, "--interval", 0.1, "--sink", url, "--spool-dir", tmp_path / "spool", "--stats", stats),
            command=agent_command,
        )
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr
    # four batches of three, none sent twice; batches that waited for an answer may go together
    lines = server.lines()
    assert len(lines) == 12 and len(set(lines)) == 12, lines
    assert 1 <= len(server.requests) <= 4
    assert all(path.startswith("/write") for path, _, _ in server.requests)
    sink = sink_stats(stats, url)
    assert (sink["delivered"], sink["refused"], sink["lost"], sink["spooled"]) == (11, 1, 0, 0)
    assert "partial write" in out.stderr


@pytest.mark.parametrize(
    "status,down", [(408, True), (429, True), (500, True), (503, True), (400, False), (404, False), (413, False)]
)
def test_http_statuses_follow_the_store_policy(tmp_path, status, down, agent_command):
    """The first batch is answered `status`: down means sent again later, else refused for good,
    and said so with the store's answer."""
    server = ScriptedHttp(lambda path, body, n: (status, b'{"error":"scripted"}') if n == 0 else (204, b""))
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats = tmp_path / "stats.json"
    try:
        out = run_agent(
            *("--pid", proc.pid, "--count", 3, "--interval", 0.1, "--sink", url, "--quiet"),
            *("--spool-dir", tmp_path / "spool", "--drain-timeout", 10, "--stats", stats),
            command=agent_command,
        )
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr
    seqs = [seq_of(line) for line in server.lines()]
    sink = sink_stats(stats, url)
    if down:
        # sent again (what was sampled since may go before it: the order is another test's)
        assert seqs[0] == 0 and sorted(seqs[1:]) == [0, 1, 2] and (sink["delivered"], sink["refused"]) == (3, 0)
        assert "is down (" in out.stderr and f"HTTP {status}" in out.stderr, out.stderr
    else:
        assert seqs == [0, 1, 2] and (sink["delivered"], sink["refused"]) == (2, 1)
        assert f"HTTP {status}" in out.stderr and "scripted" in out.stderr, out.stderr
    assert sink["lost"] == 0 and sink["spooled"] == 0


def test_a_batch_refused_after_an_outage_neither_stalls_nor_spins(tmp_path, agent_command):
    """Down (503), then the spooled batch refused (404), then taken: the refused batch is counted and
    dropped, what follows is delivered, and the agent waits for its next tick instead of spinning."""
    import resource

    answers = {0: 503, 1: 404}
    server = ScriptedHttp(lambda path, body, n: (answers.get(n, 204), b'{"error":"scripted"}'))
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats = tmp_path / "stats.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        # the resend (1 s after the outage) comes 1.5 s before the next tick: the refused batch is the
        # only one spooled, and nothing else is due for a while
        out = run_agent(
            *("--pid", proc.pid, "--count", 2, "--interval", 2.5, "--sink", url, "--quiet"),
            *("--spool-dir", tmp_path / "spool", "--stats", stats),
            command=agent_command,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr
    assert [seq_of(line) for line in server.lines()] == [0, 0, 1]  # 0 refused on its resend
    sink = sink_stats(stats, url)
    assert (sink["delivered"], sink["refused"], sink["lost"], sink["spooled"]) == (1, 1, 0, 0)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert cpu < 1.0, f"{cpu:.2f} s of CPU for 5 s of sampling one process: spinning"


# -- the spool names its sink, and the next agent resends it --------------------------------------


def batch_files(folder) -> list:
    """A spool folder's batches, oldest first (their names start with their number)."""
    return sorted(folder.glob("*.batch"))


def test_each_spool_folder_names_its_sink_and_is_resent_by_the_next_agent(tmp_path, agent_command):
    port = free_port()  # nobody there yet
    proc = sleeper()
    http_url, file_url = f"http://127.0.0.1:{port}/write", f"file://{tmp_path}/{'samples-' * 12}.lp"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    common = (
        *("--pid", proc.pid, "--interval", 0.05, "--sink", http_url, "--sink", file_url, "--spool-dir", spool),
        *("--stats", stats),
        "--quiet",
    )
    try:
        first = run_agent(*common, "--count", 5, "--drain-timeout", 0, command=agent_command)
        assert first.returncode == 0, first.stderr
        folders = {d.name: d for d in spool.iterdir()}
        # named as the Python agent names them
        assert set(folders) == {folder_name(url) for url in (http_url, file_url)}
        assert {(d / "sink-url").read_text() for d in folders.values()} == {http_url + "\n", file_url + "\n"}
        waiting = next(d for d in folders.values() if (d / "sink-url").read_text() == http_url + "\n")
        assert [f.name for f in batch_files(waiting)] == [f"{n:012d}-1.batch" for n in range(5)]
        spooled = [f.read_bytes() for f in batch_files(waiting)]
        assert [seq_of(b.decode()) for b in spooled] == [0, 1, 2, 3, 4]
        assert sink_stats(stats, http_url)["spooled_samples"] == 5
        receiver = HttpReceiver(port)
        try:
            second = run_agent(*common, "--count", 2, command=agent_command)
        finally:
            receiver.stop()
        assert second.returncode == 0, second.stderr
        # the spool first, oldest first, as it was written (together: --send-max-kb); then the new agent's own
        assert b"".join(receiver.bodies).startswith(b"".join(spooled))
        assert [seq_of(line) for line in receiver.lines()] == [0, 1, 2, 3, 4, 0, 1]
        assert sink_stats(stats, http_url)["delivered"] == 7 and sink_stats(stats, http_url)["spooled"] == 0
        assert (waiting / "sink-url").read_text() == http_url + "\n" and not batch_files(waiting)
        (waiting / "sink-url").write_text("http://elsewhere:1/write\n")
        third = run_agent(*common, "--count", 1, command=agent_command)
        assert third.returncode == 2 and "holds the batches of another sink" in third.stderr
    finally:
        proc.kill()


# -- an agent killed with SIGKILL: what it sampled is in its spool -------------------------------


def sample_key(line: str) -> tuple[str, str, int]:
    """A line protocol sample's (agent, node_id, seq): how loss and duplication are counted."""
    tags = dict(tag.split("=", 1) for tag in line.split(" ", 1)[0].split(",")[1:])
    return tags["agent"], tags.get("node_id", ""), seq_of(line)


def first_agent(common: tuple, rounds: int, seen, agent_command, stderr) -> subprocess.Popen:
    """The agent to be killed, named k1: a second sink, a file, shows what it sampled."""
    more = ("--name", "k1", "--count", rounds, "--drain-timeout", 60, "--sink", f"file://{seen}?format=json")
    return subprocess.Popen(agent_cmd(*common, *more, command=agent_command), stderr=stderr)


def killed_and_next(agent_command, rounds: int) -> list[tuple[str, str, int]]:
    """The samples of k1's ``rounds`` and of k2's two, on nodes a, b and c."""
    name = "flowstat-agent-c" if agent_command[0].endswith("flowstat-agent") else "flowstat-agent-py"
    return [(f"{name}/{k}", node, seq) for k, n in (("k1", rounds), ("k2", 2)) for node in "abc" for seq in range(n)]


def test_an_agent_killed_while_its_sink_hangs_loses_nothing_once_restarted_on_its_spool(tmp_path, agent_command):
    """The soak's agent-kill (issue 28): the sink accepts the agent's first post and never answers,
    so its thread waits out the 5 s time-out while the agent samples on; the agent is killed with
    SIGKILL in that wait. Every round it sampled must be in its spool by then: the next agent on the
    same spool, with the sink back, delivers each (agent, node, seq) once, its own rounds after them."""
    hung = TcpNeverReads()  # accepts the post and never reads it, let alone answers
    port, proc = hung.port, sleeper()
    url = f"http://127.0.0.1:{port}/write"
    seen, spool, stats, log = (tmp_path / name for name in ("seen.json", "spool", "stats.json", "first.log"))
    endpoints = endpoints_file(tmp_path, proc.pid)  # three nodes a, b, c
    rounds = 8
    common = ("--endpoints", endpoints, "--interval", 0.05, "--sink", url, "--spool-dir", spool)
    try:
        with open(log, "w") as log_file:
            first = first_agent(common, rounds, seen, agent_command, log_file)
        try:
            wait_until(lambda: hung.conns, "the first agent's post, which the sink never answers")
            wait_until(lambda: lines_written(seen) == 3 * rounds, f"the first agent's {rounds} rounds sampled")
            # well within the 5 s the sink thread waits for an answer to its first post
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        finally:
            first.kill()
            hung.close()
        receiver = HttpReceiver(port)  # the sink is back, on the same port
        try:
            second = run_agent(
                *common, "--name", "k2", "--count", 2, "--drain-timeout", 10, "--stats", stats, command=agent_command
            )
        finally:
            receiver.stop()
    finally:
        proc.kill()
    assert second.returncode == 0, second.stderr
    taken = sorted(sample_key(line) for line in receiver.lines())
    expected = killed_and_next(agent_command, rounds)
    assert taken == sorted(expected), log.read_text()  # each once: none lost, none sent twice
    assert sink_stats(stats, url) == {
        "delivered": len(expected),  # the spool the first agent left, then its own
        "refused": 0,
        "lost": 0,
        "spooled": 0,
        "spooled_samples": 0,
        "spool_dropped": 0,
        "failovers": 0,
    }
    assert not batch_files(spool / folder_name(url))  # each batch removed once the sink took it


def test_an_agent_killed_after_its_post_reached_the_sink_resends_it_identical(tmp_path, agent_command):
    """Killed between a send and the sink's answer, an agent cannot know whether the sink took the
    batch: the next one sends it again, the very same bytes (measurement, tags and time stamp for
    InfluxDB, which keeps one point per series and time; the same _id and index for Elasticsearch),
    so the store overwrites it instead of keeping it twice. That batch alone comes twice."""
    server = ScriptedHttp(hold=True)  # reads each post at once, answers only once released
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    seen, spool, stats = tmp_path / "seen.json", tmp_path / "spool", tmp_path / "stats.json"
    endpoints = endpoints_file(tmp_path, proc.pid)
    rounds = 4
    common = ("--endpoints", endpoints, "--interval", 0.05, "--sink", url, "--spool-dir", spool)
    try:
        first = first_agent(common, rounds, seen, agent_command, subprocess.DEVNULL)
        try:
            wait_until(lambda: server.requests, "the first agent's post, which the sink holds")
            wait_until(lambda: lines_written(seen) == 3 * rounds, f"the first agent's {rounds} rounds sampled")
            first.send_signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        finally:
            first.kill()
        server.release.set()  # answers from now on (the held post's answer goes nowhere)
        second = run_agent(
            *common, "--name", "k2", "--count", 2, "--drain-timeout", 10, "--stats", stats, command=agent_command
        )
    finally:
        proc.kill()
        server.close()
    assert second.returncode == 0, second.stderr
    bodies = server.bodies()
    assert bodies[1].startswith(bodies[0])  # the held post, sent again first, byte for byte (the rest with it)
    taken = [sample_key(line) for line in server.lines()]
    twice = sorted(k for k in set(taken) if taken.count(k) > 1)
    assert twice == sorted(sample_key(line) for line in bodies[0].decode().splitlines())
    assert all(taken.count(k) == 2 for k in twice)
    assert sorted(set(taken)) == sorted(killed_and_next(agent_command, rounds))  # nothing lost


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 64 KiB tmpfs (a batch file takes a 4 KiB page of it at least): writes past it fail
    with ENOSPC, as the soak's spool-full fault's 1 MiB one did."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("fills", ["tmpfs", "bound"])
def test_a_full_spool_counts_exactly_what_it_could_not_keep(tmp_path, request, fills, agent_command):
    """The soak's spool-full (issue 28): the sink is down until the spool is full and batches are
    being lost, then back. The spool is full as its tmpfs is (a write fails: the batch that does not
    fit is lost), or at its bound (--spool-max-mb: the oldest batch is dropped). Either way, what
    the sink lacks once the spool was sent is exactly what the agent counted as lost or dropped: node
    samples and self-samples alike, both of which its counters count (the soak compared its node
    samples alone with them, and was 17 self-samples off); also once its spool is empty again."""
    port = free_port()  # nobody there yet: the sink is down
    url = f"http://127.0.0.1:{port}/write"
    proc = sleeper()
    stats, log = tmp_path / "stats.json", tmp_path / "agent.log"
    if fills == "tmpfs":
        spool, extra, said, counter = (
            request.getfixturevalue("small_tmpfs"),
            (),
            "cannot write: No space left on device",
            "lost",
        )
    else:
        spool, extra, said, counter = (
            tmp_path / "spool",
            ("--spool-max-mb", 0.002),
            "dropped its oldest batch",
            "spool_dropped",
        )
    try:
        with open(log, "w") as log_file:
            # self-samples too (a later --self-interval wins over agent_cmd's)
            agent = subprocess.Popen(
                agent_cmd(
                    "--endpoints",
                    endpoints_file(tmp_path, proc.pid),
                    *("--name", "t", "--interval", 0.02, "--self-interval", 0.2, "--sink", url, "--spool-dir", spool),
                    *extra,
                    "--drain-timeout",
                    30,
                    "--stats",
                    stats,
                    command=agent_command,
                ),
                stderr=log_file,
            )
        receiver = None
        try:
            # each batch the full spool could not keep is said: 30 of them, a few self-samples among them
            wait_until(lambda: log.read_text().count(said) >= 30, "30 batches the full spool could not keep")
            receiver = HttpReceiver(port)  # the sink is back
            caught_up = re.compile(r"^flowstat_agent,.* .*spooled_batches=0i,spooled_samples=0i,sinks_down=0i")
            wait_until(
                lambda: any(caught_up.match(line) for line in receiver.lines()),
                "a self-sample saying the spool was sent",
                timeout=30,
            )
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(60) == 1, log.read_text()  # samples were lost: said by the exit status
        finally:
            agent.kill()
            if receiver is not None:
                receiver.stop()
    finally:
        proc.kill()
    everything = json.loads(stats.read_text())
    sink = everything["sinks"][url]
    taken = [sample_key(line) for line in receiver.lines()]
    assert len(set(taken)) == len(taken)  # none twice
    nodes, selves = sum(1 for k in taken if k[1]), sum(1 for k in taken if not k[1])
    assert sink["delivered"] == nodes + selves
    missing = everything["samples"] - nodes + everything["self_samples"] - selves
    assert missing == sink["lost"] + sink["spool_dropped"], (everything, nodes, selves)
    assert sink[counter] >= 30 and everything["self_samples"] > selves  # self-samples were lost too
    assert (sink["refused"], sink["spooled"], sink["spooled_samples"]) == (0, 0, 0)


def test_batches_the_bound_drops_while_they_are_sent_are_counted_once(tmp_path, agent_command):
    """A sink slower than the rounds (each post answered in 30 ms, a round every 20 ms, at most
    1 KiB a post: --send-max-kb 1) behind a spool of 2 KiB: the bound keeps dropping the oldest
    batches, often those being sent. Each is
    counted once, as what became of it: delivered if the sink took it, else dropped. (A self-sample
    after each round: batches of 3 and of 1 samples, so that miscounting one for another shows.)"""
    server = ScriptedHttp(lambda path, body, n: (time.sleep(0.03), (204, b""))[1])  # the scenario: a slow sink
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats = tmp_path / "stats.json"
    try:
        out = run_agent(
            "--endpoints",
            endpoints_file(tmp_path, proc.pid),
            *("--interval", 0.02, "--duration", 3, "--self-interval", 0.02, "--sink", url),
            *("--spool-dir", tmp_path / "spool", "--spool-max-mb", 0.002, "--send-max-kb", 1, "--drain-timeout", 10),
            *("--stats", stats),
            command=agent_command,
        )
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 1, out.stderr[-2000:]  # samples were dropped
    everything = json.loads(stats.read_text())
    sink = everything["sinks"][url]
    taken = [sample_key(line) for line in server.lines()]
    assert len(set(taken)) == len(taken) == sink["delivered"]
    assert sink["spool_dropped"] > 0 and (sink["lost"], sink["spooled_samples"]) == (0, 0)
    assert sink["delivered"] + sink["spool_dropped"] == everything["samples"] + everything["self_samples"]


# -- the spool's bound ---------------------------------------------------------------------------


def line_protocol(doc: dict) -> str:
    """A sample or self-sample as a spooled batch of one holds it (either agent encodes them alike:
    test_c_agent.py)."""
    return (sample_schema if "node_id" in doc else agent_schema).to_line_protocol(doc) + "\n"


def test_a_spool_past_its_bound_keeps_the_newest_batches_and_counts_the_dropped(tmp_path, agent_command):
    """A sink down for 60 rounds and a spool bound of 2097 bytes (--spool-max-mb 0.002): about ten
    batches of one sample. The spool keeps the newest batches that fit, no fewer; the older ones
    are dropped, counted in the stats and the self-samples, and make the exit non-zero."""
    port = free_port()  # nobody there: the sink is down throughout
    proc = sleeper()
    url = f"http://127.0.0.1:{port}/write"
    samples, spool, stats = tmp_path / "s.json", tmp_path / "spool", tmp_path / "stats.json"
    bound = int(0.002 * 1024 * 1024)
    try:
        # self-samples too (a later --self-interval wins over agent_cmd's): they report spool_dropped
        out = run_agent(
            *("--pid", proc.pid, "--count", 60, "--interval", 0.05, "--self-interval", 0.5, "--sink", url),
            *("--sink", f"file://{samples}?format=json", "--spool-dir", spool, "--spool-max-mb", 0.002),
            *("--drain-timeout", 0, "--stats", stats, "--quiet"),
            command=agent_command,
        )
    finally:
        proc.kill()
    assert out.returncode == 1, out.stderr  # samples were lost
    assert f"is over {bound} bytes: dropped its oldest batch (1 samples)" in out.stderr
    everything = json.loads(stats.read_text())
    # the file sink took every batch the spool was given, in the same order: batch n is docs[n]
    docs = [json.loads(line) for line in open(samples)]
    assert len(docs) == everything["samples"] + everything["self_samples"] and everything["samples"] == 60
    batches = batch_files(spool / folder_name(url))
    first = int(batches[0].name.split("-")[0])
    assert [f.name for f in batches] == [f"{n:012d}-1.batch" for n in range(first, len(docs))]  # the newest
    assert [f.read_text() for f in batches] == [line_protocol(d) for d in docs[first:]]
    kept = sum(f.stat().st_size for f in batches)
    assert kept <= bound < kept + len(line_protocol(docs[first - 1]))  # all that fits: the last dropped did not
    sink = everything["sinks"][url]
    assert (sink["spool_dropped"], sink["spooled"], sink["spooled_samples"], sink["lost"]) == (
        first,
        len(batches),
        len(batches),
        0,
    )
    selves = [d for d in docs if "node_id" not in d]
    dropped = [d["spool_dropped"] for d in selves]
    # as the sink thread had published it when each was taken: it only grows, up to the final count
    assert len(selves) >= 5 and dropped == sorted(dropped) and 0 < dropped[-1] <= first
    smallest = min(len(line_protocol(d)) for d in docs)
    assert all(d["spooled_batches"] <= bound // smallest for d in selves), [d["spooled_batches"] for d in selves]


# -- options without silent limits ---------------------------------------------------------------


@pytest.fixture
def target():
    proc = sleeper()
    yield proc.pid
    proc.kill()


@needs(AGENT)
@pytest.mark.parametrize(
    "option,count", [("--pid", 5000), ("--pidfile", 5000), ("--endpoints", 5000), ("--pattern", 300)]
)
def test_long_target_lists_are_all_taken(tmp_path, target, option, count):
    pidfile, endpoints = tmp_path / "pid", tmp_path / "endpoints.json"
    pidfile.write_text(f"{target}\n")
    endpoints.write_text(json.dumps({"run_id": "r", "nodes": [{"node_id": "n", "role": "merger", "pid": target}]}))
    values = {
        "--pid": [target] * count,
        "--pidfile": [pidfile] * count,
        "--endpoints": [endpoints] * count,
        "--pattern": [f"no-such-command-{i}" for i in range(count - 1)] + ["time.sleep"],
    }[option]
    out = run_agent(
        *[arg for v in values for arg in (option, v)],
        "--count",
        2,
        "--interval",
        0.05,
        "--sink",
        f"file://{tmp_path}/s.json?format=json",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    docs = [json.loads(x) for x in open(tmp_path / "s.json")]
    assert [d["pid"] for d in docs if d["pid"] == target] == [target, target]


@needs(AGENT)
def test_a_hundred_sinks_all_get_every_sample(tmp_path, target):
    sinks = [arg for i in range(100) for arg in ("--sink", f"file://{tmp_path}/s{i}.lp")]
    out = run_agent("--pid", target, "--count", 2, "--interval", 0.05, *sinks, "--stats", tmp_path / "stats.json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert [len(open(tmp_path / f"s{i}.lp").readlines()) for i in range(100)] == [2] * 100
    assert len(json.loads((tmp_path / "stats.json").read_text())["sinks"]) == 100


@needs(AGENT)
@pytest.mark.parametrize(
    "args,message",
    [
        (["--sink", "http://127.0.0.1:1/" + "w" * 520], "--sink: URL longer than the limit of 511 characters"),
        (["--sink", "file:///tmp/x.lp", "--sink", "file:///tmp/x.lp"], "--sink file:///tmp/x.lp: given twice"),
        (
            ["--sink", "file:///tmp/x.lp", "--spool-dir", "/tmp/" + "d" * 400],
            "--spool-dir: a path longer than the limit of 400 characters",
        ),
        (["--name", "n" * 161], "--name: longer than the limit of 160 characters"),
        (["--run-id", "r" * 128], "--run-id: longer than the limit of 127 characters"),
        (["--pid", "99999999999"], "--pid: bad process id"),
    ],
)
def test_options_past_their_limits_are_refused_clearly(args, message):
    out = run_agent("--pid", 1, *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_a_request_too_big_for_the_time_out_is_cut_down_until_it_goes(tmp_path, agent_command):
    """The sink refuses connections for 5 s (its port bound, not listening: the kernel refuses at once
    however loaded the machine, and a refusal says nothing of size), so about 100 batches wait in the
    spool; then it answers a request of more than 8 KB only after 1.5 s, past the agent's 1 s
    time-out (a store too busy for a big request). Sent together as they are, they would time out
    again and again: each time-out halves what goes together (64 KiB, 32, 16, 8, 4), until
    requests go, and every sample arrives."""

    def answer(path, body, n):
        if len(body) > 8000:
            time.sleep(1.5)  # the scenario: a request this big is answered after the agent gave up
        return 204, b""

    server = ScriptedHttp(answer, listening=False)
    threading.Timer(5, server.listen).start()  # the outage the test is about
    out, everything = one_sleeper_into(
        server,
        tmp_path,
        agent_command,
        *("--duration", 10, "--sink-timeout", 1, "--send-max-kb", 64, "--drain-timeout", 10),
        *("--spool-dir", tmp_path / "spool"),
    )
    assert sorted({seq_of(line) for line in server.lines()}) == list(range(everything["samples"]))
    sizes = [len(body) for _, body, _ in server.requests]
    assert max(sizes) > 8000, sizes  # what waited went together, past what the sink answers in time
    assert 1 <= sum(size > 8000 for size in sizes) <= 5, sizes  # timed out, then cut down


@pytest.mark.parametrize("kb", ["0.5", "2e6"])
def test_a_send_size_out_of_its_range_is_refused_naming_the_option(agent_command, kb):
    out = run_agent("--pid", 1, "--send-max-kb", kb, command=agent_command)
    assert out.returncode == 2, out.stderr
    assert "--send-max-kb: expected kibibytes between 1 and 1048576, got" in out.stderr, out.stderr
