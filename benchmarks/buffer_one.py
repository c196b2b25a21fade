#!/usr/bin/env python3
"""A buffer of one (thesis 5.1): at what rate does it overload, and why?

The thesis's merger, fed by 4 producers of 1 kB TH1F at 100 objects/s each through a ZeroMQ buffer
(high-water mark) of one message, lost 6% of its throughput and logged overloads. flowstat's does
not at that rate. This sweeps the rate per producer and the kernel's socket buffers under ZeroMQ's
(auto-tuned, or SO_SNDBUF/SO_RCVBUF of 4096 bytes: the topology's kernel_buffer_size), always with
4 producers of 1 kB TH1F, buffer_size 1 and one merger pinned on CPU 1, everything else on CPU 0.

For each run it records the offered and merged objects/s and the producers' overload events/s over
the steady state (start-up and drain out: flowstat.harness.online's window), the overloads and
counts every second, and the TCP queues of the producer->merger connections, read from
/proc/net/tcp every 0.1 s by a thread while the run goes (tx_queue of the producers' ends: bytes
sent and not yet acknowledged by the merger's end; rx_queue of the merger's ends: bytes the merger
has not read). Then it measures the pipe alone (PROBE): how soon a PUSH of high-water mark 1 takes a
second message after a first.

Each configuration's result is kept in .cache/buffer-one/<duration>s/ as it finishes: a rerun
skips those already measured (--redo measures them again). At the end it writes every series to
benchmarks/results/raw/buffer-one.json (not tracked), the figures the docs read (each run's
without its per-second and queue series and its whole-run queues) to
benchmarks/results/buffer-one.json, and
docs/img/buffer-one.svg and docs/buffer-one.md from the line "## Results" on (what is above it is
written by hand, and kept).

Usage: benchmarks/buffer_one.py [--duration S] [--rates R,R,...] [--redo]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flowstat.harness.orchestrator import run_topology
from flowstat.harness.topology import from_dict
from flowstat.proc.machine import describe
from flowstat.timeutil import iso_utc_ms

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "buffer-one.json"  # the summary, tracked
RAW = ROOT / "benchmarks" / "results" / "raw" / "buffer-one.json"  # every series, not tracked
SERIES = ("per_second", "queue_series")  # a run's series, left out of the summary
# a run's figures that neither the doc nor the plot reads (the whole run's queues and overloads:
# start-up and drain in), also left out: the raw file keeps them
UNREAD = ("queues_whole_run", "overload_events_whole_run", "run_id", "seconds", "window_s", "failures")
# Of a run's steady queues, what the doc reads (the raw file has the rest: readings, a connection's maxima).
QUEUE_FIGURES = tuple(
    f"{q}_queue_{f}" for q in ("send", "receive") for f in ("max_bytes", "mean_bytes", "empty_fraction")
)
DOC = ROOT / "docs" / "buffer-one.md"
SVG = ROOT / "docs" / "img" / "buffer-one.svg"
RATES = [
    100,
    500,
    750,
    900,
    1000,
    2000,
    4000,
    8000,
    16000,
    0,
]  # objects/s per producer; 0 = as fast as it can (500-900: where overloads start)
KERNEL_BUFFERS: list[int | None] = [None, 4096]  # None: the kernel's auto-tuning
PRODUCERS = 4
PINS = {"merger": 1, "producer": 0, "viewer": 0, "agent": 0}  # the merger alone on CPU 1
SAMPLE_S = 0.1  # the TCP queues are read this often
ESTABLISHED = "01"  # /proc/net/tcp's st column


def machine() -> dict[str, Any]:
    """flowstat's description of this machine (flowstat.proc.machine) and the socket buffer limits."""
    return {
        **describe(),
        "tcp_wmem": read_sysctl("net/ipv4/tcp_wmem"),
        "tcp_rmem": read_sysctl("net/ipv4/tcp_rmem"),
        "wmem_max": read_sysctl("net/core/wmem_max"),
        "rmem_max": read_sysctl("net/core/rmem_max"),
    }


def read_sysctl(name: str) -> str | None:
    try:
        return " ".join(Path("/proc/sys", name).read_text().split())
    except OSError:
        return None


def key(rate: int, kbuf: int | None) -> str:
    return f"rate-{rate}-kbuf-{kbuf or 'auto'}"


def topology(rate: int, kbuf: int | None, duration: float) -> dict[str, Any]:
    topo = {
        "run_id": f"buffer-one-{key(rate, kbuf)}",
        "duration": duration,
        "buffer_size": 1,
        "object": {"type": "TH1F", "size": "1kB"},
        "producers": {"count": PRODUCERS, "rate": rate, "processes": 1},
        "mergers": 1,
        "cpus": PINS,
    }
    if kbuf is not None:
        topo["kernel_buffer_size"] = kbuf
    return topo


# -- the TCP queues -----------------------------------------------------------------------------------
def tcp_queues(port: int) -> tuple[list[int], list[int]]:
    """The send queues of the producers' ends and the receive queues of the merger's ends of the
    established connections to ``port`` (bytes, one per connection), from /proc/net/tcp."""
    send, receive = [], []
    with open("/proc/net/tcp") as f:
        next(f)  # the header
        for line in f:
            fields = line.split()
            if fields[3] != ESTABLISHED:
                continue
            local, remote = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
            tx, rx = (int(x, 16) for x in fields[4].split(":"))
            if remote == port:
                send.append(tx)
            elif local == port:
                receive.append(rx)
    return send, receive


def merger_port(run_dir: Path) -> int | None:
    try:
        nodes = json.loads((run_dir / "endpoints.json").read_text())["nodes"]
    except (OSError, ValueError):  # not written yet (or being written)
        return None
    return int(next(n["data"] for n in nodes if n["role"] == "merger").rsplit(":", 1)[1])


def sample_queues(run_dir: Path, ended: threading.Event, series: list) -> None:
    """Every SAMPLE_S until the run ends: (monotonic s, the producers' send queues, the merger's
    receive queues), once the merger's data port is known (endpoints.json)."""
    port = None
    while not ended.wait(SAMPLE_S):
        port = port or merger_port(run_dir)
        if port is not None:
            series.append((time.monotonic(), *tcp_queues(port)))


def queue_stats(samples: list[tuple[float, list[int], list[int]]]) -> dict[str, Any]:
    """Max and mean of the send and receive queues (bytes summed over the connections), and how
    often each was empty."""
    out: dict[str, Any] = {"samples": len(samples)}
    for name, i in (("send_queue", 1), ("receive_queue", 2)):
        totals = [sum(s[i]) for s in samples]
        out[f"{name}_max_bytes"] = max(totals, default=None)
        out[f"{name}_mean_bytes"] = round(statistics.fmean(totals), 1) if totals else None
        out[f"{name}_empty_fraction"] = round(sum(1 for t in totals if t == 0) / len(totals), 3) if totals else None
        out[f"{name}_max_one_connection_bytes"] = max((max(s[i], default=0) for s in samples), default=None)
    out["connections"] = max((len(s[1]) for s in samples), default=0)
    return out


# -- one run ------------------------------------------------------------------------------------------
def measure(rate: int, kbuf: int | None, duration: float, runs_dir: Path) -> dict[str, Any]:
    topo = from_dict(topology(rate, kbuf, duration), f"buffer_one.py {key(rate, kbuf)}")
    run_id = f"buffer-one-{key(rate, kbuf)}"
    shutil.rmtree(runs_dir / run_id, ignore_errors=True)  # a run interrupted before its result was kept
    ended, queues, seconds, start = threading.Event(), [], [], []

    def on_progress(elapsed: float, _duration: float, metrics: list[dict], _verdicts: dict, _flow: object) -> None:
        if not start:
            start.append(time.monotonic() - elapsed)  # the start command, on this process's clock
        seconds.append(per_second(elapsed, metrics))
        if int(elapsed) % 5 == 0:
            last = seconds[-1]
            print(
                f"    {elapsed:4.0f} s: sent {last['sent']:,}, merged {last['merged']:,}, "
                f"overload events {last['overload_events']:,}",
                file=sys.stderr,
                flush=True,
            )

    sampler = threading.Thread(target=sample_queues, args=(runs_dir / run_id, ended, queues), daemon=True)
    sampler.start()
    try:
        summary = run_topology(topo, run_id=run_id, runs_dir=runs_dir, on_progress=on_progress)
    finally:
        ended.set()
        sampler.join()
    return result(rate, kbuf, summary, seconds, queues, start[0] if start else None)


def per_second(elapsed: float, metrics: list[dict]) -> dict[str, Any]:
    """The counters of one progress reading (totals since the start)."""
    producers = [m for m in metrics if m.get("role") == "producer"]
    merger = next((m for m in metrics if m.get("role") == "merger"), {})
    return {
        "t": round(elapsed, 2),
        "sent": sum(p.get("objects_sent") or 0 for p in producers),
        "overload_events": sum(p.get("send_overload_events") or 0 for p in producers),
        "received": merger.get("objects_received") or 0,
        "merged": merger.get("objects_merged") or 0,
        "in_flight": merger.get("objects_in_flight"),
    }


def result(rate: int, kbuf: int | None, s: dict, seconds: list[dict], queues: list, t0: float | None) -> dict:
    v = s["online"]["merger-0"]
    window = v.get("window_s") or [0.0, 0.0]
    span = window[1] - window[0]
    rel = [(t - t0, snd, rcv) for t, snd, rcv in queues] if t0 is not None else []
    steady = [q for q in rel if window[0] <= q[0] <= window[1]]
    producers = [n for n in s["nodes"] if n["role"] == "producer"]
    return {
        "rate_per_producer": rate,
        "kernel_buffer_bytes": kbuf,
        "run_id": s["run_id"],
        "seconds": s["seconds"],
        "no_loss": s["conservation"]["ok"],
        "ok": s["ok"],
        "failures": s["failures"],
        "window_s": window,
        "verdict": v.get("state"),
        "offered_per_second": v.get("offered_per_second"),
        "merged_per_second": v.get("merged_per_second"),
        "overload_events_steady": v.get("producer_refusals"),
        "overload_events_per_second": round(v["producer_refusals"] / span, 2) if span > 0 else None,
        "overload_events_whole_run": sum(p.get("send_overload_events") or 0 for p in producers),
        "input_latency_p99_ms_worst_second": v.get("latency_p99_ms_worst_second"),
        "queues_steady": queue_stats(steady),
        "queues_whole_run": queue_stats(rel),
        "per_second": seconds,
        # the series as (s since the start, send queue bytes, receive queue bytes), summed over connections
        "queue_series": [(round(t, 2), sum(snd), sum(rcv)) for t, snd, rcv in rel],
    }


# -- the pipe's round trip, alone ---------------------------------------------------------------------
# A PUSH of high-water mark 1 sends one 1 kB message, then, GAP s later, tries a second without
# blocking: refused or not, and how long until it went. Its receiver (its own context, so its own
# I/O thread, on CPU 1) never reads: its pipe and the kernel take everything. The sender's threads
# run on the CPUs given. With "events", the sender reads ZMQ_EVENTS first, which makes libzmq
# process the commands its I/O thread sent (a send without blocking does so at most once every
# max_command_delay = 3,000,000 CPU ticks: libzmq's config.hpp).
PROBE = r"""
import json, os, statistics, sys, time, zmq
cpus, gap, events, n = {int(c) for c in sys.argv[1].split(",")}, float(sys.argv[2]), sys.argv[3] == "1", 300
os.sched_setaffinity(0, {1})
rctx = zmq.Context(); pull = rctx.socket(zmq.PULL); pull.setsockopt(zmq.RCVHWM, 100000)
port = pull.bind_to_random_port("tcp://127.0.0.1")
os.sched_setaffinity(0, cpus)  # before the sender's context: its I/O thread inherits it
ctx = zmq.Context(); push = ctx.socket(zmq.PUSH); push.setsockopt(zmq.SNDHWM, 1)
push.connect(f"tcp://127.0.0.1:{port}")
msg, refused, waits = b"x" * 1081, 0, []
push.send(msg); time.sleep(0.05)
for _ in range(n):
    push.send(msg)  # blocking: it waits for the pipe to be free
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < gap: pass  # a busy producer: it does not yield the CPU
    if events:
        push.getsockopt(zmq.EVENTS)
    try:
        push.send(msg, zmq.NOBLOCK)
    except zmq.Again:
        refused += 1
        while True:
            try:
                push.send(msg, zmq.NOBLOCK); break
            except zmq.Again: pass
        waits.append((time.perf_counter() - t0) * 1e6)
    time.sleep(0.003)
median = statistics.median(waits) if waits else None
print(json.dumps({"refused_fraction": refused / n, "until_sent_us_median": median}))
"""
PROBE_CASES = [
    (cpus, gap, events) for events in (False, True) for cpus in ("0", "0,1") for gap in (0.0, 50e-6, 500e-6, 1e-3, 2e-3)
]


def pipe_probe() -> list[dict]:
    out = []
    for cpus, gap, events in PROBE_CASES:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, cpus, str(gap), "1" if events else "0"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        out.append(
            {"sender_cpus": cpus, "gap_us": round(gap * 1e6), "events_read_first": events, **json.loads(proc.stdout)}
        )
    return out


def probe_section(probe: list[dict]) -> list[str]:
    lines = [
        "",
        "The pipe alone (`PROBE` in the script): a PUSH of high-water mark 1 sends a 1 kB message, then "
        "tries a second one without blocking after a busy wait of the gap given; its receiver, on CPU 1, "
        "never reads. Refused: share of 300 tries; until it went: median, from the first send, of the refused "
        "ones.",
        "",
        "| sender's threads on CPUs | gap us | ZMQ_EVENTS read first | refused | until it went us |",
        "|---|---:|---|---:|---:|",
    ]
    for p in probe:
        lines.append(
            f"| {p['sender_cpus']} | {p['gap_us']} | {'yes' if p['events_read_first'] else 'no'} | "
            f"{p['refused_fraction']:.0%} | {fmt(p['until_sent_us_median'])} |"
        )
    return lines


# -- the sweep ----------------------------------------------------------------------------------------
def sweep(args: argparse.Namespace, cache: Path) -> list[dict]:
    runs_dir = cache / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    configs = [(rate, kbuf) for kbuf in KERNEL_BUFFERS for rate in args.rates]
    out = []
    for i, (rate, kbuf) in enumerate(configs, 1):
        path = cache / f"{key(rate, kbuf)}.json"
        label = f"[{i}/{len(configs)}] {PRODUCERS} x {rate or 'unlimited'}/s, kernel buffer {kbuf or 'auto'}"
        if path.exists() and not args.redo:
            print(f"{label}: measured already ({path})", file=sys.stderr, flush=True)
        else:
            print(f"{label}: {args.duration:g} s ...", file=sys.stderr, flush=True)
            path.write_text(json.dumps(measure(rate, kbuf, args.duration, runs_dir)))
        r = json.loads(path.read_text())
        print(
            f"{label}: merged {r['merged_per_second']}/s of {r['offered_per_second']}/s, "
            f"{r['overload_events_per_second']} overload events/s, send queue max "
            f"{r['queues_steady']['send_queue_max_bytes']} B, receive queue max "
            f"{r['queues_steady']['receive_queue_max_bytes']} B",
            file=sys.stderr,
            flush=True,
        )
        out.append(r)
    return out


def first_overloading(runs: list[dict], kbuf: int | None) -> dict | None:
    """The paced run of lowest rate whose producers overloaded in the steady state (unlimited last)."""
    mine = sorted(
        (r for r in runs if r["kernel_buffer_bytes"] == kbuf), key=lambda r: r["rate_per_producer"] or math.inf
    )
    return next((r for r in mine if (r["overload_events_steady"] or 0) > 0), None)


def summary_of(runs: list[dict]) -> dict[str, Any]:
    out = {}
    for kbuf in KERNEL_BUFFERS:
        r = first_overloading(runs, kbuf)
        out[f"kernel_{kbuf or 'auto'}"] = (
            None
            if r is None
            else {
                "rate_per_producer": r["rate_per_producer"],
                "overload_events_per_second": r["overload_events_per_second"],
                "send_queue_max_bytes": r["queues_steady"]["send_queue_max_bytes"],
                "send_queue_mean_bytes": r["queues_steady"]["send_queue_mean_bytes"],
                "receive_queue_max_bytes": r["queues_steady"]["receive_queue_max_bytes"],
                "receive_queue_mean_bytes": r["queues_steady"]["receive_queue_mean_bytes"],
            }
        )
    return {"lowest_overloading_rate": out}


# -- the plot and the doc -----------------------------------------------------------------------------
SVG_NOTE = "<!-- Written by benchmarks/buffer_one.py (make bench): do not edit. -->"


def svg_plot(runs: list[dict]) -> str:
    """Overload events/s against offered objects/s, log-log, one line per kernel buffer setting; a
    run without overloads sits on the 0 line at the bottom."""
    w, h, left, right, top, bottom = 660, 400, 70, 40, 30, 60
    x_lo, x_hi, y_lo, y_hi = 2, 5, -1, 5  # decades: 100 .. 1e5 objects/s, 0.1 .. 1e5 events/s
    zero_y = h - bottom + 0  # the 0 line, under the log axis

    def x(v: float) -> float:
        return left + (math.log10(max(v, 10**x_lo)) - x_lo) / (x_hi - x_lo) * (w - left - right)

    def y(v: float) -> float:
        if v <= 0:
            return zero_y
        return h - bottom - 20 - (math.log10(max(v, 10**y_lo)) - y_lo) / (y_hi - y_lo) * (h - bottom - 20 - top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        f'font-family="sans-serif" font-size="12">',
        SVG_NOTE,
        f'<rect width="{w}" height="{h}" fill="white"/>',
    ]
    for d in range(x_lo, x_hi + 1):
        parts.append(f'<line x1="{x(10**d):.1f}" y1="{top}" x2="{x(10**d):.1f}" y2="{h - bottom}" stroke="#ddd"/>')
        parts.append(f'<text x="{x(10**d):.1f}" y="{h - bottom + 16}" text-anchor="middle">{10**d:,}</text>')
    for d in range(y_lo, y_hi + 1):
        parts.append(f'<line x1="{left}" y1="{y(10**d):.1f}" x2="{w - right}" y2="{y(10**d):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(10**d) + 4:.1f}" text-anchor="end">{10**d:,g}</text>')
    parts.append(f'<text x="{left - 6}" y="{zero_y + 4}" text-anchor="end">0</text>')
    parts.append(f'<line x1="{left}" y1="{zero_y}" x2="{w - right}" y2="{zero_y}" stroke="#999"/>')
    parts.append(
        f'<text x="{(left + w - right) / 2}" y="{h - 18}" text-anchor="middle">offered objects/s '
        f"(4 producers together, steady state)</text>"
    )
    parts.append(
        f'<text transform="translate(16 {(top + h - bottom) / 2}) rotate(-90)" text-anchor="middle">'
        f"producers' overload events/s</text>"
    )
    parts.append(
        f'<text x="{left}" y="{top - 10}">Buffer of one, 4 producers of 1 kB TH1F, 1 pinned merger '
        f"(labels: rate asked per producer)</text>"
    )
    for i, (kbuf, colour) in enumerate(zip(KERNEL_BUFFERS, ("#1f77b4", "#d62728"), strict=False)):
        # in the order of the rate asked for (unlimited last), each point labelled with it: producers
        # that cannot keep up offer less than asked, and the line may turn back
        mine = sorted(
            (r for r in runs if r["kernel_buffer_bytes"] == kbuf), key=lambda r: r["rate_per_producer"] or math.inf
        )
        points = [(x(r["offered_per_second"] or 0), y(r["overload_events_per_second"] or 0)) for r in mine]
        parts += [
            f'<text x="{px + 5:.1f}" y="{py + (-6 if i == 0 else 14):.1f}" font-size="10" fill="{colour}">'
            f'{r["rate_per_producer"] or "unl."}</text>'
            for r, (px, py) in zip(mine, points, strict=False)
        ]
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
            + " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
            + '"/>'
        )
        parts += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{colour}"/>' for px, py in points]
        ly = top + 14 + 18 * i
        name = f"kernel buffers {kbuf} B (SO_SNDBUF/SO_RCVBUF)" if kbuf else "kernel buffers auto-tuned"
        parts.append(
            f'<line x1="{left + 12}" y1="{ly - 4}" x2="{left + 36}" y2="{ly - 4}" stroke="{colour}" '
            f'stroke-width="2"/><text x="{left + 42}" y="{ly}">{name}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, (int, float)) else str(v)


def results_section(results: dict) -> str:
    m, runs = results["machine"], results["runs"]
    lines = [
        "## Results",
        "",
        "Generated by `benchmarks/buffer_one.py` from `benchmarks/results/buffer-one.json`: do not edit below this "
        "line by hand.",
        "",
        f"Command: `{results['command']}` ({results['duration_s']:g} s per run, finished {results['finished']}).",
        "",
        f"Machine: {m['host']}, nproc {m['usable_cpus']}, kernel {m['kernel']}, {m['cpu_model']}; tcp_wmem "
        f"{m['tcp_wmem']}, "
        f"tcp_rmem {m['tcp_rmem']}, wmem_max {m['wmem_max']}, rmem_max {m['rmem_max']}.",
        "",
        "Steady state only (start-up and drain excluded: the online verdict's window). Queues: bytes summed over "
        "the 4 producer->merger connections, read every 0.1 s from /proc/net/tcp (send: tx_queue of the producers' "
        "ends; receive: rx_queue of the merger's end); empty: the share of readings at 0.",
        "",
        "| rate/producer | kernel buffer | offered/s | merged/s | overload events/s | send queue max / mean B "
        "| send queue empty | receive queue max / mean B | receive queue empty | verdict |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        q = r["queues_steady"]
        lines.append(
            f"| {r['rate_per_producer'] or 'unlimited'} | {r['kernel_buffer_bytes'] or 'auto'} | "
            f"{fmt(r['offered_per_second'])} | {fmt(r['merged_per_second'])} | "
            f"{fmt(r['overload_events_per_second'], 1)} | "
            f"{fmt(q['send_queue_max_bytes'])} / {fmt(q['send_queue_mean_bytes'])} | "
            f"{fmt(q['send_queue_empty_fraction'], 2)} | "
            f"{fmt(q['receive_queue_max_bytes'])} / {fmt(q['receive_queue_mean_bytes'])} | "
            f"{fmt(q['receive_queue_empty_fraction'], 2)} | {r['verdict']}{'' if r['no_loss'] else ', LOSS'} |"
        )
    lines += ["", "![overload events/s against offered rate](img/buffer-one.svg)", ""]
    if results.get("pipe_probe"):
        lines += probe_section(results["pipe_probe"]) + [""]
    for kbuf in KERNEL_BUFFERS:
        first = results["summary"]["lowest_overloading_rate"][f"kernel_{kbuf or 'auto'}"]
        name = f"kernel buffers of {kbuf} bytes" if kbuf else "auto-tuned kernel buffers"
        lines.append(
            f"- Lowest rate with overloads, {name}: "
            + (
                "none"
                if first is None
                else f"{first['rate_per_producer'] or 'unlimited'}/s per producer "
                f"({first['overload_events_per_second']} events/s; "
                f"send queue max {first['send_queue_max_bytes']} B, mean {first['send_queue_mean_bytes']} B; receive "
                f"queue max {first['receive_queue_max_bytes']} B, mean {first['receive_queue_mean_bytes']} B)."
            )
        )
    return "\n".join(lines) + "\n"


DOC_HEAD = """# A buffer of one

(What the measurements below say is written here by hand; the results are generated.)

"""


def write_doc(results: dict) -> None:
    """docs/buffer-one.md: the hand-written part is kept, "## Results" on is replaced."""
    text = DOC.read_text() if DOC.exists() else DOC_HEAD
    head = text.split("## Results", 1)[0]
    DOC.write_text(head + results_section(results))


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The results without each run's series: what the doc and the plot read."""
    return {**results, "runs": [_summary_run(r) for r in results["runs"]]}


def _summary_run(run: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in run.items() if k not in SERIES + UNREAD}
    out["queues_steady"] = {k: v for k, v in run["queues_steady"].items() if k in QUEUE_FIGURES}
    return out


def main() -> int:
    from run_benchmarks import command_line  # beside this script, on its path when it runs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20, help="seconds per run (default 20)")
    ap.add_argument(
        "--rates",
        type=lambda s: [int(x) for x in s.split(",")],
        default=RATES,
        help="objects/s per producer, comma-separated; 0 = unlimited (default: %(default)s)",
    )
    ap.add_argument("--redo", action="store_true", help="measure again what .cache/buffer-one/ holds")
    ap.add_argument("--out", type=Path, default=RESULTS, help="JSON summary (default: %(default)s)")
    ap.add_argument("--raw", type=Path, default=RAW, help="JSON of every series (default: %(default)s)")
    ap.add_argument("--no-probe", action="store_true", help="skip the pipe's round trip measured alone")
    ap.add_argument("--no-doc", action="store_true", help="do not rewrite docs/buffer-one.md and its SVG")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        print("buffer_one.py: needs CPUs 0 and 1 (the merger alone on CPU 1)", file=sys.stderr)
        return 2
    cache = ROOT / ".cache" / "buffer-one" / f"{args.duration:g}s"
    cache.mkdir(parents=True, exist_ok=True)
    started = iso_utc_ms()
    runs = sweep(args, cache)
    results = {
        "started": started,
        "finished": iso_utc_ms(),
        "machine": machine(),
        "command": command_line(),
        "duration_s": args.duration,
        "producers": PRODUCERS,
        "object": "TH1F 1 kB",
        "buffer_size": 1,
        "cpus": PINS,
        "runs": runs,
        "summary": summary_of(runs),
    }
    if not args.no_probe:
        print("the pipe's round trip, alone ...", file=sys.stderr, flush=True)
        results["pipe_probe"] = pipe_probe()
    for path, doc in ((args.raw, results), (args.out, summary(results))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")  # compact: the summary is tracked
        print(f"written: {path}", file=sys.stderr)
    if not args.no_doc:
        SVG.parent.mkdir(parents=True, exist_ok=True)
        SVG.write_text(svg_plot(runs))
        write_doc(results)
        print(f"written: {SVG}, {DOC}", file=sys.stderr)
    print(json.dumps(results["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
