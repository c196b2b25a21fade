"""Merger process (thesis section 3.1.2).

It holds received objects per name and merges them when it holds as many as it has producers,
whatever cycle they come from. It checks every producer's sequence (gaps, reorderings), times each
merge, and pushes the result downstream with the same no-loss rule as the producers.

Mergers come in layers (the topology's merger_layers): the first layer's producers are the
producers; a merger of a layer above merges the merged objects of mergers of the layer below, whose
indices (in their layer) are its "producers", with the same sequence and end-of-stream rules.
Downstream is a merger of the next layer, or the viewer for the last layer.

It reads its input in batches of up to latency.CHUNK messages. The common messages of a batch are
parsed at once (merging.batches) and taken a run at a time; any other message is taken on its own,
in its place: what comes before it is taken first, what comes after it next, so every producer's
objects are taken in the order they arrived. Each name's objects are merged as they arrive
(merging.slots); each producer's sequence is checked (merging.sequences).
"""

from __future__ import annotations

import collections
import logging
import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq

from flowstat.node.latency import CHUNK, LatencyRecorder
from flowstat.node.phases import BACKPRESSURED, BUSY

from .. import wire
from ..mergecost import node_cost
from ..merging.batches import MAX_SEQ, Batch, BatchReader, Multipart
from ..merging.sequences import Sequences
from ..merging.slots import TTREE, Merged, Slot
from ..qcobjects import DTYPE
from .device import Device

log = logging.getLogger("flowstat.merger")

RECV_CHUNKS = 16  # batches of at most latency.CHUNK messages read per turn ...
TURN_S = 0.01  # ... and for at most this long: then the control socket gets its turn
MIN_BATCH = 32  # fewer messages are cheaper to take one by one than to parse at once
MERGE_TIME_WINDOW = 10  # average_merge_time covers the last 10 merges (thesis section 4.2.3)
__all__ = ["MAX_SEQ", "MIN_BATCH", "Merger", "Multipart"]


class Merger(Device):
    role = "merger"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.index: int = config["index"]  # in its layer: the source id of what it sends
        self.layer: int = config.get("layer", 1)
        self.producers: list[int] = list(config["producers"])  # upper layers: the indices of its input mergers
        self.source_word = "producer" if self.layer == 1 else "merger"  # what its inputs are, for its log
        self.local = {p: i for i, p in enumerate(self.producers)}
        n = len(self.producers)
        self.required = n  # merge when holding as many objects as producers
        self.merge_cost = node_cost(config.get("merge_cost"))  # this merger's (Topology.cost_of)
        self.receive_buffer_size: int = config["buffer_size"]
        self.send_buffer_size: int = config["send_buffer"]
        self.data = self.ctx.socket(zmq.PULL)
        self.data.setsockopt(zmq.RCVHWM, self.receive_buffer_size)
        if config.get("kernel_buffer_size"):  # before bind: ZeroMQ applies it to each connection it accepts
            self.data.setsockopt(zmq.RCVBUF, config["kernel_buffer_size"])
        self.secure_data(self.data, bound=True)
        self.data_endpoint = self.bind(self.data, config.get("data_port", 0))
        self.out = self.ctx.socket(zmq.PUSH)
        self.out.setsockopt(zmq.SNDHWM, self.send_buffer_size)
        self.secure_data(self.out, bound=False)
        self.out.connect(config["downstream_endpoint"])  # the next layer's merger, or the viewer
        self.slots: dict[bytes, Slot] = {}
        self.seq = Sequences(self.node_id, self.producers, self.source_word)
        self.reader = BatchReader(self.producers, self.slots)
        self.malformed = 0
        self.unexpected = 0  # objects from producers not assigned here
        self.incompatible = 0  # objects whose binning differs from others of the same name
        self.objects_received = 0
        self.bytes_received = 0
        self.objects_merged = 0
        self.merges = 0
        self.merge_times: collections.deque[float] = collections.deque(maxlen=MERGE_TIME_WINDOW)
        self.merge_time_total_ms = 0.0
        self.entries_merged = 0.0
        self.send_overload_events = 0
        self.send_is_overloaded = False
        self.recv_is_overloaded = False
        self.receive_overload_events = 0
        self.first_receive: float | None = None
        self.last_merge: float | None = None
        self.names_by_key: dict[bytes, bytes] = {}
        self.latency: LatencyRecorder = LatencyRecorder()
        self.sent_stamps: list[float] = []  # t_sent of the objects taken since the clock was last read ...
        self.sent_arrays: list[np.ndarray] = []  # ... one by one, and a run at a time
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

    def overload_events(self) -> tuple[int, int]:
        return self.send_overload_events, self.receive_overload_events

    def objects_held(self) -> int:
        """Objects received and waiting for their counterparts from the other producers: not the
        input queue (see in_flight)."""
        return sum(s.held for s in self.slots.values())

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
            "sequence_gaps": self.seq.gaps,
            "gap_events": self.seq.gap_events,
            "reordered_objects": self.seq.reordered,
            "malformed_messages": self.malformed,
            "unexpected_objects": self.unexpected,
            "incompatible_objects": self.incompatible,
            "send_overload_events": self.send_overload_events,
            "receive_overload_events": self.receive_overload_events,
            "eos_received": self.seq.eos_seen,
        }

    # -- receiving ------------------------------------------------------------------------------
    def drain_input(self) -> None:
        """Read what is queued, a batch at a time, for at most RECV_CHUNKS batches and TURN_S: then
        the control socket gets its turn. A turn that did not empty the queue means the merger is behind."""
        now = time.monotonic()
        if self.first_receive is None:
            self.first_receive = now
            if self.merge_cost is not None:
                self.merge_cost.begin(now)  # a cost that starts later counts from here
        deadline = now + TURN_S
        for _ in range(RECV_CHUNKS):
            batch, unusual, emptied = self.receive_batch()
            self.on_batch(batch, unusual)
            if emptied:
                self.recv_is_overloaded = False
                return
            if time.monotonic() > deadline:
                break
        if not self.recv_is_overloaded:
            self.recv_is_overloaded = True
            self.receive_overload_events += 1

    def batch_size(self) -> int:
        """How many messages to read at once: CHUNK, or, when merges are made dearer (merge_cost), as
        many as cost at most TURN_S of added CPU time (at least one), so that the control socket
        still gets its turn several times a second however dear a merge is."""
        cost, n = self.merge_cost, self.objects_received
        return CHUNK if cost is None else cost.objects_per_turn(CHUNK, TURN_S, self.bytes_received // n if n else None)

    def receive_batch(self) -> tuple[list[bytes | Multipart], list[int], bool]:
        """Up to batch_size() messages, the positions of those not of the common length (or saying a
        payload frame follows), and whether the queue is empty. Those are read whole (Multipart) here, while
        the socket can still tell where a message ends: asking it costs more than a message."""
        batch: list[bytes | Multipart] = []
        unusual: list[int] = []
        recv, length = self.data.recv, self.reader.common_length
        append, flag = batch.append, wire.FLAG_PAYLOAD_FRAME
        for _ in range(self.batch_size()):
            try:
                buf = recv(zmq.NOBLOCK)
            except zmq.Again:
                return batch, unusual, True
            if len(buf) != length or buf[6] & flag:
                unusual.append(len(batch))
                if self.data.getsockopt(zmq.RCVMORE):
                    append(Multipart([buf, *(f.buffer for f in self.data.recv_multipart(copy=False))]))
                    continue
            append(buf)
        return batch, unusual, False

    def on_batch(self, msgs: list, unusual: list[int] | None = None) -> None:
        """Take a batch of at most CHUNK messages, in arrival order, then read the clock for their
        input latency. ``unusual``: the positions of the messages not of the common length (None:
        look). The common ones are taken a run at a time, the others on their own, in between."""
        done = self.take_in_order(msgs, unusual)
        while done < len(msgs):  # a message brought a new name: the rest is parsed again, knowing it
            done += self.take_in_order(msgs[done:], None)
        self.record_latency()

    def take_in_order(self, msgs: list, unusual: list[int] | None) -> int:
        """Take messages in order; stop after one that brings a new name. Returns how many were taken."""
        b = self.reader.parse(msgs, unusual) if len(msgs) >= MIN_BATCH else None
        start = 0
        for i in b.alone if b is not None else range(len(msgs)):
            if b is not None and i > start:  # without a batch (b None) every message is taken alone
                self.take_run(b, start, i)
            names = len(self.slots)
            msg = msgs[i]
            if type(msg) is Multipart:
                self.on_message(msg.frames[0], msg.frames[1:])
            else:
                self.on_message(msg)
            start = i + 1
            if len(self.slots) > names:
                return start
        if b is not None and start < len(msgs):
            self.take_run(b, start, len(msgs))
        return len(msgs)

    def record_latency(self) -> None:
        stamps = self.sent_arrays
        if self.sent_stamps:
            stamps.append(np.array(self.sent_stamps))
            self.sent_stamps.clear()
        if stamps:
            self.latency.record(stamps[0] if len(stamps) == 1 else np.concatenate(stamps), self.wall.now())
            stamps.clear()

    # -- a batch at once --------------------------------------------------------------------------
    def take_run(self, b: Batch, first: int, end: int) -> None:
        """Take the messages first .. end - 1 of a batch, all common ones (rows r0 .. r1 - 1)."""
        r0 = first if b.row_of is None else int(b.row_of[first])
        r1 = r0 + end - first
        records, local = b.records[r0:r1], b.local[r0:r1]
        counts = np.bincount(local, minlength=len(self.producers))
        self.seq.check_sequences(local, records["seq"], counts)
        self.seq.received += counts
        self.objects_received += r1 - r0
        self.bytes_received += (r1 - r0) * b.length
        sent = records["t_sent"]
        self.sent_arrays.append(sent[sent != 0])
        ids = b.slot_ids[r0:r1]
        payloads = b.payloads()
        if ids[0] == ids[-1] and (ids == ids[0]).all():
            done = self.take_rows(b.slots[ids[0]], payloads, records, local, slice(r0, r1), r0)
        else:
            done = []
            for i in np.unique(ids).tolist():
                rows = np.flatnonzero(ids == i)
                done += self.take_rows(b.slots[i], payloads, records[rows], local[rows], rows + r0, r0)
            done.sort(key=lambda d: d[0])  # sent in the order the merges were completed
        for _, merged in done:
            self.send_merged(merged)

    def take_rows(
        self,
        slot: Slot,
        payloads: np.ndarray,
        records: np.ndarray,
        local: np.ndarray,
        rows: slice | np.ndarray,
        r0: int,
    ) -> list[tuple[int, Merged]]:
        """``rows`` (of the batch) into ``slot``; the merges it completes, by the row that completed each."""
        cells = slot.nbytes // DTYPE.itemsize
        first = slot.payload_offset // DTYPE.itemsize
        data = payloads[rows, first : first + cells]
        done = slot.add_rows(data, records["entries"], records["n_inputs"], local, self.required, self.seq.merged_in)
        positions = rows if isinstance(rows, np.ndarray) else None
        return [(int(positions[i]) if positions is not None else r0 + i, m) for i, m in done]

    # -- one message at a time --------------------------------------------------------------------
    def on_message(self, buf: bytes, more: Sequence[bytes | memoryview] = ()) -> None:
        """Take one object (``more``: its frames after the first). The common case (an inline object
        of a known name from a known producer) is kept short."""
        try:
            magic, kind, ndim, flags, source, seq, entries, t_sent, n_inputs, name_len, _ = wire.FIXED.unpack_from(buf)
        except struct.error:
            self.bad_message(f"message of {len(buf)} bytes is shorter than a header")
            return
        local = self.local.get(source)
        if magic != wire.MAGIC or local is None or flags & ~wire.FLAG_MERGED or seq >= MAX_SEQ or more:
            self.on_unusual_message(buf, more)
            return
        offset = (wire.FIXED.size + ndim * (4 if kind == TTREE else 20) + name_len + 7) & ~7
        slot = self.slots.get(buf[wire.FIXED.size : offset])
        if slot is None or slot.kind != kind or slot.ndim != ndim or len(buf) - offset != slot.nbytes:
            self.on_unusual_message(buf, more)
            return
        self.take(slot, local, seq, entries, n_inputs, np.frombuffer(buf, DTYPE, offset=offset), len(buf), t_sent)

    def take(
        self,
        slot: Slot,
        local: int,
        seq: int,
        entries: float,
        n_inputs: int,
        data: np.ndarray,
        nbytes: int,
        t_sent: float,
    ) -> None:
        if t_sent:
            self.sent_stamps.append(t_sent)
        expected = self.seq.expected
        if expected[local] == seq:
            expected[local] = seq + 1
        else:
            self.seq.check_sequence(local, seq)
        self.seq.received[local] += 1
        self.objects_received += 1
        self.bytes_received += nbytes
        slot.add(data, entries, n_inputs, local)
        if slot.held >= self.required:
            self.merge_slot(slot)

    def on_unusual_message(self, buf: bytes, more: Sequence[bytes | memoryview] = ()) -> None:
        """End-of-stream markers, separate payload frames, new names, and anything malformed."""
        frames = [buf, *more]
        try:
            h = wire.decode_header(buf)
        except wire.WireError as exc:
            self.bad_message(f"bad header: {exc}")
            return
        local = self.local.get(h.source)
        if local is None:
            self.unexpected += 1
            if self.unexpected == 1:
                log.error("%s: object from %s %d, which is not assigned here", self.node_id, self.source_word, h.source)
            return
        if h.flags & wire.FLAG_EOS:
            self.seq.on_eos(local, h.seq)
            return
        if h.seq >= MAX_SEQ:
            self.bad_message(f"sequence number {h.seq} out of range")
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
        slot = self.slots[key[2:]] = Slot(desc, len(self.producers), self.merge_cost)
        return slot

    def bad_message(self, why: str) -> None:
        self.malformed += 1
        if self.malformed <= 10 or self.malformed % 1000 == 0:
            log.error(
                "%s: dropped malformed message #%d on %s: %s", self.node_id, self.malformed, self.data_endpoint, why
            )

    # -- merging and sending --------------------------------------------------------------------
    def merge_slot(self, slot: Slot) -> None:
        self.send_merged(slot.complete(self.seq.merged_in))

    def send_merged(self, m: Merged) -> None:
        self.merge_times.append(m.merge_ms)
        self.merge_time_total_ms += m.merge_ms
        self.objects_merged += m.objects
        self.entries_merged += m.entries
        frames = m.slot.encode(m, source=self.index, seq=self.merges, now=self.wall.now)
        self.merges += 1
        self.last_merge = time.monotonic()
        self.send_downstream(frames)

    def send_downstream(self, frames: list) -> None:
        """Send without blocking; when the buffer is full, record it and retry until it goes, or
        until downstream is abandoned (SIGUSR1, or the orchestrator is gone)."""
        while True:
            try:
                if len(frames) == 1:
                    self.out.send(frames[0], zmq.NOBLOCK)
                else:
                    self.out.send_multipart(frames, zmq.NOBLOCK, copy=False)
                self.send_is_overloaded = False
                self.enter(BUSY)
                return
            except zmq.Again:
                self.enter(BACKPRESSURED)  # held by the downstream until the send goes
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
            if slot.held:
                self.merge_slot(slot)

    # -- main loop ------------------------------------------------------------------------------
    def all_ended(self) -> bool:
        return self.seq.all_ended()

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
        self.emit(
            "final",
            role=self.role,
            layer=self.layer,
            **self.counters(),
            average_merge_time=self.average_merge_time(),
            merge_time_total_ms=round(self.merge_time_total_ms, 3),
            mean_merge_time=round(self.merge_time_total_ms / self.merges, 6) if self.merges else 0.0,
            active_seconds=round(active, 6),
            input_latency=self.latency.total(),
            merged_objects_per_second=round(self.objects_merged / active, 3) if active > 0 else 0.0,
            entries_merged=self.entries_merged,
            per_producer={
                "producer": self.producers,
                "received": self.seq.received.tolist(),
                "merged_in": self.seq.merged_in.tolist(),
                "declared_sent": self.seq.eos_count,
            },
        )
        self.out.close(self.linger_ms())
        self.data.close(0)
        self.close()
        return 0
