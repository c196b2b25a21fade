"""`flowstat verdict` (flowstat.verdicts): which node holds a run's flow back, judged over what a store
holds and written back to it (issue 46).

Against the real servers: harness runs of four topologies of known limit (support.flowcases)
watched by both agents, shipping into InfluxDB and Elasticsearch (a database and a samples index of
this module's own): a slow merger in layer 1 of 2, a slow viewer, two slow mergers of four (a CPU
cost per object, pinned apart from the others), none slow.
The run documents' edges reach both stores (InfluxDB: flowstat_edge topology points); `flowstat
verdict` judges each run live while it runs and once after (--run) on each store; the stored
verdicts name exactly the slow merger, or none; judged again, nothing is added; a store down is
named; the runs' own verdicts (flowstat run's summary) name the same nodes. The live judge of
InfluxDB also serves its verdicts on /metrics (--listen), scraped by a
Prometheus evaluating flowstat's rules: the held-back alert goes pending on the slow merger.
Then the parts that need no server: the edge rates, a bad sample, the evaluation grid.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from flowstat.flow import WINDOW_S, Point
from flowstat.harness.agents import AgentOptions
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.summary import format_summary
from flowstat.harness.topology import from_dict
from flowstat.schema import flow as flow_schema
from flowstat.schema import run as run_schema
from flowstat.schema.sample import time_ns
from flowstat.stores.influxdb import InfluxDBWriter
from flowstat.views import promrules
from flowstat_lab.prometheus import PrometheusServer
from support.common import C_AGENT, PYTHON_AGENT, free_port, topology_dict
from support.flowcases import CASES, costs, pins
from support.user_runs import EXAMPLE, free_port_block

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:8]
DB = f"flowstat_verdict_{TAG}"  # the runs' samples, verdicts and edges in InfluxDB
INDEX = f"flowstat-samples-verdict{TAG}"  # ... their samples in Elasticsearch (verdicts: flowstat-verdicts-*)
EVERY = "1"  # an evaluation a second: a 10 s run has a steady state of several


def flowstat(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flowstat", "verdict", *args], capture_output=True, text=True, timeout=180, **kw
    )


SUMMARIES: dict[str, dict] = {}  # each case's run summary (flowstat run's own verdict), by case


def run(case: str, runs_dir: Path, sinks: list[str], duration: float) -> dict:
    """A harness run of one of support.flowcases' topologies: the slow nodes' cost set, pinned
    apart; both agents ship to ``sinks``. Its run document; its summary kept in SUMMARIES."""
    shape, slow, _ = CASES[case]
    small = {"buffer_size": 20, "kernel_buffer_size": "16kB", "run_id": f"verdict-{TAG}"}
    topo = from_dict(topology_dict(duration=duration, **{**small, **shape}))
    nodes = [n for n, r in topo.node_roles().items() if r != "agent"]
    topo = from_dict(
        topology_dict(
            duration=duration,
            **{**small, **shape},
            merge_cost={"nodes": costs(slow)} if slow else None,
            cpus=pins(slow, nodes),
        )
    )
    s = run_topology(topo, runs_dir=runs_dir, agent=AgentOptions(sinks=sinks, c_agent=True))
    assert s["ok"], s
    SUMMARIES[case] = s
    return json.loads((runs_dir / s["run_id"] / "run.json").read_text())


@pytest.fixture(scope="module")
def judged(stack, tmp_path_factory):
    """The two runs, judged live while the slow one runs and once after by --run on each store:
    {"slow", "none": run documents, "stores": {store: its options}, "live": {store: (exit, stderr)},
    "once": {(run, store): the --run's CompletedProcess}}."""
    influx, es = stack["influxdb"], stack["elasticsearch"]
    writer = InfluxDBWriter(influx.url, DB)
    writer.install()  # the database and its retention policies, as flowstat stack up makes flowstat's
    writer.close()
    sinks = [
        influx.url.replace("http://", "influxdb://") + f"/{DB}",
        es.url.replace("http://", "elasticsearch://") + f"/{INDEX}",
    ]
    stores = {"influxdb": ["--influx", influx.url, "--db", DB], "elasticsearch": ["--es", es.url, "--index", INDEX]}
    runs_dir = tmp_path_factory.mktemp("verdict-runs")
    command = [sys.executable, "-m", "flowstat", "verdict", "--every", EVERY]
    logs = {name: runs_dir / f"verdict-live-{name}.log" for name in stores}
    served = free_port()  # the InfluxDB judge's /metrics
    listen = {"influxdb": ["--listen", f"127.0.0.1:{served}"], "elasticsearch": []}
    lives = {}
    for name, options in stores.items():
        with logs[name].open("w") as log:
            lives[name] = subprocess.Popen([*command, *options, *listen[name]], stderr=log)
    prom_home = tmp_path_factory.mktemp("verdict-prometheus")
    with PrometheusServer(
        prom_home, free_port(), {"verdict": [f"127.0.0.1:{served}"]}, 1.0, rule_files=[rules_each_second(prom_home)]
    ) as prom:
        try:
            slow = run("slow merger in layer 1 of 2", runs_dir, sinks, duration=10)
            scraped = requests.get(f"http://127.0.0.1:{served}/metrics", timeout=10).text
        finally:
            for proc in lives.values():
                proc.send_signal(signal.SIGTERM)
            live = {name: (proc.wait(30), logs[name].read_text()) for name, proc in lives.items()}
        span = (time_ns(slow["started"]) / 1e9, time_ns(slow["finished"]) / 1e9 + 10)
        prometheus = {
            "scraped": scraped,
            "alerts": prom.query_range(
                f'ALERTS{{alertname="FlowstatPipelineHeldBack",run_id="{slow["run_id"]}"}}', *span
            ),
            "held": prom.query_range(f'flowstat_verdict_held_nodes{{run_id="{slow["run_id"]}"}}', *span),
        }
    none = run("none slow", runs_dir, sinks, duration=10)
    more = {case: run(case, runs_dir, sinks, duration=10) for case in ("slow viewer", "two slow mergers of four")}
    procs = {
        (doc["run_id"], name): subprocess.Popen(
            [*command, *options, "--run", doc["run_id"], "--quiet"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for doc in (slow, none, *more.values())
        for name, options in stores.items()
    }
    once = {}
    for key, p in procs.items():
        out, err = p.communicate(timeout=120)
        once[key] = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    yield {
        "slow": slow,
        "none": none,
        "stores": stores,
        "stores_sinks": sinks,
        "live": live,
        "once": once,
        "es": es,
        "influx": influx,
        "prometheus": prometheus,
        "more": more,
    }
    influx.query(f'DROP DATABASE "{DB}"')
    requests.delete(f"{es.url}/{INDEX}-*", timeout=30)


FAN_RATE = 200  # objects/s each source of the fanned pipeline offers, paced: its edges' total


@pytest.fixture(scope="module")
def fanned(judged, tmp_path_factory):
    """The example pipeline with two sources dealing to two workers (PUSH fanned out, PULLs fanned
    in: no node count tells an edge's share), each receiver counting by source; both agents ship
    to both stores, then --run judges it on each: {"run_id", "once": {store: CompletedProcess}}."""
    folder = tmp_path_factory.mktemp("fanned-endpoints")
    run_id = f"fanned-{TAG}"
    sinks = judged["stores_sinks"]
    agents = [
        subprocess.Popen(
            [*command, "--endpoints-dir", str(folder), "--interval", "0.5", "--rescan", "0.2", "--run-id", run_id]
            + [a for url in sinks for a in ("--sink", url)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in (PYTHON_AGENT, [str(C_AGENT)])
    ]
    example = subprocess.run(
        [sys.executable, str(EXAMPLE), "all", "--endpoints-dir", str(folder), "--base-port", str(free_port_block())]
        + ["--run-id", run_id, "--sources", "2", "--workers", "2", "--objects", str(FAN_RATE * 16)]
        + ["--rate", str(FAN_RATE), "--merge-every", "10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    for a in agents:
        a.send_signal(signal.SIGTERM)
    errs = [a.communicate(timeout=60)[1] for a in agents]
    assert example.returncode == 0 and all(a.returncode == 0 for a in agents), (example.stderr[-2000:], errs)
    once = {
        name: flowstat(*options, "--run", run_id, "--every", EVERY, "--quiet")
        for name, options in judged["stores"].items()
    }
    return {"run_id": run_id, "once": once}


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_edge_counters_reach_the_store_and_make_fanned_edges_exact(judged, fanned, store):
    run_id = fanned["run_id"]
    assert fanned["once"][store].returncode == 0, fanned["once"][store].stderr
    if store == "influxdb":
        points = edge_points(judged, run_id)
    else:
        points = [
            {**d, "iso": d["time"], "time": time_ns(d["time"])} for d in es_docs(judged, "flowstat-edges", run_id)
        ]
    counters = [p for p in points if "objects_received" in p]
    if store == "elasticsearch":  # each agent's _id as flowstat.schema.flow's: the C agent's too
        assert all(c["_id"] == flow_schema.document_id("edge", {**c, "time": c["iso"]}) for c in counters)
    # each agent's last counter of each edge: every object a source sent reached a worker, counted once
    last: dict[tuple[str, str, str], int] = {}
    for c in sorted(counters, key=lambda c: c["time"]):
        last[(c["agent"], c["from"], c["to"])] = c["objects_received"]
    assert {a for a, _, _ in last} == {"flowstat-agent-py", "flowstat-agent-c"}
    for agent in ("flowstat-agent-py", "flowstat-agent-c"):
        for k in range(2):
            assert sum(n for (a, f, _), n in last.items() if a == agent and f == f"source-{k}") == FAN_RATE * 16
    # the verdict's rates: from the counters (not estimated), each source's edges adding up to its pace
    rates = [p for p in points if "window_s" in p and "objects_per_second" in p]
    fanned_in = [r for r in rates if r["from"].startswith("source-")]
    assert fanned_in and all(r["estimated"] is False for r in fanned_in)
    by_time: dict[int, dict[str, float]] = {}
    for r in fanned_in:
        by_time.setdefault(r["time"], {}).setdefault(r["from"], 0.0)
        by_time[r["time"]][r["from"]] += r["objects_per_second"]
    full = [t for t, per in by_time.items() if len(per) == 2]
    middle = sorted(full)[len(full) // 2]  # a window inside the paced run
    assert by_time[middle] == {
        "source-0": pytest.approx(FAN_RATE, rel=0.2),
        "source-1": pytest.approx(FAN_RATE, rel=0.2),
    }


def rules_each_second(home: Path) -> Path:
    """flowstat's rules as generated, their groups evaluated each second (not each 10 s): a 10 s
    run is judged held back for a few seconds only."""
    rules = promrules.rules()
    for group in rules["groups"]:
        group["interval"] = "1s"
    path = home / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    return path


def verdicts(judged: dict, store: str, run_id: str) -> list[dict]:
    """The verdicts a store holds of a run, as written (time in ISO), in time order."""
    if store == "influxdb":
        body = judged["influx"].query(f'SELECT * FROM "flowstat_verdict" WHERE "run_id" = \'{run_id}\'', DB)
        series = body["results"][0].get("series", [])
        rows = [dict(zip(s["columns"], row, strict=False)) for s in series for row in s["values"]]
        return sorted(({k: v for k, v in r.items() if v is not None} for r in rows), key=lambda r: r["time"])
    return [{**d, "time": time_ns(d["time"])} for d in es_docs(judged, "flowstat-verdicts", run_id)]


def es_docs(judged: dict, index: str, run_id: str) -> list[dict]:
    url = judged["es"].url
    requests.post(f"{url}/{index}-*/_refresh", timeout=30).raise_for_status()
    hits = requests.post(
        f"{url}/{index}-*/_search",
        json={"size": 10_000, "query": {"term": {"run_id": run_id}}, "sort": [{"time": "asc"}]},
        timeout=30,
    ).json()["hits"]["hits"]
    return [{**h["_source"], "_id": h["_id"], "_index": h["_index"]} for h in hits]


def edge_points(judged: dict, run_id: str, where: str = "") -> list[dict]:
    body = judged["influx"].query(
        f'SELECT * FROM "flowstat_edge" WHERE "run_id" = \'{run_id}\'{where} GROUP BY "from", "to"', DB
    )
    return [
        {**s["tags"], **{k: v for k, v in zip(s["columns"], row, strict=False) if v is not None}}
        for s in body["results"][0].get("series", [])
        for row in s["values"]
    ]


def steady(doc: dict) -> tuple[int, int]:
    """The run's steady state (ns): after start-up, until it finished."""
    started, finished = time_ns(doc["started"]), time_ns(doc["finished"])
    duration_s = (finished - started) / 1e9
    return started + int(run_schema.startup_s(duration_s) * 1e9), finished


@pytest.mark.parametrize("case", list(CASES))
def test_the_run_s_own_verdict_names_exactly_the_slow_nodes(judged, case):
    """flowstat run's verdict (judged live by the orchestrator, every second, over the topology's
    edges) of the same runs: in its summary and its run document, exactly the slow nodes, or none."""
    shape, slow, others = CASES[case]
    s = SUMMARIES[case]
    flow, text = s["flow"], format_summary(s)
    if slow:
        assert flow["flow"] == "held_back" and sorted(flow["held_back_by"]) == sorted(slow), text
        assert "flow: held back by " + slow[0] in text or "flow: held back by " + slow[-1] in text
        for node in slow:
            # named before the run ends (10 s): the slowdown is there from the start
            assert flow["first_named_s"][node] <= 10.0, flow
        if case == "two slow mergers of four":  # its producers' sends are refused: the symptom upstream
            assert "upstream producers-0 backpressured" in flow["flow_evidence"], flow
    else:
        assert flow["flow"] == "none" and flow["held_back_by"] == [], text
        busiest = re.search(r"busiest: \S+ busy (\d+)%", flow["flow_evidence"])
        assert busiest and int(busiest.group(1)) < 50, flow  # nodes that keep up wait for input
    doc = {"slow merger in layer 1 of 2": judged["slow"], "none slow": judged["none"], **judged["more"]}[case]
    assert doc["verdict"]["flow"] == flow["flow"] and doc["verdict"]["held_back_by"] == flow["held_back_by"]
    edges = {(e["from"], e["to"]) for e in doc["edges"]}
    assert {to for _, to in edges} >= {n for n in slow if n.startswith("merger")} | {"viewer"}
    assert not any(o in flow["held_back_by"] for o in others)


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_the_run_s_edges_reach_the_store(judged, store):
    doc = judged["slow"]
    edges = {(e["from"], e["to"]) for e in doc["edges"]}
    assert ("merger-1", "merger-l2-0") in edges and ("merger-l2-0", "viewer") in edges
    if store == "influxdb":  # a topology point per edge at the run's start, no rate
        points = edge_points(judged, doc["run_id"], ' AND "topology" = true')
        assert {(p["from"], p["to"]) for p in points} == edges
        assert {p["time"] for p in points} == {time_ns(doc["started"])}
        assert all("objects_per_second" not in p and "window_s" not in p for p in points)
    else:
        url = judged["es"].url
        stored = requests.get(f"{url}/flowstat-runs/_doc/{doc['run_id']}", timeout=30).json()["_source"]
        assert {(e["from"], e["to"]) for e in stored["edges"]} == edges
        found = requests.post(
            f"{url}/flowstat-runs/_search",
            json={
                "query": {"bool": {"filter": [{"term": {"edges.to": "merger-1"}}, {"term": {"run_id": doc["run_id"]}}]}}
            },
            timeout=30,
        ).json()["hits"]["hits"]
        assert len(found) == 1  # edges.from / edges.to are keywords: searchable


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_the_stored_verdict_names_exactly_the_slow_merger(judged, store):
    doc = judged["slow"]
    once = judged["once"][(doc["run_id"], store)]
    assert once.returncode == 0, once.stderr
    assert f"run {doc['run_id']}: " in once.stdout and "0 bad samples skipped" in once.stdout
    got = verdicts(judged, store, doc["run_id"])
    lo, hi = steady(doc)
    in_steady = [v for v in got if lo <= v["time"] <= hi]
    named = [v for v in in_steady if v.get("held_back_by") == "merger-1"]
    summary = [(v["time"], v["flow"], v.get("held_back_by"), v["evidence"][:80]) for v in got]
    assert len(in_steady) >= 5 and len(named) >= 0.5 * len(in_steady), summary
    assert {v.get("held_back_by") for v in got} <= {"merger-1", None}, summary  # never another node
    for v in named:
        assert (v["flow"], v["held"], v["window_s"]) == ("held_back", 1, WINDOW_S)
        assert v["evidence"].startswith("merger-1: busy ")
    assert all(time_ns(doc["started"]) < v["time"] for v in got)
    times = [v["time"] for v in got]
    assert all(b - a == 1_000_000_000 for a, b in zip(times, times[1:], strict=False)), "an evaluation a second"


@pytest.mark.parametrize("case", ["slow viewer", "two slow mergers of four"])
@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_the_other_topologies_stored_verdicts_name_exactly_their_slow_nodes(judged, store, case):
    """Judged from the stores (--run), as the harness judged them itself: the
    steady state's verdicts name the slow nodes (both, of two: each of them, and most evaluations
    held back by some of them), never another node."""
    doc, slow = judged["more"][case], set(CASES[case][1])
    once = judged["once"][(doc["run_id"], store)]
    assert once.returncode == 0, once.stderr
    lo, hi = steady(doc)
    got = verdicts(judged, store, doc["run_id"])
    in_steady = [v for v in got if lo <= v["time"] <= hi]
    named = [set(v["held_back_by"].split(",")) for v in in_steady if "held_back_by" in v]
    summary = [(v["time"], v["flow"], v.get("held_back_by"), v["evidence"][:80]) for v in got]
    assert len(in_steady) >= 5 and len(named) >= 0.5 * len(in_steady), summary
    assert set().union(*named) == slow, summary
    assert all(nodes <= slow for v in got if "held_back_by" in v for nodes in [set(v["held_back_by"].split(","))])


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_the_edge_rates_are_written_beside_the_verdicts(judged, store):
    doc = judged["slow"]
    lo, hi = steady(doc)
    if store == "influxdb":
        rates = [p for p in edge_points(judged, doc["run_id"]) if "window_s" in p]
    else:
        rates = [{**d, "time": time_ns(d["time"])} for d in es_docs(judged, "flowstat-edges", doc["run_id"])]
        ids = {d["_id"] for d in es_docs(judged, "flowstat-edges", doc["run_id"])}
        assert f"{doc['run_id']}/merger-1/merger-l2-0/{rates[0]['time'] // 1_000_000}" in ids
    for p in rates:
        assert not flow_schema.validate(
            "edge", {k: v for k, v in p.items() if not k.startswith("_")} | {"time": "2026-01-01T00:00:00.000Z"}
        )
    edges = {(e["from"], e["to"]) for e in doc["edges"]}
    assert {(p["from"], p["to"]) for p in rates} == edges
    # the slow merger: at most 100 objects/s (10 ms each), and on in the steady state
    slow = [
        p["objects_per_second"]
        for p in rates
        if (p["from"], p["to"]) == ("merger-1", "merger-l2-0") and lo <= p["time"] <= hi and "objects_per_second" in p
    ]
    assert slow and all(0 < r <= 110 for r in slow), slow
    # each merger feeds one node and counts what it sends: its own rate; the producer process feeds
    # both first-layer mergers, each of which it alone feeds: their intake, whole
    known = [p for p in rates if lo <= p["time"] <= hi and "objects_per_second" in p]
    assert {(p["from"], p["to"]) for p in known} == edges and not any(p["estimated"] for p in known)


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_a_run_with_no_slow_node_is_judged_none(judged, store):
    doc = judged["none"]
    once = judged["once"][(doc["run_id"], store)]
    assert once.returncode == 0, once.stderr
    got = verdicts(judged, store, doc["run_id"])
    lo, hi = steady(doc)
    in_steady = [v for v in got if lo <= v["time"] <= hi]
    summary = [(v["time"], v["flow"], v["evidence"][:80]) for v in got]
    assert in_steady and sum(v["flow"] == "none" for v in in_steady) >= 0.5 * len(in_steady), summary
    assert not any(v["flow"] == "held_back" for v in got), summary


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_the_live_verdict_named_the_slow_merger_as_it_ran_and_stopped_on_sigterm(judged, store):
    code, stderr = judged["live"][store]
    assert code == 0, stderr
    run_id = judged["slow"]["run_id"]
    said = [line for line in stderr.splitlines() if f"run {run_id}: held back by" in line]
    assert said and all(f"run {run_id}: held back by merger-1 (" in line for line in said), stderr
    assert "stopped" in stderr.splitlines()[-1]


def test_the_served_verdict_takes_prometheus_s_held_back_alert_to_pending_on_the_slow_merger(judged):
    """What Prometheus scraped of `flowstat verdict --listen` as the slow run ran: the verdict held
    back by merger-1, which its alert rule (as generated, evaluated each second) saw: pending, the
    60 s of its ``for`` longer than the run. promtool checks the exposition."""
    got = judged["prometheus"]
    named = {s["metric"].get("held_back_by") for s in got["held"] if any(float(v) >= 1 for _, v in s["values"])}
    assert named == {"merger-1"}, got["held"]
    states = {(s["metric"]["held_back_by"], s["metric"]["alertstate"]) for s in got["alerts"]}
    assert states == {("merger-1", "pending")}, got["alerts"]
    assert "# TYPE flowstat_verdict_held_nodes gauge" in got["scraped"]
    check = subprocess.run(["promtool", "check", "metrics"], input=got["scraped"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_judged_again_the_run_overwrites_itself(judged, store):
    doc = judged["slow"]
    options = judged["stores"][store]

    def counts() -> tuple[int, int]:
        if store == "influxdb":
            return len(verdicts(judged, store, doc["run_id"])), len(edge_points(judged, doc["run_id"]))
        return len(es_docs(judged, "flowstat-verdicts", doc["run_id"])), len(
            es_docs(judged, "flowstat-edges", doc["run_id"])
        )

    before = counts()
    again = flowstat(*options, "--run", doc["run_id"], "--every", EVERY, "--quiet")
    assert again.returncode == 0, again.stderr
    assert counts() == before and before[0] > 0


def test_a_store_down_or_a_run_it_lacks_is_named(judged):
    port = free_port()
    down = flowstat("--influx", f"http://127.0.0.1:{port}", "--run", "r")
    assert down.returncode == 3 and f"InfluxDB at http://127.0.0.1:{port} cannot be reached" in down.stderr
    down = flowstat("--es", f"http://127.0.0.1:{port}", "--run", "r")
    assert down.returncode == 3 and f"Elasticsearch at http://127.0.0.1:{port} cannot be reached" in down.stderr
    none = flowstat(*judged["stores"]["elasticsearch"], "--run", "no-such-run")
    assert none.returncode == 2 and "holds no sample of run no-such-run" in none.stderr
    both = flowstat("--influx", "http://127.0.0.1:1", "--es", "http://127.0.0.1:1")
    assert both.returncode == 2 and "--influx URL or --es URL (one)" in both.stderr


# -- no server --------------------------------------------------------------------------------------
def sample(node: str, t: float, busy: float, sent: int | None = None, received: int | None = None, agent="a", **kw):
    idle = 1 - busy if isinstance(busy, float) else None
    doc = {
        "time": t,
        "node_id": node,
        "agent": agent,
        "busy_ratio": busy,
        "backpressured_ratio": 0.0,
        "idle_ratio": idle,
    }
    doc.update(kw)
    if sent is not None:
        doc["objects_sent"] = sent
    if received is not None:
        doc["objects_received"] = received
    return doc


def test_edge_rates_from_the_sender_or_split_from_the_receiver():
    from flowstat.verdicts import evaluate, parse_sample

    at = 1_800_000_000.0
    edges = [("p0", "m"), ("p1", "m"), ("p2", "m"), ("m", "v"), ("m", "w")]
    docs = []
    for i in range(10):
        t = at - 9 + i
        docs += [
            sample("p0", t, 0.1, sent=10 * i),  # feeds m only, counts: 10/s, its own
            sample("p1", t, 0.1),  # counts nothing: m's intake less p0's, split with p2
            sample("p2", t, 0.1),
            sample("m", t, 0.5, sent=7 * i if i != 5 else 0, received=40 * i),  # feeds two: split of v's, w's
            sample("v", t, 0.2, received=3 * i),
            sample("w", t, 0.2),  # no counts: unknown
        ]
    window = [parse_sample(d) for d in docs]
    verdict, doc, rates = evaluate("r", window, edges, int(at * 1000))
    assert verdict.kind == "none" and doc["flow"] == "none" and "held_back_by" not in doc and doc["held"] == 0
    by = {(r["from"], r["to"]): r for r in rates}
    assert by[("p0", "m")]["objects_per_second"] == pytest.approx(10) and by[("p0", "m")]["estimated"] is False
    assert by[("p1", "m")]["objects_per_second"] == pytest.approx(15) and by[("p1", "m")]["estimated"] is True
    assert by[("p2", "m")] == {**by[("p1", "m")], "from": "p2"}
    # m feeds two, v has one feeder: all v takes comes from m
    assert by[("m", "v")]["objects_per_second"] == pytest.approx(3) and by[("m", "v")]["estimated"] is False
    assert "objects_per_second" not in by[("m", "w")] and "estimated" not in by[("m", "w")]
    assert all(r["window_s"] == WINDOW_S and r["time"] == doc["time"] for r in rates)
    for r in rates:
        assert flow_schema.validate("edge", r) == []
    assert flow_schema.validate("verdict", doc) == []


def test_edge_counters_come_before_the_split_and_name_edges_no_run_document_gave():
    """A PULL fed by three (w0 w1 w2 -> sink) counting by source, and a PUSH fanning out (vent -> w0
    w1 w2) whose receivers count it: each edge's rate is its counter's, exact, from the agent with
    the most points; a restart is skipped; an edge only the counters name is judged too."""
    from flowstat.verdicts import EdgeCount, evaluate, parse_edge_count, parse_sample

    at = 1_800_000_000.0
    edges = [("vent", "w0"), ("vent", "w1"), ("vent", "w2"), ("w0", "sink"), ("w1", "sink")]  # w2 -> sink unsaid
    docs, counts = [], []
    for i in range(10):
        t = at - 9 + i
        docs += [sample("vent", t, 0.1, sent=60 * i)] + [sample(f"w{k}", t, 0.3, sent=20 * i) for k in range(3)]
        docs.append(sample("sink", t, 0.2, received=60 * i))
        for k, per_s in enumerate((10, 20, 30)):  # what each worker took from vent, and gave the sink
            counts.append(EdgeCount("vent", f"w{k}", "a", t, per_s * i))
            counts.append(EdgeCount(f"w{k}", "sink", "a", t, (5 + k) * i if i != 4 else 0))  # a restart at 4
        counts.append(EdgeCount("vent", "w0", "b", t, 1000 * i) if i < 3 else EdgeCount("x", "y", "b", t, i))
    window = [parse_sample(d) for d in docs]
    _, _, rates = evaluate("r", window, edges, int(at * 1000), counts=counts)
    by = {(r["from"], r["to"]): r for r in rates}
    for k, per_s in enumerate((10, 20, 30)):
        assert by[("vent", f"w{k}")]["objects_per_second"] == pytest.approx(per_s)  # agent a: more points
        assert by[("vent", f"w{k}")]["estimated"] is False
        # the restart's fall is skipped, what it counted since (5 x (5+k) at i=5) is kept: 12 steps of 9 s
        assert by[(f"w{k}", "sink")]["objects_per_second"] == pytest.approx((5 + k) * 12 / 9)
    assert ("w2", "sink") in by and ("x", "y") in by  # named by counters alone
    _, _, split = evaluate("r", window, edges, int(at * 1000))  # without counters: the old split
    assert {(r["from"], r["to"]) for r in split} == set(edges)
    # vent feeds three and the workers count no intake: unknown; w0 and w1 feed the sink alone: their sends
    assert all("objects_per_second" not in r for r in split if r["from"] == "vent")
    assert [r["objects_per_second"] for r in split if r["to"] == "sink"] == [pytest.approx(20)] * 2
    assert parse_edge_count({"time": at, "from": "a", "to": "b", "objects_received": 3}).count == 3
    for bad in (
        {"time": at, "from": "a", "objects_received": 3},
        {"time": at, "from": "a", "to": "b", "objects_received": -1},
    ):
        with pytest.raises(ValueError):
            parse_edge_count(bad)


def test_one_agent_a_node_and_a_slow_node_named():
    from flowstat.verdicts import evaluate, parse_sample

    at = 1_800_000_000.0
    docs = []
    for i in range(10):
        t = at - 9 + i
        docs += [
            sample("src", t, 0.0, backpressured_ratio=0.9),
            sample("m", t, 0.97, input_latency_p50_ms=10.0 + 5 * i),
            # a second agent that sees m idle (were it mixed in, m's mean would drop under 90%)
            sample("m", t + 0.5, 0.5, agent="b"),
        ]
        docs[-3]["backpressured_ratio"] = 0.9
    verdict, doc, _ = evaluate("r", [parse_sample(d) for d in docs], [("src", "m")], int(at * 1000))
    assert verdict.kind == "held_back" and doc["held_back_by"] == "m" and doc["held"] == 1


def test_a_bad_sample_is_skipped_and_counted():
    from flowstat.verdicts import Judging, Source, grid, judge

    class Fake(Source):
        def __init__(self):
            self.written: list = []

        def samples(self, run_id, lo_ms, hi_ms):
            good = [sample("m", t / 1000, 0.3) for t in range(lo_ms + 1000, hi_ms + 1, 1000)]
            return good + [sample("m", hi_ms / 1000, "busy"), {"time": "yesterday", "node_id": "m"}]

        def write(self, verdicts, rates):
            self.written += verdicts
            from flowstat.stores import Outcome

            return Outcome(accepted=len(verdicts) + len(rates))

    fake, tally = Fake(), Judging()
    times = grid(1_800_000_000_000, 1_800_000_020_000, 5000)
    assert times[0] == 1_800_000_005_000 and times[-1] == 1_800_000_020_000
    judge(fake, "r", times, [("src", "m")], tally)
    assert tally.evaluations == len(fake.written) == 4 and tally.skipped == 2 * 1  # one chunk read: two bad
    assert "busy_ratio is not a number" in tally.bad[0] and "bad time 'yesterday'" in tally.bad[1]


def test_the_influxdb_run_document_carries_its_edges_as_topology_points():
    doc = {
        "run_id": "r 1",
        "label": "r 1 | recorded on h",
        "started": "2026-11-29T10:00:00.000Z",
        "edges": [{"from": "p", "to": "m"}, {"from": "m", "to": "v"}, {"from": "p", "to": "m"}],
    }
    lines = InfluxDBWriter("http://127.0.0.1:1").encode_run(doc).decode().splitlines()
    assert lines[0].startswith("flowstat_run,")
    assert lines[1:] == [
        f"flowstat_edge,from=p,run_id=r\\ 1,to=m topology=true {time_ns(doc['started'])}",
        f"flowstat_edge,from=m,run_id=r\\ 1,to=v topology=true {time_ns(doc['started'])}",
    ]
    assert InfluxDBWriter("http://127.0.0.1:1").encode_run({**doc, "edges": []}).decode().count("\n") == 1


def test_the_elasticsearch_verdicts_go_to_daily_indices_under_their_ids():
    from flowstat.stores.elasticsearch import ElasticsearchWriter

    verdict = {
        "time": "2026-11-29T10:00:05.000Z",
        "run_id": "r",
        "flow": "none",
        "held": 0,
        "evidence": "e",
        "window_s": 10.0,
    }
    edge = {"time": "2026-11-29T10:00:05.000Z", "run_id": "r", "from": "p", "to": "m", "window_s": 10.0}
    es = ElasticsearchWriter("http://127.0.0.1:1")
    ms = time_ns(verdict["time"]) // 1_000_000
    lines = (es.encode_flow("verdict", [verdict]) + es.encode_flow("edge", [edge])).decode().splitlines()
    assert json.loads(lines[0]) == {"index": {"_index": "flowstat-verdicts-2026.11.29", "_id": f"r/{ms}"}}
    assert json.loads(lines[1]) == verdict
    assert json.loads(lines[2]) == {"index": {"_index": "flowstat-edges-2026.11.29", "_id": f"r/p/m/{ms}"}}


def test_point_is_what_held_back_by_takes():
    """The samples' fields reach held_back_by as flowstat.flow's Point (a guard on the names read)."""
    from flowstat.verdicts import parse_sample

    s = parse_sample(sample("m", 5.0, 0.4, input_latency_p50_ms=3.0, node_state="STOPPED"))
    assert s.point == Point(5.0, 0.4, 0.0, 0.6, 3.0, "STOPPED") and (s.node, s.agent) == ("m", "a")


def test_the_served_board_shows_the_latest_verdicts_and_nothing_once_emptied():
    from flowstat.verdicts import VerdictBoard

    board = VerdictBoard()
    held = {"time": "2026-01-01T00:00:05.000Z", "run_id": "r", "held_back_by": "m1", "flow": "held_back", "held": 1}
    edge = {"time": held["time"], "run_id": "r", "from": "p0", "to": "m1", "objects_per_second": 2.5, "estimated": True}
    board.show({"r": (held, [edge])})
    version, body = board.rendered(openmetrics=True)
    text = body.decode()
    assert 'flowstat_verdict_held_nodes{run_id="r",held_back_by="m1"} 1\n' in text
    assert 'flowstat_edge_objects_per_second{run_id="r",from="p0",to="m1"} 2.5\n' in text
    assert 'flowstat_edge_estimated{run_id="r",from="p0",to="m1"} 1\n' in text and text.endswith("# EOF\n")
    assert board.rendered(openmetrics=True) == (version, body)  # kept until the next pass
    board.show({})  # the store down: nothing current to show
    later, emptied = board.rendered(openmetrics=False)
    assert later > version and "flowstat_verdict" not in emptied.decode() and b"process_cpu_seconds_total" in emptied


def test_listen_is_refused_with_a_past_run_beyond_loopback_or_without_a_port():
    store = ["--influx", "http://127.0.0.1:1"]
    got = flowstat(*store, "--run", "r", "--listen", "9466")
    assert got.returncode == 2 and "--listen serves live verdicts: not with --run" in got.stderr
    got = flowstat(*store, "--listen", "192.0.2.1:9466")
    assert got.returncode == 2 and "--listen 192.0.2.1:9466: /metrics is served on loopback only" in got.stderr
    got = flowstat(*store, "--listen", "127.0.0.1:port")
    assert got.returncode == 2 and "a port (0 to 65535) is needed" in got.stderr
