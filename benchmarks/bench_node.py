#!/usr/bin/env python3
"""What flowstat.node costs a Python node: a receiver taking 100,000 small messages per second (a paced
sender in another process), its CPU time measured with and without the library's calls, in one run.

Modes of the same receiver loop (each reads the message and its sender's stamp, as a node would):
- bare: no library;
- per-message: node.received(1, nbytes, sent_at=stamp) for every message (input latency included);
- per-message-counts: node.received(1, nbytes), no stamp;
- bare-batch: the loop reads what waits, up to 256 messages at once (as flowstat's harness reads),
  no library;
- per-batch: the same and node.received(n, nbytes, sent_at=stamps) once per batch;
- per-batch-counts: the same without the stamps, node.received(n, nbytes) once per batch;
- per-batch-1-in-16: per-batch with Node(latency_every=16): the library measures the stamps of one
  call in 16 (each object measured with a chance of one in 16), the percentiles from that sample;
- per-batch-phases: per-batch, and node.waiting() before each blocking read: the node's time is
  accounted busy/idle (issue 46), two phase changes (two clock reads) per batch. Its cost is
  against per-batch (the library without the accounting): accounting_share_of_a_core, the CPU the
  accounting adds per second of the run (target: at most 1% of a core).
- per-message-source: per-message, and the edge it came by: node.received(1, nbytes, sent_at=stamp,
  source="sender-0"), as a PULL fed by several nodes counts each (issue 46). Its cost is against
  per-message: source_ns_per_call, the CPU one call gains by naming its source (both measured in
  their runs, by replaying their calls).
A figure is the receiver's CPU time (user + system of all its threads, CLOCK_PROCESS_CPUTIME_ID) over
a fixed number of messages after a warm-up; each mode runs REPEATS times, interleaved, and the median
is kept. The cost of a mode is its CPU time over that of the same loop without the library (bare or
bare-batch), minus one; and, measured inside each run, the calls it made times the CPU of one call
over the rest of its CPU (library_cost_direct: the between-runs figure spreads by 15-30% here).
Target (issue 26): at most 1% of the node's CPU.

Usage: benchmarks/bench_node.py [--rate 100000] [--seconds 5] [--repeats 3]
Writes benchmarks/results/node-python.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import zmq

from flowstat.node import Node
from flowstat.proc.machine import describe

HEADER = struct.Struct("<Qd")
MODES = (
    "bare",
    "per-message",
    "per-message-counts",
    "bare-batch",
    "per-batch",
    "per-batch-counts",
    "per-batch-1-in-16",
    "per-batch-phases",
    "per-message-source",
)
SOURCE = "sender-0"
LATENCY_EVERY = {"per-batch-1-in-16": 16}
BASELINE = {
    "per-message": "bare",
    "per-message-counts": "bare",
    "per-batch": "bare-batch",
    "per-batch-counts": "bare-batch",
    "per-batch-1-in-16": "bare-batch",
    "per-batch-phases": "bare-batch",
    "per-message-source": "bare",
}
BATCH = 256
REPLAYED = 2000  # calls kept for timing one
RESULTS = Path(__file__).resolve().parent / "results" / "node-python.json"


def cpu_s() -> float:
    # the process's clock (all threads), to the nanosecond: /proc's 10 ms ticks blur a 1% difference
    return time.process_time()


def receive(mode: str, port: int, count: int, warmup: int) -> dict:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.bind(f"tcp://127.0.0.1:{port}")
    node = Node("bench", "worker", latency_every=LATENCY_EVERY.get(mode, 1)) if not mode.startswith("bare") else None
    print("ready", flush=True)
    taken, nbytes, t0, c0, counted, calls = 0, 0, 0.0, 0.0, 0, 0
    told: list[tuple] = []  # the last calls' arguments, replayed after the run to time a call
    unpack = HEADER.unpack_from
    while taken < count + warmup:
        if not t0 and taken >= warmup:
            t0, c0, counted, calls = time.monotonic(), cpu_s(), taken, 0
        calls += 1
        if mode.endswith("-batch") or mode.startswith("per-batch"):
            if mode == "per-batch-phases":
                node.waiting()
            batch = [sock.recv()]
            try:
                while len(batch) < BATCH:
                    batch.append(sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                pass
            size = 0
            stamps = []
            for m in batch:
                size += len(m)
                stamps.append(unpack(m)[1])
            if mode in ("per-batch", "per-batch-1-in-16", "per-batch-phases"):
                node.received(len(batch), size, sent_at=stamps)
                told.append((len(batch), size, stamps, None))
            elif node is not None:
                node.received(len(batch), size)
                told.append((len(batch), size, None, None))
            taken += len(batch)
            continue
        m = sock.recv()
        stamp = unpack(m)[1]
        if mode == "bare":
            nbytes += len(m)
        elif mode == "per-message":
            node.received(1, len(m), sent_at=stamp)
            told.append((1, len(m), stamp, None))
        elif mode == "per-message-source":
            node.received(1, len(m), sent_at=stamp, source=SOURCE)
            told.append((1, len(m), stamp, SOURCE))
        else:
            node.received(1, len(m))
            told.append((1, len(m), None, None))
        taken += 1
        if len(told) > 2 * REPLAYED:
            del told[:REPLAYED]
    out = {"mode": mode, "messages": taken - counted, "cpu_s": cpu_s() - c0, "wall_s": time.monotonic() - t0}
    out["calls"] = calls
    if node is not None:
        out["library_s"] = calls * time_a_call(node, told[-REPLAYED:], waits=mode == "per-batch-phases")
        out["direct_cost"] = out["library_s"] / (out["cpu_s"] - out["library_s"])
        node.close()
    ctx.destroy(linger=0)
    return out


def time_a_call(node: Node, told: list[tuple], waits: bool = False) -> float:
    """CPU seconds one of the run's calls costs: its last calls told again, the same arguments, until
    a quarter second has gone (latency bucketing included, as it comes every 4,096 waits); with
    ``waits``, each preceded by node.waiting() as in the run (two phase changes a call)."""
    replayed, c0 = 0, cpu_s()
    while cpu_s() - c0 < 0.25:
        for n, size, stamps, source in told:
            if waits:
                node.waiting()
            if stamps is None:
                node.received(n, size)
            elif source is None:
                node.received(n, size, sent_at=stamps)
            else:
                node.received(n, size, sent_at=stamps, source=source)
        replayed += len(told)
    return (cpu_s() - c0) / replayed


def send(port: int, rate: float, total: int) -> None:
    """Paced: every millisecond the messages due by then (HEADER + 8 bytes)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(f"tcp://127.0.0.1:{port}")
    pad = bytes(8)
    t0, sent = time.monotonic(), 0
    while sent < total:
        due = min(total, int((time.monotonic() - t0) * rate) + 1)
        while sent < due:
            sock.send(HEADER.pack(sent, time.time()) + pad)
            sent += 1
        time.sleep(0.001)
    ctx.destroy(linger=10_000)


def one(mode: str, rate: float, seconds: float, port: int) -> dict:
    count, warmup = int(rate * seconds), int(rate * 0.5)
    me = [sys.executable, __file__]
    receiver = subprocess.Popen(
        me + ["_receive", mode, str(port), str(count), str(warmup)], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout.readline().strip() == "ready"
    sender = subprocess.Popen(me + ["_send", str(port), str(rate), str(count + warmup)])
    out = json.loads(receiver.stdout.readline())
    receiver.wait(60), sender.wait(60)
    out["rate"] = out["messages"] / out["wall_s"]
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_receive":
        print(json.dumps(receive(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))), flush=True)
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_send":
        send(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=100_000, help="messages per second offered (default 100,000)")
    p.add_argument("--seconds", type=float, default=5, help="measured seconds per repeat (default 5)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--port", type=int, default=27811)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in MODES:
            got = one(mode, args.rate, args.seconds, args.port)
            runs[mode].append(got)
            print(
                f"[{r + 1}/{args.repeats}] {mode:20s} {got['cpu_s']:.3f} s CPU, {got['rate']:,.0f} msg/s",
                file=sys.stderr,
            )
    cpu = {m: statistics.median(x["cpu_s"] for x in runs[m]) for m in MODES}
    result = {
        "benchmark": "node-python",
        "machine": describe(),
        "rate_offered": args.rate,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "cpu_s_median": cpu,
        "node_cpu_share_of_a_core": {m: cpu[m] / args.seconds for m in MODES},
        "library_cost_vs_bare": {m: cpu[m] / cpu[base] - 1 for m, base in BASELINE.items()},
        # the same cost measured inside each run: calls made x CPU of one call (the run's last calls
        # replayed), over the rest of the node's CPU; immune to the run-to-run spread of the above
        "library_cost_direct": {m: statistics.median(x["direct_cost"] for x in runs[m]) for m in BASELINE},
        "calls_per_message": {m: statistics.median(x["calls"] / x["messages"] for x in runs[m]) for m in BASELINE},
        "target_cost": 0.01,
        # issue 46: what accounting busy/idle adds, CPU seconds per second of the run (a share of a
        # core): the calls' CPU with node.waiting() before each read, less without (both measured in
        # their runs); target at most 0.01
        "accounting_share_of_a_core": statistics.median(x["library_s"] for x in runs["per-batch-phases"]) / args.seconds
        - statistics.median(x["library_s"] for x in runs["per-batch"]) / args.seconds,
        "accounting_cost_vs_per_batch": cpu["per-batch-phases"] / cpu["per-batch"] - 1,
        # issue 46: what naming a message's source costs a call (received(source=...)), ns, from the
        # calls replayed in each run: per-message-source's less per-message's
        "source_ns_per_call": 1e9
        * (
            statistics.median(x["library_s"] / x["calls"] for x in runs["per-message-source"])
            - statistics.median(x["library_s"] / x["calls"] for x in runs["per-message"])
        ),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, separators=(",", ":")) + "\n")  # compact: git keeps it
    for m, c in result["library_cost_vs_bare"].items():
        print(
            f"{m:20s} {c * 100:+.1f}% CPU against {BASELINE[m]}, "
            f"{result['library_cost_direct'][m] * 100:.2f}% measured in the run",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
