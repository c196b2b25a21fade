"""Both agents' direct sinks against a real InfluxDB and a real Elasticsearch."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid

import pytest
import requests

from support.agents import sleeper, wait_until
from support.common import ROOT

C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
AGENTS = {"c": [str(C_AGENT)], "py": [sys.executable, "-m", "flowstat.cli", "agent"]}
N = 15


def run_agent(agent: str, run_id: str, sink: str, pids: list[int]):
    if agent == "c" and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    args = [a for p in pids for a in ("--pid", str(p))]
    out = subprocess.run(
        [
            *AGENTS[agent],
            *args,
            "--run-id",
            run_id,
            "--interval",
            "0.05",
            "--count",
            str(N),
            "--self-interval",
            "0",
            "--sink",
            sink,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
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
        requests.post(f"{es.url}/{index}*/_refresh", timeout=10).raise_for_status()
        first = requests.get(f"{es.url}/{index}*/_count", timeout=10).json()["count"]
        # The same run sampled again (same run, agent, nodes, seqs): the same _ids, so no duplicates.
        run_agent(agent, "r1", sink, [p.pid for p in procs])
    finally:
        for p in procs:
            p.kill()
    requests.post(f"{es.url}/{index}*/_refresh", timeout=10).raise_for_status()
    assert first == 2 * N
    assert requests.get(f"{es.url}/{index}*/_count", timeout=10).json()["count"] == 2 * N
    hits = requests.get(f"{es.url}/{index}*/_search", params={"size": 1, "q": "seq:3"}, timeout=10).json()["hits"][
        "hits"
    ]
    doc = hits[0]
    assert doc["_id"] == f"r1/flowstat-agent-{agent}/{doc['_source']['node_id']}/3"
    assert doc["_source"]["vmrss_kb"] > 0


def influx_self_samples(influx, db: str, run_id: str) -> list[dict]:
    body = influx.query(f'SELECT * FROM "flowstat_agent" WHERE "run_id" = \'{run_id}\'', db)
    series = body["results"][0].get("series", [])
    return [dict(zip(s["columns"], row, strict=False)) for s in series for row in s["values"]]


@pytest.mark.parametrize("agent", ["c", "py"])
def test_self_samples_reach_both_stores_and_show_a_sink_that_is_down(stack, agent, tmp_path):
    """Each agent's self-samples in InfluxDB (measurement flowstat_agent) and Elasticsearch (index
    flowstat-agents, beside the samples index its sink names), every field of the agent schema; a
    third sink down for a while: its spool grows in the self-samples the stores get, sinks_down is
    1, then both fall back to 0 once it is back."""
    from flowstat.schema import agent as agent_schema
    from support.agents import HttpReceiver

    if agent == "c" and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    influx, es = stack["influxdb"], stack["elasticsearch"]
    tag = uuid.uuid4().hex[:8]
    db, run_id = f"flowstat_self_{agent}_{tag}", f"self-{agent}-{tag}"
    influx.query(f'CREATE DATABASE "{db}"')
    down = HttpReceiver()
    down.stop()
    target = sleeper()
    proc = subprocess.Popen(
        [
            *AGENTS[agent],
            "--pid",
            str(target.pid),
            *("--run-id", run_id, "--interval", "0.05", "--self-interval", "0.2"),
            *("--sink", f"influxdb://127.0.0.1:{influx.port}/{db}"),
            *("--sink", f"elasticsearch://127.0.0.1:{es.port}/flowstat-test-self-{tag}"),
            *("--sink", f"http://127.0.0.1:{down.port}/write"),
            "--spool-dir",
            str(tmp_path / "spool"),
            "--quiet",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: sum(s["sinks_down"] == 1 for s in influx_self_samples(influx, db, run_id)) >= 3,
            timeout=60,
            what="three self-samples in InfluxDB while a sink is down",
            poll=0.2,
        )
        down.start()
        wait_until(
            lambda: (s := influx_self_samples(influx, db, run_id))
            and s[-1]["sinks_down"] == 0
            and s[-1]["spooled_samples"] == 0,
            timeout=60,
            what="a self-sample after the sink came back",
            poll=0.2,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read()
    finally:
        for p in (target, proc):
            p.kill()
        down.stop()
    points = influx_self_samples(influx, db, run_id)
    names = {f.name for f in agent_schema.fields()}
    for point in points:  # every field of the schema (InfluxDB calls the time "time" too)
        assert set(point) == names and point["agent"] == f"flowstat-agent-{agent}"
    assert [p["seq"] for p in points] == list(range(len(points)))
    spooled = [p["spooled_samples"] for p in points if p["sinks_down"] == 1]
    # the spool grows while the sink is down (the first self-sample that says it is down may come
    # before anything is spooled: the sink is down from its first failed send, a batch spooled after)
    assert spooled == sorted(spooled) and spooled[-1] > spooled[0] >= 0
    requests.post(f"{es.url}/flowstat-agents*/_refresh", timeout=10).raise_for_status()
    hits = requests.post(
        f"{es.url}/flowstat-agents*/_search",
        json={"size": 1000, "query": {"term": {"run_id": run_id}}, "sort": [{"seq": "asc"}]},
        timeout=10,
    ).json()["hits"]["hits"]
    assert [h["_source"]["seq"] for h in hits] == [p["seq"] for p in points]  # the same self-samples, each once
    for hit in hits:
        assert agent_schema.validate(hit["_source"]) == [] and set(hit["_source"]) == names
        assert hit["_id"] == agent_schema.document_id(hit["_source"])
    requests.post(f"{es.url}/flowstat-test-self-{tag}*/_refresh", timeout=10).raise_for_status()
    assert requests.get(f"{es.url}/flowstat-test-self-{tag}*/_count", timeout=10).json()["count"] > 0  # node samples


# -- every field, as the agent wrote it ----------------------------------------------------------


@pytest.mark.parametrize("agent", ["c", "py"])
def test_every_field_an_agent_writes_reaches_both_stores_with_its_value(stack, agent, tmp_path):
    """What each agent wrote to its JSON file sink is what each store holds, field by field, for
    every node sample and the self-sample: a node answering every control field (booleans, large
    integers, many-digit numbers, timestamps), one answering garbage (control_errors), and a third
    sink down (send_failures, spooled_*, sinks_down) so that the self-sample's figures are not all 0."""
    from flowstat.schema import agent as agent_schema
    from flowstat.schema import sample as sample_schema
    from support.agents import FULL_REPLY, StubNode
    from support.common import free_port
    from support.store_readback import NODE_KEY, SEQ, compare_es, compare_influx

    if agent == "c" and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    influx, es = stack["influxdb"], stack["elasticsearch"]
    tag = uuid.uuid4().hex[:8]
    db, index, run_id = (
        f"flowstat_fields_{agent}_{tag}",
        f"flowstat-samples-fields-{agent}-{tag}",
        f"fields-{agent}-{tag}",
    )
    influx.query(f'CREATE DATABASE "{db}"')
    full, garbage = StubNode("full"), StubNode("garbage")
    procs = [sleeper(), sleeper()]
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps(
            {
                "run_id": run_id,
                "nodes": [
                    {"node_id": name, "role": "merger", "pid": p.pid, "control": node.endpoint}
                    for name, p, node in (("full", procs[0], full), ("garbage", procs[1], garbage))
                ],
            }
        )
    )
    written_path = tmp_path / "written.json"
    try:
        # One self-sample, at exit: its figures are the run's last (the garbage node's control
        # errors, the sink that was down all along).
        out = subprocess.run(
            [
                *AGENTS[agent],
                "--endpoints",
                str(endpoints),
                *("--run-id", run_id, "--interval", "0.1", "--count", "6", "--self-interval", "3600", "--quiet"),
                *("--drain-timeout", "0", "--sink", f"influxdb://127.0.0.1:{influx.port}/{db}"),
                *("--sink", f"elasticsearch://127.0.0.1:{es.port}/{index}"),
                *("--sink", f"file://{written_path}?format=json", "--sink", f"http://127.0.0.1:{free_port()}/write"),
                "--spool-dir",
                str(tmp_path / "spool"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        for p in procs:
            p.kill()
        full.close()
        garbage.close()
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in written_path.read_text().splitlines()]
    samples = {(d["node_id"], d["seq"]): d for d in lines if "node_id" in d}
    selves = {d["seq"]: d for d in lines if "node_id" not in d}
    assert len(samples) == 12 and list(selves) == [0]
    assert all(sample_schema.validate(d) == [] for d in samples.values())
    assert agent_schema.validate(selves[0]) == []
    # the node that answers every control field gives a sample of every field the agents fill in
    everything = {f.name for f in sample_schema.fields()}
    assert set(samples["full", 0]) == everything, everything - set(samples["full", 0])
    assert samples["full", 0]["bytes_sent"] == FULL_REPLY["bytes_sent"]
    me = selves[0]
    assert me["control_errors"] > 0 and me["send_failures"] > 0 and me["sinks_down"] == 1 and me["spooled_samples"] > 0

    where, query = f"\"run_id\" = '{run_id}'", {"term": {"run_id": run_id}}
    compare_influx(influx, db, sample_schema, samples, NODE_KEY, where)
    compare_influx(influx, db, agent_schema, selves, SEQ, where)
    compare_es(es, f"{index}*", sample_schema, samples, NODE_KEY, query)
    compare_es(es, "flowstat-agents*", agent_schema, selves, SEQ, query)
