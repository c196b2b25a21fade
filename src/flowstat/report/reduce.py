"""Fewer points, every peak kept: min/max per time bucket.

A plot is some hundred pixels wide; a node sampled 2,000 times, or 500 nodes, give far more points
than pixels. Each bucket (a slice of time, about a pixel) keeps its lowest and highest sample, so
a single-sample spike survives whatever the reduction; nothing is dropped blindly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _bucket(t: np.ndarray, lo: float, hi: float, buckets: int) -> np.ndarray:
    """The bucket of each time: ``buckets`` equal slices of [lo, hi] (the last one closed)."""
    width = (hi - lo) / buckets if hi > lo else 1.0
    return np.clip(((t - lo) / width).astype(np.int64), 0, buckets - 1)


def _firsts(where: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The first index of each segment at which ``where`` holds."""
    idx = np.flatnonzero(where)
    return idx[np.r_[True, segment[idx][1:] != segment[idx][:-1]]]


def minmax(
    t: np.ndarray, y: np.ndarray, lo: float, hi: float, buckets: int, series: np.ndarray | None = None
) -> np.ndarray:
    """Which samples to keep: in each bucket, the lowest and the highest (at their own times), so at
    most 2 x ``buckets`` per series. ``t`` and ``y`` (without NaN) hold one series in time order, or
    several one after the other, ``series`` saying whose each sample is (all reduced at once, in a
    few passes over the arrays: no sort). The indices come in the order of the samples."""
    if not len(t):
        return np.empty(0, np.int64)
    b = _bucket(t, lo, hi, buckets)
    if series is not None:
        b = b + series.astype(np.int64) * buckets  # one series' buckets, then the next's
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])  # each bucket's samples are one run
    segment = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(b)]))
    lowest = _firsts(np.minimum.reduceat(y, starts)[segment] == y, segment)
    highest = _firsts(np.maximum.reduceat(y, starts)[segment] == y, segment)
    return np.union1d(lowest, highest)  # sorted: the samples' order


@dataclass(frozen=True)
class Envelope:
    """The range of many series per bucket: at each bucket's middle time ``t``, the lowest and the
    highest value any of them took in that bucket (empty buckets left out)."""

    t: np.ndarray
    low: np.ndarray
    high: np.ndarray


def envelope(t: np.ndarray, y: np.ndarray, lo: float, hi: float, buckets: int) -> Envelope:
    """The envelope of samples of many series, all together (``t`` in any order, ``y`` without NaN)."""
    b = _bucket(t, lo, hi, buckets)
    low, high = np.full(buckets, np.inf), np.full(buckets, -np.inf)
    np.minimum.at(low, b, y)
    np.maximum.at(high, b, y)
    has = np.flatnonzero(np.isfinite(low))  # JSON has no infinity: an infinite low is an empty bucket
    width = (hi - lo) / buckets if hi > lo else 1.0
    return Envelope(lo + (has + 0.5) * width, low[has], high[has])


def on_spans(t: np.ndarray, on: np.ndarray, min_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """When a flag held: the (start, end) times of its runs of true samples (``t`` ascending), each
    lasting until the next sample (the last one, one median interval). Runs less than ``min_gap``
    apart are joined, so there are at most about (t[-1] - t[0]) / min_gap of them, and a flag true
    in a single sample still shows."""
    if not on.any():
        return np.empty(0), np.empty(0)
    step = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    nxt = np.r_[t[1:], t[-1] + step]
    edges = np.diff(np.r_[0, on.astype(np.int8), 0])
    first, last = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    start, end = t[first], nxt[last]
    joined = np.r_[True, start[1:] - end[:-1] >= min_gap]  # a run that starts a new span
    keep = np.flatnonzero(joined)
    return start[keep], np.maximum.reduceat(end, keep)
