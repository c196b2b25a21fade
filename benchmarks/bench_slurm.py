#!/usr/bin/env python3
"""Runs across hosts (issue 30), on the suite's own Slurm cluster (lab/src/flowstat_lab/slurm.py: three
slurmd, n1-n3, at 127.0.0.11-13 in a network namespace of this machine).

startup     `flowstat run TOPOLOGY --slurm` (the demo topology across three hosts, 1 s, agents on),
            REPEATS times: seconds from starting the command to the run's start (run.json's
            `started`: every device has said it is ready, the agents started) — salloc, srun of
            every step, the devices' imports and binds all in it. Target: at most 3 s.
campaign    the thesis's 5.4 (number of producers: 1 kB TH1F, 100 objects/s each, one merger) at
            --producers counts, each run --seconds long, once on one host (`flowstat run`) and once
            across hosts (--slurm, producers on n1 and n2, the merger and viewer on n3), interleaved;
            the figure is the merger's steady merged objects/s (the online verdict's, start-up and
            drain left out), and the ratio across/one host. Target: within 10%.

What a loopback test cluster can and cannot show: the three "hosts" are one machine, so the
objects cross the kernel's loopback, not a network (no bandwidth limit, no latency, no packet loss),
and every process shares the same two cores whichever "host" it is placed on. What it shows is what
flowstat adds across hosts: job steps instead of child processes, binding each host's address,
agents per host, one run stitched together. What a real network adds (its round trip, its
bandwidth for 500 kB and 50 MB objects, a switch's buffers) it cannot show.

Usage: benchmarks/bench_slurm.py [--repeats 5] [--producers 100,250,500] [--seconds 20] [--out FILE]
Needs root (the cluster), and `make c-agent`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from flowstat_lab import slurm as sc

ROOT = Path(__file__).resolve().parents[1]

C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
DEMO = """run_id: {run_id}
duration: {seconds}
buffer_size: {buffer}
object: {{type: TH1F, size: 1kB}}
producers: {{count: {producers}, rate: 100, processes: 2}}
mergers: {mergers}
placement: {{producers: [n1, n2], mergers: [n3]}}
"""


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cluster: sc.Cluster, topo: Path, runs: Path, run_id: str, *args: str, slurm: bool = True) -> dict:
    argv = [sys.executable, "-m", "flowstat", "run", str(topo), "--json", "--runs-dir", str(runs), "--run-id", run_id]
    argv += ["--slurm"] if slurm else []
    t0 = time.time()
    out = cluster.client(*argv, *args, env={"FLOWSTAT_C_AGENT": str(C_AGENT)}, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{run_id}: exit {out.returncode}: {out.stderr[-2000:]}")
    from flowstat.schema.sample import time_ns

    doc = json.loads((runs / run_id / "run.json").read_text())
    summary = json.loads(out.stdout)
    summary["startup_s"] = round(time_ns(doc["started"]) / 1e9 - t0, 3)
    return summary


def bench_startup(cluster: sc.Cluster, tmp: Path, repeats: int) -> dict:
    topo = tmp / "startup.yaml"
    topo.write_text(DEMO.format(run_id="startup", seconds=1, buffer=100, producers=8, mergers=2))
    times = []
    for k in range(repeats):
        s = run(cluster, topo, tmp / "runs", f"startup-{k}")
        assert s["ok"], s["failures"]
        times.append(s["startup_s"])
        say(f"startup {k + 1}/{repeats}: {s['startup_s']:.2f} s")
    return {
        "runs": times,
        "median_s": round(statistics.median(times), 3),
        "max_s": max(times),
        "target_s": 3.0,
        "met": statistics.median(times) <= 3.0,
    }


def bench_campaign(cluster: sc.Cluster, tmp: Path, counts: list[int], seconds: float) -> dict:
    rows = []
    for n in counts:
        topo = tmp / f"p{n}.yaml"
        topo.write_text(DEMO.format(run_id=f"p{n}", seconds=seconds, buffer=100000, producers=n, mergers=1))
        pair = {}
        for where in ("one host", "across hosts"):
            s = run(cluster, topo, tmp / "runs", f"p{n}-{where.replace(' ', '-')}", slurm=where == "across hosts")
            verdict = (s.get("online") or {}).get("merger-0") or {}
            pair[where] = {
                "ok": s["ok"],
                "steady_merged_per_s": verdict.get("merged_per_second"),
                "offered_per_s": verdict.get("offered_per_second"),
                "online": verdict.get("online"),
                "conserved": s["conservation"]["ok"],
            }
            say(f"5.4 at {n} producers, {where}: {verdict.get('merged_per_second')} merged/s")
        one, across = pair["one host"]["steady_merged_per_s"], pair["across hosts"]["steady_merged_per_s"]
        ratio = round(across / one, 4) if one and across else None
        rows.append({"producers": n, **pair, "ratio_across_to_one_host": ratio})
    ratios = [r["ratio_across_to_one_host"] for r in rows if r["ratio_across_to_one_host"] is not None]
    return {
        "seconds": seconds,
        "rows": rows,
        "worst_ratio": min(ratios) if ratios else None,
        "target": "within 10% (ratio >= 0.9)",
        "met": bool(ratios) and min(ratios) >= 0.9,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="start-up runs (default 5)")
    ap.add_argument("--producers", default="100,250,500", help="5.4's producer counts (default 100,250,500)")
    ap.add_argument("--seconds", type=float, default=20, help="length of each 5.4 run (default 20)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from run_benchmarks import command_line, machine, save_results

    from flowstat.timeutil import iso_utc_ms

    cluster = sc.Cluster()
    cluster.up(owner=None)
    results = {"started": iso_utc_ms(), "machine": machine(), "command": command_line(), "benchmarks": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="flowstat-slurm-") as tmp:
            results["benchmarks"]["startup"] = bench_startup(cluster, Path(tmp), args.repeats)
            counts = [int(x) for x in args.producers.split(",")]
            results["benchmarks"]["campaign_5_4"] = bench_campaign(cluster, Path(tmp), counts, args.seconds)
    finally:
        cluster.down()
    save_results(results, args.out or ROOT / "benchmarks" / "results" / "slurm.json")
    print(
        json.dumps(
            {k: {kk: v.get(kk) for kk in ("median_s", "worst_ratio", "met")} for k, v in results["benchmarks"].items()}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
