#!/usr/bin/env python3
"""A plain pyzmq pipeline, monitored by flowstat: source -> workers -> merger -> sink.

Each stage is its own process (`pipeline.py STAGE ...`, or `pipeline.py all` to start them all).
Objects are a small header (sequence number, the Unix time the source sent it) and a payload; the
workers transform them, the merger sums every N of them into one (a "merge", with an optional cost
per object to make it dearer), the sink counts what arrives. The lines marked `# flowstat` are all
the monitoring there is: with them, flowstat's agents report each stage's merge time, rates, input
latency and overloads, as they do for flowstat's own harness, and where its time goes (busy,
backpressured, idle) and who feeds it: what `flowstat top` needs to name the stage that holds the
flow back (`--slow STAGE` makes one do so).

    python pipeline.py all --endpoints-dir /tmp/flowstat-endpoints --objects 20000
    flowstat agent --endpoints-dir /tmp/flowstat-endpoints --sink stdout://
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import subprocess
import sys
import time

import zmq

from flowstat.node import Node  # flowstat

# sequence number, Unix time the source sent it, the index of the stage that sent it on (a source's or
# a worker's): what a PULL fed by several needs to count each edge (flowstat's received(source=...))
HEADER = struct.Struct("<QdH")
BATCH = 64  # messages a merger reads at once: a full batch means its input had work waiting
PORTS = {"merger": 0, "sink": 1, "worker": 10}  # offsets from --base-port (workers: 10 + index)
SEND_TIMEOUT_MS = 100  # a blocking send looks at a stop request this often


def address(args: argparse.Namespace, stage: str, index: int = 0) -> str:
    """Where a stage takes its input: each binds, its senders connect (their messages queue until
    the connection is made, rather than being refused)."""
    return f"tcp://127.0.0.1:{args.base_port + PORTS[stage] + index}"


def monitored(args: argparse.Namespace, node_id: str, role: str, upstream: list[str], **buffers: int) -> Node:
    """The stage's flowstat node, saying who feeds it; SIGTERM asks it to stop, as a monitor's
    `stop` does."""
    node = Node(
        node_id, role, run_id=args.run_id, endpoints_dir=args.endpoints_dir, upstream=upstream, **buffers
    )  # flowstat
    signal.signal(signal.SIGTERM, lambda *_: node.request_stop())
    return node


def slow(args: argparse.Namespace, node_id: str) -> float:
    """The CPU time (us) each object costs this stage: --slow-us if --slow names it (its id, e.g.
    worker-1, or its kind, e.g. worker for every worker), else none."""
    return args.slow_us if args.slow in (node_id, node_id.split("-")[0]) else 0.0


def burn(cost_us: float, objects: int = 1) -> None:
    """A chosen CPU cost: thread CPU time, not wall time, so the stage is as slow on any machine."""
    deadline = time.thread_time() + cost_us * 1e-6 * objects
    while time.thread_time() < deadline:
        pass


def data_socket(ctx: zmq.Context, kind: int, args: argparse.Namespace) -> zmq.Socket:
    """A PUSH or PULL socket whose queues hold --hwm messages, and the kernel's --tcp-buffer-kb."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM if kind == zmq.PUSH else zmq.RCVHWM, args.hwm)
    if kind == zmq.PUSH:
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)  # a blocking send, given up only to look at a stop
    if args.tcp_buffer_kb:
        sock.setsockopt(zmq.SNDBUF if kind == zmq.PUSH else zmq.RCVBUF, args.tcp_buffer_kb * 1024)
    return sock


def send(sock: zmq.Socket, node: Node, frame: bytes, blocking: bool) -> bool:
    """Send. Blocking (--blocking-sends, or --slow): a full queue holds the sender until the
    downstream takes, as a plain pyzmq send does (backpressure). Else without ever blocking for long:
    a full buffer is an overload, told, and the send retried."""
    node.sending()  # flowstat: backpressured until sent
    while not node.stop_requested:
        try:
            sock.send(frame, 0 if blocking else zmq.NOBLOCK)
            node.sent(1, len(frame))  # flowstat
            return True
        except zmq.Again:
            if blocking:
                continue  # SEND_TIMEOUT_MS went by: still held
            node.send_refused()  # flowstat
            time.sleep(0.0005)
    return False


def source(args: argparse.Namespace) -> None:
    node = monitored(args, f"source-{args.index}", "producer", [], send_buffer_size=args.hwm)
    ctx = zmq.Context()
    out = data_socket(ctx, zmq.PUSH, args)
    for i in range(args.workers):
        out.connect(address(args, "worker", i))
    payload = bytes(args.size)
    period = 1.0 / args.rate if args.rate else 0.0
    t0 = time.monotonic()
    for seq in range(args.objects):
        if node.stop_requested:
            break
        if period:
            node.waiting()  # flowstat: idle until the next object is due
            time.sleep(max(0.0, t0 + seq * period - time.monotonic()))
        if not send(out, node, HEADER.pack(seq, time.time(), args.index) + payload, args.blocking_sends):
            break
    ctx.destroy(linger=0 if node.stop_requested else 10_000)  # what is queued still goes, unless told to stop
    node.close()  # flowstat


def worker(args: argparse.Namespace) -> None:
    node_id, sources = f"worker-{args.index}", [f"source-{i}" for i in range(args.sources)]
    node = monitored(args, node_id, "worker", sources, receive_buffer_size=args.hwm, send_buffer_size=args.hwm)
    cost_us = slow(args, node_id)
    ctx = zmq.Context()
    inp, out = data_socket(ctx, zmq.PULL, args), data_socket(ctx, zmq.PUSH, args)
    inp.bind(address(args, "worker", args.index))
    out.connect(address(args, "merger"))
    while not node.stop_requested:
        node.waiting()  # flowstat: idle until the next object
        if not inp.poll(100):
            continue
        frame = inp.recv()
        seq, sent_at, by = HEADER.unpack_from(frame)
        node.received(1, len(frame), sent_at=sent_at, source=f"source-{by}")  # flowstat: the edge it came by
        burn(cost_us)
        send(out, node, HEADER.pack(seq, sent_at, args.index) + frame[HEADER.size :], args.blocking_sends)
    finish(node, ctx)


def merger(args: argparse.Namespace) -> None:
    workers = [f"worker-{i}" for i in range(args.workers)]
    node = monitored(args, "merger", "merger", workers, receive_buffer_size=args.hwm, send_buffer_size=args.hwm)
    cost_us = slow(args, "merger")
    ctx = zmq.Context()
    inp, out = data_socket(ctx, zmq.PULL, args), data_socket(ctx, zmq.PUSH, args)
    inp.bind(address(args, "merger"))
    out.connect(address(args, "sink"))
    held: list[bytes] = []
    while not node.stop_requested:
        node.waiting()  # flowstat: idle until input comes
        if not inp.poll(100):
            continue
        batch = read_batch(inp)
        node.input_backlog(len(batch) == BATCH)  # flowstat: a full batch read, more was waiting
        for frame in batch:
            _, sent_at, by = HEADER.unpack_from(frame)
            node.received(1, len(frame), sent_at=sent_at, source=f"worker-{by}")  # flowstat: the edge it came by
            burn(cost_us)
            held.append(frame)
            if len(held) == args.merge_every:
                t0 = time.perf_counter()
                merged = merge(held, args.merge_cost_us)
                node.merged(len(held), time.perf_counter() - t0)  # flowstat
                held = []
                send(out, node, merged, args.blocking_sends)
    finish(node, ctx)


def read_batch(sock: zmq.Socket) -> list[bytes]:
    """What waits on the socket, up to BATCH messages."""
    batch = []
    try:
        while len(batch) < BATCH:
            batch.append(sock.recv(zmq.NOBLOCK))
    except zmq.Again:
        pass
    return batch


def merge(frames: list[bytes], cost_us: float) -> bytes:
    """Sums the payloads' first bytes (a stand-in for adding histograms), plus a chosen CPU cost per
    object, so that a merger can be made as slow as a test or a user wants, on any machine."""
    burn(cost_us, len(frames))
    total = sum(f[HEADER.size] if len(f) > HEADER.size else 0 for f in frames) % 256
    size = len(frames[-1]) - HEADER.size
    return HEADER.pack(HEADER.unpack_from(frames[-1])[0], time.time(), 0) + bytes([total]) * size


def sink(args: argparse.Namespace) -> None:
    node = monitored(args, "sink", "sink", ["merger"], receive_buffer_size=args.hwm)
    cost_us = slow(args, "sink")
    ctx = zmq.Context()
    inp = data_socket(ctx, zmq.PULL, args)
    inp.bind(address(args, "sink"))
    taken = 0
    while not node.stop_requested:
        node.waiting()  # flowstat: idle until input comes
        if inp.poll(100):
            frame = inp.recv()
            node.received(1, len(frame), sent_at=HEADER.unpack_from(frame)[1])  # flowstat
            burn(cost_us)
            taken += 1
            if args.sink_delay_ms:
                time.sleep(args.sink_delay_ms / 1e3)
            if taken == args.expect:
                print(f"sink: {taken} merged objects", flush=True)
                if not args.keep_running:
                    break
    finish(node, ctx)


def finish(node: Node, ctx: zmq.Context) -> None:
    ctx.destroy(linger=0)
    node.close()  # flowstat


def run_all(args: argparse.Namespace) -> int:
    """Every stage as its own process, until the sink has every merged object (with --keep-running,
    until this process gets SIGTERM or Ctrl-C); then SIGTERM to the others (a clean stop)."""
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--base-port", str(args.base_port), "--hwm", str(args.hwm), "--run-id", args.run_id]
    common += ["--tcp-buffer-kb", str(args.tcp_buffer_kb), "--sources", str(args.sources)]
    common += ["--workers", str(args.workers)]
    if args.slow:
        common += ["--slow", args.slow, "--slow-us", str(args.slow_us)]
    if args.blocking_sends:
        common += ["--blocking-sends"]
    if args.endpoints_dir:
        common += ["--endpoints-dir", args.endpoints_dir]
    expect = args.objects * args.sources // args.merge_every
    sink_args = ["sink", "--sink-delay-ms", str(args.sink_delay_ms), "--expect", str(expect)]
    stages = [sink_args + (["--keep-running"] if args.keep_running else [])]
    stages += [["merger", "--merge-every", str(args.merge_every), "--merge-cost-us", str(args.merge_cost_us)]]
    stages += [["worker", "--index", str(i)] for i in range(args.workers)]
    children = [subprocess.Popen(me + s + common) for s in stages]
    source_args = ["source", "--objects", str(args.objects), "--rate", str(args.rate), "--size", str(args.size)]
    children += [subprocess.Popen(me + source_args + ["--index", str(i)] + common) for i in range(args.sources)]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        while not stop and (args.keep_running or children[0].poll() is None):
            time.sleep(0.1)  # a parent's loop: the stages do the work
    except KeyboardInterrupt:
        pass
    finally:
        for c in children:
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
        for c in children:
            c.wait()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=["all", "source", "worker", "merger", "sink"])
    p.add_argument("--index", type=int, default=0, help="which source or worker")
    p.add_argument("--sources", type=int, default=1, help="sources, each sending --objects to every worker")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--objects", type=int, default=10_000, help="objects a source sends")
    p.add_argument("--rate", type=float, default=0, help="objects/s a source offers (0: as fast as it can)")
    p.add_argument("--size", type=int, default=64, help="payload bytes")
    p.add_argument("--merge-every", type=int, default=10, help="objects per merge")
    p.add_argument("--merge-cost-us", type=float, default=0, help="CPU time a merge costs per object (us)")
    p.add_argument("--sink-delay-ms", type=float, default=0, help="time the sink takes per object (ms)")
    p.add_argument("--slow", metavar="STAGE", help="make a stage slow: worker-1, worker (every worker), merger or"
                   " sink burns --slow-us of CPU per object it takes; sends block (--blocking-sends), so what feeds"
                   " it is held by its full queue")  # fmt: skip
    p.add_argument("--slow-us", type=float, default=1000, help="the CPU time (us) an object costs the --slow stage")
    p.add_argument("--blocking-sends", action="store_true", help="a send waits while the queue is full (as plain"
                   " pyzmq does: backpressure), not refused and retried (an overload); --slow implies it")  # fmt: skip
    p.add_argument("--expect", type=int, default=1 << 62, help="the sink ends after this many merged objects")
    p.add_argument("--keep-running", action="store_true", help="the sink says it has them all and runs on")
    p.add_argument("--hwm", type=int, default=1000, help="ZeroMQ high-water marks (messages)")
    p.add_argument("--tcp-buffer-kb", type=int, default=0, help="the kernel's socket buffers (0: the system's)")
    p.add_argument("--base-port", type=int, default=5600)
    p.add_argument("--run-id", default="python-pipeline")
    p.add_argument("--endpoints-dir", help="where stages announce themselves (default: $FLOWSTAT_ENDPOINTS_DIR)")
    args = p.parse_args()
    args.blocking_sends = args.blocking_sends or bool(args.slow)
    if args.stage == "all":
        return run_all(args)
    {"source": source, "worker": worker, "merger": merger, "sink": sink}[args.stage](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
