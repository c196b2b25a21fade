"""The devices' wall clock: what producers stamp objects with, what mergers read to take the wait
of what they took, and what the control channel's ``clock`` command answers with.

A run's devices read their host's clock. FLOWSTAT_CLOCK_OFFSETS ("NODE=SECONDS,...", in the
environment of flowstat run, which its devices inherit) shifts the clock of the devices named: a
host whose clock is off, made on purpose, so that the offset measured by flowstat run and the
correction of input latency can be checked (tests/test_slurm_cluster.py).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

OFFSETS_ENV = "FLOWSTAT_CLOCK_OFFSETS"


def offset_for(node_id: str, spec: str | None = None) -> float:
    """Seconds added to ``node_id``'s clock by the FLOWSTAT_CLOCK_OFFSETS spec (0 when not named);
    ValueError naming the entry that is not NODE=SECONDS."""
    spec = os.environ.get(OFFSETS_ENV, "") if spec is None else spec
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        name, sep, value = entry.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not sep or not math.isfinite(seconds):
            raise ValueError(f"{OFFSETS_ENV}: {entry!r} is not NODE=SECONDS")
        if name.strip() == node_id:
            return seconds
    return 0.0


class WallClock:
    """time.time(), shifted for this device as FLOWSTAT_CLOCK_OFFSETS says. ``now`` is time.time
    itself when there is no offset: a producer reads it for every object it sends."""

    def __init__(self, node_id: str):
        self.offset = offset_for(node_id)
        self.now: Callable[[], float] = time.time if not self.offset else self._shifted

    def _shifted(self) -> float:
        return time.time() + self.offset
