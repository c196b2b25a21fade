#!/usr/bin/env python3
"""Ingest benchmarks (issue 4), against real servers started with flowstat stack.

replay      1,000,000 samples (a generated run file: 100 nodes x 10,000 samples) replayed into
            InfluxDB and, separately, into Elasticsearch by `flowstat replay`'s code; each compared
            with a baseline measured in the same run that posts the same data pre-serialised with
            plain HTTP in the same batch size (so the baseline is the store's own ingestion speed).
            Each store is first warmed up with 200,000 samples into a target thrown away; then
            --rounds pairs (baseline, replay), interleaved and alternating which goes first, each
            into a fresh target that is counted and dropped; the target is judged on the median ratio.
contention  the same pre-encoded batches posted to InfluxDB alone, beside replay's parsing in a
            thread of the posting process, and beside it in another process (why replay posts
            from processes of its own).
latency     live: the C agent samples 20 processes at 10 Hz for S seconds into Telegraf -> InfluxDB
            and directly into Elasticsearch; a poller asks each store every 100 ms for what is
            new; a sample's latency = when it was first seen queryable - its timestamp (so the
            figures include up to 100 ms of polling granularity).

Usage: benchmarks/bench_ingest.py [--quick] [--samples N] [--rounds R] [--latency-seconds S] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

import requests

from flowstat import stores
from flowstat.proc.procfs import tree_cpu_seconds
from flowstat_lab.figures import pct

ROOT = Path(__file__).resolve().parents[1]
C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
BATCH = 5000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_run_file(path: Path, run_id: str, n: int, nodes: int = 100) -> None:
    """A run file as the Python agent writes it: a header, then n samples of ``nodes`` nodes."""
    from flowstat.timeutil import iso_utc_ms

    t0 = time.time() - 86400  # yesterday: inside the raw retention policy
    with open(path, "w") as f:
        f.write(json.dumps({"flowstat_run": {"run_id": run_id, "parameters": {"producers": nodes}}}) + "\n")
        for i in range(n):
            node, seq = i % nodes, i // nodes
            f.write(
                json.dumps(
                    {
                        "time": iso_utc_ms(t0 + seq * 0.1),
                        "run_id": run_id,
                        "host": "bench",
                        "node_id": f"node-{node:03d}",
                        "role": "merger",
                        "agent": "flowstat-agent-c",
                        "seq": seq,
                        "pid": 10000 + node,
                        "node_state": "RUNNING",
                        "vmrss_kb": 30000 + i % 977,
                        "cpu_clock_hz": round(1000.0 + i % 5000 / 10, 1),
                        "cpu_user_hz": 900.5,
                        "cpu_system_hz": 100.0,
                        "threads": 4,
                        "average_merge_time_ms": 0.012,
                        "merged_objects_per_second": 400.0,
                        "objects_received": i,
                        "objects_held": i % 7,
                        "send_buffer_overloaded": False,
                    }
                )
                + "\n"
            )


def serialise(path: Path, store: str, target: str) -> list[tuple[bytes, int]]:
    """The same samples, encoded ahead of time by the store's writer, in batches: what the baseline posts."""
    writer = stores.get(store)("http://unused", target)
    batches, cur = [], []
    with open(path) as f:
        next(f)
        for line in f:
            cur.append(json.loads(line))
            if len(cur) == BATCH:
                batches.append((writer.encode(cur), len(cur)))
                cur = []
    if cur:
        batches.append((writer.encode(cur), len(cur)))
    return batches


def measured(n: int, server_pid: int, work, beside=None) -> dict:
    """Run work(); its wall time and rate, and the CPU it cost: this process (the client's
    reader), its reaped children (replay's posting processes) and the server (all its threads).
    beside(), if given, starts other work once the first readings are taken (a thread started
    before them slows the reading of /proc itself) and returns what waits for it to end."""
    server0, own0 = tree_cpu_seconds(server_pid), time.process_time()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wait = beside() if beside else None
    t0 = time.perf_counter()
    work()
    elapsed = time.perf_counter() - t0
    if wait:
        wait()
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "samples": n,
        "seconds": round(elapsed, 3),
        "samples_per_second": round(n / elapsed, 1),
        "client_cpu_us_per_sample": round((time.process_time() - own0) / n * 1e6, 2),
        "client_children_cpu_us_per_sample": round(
            (kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime) / n * 1e6, 2
        ),
        "server_cpu_s": round(tree_cpu_seconds(server_pid) - server0, 2),
    }


def post_batches(store: str, url: str, target: str, batches: list[tuple[bytes, int]]) -> None:
    """Post pre-encoded batches one after the other with the store's writer, once each."""
    writer = stores.get(store)(url, target, timeout_s=300)
    for body, count in batches:
        done = writer.post(body, count)
        assert done.accepted == count and done.retry is None, f"baseline batch not taken: {done.reasons[:1]}"


def baseline(store: str, url: str, target: str, batches: list[bytes], n: int, server_pid: int) -> dict:
    return measured(n, server_pid, lambda: post_batches(store, url, target, batches))


def replay_rate(store: str, url: str, target: str, path: Path, n: int, server_pid: int) -> dict:
    from flowstat.replay import replay

    reports = []
    out = measured(n, server_pid, lambda: reports.extend(replay([path], {store: (url, target)})))
    assert reports[0].good == n and not reports[0].bad
    return out


def stored_count(store: str, stack, target: str, run_id: str) -> int:
    if store == "influxdb":
        body = stack["influxdb"].query(f'SELECT count("seq") FROM "flowstat_node" WHERE run_id = \'{run_id}\'', target)
        return body["results"][0]["series"][0]["values"][0][1]
    es = stack["elasticsearch"].url
    requests.post(f"{es}/{target}/_refresh", timeout=120)
    return requests.get(f"{es}/{target}/_count", timeout=60).json()["count"]


def create_target(stack, store: str, name: str) -> None:
    if store == "influxdb":
        stack["influxdb"].query(f'CREATE DATABASE "{name}"')


def drop_target(stack, store: str, name: str) -> None:
    """Each measurement writes into a fresh target, dropped once counted: a store that keeps
    growing would make whatever ran later look slower."""
    if store == "influxdb":
        stack["influxdb"].query(f'DROP DATABASE "{name}"')
    else:
        requests.delete(f"{stack['elasticsearch'].url}/{name}", timeout=120)


def retarget(batches: list[tuple[bytes, int]], store: str, old: str, new: str) -> list[tuple[bytes, int]]:
    """The baseline's batches aimed at another index (the _bulk action lines name it)."""
    return (
        [(b.replace(f'"_index":"{old}"'.encode(), f'"_index":"{new}"'.encode()), c) for b, c in batches]
        if store == "elasticsearch"
        else batches
    )


def bench_replay(stack, tmp: Path, n: int, rounds: int) -> dict:
    path = tmp / "samples.ndjson"
    make_run_file(path, "bench-replay", n)
    out = {"samples": n, "batch": BATCH, "rounds": rounds}
    for store, url in (("influxdb", stack["influxdb"].url), ("elasticsearch", stack["elasticsearch"].url)):
        name = (
            (lambda kind, r: f"bench_{kind}_{r}")
            if store == "influxdb"
            else (lambda kind, r: f"flowstat-samples-bench-{kind}-{r}")
        )
        print(f"  {store}: serialising the baseline ...", flush=True)
        batches = serialise(path, store, name("base", 0))
        # Warm the store up first (JIT, caches), into a target thrown away: whichever of baseline
        # and replay ran first on a cold store would otherwise look slower (ES: 1.19x once).
        warm = retarget(batches[: len(batches) // 5], store, name("base", 0), name("warmup", 0))
        create_target(stack, store, name("warmup", 0))
        print(f"  {store}: warm-up with {len(warm) * BATCH:,} samples ...", flush=True)
        post_batches(store, url, name("warmup", 0), warm)
        drop_target(stack, store, name("warmup", 0))
        del warm
        measured = []
        for r in range(rounds):
            # Interleaved, and each round in the other order: the machine's speed drifts (other
            # tenants), and both sides of a ratio should see the same drift.
            result = {}
            for kind in ("baseline", "replay") if r % 2 == 0 else ("replay", "baseline"):
                target = name(kind, r)
                create_target(stack, store, target)
                print(f"  {store}: round {r + 1}/{rounds}: {kind} ...", flush=True)
                server = stack[store].pid()
                if kind == "baseline":
                    result[kind] = baseline(
                        store, url, target, retarget(batches, store, name("base", 0), target), n, server
                    )
                else:
                    result[kind] = replay_rate(store, url, target, path, n, server)
                result[kind]["stored"] = stored_count(store, stack, target, "bench-replay")
                drop_target(stack, store, target)
            result["ratio_to_baseline"] = round(
                result["replay"]["samples_per_second"] / result["baseline"]["samples_per_second"], 3
            )
            measured.append(result)
        del batches
        ratios = [m["ratio_to_baseline"] for m in measured]
        out[store] = {
            "rounds": measured,
            "baseline_samples_per_second_median": median(m["baseline"]["samples_per_second"] for m in measured),
            "replay_samples_per_second_median": median(m["replay"]["samples_per_second"] for m in measured),
            "ratio_to_baseline_median": round(median(ratios), 3),
            "ratio_to_baseline_min_max": [min(ratios), max(ratios)],
            "all_stored": all(m[k]["stored"] == n for m in measured for k in ("baseline", "replay")),
            "target_met": median(ratios) >= 0.8,
        }
    return out


def bench_posting_contention(stack, tmp: Path, n: int) -> dict:
    """Why replay posts from processes: the same pre-encoded batches posted to InfluxDB alone, with
    replay's parsing running in a thread of the posting process, and with it in another process."""
    path = tmp / "samples.ndjson"
    url, server = stack["influxdb"].url, stack["influxdb"].pid()
    batches = serialise(path, "influxdb", "bench_contention")
    parse = (
        "from pathlib import Path; from flowstat.replay import FileReport, read_batches; "
        "from flowstat.stores.influxdb import InfluxDBWriter; "
        f"p = Path({str(path)!r}); r = FileReport(str(p)); "
        "[None for _ in read_batches(p, r, [InfluxDBWriter('http://unused').encoder()])]"
    )

    def in_a_thread():
        t = threading.Thread(target=exec, args=(parse, {}))
        t.start()
        return t.join

    def in_a_process():
        return subprocess.Popen([sys.executable, "-c", parse]).wait

    out = {"samples": n}
    for case, beside in (
        ("alone", None),
        ("parsing in a thread", in_a_thread),
        ("parsing in another process", in_a_process),
        ("alone again", None),
    ):
        create_target(stack, "influxdb", "bench_contention")
        print(f"  posting {case} ...", flush=True)
        out[case] = measured(n, server, lambda: post_batches("influxdb", url, "bench_contention", batches), beside)
        drop_target(stack, "influxdb", "bench_contention")
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
            body = influx.query(
                f'SELECT "seq" FROM "flowstat_node" WHERE run_id = \'{run_id}\' AND time > {last} ' f"GROUP BY node_id",
                "flowstat",
            )
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
            body = requests.post(
                f"{es}/flowstat-samples*/_search",
                json={
                    "size": 10000,
                    "_source": ["node_id", "seq", "time"],
                    "query": {"bool": {"filter": [{"term": {"run_id": run_id}}, {"range": {"time": {"gte": last}}}]}},
                },
                timeout=10,
            ).json()
            now = time.time()
            for h in body.get("hits", {}).get("hits", []):
                src = h["_source"]
                seen["elasticsearch"].setdefault((src["node_id"], src["seq"]), now)
            stop.wait(0.1)

    pollers = [threading.Thread(target=poll_influx, daemon=True), threading.Thread(target=poll_es, daemon=True)]
    for t in pollers:
        t.start()
    agent = subprocess.run(
        [
            str(C_AGENT),
            *args,
            "--run-id",
            run_id,
            "--interval",
            "0.1",
            "--duration",
            str(seconds),
            "--sink",
            stack["telegraf"].write_url,
            "--sink",
            f"elasticsearch://127.0.0.1:{stack['elasticsearch'].port}/flowstat-samples",
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    time.sleep(5)  # let the last samples arrive before the pollers stop
    stop.set()
    for t in pollers:
        t.join()
    for p in targets:
        p.kill()
        p.wait()
    out = {
        "processes": 20,
        "interval_s": 0.1,
        "seconds": seconds,
        "agent_exit": agent.returncode,
        "polling_granularity_s": 0.1,
    }
    for store, first_seen in seen.items():
        lat = sorted(first_seen[k] - stamps[k] for k in first_seen if k in stamps)
        if not lat:
            out[store] = {"samples": 0}
            continue
        out[store] = {
            "samples": len(lat),
            "p50_s": pct(lat, 0.5),
            "p99_s": pct(lat, 0.99),
            "max_s": round(lat[-1], 3),
            "target_p99_le_2s": pct(lat, 0.99) <= 2.0,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--latency-seconds", type=float, default=30)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved baseline/replay pairs per store (median)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.samples, args.latency_seconds, args.rounds = 50_000, 10, 1
    from run_benchmarks import command_line, machine, save_results

    from flowstat.stack import Stack
    from flowstat.timeutil import compact_utc, iso_utc_ms

    cache = ROOT / ".cache" / "bench-stack"
    stack = Stack(cache, {"influxdb": free_port(), "elasticsearch": free_port(), "telegraf": free_port()})
    stack.up()
    results = {"started": iso_utc_ms(), "machine": machine(), "command": command_line(), "benchmarks": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="flowstat-ingest-") as tmp:
            print(f"replay of {args.samples:,} samples ...", flush=True)
            results["benchmarks"]["replay"] = bench_replay(stack, Path(tmp), args.samples, args.rounds)
            print("posting to InfluxDB beside replay's parsing ...", flush=True)
            results["benchmarks"]["posting_contention"] = bench_posting_contention(stack, Path(tmp), args.samples)
        print("end-to-end latency ...", flush=True)
        results["benchmarks"]["latency"] = bench_latency(stack, args.latency_seconds)
    finally:
        stack.down()
        import shutil

        for sub in ("influxdb/data", "influxdb/meta", "influxdb/wal", "elasticsearch/data"):
            shutil.rmtree(cache / sub, ignore_errors=True)
    save_results(results, args.out or ROOT / "benchmarks" / "results" / "raw" / f"ingest-{compact_utc()}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
