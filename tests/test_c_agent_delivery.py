"""The agents' delivery: one thread per sink (a sink that hangs never delays sampling), the store
policy (HTTP statuses, InfluxDB partial writes, Elasticsearch per-document outcomes), the spool's
sink-url file; for the C agent also the queue's bound and options without silent limits. The
tests of behaviour both agents share run against each (`agent`: c, py). Real sockets on
127.0.0.1 throughout."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime

import pytest

from agent_helpers import HttpReceiver, ScriptedHttp, free_port, sleeper
from conftest import ROOT
from flowstat.agent.spool import folder_name

BUILD = ROOT / "collectors" / "c" / "build"
AGENT = BUILD / "flowstat-agent"
ASAN = BUILD / "flowstat-agent-asan"
HAS_VALGRIND = subprocess.run(["which", "valgrind"], capture_output=True).returncode == 0

c_only = pytest.mark.skipif(not AGENT.exists(), reason="run `make c-agent` (make test does)")
PYTHON_AGENT = [sys.executable, "-m", "flowstat.agent"]


@pytest.fixture(params=["c", "py"])
def agent_command(request) -> list[str]:
    """The command of an agent: both implement the same delivery."""
    if request.param == "c" and not AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    return [str(AGENT)] if request.param == "c" else PYTHON_AGENT


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
            except (socket.timeout, OSError):
                continue

    def close(self) -> None:
        self.running = False
        self.thread.join()
        for c in self.conns:
            c.close()
        self.sock.close()


def agent_cmd(*args, binary=AGENT, command=None) -> list[str]:
    """No self-samples: the delivery of node samples is what these tests count, item by item."""
    return [*(command or [str(binary)]), "--self-interval", "0", *map(str, args)]


def run_agent(*args, binary=AGENT, command=None, wrap=(), timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, *agent_cmd(*args, binary=binary, command=command)], capture_output=True, text=True,
                          timeout=timeout)


def seq_of(line: str) -> int:
    return int(line.split("seq=")[1].split("i")[0])


def stamps_by_node(path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for line in open(path):
        doc = json.loads(line)
        t = datetime.fromisoformat(doc["time"].replace("Z", "+00:00")).timestamp()
        out.setdefault(doc["node_id"], []).append(t)
    return out


def assert_on_schedule(path, interval: float) -> int:
    """Consecutive samples of each node at most about two intervals apart; returns their number."""
    nodes = stamps_by_node(path)
    assert nodes
    for node, stamps in nodes.items():
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        assert max(gaps) <= 2 * interval + 0.02, (node, max(gaps))
    return sum(len(s) for s in nodes.values())


def endpoints_file(tmp_path, pid: int, nodes=("a", "b", "c")):
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"run_id": "r", "nodes": [{"node_id": n, "role": "merger", "pid": pid} for n in nodes]}))
    return path


def sink_stats(stats_path, url: str) -> dict:
    return json.loads(stats_path.read_text())["sinks"][url]


# -- a sink that hangs does not delay sampling ---------------------------------------------------

def test_an_http_sink_that_never_answers_does_not_delay_sampling(tmp_path, agent_command):
    server = ScriptedHttp(hold=True)
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    samples, stats = tmp_path / "s.json", tmp_path / "stats.json"
    agent = subprocess.Popen(agent_cmd("--pid", proc.pid, "--interval", 0.1, "--duration", 5, "--quiet",
                                       "--sink", url, "--sink", f"file://{samples}?format=json",
                                       "--spool-dir", tmp_path / "spool", "--stats", stats, command=agent_command),
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.requests, "the agent never posted"
        time.sleep(3.0)  # held for 3 s: less than the agent's 5 s HTTP time-out
        sampled_while_held = len(open(samples).readlines())
        assert len(server.requests) == 1  # the sink thread waits for its answer
        server.release.set()
        assert agent.wait(30) == 0, agent.stderr.read()
    finally:
        proc.kill()
        agent.kill()
        server.close()
    assert sampled_while_held >= 25  # 3 s at 10 Hz went on meanwhile
    assert_on_schedule(samples, 0.1)
    everything = json.loads(stats.read_text())
    assert everything["skipped_rounds"] == 0
    seqs = sorted(seq_of(line) for line in server.lines())
    assert seqs == list(range(everything["samples"]))  # each sample once: no gap, no duplicate
    sink = everything["sinks"][url]
    assert sink["delivered"] == everything["samples"] and sink["lost"] == 0 and sink["spooled"] == 0
    assert sink["rejected"] == 0


@c_only
def test_a_tcp_sink_that_never_reads_does_not_delay_sampling(tmp_path):
    """500 targets in JSON at 10 Hz fill the agent's socket buffer (a few MB) in seconds; sampling
    goes on through the send time-out that follows, until the test stops the agent."""
    receiver = TcpNeverReads()
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(500)]
    url = f"tcp://127.0.0.1:{receiver.port}?format=json"
    samples, stats = tmp_path / "s.json", tmp_path / "stats.json"
    pids = [arg for p in procs for arg in ("--pid", p.pid)]
    agent = subprocess.Popen(agent_cmd(*pids, "--interval", 0.1, "--sink", url, "--drain-timeout", 0, "--quiet",
                                       "--sink", f"file://{samples}?format=json", "--spool-dir", tmp_path / "spool",
                                       "--stats", stats), stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    blocked = threading.Event()

    def read_log():
        for line in agent.stderr:
            log.append(line)
            if "timed out: the receiver does not read" in line:
                blocked.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        assert blocked.wait(60), "the socket buffer never filled:\n" + "".join(log)
        time.sleep(1.0)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == 0, "".join(log)
    finally:
        agent.kill()
        for p in procs:
            p.kill()
            p.wait()
        receiver.close()
    reader.join(10)
    assert_on_schedule(samples, 0.1)  # through the 3 s the sink thread waited in send()
    everything = json.loads(stats.read_text())
    # a sampling loop blocked in the 3 s send would skip 30 rounds; a busy machine (the other test
    # worker) may cost one or two
    assert everything["skipped_rounds"] <= 2 and everything["rounds"] >= 40
    sink = everything["sinks"][url]
    # every sample is accounted for: sent, or still waiting on disk (none lost: the spool is large enough)
    assert sink["lost"] == 0 and sink["spool_dropped"] == 0 and sink["spooled_samples"] > 0
    assert sink["delivered"] + sink["spooled_samples"] == everything["samples"]


@c_only
def test_a_full_queue_drops_its_oldest_batch_and_says_so(tmp_path):
    """The queue in front of a sink is bounded by --spool-max-mb too: past it the oldest batch goes,
    counted as lost and logged, and the agent exits non-zero."""
    server = ScriptedHttp(hold=True)
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats = tmp_path / "stats.json"
    agent = subprocess.Popen(agent_cmd("--pid", proc.pid, "--interval", 0.02, "--duration", 4, "--quiet",
                                       "--sink", url, "--spool-max-mb", 0.005, "--stats", stats),
                             stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        server.release.set()
        assert agent.wait(30) == 1
        log = agent.stderr.read()
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
    """A sink that answers each batch in 1 s: at exit, what is still queued gets 5 s (at least
    --drain-timeout) to go out, and the rest waits in the spool."""
    server = ScriptedHttp(lambda path, body, n: (time.sleep(1.0), (204, b""))[1])
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats = tmp_path / "stats.json"
    started = time.monotonic()
    try:
        out = run_agent("--pid", proc.pid, "--interval", 0.05, "--duration", 2, "--sink", url, "--quiet",
                        "--spool-dir", tmp_path / "spool", "--drain-timeout", 0, "--stats", stats, command=agent_command)
    finally:
        proc.kill()
        server.close()
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert took < 2 + 5 + 1 + 1.5, took  # 40 batches at 1 s each would take 40 s
    assert "too slow to take what was queued before the exit: the rest is spooled" in out.stderr
    everything = json.loads(stats.read_text())
    sink = everything["sinks"][url]
    assert 3 <= sink["delivered"] <= 9 and sink["lost"] == 0
    assert sink["delivered"] + sink["spooled_samples"] == everything["samples"]


# -- the store policy ----------------------------------------------------------------------------

def bulk_answer(seen: dict[str, int]):
    """Per document, by node: a stored (201), b refused (400), c refused for now (429) the first
    time its _id comes, stored the second."""

    def answer(path, body, n):
        assert path == "/_bulk"
        lines = body.decode().splitlines()
        items = []
        for action, doc in zip(lines[::2], lines[1::2]):
            _id, node = json.loads(action)["index"]["_id"], json.loads(doc)["node_id"]
            seen[_id] = seen.get(_id, 0) + 1
            item = {"_index": "flowstat", "_id": _id, "status": 201}
            if node == "b":
                item.update(status=400, error={"type": "mapper_parsing_exception",
                                               "reason": "failed to parse field [threads] of type [long]"})
            elif node == "c" and seen[_id] == 1:
                item.update(status=429, error={"type": "es_rejected_execution_exception", "reason": "queue full"})
            items.append({"index": item})
        errors = any(i["index"]["status"] >= 300 for i in items)
        return 200, json.dumps({"took": 1, "errors": errors, "items": items}).encode()

    return answer


@pytest.mark.parametrize("build", ["plain", "asan", "valgrind", "python"])
def test_elasticsearch_documents_are_settled_one_by_one(tmp_path, build):
    if build == "valgrind" and not HAS_VALGRIND:
        pytest.skip("no valgrind")
    if build != "python" and not AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    binary = ASAN if build == "asan" else AGENT
    wrap = ("valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=99",
            "--quiet") if build == "valgrind" else ()
    seen: dict[str, int] = {}
    server = ScriptedHttp(bulk_answer(seen))
    proc = sleeper()
    url = f"elasticsearch://127.0.0.1:{server.port}/flowstat"
    stats = tmp_path / "stats.json"
    try:
        out = run_agent("--endpoints", endpoints_file(tmp_path, proc.pid), "--count", 3, "--interval", 0.2,
                        "--sink", url, "--spool-dir", tmp_path / "spool", "--drain-timeout", 20, "--stats", stats,
                        binary=binary, command=PYTHON_AGENT if build == "python" else None, wrap=wrap, timeout=300)
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr
    by_node: dict[str, list[int]] = {}
    for _id, times in seen.items():
        by_node.setdefault(_id.split("/")[-2], []).append(times)
    assert by_node == {"a": [1] * 3, "b": [1] * 3, "c": [2] * 3}  # only c's documents come again
    resends = [b for b in server.bodies()[1:] if b'"node_id":"c"' in b and b'"node_id":"a"' not in b]
    assert resends and all(body.count(b"\n") % 2 == 0 for body in resends)
    assert "mapper_parsing_exception" in out.stderr  # the reason of the refusal is told
    sink = sink_stats(stats, url)
    assert sink == {"delivered": 6, "rejected": 3, "lost": 0, "spooled": 0, "spooled_samples": 0,
                    "spool_dropped": 0}


@pytest.mark.parametrize("scheme", ["influxdb", "http"])
def test_an_influxdb_partial_write_stores_the_rest_and_resends_nothing(tmp_path, scheme, agent_command):
    conflict = (b'{"error":"partial write: field type conflict: input field \\"threads\\" on measurement '
                b'\\"flowstat_node\\" is type float, already exists as type integer dropped=1"}')
    server = ScriptedHttp(lambda path, body, n: (400, conflict) if n == 0 else (204, b""))
    proc = sleeper()
    url = f"{scheme}://127.0.0.1:{server.port}/" + ("flowstat" if scheme == "influxdb" else "write")
    stats = tmp_path / "stats.json"
    try:
        out = run_agent("--endpoints", endpoints_file(tmp_path, proc.pid), "--count", 4, "--interval", 0.1,
                        "--sink", url, "--spool-dir", tmp_path / "spool", "--stats", stats, command=agent_command)
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr
    assert len(server.requests) == 4 and len(server.lines()) == 12  # four batches of three, none twice
    assert all(path.startswith("/write") for path, _, _ in server.requests)
    sink = sink_stats(stats, url)
    assert (sink["delivered"], sink["rejected"], sink["lost"], sink["spooled"]) == (11, 1, 0, 0)
    assert "partial write" in out.stderr


@pytest.mark.parametrize("status,down", [(408, True), (429, True), (500, True), (503, True), (400, False),
                                         (404, False), (413, False)])
def test_http_statuses_follow_the_store_policy(tmp_path, status, down, agent_command):
    """The first batch is answered `status`: down means sent again later, else refused for good."""
    server = ScriptedHttp(lambda path, body, n: (status, b'{"error":"scripted"}') if n == 0 else (204, b""))
    proc = sleeper()
    url = f"http://127.0.0.1:{server.port}/write"
    stats = tmp_path / "stats.json"
    try:
        out = run_agent("--pid", proc.pid, "--count", 3, "--interval", 0.1, "--sink", url, "--quiet",
                        "--spool-dir", tmp_path / "spool", "--drain-timeout", 10, "--stats", stats, command=agent_command)
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr
    seqs = [seq_of(line) for line in server.lines()]
    sink = sink_stats(stats, url)
    if down:
        assert seqs == [0, 0, 1, 2] and (sink["delivered"], sink["rejected"]) == (3, 0)
    else:
        assert seqs == [0, 1, 2] and (sink["delivered"], sink["rejected"]) == (2, 1)
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
        out = run_agent("--pid", proc.pid, "--count", 2, "--interval", 2.5, "--sink", url, "--quiet",
                        "--spool-dir", tmp_path / "spool", "--stats", stats, command=agent_command)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        proc.kill()
        server.close()
    assert out.returncode == 0, out.stderr
    assert [seq_of(line) for line in server.lines()] == [0, 0, 1]  # 0 refused on its resend
    sink = sink_stats(stats, url)
    assert (sink["delivered"], sink["rejected"], sink["lost"], sink["spooled"]) == (1, 1, 0, 0)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert cpu < 1.0, f"{cpu:.2f} s of CPU for 5 s of sampling one process: spinning"


# -- the spool names its sink --------------------------------------------------------------------

def test_each_spool_folder_names_its_sink_and_is_resent_by_the_next_agent(tmp_path, agent_command):
    port = free_port()  # nobody there yet
    proc = sleeper()
    http_url, file_url = f"http://127.0.0.1:{port}/write", f"file://{tmp_path}/{'samples-' * 12}.lp"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    common = ("--pid", proc.pid, "--interval", 0.05, "--sink", http_url, "--sink", file_url, "--spool-dir", spool,
              "--stats", stats, "--quiet")
    try:
        first = run_agent(*common, "--count", 3, "--drain-timeout", 0, command=agent_command)
        assert first.returncode == 0, first.stderr
        folders = {d.name: d for d in spool.iterdir()}
        # named as the Python agent names them
        assert set(folders) == {folder_name(url) for url in (http_url, file_url)}
        assert {(d / "sink-url").read_text() for d in folders.values()} == {http_url + "\n", file_url + "\n"}
        waiting = next(d for d in folders.values() if (d / "sink-url").read_text() == http_url + "\n")
        assert sorted(f.name.split("-")[1] for f in waiting.glob("*.batch")) == ["1.batch"] * 3
        assert sink_stats(stats, http_url)["spooled_samples"] == 3
        receiver = HttpReceiver(port)
        try:
            second = run_agent(*common, "--count", 2, command=agent_command)
        finally:
            receiver.stop()
        assert second.returncode == 0, second.stderr
        assert len(receiver.lines()) == 5  # three from the spool, then two new
        assert sink_stats(stats, http_url)["delivered"] == 5 and sink_stats(stats, http_url)["spooled"] == 0
        assert (waiting / "sink-url").read_text() == http_url + "\n" and not list(waiting.glob("*.batch"))
        (waiting / "sink-url").write_text("http://elsewhere:1/write\n")
        third = run_agent(*common, "--count", 1, command=agent_command)
        assert third.returncode == 2 and "holds the batches of another sink" in third.stderr
    finally:
        proc.kill()


# -- options without silent limits ---------------------------------------------------------------

@pytest.fixture
def target():
    proc = sleeper()
    yield proc.pid
    proc.kill()


@c_only
@pytest.mark.parametrize("option,count", [("--pid", 5000), ("--pidfile", 5000), ("--endpoints", 5000),
                                          ("--pattern", 300)])
def test_long_target_lists_are_all_taken(tmp_path, target, option, count):
    pidfile, endpoints = tmp_path / "pid", tmp_path / "endpoints.json"
    pidfile.write_text(f"{target}\n")
    endpoints.write_text(json.dumps({"run_id": "r", "nodes": [{"node_id": "n", "role": "merger", "pid": target}]}))
    values = {"--pid": [target] * count, "--pidfile": [pidfile] * count, "--endpoints": [endpoints] * count,
              "--pattern": [f"no-such-command-{i}" for i in range(count - 1)] + ["time.sleep"]}[option]
    out = run_agent(*[arg for v in values for arg in (option, v)], "--count", 2, "--interval", 0.05,
                    "--sink", f"file://{tmp_path}/s.json?format=json")
    assert out.returncode == 0, out.stderr[-2000:]
    docs = [json.loads(x) for x in open(tmp_path / "s.json")]
    assert [d["pid"] for d in docs if d["pid"] == target] == [target, target]


@c_only
def test_a_hundred_sinks_all_get_every_sample(tmp_path, target):
    sinks = [arg for i in range(100) for arg in ("--sink", f"file://{tmp_path}/s{i}.lp")]
    out = run_agent("--pid", target, "--count", 2, "--interval", 0.05, *sinks, "--stats", tmp_path / "stats.json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert [len(open(tmp_path / f"s{i}.lp").readlines()) for i in range(100)] == [2] * 100
    assert len(json.loads((tmp_path / "stats.json").read_text())["sinks"]) == 100


@c_only
@pytest.mark.parametrize("args,message", [
    (["--sink", "http://127.0.0.1:1/" + "w" * 520], "--sink: URL longer than the limit of 511 characters"),
    (["--sink", "file:///tmp/x.lp", "--sink", "file:///tmp/x.lp"], "--sink file:///tmp/x.lp: given twice"),
    (["--sink", "file:///tmp/x.lp", "--spool-dir", "/tmp/" + "d" * 400],
     "--spool-dir: a path longer than the limit of 400 characters"),
    (["--name", "n" * 161], "--name: longer than the limit of 160 characters"),
    (["--run-id", "r" * 128], "--run-id: longer than the limit of 127 characters"),
    (["--pid", "99999999999"], "--pid: bad process id"),
])
def test_options_past_their_limits_are_refused_clearly(args, message):
    out = run_agent("--pid", 1, *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
