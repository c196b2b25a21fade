#!/usr/bin/env python3
"""A plain pyzmq pipeline, monitored by flowstat: source -> workers -> merger -> sink.

Each stage is its own process (`pipeline.py STAGE ...`, or `pipeline.py all` to start them all).
Objects are a small header (sequence number, the Unix time the source sent it) and a payload; the
workers transform them, the merger sums every N of them into one (a "merge", with an optional cost
per object to make it dearer), the sink counts what arrives. The lines marked `# flowstat` are all
the monitoring there is: with them, flowstat's agents report each stage's merge time, rates, input
latency and overloads, as they do for flowstat's own harness.

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

HEADER = struct.Struct("<Qd")  # sequence number, Unix time the source sent it
BATCH = 64  # messages a merger reads at once: a full batch means its input had work waiting
PORTS = {"merger": 0, "sink": 1, "worker": 10}  # offsets from --base-port (workers: 10 + index)


def address(args: argparse.Namespace, stage: str, index: int = 0) -> str:
    """Where a stage takes its input: each binds, its senders connect (their messages queue until
    the connection is made, rather than being refused)."""
    return f"tcp://127.0.0.1:{args.base_port + PORTS[stage] + index}"


def monitored(args: argparse.Namespace, node_id: str, role: str, **buffers: int) -> Node:
    """The stage's flowstat node; SIGTERM asks it to stop, as a monitor's `stop` does."""
    node = Node(node_id, role, run_id=args.run_id, endpoints_dir=args.endpoints_dir, **buffers)  # flowstat
    signal.signal(signal.SIGTERM, lambda *_: node.request_stop())
    return node


def data_socket(ctx: zmq.Context, kind: int, args: argparse.Namespace) -> zmq.Socket:
    """A PUSH or PULL socket whose queues hold --hwm messages, and the kernel's --tcp-buffer-kb."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM if kind == zmq.PUSH else zmq.RCVHWM, args.hwm)
    if args.tcp_buffer_kb:
        sock.setsockopt(zmq.SNDBUF if kind == zmq.PUSH else zmq.RCVBUF, args.tcp_buffer_kb * 1024)
    return sock


def send(sock: zmq.Socket, node: Node, frame: bytes) -> bool:
    """Send without ever blocking for long: a full buffer is an overload, told and retried."""
    while not node.stop_requested:
        try:
            sock.send(frame, zmq.NOBLOCK)
            node.sent(1, len(frame))  # flowstat
            return True
        except zmq.Again:
            node.send_refused()  # flowstat
            time.sleep(0.0005)
    return False


def source(args: argparse.Namespace) -> None:
    node = monitored(args, f"source-{args.index}", "producer", send_buffer_size=args.hwm)
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
            time.sleep(max(0.0, t0 + seq * period - time.monotonic()))
        if not send(out, node, HEADER.pack(seq, time.time()) + payload):
            break
    ctx.destroy(linger=10_000)  # what is queued still goes
    node.close()  # flowstat


def worker(args: argparse.Namespace) -> None:
    node = monitored(args, f"worker-{args.index}", "worker", receive_buffer_size=args.hwm, send_buffer_size=args.hwm)
    ctx = zmq.Context()
    inp, out = data_socket(ctx, zmq.PULL, args), data_socket(ctx, zmq.PUSH, args)
    inp.bind(address(args, "worker", args.index))
    out.connect(address(args, "merger"))
    while not node.stop_requested:
        if not inp.poll(100):
            continue
        frame = inp.recv()
        seq, sent_at = HEADER.unpack_from(frame)
        node.received(1, len(frame), sent_at=sent_at)  # flowstat
        send(out, node, frame)
    finish(node, ctx)


def merger(args: argparse.Namespace) -> None:
    node = monitored(args, "merger", "merger", receive_buffer_size=args.hwm, send_buffer_size=args.hwm)
    ctx = zmq.Context()
    inp, out = data_socket(ctx, zmq.PULL, args), data_socket(ctx, zmq.PUSH, args)
    inp.bind(address(args, "merger"))
    out.connect(address(args, "sink"))
    held: list[bytes] = []
    while not node.stop_requested:
        if not inp.poll(100):
            continue
        batch = read_batch(inp)
        node.input_backlog(len(batch) == BATCH)  # flowstat: a full batch read, more was waiting
        for frame in batch:
            node.received(1, len(frame), sent_at=HEADER.unpack_from(frame)[1])  # flowstat
            held.append(frame)
            if len(held) == args.merge_every:
                t0 = time.perf_counter()
                merged = merge(held, args.merge_cost_us)
                node.merged(len(held), time.perf_counter() - t0)  # flowstat
                held = []
                send(out, node, merged)
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
    deadline = time.thread_time() + cost_us * 1e-6 * len(frames)
    while time.thread_time() < deadline:
        pass
    total = sum(f[HEADER.size] if len(f) > HEADER.size else 0 for f in frames) % 256
    size = len(frames[-1]) - HEADER.size
    return HEADER.pack(HEADER.unpack_from(frames[-1])[0], time.time()) + bytes([total]) * size


def sink(args: argparse.Namespace) -> None:
    node = monitored(args, "sink", "sink", receive_buffer_size=args.hwm)
    ctx = zmq.Context()
    inp = data_socket(ctx, zmq.PULL, args)
    inp.bind(address(args, "sink"))
    taken = 0
    while not node.stop_requested:
        if inp.poll(100):
            frame = inp.recv()
            node.received(1, len(frame), sent_at=HEADER.unpack_from(frame)[1])  # flowstat
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
    common += ["--tcp-buffer-kb", str(args.tcp_buffer_kb)]
    if args.endpoints_dir:
        common += ["--endpoints-dir", args.endpoints_dir]
    expect = args.objects // args.merge_every
    sink_args = ["sink", "--sink-delay-ms", str(args.sink_delay_ms), "--expect", str(expect)]
    stages = [sink_args + (["--keep-running"] if args.keep_running else [])]
    stages += [["merger", "--merge-every", str(args.merge_every), "--merge-cost-us", str(args.merge_cost_us)]]
    stages += [["worker", "--index", str(i)] for i in range(args.workers)]
    children = [subprocess.Popen(me + s + common) for s in stages]
    source_args = ["source", "--objects", str(args.objects), "--rate", str(args.rate), "--size", str(args.size)]
    children.append(subprocess.Popen(me + source_args + ["--workers", str(args.workers)] + common))
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
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--objects", type=int, default=10_000, help="objects the source sends")
    p.add_argument("--rate", type=float, default=0, help="objects/s the source offers (0: as fast as it can)")
    p.add_argument("--size", type=int, default=64, help="payload bytes")
    p.add_argument("--merge-every", type=int, default=10, help="objects per merge")
    p.add_argument("--merge-cost-us", type=float, default=0, help="CPU time a merge costs per object (us)")
    p.add_argument("--sink-delay-ms", type=float, default=0, help="time the sink takes per object (ms)")
    p.add_argument("--expect", type=int, default=1 << 62, help="the sink ends after this many merged objects")
    p.add_argument("--keep-running", action="store_true", help="the sink says it has them all and runs on")
    p.add_argument("--hwm", type=int, default=1000, help="ZeroMQ high-water marks (messages)")
    p.add_argument("--tcp-buffer-kb", type=int, default=0, help="the kernel's socket buffers (0: the system's)")
    p.add_argument("--base-port", type=int, default=5600)
    p.add_argument("--run-id", default="python-pipeline")
    p.add_argument("--endpoints-dir", help="where stages announce themselves (default: $FLOWSTAT_ENDPOINTS_DIR)")
    args = p.parse_args()
    if args.stage == "all":
        return run_all(args)
    {"source": source, "worker": worker, "merger": merger, "sink": sink}[args.stage](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
