#!/usr/bin/env python3
"""What libflowstat-node costs a C node (issue 26): one C receiver (collectors/c/build/node-bench)
taking 100,000 small messages a second from a paced C sender, with and without the library's
calls, in one run.

plain      the receiver takes each message and makes no library call;
monitored  it opens a node and tells it of each message (fs_node_received, fs_node_latency), and
           a client asks the node get-metrics once a second, as an agent would: the control
           thread's work is in the figure too.

The modes alternate, ROUNDS times each (default 3), each run SECONDS long (default 8); the
receiver's CPU (all its threads) is read over the run's middle (its first and last second left
out) from /proc/PID/stat (utime + stime, in clock ticks: the issue's measure) and from
/proc/PID/task/*/schedstat (nanoseconds: the precise one). Reported: CPU seconds per second of
each mode, nanoseconds per message, the ratio monitored / plain and the extra CPU in percent (the
issue's target: at most 1%).

Usage: benchmarks/bench_node_c.py [--rate N] [--seconds S] [--rounds R] [--size BYTES] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from flowstat.harness.control import ControlClient
from flowstat.proc.procfs import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "collectors" / "c" / "build" / "node-bench"
TICK = os.sysconf("SC_CLK_TCK")


def stat_cpu_seconds(pid: int) -> float:
    """utime + stime of /proc/PID/stat (fields 14 and 15), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def poll_metrics(endpoint: str, stop: threading.Event, replies: list[dict]) -> None:
    client = ControlClient(endpoint, timeout_s=2)
    try:
        while not stop.wait(1.0):
            replies.append(client.request("get-metrics"))
    finally:
        client.close()


def one_run(mode: str, rate: int, seconds: float, size: int, endpoint: str) -> dict:
    receiver = subprocess.Popen([str(BENCH), "receive", endpoint, mode], stdout=subprocess.PIPE, text=True)
    control = receiver.stdout.readline().strip()
    stop, replies = threading.Event(), []
    poller = None
    if mode == "monitored":
        poller = threading.Thread(target=poll_metrics, args=(control, stop, replies), daemon=True)
        poller.start()
    sender = subprocess.Popen(
        [str(BENCH), "send", endpoint, str(rate), str(seconds), str(size)], stdout=subprocess.PIPE, text=True
    )
    time.sleep(1.0)
    t0, stat0, sched0 = time.monotonic(), stat_cpu_seconds(receiver.pid), cpu_seconds(receiver.pid)
    time.sleep(seconds - 2.0)
    t1, stat1, sched1 = time.monotonic(), stat_cpu_seconds(receiver.pid), cpu_seconds(receiver.pid)
    sent = int(sender.communicate(timeout=60)[0].strip() or 0)
    received = int(receiver.communicate(timeout=60)[0].strip() or 0)
    stop.set()
    if poller:
        poller.join(5)
    wall = t1 - t0
    return {
        "mode": mode,
        "sent": sent,
        "received": received,
        "window_s": round(wall, 3),
        "cpu_stat_per_s": (stat1 - stat0) / wall,
        "cpu_schedstat_per_s": (sched1 - sched0) / wall,
        "metrics_requests": len(replies),
        "node_objects_received": replies[-1]["objects_received"] if replies else None,
    }


def summary(runs: list[dict], rate: int) -> dict:
    out: dict = {}
    for mode in ("plain", "monitored"):
        mine = [r for r in runs if r["mode"] == mode]
        for measure in ("cpu_stat_per_s", "cpu_schedstat_per_s"):
            values = [r[measure] for r in mine]
            out[f"{mode}_{measure}"] = round(statistics.mean(values), 5)
            out[f"{mode}_{measure}_runs"] = [round(v, 5) for v in values]
        out[f"{mode}_ns_per_message"] = round(out[f"{mode}_cpu_schedstat_per_s"] / rate * 1e9, 1)
    for measure in ("cpu_stat_per_s", "cpu_schedstat_per_s"):
        ratio = out[f"monitored_{measure}"] / out[f"plain_{measure}"]
        out[f"ratio_{measure}"] = round(ratio, 4)
        out[f"extra_percent_{measure}"] = round((ratio - 1) * 100, 2)
        out[f"extra_percent_of_a_core_{measure}"] = round(
            (out[f"monitored_{measure}"] - out[f"plain_{measure}"]) * 100, 3
        )
    out["extra_ns_per_message"] = round(out["monitored_ns_per_message"] - out["plain_ns_per_message"], 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "node-c.json")
    args = ap.parse_args()
    subprocess.run(["make", "-C", str(ROOT / "collectors" / "c"), "build/node-bench"], check=True)
    endpoint = f"ipc:///tmp/flowstat-bench-node-{os.getpid()}"
    runs = []
    for r in range(args.rounds):
        order = ("plain", "monitored") if r % 2 == 0 else ("monitored", "plain")
        for mode in order:
            run = one_run(mode, args.rate, args.seconds, args.size, endpoint)
            print(json.dumps(run), file=sys.stderr)
            assert run["received"] == run["sent"] > 0, run
            runs.append(run)
    result = {
        "benchmark": "bench_node_c",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "rate_per_s": args.rate,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "message_bytes": args.size,
        "target_extra_percent": 1.0,
        "summary": summary(runs, args.rate),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
