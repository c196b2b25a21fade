#!/usr/bin/env python3
"""Harness benchmarks (issue 2): merge time, merger throughput, 500 producers on one merger.

Every figure is measured here, in this run, next to a baseline measured in the same run:
  merge_time     two 500 kB TH1F merged by the merger's own code vs. a bare numpy add (the floor);
                 and the merge times a live merger reports at 20 producers x 500 kB
  throughput     1 kB TH1F merged objects/s by one merger process, producers unthrottled, vs. the
                 same producer process pushing to a bare pyzmq PULL that only counts (the transport)
  scale_500      500 producers x 100 objects/s into one merger (and, with --full, 2 and 4 mergers)

Usage: benchmarks/run_benchmarks.py [--quick] [--full] [--out FILE]
Prints a table and writes JSON (default benchmarks/results/harness-<UTC>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flowstat.timeutil import compact_utc, iso_utc_ms
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.qcobjects import Kind, fill_gaussian, make_desc, merge, shape_for_size
from flowstat.harness.topology import from_dict

THESIS = {"merge_time_500kB_ms": 1.478, "peak_merged_per_s_one_merger": 37307, "merged_per_s_500_producers_1_merger": 36341}


def machine() -> dict:
    model = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "kernel": platform.release()}


def save_results(results: dict, out: Path, quiet: bool = False) -> None:
    """Stamp, write and print a benchmark's results (every benchmark script ends this way; quiet:
    only write, to keep what is measured so far)."""
    results["finished"] = iso_utc_ms()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    if not quiet:
        print(json.dumps(results, indent=1))
        print(f"\nwritten: {out}")


def bench_merge_time(reps: int) -> dict:
    desc = make_desc("TH1F_0", Kind.TH1F, shape_for_size(Kind.TH1F, 500_000))
    rng = np.random.default_rng(0)
    a, b = (fill_gaussian(desc, 1000, rng)[0] for _ in range(2))
    a.flags.writeable = b.flags.writeable = False  # as received from the network

    def timed(fn) -> list[float]:
        out = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e6)
        return out

    timed(lambda: merge(desc, [a, b]))  # warm-up
    ours = timed(lambda: merge(desc, [a, b]))
    floor = timed(lambda: np.add(a, b))
    return {
        "object": f"TH1F {desc.shape[0] - 2} bins, {desc.nbytes} bytes", "repetitions": reps,
        "merge_ms_median": statistics.median(ours), "merge_ms_p99": float(np.percentile(ours, 99)),
        "numpy_add_ms_median": statistics.median(floor),
        "ratio_to_numpy_add": statistics.median(ours) / statistics.median(floor),
        "thesis_ms": THESIS["merge_time_500kB_ms"], "target_ms": 0.1,
        "target_met": statistics.median(ours) <= 0.1,
    }


def run(topo_dict: dict, runs_dir: Path, samples: list | None = None) -> dict:
    def collect(elapsed, duration, metrics, verdicts):
        if samples is not None:
            samples.append({"t": round(elapsed, 2), "mergers": [
                {k: m.get(k) for k in ("node_id", "objects_held", "objects_in_flight", "input_latency_p99_ms", "cpu_clock", "merged_objects_per_second", "VmRSS")}
                for m in metrics if m.get("role") == "merger"]})
    return run_topology(from_dict(topo_dict), runs_dir=runs_dir, on_progress=collect)


def merger_rows(summary: dict) -> list[dict]:
    return [n for n in summary["nodes"] if n["role"] == "merger"]


def bench_live_merge_time(runs_dir: Path, seconds: float) -> dict:
    s = run({"run_id": "bench-merge-500kB", "duration": seconds, "buffer_size": 100000,
             "object": {"type": "TH1F", "size": "500kB"}, "producers": {"count": 2, "rate": 20}, "mergers": 1},
            runs_dir)
    m = merger_rows(s)[0]
    return {"topology": "2 producers x 20 obj/s, 500 kB TH1F (thesis 5.2)", "seconds": s["seconds"],
            "merges": m["merges"], "mean_merge_ms": m["mean_merge_time"],
            "average_merge_time_last10_ms": m["average_merge_time"], "no_loss": s["conservation"]["ok"]}


TRANSPORT_SINK = r"""
import sys, time, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PULL); s.setsockopt(zmq.RCVHWM, 1000)
port = s.bind_to_random_port("tcp://127.0.0.1"); print(port, flush=True)
n = 0; first = None; last = time.monotonic(); deadline = None
while True:
    if not s.poll(2000):
        break
    while True:
        try: s.recv(zmq.NOBLOCK)
        except zmq.Again: break
        n += 1
        if first is None: first = time.monotonic()
    last = time.monotonic()
print(n, first, last, flush=True)
"""


def bench_transport_floor(seconds: float, producers: int) -> dict:
    """The same producer process as the harness, pushing 1 kB TH1F to a PULL that only counts."""
    sink = subprocess.Popen([sys.executable, "-c", TRANSPORT_SINK], stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    from flowstat.harness.devices.producer import Producer
    cfg = {"node_id": "floor", "producers": list(range(producers)), "rate": 0, "buffer_size": 1000,
           "endpoints": [f"tcp://127.0.0.1:{port}"] * producers, "seed": 0,
           "object": {"type": "TH1F", "shape": list(shape_for_size(Kind.TH1F, 1000)), "entries": 1000, "names": 1}}
    p = Producer(cfg)
    p.state, p.t0 = "RUNNING", time.monotonic()
    end = p.t0 + seconds
    while time.monotonic() < end:
        p.send_due(time.monotonic())
    for ch in p.channels:
        while ch.pending is not None:
            p.retry_pending(ch)
        ch.sock.close()
    p.close()
    n, first, last = sink.stdout.readline().split()
    sink.wait()
    rate = int(n) / (float(last) - float(first))
    return {"objects": int(n), "objects_per_second": rate}


def bench_throughput(runs_dir: Path, seconds: float, producers: int) -> dict:
    s = run({"run_id": "bench-throughput", "duration": seconds, "buffer_size": 1000,
             "object": {"type": "TH1F", "size": "1kB"}, "producers": {"count": producers, "rate": 0},
             "mergers": 1}, runs_dir)
    m = merger_rows(s)[0]
    floor = bench_transport_floor(seconds, producers)
    rate = m["merged_objects_per_second_whole_run"]  # first receive to last merge
    steady = m.get("merged_objects_per_second_steady")  # the online verdict's window: no start-up, no drain
    return {"topology": f"{producers} producers unthrottled, 1 kB TH1F, buffer 1000, 1 merger",
            "seconds": s["seconds"], "objects_merged": m["objects_merged"], "merged_objects_per_second": rate,
            "merged_objects_per_second_steady": steady,
            "no_loss": s["conservation"]["ok"], "transport_floor_objects_per_second": floor["objects_per_second"],
            "ratio_to_transport": rate / floor["objects_per_second"],
            "steady_ratio_to_transport": steady / floor["objects_per_second"] if steady else None,
            "target_ratio_to_transport": 0.5,
            "thesis_peak": THESIS["peak_merged_per_s_one_merger"], "ratio_to_thesis": rate / THESIS["peak_merged_per_s_one_merger"],
            "target": 100_000, "target_met": rate >= 100_000 and s["conservation"]["ok"]}


def bench_scale(runs_dir: Path, seconds: float, mergers: int) -> dict:
    samples: list = []
    s = run({"run_id": f"bench-500x100-{mergers}m", "duration": seconds, "buffer_size": 100000,
             "object": {"type": "TH1F", "size": "1kB"}, "producers": {"count": 500, "rate": 100},
             "mergers": mergers}, runs_dir, samples)
    ms = merger_rows(s)
    steady = [x for x in samples if x["t"] >= 3]
    backlog = [sum(m["objects_held"] or 0 for m in x["mergers"]) for x in steady]
    cpu = [sum(m["cpu_clock"] or 0 for m in x["mergers"]) for x in steady]
    rss = [max(m["VmRSS"] or 0 for m in x["mergers"]) for x in steady]
    merged_rate = sum(m["objects_merged"] for m in ms) / s["seconds"]
    half = len(backlog) // 2
    return {"topology": f"500 producers x 100 obj/s, 1 kB TH1F, buffer 100000, {mergers} merger(s)",
            "seconds": s["seconds"], "offered_objects_per_second": 50_000,
            "merged_objects_per_second": merged_rate, "no_loss": s["conservation"]["ok"],
            "merger_cpu_clock_hz_mean": statistics.mean(cpu) if cpu else None,
            "backlog_first_half_max": max(backlog[:half]) if half else None,
            "backlog_second_half_max": max(backlog[half:]) if backlog else None,
            "merger_vmrss_kb_first": rss[0] if rss else None, "merger_vmrss_kb_last": rss[-1] if rss else None,
            "merger_vmrss_kb_max": max(rss) if rss else None,
            "thesis_merged_per_s": THESIS["merged_per_s_500_producers_1_merger"] if mergers == 1 else None,
            "online": s["conservation"]["ok"] and merged_rate >= 0.97 * 50_000}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (a sanity check, not a measurement)")
    ap.add_argument("--full", action="store_true", help="also 500 producers on 2 and 4 mergers")
    ap.add_argument("--out", type=Path, help="JSON output file")
    args = ap.parse_args()
    secs = 5 if args.quick else 30
    out = args.out or Path(__file__).parent / "results" / f"harness-{compact_utc()}.json"
    results = {"started": iso_utc_ms(), "machine": machine(), "command": " ".join(sys.argv), "benchmarks": {}}
    with tempfile.TemporaryDirectory(prefix="flowstat-bench-") as tmp:
        runs = Path(tmp)
        b = results["benchmarks"]
        print("merge time of two 500 kB TH1F ...", flush=True)
        b["merge_time_500kB_TH1F"] = bench_merge_time(200 if args.quick else 2000)
        b["live_merge_time_500kB_TH1F"] = bench_live_merge_time(runs, secs / 2)
        print("merger throughput, 1 kB TH1F ...", flush=True)
        b["merger_throughput_1kB_TH1F"] = bench_throughput(runs, secs / 2, 8)
        for m in ((1, 2, 4) if args.full else (1,)):
            print(f"500 producers x 100 obj/s, {m} merger(s) ...", flush=True)
            b[f"scale_500_producers_{m}_merger"] = bench_scale(runs, secs, m)
    save_results(results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
