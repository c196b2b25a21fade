"""The flow through a pipeline, judged from the nodes' samples (pure: no store, no clock).

``held_back_by``: which nodes hold the flow back (issue 46), from each node's busy, backpressured and
idle shares and input latency, and who feeds whom; ``points_from_samples`` makes its input from
samples as run files and stores hold them.
"""

from __future__ import annotations

from flowstat.flow.verdict import (
    BACKPRESSURE_OK,
    BUSY_HIGH,
    FINAL_STATES,
    LATENCY_GROWTH,
    LATENCY_GROWTH_MIN_MS,
    MIN_POINTS,
    SHARE_WINDOW_S,
    VERDICT_EVERY_S,
    WINDOW_S,
    Kind,
    Point,
    Verdict,
    epoch_seconds,
    held_back_by,
    points_from_samples,
)

__all__ = [
    "BACKPRESSURE_OK",
    "BUSY_HIGH",
    "FINAL_STATES",
    "LATENCY_GROWTH",
    "LATENCY_GROWTH_MIN_MS",
    "MIN_POINTS",
    "SHARE_WINDOW_S",
    "VERDICT_EVERY_S",
    "WINDOW_S",
    "Kind",
    "Point",
    "Verdict",
    "epoch_seconds",
    "held_back_by",
    "points_from_samples",
]
