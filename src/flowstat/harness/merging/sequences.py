"""Each producer's sequence, as a merger checks it: the next number it expects from each, what it
received and merged in, gaps, reorderings and what each declared at its end of stream. A merger
of an upper layer checks its input mergers' sequences the same way (they are its "producers")."""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("flowstat.merger")


class Sequences:
    """The book-keeping of ``producers`` (their ids, in the merger's order: index = local id)."""

    def __init__(self, node_id: str, producers: list[int], source_word: str):
        self.node_id, self.producers, self.source_word = node_id, producers, source_word
        n = len(producers)
        self.expected = np.zeros(n, np.int64)  # next sequence number per producer
        self.received = np.zeros(n, np.int64)
        self.merged_in = np.zeros(n, np.int64)
        self.eos_count: list[int | None] = [None] * n
        self.eos_seen = 0
        self.gaps = 0  # objects missing from sequences
        self.gap_events = 0
        self.reordered = 0

    def all_ended(self) -> bool:
        return self.eos_seen == len(self.producers)

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
        for p, s in zip(local.tolist(), seq.tolist(), strict=False):
            self.check_sequence(p, s)

    def check_sequence(self, local: int, seq: int) -> None:
        expected = int(self.expected[local])
        if seq == expected:
            self.expected[local] = seq + 1
        elif seq > expected:
            self.gaps += seq - expected
            self.gap_events += 1
            self.expected[local] = seq + 1
            log.error(
                "%s: %s %d skipped from seq %d to %d",
                self.node_id,
                self.source_word,
                self.producers[local],
                expected,
                seq,
            )
        else:
            self.reordered += 1
            log.error(
                "%s: %s %d sent seq %d after %d",
                self.node_id,
                self.source_word,
                self.producers[local],
                seq,
                expected - 1,
            )

    def on_eos(self, local: int, count: int) -> None:
        if self.eos_count[local] is None:
            self.eos_seen += 1
        self.eos_count[local] = count
        expected = int(self.expected[local])
        if count != expected:
            missing = count - expected
            self.gaps += max(0, missing)
            log.error(
                "%s: %s %d ended at %d objects, %d received",
                self.node_id,
                self.source_word,
                self.producers[local],
                count,
                self.received[local],
            )
