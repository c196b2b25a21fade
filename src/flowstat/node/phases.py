"""Where a node's time goes: busy, backpressured or idle, as Flink accounts a task's time.

A counting thread is always in exactly one phase; the time between two of its calls belongs to the
phase the earlier one set (docs/node-library.md, "Where the time goes"). Received, merged and sent
mean busy; a refused send, or a send that begins (``sending``), means backpressured: held by the
downstream until a send goes through; ``waiting`` means idle until the next input. A call that
keeps the phase reads no clock, so a node that takes input in a loop pays for accounting only
where it waits or sends.

The control thread reads a phase clock while its thread counts: the clock's state is one tuple,
replaced whole (one store under the GIL), so a reader sees one consistent state. A reader may
still count a slice of time to the phase that was just left (its "now" falls after the thread's
clock read, before its store); ``PhaseTotals`` keeps what it reported and never reports less, so
the seconds stay counters.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

BUSY, BACKPRESSURED, IDLE = 0, 1, 2
PHASES = ("busy", "backpressured", "idle")  # by index: the fields' prefixes (busy_seconds, busy_ratio)


class PhaseClock:
    """The time one thread spent in each phase. ``phase`` is read on the counting path (a call that
    keeps it does nothing more); ``enter`` is called only on a change."""

    __slots__ = ("phase", "_state")

    def __init__(self) -> None:
        self.phase = BUSY  # a node starting up is working
        # (phase, since, busy, backpressured, idle): replaced whole, never mutated
        self._state: tuple[int, float, float, float, float] = (BUSY, time.monotonic(), 0.0, 0.0, 0.0)

    def enter(self, phase: int) -> None:
        """Leave the current phase for ``phase`` now (the counting thread only)."""
        now = time.monotonic()
        old, since, busy, backpressured, idle = self._state
        spent = now - since
        if old == BUSY:
            busy += spent
        elif old == BACKPRESSURED:
            backpressured += spent
        else:
            idle += spent
        self._state = (phase, now, busy, backpressured, idle)
        self.phase = phase

    def seconds(self, now: float) -> tuple[float, float, float]:
        """Busy, backpressured and idle seconds up to ``now`` (monotonic), the running phase's
        slice included."""
        phase, since, *spent = self._state
        spent[phase] += max(0.0, now - since)
        return spent[0], spent[1], spent[2]


class PhaseTotals:
    """A node's phase seconds over its clocks (one per counting thread), as the control thread
    reports them: never less than it reported before."""

    def __init__(self) -> None:
        self._last = (0.0, 0.0, 0.0)

    def read(self, clocks: Iterable[PhaseClock], now: float | None = None) -> tuple[float, float, float]:
        at = time.monotonic() if now is None else now
        sums = [0.0, 0.0, 0.0]
        for clock in clocks:
            for i, s in enumerate(clock.seconds(at)):
                sums[i] += s
        last = self._last
        self._last = (max(sums[0], last[0]), max(sums[1], last[1]), max(sums[2], last[2]))
        return self._last


def shares(before: tuple[float, float, float], after: tuple[float, float, float]) -> tuple[float, float, float] | None:
    """Each phase's part of the time between two readings (they add up to 1); None when no time
    passed."""
    grown = [max(0.0, a - b) for a, b in zip(after, before, strict=True)]
    total = sum(grown)
    if total <= 0:
        return None
    return grown[0] / total, grown[1] / total, grown[2] / total


Seconds = tuple[float, float, float]  # busy, backpressured, idle


def phase_fields(seconds: Seconds, ratios: Seconds | None) -> dict[str, float | None]:
    """The control reply's fields: busy_seconds ... idle_ratio (seconds to the microsecond, shares
    to 1e-4)."""
    fields: dict[str, float | None] = {f"{name}_seconds": round(s, 6) for name, s in zip(PHASES, seconds, strict=True)}
    for i, name in enumerate(PHASES):
        fields[f"{name}_ratio"] = None if ratios is None else round(ratios[i], 4)
    return fields
