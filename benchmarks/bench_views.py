#!/usr/bin/env python3
"""Dashboard query speed (issue 10): the views' queries timed on real InfluxDB and Elasticsearch.

The data. A short real harness run (the demo topology, 10 s, or --source) is replicated by
flowstat.synthetic.synthesize into a run of NODES nodes x SECONDS samples (1 sample/s per node; default
500 x 300 = 150,000 samples, node copies named NODE~K), placed two hours before now, and RUNS
smaller runs (default 50 of 20 nodes x 60 s) placed one after another before it, whose run
documents say producers = 1, 2, ... RUNS: the parameter they differ in. Their samples are copies of
the same real run's: what is measured is the queries, not the values. Everything is loaded with
`flowstat replay`'s code (run documents to flowstat-runs, InfluxDB rollups), then Elasticsearch is
refreshed.

The queries.
run view    every panel of the Grafana run view (flowstat.views.panels.RUN_VIEW): its InfluxQL
            expanded as Grafana expands it (flowstat_lab.grafana) for the whole run's time range
            (first sample - 5 s to last + 5 s), $__interval for a panel of --max-points pixels, the
            run, its agent, the role variable on All, and the node variable on All (what Grafana
            sends for it: the variable's custom all value, .*) or on 10 nodes spread over the
            roles; and every Lens panel of
            the Kibana run view as the Elasticsearch search Lens sends (flowstat_lab.kibana; the query
            bar holding run_id, agent and, for 10 nodes, the nodes; "auto" intervals as Kibana
            picks them for the time range). The run view's variable queries (agent, node) too,
            reported apart: they are not panels.
run view,   Kibana's run view per 10 s (flowstat.views.panels.RUN_VIEW_10S), the same way: the run view's
 per 10 s   per-node panels on Elasticsearch's per-node rollup (flowstat rollup; replay rolls up what it
            loads), its run document panels as they are.
cross-run   the aggregate view's cross-run panels with all RUNS runs selected and the time range
            holding them: the mean and standard deviation table (InfluxDB), the steady rate against
            the parameter (Grafana's Elasticsearch request, "compared by" producers), their Kibana
            Lens counterparts, and the `runs` variable (the list of runs to choose from).
baseline    measured in the same rounds: SELECT count("seq") of the big run on InfluxDB, and a
            _count of its documents on Elasticsearch (the machine's speed at that moment).

Timing. Each query is sent once to warm up (its answer must hold data: a query that returns
nothing is a failure, not a fast result), then --repeats rounds, each sending every query once
(the order rotated each round, so drift is shared). A figure is the wall time of the HTTP request
from sending to the last byte of the answer (requests, one keep-alive session; decoding the answer
is left out), in ms: p50, p95 (nearest rank: the 19th of 20) and max. Elasticsearch searches are
sent with request_cache=false: a repeated search would otherwise be answered from the shard
request cache, which says nothing of the query. Targets (issue 10): p95 <= 200 ms for every
run-view panel query on each store; <= 1 s (p95) for each cross-run query. The machine's load
average is recorded before and after (other work on its 2 cores slows every query down).

Why a query misses its target: after the rounds, each such query is run 3 more times under the
store's own profiler, and the medians are kept: InfluxDB's EXPLAIN ANALYZE (planning and execution
time; the rest of the wall time is encoding and sending the answer), Elasticsearch's profile API
(the time its shards spent in the query and in the aggregations).

Usage: benchmarks/bench_views.py [--quick] [--nodes N] [--seconds S] [--runs N] [--run-nodes N]
                                 [--run-seconds S] [--repeats R] [--max-points P] [--source RUN_DIR]
                                 [--out FILE]
Prints the figures and writes JSON: everything, each request's text too, to
benchmarks/results/raw/views-<UTC>.json (not tracked), and with --out the summary the docs quote
(benchmarks/results/views-full.json: every query's times, without its text) to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from urllib.parse import urlencode

import requests

from flowstat.replay import replay
from flowstat.timeutil import compact_utc, iso_utc_ms
from flowstat_lab import grafana as gx
from flowstat_lab import kibana as lens_es
from flowstat_lab.figures import TARGETS, p95

ROOT = Path(__file__).resolve().parents[1]

DB, SAMPLES_INDEX = "flowstat", "flowstat-samples"
SELECTED = 10  # nodes in the small selection


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class NoData(AssertionError):
    """A query answered, but with nothing in it."""


@dataclass
class Query:
    """One HTTP request to time, and how to tell that its answer holds data."""

    group: str  # run view, run view variables, cross-run, baseline
    store: str
    title: str  # the panel's (or what is asked)
    selection: str  # which nodes or runs
    url: str
    body: bytes
    content_type: str
    check: Callable[[dict], dict]  # the decoded answer -> what it held (raises NoData when empty)
    shown: dict  # the request, for the JSON
    profiled: tuple[str, bytes] | None = None  # the same request under the store's profiler (url, body)
    ms: list[float] = field(default_factory=list)
    held: dict = field(default_factory=dict)
    response_bytes: int = 0
    profile: dict = field(default_factory=dict)

    def send(self, session: requests.Session) -> requests.Response:
        r = session.post(self.url, data=self.body, headers={"Content-Type": self.content_type}, timeout=120)
        if r.status_code != 200:
            raise RuntimeError(f"{self.store} {self.title} ({self.selection}): HTTP {r.status_code}: {r.text[:500]}")
        return r

    def summary(self) -> dict:
        ms = sorted(self.ms)
        return {
            "group": self.group,
            "store": self.store,
            "title": self.title,
            "selection": self.selection,
            "runs": len(ms),
            "p50_ms": round(median(ms), 1),
            "p95_ms": round(p95(ms), 1),
            "max_ms": round(ms[-1], 1),
            "response_bytes": self.response_bytes,
            **self.held,
            **({"profile": self.profile} if self.profile else {}),
            **self.shown,
        }

    def profiled_ms(self, session: requests.Session) -> dict:
        """The store's own account of the query (ms): InfluxDB's EXPLAIN ANALYZE, Elasticsearch's profile."""
        url, body = self.profiled
        answer = session.post(url, data=body, headers={"Content-Type": self.content_type}, timeout=120).json()
        if self.store == "influxdb":
            lines = [row[0] for row in answer["results"][0]["series"][0]["values"]]
            return {
                key: _go_ms(next(line for line in lines if f"{key}:" in line))
                for key in ("planning_time", "execution_time")
            }
        shards = answer["profile"]["shards"]
        return {
            "query": sum(q["time_in_nanos"] for s in shards for search in s["searches"] for q in search["query"]) / 1e6,
            "aggregations": sum(a["time_in_nanos"] for s in shards for a in s["aggregations"]) / 1e6,
        }


def _go_ms(line: str) -> float:
    """A Go duration at the end of an EXPLAIN ANALYZE line ("1.11s", "18.5ms", "950µs"), in ms."""
    value, unit = re.search(r"([\d.]+)(ns|µs|us|ms|s)\s*$", line).groups()
    return float(value) * {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1000.0}[unit]


# -- the data -----------------------------------------------------------------------------------------


def make_runs(source: Path, tmp: Path, args, stamp: str) -> dict:
    """The big run and the cross-run runs, synthesised from the real run in ``source``."""
    from flowstat.schema.sample import time_ns
    from flowstat.synthetic import synthesize

    started = time_ns(json.loads((source / "run.json").read_text())["started"]) / 1e9
    big_start = time.time() - 7200
    big_id = f"views-{args.nodes}x{args.seconds}-{stamp}"
    say(f"synthesising the run view's run: {args.nodes} nodes x {args.seconds} s ...")
    n = synthesize(source, tmp / big_id, args.nodes, args.seconds, run_id=big_id, shift_s=big_start - started)
    step = args.run_seconds + 10  # a run, then 10 s before the next
    cross = []
    say(f"synthesising {args.runs} runs of {args.run_nodes} nodes x {args.run_seconds} s ...")
    for k in range(args.runs):
        run_id = f"views-cross-{k + 1:02d}-{stamp}"
        synthesize(
            source,
            tmp / run_id,
            args.run_nodes,
            args.run_seconds,
            run_id=run_id,
            parameters={"producers": k + 1},
            shift_s=big_start - (args.runs - k) * step - 60 - started,
        )
        cross.append(run_id)
    return {"big": big_id, "big_samples": n, "cross": cross, "dirs": [tmp / big_id, *(tmp / c for c in cross)]}


def load(stack, runs: dict) -> dict:
    influx, es = stack["influxdb"].url, stack["elasticsearch"].url
    paths = [d / "samples.ndjson" for d in runs["dirs"]]
    say(f"replaying {len(paths)} runs into InfluxDB and Elasticsearch (with rollups) ...")
    t0 = time.perf_counter()
    reports = replay(paths, {"influxdb": (influx, DB), "elasticsearch": (es, SAMPLES_INDEX)})
    seconds = time.perf_counter() - t0
    requests.post(f"{es}/flowstat-*/_refresh", timeout=300).raise_for_status()
    good = sum(r.good for r in reports)
    assert not any(r.bad for r in reports), [r.bad[:3] for r in reports if r.bad]
    body = stack["influxdb"].query(f"SELECT count(\"seq\") FROM \"flowstat_node\" WHERE run_id = '{runs['big']}'", DB)
    in_influx = body["results"][0]["series"][0]["values"][0][1]
    answer = requests.post(
        f"{es}/{SAMPLES_INDEX}*/_count", json={"query": {"term": {"run_id": runs["big"]}}}, timeout=60
    ).json()
    if "count" not in answer:
        raise RuntimeError(f"Elasticsearch did not count the big run's samples: {answer}")
    in_es = answer["count"]
    out = {
        "samples": good,
        "seconds": round(seconds, 1),
        "big_run_samples": runs["big_samples"],
        "big_run_in_influxdb": in_influx,
        "big_run_in_elasticsearch": in_es,
    }
    if not in_influx == in_es == runs["big_samples"]:
        raise RuntimeError(f"the big run is not all stored: {out}")
    return out


def run_range(run_dir: Path) -> tuple[list[str], str, int, int]:
    """The run's nodes (sorted), its agent, and the time range of the whole run in ms (+-5 s)."""
    from flowstat.schema.sample import time_ns

    nodes, agent, first, last = set(), None, None, None
    with open(run_dir / "samples.ndjson") as f:
        next(f)
        for line in f:
            doc = json.loads(line)
            if "node_id" not in doc:  # the agents' self-samples ({"flowstat_agent": ...})
                continue
            nodes.add(doc["node_id"])
            agent = doc["agent"]
            t = time_ns(doc["time"]) // 1_000_000
            first = t if first is None else min(first, t)
            last = t if last is None else max(last, t)
    return sorted(nodes), agent, first - 5000, last + 5000


def spread(nodes: list[str], k: int) -> list[str]:
    """k nodes spread over the sorted list (so over the roles: merger-0~..., merger-1~..., producers-0~...)."""
    return [nodes[i * len(nodes) // k] for i in range(k)]


# -- the queries --------------------------------------------------------------------------------------


def _influx_held(answer: dict) -> dict:
    result = answer["results"][0]
    if "error" in result:
        raise RuntimeError(result["error"])
    series = result.get("series", [])
    points = sum(len(s["values"]) for s in series)
    values = sum(1 for s in series for row in s["values"] for v in row[1:] if v is not None)
    if not values:
        raise NoData("no values")
    return {"series": len(series), "points": points}


def influx_query(url: str, group: str, title: str, selection: str, query: str, **shown) -> Query:
    """A query as Grafana's InfluxQL back end sends it in POST mode: q in the form body, db and epoch=ms."""
    endpoint = f"{url}/query?{urlencode({'db': DB, 'epoch': 'ms'})}"
    return Query(
        group,
        "influxdb",
        title,
        selection,
        endpoint,
        urlencode({"q": query}).encode(),
        "application/x-www-form-urlencoded",
        _influx_held,
        {**shown, "query_chars": len(query)} | ({"query": query} if len(query) < 2000 else {}),
        (endpoint, urlencode({"q": f"EXPLAIN ANALYZE {query}"}).encode()),
    )


def es_search(
    url: str, group: str, title: str, selection: str, index: str, body: dict, check: Callable[[dict], dict], **shown
) -> Query:
    endpoint = f"{url}/{index}/_search?request_cache=false"
    return Query(
        group,
        "elasticsearch",
        title,
        selection,
        endpoint,
        json.dumps(body).encode(),
        "application/json",
        check,
        {**shown, "index": index} | ({"body": body} if len(json.dumps(body)) < 3000 else {}),
        (endpoint, json.dumps({**body, "profile": True}).encode()),
    )


def lens_query(
    url: str, group: str, lens: dict, selection: str, time_range: tuple[int, int], filters: list[dict], **shown
) -> Query:
    """A Lens panel's search (flowstat_lab.kibana) with the Kibana query bar's filters."""
    auto = lens_es.auto_interval_s(time_range)
    search = lens_es.lens_search(lens, time_range, filters, auto)
    (layer,) = lens_es.layers(lens).values()
    drawn = lens_es.shown(layer)

    def check(answer: dict) -> dict:
        rows = search.rows(answer)
        values = [r[c] for r in rows for c in drawn if r.get(c) is not None]
        if not values:
            raise NoData("no values")
        return {"rows": len(rows), "values": len(values)}

    return es_search(
        url,
        group,
        lens["attributes"]["title"],
        selection,
        search.index,
        search.body,
        check,
        lens=lens["id"],
        auto_interval_s=auto,
        **shown,
    )


def _buckets_held(answer: dict) -> dict:
    (agg,) = answer["aggregations"].values()
    values = [b for b in agg["buckets"] if any(v.get("value") is not None for v in b.values() if isinstance(v, dict))]
    if not values:
        raise NoData("no buckets with a value")
    return {"buckets": len(agg["buckets"])}


def _count_held(answer: dict) -> dict:
    if not answer.get("count"):
        raise NoData("count 0")
    return {"count": answer["count"]}


def run_view_queries(stack, run_id: str, run_dir: Path, max_points: int) -> list[Query]:
    nodes, agent, from_ms, to_ms = run_range(run_dir)
    selections = {f"all {len(nodes)} nodes": [gx.ALL], f"{SELECTED} nodes": spread(nodes, SELECTED)}
    return view_queries(stack, run_id, agent, nodes, selections, (from_ms, to_ms), max_points)


def view_queries(
    stack,
    run_id: str,
    agent: str,
    nodes: list[str],
    selections: dict[str, list[str]],
    time_range: tuple[int, int],
    max_points: int,
) -> list[Query]:
    """The run view's queries for a run of ``nodes`` (each selection of them in turn: a list of node
    ids, or [gx.ALL] for "All") over ``time_range`` (ms), and Kibana's run view per 10 s (group "run
    view, per 10 s": the same panels on the per-node rollup). The role variable is on "All"."""
    from flowstat.stores.elasticsearch_rollup import ROLLUP_INDEX
    from flowstat.views import influxql, kibana
    from flowstat.views.panels import RUN_VIEW, RUN_VIEW_10S

    influx, es = stack["influxdb"].url, stack["elasticsearch"].url
    from_ms, to_ms = time_range
    lenses = lens_es.by_id("lens")
    out = []
    for label, chosen in selections.items():
        variables = {"run": [run_id], "agent": [agent], "role": [gx.ALL], "node": chosen}
        for name in ("agent", "node"):
            q = gx.expand(gx.view_interpolate(RUN_VIEW, influxql.variable_query(name), variables), from_ms, to_ms, 1000)
            out.append(influx_query(influx, "run view variables", f"${name}", label, q))
        for panel in RUN_VIEW.panels():
            q, interval = gx.panel_query(RUN_VIEW, panel, variables, from_ms, to_ms, max_points)
            out.append(influx_query(influx, "run view", panel.title, label, q, interval_ms=interval))
        for view, group in ((RUN_VIEW, "run view"), (RUN_VIEW_10S, "run view, per 10 s")):  # the latter Kibana's only
            for panel in view.panels():
                lens = lenses[kibana.lens_id(view, panel)]
                filters = [{"term": {"run_id": run_id}}]
                title = lens_es.data_view_of(lens, next(iter(lens_es.layers(lens))))["attributes"]["title"]
                if title.startswith((SAMPLES_INDEX, ROLLUP_INDEX)):  # the nodes' documents, not the run's
                    filters.append({"term": {"agent": agent}})
                    if chosen != [gx.ALL]:
                        filters.append({"terms": {"node_id": chosen}})
                out.append(lens_query(es, group, lens, label, (from_ms, to_ms), filters))
    return out


def cross_run_queries(stack, run_ids: list[str], dirs: list[Path], max_points: int) -> list[Query]:
    from flowstat.views import grafana, influxql, kibana
    from flowstat.views.panels import AGGREGATE_VIEW

    influx, es = stack["influxdb"].url, stack["elasticsearch"].url
    ranges = [run_range(d) for d in dirs]
    agent = ranges[0][1]
    from_ms, to_ms = min(r[2] for r in ranges) - 60_000, max(r[3] for r in ranges) + 60_000
    label = f"{len(run_ids)} runs"
    variables = {"runs": run_ids, "agent": [agent], "param": ["producers"]}
    panels = {p.title: p for p in AGGREGATE_VIEW.panels()}
    table, chart = (
        panels["Mean and standard deviation per run"],
        panels["Merged objects/s (steady) against the parameter"],
    )
    lenses = lens_es.by_id("lens")
    out = [
        influx_query(
            influx,
            "cross-run",
            "$runs (the runs to compare)",
            "the time range",
            gx.expand(influxql.variable_query("runs"), from_ms, to_ms, 1000),
        )
    ]
    q, _ = gx.panel_query(AGGREGATE_VIEW, table, variables, from_ms, to_ms, max_points)
    out.append(influx_query(influx, "cross-run", table.title, label, q))
    index, body = gx.elasticsearch_request(grafana._target(AGGREGATE_VIEW, chart), variables, from_ms, to_ms)
    out.append(es_search(es, "cross-run", chart.title + " (Grafana)", label, index, body, _buckets_held))
    for panel in (table, chart):
        out.append(
            lens_query(
                es,
                "cross-run",
                lenses[kibana.lens_id(AGGREGATE_VIEW, panel)],
                label,
                (from_ms, to_ms),
                [{"terms": {"run_id": run_ids}}],
            )
        )
    return out


def stack_view_queries(stack, time_range: tuple[int, int], max_points: int) -> list[Query]:
    """The agents view's panels (Grafana's InfluxQL and Kibana's Lens) over ``time_range`` (ms)."""
    from flowstat.views import kibana
    from flowstat.views.panels import STACK_VIEW

    influx, es = stack["influxdb"].url, stack["elasticsearch"].url
    lenses = lens_es.by_id("lens")
    out = []
    for panel in STACK_VIEW.panels():
        q, interval = gx.panel_query(STACK_VIEW, panel, {}, *time_range, max_points)
        out.append(influx_query(influx, "stack view", panel.title, "every agent", q, interval_ms=interval))
        lens = lenses[kibana.lens_id(STACK_VIEW, panel)]
        out.append(lens_query(es, "stack view", lens, "every agent", time_range, []))
    return out


def baselines(stack, run_id: str) -> list[Query]:
    influx, es = stack["influxdb"].url, stack["elasticsearch"].url
    return [
        influx_query(
            influx,
            "baseline",
            "count of the run's samples",
            "the run",
            f'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_id}\'',
        ),
        Query(
            "baseline",
            "elasticsearch",
            "_count of the run's documents",
            "the run",
            f"{es}/{SAMPLES_INDEX}/_count",
            json.dumps({"query": {"term": {"run_id": run_id}}}).encode(),
            "application/json",
            _count_held,
            {"index": SAMPLES_INDEX},
        ),
    ]


def measure(queries: list[Query], repeats: int) -> None:
    session = requests.Session()
    say(f"warm-up: {len(queries)} queries, each checked for data ...")
    for q in queries:
        r = q.send(session)
        q.response_bytes = len(r.content)
        try:
            q.held = q.check(r.json())
        except NoData as exc:
            raise NoData(f"{q.store} {q.title} ({q.selection}) returned no data ({exc}): {q.shown}") from None
    for i in range(repeats):
        say(f"round {i + 1}/{repeats} ...")
        for q in queries[i % len(queries) :] + queries[: i % len(queries)]:
            t0 = time.perf_counter()
            q.send(session)  # an answer other than 200 raises
            q.ms.append((time.perf_counter() - t0) * 1000)
    missed = [q for q in queries if q.group in TARGETS and p95(sorted(q.ms)) > TARGETS[q.group]]
    if missed:
        say(f"profiling the {len(missed)} queries over their target ...")
    for q in missed:
        runs = [q.profiled_ms(session) for _ in range(3)]
        q.profile = {f"{key}_ms": round(median(r[key] for r in runs), 1) for key in runs[0]}


def verdicts(queries: list[Query]) -> dict:
    base = {q.store: median(q.ms) for q in queries if q.group == "baseline"}
    out: dict = {"baseline_p50_ms": {k: round(v, 1) for k, v in base.items()}}
    for group, target in TARGETS.items():
        mine = [q for q in queries if q.group == group]
        per_store = {}
        for store in ("influxdb", "elasticsearch"):
            ours = [q for q in mine if q.store == store]
            if not ours:
                continue
            worst = max(ours, key=lambda q: p95(sorted(q.ms)))
            per_store[store] = {
                "queries": len(ours),
                "worst_p95_ms": round(p95(sorted(worst.ms)), 1),
                "worst": f"{worst.title} ({worst.selection})",
                "over_target": [f"{q.title} ({q.selection})" for q in ours if p95(sorted(q.ms)) > target],
                "median_p50_ms": round(median(median(q.ms) for q in ours), 1),
            }
        out[group] = {
            "target_p95_ms": target,
            **per_store,
            "target_met": all(not s["over_target"] for s in per_store.values()),
        }
    return out


def table(queries: list[Query]) -> str:
    lines = [f"{'group':<19} {'store':<13} {'query':<52} {'selection':<15} {'p50':>7} {'p95':>7} {'max':>7}"]
    for q in queries:
        ms = sorted(q.ms)
        lines.append(
            f"{q.group:<19} {q.store:<13} {q.title[:52]:<52} {q.selection:<15} {median(ms):7.1f} "
            f"{p95(ms):7.1f} {ms[-1]:7.1f}"
        )
    return "\n".join(lines)


def wipe(cache: Path) -> None:
    """The stores' data: each benchmark starts from empty stores."""
    for sub in ("influxdb/data", "influxdb/meta", "influxdb/wal", "elasticsearch/data"):
        shutil.rmtree(cache / sub, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small runs, 3 rounds (a sanity check, not a measurement)")
    ap.add_argument("--nodes", type=int, default=500, help="nodes of the run view's run (default 500)")
    ap.add_argument("--seconds", type=int, default=300, help="its samples per node, one a second (default 300)")
    ap.add_argument("--runs", type=int, default=50, help="runs compared (default 50)")
    ap.add_argument("--run-nodes", type=int, default=20, help="nodes of each compared run (default 20)")
    ap.add_argument("--run-seconds", type=int, default=60, help="samples per node of each compared run (default 60)")
    ap.add_argument("--repeats", type=int, default=20, help="timed rounds after the warm-up (default 20)")
    ap.add_argument(
        "--max-points",
        type=int,
        default=1500,
        help="a Grafana panel's max data points: its width in " "pixels (default 1500)",
    )
    ap.add_argument("--source", type=Path, help="a run directory to replicate (default: record a 10 s demo run)")
    ap.add_argument("--out", type=Path, help="the summary (each query without its text) to this file too")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.seconds, args.runs, args.run_nodes, args.run_seconds, args.repeats = 40, 60, 5, 8, 20, 3
    from bench_ingest import free_port
    from bench_report import record_run
    from run_benchmarks import command_line, machine, save_results

    from flowstat.stack import Stack

    stamp = compact_utc()
    results = {
        "started": iso_utc_ms(),
        "machine": machine(),
        "command": command_line(),
        "parameters": {k: v for k, v in vars(args).items() if k not in ("out", "source")},
        "benchmarks": {},
    }
    cache = ROOT / ".cache" / "bench-stack"
    stack = Stack(
        cache, {"influxdb": free_port(), "elasticsearch": free_port()}, services=("influxdb", "elasticsearch")
    )
    with tempfile.TemporaryDirectory(prefix="flowstat-views-") as tmp:
        source = args.source
        if source is None:
            say("recording a 10 s run of the demo topology ...")
            source = record_run(Path(tmp) / "recorded", 10.0)
        runs = make_runs(source, Path(tmp) / "runs", args, stamp)
        wipe(cache)  # what a benchmark cut short left behind would be queried too
        try:
            stack.up(report=say)
            results["benchmarks"]["replay"] = load(stack, runs)
            queries = (
                run_view_queries(stack, runs["big"], runs["dirs"][0], args.max_points)
                + cross_run_queries(stack, runs["cross"], runs["dirs"][1:], args.max_points)
                + baselines(stack, runs["big"])
            )
            load_before = os.getloadavg()
            measure(queries, args.repeats)
            results["benchmarks"]["load_average"] = {"before": load_before, "after": os.getloadavg()}
        finally:
            stack.down(report=say)
            wipe(cache)
    results["benchmarks"]["views"] = {"verdicts": verdicts(queries), "queries": [q.summary() for q in queries]}
    print(table(queries), flush=True)
    whole = ROOT / "benchmarks" / "results" / "raw" / f"views-{stamp}.json"
    if args.out:  # the summary: every query's figures; the requests themselves stay in the raw file (issue 41)
        save_results(without_requests(results), args.out, quiet=True)
    save_results(results, whole)
    return 0


SUMMARY_KEYS = ["group", "store", "title", "selection", "p50_ms", "p95_ms", "max_ms"]


def without_requests(results: dict) -> dict:
    """RESULTS with each query's times alone (SUMMARY_KEYS), a row a query (run_benchmarks.table): the
    figures the docs quote; its text (InfluxQL "query", Elasticsearch "body"), sizes and counts stay in
    the raw file."""
    from run_benchmarks import table

    views = results["benchmarks"]["views"]
    queries = table(views["queries"], SUMMARY_KEYS)
    return {**results, "benchmarks": {**results["benchmarks"], "views": {**views, "queries": queries}}}


if __name__ == "__main__":
    sys.exit(main())
