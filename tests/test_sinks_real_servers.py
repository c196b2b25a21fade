"""Both agents' direct sinks against a real InfluxDB and a real Elasticsearch."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
import requests

from agent_helpers import sleeper
from conftest import ROOT


C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
AGENTS = {"c": [str(C_AGENT)], "py": [sys.executable, "-m", "flowstat.cli", "agent"]}
N = 15


def run_agent(agent: str, run_id: str, sink: str, pids: list[int]):
    if agent == "c" and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    args = [a for p in pids for a in ("--pid", str(p))]
    out = subprocess.run([*AGENTS[agent], *args, "--run-id", run_id, "--interval", "0.05", "--count", str(N),
                          "--sink", sink, "--quiet"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("agent", ["c", "py"])
def test_influxdb_sink(stack, agent):
    influx = stack["influxdb"]
    db = f"flowstat_{agent}_{uuid.uuid4().hex[:8]}"
    influx.query(f'CREATE DATABASE "{db}"')
    procs = [sleeper(), sleeper()]
    try:
        run_agent(agent, "r1", f"influxdb://127.0.0.1:{influx.port}/{db}", [p.pid for p in procs])
    finally:
        for p in procs:
            p.kill()
    body = influx.query('SELECT "seq", "vmrss_kb", "pid" FROM "flowstat_node" GROUP BY "node_id", "agent"', db)
    series = body["results"][0]["series"]
    assert len(series) == 2
    for s in series:
        cols = s["columns"]
        seqs = [row[cols.index("seq")] for row in s["values"]]
        assert seqs == list(range(N))  # every sample, once, in time order
        assert all(row[cols.index("vmrss_kb")] > 0 for row in s["values"])
        assert s["tags"]["agent"] == f"flowstat-agent-{agent}"


@pytest.mark.parametrize("agent", ["c", "py"])
def test_elasticsearch_sink_is_idempotent(stack, agent):
    es = stack["elasticsearch"]
    index = f"flowstat-test-{agent}-{uuid.uuid4().hex[:8]}"
    procs = [sleeper(), sleeper()]
    try:
        sink = f"elasticsearch://127.0.0.1:{es.port}/{index}"
        run_agent(agent, "r1", sink, [p.pid for p in procs])
        requests.post(f"{es.url}/{index}/_refresh", timeout=10).raise_for_status()
        first = requests.get(f"{es.url}/{index}/_count", timeout=10).json()["count"]
        # The same run sampled again (same run, agent, nodes, seqs): the same _ids, so no duplicates.
        run_agent(agent, "r1", sink, [p.pid for p in procs])
    finally:
        for p in procs:
            p.kill()
    requests.post(f"{es.url}/{index}/_refresh", timeout=10).raise_for_status()
    assert first == 2 * N
    assert requests.get(f"{es.url}/{index}/_count", timeout=10).json()["count"] == 2 * N
    hits = requests.get(f"{es.url}/{index}/_search", params={"size": 1, "q": "seq:3"}, timeout=10).json()["hits"]["hits"]
    doc = hits[0]
    assert doc["_id"] == f"r1/flowstat-agent-{agent}/{doc['_source']['node_id']}/3"
    assert doc["_source"]["vmrss_kb"] > 0
