#!/usr/bin/env python3
"""Harness benchmarks (issue 2): merge time, merger throughput, 500 producers on one merger.

Every figure is measured here, in this run, next to a baseline measured in the same run:
  merge_time     two 500 kB TH1F merged by the merger's own code vs. a bare numpy add (the floor);
                 and the merge times a live merger reports at 20 producers x 500 kB
  throughput     1 kB TH1F merged objects/s by one merger process, producers unthrottled (its input
                 never runs dry), over the steady state (start-up and drain out), vs. the same
                 producer process pushing to a bare pyzmq PULL that only counts (the transport floor)
  scale_500      500 producers x 100 objects/s into one merger, unpinned and pinned to its own CPU
                 (and, with --full, 2 and 4 mergers): steady rate, input latency, VmRSS slope and
                 the online verdict (flowstat.harness.online); the objects sent in the run against
                 the nominal count, and the pacing (offered / nominal rate)
  paced_8        8 producers x 100 objects/s into one merger: online, with a low latency
  saturation     with --full: producers x 100/s added until one pinned merger is no longer online

Usage: benchmarks/run_benchmarks.py [--quick] [--full] [--out FILE]
Prints a table and writes JSON (default benchmarks/results/raw/harness-<UTC>.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flowstat.harness.orchestrator import run_topology
from flowstat.harness.qcobjects import Kind, fill_gaussian, make_desc, merge, shape_for_size
from flowstat.harness.topology import from_dict
from flowstat.proc.machine import describe
from flowstat.timeutil import compact_utc, iso_utc_ms

THESIS = {
    "merge_time_500kB_ms": 1.478,
    "peak_merged_per_s_one_merger": 37307,
    "merged_per_s_500_producers_1_merger": 36341,
}


def machine() -> dict:
    """flowstat's description of this machine (flowstat.proc.machine), and numpy's version."""
    return {**describe(), "numpy": np.__version__}


def command_line(argv: list[str] | None = None) -> str:
    """How the benchmark was run, for its results file: the script named from the checkout, however
    it was started; a path in its arguments relative to the checkout, or its name alone when it is
    outside (a tracked summary names no folder of the machine it ran on)."""
    checkout = Path(__file__).resolve().parents[1]

    def portable(path: Path) -> str:
        return str(path.relative_to(checkout)) if path.is_relative_to(checkout) else path.name

    def argument(arg: str) -> str:
        option, eq, value = arg.partition("=") if arg.startswith("-") and "=" in arg else ("", "", arg)
        return option + eq + portable(Path(value)) if value.startswith("/") else arg

    script, *args = sys.argv if argv is None else argv
    return " ".join([portable(Path(script).resolve()), *map(argument, args)])


def rounded(value: Any) -> Any:
    """Floats to what a figure means: 3 decimals at or above 1 (an epoch stamp to the ms), 6
    significant digits below (the documents quote 3 or 4); 17 digits of noise were a tenth of the
    summaries' bytes."""
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return round(value, 3) if abs(value) >= 1 else float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def table(rows: list[dict], columns: list[str]) -> dict:
    """Many objects of the same keys as {"columns": [...], "rows": [[...], ...]}: a tracked summary
    of 40 or 75 of them would spell every key 40 or 75 times (a missing value: null)."""
    return {"columns": columns, "rows": [[row.get(c) for c in columns] for row in rows]}


def compact_json(doc: dict) -> str:
    """A results file's text: JSON without whitespace (the tracked summaries are read by tools and
    quoted by docs, not read whole; indented, a fifth of their bytes was spaces), floats rounded,
    a newline at the end."""
    return json.dumps(rounded(doc), separators=(",", ":")) + "\n"


def save_results(results: dict, out: Path, quiet: bool = False) -> None:
    """Stamp, write (compact_json) and print a benchmark's results (every benchmark script ends this
    way; quiet: only write, to keep what is measured so far)."""
    results["finished"] = iso_utc_ms()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(compact_json(results))
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
        "object": f"TH1F {desc.shape[0] - 2} bins, {desc.nbytes} bytes",
        "repetitions": reps,
        "merge_ms_median": statistics.median(ours),
        "merge_ms_p99": float(np.percentile(ours, 99)),
        "numpy_add_ms_median": statistics.median(floor),
        "ratio_to_numpy_add": statistics.median(ours) / statistics.median(floor),
        "thesis_ms": THESIS["merge_time_500kB_ms"],
        "target_ms": 0.1,
        "target_met": statistics.median(ours) <= 0.1,
    }


def run(topo_dict: dict, runs_dir: Path) -> dict:
    return run_topology(from_dict(topo_dict), runs_dir=runs_dir)


def merger_rows(summary: dict) -> list[dict]:
    return [n for n in summary["nodes"] if n["role"] == "merger"]


def bench_live_merge_time(runs_dir: Path, seconds: float) -> dict:
    s = run(
        {
            "run_id": "bench-merge-500kB",
            "duration": seconds,
            "buffer_size": 100000,
            "object": {"type": "TH1F", "size": "500kB"},
            "producers": {"count": 2, "rate": 20},
            "mergers": 1,
        },
        runs_dir,
    )
    m = merger_rows(s)[0]
    return {
        "topology": "2 producers x 20 obj/s, 500 kB TH1F (thesis 5.2)",
        "seconds": s["seconds"],
        "merges": m["merges"],
        "mean_merge_ms": m["mean_merge_time"],
        "average_merge_time_last10_ms": m["average_merge_time"],
        "no_loss": s["conservation"]["ok"],
    }


TRANSPORT_SINK = r"""
import sys, time, zmq
ctx = zmq.Context(); s = ctx.socket(zmq.PULL); s.setsockopt(zmq.RCVHWM, 1000)
port = s.bind_to_random_port("tcp://127.0.0.1"); print(port, flush=True)
n = 0; first = None; counts = []
while s.poll(2000):
    while True:
        try: s.recv(zmq.NOBLOCK)
        except zmq.Again: break
        n += 1
    now = time.monotonic()
    if first is None: first = now
    counts.append((now - first, n))
print(" ".join(f"{t:.4f}:{c}" for t, c in counts), flush=True)
"""


def window_rate(counts: list[tuple[float, int]], start: float, end: float) -> float:
    """Objects per second between the first readings at or after ``start`` and at or before ``end``."""
    inside = [(t, c) for t, c in counts if start <= t <= end]
    (t0, c0), (t1, c1) = inside[0], inside[-1]
    return (c1 - c0) / (t1 - t0)


def bench_transport_floor(seconds: float, producers: int, startup_s: float) -> dict:
    """The same producer process as the harness, pushing 1 kB TH1F to a PULL that only counts; the
    rate over the same steady window as the merger's (start-up and drain out)."""
    sink = subprocess.Popen([sys.executable, "-c", TRANSPORT_SINK], stdout=subprocess.PIPE, text=True)
    port = int(sink.stdout.readline())
    from flowstat.harness.devices.producer import Producer

    cfg = {
        "node_id": "floor",
        "producers": list(range(producers)),
        "rate": 0,
        "buffer_size": 1000,
        "endpoints": [f"tcp://127.0.0.1:{port}"] * producers,
        "seed": 0,
        "object": {"type": "TH1F", "shape": list(shape_for_size(Kind.TH1F, 1000)), "entries": 1000, "names": 1},
    }
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
    counts = [(float(t), int(c)) for t, c in (x.split(":") for x in sink.stdout.readline().split())]
    sink.wait()
    return {
        "objects": counts[-1][1],
        "objects_per_second": window_rate(counts, startup_s, seconds),
        "window_s": [startup_s, seconds],
    }


def steady(summary: dict, merger: str = "merger-0") -> dict:
    """A merger's steady-state figures and verdict (flowstat.harness.online): start-up and drain out."""
    v = summary["online"][merger]
    keys = (
        "online",
        "state",
        "why",
        "window_s",
        "offered_per_second",
        "merged_per_second",
        "merged_to_offered",
        "latency_p50_ms_median_second",
        "latency_p99_ms_worst_second",
        "latency_p99_ms_first_third",
        "latency_p99_ms_last_third",
        "vmrss_slope_mb_per_min",
        "in_flight_max",
        "producer_refusals",
    )
    return {k: v.get(k) for k in keys}


def bench_throughput(runs_dir: Path, seconds: float, producers: int) -> dict:
    """Merged objects/s while the merger's input never runs dry: unthrottled producers; the rate over
    the steady window (its verdict will say "saturated": it sets the producers' pace, by design)."""
    s = run(
        {
            "run_id": "bench-throughput",
            "duration": seconds,
            "buffer_size": 1000,
            "object": {"type": "TH1F", "size": "1kB"},
            "producers": {"count": producers, "rate": 0},
            "mergers": 1,
        },
        runs_dir,
    )
    st = steady(s)
    floor = bench_transport_floor(seconds, producers, st["window_s"][0])
    rate = st["merged_per_second"]
    whole_run = merger_rows(s)[0]["merged_objects_per_second_whole_run"]
    return {
        "topology": f"{producers} producers unthrottled, 1 kB TH1F, buffer 1000, 1 merger",
        "seconds": s["seconds"],
        "objects_merged": merger_rows(s)[0]["objects_merged"],
        "steady_merged_objects_per_second": rate,
        "steady": st,
        "merged_objects_per_second_whole_run": whole_run,
        "no_loss": s["conservation"]["ok"],
        "transport_floor_objects_per_second": floor["objects_per_second"],
        "ratio_to_transport": rate / floor["objects_per_second"],
        "target_ratio": 0.5,
        "target_met": rate >= 0.5 * floor["objects_per_second"] and s["conservation"]["ok"],
        "thesis_peak": THESIS["peak_merged_per_s_one_merger"],
        "ratio_to_thesis": rate / THESIS["peak_merged_per_s_one_merger"],
    }


PINNED = {"merger": 1, "producer": 0, "viewer": 0, "agent": 0}  # the merger alone on CPU 1


def bench_scale(runs_dir: Path, seconds: float, mergers: int, producers: int = 500, pinned: bool = False) -> dict:
    topo = {
        "run_id": f"bench-{producers}x100-{mergers}m{'-pinned' if pinned else ''}",
        "duration": seconds,
        "buffer_size": 100000,
        "object": {"type": "TH1F", "size": "1kB"},
        "producers": {"count": producers, "rate": 100, "processes": max(2, -(-producers // 250))},
        "mergers": mergers,
    }
    if pinned:
        topo["cpus"] = PINNED
    s = run(topo, runs_dir)
    verdicts = {m: steady(s, m) for m in s["online"]}
    offered = sum(v["offered_per_second"] or 0 for v in verdicts.values())
    sent, nominal_sent = s["conservation"]["objects_sent"], producers * 100 * seconds
    return {
        "topology": f"{producers} producers x 100 obj/s, 1 kB TH1F, buffer 100000, {mergers} merger(s)"
        + (", merger pinned to CPU 1, everything else on CPU 0" if pinned else ", not pinned"),
        "seconds": s["seconds"],
        "nominal_objects_per_second": producers * 100,
        "steady_offered_objects_per_second": offered,
        "offered_to_nominal": offered / (producers * 100),
        # the share of the nominal objects (rate x duration) the producers got out in the run
        "objects_sent": sent,
        "objects_sent_of_nominal": sent / nominal_sent,
        "target_sent_of_nominal": 0.9,
        "sent_target_met": sent >= 0.9 * nominal_sent,
        "steady_merged_objects_per_second": sum(v["merged_per_second"] or 0 for v in verdicts.values()),
        "online": all(v["online"] for v in verdicts.values()),
        "mergers": verdicts,
        "merged_objects_per_second_whole_run": sum(
            n["merged_objects_per_second_whole_run"] or 0 for n in merger_rows(s)
        ),
        "no_loss": s["conservation"]["ok"],
        "thesis_merged_per_s": THESIS["merged_per_s_500_producers_1_merger"]
        if mergers == 1 and producers == 500
        else None,
    }


def bench_paced(runs_dir: Path, seconds: float) -> dict:
    """8 producers x 100 obj/s of 1 kB TH1F: far under what one merger takes, so it should be
    online with its inputs waiting well under 100 ms in every second."""
    s = run(
        {
            "run_id": "bench-paced-8x100",
            "duration": seconds,
            "buffer_size": 100,
            "object": {"type": "TH1F", "size": "1kB"},
            "producers": {"count": 8, "rate": 100},
            "mergers": 1,
        },
        runs_dir,
    )
    st = steady(s)
    p99 = merger_rows(s)[0]["input_latency"]["input_latency_p99_ms"]
    worst = st["latency_p99_ms_worst_second"]
    return {
        "topology": "8 producers x 100 obj/s, 1 kB TH1F, buffer 100, 1 merger",
        "seconds": s["seconds"],
        "steady": st,
        "input_latency_p99_ms_whole_run": p99,
        "no_loss": s["conservation"]["ok"],
        "target_latency_p99_ms": 100,
        "target_merged_to_offered": 0.95,
        "target_met": bool(st["online"])
        and worst is not None
        and worst < 100
        and p99 < 100
        and (st["merged_to_offered"] or 0) >= 0.95,
    }


def bench_saturation(runs_dir: Path, seconds: float, counts: list[int]) -> dict:
    """Producers (100 obj/s each) added until one pinned merger is no longer online."""
    steps = []
    limited_by_producers = False
    for n in counts:
        print(f"  {n} producers x 100/s on one pinned merger ...", flush=True)
        step = bench_scale(runs_dir, seconds, 1, producers=n, pinned=True)
        steps.append(step)
        # Producers that cannot offer their rate on their one CPU: the merger is no longer what is measured.
        step["producers_reached_nominal"] = (
            step["steady_offered_objects_per_second"] >= 0.95 * step["nominal_objects_per_second"]
        )
        if not step["online"] or not step["producers_reached_nominal"]:
            limited_by_producers = step["online"]
            break
    online = [x for x in steps if x["online"]]
    best = max(online, key=lambda x: x["steady_merged_objects_per_second"]) if online else None
    return {
        "steps": steps,
        "limited_by_producers": limited_by_producers,
        "highest_online_producers": best and best["nominal_objects_per_second"] // 100,
        "highest_online_merged_per_second": best and best["steady_merged_objects_per_second"],
        "first_not_online_producers": None if steps[-1]["online"] else steps[-1]["nominal_objects_per_second"] // 100,
        "target_online_merged_per_second": 75_000,
        # the load it was online at (what its producers were asked to offer), not the window's
        # measured rate, which wobbles by a few objects per second around it
        "target_met": bool(best) and best["nominal_objects_per_second"] >= 75_000,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs (a sanity check, not a measurement)")
    ap.add_argument("--full", action="store_true", help="also 500 producers on 2 and 4 mergers")
    ap.add_argument("--out", type=Path, help="JSON output file")
    args = ap.parse_args()
    secs = 5 if args.quick else 30
    out = args.out or Path(__file__).parent / "results" / "raw" / f"harness-{compact_utc()}.json"
    results = {"started": iso_utc_ms(), "machine": machine(), "command": command_line(), "benchmarks": {}}
    with tempfile.TemporaryDirectory(prefix="flowstat-bench-") as tmp:
        runs = Path(tmp)
        b = results["benchmarks"]
        print("merge time of two 500 kB TH1F ...", flush=True)
        b["merge_time_500kB_TH1F"] = bench_merge_time(200 if args.quick else 2000)
        b["live_merge_time_500kB_TH1F"] = bench_live_merge_time(runs, secs / 2)
        print("merger throughput, 1 kB TH1F ...", flush=True)
        b["merger_throughput_1kB_TH1F"] = bench_throughput(runs, secs / 2, 8)
        save_results(results, out, quiet=True)
        print("8 producers x 100 obj/s, paced ...", flush=True)
        b["paced_8_producers_1_merger"] = bench_paced(runs, max(10, secs / 3))
        save_results(results, out, quiet=True)
        pin = (os.cpu_count() or 1) >= 2
        for m in (1, 2, 4) if args.full else (1,):
            print(f"500 producers x 100 obj/s, {m} merger(s) ...", flush=True)
            b[f"scale_500_producers_{m}_merger"] = bench_scale(runs, secs, m)
            save_results(results, out, quiet=True)
        if pin:
            print("500 producers x 100 obj/s, 1 merger pinned to its own CPU ...", flush=True)
            b["scale_500_producers_1_merger_pinned"] = bench_scale(runs, secs, 1, pinned=True)
            save_results(results, out, quiet=True)
        if pin and args.full:
            print("saturation of one pinned merger ...", flush=True)
            b["saturation_one_pinned_merger"] = bench_saturation(
                runs, secs, [500, 750, 1000, 1250, 1500, 2000, 2500, 3000]
            )
        else:
            b["saturation_one_pinned_merger"] = {"skipped": "needs --full and 2 CPUs"}
    save_results(results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
