"""Merging the objects of one name: a histogram's running sum, a tree's held objects, the merge
time, and the merged object ready to send.

A histogram name's objects are summed as they arrive: a merger holds one running sum per name, not
one array per object. Cells are integer counts in float32, so the sum is exact (below 2**24 per
cell) in whatever order it is taken.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .. import wire
from ..mergecost import MergeCost, NodeCost
from ..qcobjects import DTYPE, Kind, merge

TTREE = int(Kind.TTree)


class Merged(NamedTuple):
    """One merged object, ready to send."""

    slot: Slot
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

    __slots__ = (
        "desc",
        "kind",
        "ndim",
        "nbytes",
        "is_tree",
        "descriptor",
        "payload_offset",
        "message_length",
        "static_columns",
        "static_words",
        "merged_header",
        "total",
        "arrays",
        "held",
        "held_from",
        "entries",
        "n_inputs",
        "merge_ns",
        "cost",
    )

    def __init__(self, desc, producers: int, cost: MergeCost | NodeCost | None = None):
        self.desc = desc
        self.cost = cost  # CPU time added to every merge step (its merger's: Topology.cost_of)
        self.kind, self.ndim, self.nbytes = int(desc.kind), len(desc.shape), desc.nbytes
        self.is_tree = desc.kind is Kind.TTree
        self.descriptor = wire.descriptor_bytes(desc)  # packed once: every merged object carries it
        self.payload_offset = wire.FIXED.size + len(self.descriptor)  # of an inline object
        self.message_length = self.payload_offset + self.nbytes
        # What every inline object of this name from a producer has in common, as 32-bit words of
        # its header: magic, kind, rank, flags (none), name length, descriptor (see Merger.match_usual).
        header = wire.encode_header(desc, source=0, seq=0, entries=0.0, inline=True, descriptor=self.descriptor)
        self.static_columns = np.r_[0:2, 10 : self.payload_offset // 4]
        self.static_words = np.frombuffer(header, "<u4")[self.static_columns]
        # The header of its merged histograms when inline, re-stamped for each (see encode).
        self.merged_header = bytearray(
            wire.encode_header(
                desc, source=0, seq=0, entries=0.0, flags=wire.FLAG_MERGED, inline=True, descriptor=self.descriptor
            )
        )
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

    def add_rows(
        self,
        rows: np.ndarray,
        entries: np.ndarray,
        n_inputs: np.ndarray,
        locals_: np.ndarray,
        required: int,
        merged_in: np.ndarray,
    ) -> list[tuple[int, Merged]]:
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
                done.append(
                    (end - 1, Merged(self, sums[i].reshape(shape), group_entries[i], group_inputs[i], objects, ms))
                )
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
            assert self.total is not None, "complete() with no histogram held"
            data = self.total.reshape(self.desc.shape)
        if self.cost is not None and self.is_tree:  # per object and per byte: paid as each was added
            self.cost.spend(0, 0, time.perf_counter_ns() - t0)
        ms = (self.merge_ns + time.perf_counter_ns() - t0) / 1e6
        merged_in += self.held_from
        done = Merged(self, data, self.entries, self.n_inputs, self.held, ms)
        self.reset()
        return done

    def encode(self, m: Merged, source: int, seq: int, now: Callable[[], float] = time.time) -> list:
        """The merged object's frames, stamped ``now()`` (the merger's wall clock)."""
        if not self.is_tree and self.nbytes <= wire.INLINE_LIMIT:  # the rule: patch the header, one copy
            wire.RESTAMP.pack_into(self.merged_header, wire.OFF_SOURCE, source, seq, m.entries, now(), m.n_inputs)
            # (numpy's stubs give ndarray its __buffer__ from Python 3.12 only: for mypy it is no buffer on 3.11)
            return [b"".join((self.merged_header, m.data))]  # type: ignore[arg-type]
        # Histograms keep their shape; a merged tree holds the entries of all its inputs.
        if self.is_tree:
            desc, descriptor = dataclasses.replace(self.desc, shape=m.data.shape), None
        else:
            desc, descriptor = self.desc, self.descriptor
        return wire.encode(
            desc,
            m.data,
            source=source,
            seq=seq,
            entries=m.entries,
            n_inputs=m.n_inputs,
            flags=wire.FLAG_MERGED,
            t_sent=now(),
            descriptor=descriptor,
        )
