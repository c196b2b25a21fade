"""Dearer merges on purpose: CPU time a merger spends on each object it takes, beyond its own.

What a merger can take depends on the machine: a TH1F of 1 kB merges in microseconds here and in
half of that on a machine twice as fast. A topology's ``merge_cost`` puts a floor under what a
merge costs, whatever the machine, so that a merger's capacity is known: at ``per_object: 1ms`` a
merger takes at most 1,000 objects/s, and producers offering 2,000/s leave it behind on a machine
of any speed. It also answers "what if my merges were dearer?": the thesis's THnF and TTree
objects cost far more than its TH1F, and ``factor: 3`` makes every merge three times what it
measured.

The cost is thread CPU time (CLOCK_THREAD_CPUTIME_ID) spent in a busy loop inside the timed merge,
so the merge time the merger reports includes it, and a busy machine or a CPU limit slows it as it
would slow a real merge. A sleep would cost no CPU and keep its wall time on a busy machine: it
would not emulate work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class MergeCost:
    """CPU time to add to each merge step: per object taken, per byte of its payload, and a factor
    on the step's own measured time (1: none added)."""

    per_object_s: float = 0.0
    per_byte_s: float = 0.0
    factor: float = 1.0

    def __bool__(self) -> bool:
        return self.per_object_s > 0 or self.per_byte_s > 0 or self.factor != 1.0

    def extra_ns(self, objects: int, nbytes: int, measured_ns: int) -> int:
        """The CPU time to add to a step that took ``objects`` of ``nbytes`` in all and measured ``measured_ns``."""
        return int((objects * self.per_object_s + nbytes * self.per_byte_s) * 1e9 + (self.factor - 1.0) * measured_ns)

    def spend(self, objects: int, nbytes: int, measured_ns: int) -> None:
        """Burn the extra CPU time of one step in this thread."""
        burn_cpu_ns(self.extra_ns(objects, nbytes, measured_ns))

    def config(self) -> dict[str, float]:
        """As a device's configuration (JSON) carries it; ``from_config`` reads it back."""
        return {"per_object_s": self.per_object_s, "per_byte_s": self.per_byte_s, "factor": self.factor}

    @classmethod
    def from_config(cls, data: dict | None) -> MergeCost | None:
        cost = cls(**data) if data else None
        return cost if cost else None


def burn_cpu_ns(ns: int) -> None:
    """Spend ``ns`` of this thread's CPU time."""
    if ns <= 0:
        return
    end = time.thread_time_ns() + ns
    while time.thread_time_ns() < end:
        pass
