"""Reading a batch of messages at once: the common messages of a batch (inline objects of known
names from known producers, all of one length) are parsed with numpy as one array of header
records and one of payloads, so their headers and sequences are checked, and their histograms
summed, in a few calls whatever their number. Any other message (end-of-stream, separate payload
frame, new name, unknown producer, malformed) is left to be taken on its own, in its place."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from .. import wire
from ..qcobjects import DTYPE
from .slots import TTREE, Slot

# Sequence numbers at or above this are malformed: the per-producer counters are int64 (a producer
# sending 10**9 objects/s would get there in 146 years).
MAX_SEQ = 2**62


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


class BatchReader:
    """Parses batches for a merger of ``producers`` whose names' slots are ``slots`` (shared with
    the merger: a name it learns is known here)."""

    def __init__(self, producers: list[int], slots: dict[bytes, Slot]):
        self.slots = slots
        local = {p: i for i, p in enumerate(producers)}
        # Producer ids sorted, and the index of each in producers: to look a batch's up at once.
        self.ids_sorted = np.array(sorted(producers), dtype=np.int64)
        self.local_of_sorted = np.array([local[p] for p in sorted(producers)], dtype=np.int64)
        self.common_length = 0  # of the messages most of a batch has: those are parsed at once
        self.usual_slot: Slot | None = None  # the name most of the last batch had

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
        shape_code = (
            (records["kind"].astype(np.int64) << 24) | (records["ndim"].astype(np.int64) << 16) | records["name_len"]
        )
        codes = shape_code[ok]
        for code in [int(codes[0])] if (codes == codes[0]).all() else np.unique(codes).tolist():
            kind, ndim, name_len = code >> 24, (code >> 16) & 0xFF, code & 0xFFFF
            end = (wire.FIXED.size + 20 * ndim + name_len + 7) & ~7  # histograms: shape and axes
            if kind == TTREE or not 0 < ndim <= wire.MAX_NDIM or end >= length:
                continue
            rows = np.flatnonzero(ok & (shape_code == code))
            descs = np.frombuffer(joined, np.uint8).reshape(n, length)[rows, wire.FIXED.size : end]
            for group, key in self.by_descriptor(rows, descs):
                slot = self.slots.get(key)
                if (
                    slot is None
                    or slot.is_tree
                    or slot.kind != kind
                    or slot.ndim != ndim
                    or length - end != slot.nbytes
                ):
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
