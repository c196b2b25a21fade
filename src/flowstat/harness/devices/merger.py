"""Merger process (thesis section 3.1.2).

It holds received objects per name and merges them when it holds as many as it has producers,
whatever cycle they come from. It checks every producer's sequence (gaps, reorderings), times each
merge, and pushes the result to the viewer with the same no-loss rule as the producers.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import struct
import time
from typing import Any

import numpy as np
import zmq

from .. import wire
from ..latency import CHUNK, LatencyRecorder
from ..qcobjects import DTYPE, Kind, merge
from .node import Node

log = logging.getLogger("flowstat.merger")

RECV_CHUNKS = 16  # chunks of latency.CHUNK objects read per turn before looking at the control socket again
MERGE_TIME_WINDOW = 10  # average_merge_time covers the last 10 merges (thesis section 4.2.3)
TTREE = int(Kind.TTree)


class Slot:
    """Objects of one name (one descriptor) waiting to be merged."""

    __slots__ = ("desc", "kind", "ndim", "nbytes", "arrays", "sources", "entries", "n_inputs")

    def __init__(self, desc):
        self.desc = desc
        self.kind, self.ndim, self.nbytes = int(desc.kind), len(desc.shape), desc.nbytes
        self.reset()

    def reset(self) -> None:
        self.arrays: list[np.ndarray] = []
        self.sources: list[int] = []
        self.entries = 0.0
        self.n_inputs = 0


class Merger(Node):
    role = "merger"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.index: int = config["index"]
        self.producers: list[int] = list(config["producers"])
        self.local = {p: i for i, p in enumerate(self.producers)}
        n = len(self.producers)
        self.required = n  # merge when holding as many objects as producers
        self.receive_buffer_size = config["buffer_size"]
        self.send_buffer_size = config["send_buffer"]
        self.data = self.ctx.socket(zmq.PULL)
        self.data.setsockopt(zmq.RCVHWM, self.receive_buffer_size)
        self.data_endpoint = self.bind(self.data, config.get("data_port", 0))
        self.out = self.ctx.socket(zmq.PUSH)
        self.out.setsockopt(zmq.SNDHWM, self.send_buffer_size)
        self.out.connect(config["viewer_endpoint"])
        self.slots: dict[bytes, Slot] = {}
        self.expected = [0] * n  # next sequence number per producer
        self.received = [0] * n
        self.merged_in = [0] * n
        self.eos_count: list[int | None] = [None] * n
        self.eos_seen = 0
        self.gaps = 0  # objects missing from sequences
        self.gap_events = 0
        self.reordered = 0
        self.malformed = 0
        self.unexpected = 0  # objects from producers not assigned here
        self.incompatible = 0  # objects whose binning differs from others of the same name
        self.objects_received = 0
        self.bytes_received = 0
        self.objects_merged = 0
        self.merges = 0
        self.merge_times = collections.deque(maxlen=MERGE_TIME_WINDOW)
        self.merge_time_total_ms = 0.0
        self.entries_merged = 0.0
        self.send_overload_events = 0
        self.send_is_overloaded = False
        self.recv_is_overloaded = False
        self.receive_overload_events = 0
        self.first_receive: float | None = None
        self.last_merge: float | None = None
        self.names_by_key: dict[bytes, bytes] = {}
        self.latency = LatencyRecorder()
        self.sent_stamps: list[float] = []  # t_sent of the objects taken since the clock was last read
        # Objects its producers sent that it has not received, as of the last reading of both
        # (the harness's, every second; see upstream_sent in docs/control-protocol.md).
        self.in_flight: int | None = None

    # -- metrics --------------------------------------------------------------------------------
    def merged_total(self) -> int:
        return self.objects_merged

    def average_merge_time(self) -> float | None:
        if not self.merge_times:
            return 0.0
        return round(sum(self.merge_times) / len(self.merge_times), 6)

    def send_overloaded(self) -> bool:
        return self.send_is_overloaded

    def receive_overloaded(self) -> bool:
        return self.recv_is_overloaded

    def objects_held(self) -> int:
        """Objects received and waiting for their counterparts from the other producers: not the
        input queue (see in_flight)."""
        return sum(len(s.arrays) for s in self.slots.values())

    def on_metrics_request(self, request: dict) -> None:
        sent = request.get("upstream_sent")
        if isinstance(sent, int) and not isinstance(sent, bool) and sent >= 0:
            # Read by the asker just before asking: what arrived in between makes this a lower bound.
            self.in_flight = max(0, sent - self.objects_received)

    def counters(self) -> dict[str, Any]:
        return {
            "producers": len(self.producers),
            "objects_received": self.objects_received,
            "bytes_received": self.bytes_received,
            "objects_merged": self.objects_merged,
            "merges": self.merges,
            "objects_sent": self.merges,
            "objects_held": self.objects_held(),
            "objects_in_flight": self.in_flight,
            "sequence_gaps": self.gaps,
            "gap_events": self.gap_events,
            "reordered_objects": self.reordered,
            "malformed_messages": self.malformed,
            "unexpected_objects": self.unexpected,
            "incompatible_objects": self.incompatible,
            "send_overload_events": self.send_overload_events,
            "receive_overload_events": self.receive_overload_events,
            "eos_received": self.eos_seen,
        }

    # -- receiving ------------------------------------------------------------------------------
    def drain_input(self) -> None:
        """Read what is queued, up to RECV_CHUNKS chunks; reading them all means the merger is behind."""
        recv, on_message, stamps, record = self.data.recv, self.on_message, self.sent_stamps, self.latency.record
        if self.first_receive is None:
            self.first_receive = time.monotonic()
        for _ in range(RECV_CHUNKS):
            for _ in range(CHUNK):
                try:
                    buf = recv(zmq.NOBLOCK)
                except zmq.Again:
                    record(stamps, time.time())
                    stamps.clear()
                    self.recv_is_overloaded = False
                    return
                on_message(buf)
            record(stamps, time.time())
            stamps.clear()
        if not self.recv_is_overloaded:
            self.recv_is_overloaded = True
            self.receive_overload_events += 1

    def on_message(self, buf: bytes) -> None:
        """Take one object. The common case (an inline object of a known name from a known producer)
        is kept short: this runs 100,000 times a second."""
        try:
            magic, kind, ndim, flags, source, seq, entries, t_sent, n_inputs, name_len, _ = wire.FIXED.unpack_from(buf)
        except struct.error:
            self.bad_message(f"message of {len(buf)} bytes is shorter than a header")
            return
        local = self.local.get(source)
        if magic != wire.MAGIC or local is None or flags & (wire.FLAG_EOS | wire.FLAG_PAYLOAD_FRAME):
            self.on_unusual_message(buf)
            return
        offset = (wire.FIXED.size + ndim * (4 if kind == TTREE else 20) + name_len + 7) & ~7
        slot = self.slots.get(buf[wire.FIXED.size:offset])
        if slot is None or slot.kind != kind or slot.ndim != ndim or len(buf) - offset != slot.nbytes:
            self.on_unusual_message(buf)
            return
        self.take(slot, local, seq, entries, n_inputs, np.frombuffer(buf, DTYPE, offset=offset), len(buf), t_sent)

    def take(self, slot: Slot, local: int, seq: int, entries: float, n_inputs: int, data: np.ndarray,
             nbytes: int, t_sent: float) -> None:
        if t_sent:
            self.sent_stamps.append(t_sent)
        if self.expected[local] == seq:
            self.expected[local] = seq + 1
        else:
            self.check_sequence(local, seq)
        self.received[local] += 1
        self.objects_received += 1
        self.bytes_received += nbytes
        arrays = slot.arrays
        arrays.append(data)
        slot.sources.append(local)
        slot.entries += entries
        slot.n_inputs += n_inputs
        if len(arrays) >= self.required:
            self.merge_slot(slot)

    def on_unusual_message(self, buf: bytes) -> None:
        """End-of-stream markers, separate payload frames, new names, and anything malformed."""
        frames = [buf]
        if self.data.getsockopt(zmq.RCVMORE):
            frames.extend(f.buffer for f in self.data.recv_multipart(copy=False))
        try:
            h = wire.decode_header(buf)
        except wire.WireError as exc:
            self.bad_message(f"bad header: {exc}")
            return
        local = self.local.get(h.source)
        if local is None:
            self.unexpected += 1
            if self.unexpected == 1:
                log.error("%s: object from producer %d, which is not assigned here", self.node_id, h.source)
            return
        if h.flags & wire.FLAG_EOS:
            self.on_eos(local, h.seq)
            return
        try:
            slot = self.slots.get(h.desc_key[2:]) or self.new_slot(h.desc_key)
            if slot is None:
                return
            data = wire.payload_array(slot.desc, h, frames).reshape(-1)
        except (wire.WireError, ValueError) as exc:
            self.bad_message(str(exc))
            return
        self.take(slot, local, h.seq, h.entries, h.n_inputs, data, sum(len(f) for f in frames), h.t_sent)

    def new_slot(self, key: bytes) -> Slot | None:
        desc = wire.parse_descriptor(key)
        name = desc.name.encode()
        other = self.names_by_key.get(name)
        if other is not None and other != key:
            self.incompatible += 1
            log.error("%s: object %r arrives with another binning; it cannot be merged", self.node_id, desc.name)
            return None
        self.names_by_key[name] = key
        slot = self.slots[key[2:]] = Slot(desc)
        return slot

    def bad_message(self, why: str) -> None:
        self.malformed += 1
        if self.malformed <= 10 or self.malformed % 1000 == 0:
            log.error("%s: dropped malformed message #%d on %s: %s", self.node_id, self.malformed,
                      self.data_endpoint, why)

    def check_sequence(self, local: int, seq: int) -> None:
        expected = self.expected[local]
        if seq == expected:
            self.expected[local] = seq + 1
        elif seq > expected:
            self.gaps += seq - expected
            self.gap_events += 1
            self.expected[local] = seq + 1
            log.error("%s: producer %d skipped from seq %d to %d", self.node_id, self.producers[local], expected, seq)
        else:
            self.reordered += 1
            log.error("%s: producer %d sent seq %d after %d", self.node_id, self.producers[local], seq, expected - 1)

    def on_eos(self, local: int, count: int) -> None:
        if self.eos_count[local] is None:
            self.eos_seen += 1
        self.eos_count[local] = count
        if count != self.expected[local]:
            missing = count - self.expected[local]
            self.gaps += max(0, missing)
            log.error("%s: producer %d ended at %d objects, %d received", self.node_id,
                      self.producers[local], count, self.received[local])

    # -- merging and sending --------------------------------------------------------------------
    def merge_slot(self, slot: Slot) -> None:
        desc = slot.desc
        is_tree = desc.kind is Kind.TTree
        arrays = [a.reshape(desc.shape) for a in slot.arrays] if is_tree else slot.arrays
        t0 = time.perf_counter_ns()
        result = merge(desc, arrays)
        elapsed_ms = (time.perf_counter_ns() - t0) / 1e6
        # Histograms keep their shape; a merged tree holds the entries of all its inputs.
        out_desc = dataclasses.replace(desc, shape=result.shape) if is_tree else desc
        self.merge_times.append(elapsed_ms)
        self.merge_time_total_ms += elapsed_ms
        merged_in = self.merged_in
        for s in slot.sources:
            merged_in[s] += 1
        self.objects_merged += len(slot.arrays)
        self.entries_merged += slot.entries
        frames = wire.encode(out_desc, result.reshape(out_desc.shape), source=self.index, seq=self.merges, entries=slot.entries,
                             n_inputs=slot.n_inputs, flags=wire.FLAG_MERGED, t_sent=time.time())
        self.merges += 1
        self.last_merge = time.monotonic()
        slot.reset()
        self.send_downstream(frames)

    def send_downstream(self, frames: list) -> None:
        """Send without blocking; when the buffer is full, record it and retry until it goes, or
        until downstream is abandoned (SIGUSR1, or the orchestrator is gone)."""
        while True:
            try:
                self.out.send_multipart(frames, zmq.NOBLOCK, copy=len(frames) == 1)
                self.send_is_overloaded = False
                return
            except zmq.Again:
                if not self.send_is_overloaded:
                    self.send_is_overloaded = True
                    self.send_overload_events += 1
            if self.downstream_abandoned():
                log.error("%s: downstream is gone: a merged object or end-of-stream marker was not sent", self.node_id)
                return
            poller = zmq.Poller()
            poller.register(self.out, zmq.POLLOUT)
            poller.register(self.control, zmq.POLLIN)
            poller.poll(1000)
            self.serve_control()

    def flush(self) -> None:
        """Merge what is held, complete or not: at the end of a run nothing stays behind."""
        for slot in list(self.slots.values()):
            if slot.arrays:
                self.merge_slot(slot)

    # -- main loop ------------------------------------------------------------------------------
    def all_ended(self) -> bool:
        return self.eos_seen == len(self.producers)

    def run(self) -> int:
        self.receive_until(self.data, self.drain_input, self.all_ended)
        if self.stop_requested:  # asked to stop early: keep what already arrived
            self.recv_is_overloaded = False
            self.drain_input()
        self.state = "DRAINING"
        self.flush()
        eos = wire.encode_eos(self.index, self.merges)
        self.send_downstream([eos])
        self.state = "STOPPED"
        active = (self.last_merge or 0) - (self.first_receive or 0)
        self.emit("final", role=self.role, **self.counters(), average_merge_time=self.average_merge_time(),
                  merge_time_total_ms=round(self.merge_time_total_ms, 3),
                  mean_merge_time=round(self.merge_time_total_ms / self.merges, 6) if self.merges else 0.0,
                  active_seconds=round(active, 6), input_latency=self.latency.total(),
                  merged_objects_per_second=round(self.objects_merged / active, 3) if active > 0 else 0.0,
                  entries_merged=self.entries_merged,
                  per_producer={"producer": self.producers, "received": self.received,
                                "merged_in": self.merged_in, "declared_sent": self.eos_count})
        self.out.close(self.linger_ms())
        self.data.close(0)
        self.close()
        return 0
