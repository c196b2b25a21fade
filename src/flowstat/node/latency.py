"""Input latency: how long objects waited between being sent and being taken by the node that reads them.

ZeroMQ does not say how many messages wait in its queues (the sender's, the kernel's, the
receiver's), but each object carries the Unix time its sender first tried to send it (``t_sent``
in the wire header). The wait of an object, taken minus sent, is the queue depth in time: it stays
flat while a node keeps up and grows while it falls behind.

The taken time is read once per chunk of at most ``CHUNK`` objects (after the chunk): a wait is
over-estimated by at most the time a chunk takes to read (well under a millisecond), never
under-estimated. Sender and reader must share a clock: on one host they do; across hosts their
clocks must be synchronised (NTP, PTP), and a wait below zero is counted as ``clock_skewed``.

Waits go into log-spaced buckets 2% wide (1 us to about 3 hours), so percentiles are within 1%
and recording a batch read at once costs a few numpy calls (numpy is optional: one object at a
time costs a logarithm). As with the rates of the control channel
(control.RateTracker), every client of ``get-metrics`` gets the figures of the interval since its
own previous request, so several monitors do not steal each other's intervals.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

# numpy, imported by the first recorder (_numpy): the harness reads objects in batches and records
# them with numpy, a user's node needs none, and the agent, which imports this package for its curve
# keys, records nothing (numpy cost each of its processes about half its start-up CPU)
np: Any = None

CHUNK = 256  # objects read between two readings of the clock
_LOW_S = 1e-6  # waits at or below this go to bucket 0
_GROWTH = 1.02
_LOG_GROWTH = math.log(_GROWTH)
_BUCKETS = int(math.log(1e4 / _LOW_S) / _LOG_GROWTH) + 2
# Bucket i holds waits in (LOW * G**(i-1), LOW * G**i]; a percentile reports the bucket's geometric middle.
_MIDDLES_MS = [_LOW_S * 1e3] + [_LOW_S * 1e3 * _GROWTH ** (i - 0.5) for i in range(1, _BUCKETS)]

FIELDS = ("input_latency_p50_ms", "input_latency_p99_ms", "input_latency_max_ms", "input_latency_objects")


def bucket(wait_s: float) -> int:
    """The bucket of one wait (seconds)."""
    if wait_s <= _LOW_S:
        return 0
    return min(math.ceil(math.log(wait_s / _LOW_S) / _LOG_GROWTH), _BUCKETS - 1)


def _stats(counts: Sequence[int], max_s: float) -> dict[str, float | int | None]:
    n = sum(counts)
    if n == 0:
        return {
            "input_latency_p50_ms": None,
            "input_latency_p99_ms": None,
            "input_latency_max_ms": None,
            "input_latency_objects": 0,
        }
    p50, p99 = _percentile_buckets(counts, (0.5 * n, 0.99 * n))
    top = max_s * 1e3
    return {
        "input_latency_p50_ms": round(min(_MIDDLES_MS[p50], top), 3),
        "input_latency_p99_ms": round(min(_MIDDLES_MS[p99], top), 3),
        "input_latency_max_ms": round(top, 3),
        "input_latency_objects": n,
    }


def _percentile_buckets(counts: Sequence[int], ranks: tuple[float, float]) -> tuple[int, int]:
    """The first bucket whose cumulative count reaches each rank (numpy's searchsorted, left)."""
    found: list[int] = []
    cumulative = 0
    for i, c in enumerate(counts):
        cumulative += c
        while len(found) < len(ranks) and cumulative >= ranks[len(found)]:
            found.append(i)
        if len(found) == len(ranks):
            break
    return found[0], found[1]


def _numpy() -> Any:
    """numpy, imported once; None without it."""
    global np
    if np is None:
        try:
            import numpy
        except ImportError:  # pragma: no cover - the harness extra installs numpy
            return None
        np = numpy
    return np


class LatencyRecorder:
    """Distribution of input latencies: whole-run and per asking client.

    Recorded by the node's thread, asked by the control thread (flowstat.node.Node) or by the same
    thread (the harness): a lock guards the buckets, held for a chunk's update or an interval's copy."""

    def __init__(self, max_clients: int = 256):
        self.counts = [0] * _BUCKETS
        self.max_s = 0.0
        self.clock_skewed = 0  # objects stamped later than they were taken: clocks out of step
        self._clients: OrderedDict[bytes, tuple[list[int] | None, float]] = OrderedDict()  # counts then, max since
        self._max_clients = max_clients
        self._lock = threading.Lock()
        _numpy()

    def record(self, sent_s: Any, taken_s: float) -> None:
        """Objects stamped ``sent_s`` (Unix s: a sequence or a numpy array) were all taken by ``taken_s``."""
        if np is not None and isinstance(sent_s, np.ndarray):
            self._record_array(sent_s, taken_s)
            return
        self.record_waits([taken_s - s for s in sent_s])

    def record_waits(self, waits: Sequence[float]) -> None:
        """Waits (seconds, taken minus sent) measured one by one (flowstat.node.Node)."""
        if not waits:
            return
        if np is not None and len(waits) >= 32:
            self._record_array(np.asarray(waits, dtype=np.float64), 0.0, waits_given=True)
            return
        log, ceil, low, scale, last = math.log, math.ceil, _LOW_S, 1 / _LOG_GROWTH, _BUCKETS - 1
        skewed = 0
        with self._lock:
            counts = self.counts
            for w in waits:  # bucket(w), inlined: this loop runs once per object a user's node takes
                if w > low:
                    i = ceil(log(w / low) * scale)
                    counts[i if i < last else last] += 1
                else:
                    counts[0] += 1
                    if w < 0:
                        skewed += 1
            self.clock_skewed += skewed
            self._raise_max(max(waits))

    def _record_array(self, values: Any, taken_s: float, waits_given: bool = False) -> None:
        """Stamps (or, ``waits_given``, waits) in a numpy array: a few vector operations."""
        waits = values if waits_given else taken_s - values.astype(np.float64, copy=False)
        if not len(waits):
            return
        safe = np.maximum(waits, _LOW_S)
        buckets = np.minimum(np.ceil(np.log(safe / _LOW_S) / _LOG_GROWTH), _BUCKETS - 1).astype(np.intp)
        per_bucket = np.bincount(buckets)
        hit = np.flatnonzero(per_bucket)
        with self._lock:
            counts = self.counts
            for i, c in zip(hit.tolist(), per_bucket[hit].tolist(), strict=True):
                counts[i] += c
            self.clock_skewed += int(np.count_nonzero(waits < 0))
            self._raise_max(float(waits.max()))

    def _raise_max(self, top: float) -> None:
        if top > self.max_s:
            self.max_s = top
        for client, (then, client_max) in self._clients.items():
            if top > client_max:
                self._clients[client] = (then, top)

    def interval(self, client: bytes) -> dict[str, float | int | None]:
        """p50, p99, max (ms) and object count since ``client``'s previous call (first call: since start)."""
        with self._lock:
            then, client_max = self._clients.pop(client, (None, self.max_s))
            now = list(self.counts)
            self._clients[client] = (now, 0.0)
            while len(self._clients) > self._max_clients:
                self._clients.popitem(last=False)
        counts = [a - b for a, b in zip(now, then, strict=True)] if then is not None else now
        return _stats(counts, client_max)

    def total(self) -> dict[str, float | int | None]:
        """The whole run's figures."""
        with self._lock:
            counts, top = list(self.counts), self.max_s
        return {**_stats(counts, top), "clock_skewed_objects": self.clock_skewed}
