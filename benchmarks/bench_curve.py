#!/usr/bin/env python3
"""What CURVE on the control channel costs the agents (issue 30): CPU per sample of each agent asking
100 nodes in the clear, and the same 100 nodes secured with a run's keys, in one run.

Processes of 10 flowstat.node nodes each host 100 nodes announced in a plain endpoints directory and
100 in a secured one (CURVE servers, the run's client key let in). Each agent (Python, and C
when built with CURVE) watches one directory at a time at --interval for --seconds, the two
interleaved, --repeats times; a figure is the agent's CPU time (all its threads, /proc/PID/task/*/schedstat)
over the node samples it wrote stamped in the same window (JSON lines on a file), a window that starts
--warmup seconds after the agent: the steady cost, the start-up (imports, a CURVE handshake per node)
reported beside it. Every sample must carry the nodes' figures (objects_received): an agent not
answered would look cheaper. Target: no measurable change (the
secured/plain ratio within the spread of the plain rounds).

Usage: benchmarks/bench_curve.py [--nodes 100] [--seconds 10] [--warmup 3] [--interval 0.2] [--repeats 6]
Writes benchmarks/results/curve.json (each round's whole figures: results/raw/curve-rounds.json, out
of git). With --serve-only it starts the nodes and prints their
directories, for an agent started by hand under perf or strace (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "curve.json"
C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"


def host_nodes(first: int, n: int, folder: str, keys: str) -> None:
    """A nodes' process: ``n`` nodes counting a little, until stdin closes."""
    from flowstat.node import Node

    nodes = [
        Node(f"n{i}", "worker", run_id="bench-curve", endpoints_dir=folder, curve_keys=keys or None)
        for i in range(first, first + n)
    ]
    print("ready", flush=True)
    import select

    while not select.select([sys.stdin], [], [], 0.01)[0]:
        for node in nodes:
            node.received(1, 100)
    for node in nodes:
        node.close()


def cpu_ns(pid: int) -> int:
    """Time on a CPU of every thread of ``pid`` so far, in ns (schedstat: exact, where /proc/PID/stat
    counts clock ticks of 10 ms, 2-4% of a round's figure at each end)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended between the two reads
            pass
    return total


def agent_round(command: list[str], folder: Path, out: Path, seconds: float, interval: float, warmup: float) -> dict:
    """One agent watching ``folder``: its CPU over the node samples stamped in a window of ``seconds``
    that starts ``warmup`` seconds after the agent did, so that the figure is the steady cost a sample,
    not the start-up's (the Python agent's imports, a CURVE handshake per node) spread over the round."""
    proc = subprocess.Popen(
        [*command, "--endpoints-dir", str(folder), "--interval", str(interval), "--self-interval", "0"]
        + ["--rescan", "3600", "--sink", "stdout://?format=json"],
        stdout=open(out, "w"),
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(warmup)  # the window's start, not a wait for something
    t0, cpu0 = time.time(), cpu_ns(proc.pid)
    time.sleep(seconds)  # the measured window itself
    t1, cpu1 = time.time(), cpu_ns(proc.pid)
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    from flowstat.schema.sample import time_ns

    samples = [json.loads(line) for line in out.read_text().splitlines() if '"node_id"' in line]
    stamped = [(time_ns(s["time"]) / 1e9, s) for s in samples]
    window = [s for t, s in stamped if t0 <= t < t1]
    return {
        "cpu_s": (cpu1 - cpu0) / 1e9,
        "cpu_s_with_startup": cpu1 / 1e9,
        "samples": len(window),
        "samples_with_startup": sum(t < t1 for t, _ in stamped),
        "answered": sum("objects_received" in s for s in window),
        "log_tail": err[-500:],
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_nodes":
        host_nodes(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100, help="nodes per directory (default 100)")
    ap.add_argument(
        "--per-process", type=int, default=10, help="nodes a process hosts (default 10: one application's nodes)"
    )
    ap.add_argument("--seconds", type=float, default=10, help="seconds measured per round (default 10)")
    ap.add_argument("--warmup", type=float, default=3, help="seconds of a round before its window starts (default 3)")
    ap.add_argument("--interval", type=float, default=0.2, help="agents' sampling interval (default 0.2)")
    ap.add_argument("--repeats", type=int, default=6, help="rounds per agent and channel (default 6)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--serve-only",
        action="store_true",
        help="start the nodes, print their two directories and wait for Enter: for profiling an agent by hand",
    )
    args = ap.parse_args()
    from flowstat.node import curve
    from flowstat.proc.machine import describe

    agents = {"py": [sys.executable, "-m", "flowstat.agent"]}
    if (
        C_AGENT.exists()
        and "--curve-client-key" in subprocess.run([str(C_AGENT), "--help"], capture_output=True, text=True).stdout
    ):
        agents["c"] = [str(C_AGENT)]
    with tempfile.TemporaryDirectory(prefix="bench-curve-") as tmp:
        base = Path(tmp)
        plain, secured = base / "plain", base / "secured"
        keys = curve.create_run_keys(secured)  # secured/keys: where an agent of the directory looks
        hosts = [
            subprocess.Popen(
                [sys.executable, __file__, "_nodes", str(first), str(min(args.per_process, args.nodes - first))]
                + [str(folder), str(k)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for folder, k in ((plain, ""), (secured, keys))
            for first in range(0, args.nodes, args.per_process)
        ]
        try:
            for h in hosts:
                assert h.stdout.readline().strip() == "ready"
            if args.serve_only:
                print(f"in the clear: --endpoints-dir {plain}\nwith CURVE:   --endpoints-dir {secured}")
                input("Enter stops the nodes ")
                return 0
            rounds: dict[str, dict[str, list[dict]]] = {a: {"plain": [], "curve": []} for a in agents}
            for r in range(args.repeats):
                for agent, command in agents.items():
                    for channel, folder in (("plain", plain), ("curve", secured)):
                        got = agent_round(
                            command, folder, base / "out.ndjson", args.seconds, args.interval, args.warmup
                        )
                        got["us_per_sample"] = got["cpu_s"] / max(1, got["samples"]) * 1e6
                        got["us_per_sample_with_startup"] = (
                            got["cpu_s_with_startup"] / max(1, got["samples_with_startup"]) * 1e6
                        )
                        rounds[agent][channel].append(got)
                        print(
                            f"[{r + 1}/{args.repeats}] {agent} {channel:5s} {got['us_per_sample']:7.1f} us a sample "
                            f"({got['samples']} samples, {got['answered']} answered; "
                            f"{got['us_per_sample_with_startup']:.1f} with the start-up)",
                            file=sys.stderr,
                        )
                        if got["answered"] < got["samples"]:
                            raise SystemExit(f"{agent} on {channel}: nodes not answered\n{got['log_tail']}")
        finally:
            for h in hosts:
                h.stdin.close()
                h.wait(30)
    result: dict = {"benchmark": "curve", "machine": describe(), **vars(args), "out": str(args.out), "agents": {}}
    for agent, by in rounds.items():
        med = {ch: statistics.median(x["us_per_sample"] for x in runs) for ch, runs in by.items()}
        plain_spread = [x["us_per_sample"] for x in by["plain"]]
        result["agents"][agent] = {
            "us_per_sample_median": med,
            "us_per_sample_with_startup_median": {
                ch: statistics.median(x["us_per_sample_with_startup"] for x in runs) for ch, runs in by.items()
            },
            "curve_over_plain": med["curve"] / med["plain"],
            "plain_spread": [min(plain_spread) / med["plain"], max(plain_spread) / med["plain"]],
            "rounds_us_per_sample": {ch: [x["us_per_sample"] for x in runs] for ch, runs in by.items()},
        }
        print(
            f"{agent}: {med['plain']:.1f} us a sample in the clear, {med['curve']:.1f} with CURVE "
            f"(x{med['curve'] / med['plain']:.3f}; plain rounds x{min(plain_spread) / med['plain']:.3f}-"
            f"{max(plain_spread) / med['plain']:.3f})",
            file=sys.stderr,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result["out"] = str(args.out.relative_to(ROOT)) if args.out.is_relative_to(ROOT) else str(args.out)
    args.out.write_text(json.dumps(result, separators=(",", ":"), default=str) + "\n")  # compact: tracked
    raw = ROOT / "benchmarks" / "results" / "raw" / "curve-rounds.json"  # every round whole, outside git
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(rounds, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
