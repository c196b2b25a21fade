"""Per-client rates of the control channel: what happened since a client's previous get-metrics."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import NamedTuple

from .phases import shares

Phases = tuple[float, float, float]


class Interval(NamedTuple):
    """What happened since a client's previous get-metrics (or since the node started)."""

    cpu_hz: float  # CPU clock, 10^6 being one full core
    merged_per_second: float
    send_overloads: int  # overload episodes begun on the node's sends ...
    receive_overloads: int  # ... and on its input
    phase_shares: tuple[float, float, float] | None = None  # busy, backpressured, idle; None: not accounted


class RateTracker:
    """Per-client baselines for the thesis's per-request rates (formulas (1) and (2)), and for the
    overload flags.

    The thesis resets its counters at each get-metrics; with several monitors that would make each
    see a fraction. Keeping one baseline per client identity gives each the rate since its own last
    request, as the thesis defines it. The same baseline of overload episodes lets a node tell each
    client whether a buffer overloaded since it last asked: a flag read once a second would miss
    most refusals if it said only whether one is being retried at that moment.
    """

    def __init__(self, max_clients: int = 256):
        self._last: OrderedDict[bytes, tuple[float, float, int, int, int, Phases]] = OrderedDict()
        self._max = max_clients
        self._start = (time.monotonic(), time.process_time(), 0, 0, 0, (0.0, 0.0, 0.0))

    def interval(
        self,
        client: bytes,
        merged_total: int,
        overload_events: tuple[int, int] = (0, 0),
        phase_seconds: Phases | None = None,
    ) -> Interval:
        """The figures of ``client``'s interval, given the node's totals now (merged objects, send
        and receive overload episodes, busy/backpressured/idle seconds when it accounts them)."""
        now = (time.monotonic(), time.process_time(), merged_total, *overload_events, phase_seconds or (0.0, 0.0, 0.0))
        wall0, cpu0, merged0, send0, receive0, phases0 = self._last.pop(client, self._start)
        self._last[client] = now
        while len(self._last) > self._max:
            self._last.popitem(last=False)
        elapsed = now[0] - wall0
        cpu_hz, merged_rate = (
            ((now[1] - cpu0) * 1e6 / elapsed, (now[2] - merged0) / elapsed) if elapsed > 0 else (0.0, 0.0)
        )
        phase_part = shares(phases0, phase_seconds) if phase_seconds is not None else None
        return Interval(cpu_hz, merged_rate, now[3] - send0, now[4] - receive0, phase_part)
