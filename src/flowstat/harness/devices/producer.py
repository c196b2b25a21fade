"""Producer process: hosts many logical producers, each with its own PUSH socket, id and sequence.

Sends are non-blocking. When a socket's buffer (its high-water mark, the topology's buffer_size) is
full, the producer records an overload event, sets send_buffer_overloaded and retries that object
until it goes, before sending anything newer from that producer (the thesis's no-loss rule).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import zmq

from flowstat.node.phases import BACKPRESSURED, BUSY, IDLE

from .. import wire
from ..pool import PooledObject, build_pool
from ..qcobjects import Kind, make_desc
from .device import Device

log = logging.getLogger("flowstat.producer")

UNLIMITED_BATCH = 64  # objects per logical producer per loop turn when the rate is unlimited


class Channel:
    """One logical producer: its socket, sequence and overload state."""

    __slots__ = ("producer_id", "sock", "seq", "pending", "overloaded", "overload_events", "phase", "merger")

    def __init__(self, producer_id: int, sock: zmq.Socket, phase: float, merger: str):
        self.producer_id = producer_id
        self.merger = merger  # the node id of the merger it feeds
        self.sock = sock
        self.seq = 0
        self.pending: list | None = None  # frames of an object the buffer refused
        self.overloaded = False
        self.overload_events = 0
        self.phase = phase


class Producer(Device):
    role = "producer"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        obj = config["object"]
        kind = Kind[obj["type"]]
        self.descs = [make_desc(f"{kind.name}_{i}", kind, tuple(obj["shape"])) for i in range(obj["names"])]
        self.pool = build_pool(self.descs, obj["entries"], seed=config.get("seed", 0))
        self.rate: float = config["rate"]
        self.send_buffer_size: int = config["buffer_size"]
        self.channels: list[Channel] = []
        ids, endpoints = config["producers"], config["endpoints"]
        mergers = config.get("mergers") or ["merger"] * len(ids)
        for i, (pid, endpoint, merger) in enumerate(zip(ids, endpoints, mergers, strict=False)):
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, self.send_buffer_size)
            if config.get("kernel_buffer_size"):  # before connect: ZeroMQ applies it to the TCP socket it opens
                sock.setsockopt(zmq.SNDBUF, config["kernel_buffer_size"])
            self.secure_data(sock, bound=False)
            sock.connect(endpoint)
            # Stagger the producers over one period so that they do not all send at once.
            self.channels.append(Channel(pid, sock, (i / len(ids)) / self.rate if self.rate else 0.0, merger))
        self.t0 = 0.0
        self.undelivered = 0
        self.message_bytes = self.pool[0][0].nbytes
        self.inline = self.pool[0][0].payload is None
        self.entries_per_object = self.pool[0][0].entries

    # -- metrics --------------------------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        sent = sum(c.seq for c in self.channels)
        return {
            "producers": len(self.channels),
            "objects_sent": sent,
            "bytes_sent": sent * self.message_bytes,
            "send_overload_events": self.overload_events()[0],
            "pending_objects": sum(1 for c in self.channels if c.pending is not None),
            "undelivered_objects": self.undelivered,
            "to_mergers": self.to_mergers(),
        }

    def to_mergers(self) -> dict[str, dict[str, int]]:
        """Objects sent to each merger and the overload events on the way: with the merger's own
        count, what is in flight to it, and whether it holds its producers back (harness.online)."""
        out: dict[str, dict[str, int]] = {}
        for c in self.channels:
            m = out.setdefault(c.merger, {"sent": 0, "overload_events": 0})
            m["sent"] += c.seq
            m["overload_events"] += c.overload_events
        return out

    def send_overloaded(self) -> bool:
        return any(c.overloaded for c in self.channels)

    def overload_events(self) -> tuple[int, int]:
        return sum(c.overload_events for c in self.channels), 0

    def on_start(self) -> None:
        if self.state == "READY":
            self.t0 = time.monotonic()
            self.state = "RUNNING"

    # -- sending --------------------------------------------------------------------------------
    def object_frames(self, ch: Channel) -> list:
        names = len(self.pool)
        variants = self.pool[ch.seq % names]
        obj: PooledObject = variants[(ch.seq // names + ch.producer_id) % len(variants)]
        wire.STAMP.pack_into(obj.header, wire.OFF_SOURCE, ch.producer_id, ch.seq, obj.entries, self.wall.now())
        if obj.payload is None:
            return [obj.header]
        return [bytes(obj.header), obj.payload]

    @staticmethod
    def try_send(ch: Channel, frames: list) -> bool:
        try:
            if len(frames) == 1:
                ch.sock.send(frames[0], zmq.NOBLOCK, copy=True)
            else:
                ch.sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def refused(self, ch: Channel, frames: list) -> None:
        # The pooled header is reused for the next send: keep a private copy of the refused one.
        ch.pending = [bytes(frames[0])] + frames[1:]
        if not ch.overloaded:
            ch.overloaded = True
            ch.overload_events += 1

    def retry_pending(self, ch: Channel) -> bool:
        """Try the refused object again; True when the channel is free."""
        if ch.pending is None:
            return True
        if not self.try_send(ch, ch.pending):
            return False
        ch.pending = None
        ch.overloaded = False
        return True

    def send_due(self, now: float) -> float:
        """Send every object due by ``now``; return when the next one is due (monotonic s)."""
        next_due = now + 0.1
        rate, t0 = self.rate, self.t0
        for ch in self.channels:
            if ch.pending is not None and not self.retry_pending(ch):
                continue
            owed = int((now - t0 - ch.phase) * rate) + 1 if rate else ch.seq + UNLIMITED_BATCH
            if ch.seq < owed:
                self.send_owed(ch, owed)
            if rate and ch.pending is None:
                next_due = min(next_due, t0 + ch.phase + ch.seq / rate)
        return next_due if rate else now

    def send_owed(self, ch: Channel, owed: int) -> None:
        """Send ``ch``'s objects up to sequence ``owed``, stopping at the first refusal."""
        if self.inline:
            # The common case, kept lean: patch the pooled message and let ZeroMQ copy it. The
            # stamp is when the object is first offered: a refused one keeps it (see refused).
            variants, pack_into, send, pid = self.pool[0], wire.STAMP.pack_into, ch.sock.send, ch.producer_id
            nvar, names, clock = len(variants), len(self.pool), self.wall.now
            if names == 1:
                while ch.seq < owed:
                    obj = variants[(ch.seq + pid) % nvar]
                    header = obj.header
                    pack_into(header, wire.OFF_SOURCE, pid, ch.seq, obj.entries, clock())
                    try:
                        send(header, zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        self.refused(ch, [header])
                        ch.seq += 1
                        return
                    ch.seq += 1
                return
        while ch.seq < owed:
            frames = self.object_frames(ch)
            ch.seq += 1
            if not self.try_send(ch, frames):
                self.refused(ch, frames)
                return

    def wait(self, until: float) -> None:
        """Sleep until ``until`` or a control request or a refused object can go, whichever first."""
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        for ch in self.channels:
            if ch.pending is not None:
                poller.register(ch.sock, zmq.POLLOUT)
        # Rounded up to poll()'s whole ms: cut down, a wait shorter than 1 ms would be no wait, and at
        # a few hundred objects/s the producer would spin until each is due. An object may go up to
        # 1 ms late; its stamp is when it goes, and send_due catches up whatever fell due meanwhile.
        timeout_ms = max(0.0, (until - time.monotonic()) * 1000)
        # held by a merger while an object waits to go; else waiting for the next one's due time
        self.enter(BACKPRESSURED if any(ch.pending is not None for ch in self.channels) else IDLE)
        poller.poll(math.ceil(timeout_ms))
        self.enter(BUSY)

    def drain(self) -> None:
        """Send what the buffers refused, then an end-of-stream marker on every channel.

        SIGUSR1 abandons what is still refused (its merger is gone), and so does an orchestrator
        that died (see Node.downstream_abandoned): those objects are reported as undelivered rather
        than waited for.
        """
        self.state = "DRAINING"
        eos_queued = [False] * len(self.channels)
        while not self.downstream_abandoned():
            waiting = False
            for i, ch in enumerate(self.channels):
                if not self.retry_pending(ch):
                    waiting = True
                    continue
                if not eos_queued[i]:
                    eos_queued[i] = True
                    eos = [wire.encode_eos(ch.producer_id, ch.seq)]
                    if not self.try_send(ch, eos):
                        ch.pending = eos
                        waiting = True
            if not waiting:
                return
            self.serve_control()
            self.wait(time.monotonic() + 0.1)
        self.undelivered = sum(1 for ch in self.channels if ch.pending is not None)
        log.error("%s: stopped while %d objects were still refused by their mergers", self.node_id, self.undelivered)

    def run(self) -> int:
        self.state = "READY"
        self.emit("ready", control=self.control_endpoint, pid_count=len(self.channels))
        autostart = self.config.get("autostart", False)
        if autostart:
            self.on_start()
        while not self.stop_requested:
            self.serve_control()
            if self.state == "RUNNING":
                until = self.send_due(time.monotonic())
            else:
                until = time.monotonic() + 0.1
            self.wait(until)
        self.drain()
        self.state = "STOPPED"
        self.emit(
            "final",
            role=self.role,
            entries_per_object=self.entries_per_object,
            message_bytes=self.message_bytes,
            **self.counters(),
            per_producer=[
                {"producer": c.producer_id, "sent": c.seq, "overload_events": c.overload_events} for c in self.channels
            ],
        )
        for ch in self.channels:
            # Queued objects still go (context linger), unless their merger is gone (see linger_ms).
            ch.sock.close(self.linger_ms())
        self.close()
        return 0
