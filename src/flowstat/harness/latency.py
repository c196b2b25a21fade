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
and recording a batch costs a few numpy calls. As with the rates of the control channel
(control.RateTracker), every client of ``get-metrics`` gets the figures of the interval since its
own previous request, so several monitors do not steal each other's intervals.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

CHUNK = 256  # objects read between two readings of the clock
_LOW_S = 1e-6  # waits at or below this go to bucket 0
_GROWTH = 1.02
_LOG_GROWTH = math.log(_GROWTH)
_BUCKETS = int(math.log(1e4 / _LOW_S) / _LOG_GROWTH) + 2
# Bucket i holds waits in (LOW * G**(i-1), LOW * G**i]; a percentile reports the bucket's geometric middle.
_MIDDLES_MS = np.concatenate(([_LOW_S * 1e3], _LOW_S * 1e3 * _GROWTH ** (np.arange(1, _BUCKETS) - 0.5)))

FIELDS = ("input_latency_p50_ms", "input_latency_p99_ms", "input_latency_max_ms", "input_latency_objects")


def _bucket(waits_s: np.ndarray) -> np.ndarray:
    safe = np.maximum(waits_s, _LOW_S)
    return np.minimum(np.ceil(np.log(safe / _LOW_S) / _LOG_GROWTH), _BUCKETS - 1).astype(np.intp)


def _stats(counts: np.ndarray, max_s: float) -> dict[str, float | int | None]:
    n = int(counts.sum())
    if n == 0:
        return {
            "input_latency_p50_ms": None,
            "input_latency_p99_ms": None,
            "input_latency_max_ms": None,
            "input_latency_objects": 0,
        }
    cum = np.cumsum(counts)
    p50, p99 = (float(_MIDDLES_MS[int(np.searchsorted(cum, q * n))]) for q in (0.5, 0.99))
    top = max_s * 1e3
    return {
        "input_latency_p50_ms": round(min(p50, top), 3),
        "input_latency_p99_ms": round(min(p99, top), 3),
        "input_latency_max_ms": round(top, 3),
        "input_latency_objects": n,
    }


class LatencyRecorder:
    """Distribution of input latencies: whole-run and per asking client."""

    def __init__(self, max_clients: int = 256):
        self.counts = np.zeros(_BUCKETS, dtype=np.int64)
        self.max_s = 0.0
        self.clock_skewed = 0  # objects stamped later than they were taken: clocks out of step
        self._clients: OrderedDict[bytes, tuple[np.ndarray, float]] = OrderedDict()  # counts then, max since
        self._max_clients = max_clients

    def record(self, sent_s: np.ndarray | list[float], taken_s: float) -> None:
        """Objects stamped ``sent_s`` (Unix s) were all taken by ``taken_s``."""
        waits = taken_s - np.asarray(sent_s, dtype=np.float64)
        if not len(waits):
            return
        self.counts += np.bincount(_bucket(waits), minlength=_BUCKETS)
        self.clock_skewed += int(np.count_nonzero(waits < 0))
        top = float(waits.max())
        if top > self.max_s:
            self.max_s = top
        for client, (then, client_max) in self._clients.items():
            if top > client_max:
                self._clients[client] = (then, top)

    def interval(self, client: bytes) -> dict[str, float | int | None]:
        """p50, p99, max (ms) and object count since ``client``'s previous call (first call: since start)."""
        then, client_max = self._clients.pop(client, (None, self.max_s))
        counts = self.counts - then if then is not None else self.counts
        self._clients[client] = (self.counts.copy(), 0.0)
        while len(self._clients) > self._max_clients:
            self._clients.popitem(last=False)
        return _stats(counts, client_max)

    def total(self) -> dict[str, float | int | None]:
        """The whole run's figures."""
        return {**_stats(self.counts, self.max_s), "clock_skewed_objects": self.clock_skewed}
