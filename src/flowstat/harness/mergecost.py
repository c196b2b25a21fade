"""Dearer merges on purpose: CPU time a merger spends on each object it takes, beyond its own.

What a merger can take depends on the machine: a TH1F of 1 kB merges in microseconds here and in
half of that on a machine twice as fast. A topology's ``merge_cost`` puts a floor under what a
merge costs, whatever the machine, so that a merger's capacity is known: at ``per_object: 1ms`` a
merger takes at most 1,000 objects/s, and producers offering 2,000/s leave it behind on a machine
of any speed. A topology may give a merger, or the viewer, a cost of its own (``merge_cost.nodes``):
one slow node among fast ones, a limit known in advance. It also answers "what if my merges were
dearer?": the thesis's THnF and TTree objects cost far more than its TH1F, and ``factor: 3`` makes
every merge three times what it measured.

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
    # From this many seconds after the node's first object on (0: from the start): a node that
    # slows down during a run (merge_cost.nodes.NODE.after), how soon a verdict names it is measured
    after_s: float = 0.0

    def __bool__(self) -> bool:
        return self.per_object_s > 0 or self.per_byte_s > 0 or self.factor != 1.0

    def extra_ns(self, objects: int, nbytes: int, measured_ns: int) -> int:
        """The CPU time to add to a step that took ``objects`` of ``nbytes`` in all and measured ``measured_ns``."""
        return int((objects * self.per_object_s + nbytes * self.per_byte_s) * 1e9 + (self.factor - 1.0) * measured_ns)

    def spend(self, objects: int, nbytes: int, measured_ns: int) -> None:
        """Burn the extra CPU time of one step in this thread."""
        burn_cpu_ns(self.extra_ns(objects, nbytes, measured_ns))

    def objects_per_turn(self, limit: int, turn_s: float, mean_nbytes: int | None) -> int:
        """How many objects to take at once so that their added cost is at most ``turn_s`` (at least
        one, at most ``limit``), for objects of ``mean_nbytes`` each (None: not known yet). A factor
        is not known in advance: proportional to the node's own work, it leaves ``limit``."""
        if self.per_byte_s and mean_nbytes is None:
            return 1  # the objects' size is not known yet
        each_ns = self.extra_ns(1, mean_nbytes or 0, 0)
        return limit if each_ns <= 0 else max(1, min(limit, int(turn_s * 1e9) // each_ns))

    def config(self) -> dict[str, float]:
        """As a device's configuration (JSON) carries it; ``from_config`` reads it back."""
        out = {"per_object_s": self.per_object_s, "per_byte_s": self.per_byte_s, "factor": self.factor}
        return {**out, "after_s": self.after_s} if self.after_s else out

    @classmethod
    def from_config(cls, data: dict | None) -> MergeCost | None:
        cost = cls(**data) if data else None
        return cost if cost else None


class NodeCost:
    """A node's merge cost as its device spends it: from ``after_s`` seconds after ``begin`` (its
    first object) on, nothing before. What the merging code and the device call, in place of a
    MergeCost."""

    def __init__(self, cost: MergeCost):
        self.cost = cost
        self.from_t: float | None = None if cost.after_s else 0.0  # monotonic; None: not begun

    def begin(self, now: float) -> None:
        """The node took its first object at ``now`` (monotonic): the delay counts from there."""
        if self.from_t is None:
            self.from_t = now + self.cost.after_s

    def spend(self, objects: int, nbytes: int, measured_ns: int) -> None:
        if self.from_t is not None and (not self.from_t or time.monotonic() >= self.from_t):
            self.cost.spend(objects, nbytes, measured_ns)

    def objects_per_turn(self, limit: int, turn_s: float, mean_nbytes: int | None) -> int:
        return self.cost.objects_per_turn(limit, turn_s, mean_nbytes)


def node_cost(config: dict | None) -> NodeCost | None:
    """A device's cost, from its configuration's merge_cost (None: none)."""
    cost = MergeCost.from_config(config)
    return NodeCost(cost) if cost else None


def burn_cpu_ns(ns: int) -> None:
    """Spend ``ns`` of this thread's CPU time."""
    if ns <= 0:
        return
    end = time.thread_time_ns() + ns
    while time.thread_time_ns() < end:
        pass
