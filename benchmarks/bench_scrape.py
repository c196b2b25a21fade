#!/usr/bin/env python3
"""A Prometheus scrape of an agent watching many nodes, against one of its sampling rounds (issue 45).

scrape  K idle processes (default 10,000, `sleep 86399.6`); each agent that has a prometheus://
        sink watches them at 1 Hz with it (and nothing else). After 10 s of start-up, S scrapes
        (default 10), one every 1.5 s, each asking for OpenMetrics as Prometheus does. Figures:
        a scrape's wall time (request to last byte), the agent's CPU over each scrape (the sum of
        its threads' schedstat run time, from just before the request to just after the answer,
        less the CPU of the rounds that fell inside: the second before and after are measured
        without a scrape), the answer's size, series and nodes (nodes_shown: fewer than K when
        the agent's open files limit, 2 a process, left some out), and one sampling round's CPU
        (the median second without a scrape). Target: a scrape costs less CPU than a round.

Usage: benchmarks/bench_scrape.py [--quick] [--targets K] [--scrapes S] [--out FILE]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

from flowstat.proc.procfs import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
MARK = "86399.6"  # the idle targets are `sleep 86399.6`
SETTLE_S = 10.0  # start-up (the first scan of K processes) is not what is measured
ACCEPT = {"Accept": "application/openmetrics-text; version=1.0.0"}
AGENTS = {"python_agent": [sys.executable, "-m", "flowstat.agent"], "c_agent": [str(C_AGENT)]}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def room_for(targets: int):
    """The agent's open files limit raised to watch every target (2 descriptors each) where it may
    be (root): at 20,000 an agent would leave 128 of 10,000 out, and the scrape would be smaller."""
    need = 2 * targets + 1024

    def raise_limit() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < need:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (need, max(hard, need)))
            except (ValueError, OSError):
                pass  # not allowed: the agent says how many it left out

    return raise_limit


def has_prometheus_sink(agent: list[str]) -> bool:
    out = subprocess.run([*agent, "--help"], capture_output=True, text=True)
    return "prometheus://" in out.stdout


def one_agent(agent: list[str], scrapes: int, targets: int) -> dict:
    port = free_port()
    proc = subprocess.Popen(
        [*agent, "--pattern", f"^sleep {MARK}$", "--interval", "1", "--rescan", "3600", "--self-interval", "0"]
        + ["--quiet", "--sink", f"prometheus://127.0.0.1:{port}"],
        stderr=subprocess.DEVNULL,
        preexec_fn=room_for(targets),
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        time.sleep(SETTLE_S)  # a timed start-up left out, not a synchronisation
        quiet = []  # CPU of one second without a scrape: a round
        for _ in range(3):
            c0 = cpu_seconds(proc.pid)
            time.sleep(1.0)
            quiet.append(cpu_seconds(proc.pid) - c0)
        round_cpu = statistics.median(quiet)
        walls, cpus, size, series, nodes = [], [], 0, 0, 0
        for _ in range(scrapes):
            c0, t0 = cpu_seconds(proc.pid), time.monotonic()
            answer = requests.get(url, headers=ACCEPT, timeout=120)
            wall, c1 = time.monotonic() - t0, cpu_seconds(proc.pid)
            answer.raise_for_status()
            walls.append(wall)
            cpus.append(max(0.0, (c1 - c0) - round_cpu * wall))  # less the rounds' share of that time
            size = len(answer.content)
            lines = answer.text.splitlines()
            series = sum(1 for line in lines if line and not line.startswith("#"))
            nodes = sum(1 for line in lines if line.startswith("flowstat_node_threads{"))
            time.sleep(1.5)
    finally:
        proc.terminate()
        proc.wait()
    return {
        "round_cpu_ms": round(round_cpu * 1000, 2),
        "scrape_cpu_ms": {"median": round(statistics.median(cpus) * 1000, 2), "max": round(max(cpus) * 1000, 2)},
        "scrape_wall_ms": {"median": round(statistics.median(walls) * 1000, 2), "max": round(max(walls) * 1000, 2)},
        "nodes_shown": nodes,
        "answer_bytes": size,
        "series": series,
        "scrape_over_round_cpu": round(statistics.median(cpus) / round_cpu, 3) if round_cpu else None,
        "target_met": statistics.median(cpus) < round_cpu,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1,000 processes, 3 scrapes: a sanity check")
    ap.add_argument("--targets", type=int, default=10_000)
    ap.add_argument("--scrapes", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.targets, args.scrapes = 1000, 3
    if args.targets < 1 or args.scrapes < 1:
        ap.error("--targets and --scrapes must be positive")
    from run_benchmarks import command_line, machine, save_results

    from flowstat.timeutil import compact_utc, iso_utc_ms

    results = {"started": iso_utc_ms(), "machine": machine(), "command": command_line(), "benchmarks": {}}
    out = args.out or ROOT / "benchmarks" / "results" / "raw" / f"scrape-{compact_utc()}.json"
    targets = [subprocess.Popen(["sleep", MARK]) for _ in range(args.targets)]
    try:
        for name, agent in AGENTS.items():
            if not has_prometheus_sink(agent):
                print(f"{name}: no prometheus:// sink: left out", flush=True)
                continue
            print(f"{name}: {args.targets} processes, {args.scrapes} scrapes ...", flush=True)
            results["benchmarks"][name] = {"targets": args.targets, **one_agent(agent, args.scrapes, args.targets)}
            save_results(results, out, quiet=True)
    finally:
        for p in targets:
            p.kill()
            p.wait()
    save_results(results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
