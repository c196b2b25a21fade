#!/usr/bin/env python3
"""Report benchmark: `flowstat report` on a run of 1,000,000 samples.

The run is made from a real one: a short harness run (demo topology) is recorded, then its nodes
are replicated (node copies named NODE~K) and its time is replicated (the node's samples repeated
after one another, times and seq moved on), to NODES x SAMPLES samples. Its run.json says the
longer run's duration, so the steady window scales with it. Measured: the wall time of
`flowstat report RUN_DIR -o FILE` in a process of its own (start-up, reading, reducing, drawing,
writing the HTML), the CPU time it and its workers took, the machine's load average beside it (other
work on the 2 cores slows it down), and the HTML's size; targets <= 10 s and <= 10 MB. The run
file holds the agent's self-sample lines between the ticks, as a real one does.

Then the same report (500 nodes) is opened in headless Chromium at a laptop's screen, as the tests
open reports (flowstat_lab.screenshots), BROWSER_OPENS times: from navigation start to every plot
drawn (polled every 20 ms), the median against a target of 3 s.

Usage: benchmarks/bench_report.py [--quick] [--nodes N] [--samples S] [--out FILE]
Prints the figures and writes JSON (default benchmarks/results/raw/report-<UTC>.json).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flowstat.harness.orchestrator import run_topology
from flowstat.harness.topology import load
from flowstat.synthetic import synthesize
from flowstat.timeutil import compact_utc, iso_utc_ms

ROOT = Path(__file__).resolve().parents[1]

TARGET_S, TARGET_BYTES = 10.0, 10 * 10**6
TARGET_DRAWN_MS, BROWSER_OPENS = 3000, 5


def record_run(runs_dir: Path, seconds: float) -> Path:
    """A real run of the demo topology: the run file every synthetic sample comes from."""
    topo = load(ROOT / "benchmark-harness" / "topologies" / "demo.yaml")
    summary = run_topology(topo, duration=seconds, runs_dir=runs_dir)
    return Path(summary["run_dir"])


def _cpu() -> float:
    """CPU seconds of this process and of the workers it waited for (the report's reading and drawing)."""
    return sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )


def bench_report(run_dir: Path, html: Path) -> dict:
    """The report as `flowstat report RUN_DIR -o FILE` makes it, in a process of its own (its imports
    included); the machine's load beside it, as other work on it slows the report down."""
    load_before = os.getloadavg()[0]
    cpu0, t0 = _cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "flowstat", "report", str(run_dir), "-o", str(html)], check=True)
    seconds, cpu = time.perf_counter() - t0, _cpu() - cpu0
    size = html.stat().st_size
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "html_bytes": size,
        "plots": html.read_text().count('class="plot"'),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "target_seconds": TARGET_S,
        "target_html_bytes": TARGET_BYTES,
        "target_met": seconds <= TARGET_S and size <= TARGET_BYTES,
    }


def bench_browser(html: Path, plots: int) -> dict:
    """The report opened in Chromium BROWSER_OPENS times: navigation start to every plot drawn."""
    from flowstat_lab import screenshots

    times = []
    load_before = os.getloadavg()[0]
    with screenshots.browser() as driver:
        for _ in range(BROWSER_OPENS):
            page = screenshots.open_report(driver, html, plots)
            assert page["drawn"] == plots, page
            times.append(page["drawn_ms"])
    median = sorted(times)[len(times) // 2]
    return {
        "plots": plots,
        "drawn_ms": times,
        "median_drawn_ms": median,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg()[0],
        "target_ms": TARGET_DRAWN_MS,
        "target_met": median <= TARGET_DRAWN_MS,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller run (a sanity check, not a measurement)")
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--samples", type=int, default=2000, help="samples per node")
    ap.add_argument("--source", type=Path, help="a run directory to replicate (default: record a 10 s demo run)")
    ap.add_argument("--out", type=Path, help="JSON output file")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.samples = 50, 200
    from run_benchmarks import command_line, machine, save_results

    results = {"started": iso_utc_ms(), "machine": machine(), "command": command_line(), "benchmarks": {}}
    with tempfile.TemporaryDirectory(prefix="flowstat-report-") as tmp:
        source = args.source or record_run(Path(tmp) / "runs", 10.0)
        print(f"synthesising {args.nodes} nodes x {args.samples:,} samples from {source} ...", flush=True)
        run_dir = Path(tmp) / "big-run"
        n = synthesize(source, run_dir, args.nodes, args.samples)
        print(f"report of {n:,} samples ...", flush=True)
        html = Path(tmp) / "report.html"
        results["benchmarks"]["report"] = {
            "samples": n,
            "nodes": args.nodes,
            "run_file_bytes": (run_dir / "samples.ndjson").stat().st_size,
            **bench_report(run_dir, html),
        }
        print(f"the report of {args.nodes} nodes in Chromium ...", flush=True)
        results["benchmarks"]["report_in_browser"] = {
            "nodes": args.nodes,
            **bench_browser(html, results["benchmarks"]["report"]["plots"]),
        }
    save_results(results, args.out or ROOT / "benchmarks" / "results" / "raw" / f"report-{compact_utc()}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
