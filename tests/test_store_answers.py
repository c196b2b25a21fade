"""The Python agent's store sinks (influxdb://, elasticsearch://) and `flowstat replay`, against a
scripted store that answers a write as a whole with 400, 429 or 503, or a _bulk with 200 and
per-document errors (429 es_rejected_execution_exception: again later; 400
mapper_parsing_exception: refused). What is sent again, and then stored once; what is refused, and
where that is told (--stats, the output, the exit status); what waits in the spool.

The http:// sink's statuses, the InfluxDB partial write and the agents' own per-document _bulk
policy are in test_c_agent_delivery.py; the store writers against the real servers in test_stores.py."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from support.agents import ScriptedHttp, endpoints_file, run_agent, sink_stats, sleeper
from support.common import PYTHON_AGENT
from support.runs import make_run_file

NOT_NOW = {
    "elasticsearch": b'{"error":{"type":"es_rejected_execution_exception","reason":"scripted"},"status":429}',
    "influxdb": b'{"error":"scripted"}',
}
OK = {"elasticsearch": (200, b'{"took":1,"errors":false,"items":[]}'), "influxdb": (204, b"")}


def items(body: bytes) -> list[tuple]:
    """A write's samples, each as (node_id, seq), from line protocol or a _bulk body (run
    documents and self-samples left out)."""
    text = body.decode()
    if text.startswith('{"index"'):
        docs = [json.loads(x) for x in text.splitlines()[1::2]]
        return [(d["node_id"], d["seq"]) for d in docs if "node_id" in d]
    out = []
    for line in text.splitlines():
        if line.startswith("flowstat_node,"):
            tags = dict(t.split("=", 1) for t in line.split(" ", 1)[0].split(",")[1:])
            out.append((tags["node_id"], int(line.split("seq=")[1].split("i")[0])))
    return out


class Store:
    """A scripted InfluxDB or Elasticsearch: the n-th write (from 0) answered `status_of(n)` as a
    whole; rollup queries answered as InfluxDB does. Keeps what it stored (the writes it took)."""

    def __init__(self, kind: str, status_of=lambda n: None):
        self.kind, self.status_of = kind, status_of
        self.stored: list[tuple] = []
        self.writes = itertools.count()
        self.http = ScriptedHttp(self.answer)
        self.port = self.http.port

    def answer(self, path: str, body: bytes, _):
        if path.startswith("/query"):
            return 200, b'{"results":[{"statement_id":0}]}'
        status = self.status_of(next(self.writes))
        if status is None:
            self.stored += items(body)
            return OK[self.kind]
        return status, NOT_NOW[self.kind] if status != 400 else b'{"error":"scripted refusal"}'

    def sample_writes(self) -> list[bytes]:
        return [b for b in self.http.bodies() if items(b)]

    def close(self) -> None:
        self.http.close()


class BulkStore(Store):
    """A scripted Elasticsearch answering each _bulk 200, document by document: `refuse`'s
    documents 400 (mapper_parsing_exception), `busy`'s 429 (es_rejected_execution_exception) the
    first time each comes, the rest stored."""

    def __init__(self, refuse: str, busy: str):
        self.refuse, self.busy = refuse, busy
        self.seen: dict[str, int] = {}
        super().__init__("elasticsearch")

    def answer(self, path: str, body: bytes, _):
        if path.endswith("/_refresh") or "/_search" in path:  # replay's rollup, once loaded: no index here
            return 200, b'{"_shards":{"total":0,"successful":0,"failed":0},"hits":{"hits":[]}}'
        assert path == "/_bulk"
        lines = body.decode().splitlines()
        out = []
        for action, doc in zip(lines[::2], lines[1::2], strict=False):
            _id, doc = json.loads(action)["index"]["_id"], json.loads(doc)
            self.seen[_id] = self.seen.get(_id, 0) + 1
            node = doc.get("node_id")
            item = {"_index": "flowstat", "_id": _id, "status": 201}
            if node == self.refuse:
                item.update(
                    status=400,
                    error={
                        "type": "mapper_parsing_exception",
                        "reason": "failed to parse field [threads] of type [long]",
                    },
                )
            elif node == self.busy and self.seen[_id] == 1:
                item.update(status=429, error={"type": "es_rejected_execution_exception", "reason": "queue full"})
            elif node is not None:
                self.stored.append((node, doc["seq"]))
            out.append({"index": item})
        return 200, json.dumps(
            {"took": 1, "errors": any(i["index"]["status"] >= 300 for i in out), "items": out}
        ).encode()

    def times_sent(self) -> dict[str, list[int]]:
        """How often each node's samples came, by node (a sample's _id is RUN/AGENT/NODE/SEQ)."""
        by_node: dict[str, list[int]] = {}
        for _id, n in sorted(self.seen.items()):
            if _id.count("/") == 3:
                by_node.setdefault(_id.split("/")[2], []).append(n)
        return by_node


def sink_url(kind: str, port: int) -> str:
    return f"{kind}://127.0.0.1:{port}/flowstat"


def every(nodes, seqs) -> list[tuple]:
    return sorted((node, seq) for node in nodes for seq in seqs)


# -- the Python agent's store sinks ------------------------------------------------------------


def agent_into(store: Store, tmp_path, *extra) -> tuple[subprocess.CompletedProcess, dict]:
    """Three rounds of three nodes (a, b, c) into the store: a batch of three a round, a request each
    (--send-max-kb 1, less than two batches: rounds queued behind a slow delivery on a loaded
    machine still go one by one)."""
    proc = sleeper()
    url = sink_url(store.kind, store.port)
    stats = tmp_path / "stats.json"
    try:
        out = run_agent(
            "--endpoints",
            endpoints_file(tmp_path, proc.pid),
            *("--count", 3, "--interval", 0.1, "--sink", url, "--spool-dir", tmp_path / "spool", "--send-max-kb", 1),
            *("--stats", stats),
            *extra,
            command=PYTHON_AGENT,
        )
    finally:
        proc.kill()
        store.close()
    return out, sink_stats(stats, url)


@pytest.mark.parametrize("kind", ["influxdb", "elasticsearch"])
@pytest.mark.parametrize("status", [429, 503])
def test_a_store_sink_answered_not_now_sends_the_batch_again_and_it_is_stored_once(tmp_path, kind, status):
    store = Store(kind, lambda n: status if n == 0 else None)
    out, sink = agent_into(store, tmp_path, "--drain-timeout", 10)
    assert out.returncode == 0, out.stderr
    writes = store.sample_writes()
    # the first batch again, as it was (with the batches that waited beside it: --send-max-kb; those
    # written since the store answered not now may go before it: test_c_agent_delivery)
    assert any(writes[0] in w for w in writes[1:]) and 2 <= len(writes) <= 4, writes
    assert sorted(store.stored) == every("abc", range(3))  # each sample stored once
    assert (sink["delivered"], sink["refused"], sink["lost"], sink["spooled"], sink["spooled_samples"]) == (
        9,
        0,
        0,
        0,
        0,
    )
    assert "is down" in out.stderr and "is back" in out.stderr


@pytest.mark.parametrize("kind", ["influxdb", "elasticsearch"])
def test_a_store_sink_answered_400_drops_that_batch_and_counts_it_rejected(tmp_path, kind):
    store = Store(kind, lambda n: 400 if n == 0 else None)
    out, sink = agent_into(store, tmp_path)
    assert out.returncode == 0, out.stderr  # refused is not lost: nothing the agent could have kept
    writes = store.sample_writes()
    assert len(writes) == 3 and sorted(items(writes[0])) == every("abc", [0])  # never sent again
    assert sorted(store.stored) == every("abc", [1, 2])
    assert (sink["delivered"], sink["refused"], sink["lost"], sink["spooled"]) == (6, 3, 0, 0)
    assert "the store refused 3 samples" in out.stderr and "HTTP 400" in out.stderr


def test_a_store_sink_down_at_exit_spools_and_the_flush_settles_each_document(tmp_path):
    """Elasticsearch down (503) for the agent's whole life: every batch waits in the spool, nothing
    lost. --flush-spool then meets a _bulk that refuses b's documents and takes c's only the
    second time: a's and c's stored once each, b's counted refused, the spool emptied."""
    down = Store("elasticsearch", lambda n: 503)
    out, sink = agent_into(down, tmp_path, "--drain-timeout", 0)
    assert out.returncode == 0, out.stderr
    assert (sink["delivered"], sink["lost"], sink["spooled_samples"]) == (0, 0, 9)
    (folder,) = [p.parent for p in (tmp_path / "spool").rglob("sink-url")]
    assert len(list(folder.glob("*.batch"))) == 3

    store = BulkStore(refuse="b", busy="c")
    url = sink_url("elasticsearch", store.port)
    try:
        flushed = subprocess.run(
            [*PYTHON_AGENT, "--flush-spool", str(tmp_path / "spool"), "--sink", url],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        store.close()
    assert flushed.returncode == 0, flushed.stderr
    assert f"{folder}: 6 samples sent to {url}, 3 refused; spool empty" in flushed.stdout
    assert store.times_sent() == {"a": [1] * 3, "b": [1] * 3, "c": [2] * 3}  # only c's again
    assert sorted(store.stored) == every("ac", range(3))
    assert "mapper_parsing_exception" in flushed.stderr and not list(folder.glob("*.batch"))


# -- replay ------------------------------------------------------------------------------------


def replay_into(store: Store, tmp_path, n: int = 30) -> subprocess.CompletedProcess:
    """A run file of `n` samples of nodes node-0..node-9, replayed in batches of 10."""
    path = tmp_path / "samples.ndjson"
    make_run_file(path, "r", n)
    option = "--influx" if store.kind == "influxdb" else "--es"
    try:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "flowstat.cli",
                "replay",
                str(path),
                option,
                f"http://127.0.0.1:{store.port}",
                "--batch",
                "10",
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        store.close()


NODES = [f"node-{i}" for i in range(10)]


@pytest.mark.parametrize("kind", ["influxdb", "elasticsearch"])
@pytest.mark.parametrize("status", [429, 503])
def test_replay_sends_a_batch_answered_not_now_again_and_it_is_stored_once(tmp_path, kind, status):
    store = Store(kind, lambda n: status if n == 0 else None)
    out = replay_into(store, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "30 samples loaded (run r), 0 agent self-samples, 0 bad lines skipped" in out.stdout
    writes = store.sample_writes()
    assert writes[0] == writes[1] and len(writes) == 4
    assert sorted(store.stored) == every(NODES, range(3))


@pytest.mark.parametrize("kind,title", [("influxdb", "InfluxDB"), ("elasticsearch", "Elasticsearch")])
def test_replay_names_a_batch_refused_whole_stores_the_rest_and_exits_2(tmp_path, kind, title):
    store = Store(kind, lambda n: 400 if n == 1 else None)
    out = replay_into(store, tmp_path)
    assert out.returncode == 2, out.stderr
    assert f"{title} refused 10 of the samples or run documents (" in out.stderr
    assert "HTTP 400" in out.stderr and "everything else is stored" in out.stderr
    writes = store.sample_writes()
    assert len(writes) == 3 and sorted(items(writes[1])) == every(NODES, [1])  # never sent again
    assert sorted(store.stored) == every(NODES, [0, 2])


def test_replay_settles_bulk_documents_one_by_one(tmp_path):
    """node-1's documents refused (400), node-2's refused for now (429) the first time: only node-2's
    are sent again; replay names the refusal and exits 2; the run document is stored too."""
    store = BulkStore(refuse="node-1", busy="node-2")
    out = replay_into(store, tmp_path)
    assert out.returncode == 2, out.stderr
    assert (
        "Elasticsearch refused 3 of the samples or run documents (document r/flowstat-agent-py/node-1/0: "
        "HTTP 400: mapper_parsing_exception: failed to parse field [threads]"
    ) in out.stderr
    sent = store.times_sent()
    assert sent.pop("node-2") == [2] * 3 and all(times == [1] * 3 for times in sent.values())
    assert sorted(store.stored) == every(set(NODES) - {"node-1"}, range(3))
    assert store.seen["r"] == 1  # the run document (its _id is the run id)


def test_a_bulk_answer_that_stored_everything_is_known_by_its_head():
    """Issue 28: such an answer's items are not parsed (thousands for a backlog's request); any
    other answer is, as before."""
    from flowstat.stores.elasticsearch import _ALL_STORED

    for head in (
        b'{"errors":false,"took":483,"items":[{"index":{"_index":"i"}}]}',  # 8.19, as it answers here
        b'{"took":1,"errors":false,"items":[]}',  # older Elasticsearch, OpenSearch
        b'{ "took" : 30 , "errors" : false }',
        b'{"errors":false}',
    ):
        assert _ALL_STORED.match(head), head
    for head in (
        b'{"took":1,"errors":true,"items":[]}',
        b'{"errors":true,"took":1,"items":[]}',
        b'{"error":{"type":"x"},"status":400}',
        b'{"items":[],"errors":false}',
        b"",
    ):
        assert not _ALL_STORED.match(head), head
