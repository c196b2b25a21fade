"""Elasticsearch writers given every node of a cluster (elasticsearch://HOST:PORT,HOST:PORT/INDEX;
replay's --es http://HOST:PORT,HOST:PORT) fail over: both agents and replay, against the session's
real Elasticsearch listed behind a node that fails (tests/support/esnodes.py): a port that refuses
connections, a node that accepts and never answers, a node answering 503, and a node that stores a
batch and dies before it answers. Every sample is stored exactly once (counted by _id, seqs
unbroken) and counted delivered once; the failover is logged once; a node that failed is left alone
for --node-backoff, then asked again, and takes the batches again once it answers. A 4xx is not
failed over. The rule is flowstat.stores._base's (collectors/c/agent/sinks.h says the same)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from support.agents import agent_args, sleeper, wait_until
from support.common import C_AGENT, PYTHON_AGENT
from support.esnodes import ClosingNode, ProxyNode, RefusingPort, SilentNode, StatusNode
from support.runs import make_run_file

BACKOFF_S = 1.0  # --node-backoff in these tests: short, so that a node is asked again within a test
TIMEOUT_S = 1.0  # --sink-timeout: a node that never answers costs this much
RUN_FILE_T0_NS = 1_795_000_000 * 10**9  # support.runs.make_run_file's samples: 3 s from here


# -- reading the real node ------------------------------------------------------------------------


def es_docs(es, index: str) -> list[dict]:
    """Every document of INDEX* (the daily indices an agent writes): _id, _version, node_id, seq."""
    requests.post(f"{es.url}/{index}*/_refresh", timeout=30).raise_for_status()
    resp = requests.post(
        f"{es.url}/{index}*/_search",
        json={"size": 10000, "version": True, "_source": ["node_id", "seq"], "query": {"match_all": {}}},
        timeout=30,
    )
    if resp.status_code == 404:
        return []
    resp.raise_for_status()
    return [{"_id": h["_id"], "_version": h["_version"], **h["_source"]} for h in resp.json()["hits"]["hits"]]


def create_days(es, index: str, times_ns: list[int]) -> None:
    """Create the daily indices of these times beforehand, with the samples' whole mapping (as the
    stores' templates make them): creating an index, or a field of a dynamic mapping, takes a real
    node longer than the short --sink-timeout of these tests."""
    from flowstat.stores.elasticsearch import daily_index, templates

    mappings = templates()["component-flowstat-sample-mappings.json"]["template"]["mappings"]
    body = {"settings": {"number_of_shards": 1, "number_of_replicas": 0}, "mappings": mappings}
    for name in sorted({daily_index(index, ns) for ns in times_ns}):
        requests.put(f"{es.url}/{name}", json=body, timeout=60).raise_for_status()


def create_today(es, index: str) -> None:
    """The day an agent samples now, and the next one as well near midnight (UTC)."""
    now = time.time_ns()
    create_days(es, index, [now, now + 600 * 10**9])


def es_count(es, index: str) -> int:
    resp = requests.get(f"{es.url}/{index}*/_count", timeout=30)
    return resp.json().get("count", 0) if resp.status_code == 200 else 0


def bulk_ids(body: bytes) -> list[str]:
    """The _ids of a _bulk body's documents."""
    return [json.loads(line)["index"]["_id"] for line in body.decode().splitlines()[::2]]


def assert_each_once(docs: list[dict], samples: int, nodes: int) -> None:
    """``samples`` documents, one per (node, seq), each node's seqs unbroken from 0."""
    assert len(docs) == samples and len({d["_id"] for d in docs}) == samples
    by_node: dict[str, list[int]] = {}
    for d in docs:
        by_node.setdefault(d["node_id"], []).append(d["seq"])
    assert len(by_node) == nodes
    for seqs in by_node.values():
        assert sorted(seqs) == list(range(len(seqs)))


def failover_lines(log: str, bad: str, good: str, backoff_s: float = BACKOFF_S) -> list[str]:
    return re.findall(
        rf"Elasticsearch at \S+: {re.escape(bad)} failed \([^\n]*\); batches go to {re.escape(good)} now \(a node "
        rf"that fails is left alone for {backoff_s:g} s\)",
        log,
    )


# -- the agents -----------------------------------------------------------------------------------

C_AGENT_ASAN = Path(str(C_AGENT) + "-asan")  # AddressSanitizer + leak check: exits non-zero on an error
AGENTS = {"c": [str(C_AGENT)], "py": PYTHON_AGENT, "c-asan": [str(C_AGENT_ASAN)]}
WITH_ASAN = pytest.mark.parametrize("agent", ["c", "py", "c-asan"], indirect=True)  # the C agent's new code too


@pytest.fixture(params=["c", "py"])
def agent(request) -> str:
    if request.param == "c" and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    if request.param == "c-asan" and not C_AGENT_ASAN.exists():
        pytest.skip("run `make -C collectors/c asan`")
    return request.param


class Agent:
    """An agent sampling two sleepers every 50 ms into ``sink``, its log in a file, until stop().
    With a spool: a real node slower than the short --sink-timeout now and then (a loaded machine)
    loses nothing, and the batch goes again under the same _ids."""

    def __init__(self, agent: str, sink: str, tmp_path: Path, *extra: str, **options) -> None:
        self.targets = [sleeper(), sleeper()]
        self.stats, self.log = tmp_path / "stats.json", tmp_path / "agent.log"
        args = agent_args(
            [p.pid for p in self.targets],
            **{
                "run_id": "failover",
                "interval": 0.05,
                "self_interval": 0,
                "sink": sink,
                "sink_timeout": TIMEOUT_S,
                "node_backoff": BACKOFF_S,
                "stats": self.stats,
                "spool_dir": tmp_path / "spool",
                "quiet": True,
                **options,
            },
        )
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([*AGENTS[agent], *args, *extra], stderr=log)

    def stop(self) -> tuple[dict, str]:
        """SIGTERM, the exit (0: nothing lost), its stats and log."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        for p in self.targets:
            p.kill()
        log = self.log.read_text()
        assert code == 0, log
        stats = json.loads(self.stats.read_text())
        return stats, log

    def kill(self) -> None:
        for p in (self.proc, *self.targets):
            p.kill()


def only_sink(stats: dict) -> dict:
    (sink,) = stats["sinks"].values()
    return sink


def index_name(es, agent: str) -> str:
    """A fresh index (its daily indices made: see create_today)."""
    index = f"flowstat-test-failover-{agent}-{uuid.uuid4().hex[:8]}"
    create_today(es, index)
    return index


@pytest.mark.parametrize("also_refusing", [0, 1], ids=["two-nodes", "three-nodes"])
def test_an_agent_fails_over_past_a_port_that_refuses_and_goes_back_to_it_once_it_answers(
    stack, agent, tmp_path, also_refusing
):
    """[refusing port, (refusing port,) real node]: the batches go to the real node at once, said
    and counted once; the first port comes up as a node (passing on to the real one): after its
    rest it is asked again, and from then on every batch goes to it, the first listed, said once
    too — a return, not counted as a failover, although the second port (three nodes), never asked
    since, still failed when last asked."""
    es, first = stack["elasticsearch"], RefusingPort()
    others = [RefusingPort() for _ in range(also_refusing)]
    index = index_name(es, agent)
    real = f"127.0.0.1:{es.port}"
    nodes = ",".join(f"127.0.0.1:{p.port}" for p in (first, *others))
    run = Agent(agent, f"elasticsearch://{nodes},{real}/{index}", tmp_path)
    try:
        wait_until(lambda: es_count(es, index) >= 20, "20 samples stored through the real node", timeout=30)
        node = first.come_up(es.url)
        wait_until(lambda: len(node.bulks()) >= 3, "three batches through the first node, back", timeout=30)
        stats, log = run.stop()
    finally:
        run.kill()
        for port in (first, *others):
            port.close()
    docs = es_docs(es, index)
    assert_each_once(docs, stats["samples"], nodes=2)
    assert only_sink(stats)["delivered"] == stats["samples"] and only_sink(stats)["refused"] == 0
    assert len(re.findall(r" failed \(", log)) == 1, log
    if not others:
        assert len(failover_lines(log, f"127.0.0.1:{first.port}", real)) == 1, log
    assert only_sink(stats)["failovers"] == 1  # the move away; the first node's return is not one
    assert len(re.findall(rf"127\.0\.0\.1:{first.port} answers again; batches go to it now", log)) == 1, log
    # Once back, the first node took every batch: the samples that came through it are, per node,
    # every seq from the first it took on.
    via_first = [json.loads(line) for body, _ in node.bulks() for line in body.decode().splitlines()[1::2]]
    for target in {d["node_id"] for d in docs}:
        seqs = sorted(d["seq"] for d in via_first if d["node_id"] == target)
        last = max(d["seq"] for d in docs if d["node_id"] == target)
        assert seqs == list(range(seqs[0], last + 1)) and seqs[0] > 0


@WITH_ASAN
@pytest.mark.parametrize("failing", ["silent", "503"])
def test_an_agent_fails_over_past_a_node_that_hangs_or_answers_503_and_asks_it_again_after_its_rest(
    stack, agent, tmp_path, failing
):
    """[node that never answers / answers 503, real node]: each batch is stored once through the
    real node; the failing node is asked again only once it has rested --node-backoff (not at each
    batch), fails again, and that is not logged again."""
    es = stack["elasticsearch"]
    bad = SilentNode() if failing == "silent" else StatusNode(503)
    index = index_name(es, agent)
    real = f"127.0.0.1:{es.port}"
    attempts = bad.times if failing == "silent" else lambda: [at for _, at in bad.bulks()]
    run = Agent(agent, f"elasticsearch://127.0.0.1:{bad.port},{real}/{index}", tmp_path)
    try:
        asks = 2 if failing == "silent" else 3  # a silent node costs the time-out each time
        wait_until(lambda: len(attempts()) >= asks, f"the failing node asked {asks} times", timeout=30)
        stats, log = run.stop()
    finally:
        run.kill()
        bad.close()
    times = attempts()
    assert all(later - earlier >= BACKOFF_S for earlier, later in zip(times, times[1:], strict=False)), times
    docs = es_docs(es, index)
    assert_each_once(docs, stats["samples"], nodes=2)
    assert stats["samples"] > 4 * len(times)  # many more batches than asks of the failing node
    assert only_sink(stats)["delivered"] == stats["samples"] and only_sink(stats)["refused"] == 0
    assert len(failover_lines(log, f"127.0.0.1:{bad.port}", real)) == 1, log
    assert "answers again" not in log, log
    if failing == "503":  # what it was sent is stored once, through the other node
        ids = {d["_id"] for d in docs}
        assert all(i in ids for body, _ in bad.bulks() for i in bulk_ids(body))


@WITH_ASAN
def test_a_batch_a_node_stored_before_it_died_is_stored_once_and_counted_once(stack, agent, tmp_path):
    """[node that stores the first batch and dies before answering, real node]: the batch goes
    again through the real node under the same _ids, overwriting (its documents are at _version 2,
    every other at 1): no duplicate, delivered counted once."""
    es = stack["elasticsearch"]
    index = index_name(es, agent)
    dying = ProxyNode(es.url, dies_after=lambda n: n == 0)
    run = Agent(
        agent,
        f"elasticsearch://127.0.0.1:{dying.port},127.0.0.1:{es.port}/{index}",
        tmp_path,
        count=20,
        node_backoff=60,  # the dead node is not asked again in this run
    )
    try:
        assert run.proc.wait(60) == 0, run.log.read_text()
        stats, log = run.stop()
    finally:
        run.kill()
        dying.close()
    assert len(dying.dropped) == 1 and dying.bulk_count == 1  # stored once there, then left alone
    twice = set(bulk_ids(dying.dropped[0]))
    docs = es_docs(es, index)
    assert_each_once(docs, stats["samples"], nodes=2)
    assert stats["samples"] == 40 and len(twice) >= 2
    assert {d["_id"] for d in docs if d["_version"] == 2} == twice
    assert all(d["_version"] == 1 for d in docs if d["_id"] not in twice)
    assert only_sink(stats)["delivered"] == 40 and only_sink(stats)["refused"] == 0
    assert len(failover_lines(log, f"127.0.0.1:{dying.port}", f"127.0.0.1:{es.port}", 60)) == 1, log


def test_an_agent_whose_nodes_all_fail_spools_and_delivers_everything_once_one_comes_up(stack, agent, tmp_path):
    """[refusing port, refusing port]: the sink is down as with one node (said once, naming both),
    the batches wait in the spool; the second comes up, and all of them are stored once."""
    es, ports = stack["elasticsearch"], [RefusingPort(), RefusingPort()]
    index = index_name(es, agent)
    run = Agent(
        agent,
        f"elasticsearch://127.0.0.1:{ports[0].port},127.0.0.1:{ports[1].port}/{index}",
        tmp_path,
    )
    try:
        wait_until(
            lambda: sum(int(f.stem.split("-")[1]) for f in (tmp_path / "spool").rglob("*.batch")) >= 20,
            "20 samples spooled while both nodes refuse",
            timeout=30,
        )
        node = ports[1].come_up(es.url)
        wait_until(lambda: es_count(es, index) >= 30, "the spooled samples stored through the second node")
        stats, log = run.stop()
    finally:
        run.kill()
        for p in ports:
            p.close()
    assert_each_once(es_docs(es, index), stats["samples"], nodes=2)
    assert only_sink(stats)["delivered"] == stats["samples"] and only_sink(stats)["spooled"] == 0
    down = re.findall(r"is down \((?:Elasticsearch at \S+: )?no node answers \(([^\n]*)\)\)", log)
    assert len(down) == 1 and f"127.0.0.1:{ports[0].port}" in down[0] and f"127.0.0.1:{ports[1].port}" in down[0], log
    assert len(re.findall(r"is back", log)) == 1, log
    assert len(node.bulks()) >= 1


def test_a_failover_is_said_even_when_the_next_node_answers_after_the_failed_ones_rest(stack, agent, tmp_path):
    """[refusing port, slow node]: the second node answers the first batch after the first one's
    rest is over (a loaded machine, or a busy node): the move is still said, naming the node
    that failed, once."""
    es, first = stack["elasticsearch"], RefusingPort()
    slow = ProxyNode(es.url, delay_s=BACKOFF_S * 1.5)
    index = index_name(es, agent)
    run = Agent(
        agent,
        f"elasticsearch://127.0.0.1:{first.port},127.0.0.1:{slow.port}/{index}",
        tmp_path,
        count=3,
        sink_timeout=BACKOFF_S * 5,
    )
    try:
        assert run.proc.wait(60) == 0, run.log.read_text()
        stats, log = run.stop()
    finally:
        run.kill()
        first.close()
        slow.close()
    assert only_sink(stats)["delivered"] == stats["samples"] == 6, log
    assert len(failover_lines(log, f"127.0.0.1:{first.port}", f"127.0.0.1:{slow.port}")) == 1, log


def test_an_agent_does_not_fail_over_a_batch_refused_with_a_4xx(stack, agent, tmp_path):
    """[node answering 400, real node]: a 4xx is the data's fault, not the node's: refused, counted
    refused, and not sent to the next node."""
    es, refusing = stack["elasticsearch"], StatusNode(400)
    index = index_name(es, agent)
    run = Agent(agent, f"elasticsearch://127.0.0.1:{refusing.port},127.0.0.1:{es.port}/{index}", tmp_path, count=5)
    try:
        assert run.proc.wait(60) == 0, run.log.read_text()
        stats, log = run.stop()
    finally:
        run.kill()
        refusing.close()
    assert only_sink(stats)["refused"] == stats["samples"] == 10 and only_sink(stats)["delivered"] == 0
    assert sum(len(bulk_ids(body)) for body, _ in refusing.bulks()) == 10
    assert es_count(es, index) == 0 and "failed" not in log


def test_every_node_of_a_secured_cluster_is_asked_with_the_same_credentials_and_ca(secured_stack, agent, tmp_path):
    """elasticsearch+https:// with a node first that closes each connection at once (killed as the
    agent connects: the TLS handshake ends in an EOF, a node's failure, not an untrusted
    certificate): the real node is reached over TLS with the CA file and the agent's user of the
    environment, and the samples are stored once."""
    stack = secured_stack
    first = ClosingNode()
    user, password = stack.es_user("agent")
    host = stack.es_url.split("://")[1]
    run_id = f"secured-failover-{agent}-{uuid.uuid4().hex[:8]}"
    env = {
        "FLOWSTAT_ES_USER": user,
        "FLOWSTAT_ES_PASSWORD": password,
        "FLOWSTAT_ES_CA_FILE": str(stack.ca_file),
        **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "PYTHONPATH")},
    }
    proc = sleeper()
    try:
        out = subprocess.run(
            [
                *AGENTS[agent],
                *agent_args(
                    proc.pid,
                    run_id=run_id,
                    interval=0.05,
                    count=5,
                    self_interval=0,
                    sink=f"elasticsearch+https://127.0.0.1:{first.port},{host}/flowstat-samples",
                    node_backoff=BACKOFF_S,
                    quiet=True,
                ),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        proc.kill()
        first.close()
    assert out.returncode == 0, out.stderr
    assert len(failover_lines(out.stderr, f"127.0.0.1:{first.port}", host)) == 1, out.stderr
    stack.es("POST", "/flowstat-samples*/_refresh", "elastic")
    hits = stack.es(
        "POST",
        "/flowstat-samples*/_search",
        "elastic",
        json={"size": 100, "query": {"term": {"run_id": run_id}}, "_source": ["seq"]},
    ).json()["hits"]["hits"]
    assert sorted(h["_source"]["seq"] for h in hits) == list(range(5))


# -- the sink URL ---------------------------------------------------------------------------------

ONE_NODE = "takes one HOST:PORT, not a list (elasticsearch:// takes a list of nodes)"


@WITH_ASAN
@pytest.mark.parametrize(
    "url,message",
    [
        ("elasticsearch://h1:9200,h2:99999/i", "//h1:9200,h2:99999/i: node 2 of 2 ('h2:99999'): bad port"),
        ("elasticsearch://h1:9200,,h2/i", "elasticsearch://h1:9200,,h2/i: node 2 of 3 is empty"),
        ("elasticsearch://h1:9200,h1/i", "elasticsearch://h1:9200,h1/i: node 2 of 2 ('h1'): given twice"),
        ("elasticsearch://h1,:9201/i", "elasticsearch://h1,:9201/i: node 2 of 2 (':9201'): needs HOST:PORT"),
        ("elasticsearch://h 1,h2/i", "elasticsearch://h 1,h2/i: node 1 of 2 ('h 1'): bad host"),
        ("elasticsearch://" + ",".join(f"h{i}" for i in range(17)) + "/i", ": more than 16 nodes"),
        ("influxdb://h1:8086,h2:8086/db", f"influxdb://h1:8086,h2:8086/db: {ONE_NODE}"),
        ("tcp://h1:1,h2:2", f"tcp://h1:1,h2:2: {ONE_NODE}"),
        ("elasticsearch+https://h1:9200,u:p@h2/i", "--sink elasticsearch+https://***@h2/i: a user or password"),
    ],
)
def test_a_bad_list_of_nodes_is_refused_naming_the_url_and_the_node(agent, url, message):
    """Both agents check every HOST:PORT of the list and say the same; a password is refused
    wherever in the list it is, and not shown."""
    out = subprocess.run(
        [*AGENTS[agent], "--pid", "1", "--count", "1", "--sink", url], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert ":p@" not in out.stderr


# -- replay -----------------------------------------------------------------------------------------


def replay(path: Path, es_url: str, index: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "replay",
            str(path),
            "--es",
            es_url,
            "--index",
            index,
            "--batch",
            "50",
            "--timeout",
            str(TIMEOUT_S),
            "--node-backoff",
            str(BACKOFF_S * 30),  # the whole replay: a node that failed is not asked again
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("failing", ["refusing", "silent", "503"])
def test_replay_fails_over_once_and_stores_every_sample_once(stack, tmp_path, failing):
    """replay --es http://BAD,REAL: 300 samples in batches of 50, each stored once through the real
    node; the failing node was asked once by the check and once by the writer, then left alone;
    the failover said once."""
    es = stack["elasticsearch"]
    bad = {"refusing": RefusingPort, "silent": SilentNode, "503": lambda: StatusNode(503)}[failing]()
    real = ProxyNode(es.url, client_timeout_s=TIMEOUT_S)  # one slower than --timeout fails too
    index = f"flowstat-test-replay-failover-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "samples.ndjson"
    make_run_file(path, f"replay-failover-{uuid.uuid4().hex[:8]}", 300)
    create_days(es, index, [RUN_FILE_T0_NS])
    try:
        out = replay(path, f"http://127.0.0.1:{bad.port},127.0.0.1:{real.port}", index)
        assert out.returncode == 0, out.stderr
        wait_until(lambda: real.in_flight() == 0, "the answers replay gave up on", timeout=40)  # counted in late
    finally:
        bad.close()
        real.close()
    assert_each_once(es_docs(es, index), 300, nodes=10)
    lines = re.findall(
        rf"Elasticsearch at \S+: 127\.0\.0\.1:{bad.port} failed \([^\n]*\); batches go to 127\.0\.0\.1:{real.port} now",
        out.stderr,
    )
    assert len(lines) == 1, out.stderr
    # The check, then the writer's first batch; then never again while the real node answers in
    # time. A loaded machine may make the real node slower than --timeout: with both resting, the
    # one whose rest ends first is asked alone (the failing one), once per such failure.
    late = real.late
    if failing == "silent":
        assert 2 <= len(bad.times()) <= 2 + late, (bad.times(), late)
    elif failing == "503":
        asked = [(method, path.split("?")[0]) for method, path, _, _ in bad.requests]
        assert asked[:2] == [("GET", "/_cluster/health"), ("POST", "/_bulk")] and len(asked) <= 2 + late, (asked, late)


class Pauses:
    """Stops the real Elasticsearch (SIGSTOP to its process group) for ``seconds`` when ``when(method,
    path)`` first holds for a request on its way to it, once per name: a node that answers nothing
    for a while, as on a loaded machine. Every pause is ended (SIGCONT) by ``close``, whatever happened."""

    def __init__(self, pid: int, seconds: float, when: dict) -> None:
        self.pid, self.seconds, self.when = pid, seconds, when
        self.lock = threading.Lock()
        self.done: list[str] = []
        self.timers: list[threading.Timer] = []

    def __call__(self, method: str, path: str) -> None:
        with self.lock:
            name = next((n for n, test in self.when.items() if n not in self.done and test(method, path)), None)
            if name is None:
                return
            self.done.append(name)
            os.killpg(self.pid, signal.SIGSTOP)
            timer = threading.Timer(self.seconds, os.killpg, (self.pid, signal.SIGCONT))
            self.timers.append(timer)
            timer.start()

    def close(self) -> None:
        for timer in self.timers:
            timer.cancel()
        os.killpg(self.pid, signal.SIGCONT)


def test_replay_and_its_rollup_outlast_an_elasticsearch_that_stops_answering_for_seconds(own_stack, tmp_path):
    """The real Elasticsearch stopped for 3 s (SIGSTOP, then SIGCONT) as replay sends its third batch,
    and again at its roll-up's first search, with requests that wait 1 s for an answer: each is asked
    again until it is answered (the store did the first one too, once it went on); replay exits 0,
    every sample stored once and rolled up once."""
    from flowstat.stores.elasticsearch_rollup import rollup_index

    es = own_stack["elasticsearch"]
    index = f"flowstat-test-replay-paused-{uuid.uuid4().hex[:8]}"
    path = tmp_path / "samples.ndjson"
    make_run_file(path, f"replay-paused-{uuid.uuid4().hex[:8]}", 300)
    create_days(es, index, [RUN_FILE_T0_NS])
    bulks = []
    pauses = Pauses(
        es.pid(),
        3 * TIMEOUT_S,
        {
            "third batch": lambda method, path: path.startswith("/_bulk") and len(bulks) == 2,
            "roll-up": lambda method, path: "/_search" in path and path.startswith(f"/{index}-"),
        },
    )

    def before(method: str, path: str) -> None:
        pauses(method, path)
        if path.startswith("/_bulk"):
            bulks.append(path)

    proxy = ProxyNode(es.url, before=before)
    try:
        out = replay(path, f"http://127.0.0.1:{proxy.port}", index)
    finally:
        pauses.close()
        proxy.close()
    assert out.returncode == 0, out.stderr
    assert pauses.done == ["third batch", "roll-up"]
    bodies = [body for body, _ in proxy.bulks()]
    assert bodies.count(bodies[2]) >= 2  # the paused batch went again: the store did both, one document
    searches = [(p, body) for _, p, body, _ in proxy.requests if "/_search" in p and p.startswith(f"/{index}-")]
    assert searches.count(searches[0]) >= 2  # and the paused search too
    assert_each_once(es_docs(es, index), 300, nodes=10)
    rolled = rollup_docs(es, rollup_index(index))
    assert sum(d["samples"] for d in rolled) == 300 and len({d["node_id"] for d in rolled}) == 10


def rollup_docs(es, index: str) -> list[dict]:
    requests.post(f"{es.url}/{index}-*/_refresh", timeout=30).raise_for_status()
    resp = requests.post(f"{es.url}/{index}-*/_search", json={"size": 10000}, timeout=30)
    resp.raise_for_status()
    return [h["_source"] for h in resp.json()["hits"]["hits"]]


# -- the writer itself (replay's, the Python agent's) -------------------------------------------


def test_a_writer_leaves_a_failed_node_alone_for_its_backoff_then_asks_it_again(stack, caplog):
    """ElasticsearchWriter(http://503,REAL, node_backoff_s=3): the first batch fails over (said once);
    the second skips the failed node; once it has rested, the third asks it first again, fails
    over again, and that is not said again."""
    from flowstat.schema import sample as sample_schema
    from flowstat.stores.elasticsearch import ElasticsearchWriter

    es, bad = stack["elasticsearch"], StatusNode(503)
    index = f"flowstat-test-writer-failover-{uuid.uuid4().hex[:8]}"
    create_days(es, index, [sample_schema.time_ns("2026-11-26T10:00:00.000Z")])
    writer = ElasticsearchWriter(
        f"http://127.0.0.1:{bad.port},127.0.0.1:{es.port}", index, timeout_s=5, node_backoff_s=3
    )

    def batch(seq: int) -> bytes:
        doc = {
            "time": "2026-11-26T10:00:00.000Z",
            "run_id": "writer-failover",
            "host": "h",
            "node_id": "n",
            "role": "merger",
            "agent": "flowstat-agent-py",
            "seq": seq,
            "pid": 1,
            "node_state": "RUNNING",
        }
        assert sample_schema.validate(doc) == []
        return writer.encode([doc])

    try:
        with caplog.at_level(logging.WARNING, logger="flowstat.stores"):
            assert writer.post(batch(0), 1).accepted == 1
            assert len(bad.bulks()) == 1 and writer.nodes[0].resting_until > time.monotonic()
            assert writer.post(batch(1), 1).accepted == 1
            assert len(bad.bulks()) == 1  # resting: not asked
            wait_until(lambda: writer.nodes[0].resting_until <= time.monotonic(), "the failed node's rest to end")
            assert writer.post(batch(2), 1).accepted == 1
            assert len(bad.bulks()) == 2  # asked again first, failed again
    finally:
        writer.close()
        bad.close()
    assert writer.failovers == 1 and writer.serving is writer.nodes[1]
    said = [r.getMessage() for r in caplog.records if "batches go to" in r.getMessage()]
    assert said == [
        f"Elasticsearch at http://127.0.0.1:{bad.port},127.0.0.1:{es.port}: 127.0.0.1:{bad.port} failed (HTTP 503 "
        + bad_reason()
        + f"); batches go to 127.0.0.1:{es.port} now (a node that fails is left alone for 3 s)"
    ]
    assert_each_once(es_docs(es, index), 3, nodes=1)


def bad_reason() -> str:
    return (
        '{"error":{"type":"cluster_block_exception","reason":"blocked by: [SERVICE_UNAVAILABLE/1/state not '
        'recovered / initialized];"},"status":503}'
    )


@pytest.mark.parametrize("status", [400, 401, 429, 500])
def test_a_writer_does_not_fail_over_a_4xx_a_429_or_a_500(stack, status):
    """Those are the store's answers, not a node's failure: the next node is not asked."""
    from flowstat.stores import StoreDown
    from flowstat.stores.elasticsearch import ElasticsearchWriter

    es, node = stack["elasticsearch"], StatusNode(status)
    index = f"flowstat-test-writer-nofailover-{uuid.uuid4().hex[:8]}"
    writer = ElasticsearchWriter(f"http://127.0.0.1:{node.port},127.0.0.1:{es.port}", index, timeout_s=5)
    body = b'{"index":{"_index":"%s-2026.11.26","_id":"x"}}\n{"seq":1}\n' % index.encode()
    try:
        if status == 400:
            assert writer.post(body, 1).refused == 1
        else:
            with pytest.raises(StoreDown):
                writer.post(body, 1)
    finally:
        writer.close()
        node.close()
    assert len(node.bulks()) == 1 and writer.failovers == 0 and writer.nodes[0].resting_until == 0
    assert es_count(es, index) == 0


def test_a_writer_whose_nodes_all_fail_is_down_naming_each():
    from flowstat.stores import StoreDown
    from flowstat.stores.elasticsearch import ElasticsearchWriter

    refusing, busy = RefusingPort(), StatusNode(503)
    writer = ElasticsearchWriter(f"http://127.0.0.1:{refusing.port},127.0.0.1:{busy.port}", "i", timeout_s=5)
    try:
        with pytest.raises(StoreDown) as down:
            writer.post(b"{}\n{}\n", 1)
        assert len(busy.bulks()) == 1
        # both rest now: the one whose rest ends first (the refusing port) is asked, alone
        with pytest.raises(StoreDown):
            writer.post(b"{}\n{}\n", 1)
        assert len(busy.bulks()) == 1
    finally:
        writer.close()
        refusing.close()
        busy.close()
    assert str(down.value).startswith(
        f"Elasticsearch at http://127.0.0.1:{refusing.port},127.0.0.1:{busy.port}: no node answers (127.0.0.1:"
        f"{refusing.port} cannot be reached (ConnectionError); 127.0.0.1:{busy.port}: HTTP 503 "
    )


def test_only_elasticsearch_takes_a_list_of_nodes():
    from flowstat.stores import StoreURLError
    from flowstat.stores.influxdb import InfluxDBWriter

    with pytest.raises(StoreURLError, match=r"^http://h1:8086,h2:8086: InfluxDB takes one node, not a list$"):
        InfluxDBWriter("http://h1:8086,h2:8086")
