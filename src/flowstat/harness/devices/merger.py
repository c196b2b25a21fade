"""Merger process (thesis section 3.1.2).

It holds received objects per name and merges them when it holds as many as it has producers,
whatever cycle they come from. It checks every producer's sequence (gaps, reorderings), times each
merge, and pushes the result downstream with the same no-loss rule as the producers.

Mergers come in layers (the topology's merger_layers): the first layer's producers are the
producers; a merger of a layer above merges the merged objects of mergers of the layer below, whose
indices (in their layer) are its "producers", with the same sequence and end-of-stream rules.
Downstream is a merger of the next layer, or the viewer for the last layer.

It reads its input in batches of up to latency.CHUNK messages. The common messages of a batch
(inline objects of known names from known producers, all of one length) are taken a run at a time
with numpy: joined, they are one array of header records and one of payloads, so their headers and
sequences are checked, and their histograms summed, in a few calls whatever their number. Any
other message (end-of-stream, separate payload frame, new name, unknown producer, malformed) is
taken on its own, in its place: what comes before it is taken first, what comes after it next,
so every producer's objects are taken in the order they arrived.

A histogram name's objects are summed as they arrive: a merger holds one running sum per name, not
one array per object. Cells are integer counts in float32, so the sum is exact (below 2**24 per
cell) in whatever order it is taken.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import struct
import time
from typing import Any, NamedTuple

import numpy as np
import zmq

from .. import wire
from ..latency import CHUNK, LatencyRecorder
from ..mergecost import MergeCost
from ..qcobjects import DTYPE, Kind, merge
from .node import Node

log = logging.getLogger("flowstat.merger")

RECV_CHUNKS = 16  # batches of at most latency.CHUNK messages read per turn ...
TURN_S = 0.01  # ... and for at most this long: then the control socket gets its turn
MIN_BATCH = 32  # fewer messages are cheaper to take one by one than to parse at once
MERGE_TIME_WINDOW = 10  # average_merge_time covers the last 10 merges (thesis section 4.2.3)
TTREE = int(Kind.TTree)
# Sequence numbers at or above this are malformed: the per-producer counters are int64 (a producer
# sending 10**9 objects/s would get there in 146 years).
MAX_SEQ = 2**62


class Merged(NamedTuple):
    """One merged object, ready to send."""

    slot: "Slot"
    data: np.ndarray
    entries: float
    n_inputs: int
    objects: int
    merge_ms: float


class Slot:
    """Objects of one name (one descriptor) received and not merged yet.

    A histogram slot keeps the running sum of its objects, a tree slot the objects themselves
    (merged by concatenation). ``held_from`` counts what it holds per producer (merged_in).
    """

    __slots__ = ("desc", "kind", "ndim", "nbytes", "is_tree", "descriptor", "payload_offset", "message_length",
                 "static_columns", "static_words", "merged_header", "total", "arrays", "held", "held_from", "entries",
                 "n_inputs", "merge_ns", "cost")

    def __init__(self, desc, producers: int, cost: MergeCost | None = None):
        self.desc = desc
        self.cost = cost  # CPU time added to every merge step (the topology's merge_cost)
        self.kind, self.ndim, self.nbytes = int(desc.kind), len(desc.shape), desc.nbytes
        self.is_tree = desc.kind is Kind.TTree
        self.descriptor = wire.descriptor_bytes(desc)  # packed once: every merged object carries it
        self.payload_offset = wire.FIXED.size + len(self.descriptor)  # of an inline object
        self.message_length = self.payload_offset + self.nbytes
        # What every inline object of this name from a producer has in common, as 32-bit words of
        # its header: magic, kind, rank, flags (none), name length, descriptor (see Merger.match_usual).
        header = wire.encode_header(desc, source=0, seq=0, entries=0.0, inline=True, descriptor=self.descriptor)
        self.static_columns = np.r_[0:2, 10:self.payload_offset // 4]
        self.static_words = np.frombuffer(header, "<u4")[self.static_columns]
        # The header of its merged histograms when inline, re-stamped for each (see encode).
        self.merged_header = bytearray(wire.encode_header(desc, source=0, seq=0, entries=0.0, flags=wire.FLAG_MERGED,
                                                          inline=True, descriptor=self.descriptor))
        self.held_from = np.zeros(producers, np.int64)
        self.reset()

    def reset(self) -> None:
        self.total: np.ndarray | None = None  # histograms: the sum of the objects held
        self.arrays: list[np.ndarray] = []  # trees: the objects held
        self.held = 0
        self.held_from[:] = 0
        self.entries = 0.0
        self.n_inputs = 0
        self.merge_ns = 0  # time spent summing what is held: its merge time

    def add(self, data: np.ndarray, entries: float, n_inputs: int, local: int) -> None:
        """Hold one object (``data``: its flat payload, maybe a read-only network buffer)."""
        t0 = time.perf_counter_ns()
        if self.is_tree:
            self.arrays.append(data)
        elif self.total is None:
            self.total = np.array(data, dtype=DTYPE)  # a copy: data is the network's
        else:
            np.add(self.total, data, out=self.total)
        if self.cost is not None:
            self.cost.spend(1, data.nbytes, time.perf_counter_ns() - t0)
        self.merge_ns += time.perf_counter_ns() - t0
        self.held += 1
        self.held_from[local] += 1
        self.entries += entries
        self.n_inputs += n_inputs

    def add_rows(self, rows: np.ndarray, entries: np.ndarray, n_inputs: np.ndarray, locals_: np.ndarray,
                 required: int, merged_in: np.ndarray) -> list[tuple[int, Merged]]:
        """Take k histograms (``rows``, in arrival order) and merge every ``required`` held.

        Returns the merges they complete, each with the index of the row that completed it. The rows
        are summed in at most three calls: those completing what is held, whole merges (a
        (merges, required, cells) view summed over its middle axis), and the rest, then held.
        """
        k = len(rows)
        head = min(k, required - self.held)
        whole = (k - head) // required
        tail = head + whole * required
        t0 = time.perf_counter_ns()
        sums = [np.add.reduce(rows[:head], axis=0)]
        if whole:
            sums.extend(np.add.reduce(rows[head:tail].reshape(whole, required, -1), axis=1))
        if tail < k:
            sums.append(np.add.reduce(rows[tail:], axis=0))
        if self.total is not None:
            np.add(sums[0], self.total, out=sums[0])
        if self.cost is not None:
            self.cost.spend(k, rows.nbytes, time.perf_counter_ns() - t0)
        ns_each = (time.perf_counter_ns() - t0) // len(sums)
        group_entries = self.group_sums(entries, head, whole, required, tail, float)
        group_inputs = self.group_sums(n_inputs.astype(np.int64), head, whole, required, tail, int)
        group_entries[0] += self.entries
        group_inputs[0] += self.n_inputs
        done = []
        if head == required - self.held:  # what was held is complete
            shape, ends = self.desc.shape, [head, *range(head + required, tail + 1, required)]
            for i, end in enumerate(ends):
                objects = required if i else head + self.held
                ms = (ns_each + (self.merge_ns if i == 0 else 0)) / 1e6
                done.append((end - 1, Merged(self, sums[i].reshape(shape), group_entries[i], group_inputs[i], objects, ms)))
            merged_in += self.held_from
            merged_in += np.bincount(locals_[:tail], minlength=len(merged_in))
            self.reset()
        else:
            tail = 0  # nothing merged: every row is held
        if tail < k:
            self.total = sums[-1]
            self.held += k - tail
            self.held_from += np.bincount(locals_[tail:], minlength=len(merged_in))
            self.entries, self.n_inputs = group_entries[-1], group_inputs[-1]
            self.merge_ns += ns_each
        return done

    @staticmethod
    def group_sums(values: np.ndarray, head: int, whole: int, required: int, tail: int, kind: type) -> list:
        """``values`` summed as add_rows sums the rows: head, each whole merge, the rest."""
        out = [kind(values[:head].sum())]
        if whole:
            out.extend(values[head:tail].reshape(whole, required).sum(axis=1).tolist())
        if tail < len(values):
            out.append(kind(values[tail:].sum()))
        return out

    def complete(self, merged_in: np.ndarray) -> Merged:
        """Merge what is held, and hold nothing."""
        t0 = time.perf_counter_ns()
        if self.is_tree:
            data = merge(self.desc, [a.reshape(self.desc.shape) for a in self.arrays])
        else:
            data = self.total.reshape(self.desc.shape)
        if self.cost is not None and self.is_tree:  # per object and per byte: paid as each was added
            self.cost.spend(0, 0, time.perf_counter_ns() - t0)
        ms = (self.merge_ns + time.perf_counter_ns() - t0) / 1e6
        merged_in += self.held_from
        done = Merged(self, data, self.entries, self.n_inputs, self.held, ms)
        self.reset()
        return done

    def encode(self, m: Merged, source: int, seq: int) -> list:
        if not self.is_tree and self.nbytes <= wire.INLINE_LIMIT:  # the rule: patch the header, one copy
            wire.RESTAMP.pack_into(self.merged_header, wire.OFF_SOURCE, source, seq, m.entries, time.time(), m.n_inputs)
            return [b"".join((self.merged_header, m.data))]
        # Histograms keep their shape; a merged tree holds the entries of all its inputs.
        if self.is_tree:
            desc, descriptor = dataclasses.replace(self.desc, shape=m.data.shape), None
        else:
            desc, descriptor = self.desc, self.descriptor
        return wire.encode(desc, m.data, source=source, seq=seq, entries=m.entries, n_inputs=m.n_inputs,
                           flags=wire.FLAG_MERGED, t_sent=time.time(), descriptor=descriptor)


class Multipart:
    """A message of several frames, read whole when it arrived. Its length (0) is never the common
    one: it is always taken on its own."""

    __slots__ = ("frames",)

    def __init__(self, frames: list):
        self.frames = frames

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:  # not empty for all that
        return True


@dataclasses.dataclass
class Batch:
    """The common messages of a batch, parsed at once: row r of each array is the r-th of them."""

    length: int  # bytes of every one of them
    joined: bytes
    records: np.ndarray  # wire.header_records(length)
    local: np.ndarray  # producer index (-1: not a producer of ours)
    slot_ids: np.ndarray  # index into slots (-1: taken on its own)
    slots: list[Slot]
    row_of: np.ndarray | None  # the row of each message of the batch (None: message i is row i)
    alone: list[int]  # messages of the batch taken on their own, in arrival order

    def payloads(self) -> np.ndarray:
        return np.frombuffer(self.joined, DTYPE).reshape(len(self.records), self.length // DTYPE.itemsize)


class Merger(Node):
    role = "merger"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.index: int = config["index"]  # in its layer: the source id of what it sends
        self.layer: int = config.get("layer", 1)
        self.producers: list[int] = list(config["producers"])  # upper layers: the indices of its input mergers
        self.source_word = "producer" if self.layer == 1 else "merger"  # what its inputs are, for its log
        self.local = {p: i for i, p in enumerate(self.producers)}
        # Producer ids sorted, and the index of each in self.producers: to look a batch's up at once.
        self.ids_sorted = np.array(sorted(self.producers), dtype=np.int64)
        self.local_of_sorted = np.array([self.local[p] for p in sorted(self.producers)], dtype=np.int64)
        n = len(self.producers)
        self.required = n  # merge when holding as many objects as producers
        self.merge_cost = MergeCost.from_config(config.get("merge_cost"))
        self.receive_buffer_size = config["buffer_size"]
        self.send_buffer_size = config["send_buffer"]
        self.data = self.ctx.socket(zmq.PULL)
        self.data.setsockopt(zmq.RCVHWM, self.receive_buffer_size)
        if config.get("kernel_buffer_size"):  # before bind: ZeroMQ applies it to each connection it accepts
            self.data.setsockopt(zmq.RCVBUF, config["kernel_buffer_size"])
        self.data_endpoint = self.bind(self.data, config.get("data_port", 0))
        self.out = self.ctx.socket(zmq.PUSH)
        self.out.setsockopt(zmq.SNDHWM, self.send_buffer_size)
        self.out.connect(config["downstream_endpoint"])  # the next layer's merger, or the viewer
        self.slots: dict[bytes, Slot] = {}
        self.expected = np.zeros(n, np.int64)  # next sequence number per producer
        self.received = np.zeros(n, np.int64)
        self.merged_in = np.zeros(n, np.int64)
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
        self.sent_stamps: list[float] = []  # t_sent of the objects taken since the clock was last read ...
        self.sent_arrays: list[np.ndarray] = []  # ... one by one, and a run at a time
        self.common_length = 0  # of the messages most of a batch has: those are parsed at once
        self.usual_slot: Slot | None = None  # the name most of the last batch had
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
        """Read what is queued, a batch at a time, for at most RECV_CHUNKS batches and TURN_S: then
        the control socket gets its turn. A turn that did not empty the queue means the merger is behind."""
        now = time.monotonic()
        if self.first_receive is None:
            self.first_receive = now
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
        cost = self.merge_cost
        if cost is None:
            return CHUNK
        if cost.per_byte_s and not self.objects_received:
            return 1  # the objects' size is not known yet
        each_ns = cost.extra_ns(1, self.bytes_received // max(1, self.objects_received), 0)
        return CHUNK if each_ns <= 0 else max(1, min(CHUNK, int(TURN_S * 1e9) // each_ns))

    def receive_batch(self) -> tuple[list, list[int], bool]:
        """Up to batch_size() messages, the positions of those not of the common length (or saying a
        payload frame follows), and whether the queue is empty. Those are read whole (Multipart) here, while
        the socket can still tell where a message ends: asking it costs more than a message."""
        recv, length, batch, unusual = self.data.recv, self.common_length, [], []
        append, flag = batch.append, wire.FLAG_PAYLOAD_FRAME
        for _ in range(self.batch_size()):
            try:
                buf = recv(zmq.NOBLOCK)
            except zmq.Again:
                return batch, unusual, True
            if len(buf) != length or buf[6] & flag:
                unusual.append(len(batch))
                if self.data.getsockopt(zmq.RCVMORE):
                    buf = Multipart([buf, *(f.buffer for f in self.data.recv_multipart(copy=False))])
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
        b = self.parse(msgs, unusual) if len(msgs) >= MIN_BATCH else None
        start = 0
        for i in b.alone if b is not None else range(len(msgs)):
            if i > start:
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
        if start < len(msgs):
            self.take_run(b, start, len(msgs))
        return len(msgs)

    def record_latency(self) -> None:
        stamps = self.sent_arrays
        if self.sent_stamps:
            stamps.append(np.array(self.sent_stamps))
            self.sent_stamps.clear()
        if stamps:
            self.latency.record(stamps[0] if len(stamps) == 1 else np.concatenate(stamps), time.time())
            stamps.clear()

    # -- a batch at once --------------------------------------------------------------------------
    def parse(self, msgs: list, unusual: list[int] | None) -> Batch | None:
        """The batch's messages of the common length, parsed at once; None when it has none."""
        n = len(msgs)
        if unusual is None:
            unusual = [i for i, m in enumerate(msgs) if len(m) != self.common_length]
        if 2 * len(unusual) > n:  # the usual length is not what it was (or not known yet)
            self.common_length = self.usual_length(msgs)
            unusual = [i for i, m in enumerate(msgs) if len(m) != self.common_length]
        length = self.common_length
        if length < wire.FIXED.size or len(unusual) == n:
            return None
        if unusual:
            common = np.delete(np.arange(n), unusual)  # the rows' places in the batch
            row_of = np.zeros(n, np.int64)
            row_of[common] = np.arange(len(common))
            joined = b"".join([msgs[i] for i in common.tolist()])
        else:
            common, row_of, joined = None, None, b"".join(msgs)
        records = np.frombuffer(joined, wire.header_records(length))
        local = self.local_indices(records["source"])
        ok = (local >= 0) & (records["seq"] < MAX_SEQ)
        matched = self.match_usual(joined, length, ok)
        if matched is None:
            ok &= (records["magic"] == wire.MAGIC_U32) & (records["flags"] | wire.FLAG_MERGED == wire.FLAG_MERGED)
            matched = self.match_slots(joined, records, ok)
        slot_ids, slots = matched
        if common is None:
            alone = slot_ids < 0
        else:
            alone = np.ones(n, bool)
            alone[common[slot_ids >= 0]] = False
        return Batch(length, joined, records, local, slot_ids, slots, row_of, np.flatnonzero(alone).tolist())

    @staticmethod
    def usual_length(msgs: list) -> int:
        """The length most messages have (at least a header's), or 0."""
        lengths = collections.Counter(len(m) for m in msgs)
        return max((n for n in lengths if n >= wire.FIXED.size), key=lengths.__getitem__, default=0)

    def local_indices(self, sources: np.ndarray) -> np.ndarray:
        """Each source's index in self.producers, or -1 for a producer not assigned here."""
        ids = self.ids_sorted
        pos = np.minimum(np.searchsorted(ids, sources), len(ids) - 1)
        return np.where(ids[pos] == sources, self.local_of_sorted[pos], -1)

    def match_usual(self, joined: bytes, length: int, ok: np.ndarray) -> tuple[np.ndarray, list[Slot]] | None:
        """The rule: every message of the batch is an object of the name the last batch had (one
        comparison of their header words). None when they are not."""
        slot = self.usual_slot
        if slot is None or length != slot.message_length:
            return None
        words = np.frombuffer(joined, "<u4").reshape(-1, length // 4)
        if not (words[:, slot.static_columns] == slot.static_words).all():
            return None
        return np.where(ok, 0, -1), [slot]

    def match_slots(self, joined: bytes, records: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, list[Slot]]:
        """The slot of each row (an index into the list returned), or -1 when the row is not an
        inline histogram of a known name and of its size, or not ``ok``."""
        length, n = records.itemsize, len(records)
        slot_ids = np.full(n, -1, np.int64)
        slots: list[Slot] = []
        if not ok.any():
            return slot_ids, slots
        # kind, rank and name length say where the descriptor ends: group the rows by them (one group, as a rule)
        shape_code = (records["kind"].astype(np.int64) << 24) | (records["ndim"].astype(np.int64) << 16) | records["name_len"]
        codes = shape_code[ok]
        for code in ([int(codes[0])] if (codes == codes[0]).all() else np.unique(codes).tolist()):
            kind, ndim, name_len = code >> 24, (code >> 16) & 0xFF, code & 0xFFFF
            end = (wire.FIXED.size + 20 * ndim + name_len + 7) & ~7  # histograms: shape and axes
            if kind == TTREE or not 0 < ndim <= wire.MAX_NDIM or end >= length:
                continue
            rows = np.flatnonzero(ok & (shape_code == code))
            descs = np.frombuffer(joined, np.uint8).reshape(n, length)[rows, wire.FIXED.size:end]
            for group, key in self.by_descriptor(rows, descs):
                slot = self.slots.get(key)
                if slot is None or slot.is_tree or slot.kind != kind or slot.ndim != ndim or length - end != slot.nbytes:
                    continue  # new names and the like are taken on their own
                slot_ids[group] = len(slots)
                slots.append(slot)
        if slots:  # the name most of this batch had: next batch, match_usual tries it first
            self.usual_slot = slots[int(np.bincount(slot_ids[slot_ids >= 0]).argmax())]
        return slot_ids, slots

    @staticmethod
    def by_descriptor(rows: np.ndarray, descs: np.ndarray) -> list[tuple[np.ndarray, bytes]]:
        """The rows grouped by their descriptor bytes (one group when the batch has one name)."""
        if (descs == descs[0]).all():
            return [(rows, descs[0].tobytes())]
        keys = np.ascontiguousarray(descs).view(np.dtype((np.void, descs.shape[1]))).ravel()
        unique, which = np.unique(keys, return_inverse=True)
        return [(rows[which == i], unique[i].tobytes()) for i in range(len(unique))]

    def take_run(self, b: Batch, first: int, end: int) -> None:
        """Take the messages first .. end - 1 of a batch, all common ones (rows r0 .. r1 - 1)."""
        r0 = first if b.row_of is None else int(b.row_of[first])
        r1 = r0 + end - first
        records, local = b.records[r0:r1], b.local[r0:r1]
        counts = np.bincount(local, minlength=len(self.producers))
        self.check_sequences(local, records["seq"], counts)
        self.received += counts
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

    def take_rows(self, slot: Slot, payloads: np.ndarray, records: np.ndarray, local: np.ndarray,
                  rows: slice | np.ndarray, r0: int) -> list[tuple[int, Merged]]:
        """``rows`` (of the batch) into ``slot``; the merges it completes, by the row that completed each."""
        cells = slot.nbytes // DTYPE.itemsize
        first = slot.payload_offset // DTYPE.itemsize
        data = payloads[rows, first:first + cells]
        done = slot.add_rows(data, records["entries"], records["n_inputs"], local, self.required, self.merged_in)
        positions = rows if isinstance(rows, np.ndarray) else None
        return [(int(positions[i]) if positions is not None else r0 + i, m) for i, m in done]

    def check_sequences(self, local: np.ndarray, seq: np.ndarray, counts: np.ndarray) -> None:
        """Each producer's objects of a run should continue its sequence: checked at once, and one by
        one (check_sequence, in arrival order) when they do not."""
        order = np.argsort(local, kind="stable")
        by_producer = local[order]
        first = np.cumsum(counts) - counts  # where each producer's objects start in ``order``
        wanted = self.expected[by_producer] + (np.arange(len(local)) - first[by_producer])
        if np.array_equal(seq[order].astype(np.int64), wanted):
            self.expected += counts
            return
        for p, s in zip(local.tolist(), seq.tolist()):
            self.check_sequence(p, s)

    # -- one message at a time --------------------------------------------------------------------
    def on_message(self, buf: bytes, more: list = ()) -> None:
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
        slot = self.slots.get(buf[wire.FIXED.size:offset])
        if slot is None or slot.kind != kind or slot.ndim != ndim or len(buf) - offset != slot.nbytes:
            self.on_unusual_message(buf, more)
            return
        self.take(slot, local, seq, entries, n_inputs, np.frombuffer(buf, DTYPE, offset=offset), len(buf), t_sent)

    def take(self, slot: Slot, local: int, seq: int, entries: float, n_inputs: int, data: np.ndarray,
             nbytes: int, t_sent: float) -> None:
        if t_sent:
            self.sent_stamps.append(t_sent)
        expected = self.expected
        if expected[local] == seq:
            expected[local] = seq + 1
        else:
            self.check_sequence(local, seq)
        self.received[local] += 1
        self.objects_received += 1
        self.bytes_received += nbytes
        slot.add(data, entries, n_inputs, local)
        if slot.held >= self.required:
            self.merge_slot(slot)

    def on_unusual_message(self, buf: bytes, more: list = ()) -> None:
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
            self.on_eos(local, h.seq)
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
            log.error("%s: dropped malformed message #%d on %s: %s", self.node_id, self.malformed,
                      self.data_endpoint, why)

    def check_sequence(self, local: int, seq: int) -> None:
        expected = int(self.expected[local])
        if seq == expected:
            self.expected[local] = seq + 1
        elif seq > expected:
            self.gaps += seq - expected
            self.gap_events += 1
            self.expected[local] = seq + 1
            log.error("%s: %s %d skipped from seq %d to %d", self.node_id, self.source_word, self.producers[local],
                      expected, seq)
        else:
            self.reordered += 1
            log.error("%s: %s %d sent seq %d after %d", self.node_id, self.source_word, self.producers[local], seq,
                      expected - 1)

    def on_eos(self, local: int, count: int) -> None:
        if self.eos_count[local] is None:
            self.eos_seen += 1
        self.eos_count[local] = count
        expected = int(self.expected[local])
        if count != expected:
            missing = count - expected
            self.gaps += max(0, missing)
            log.error("%s: %s %d ended at %d objects, %d received", self.node_id, self.source_word,
                      self.producers[local], count, self.received[local])

    # -- merging and sending --------------------------------------------------------------------
    def merge_slot(self, slot: Slot) -> None:
        self.send_merged(slot.complete(self.merged_in))

    def send_merged(self, m: Merged) -> None:
        self.merge_times.append(m.merge_ms)
        self.merge_time_total_ms += m.merge_ms
        self.objects_merged += m.objects
        self.entries_merged += m.entries
        frames = m.slot.encode(m, source=self.index, seq=self.merges)
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
            if slot.held:
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
        self.emit("final", role=self.role, layer=self.layer, **self.counters(), average_merge_time=self.average_merge_time(),
                  merge_time_total_ms=round(self.merge_time_total_ms, 3),
                  mean_merge_time=round(self.merge_time_total_ms / self.merges, 6) if self.merges else 0.0,
                  active_seconds=round(active, 6), input_latency=self.latency.total(),
                  merged_objects_per_second=round(self.objects_merged / active, 3) if active > 0 else 0.0,
                  entries_merged=self.entries_merged,
                  per_producer={"producer": self.producers, "received": self.received.tolist(),
                                "merged_in": self.merged_in.tolist(), "declared_sent": self.eos_count})
        self.out.close(self.linger_ms())
        self.data.close(0)
        self.close()
        return 0
