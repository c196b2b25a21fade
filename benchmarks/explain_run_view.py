#!/usr/bin/env python3
"""Why a run view panel is slow: its queries with the node variable on All and on 10 nodes, against
stores that hold a run (a soak's while it ingests, or any), timed and profiled side by side.

For each panel named (default: CPU clock, VmRSS, Node state), in each store, for each selection:
the wall time of --repeats sends (ms, as bench_views times them: request to the answer's last
byte), what the answer held, and the store's own account of one more send (bench_views.Query.
profiled_ms: InfluxDB's EXPLAIN ANALYZE planning and execution time, Elasticsearch's profile of the
query phase and the aggregations; the profiler's times are inflated by the profiling). InfluxDB's
EXPLAIN ANALYZE of the All query is printed whole (its cursors say how many series were read).

The queries are the soak's (bench_soak.timed_queries): bench_views.view_queries for the run and
agent, time range from --since to now; the 10 nodes are spread over the first 50 the agent watched,
by name. docs/benchmarks.md ("The hour, third run") quotes a run of this at minute 56 of a soak.

Usage: benchmarks/explain_run_view.py --influxdb URL --elasticsearch URL [--run ID] [--agent TAG]
                                      [--since EPOCH_S] [--repeats N] [--panel TITLE ...]
Writes JSON to stdout, a line per query to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace

import bench_views as bv
import requests


def influx(url: str, q: str) -> list[list]:
    answer = requests.post(f"{url}/query", params={"db": bv.DB}, data={"q": q}, timeout=60).json()
    series = answer["results"][0].get("series") or [{"values": []}]
    return series[0]["values"]


def tag_values(url: str, key: str, where: str = "") -> list[str]:
    return [row[1] for row in influx(url, f'SHOW TAG VALUES FROM "flowstat_node" WITH KEY = "{key}"{where}')]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--influxdb", required=True, help="InfluxDB's URL (database flowstat)")
    ap.add_argument("--elasticsearch", required=True, help="Elasticsearch's URL (index flowstat-samples)")
    ap.add_argument("--run", help="run id (default: the last by name)")
    ap.add_argument("--agent", help="agent tag (default: the one that watched the most nodes of the run)")
    ap.add_argument("--since", type=float, help="start of the time range, epoch seconds (default: 30 min ago)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--panel", action="append", help="panel title (repeatable; default: CPU clock, VmRSS, Node state)")
    args = ap.parse_args()
    iurl = args.influxdb.rstrip("/")
    runs = tag_values(iurl, "run_id")
    if not runs:
        sys.exit(f"explain_run_view: {iurl} holds no flowstat_node samples")
    run = args.run or sorted(runs)[-1]
    where = f" WHERE \"run_id\" = '{run}'"
    agent = args.agent or max(
        tag_values(iurl, "agent", where),
        key=lambda a: len(tag_values(iurl, "node_id", f"{where} AND \"agent\" = '{a}'")),
    )
    nodes = sorted(tag_values(iurl, "node_id", f"{where} AND \"agent\" = '{agent}'"))[:50]
    now_ms = int(time.time() * 1000)
    since_ms = int(args.since * 1000) if args.since else now_ms - 30 * 60_000
    stack = {
        "influxdb": SimpleNamespace(url=iurl),
        "elasticsearch": SimpleNamespace(url=args.elasticsearch.rstrip("/")),
    }
    selections = {"all": [bv.gx.ALL], f"{bv.SELECTED} nodes": bv.spread(nodes, bv.SELECTED)}
    panels = set(args.panel or ["CPU clock", "VmRSS", "Node state"])
    queries = [
        q
        for q in bv.view_queries(stack, run, agent, nodes, selections, (since_ms, now_ms), 1500)
        if q.group == "run view" and q.title in panels
    ]
    session = requests.Session()
    out = {"run": run, "agent": agent, "from_ms": since_ms, "to_ms": now_ms, "queries": []}
    for q in queries:
        ms = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            answer = q.send(session)
            ms.append(round((time.perf_counter() - t0) * 1000, 1))
        row = {
            "store": q.store,
            "panel": q.title,
            "selection": q.selection,
            "ms": ms,
            "held": q.check(answer.json()),
            "profiled_ms": q.profiled_ms(session),
        }
        out["queries"].append(row)
        print(
            f"{q.store:14s} {q.title:12s} {q.selection:9s} ms={ms} held={row['held']} {row['profiled_ms']}",
            file=sys.stderr,
        )
        if q.store == "influxdb" and q.selection == "all" and q.profiled:
            url, body = q.profiled
            plan = session.post(url, data=body, headers={"Content-Type": q.content_type}, timeout=120).json()
            row["explain"] = [r[0] for r in plan["results"][0]["series"][0]["values"]]
            print("\n".join(row["explain"]), file=sys.stderr)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
