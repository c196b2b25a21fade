#!/usr/bin/env python3
"""How soon "held back by" names a node that slows down (issue 46): seconds from the start of a
slowdown to the first verdict naming the node, at 1 Hz readings (target: at most 10 s).

detect  A harness run of 8 producers x 30 objects/s into two mergers (120/s each). merger-1
        keeps up, then from AFTER_S seconds after its first object on costs 10 ms of CPU an object
        (100/s: merge_cost.nodes.merger-1.after): it is the pipeline's limit from then on. The
        orchestrator reads every node once a second and judges each reading
        (flowstat.harness.flowwatch, flowstat.flow.held_back_by over the last 10 s, start-up left
        out); the figure is the time of the first verdict naming merger-1, less AFTER_S (its first
        object comes within milliseconds of the run's start: the slowdown's start is AFTER_S into
        the run). Any other node named is counted (false_names: must be 0). Slow nodes pinned to
        CPU 0, the others to CPU 1, as in tests/test_verdict_stores.py.

Usage: benchmarks/bench_flow.py [--repeats N] [--out FILE]
Writes JSON (default benchmarks/results/raw/flow-<UTC>.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from flowstat.harness.agents import AgentOptions
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.topology import from_dict
from flowstat.timeutil import compact_utc, iso_utc_ms

ROOT = Path(__file__).resolve().parents[1]
AFTER_S = 12.0  # past start-up (3 s) and a whole 10 s window of it: the verdict has settled on "none"
DURATION_S = 30.0
TARGET_S = 10.0


def topology(run_id: str) -> dict:
    nodes = ["producers-0", "merger-0", "viewer"]
    return {
        "run_id": run_id,
        "duration": DURATION_S,
        "buffer_size": 20,
        "kernel_buffer_size": "16kB",
        "object": {"type": "TH1F", "size": "1kB"},
        "producers": {"count": 8, "rate": 30},
        "mergers": 2,
        "merge_cost": {"nodes": {"merger-1": {"per_object": "10ms", "after": f"{AFTER_S:g}s"}}},
        "cpus": {"merger-1": 0, **{n: 1 for n in nodes}},
    }


def one(i: int, runs_dir: Path) -> dict:
    s = run_topology(from_dict(topology(f"flow-{i}")), runs_dir=runs_dir, agent=AgentOptions(enabled=False))
    flow = s["flow"]
    first = (flow.get("first_named_s") or {}).get("merger-1")
    return {
        "run_id": s["run_id"],
        "flow": flow["flow"],
        "held_back_by": flow["held_back_by"],
        "first_named_s": first,
        "seconds_to_verdict": round(first - AFTER_S, 1) if first is not None else None,
        "false_names": [n for n in flow["held_back_by"] if n != "merger-1"],
        "evidence": flow["flow_evidence"],
        "ok": s["ok"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from run_benchmarks import command_line, machine, save_results  # run from benchmarks/, as make bench does

    out = args.out or ROOT / "benchmarks" / "results" / "raw" / f"flow-{compact_utc()}.json"
    results: dict = {"started": iso_utc_ms(), "machine": machine(), "command": command_line()}
    results["parameters"] = {"after_s": AFTER_S, "duration_s": DURATION_S, "readings_per_s": 1.0}
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            print(f"[{i + 1}/{args.repeats}] a merger that slows down {AFTER_S:g} s into a run ...", flush=True)
            runs.append(one(i, Path(tmp)))
            print(f"  {runs[-1]['seconds_to_verdict']} s to a verdict naming it", flush=True)
    delays = [r["seconds_to_verdict"] for r in runs if r["seconds_to_verdict"] is not None]
    results["benchmarks"] = {
        "detect": {
            "runs": runs,
            "seconds_to_verdict": {"median": statistics.median(delays), "max": max(delays)} if delays else None,
            "named_in_every_run": len(delays) == len(runs),
            "false_names": sum(len(r["false_names"]) for r in runs),
            "target_s": TARGET_S,
            "target_met": bool(delays) and len(delays) == len(runs) and max(delays) <= TARGET_S,
        }
    }
    save_results(results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
