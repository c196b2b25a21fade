#!/usr/bin/env python3
"""Ingest benchmarks (issue 4), against real servers started with flowstat stack.

replay      1,000,000 samples (a generated run file: 100 nodes x 10,000 samples) replayed into
            InfluxDB and, separately, into Elasticsearch by `flowstat replay`'s code; each compared
            with a baseline measured in the same run that posts the same data pre-serialised with
            plain HTTP in the same batch size (so the baseline is the store's own ingestion speed).
            Each store is first warmed up with 200,000 samples into a target thrown away.
latency     live: the C agent samples 20 processes at 10 Hz for S seconds into Telegraf -> InfluxDB
            and directly into Elasticsearch; a poller asks each store every 100 ms for what is
            new; a sample's latency = when it was first seen queryable - its timestamp (so the
            figures include up to 100 ms of polling granularity).

Usage: benchmarks/bench_ingest.py [--quick] [--samples N] [--latency-seconds S] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
BATCH = 5000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_run_file(path: Path, run_id: str, n: int, nodes: int = 100) -> None:
    from flowstat.timeutil import iso_utc_ms

    t0 = time.time() - 86400  # yesterday: inside the raw retention policy
    with open(path, "w") as f:
        f.write(json.dumps({"flowstat_run": {"run_id": run_id, "parameters": {"producers": nodes}}}) + "\n")
        for i in range(n):
            node, seq = i % nodes, i // nodes
            f.write(json.dumps({"time": iso_utc_ms(t0 + seq * 0.1), "run_id": run_id, "host": "bench",
                                "node_id": f"node-{node:03d}", "role": "merger", "agent": "flowstat-agent-c",
                                "seq": seq, "pid": 10000 + node, "node_state": "RUNNING", "vmrss_kb": 30000 + i % 977,
                                "cpu_clock_hz": round(1000.0 + i % 5000 / 10, 1), "cpu_user_hz": 900.5,
                                "cpu_system_hz": 100.0, "threads": 4, "average_merge_time_ms": 0.012,
                                "merged_objects_per_second": 400.0, "objects_received": i, "backlog": i % 7,
                                "send_buffer_overloaded": False}) + "\n")


def serialise(path: Path, store: str, target: str) -> list[bytes]:
    """The same samples, encoded ahead of time, in batches: what the baseline posts."""
    from flowstat_agent import schema

    batches, cur = [], []
    with open(path) as f:
        next(f)
        for line in f:
            doc = json.loads(line)
            if store == "influxdb":
                cur.append(schema.to_line_protocol(doc) + "\n")
            else:
                cur.append(json.dumps({"index": {"_index": target, "_id": schema.document_id(doc)}}) + "\n"
                           + schema.to_json(doc) + "\n")
            if len(cur) == BATCH:
                batches.append("".join(cur).encode())
                cur = []
    if cur:
        batches.append("".join(cur).encode())
    return batches


def baseline(store: str, url: str, target: str, batches: list[bytes], n: int) -> dict:
    session = requests.Session()
    t0 = time.perf_counter()
    for body in batches:
        if store == "influxdb":
            r = session.post(f"{url}/write", params={"db": target, "precision": "ns"}, data=body, timeout=300)
        else:
            r = session.post(f"{url}/_bulk", data=body, headers={"Content-Type": "application/x-ndjson"}, timeout=300)
            assert not r.json().get("errors"), "baseline bulk had errors"
        r.raise_for_status()
    elapsed = time.perf_counter() - t0
    return {"samples": n, "seconds": round(elapsed, 3), "samples_per_second": round(n / elapsed, 1)}


def replay_rate(store: str, url: str, target: str, path: Path, n: int) -> dict:
    from flowstat.replay import replay

    t0 = time.perf_counter()
    kwargs = {"influx": url, "es": None, "db": target} if store == "influxdb" else {"influx": None, "es": url, "index": target}
    reports = replay([path], **kwargs)
    elapsed = time.perf_counter() - t0
    assert reports[0].good == n and not reports[0].bad
    return {"samples": n, "seconds": round(elapsed, 3), "samples_per_second": round(n / elapsed, 1)}


def stored_count(store: str, stack, target: str, run_id: str) -> int:
    if store == "influxdb":
        body = stack["influxdb"].query(f"SELECT count(\"seq\") FROM \"flowstat_node\" WHERE run_id = '{run_id}'", target)
        return body["results"][0]["series"][0]["values"][0][1]
    es = stack["elasticsearch"].url
    requests.post(f"{es}/{target}/_refresh", timeout=120)
    return requests.get(f"{es}/{target}/_count", timeout=60).json()["count"]


def bench_replay(stack, tmp: Path, n: int) -> dict:
    path = tmp / "samples.ndjson"
    make_run_file(path, "bench-replay", n)
    out = {"samples": n, "batch": BATCH}
    for store, url in (("influxdb", stack["influxdb"].url), ("elasticsearch", stack["elasticsearch"].url)):
        base_target = "bench_base" if store == "influxdb" else "flowstat-samples-bench-base"
        replay_target = "bench_replay" if store == "influxdb" else "flowstat-samples-bench-replay"
        if store == "influxdb":
            for db in (base_target, replay_target):
                stack["influxdb"].query(f'CREATE DATABASE "{db}"')
        print(f"  {store}: serialising the baseline ...", flush=True)
        batches = serialise(path, store, base_target)
        # Warm the store up first (JIT, caches, index creation), into a target thrown away: whichever
        # of baseline and replay ran first on a cold store would otherwise look slower (ES: 1.19x).
        warm_target = "bench_warmup" if store == "influxdb" else "flowstat-samples-bench-warmup"
        if store == "influxdb":
            stack["influxdb"].query(f'CREATE DATABASE "{warm_target}"')
        warm = [b.replace(base_target.encode(), warm_target.encode()) if store == "elasticsearch" else b
                for b in batches[:len(batches) // 5]]
        print(f"  {store}: warm-up with {len(warm) * BATCH:,} samples ...", flush=True)
        baseline(store, url, warm_target, warm, len(warm) * BATCH)
        del warm
        print(f"  {store}: baseline ...", flush=True)
        base = baseline(store, url, base_target, batches, n)
        del batches
        print(f"  {store}: replay ...", flush=True)
        rep = replay_rate(store, url, replay_target, path, n)
        out[store] = {"baseline": base, "replay": rep,
                      "ratio_to_baseline": round(rep["samples_per_second"] / base["samples_per_second"], 3),
                      "stored_baseline": stored_count(store, stack, base_target, "bench-replay"),
                      "stored_replay": stored_count(store, stack, replay_target, "bench-replay"),
                      "target_met": rep["samples_per_second"] >= 0.8 * base["samples_per_second"]}
    return out


def bench_latency(stack, seconds: float) -> dict:
    run_id = f"bench-latency-{int(time.time())}"
    targets = [subprocess.Popen(["sleep", "3600"]) for _ in range(20)]
    args = [a for p in targets for a in ("--pid", str(p.pid))]
    seen: dict[str, dict[tuple[str, int], float]] = {"influxdb": {}, "elasticsearch": {}}
    stamps: dict[tuple[str, int], float] = {}
    stop = threading.Event()

    def poll_influx():
        influx = stack["influxdb"]
        last = 0
        while not stop.is_set():
            body = influx.query(f"SELECT \"seq\" FROM \"flowstat_node\" WHERE run_id = '{run_id}' AND time > {last} "
                                f"GROUP BY node_id", "flowstat")
            now = time.time()
            for s in body["results"][0].get("series", []):
                for t, seq in s["values"]:
                    key = (s["tags"]["node_id"], seq)
                    seen["influxdb"].setdefault(key, now)
                    stamps[key] = t / 1e9
                    last = max(last, t)
            stop.wait(0.1)

    def poll_es():
        es = stack["elasticsearch"].url
        last = 0
        while not stop.is_set():
            body = requests.post(f"{es}/flowstat-samples/_search", json={
                "size": 10000, "_source": ["node_id", "seq", "time"], "query": {"bool": {"filter": [
                    {"term": {"run_id": run_id}}, {"range": {"time": {"gte": last}}}]}}}, timeout=10).json()
            now = time.time()
            for h in body.get("hits", {}).get("hits", []):
                src = h["_source"]
                seen["elasticsearch"].setdefault((src["node_id"], src["seq"]), now)
            stop.wait(0.1)

    pollers = [threading.Thread(target=poll_influx, daemon=True), threading.Thread(target=poll_es, daemon=True)]
    for t in pollers:
        t.start()
    agent = subprocess.run([str(C_AGENT), *args, "--run-id", run_id, "--interval", "0.1", "--duration", str(seconds),
                            "--sink", stack["telegraf"].write_url,
                            "--sink", f"elasticsearch://127.0.0.1:{stack['elasticsearch'].port}/flowstat-samples",
                            "--quiet"], capture_output=True, text=True)
    time.sleep(5)  # let the last samples arrive before the pollers stop
    stop.set()
    for t in pollers:
        t.join()
    for p in targets:
        p.kill()
        p.wait()
    out = {"processes": 20, "interval_s": 0.1, "seconds": seconds, "agent_exit": agent.returncode,
           "polling_granularity_s": 0.1}
    for store, first_seen in seen.items():
        lat = sorted(first_seen[k] - stamps[k] for k in first_seen if k in stamps)
        if not lat:
            out[store] = {"samples": 0}
            continue
        pct = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 3)
        out[store] = {"samples": len(lat), "p50_s": pct(0.5), "p99_s": pct(0.99), "max_s": round(lat[-1], 3),
                      "target_p99_le_2s": pct(0.99) <= 2.0}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--latency-seconds", type=float, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.samples, args.latency_seconds = 50_000, 10
    from flowstat.stack import Stack
    from flowstat.timeutil import compact_utc, iso_utc_ms
    from run_benchmarks import machine, save_results

    cache = ROOT / ".cache" / "bench-stack"
    stack = Stack(cache, {"influxdb": free_port(), "elasticsearch": free_port(), "telegraf": free_port()})
    stack.up()
    results = {"started": iso_utc_ms(), "machine": machine(), "command": " ".join(sys.argv), "benchmarks": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="flowstat-ingest-") as tmp:
            print(f"replay of {args.samples:,} samples ...", flush=True)
            results["benchmarks"]["replay"] = bench_replay(stack, Path(tmp), args.samples)
        print("end-to-end latency ...", flush=True)
        results["benchmarks"]["latency"] = bench_latency(stack, args.latency_seconds)
    finally:
        stack.down()
        import shutil
        for sub in ("influxdb/data", "influxdb/meta", "influxdb/wal", "elasticsearch/data"):
            shutil.rmtree(cache / sub, ignore_errors=True)
    save_results(results, args.out or ROOT / "benchmarks" / "results" / f"ingest-{compact_utc()}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
