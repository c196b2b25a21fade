"""Issue 4: harness runs -> agents -> Telegraf -> InfluxDB, and agents -> Elasticsearch, on real
servers; with stores going down mid-run; and replay of run files."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from flowstat.schema import agent as agent_schema
from flowstat.schema import sample as sample_schema
from flowstat.views import influxql
from flowstat.views.panels import EDGE, RUN_VIEW, VERDICT
from flowstat_lab import grafana as gx
from support.agents import wait_until
from support.common import TOPOLOGIES
from support.runs import make_run_file
from support.store_readback import NODE_KEY, SEQ, compare_es, compare_influx, influx_points

pytestmark = pytest.mark.integration

# Polling the stores until the data has landed: each query costs them, so not too often.
landed = functools.partial(wait_until, poll=0.5)


def start_run(runs_dir: Path, run_id: str, stack, duration: float) -> subprocess.Popen:
    sinks = [
        f"{stack['telegraf'].write_url}",
        f"elasticsearch://127.0.0.1:{stack['elasticsearch'].port}/flowstat-samples",
    ]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "run",
            str(TOPOLOGIES / "smoke.yaml"),
            "--duration",
            str(duration),
            "--run-id",
            run_id,
            "--runs-dir",
            str(runs_dir),
            "--json",
            "--agent-interval",
            "0.5",
            *[a for s in sinks for a in ("--sink", s)],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_file(runs_dir: Path, run_id: str) -> tuple[list[dict], list[dict]]:
    """The run file's samples and self-samples (the Python agent's), header left out."""
    lines = [json.loads(x) for x in (runs_dir / run_id / "samples.ndjson").read_text().splitlines()[1:]]
    return [d for d in lines if "flowstat_agent" not in d], [
        d["flowstat_agent"] for d in lines if "flowstat_agent" in d
    ]


def influx_samples(stack, run_id: str) -> list[tuple]:
    body = stack["influxdb"].query(
        f'SELECT "seq", "vmrss_kb" FROM "flowstat_node" WHERE "run_id" = \'{run_id}\' ' f'GROUP BY "agent", "node_id"',
        "flowstat",
    )
    out = []
    for s in body["results"][0].get("series", []):
        for _, seq, rss in s["values"]:
            out.append((s["tags"]["agent"], s["tags"]["node_id"], seq, rss))
    return out


def es_samples(stack, run_id: str) -> list[tuple]:
    es = stack["elasticsearch"]
    requests.post(f"{es.url}/flowstat-samples*/_refresh", timeout=30)
    body = requests.post(
        f"{es.url}/flowstat-samples*/_search",
        json={"size": 10000, "query": {"term": {"run_id": run_id}}, "_source": ["agent", "node_id", "seq", "vmrss_kb"]},
        timeout=30,
    ).json()
    return [
        (h["_source"]["agent"], h["_source"]["node_id"], h["_source"]["seq"], h["_source"].get("vmrss_kb"))
        for h in body["hits"]["hits"]
    ]


def influx_self_samples(stack, run_id: str, db: str = "flowstat") -> dict[tuple[str, int], dict]:
    """The agents' self-samples of the run in InfluxDB, by (agent, seq)."""
    rows = influx_points(stack["influxdb"], db, "flowstat_agent", f"\"run_id\" = '{run_id}'")
    return {(r["agent"], r["seq"]): r for r in rows}


def es_self_samples(stack, run_id: str) -> dict[tuple[str, int], dict]:
    """The agents' self-samples of the run in Elasticsearch (index flowstat-agents), by (agent, seq)."""
    es = stack["elasticsearch"]
    requests.post(f"{es.url}/flowstat-agents*/_refresh", timeout=30)
    body = requests.post(
        f"{es.url}/flowstat-agents*/_search", json={"size": 10000, "query": {"term": {"run_id": run_id}}}, timeout=30
    ).json()
    hits = body.get("hits", {}).get("hits", [])  # no index yet: nothing has arrived
    return {(h["_source"]["agent"], h["_source"]["seq"]): h["_source"] for h in hits}


def agents_seqs(samples: list[tuple]) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for agent, node, seq, _ in samples:
        out.setdefault((agent, node), []).append(seq)
    return {k: sorted(v) for k, v in out.items()}


def check_as_recorded(stack, run_id: str, samples: list[dict], selves: list[dict] = (), agent: str = "") -> None:
    """The run's samples and self-samples (of `agent`, if given) in both stores are those given,
    each once, field by field."""
    influx, es = stack["influxdb"], stack["elasticsearch"]
    where = f"\"run_id\" = '{run_id}'" + (f" AND \"agent\" = '{agent}'" if agent else "")
    query = {"bool": {"filter": [{"term": {"run_id": run_id}}] + ([{"term": {"agent": agent}}] if agent else [])}}
    compare_influx(influx, "flowstat", sample_schema, {NODE_KEY(d): d for d in samples}, NODE_KEY, where)
    compare_es(es, "flowstat-samples*", sample_schema, {NODE_KEY(d): d for d in samples}, NODE_KEY, query)
    if selves:
        compare_influx(influx, "flowstat", agent_schema, {SEQ(d): d for d in selves}, SEQ, where)
        compare_es(es, "flowstat-agents*", agent_schema, {SEQ(d): d for d in selves}, SEQ, query)


def check_complete(stack, runs_dir: Path, run_id: str, summary: dict) -> None:
    """Every sample and every self-sample of both agents in both stores, each once, the Python
    agent's field by field as its run file recorded them."""
    samples, selves = run_file(runs_dir, run_id)
    py_total = summary["agent"]["agent-py"]["samples"]
    c_total = summary["agent"]["agent-c"]["samples"]
    total = py_total + c_total
    landed(lambda: len(influx_samples(stack, run_id)) >= total, timeout=60, what="InfluxDB to hold every sample")
    landed(lambda: len(es_samples(stack, run_id)) >= total, timeout=60, what="Elasticsearch to hold every sample")
    for store in (influx_samples(stack, run_id), es_samples(stack, run_id)):
        assert len(store) == total  # nothing lost, nothing twice
        for (agent, node), seqs in agents_seqs(store).items():
            assert seqs == list(range(len(seqs))), (agent, node)  # every seq exactly once
    assert len({(d["agent"], d["node_id"], d["seq"]) for d in samples}) == py_total
    # the self-samples: seq 0.. per agent, as many as each says it emitted (at least the last, at exit)
    expected = {
        (f"flowstat-agent-{a}", seq)
        for a in ("py", "c")
        for seq in range(summary["agent"][f"agent-{a}"]["self_samples"])
    }
    assert all(summary["agent"][f"agent-{a}"]["self_samples"] >= 1 for a in ("py", "c"))
    landed(
        lambda: set(influx_self_samples(stack, run_id)) >= expected,
        timeout=60,
        what="InfluxDB to hold every self-sample",
    )
    landed(
        lambda: set(es_self_samples(stack, run_id)) >= expected,
        timeout=60,
        what="Elasticsearch to hold every self-sample",
    )
    assert {k for k in expected if k[0] == "flowstat-agent-py"} == {("flowstat-agent-py", d["seq"]) for d in selves}
    for store in (influx_self_samples(stack, run_id), es_self_samples(stack, run_id)):
        assert set(store) == expected  # each once, nothing else
    check_as_recorded(stack, run_id, samples, selves, agent="flowstat-agent-py")


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def test_live_run_lands_once_in_both_stores(stack, runs_dir):
    proc = start_run(runs_dir, "live", stack, 4)
    summary = finish(proc)
    check_complete(stack, runs_dir, "live", summary)


def es_run_document(stack, run_id: str) -> dict | None:
    resp = requests.get(f"{stack['elasticsearch'].url}/flowstat-runs/_doc/{run_id}", timeout=10)
    return resp.json()["_source"] if resp.status_code == 200 else None


def influx_run_labels(stack) -> dict[str, str]:
    """What Grafana's run variable lists (its own query, expanded as Grafana does): run id -> label."""
    body = stack["influxdb"].query(gx.expand(influxql.variable_query("run"), 0, 0, 1000), "flowstat")
    values = [row[1] for s in body["results"][0].get("series", []) for row in s["values"]]
    return {run_id: label for label, run_id in gx.variable_options(values, influxql.RUN_LABEL_REGEX)}


def test_a_live_run_is_in_the_run_views_from_its_start_and_complete_at_its_end_without_a_replay(stack, runs_dir):
    """flowstat run with sinks only: the run document reaches both stores as the run starts (the run
    picker lists it, verdict pending) and again, complete, as it ends; the run view's panels then
    return its data, from the samples the agents shipped live."""
    run_id = "live-doc"
    proc = start_run(runs_dir, run_id, stack, 600)
    try:
        landed(
            lambda: es_run_document(stack, run_id) is not None and run_id in influx_run_labels(stack),
            timeout=60,
            what="the run's first document in both stores",
        )
        assert proc.poll() is None  # the run goes on: it ends at the interrupt below
        first = es_run_document(stack, run_id)
        assert "verdict" not in first and "finished" not in first and first["label"].startswith(f"{run_id} | ")
        assert influx_run_labels(stack)[run_id] == first["label"]
        # the run view's rates and increases need a few samples of each node: six (not a time: a
        # busy machine takes longer to give them)
        landed(
            lambda: min(agents_seqs(influx_samples(stack, run_id)).values(), key=len, default=[]).__len__() >= 6
            and newest_sample_time(stack, "elasticsearch", run_id),
            timeout=120,
            what="six samples of each node in InfluxDB, and samples in Elasticsearch",
        )
    finally:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode in (0, 1), err[-3000:]
    final = json.loads((runs_dir / run_id / "run.json").read_text())
    assert final["verdict"]["failures"] == ["interrupted by the user"]
    assert es_run_document(stack, run_id) == final  # replaced by the complete document, nothing else
    points = functools.partial(influx_points, stack["influxdb"], "flowstat", "flowstat_run", f"\"run_id\" = '{run_id}'")
    landed(
        lambda: points()[0].get("finished"), timeout=60, what="the complete run document in InfluxDB (through Telegraf)"
    )
    assert len(points()) == 1 and points()[0]["finished"] == final["finished"]  # the first point, overwritten
    samples, _ = run_file(runs_dir, run_id)
    from_ms, to_ms = (sample_schema.time_ns(samples[i]["time"]) // 10**6 + d for i, d in ((0, -5000), (-1, 5000)))
    variables = {
        "run": [run_id],
        "agent": ["flowstat-agent-py"],
        "role": ["producer", "merger", "viewer", "other"],
        "node": sorted({d["node_id"] for d in samples}),
    }
    empty = [
        p.title
        for p in RUN_VIEW.panels()
        if p.source not in (VERDICT, EDGE)  # written by `flowstat verdict`, not by the run: test_verdict_stores
        and not stack["influxdb"]
        .query(gx.panel_query(RUN_VIEW, p, variables, from_ms, to_ms, 1000)[0], "flowstat")["results"][0]
        .get("series")
    ]
    assert not empty, empty


def newest_sample_time(stack, store: str, run_id: str) -> float:
    """Epoch seconds of the newest sample of the run in a store (0 when it holds none)."""
    if store == "influxdb":
        body = stack["influxdb"].query(
            f'SELECT last("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_id}\'', "flowstat"
        )
        series = body["results"][0].get("series")
        return series[0]["values"][0][0] / 1e9 if series else 0.0
    es = stack["elasticsearch"]
    requests.post(f"{es.url}/flowstat-samples*/_refresh", timeout=30)
    body = requests.post(
        f"{es.url}/flowstat-samples*/_search",
        json={"size": 0, "query": {"term": {"run_id": run_id}}, "aggs": {"newest": {"max": {"field": "time"}}}},
        timeout=30,
    ).json()
    if "aggregations" not in body:  # an error (shards not yet allocated on a node just started): none yet
        return 0.0
    return (body["aggregations"]["newest"]["value"] or 0) / 1000


def spooled_batches(runs_dir: Path, run_id: str) -> int:
    return sum(1 for _ in (runs_dir / run_id / "spool").glob("*/*/*.batch"))


@pytest.mark.parametrize("victim", ["influxdb", "elasticsearch", "telegraf"])
def test_a_store_down_for_ten_seconds_loses_and_duplicates_nothing(own_stack, runs_dir, victim):
    """The run lasts until the agents have caught up after the outage, however long the store took to
    come back (Elasticsearch: 16-25 s to start again under load here, 47 s once on CI): Ctrl-C ends it.
    On a stack of the test's own: the session's goes on for the others."""
    stack = own_stack
    run_id = f"fault-{victim}"
    proc = start_run(runs_dir, run_id, stack, 600)
    try:
        both = ("influxdb", "elasticsearch")
        landed(
            lambda: all(newest_sample_time(stack, s, run_id) for s in both),
            timeout=120,
            what="the run's first samples in both stores",
        )
        stack[victim].down()
        time.sleep(10)  # the outage the test is about
        stack[victim].up()
        back = time.time()
        # Caught up: nothing left on disk, and samples taken after the store came back have arrived live.
        landed(
            lambda: spooled_batches(runs_dir, run_id) == 0, timeout=120, what="the agents to deliver what they spooled"
        )
        landed(
            lambda: all(newest_sample_time(stack, s, run_id) > back + 2 for s in both),
            timeout=120,
            what="samples taken after the outage in both stores",
        )
    finally:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    summary = json.loads(out)
    assert summary["failures"] == ["interrupted by the user"], err[-3000:]  # and nothing else went wrong
    spooled = sum(v["spooled"] for a in ("agent-py", "agent-c") for v in summary["agent"][a]["sinks"].values())
    assert spooled == 0  # what waited on disk has been delivered
    check_complete(stack, runs_dir, run_id, summary)


def replay(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flowstat.cli", "replay", *map(str, args), "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
    )


def counts(stack, run_id: str) -> tuple[int, int]:
    es = stack["elasticsearch"]
    requests.post(f"{es.url}/flowstat-samples*/_refresh", timeout=30)
    n_es = requests.post(
        f"{es.url}/flowstat-samples*/_count", json={"query": {"term": {"run_id": run_id}}}, timeout=30
    ).json()["count"]
    body = stack["influxdb"].query(
        f'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_id}\'', "flowstat"
    )
    series = body["results"][0].get("series")
    return (series[0]["values"][0][1] if series else 0), n_es


def test_replay_skips_bad_lines_loads_the_rest_and_is_idempotent(stack, tmp_path):
    path = tmp_path / "samples.ndjson"
    make_run_file(path, "replay-bad", 200)
    lines = path.read_text().splitlines(keepends=True)
    lines[10] = '{"broken": json\n'
    lines[20] = json.dumps({**json.loads(lines[20]), "seq": -3}) + "\n"
    # beyond int64: InfluxDB would refuse the whole batch it came in (HTTP 400, partial write)
    lines[30] = json.dumps({**json.loads(lines[30]), "vmrss_kb": 2**64 - 1}) + "\n"
    lines.append('{"time": "2026-11-22T10:00:00.000Z", "run_id": "replay-b')  # truncated last line
    path.write_text("".join(lines))
    urls = ("--influx", stack["influxdb"].url, "--es", stack["elasticsearch"].url)
    out = replay(path, *urls)
    assert out.returncode == 1
    assert f"{path}:11: not JSON" in out.stderr and f"{path}:21: field 'seq'" in out.stderr
    assert f"{path}:31: field 'vmrss_kb'" in out.stderr and f"{path}:202: truncated line" in out.stderr
    assert counts(stack, "replay-bad") == (197, 197)
    assert replay(path, *urls).returncode == 1
    assert counts(stack, "replay-bad") == (197, 197)  # twice: the same data
    check_as_recorded(
        stack, "replay-bad", [json.loads(x) for i, x in enumerate(lines[1:-1], 2) if i not in (11, 21, 31)]
    )
    run = requests.get(f"{stack['elasticsearch'].url}/flowstat-runs/_doc/replay-bad", timeout=10).json()["_source"]
    assert run["samples"] == 197 and run["parameters"]["producers"] == 3 and len(run["nodes"]) == 10


def self_sample(run_id: str, seq: int) -> dict:
    from flowstat.timeutil import iso_utc_ms

    figures = (
        "rounds",
        "skipped_rounds",
        "samples",
        "control_errors",
        "proc_errors",
        "delivered",
        "refused",
        "lost",
        "send_failures",
        "spool_dropped",
        "targets",
        "spooled_batches",
        "spooled_samples",
        "sinks_down",
        "failovers",
    )
    return {
        "time": iso_utc_ms(1_795_000_000.0 + 5 * seq),
        "run_id": run_id,
        "host": "h",
        "agent": "flowstat-agent-py",
        "seq": seq,
        "interval_s": 0.1,
        **{k: 10 * seq + i for i, k in enumerate(figures)},
    }


def test_replay_loads_the_self_samples_and_what_is_good_of_a_truncated_file(stack, tmp_path):
    """A run file's self-sample lines go to flowstat_agent and flowstat-agents; a bad one is named by
    its line and field, a truncated one at the end is skipped, the rest is loaded, twice the same."""
    path = tmp_path / "samples.ndjson"
    make_run_file(path, "replay-self", 100)
    lines = path.read_text().splitlines(keepends=True)
    for seq in range(5):  # one self-sample after every 20 samples, as an agent writes them
        lines.insert(1 + 21 * seq + 20, json.dumps({"flowstat_agent": self_sample("replay-self", seq)}) + "\n")
    bad = len(lines) + 1
    lines.append(json.dumps({"flowstat_agent": {**self_sample("replay-self", 5), "spooled_samples": -1}}) + "\n")
    lines.append(json.dumps({"flowstat_agent": self_sample("replay-self", 6)})[:80])  # cut by a crash
    path.write_text("".join(lines))
    urls = ("--influx", stack["influxdb"].url, "--es", stack["elasticsearch"].url)
    for _ in range(2):  # idempotent
        out = replay(path, *urls)
        assert out.returncode == 1, out.stderr
        assert "100 samples loaded (run replay-self), 5 agent self-samples, 2 bad lines skipped" in out.stdout
        assert f"{path}:{bad}: flowstat_agent.spooled_samples: must be between 0 and" in out.stderr
        assert f"{path}:{bad + 1}: truncated line" in out.stderr
        assert counts(stack, "replay-self") == (100, 100)
        want = {("flowstat-agent-py", seq): self_sample("replay-self", seq) for seq in range(5)}
        for store in (influx_self_samples(stack, "replay-self"), es_self_samples(stack, "replay-self")):
            assert set(store) == set(want)
        samples = [json.loads(x) for x in lines[1:] if x.startswith('{"time"')]
        check_as_recorded(stack, "replay-self", samples, list(want.values()))


def test_replay_loads_the_edge_counters_an_agent_wrote_in_its_run_file(stack, tmp_path):
    """A run file's edge counter lines ({"flowstat_edge": ...}, a node that counts by source) go to
    flowstat_edge and flowstat-edges-*, each under its own id: twice, the same."""
    path = tmp_path / "samples.ndjson"
    make_run_file(path, "replay-edges", 20)  # two ticks of ten nodes
    stamps = sorted({json.loads(x)["time"] for x in path.read_text().splitlines()[1:]})[:2]  # two ticks
    counters = [
        {"time": t, "run_id": "replay-edges", "from": f"w-{k}", "to": "m", "agent": "flowstat-agent-py"}
        | {"objects_received": 10 * i + k}
        for i, t in enumerate(stamps)
        for k in range(2)
    ]
    with path.open("a") as f:
        f.writelines(json.dumps({"flowstat_edge": c}) + "\n" for c in counters)
    es = stack["elasticsearch"].url
    for _ in range(2):
        out = replay(path, "--influx", stack["influxdb"].url, "--es", es)
        assert out.returncode == 0 and "4 edge counters" in out.stdout, out.stdout + out.stderr
        body = stack["influxdb"].query(
            'SELECT "objects_received" FROM "flowstat_edge" WHERE "run_id" = \'replay-edges\' GROUP BY "from"',
            "flowstat",
        )
        got = {s["tags"]["from"]: [v for _, v in s["values"]] for s in body["results"][0]["series"]}
        assert got == {"w-0": [0, 10], "w-1": [1, 11]}
        requests.post(f"{es}/flowstat-edges-*/_refresh", timeout=30)
        hits = requests.post(
            f"{es}/flowstat-edges-*/_search", json={"query": {"term": {"run_id": "replay-edges"}}}, timeout=30
        ).json()["hits"]["hits"]
        assert sorted(h["_source"]["objects_received"] for h in hits) == [0, 1, 10, 11]


def test_replay_of_a_large_run(stack, tmp_path):
    path = tmp_path / "samples.ndjson"
    make_run_file(path, "replay-large", 100_000, nodes=50)
    out = replay(path, "--influx", stack["influxdb"].url, "--es", stack["elasticsearch"].url)
    assert out.returncode == 0, out.stderr
    assert counts(stack, "replay-large") == (100_000, 100_000)


def test_replay_says_when_the_rollup_fails_and_keeps_the_samples(stack, tmp_path):
    """The samples are stored and the rollup refused (its retention policy dropped behind flowstat's
    back): replay names the run file and the reason, exits 2, and once the policy is back replaying
    again stores the same samples and rolls them up."""
    from flowstat.stores.influxdb import ROLLUP_POLICY
    from flowstat.stores.influxdb import InfluxDBWriter as InfluxWriter

    influx, db = stack["influxdb"], "flowstat_rollup_fails"
    writer = InfluxWriter(influx.url, db)
    try:
        writer.install()
        influx.query(f'DROP RETENTION POLICY "{ROLLUP_POLICY}" ON "{db}"')
        path = tmp_path / "samples.ndjson"
        make_run_file(path, "replay-rollup", 40)
        stored = 'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'replay-rollup\''
        rolled = f'SELECT count(*) FROM "{ROLLUP_POLICY}"."flowstat_node_10s"'
        out = replay(path, "--influx", influx.url, "--db", db)
        assert out.returncode == 2, out.stderr
        assert f"{path}: the samples are stored, but InfluxDB could not roll them up: " in out.stderr
        assert "retention policy not found" in out.stderr
        assert influx.query(stored, db)["results"][0]["series"][0]["values"][0][1] == 40
        writer.install()  # the policy back
        out = replay(path, "--influx", influx.url, "--db", db)
        assert out.returncode == 0, out.stderr
        assert influx.query(stored, db)["results"][0]["series"][0]["values"][0][1] == 40
        assert influx.query(rolled, db)["results"][0]["series"]
    finally:
        writer.close()
        influx.query(f'DROP DATABASE "{db}"')


def test_install_replaces_a_continuous_query_of_another_definition_and_leaves_one_in_place(stack):
    """Dropped and made again at each install, a continuous query would miss the window due meanwhile
    (flowstat stack up again while samples flow); one of an older definition must still follow."""
    from flowstat.stores.influxdb import InfluxDBWriter as InfluxWriter
    from flowstat.stores.influxdb import as_shown, statements

    influx, db = stack["influxdb"], f"flowstat_cq_{uuid.uuid4().hex[:8]}"
    writer = InfluxWriter(influx.url, db)

    def shown() -> dict[str, str]:
        series = influx.query("SHOW CONTINUOUS QUERIES")["results"][0]["series"]
        return {row[0]: row[1] for s in series if s["name"] == db for row in s.get("values", [])}

    wanted = {st.split('"')[1]: as_shown(st) for st in statements(db) if st.startswith("CREATE CONTINUOUS")}
    try:
        writer.install()
        assert shown() == wanted
        influx.query(f'DROP CONTINUOUS QUERY "flowstat_node_1m" ON "{db}"')
        old = wanted["flowstat_node_1m"].replace("time(1m)", "time(2m)")
        influx.query(old)
        assert shown()["flowstat_node_1m"] == old
        before = writer.requests
        writer.install()
        assert shown() == wanted
        assert writer.requests - before == 1 + 3 + 2  # SHOW, database and policies, the one CQ dropped and made
        before = writer.requests
        writer.install()
        assert writer.requests - before == 1 + 3
    finally:
        writer.close()
        influx.query(f'DROP DATABASE "{db}"')


def test_replay_refuses_a_store_that_is_down(tmp_path):
    path = tmp_path / "samples.ndjson"
    make_run_file(path, "replay-down", 10)
    out = replay(path, "--influx", "http://127.0.0.1:9")
    assert out.returncode == 2 and "InfluxDB at http://127.0.0.1:9 cannot be reached" in out.stderr


def test_continuous_queries_roll_up_per_node_and_sum_over_nodes(stack):
    from flowstat.stores.influxdb import statements as influx_statements

    influx = stack["influxdb"]
    cqs = {
        row[0]
        for s in influx.query("SHOW CONTINUOUS QUERIES")["results"][0]["series"]
        if s["name"] == "flowstat"
        for row in s.get("values", [])
    }
    assert cqs == {"flowstat_node_10s", "flowstat_total_10s", "flowstat_node_1m", "flowstat_total_1m"}
    # Run the rollups' own SELECT ... INTO over a fixed past window: 2 nodes x 10 samples.
    base = (int(time.time()) // 10 * 10 - 3600) * 10**9  # an hour ago, on a 10 s boundary (inside retention)
    lines = []
    for agent, node, rate in (("x", "a", 100.0), ("x", "b", 300.0), ("y", "a", 100.0)):  # agent y watches a too
        for i in range(10):
            lines.append(
                f"flowstat_node,run_id=cq,role=merger,node_id={node},agent={agent},host=h "
                f"merged_objects_per_second={rate + i},seq={i}i {base + i * 10**9}"
            )
    requests.post(
        f"{influx.url}/write", params={"db": "flowstat"}, data="\n".join(lines), timeout=10
    ).raise_for_status()
    window = f" WHERE time >= {base} AND time < {base + 10 * 10**9}"
    for stmt in influx_statements():
        if "flowstat_node_10s" in stmt.split(" BEGIN ")[0] or "flowstat_total_10s" in stmt.split(" BEGIN ")[0]:
            select = stmt.split(" BEGIN ")[1].rsplit(" END", 1)[0]
            head, group = select.split(" GROUP BY ")
            influx.query(f"{head}{window} GROUP BY {group}", "flowstat")
    node = influx.query(
        'SELECT "mean_merged_objects_per_second" FROM "rollup"."flowstat_node_10s" '
        "WHERE run_id = 'cq' AND agent = 'x' GROUP BY node_id",
        "flowstat",
    )["results"][0]["series"]
    assert {s["tags"]["node_id"]: s["values"][0][1] for s in node} == {"a": 104.5, "b": 304.5}
    total = influx.query(
        'SELECT "merged_objects_per_second" FROM "rollup"."flowstat_total_10s" WHERE run_id = \'cq\' ' "GROUP BY agent",
        "flowstat",
    )["results"][0]["series"]
    # the sum over nodes of their means, as dateStat aggregated; each agent's view on its own
    assert {s["tags"]["agent"]: s["values"][0][1] for s in total} == {"x": 409.0, "y": 104.5}


def test_replay_names_an_elasticsearch_that_is_down(tmp_path):
    path = tmp_path / "samples.ndjson"
    make_run_file(path, "replay-es-down", 10)
    out = replay(path, "--es", "http://127.0.0.1:9")
    assert out.returncode == 2 and "Elasticsearch at http://127.0.0.1:9 cannot be reached" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_replay_rolls_up_its_own_run_and_no_other_of_the_same_minutes(stack):
    """As replay calls it: the run's series alone (its id quoted as an InfluxQL string)."""
    from flowstat.stores.influxdb import ROLLUP_POLICY, InfluxDBWriter

    influx, db, mine = stack["influxdb"], "flowstat_rollup_scope", "o'brien"
    writer = InfluxDBWriter(influx.url, db)
    base = (int(time.time()) // 60 * 60 - 3600) * 10**9  # an hour ago, on a minute
    lines = [
        f"flowstat_node,run_id={run},role=merger,node_id=a,agent=x,host=h merged_objects_per_second=1,seq={i}i "
        f"{base + i * 10**9}"
        for run in (mine, "other")
        for i in range(10)
    ]
    try:
        writer.install()
        requests.post(f"{influx.url}/write", params={"db": db}, data="\n".join(lines), timeout=10).raise_for_status()
        writer.loaded(base, base + 9 * 10**9, mine)
        for measurement in ("flowstat_node_10s", "flowstat_total_10s"):
            got = influx.query(f'SELECT count(*) FROM "{ROLLUP_POLICY}"."{measurement}" GROUP BY "run_id"', db)
            assert [s["tags"]["run_id"] for s in got["results"][0]["series"]] == [mine], (measurement, got)
    finally:
        writer.close()
        influx.query(f'DROP DATABASE "{db}"')
