"""Clocks measured, not assumed: each device's clock offset from flowstat run's, over the control
channel, and input latency corrected by it.

Input latency is a difference of two clocks: the sender stamps an object with its clock, the node
that takes it subtracts that from its own. Across hosts their offset adds to every wait. At the start
and at the end of a run flowstat run asks each device for its clock (the ``clock`` command) ROUNDS
times, NTP-style: four timestamps a round (sent t1, received by the device t2, answered t3, answer
back t4, t1 and t4 on flowstat run's clock); offset = ((t2 - t1) + (t3 - t4)) / 2, round trip =
(t4 - t1) - (t3 - t2), and the round with the shortest round trip is kept (its offset is within half
of it). A node's waits are then corrected by its offset minus the mean offset of the devices that
feed it, and an offset or a drift (end minus start) above WARN_MS is said in the summary.
"""

from __future__ import annotations

import time
from typing import Any

from flowstat.node.protocol import ControlClient, ControlError

from .topology import VIEWER_NODE, Topology, producer_process_name

ROUNDS = 8
WARN_MS = 1.0  # input latency is reported in ms: an offset past this shows in it


def measure(client: ControlClient, rounds: int = ROUNDS) -> dict[str, float] | None:
    """The device's clock offset from ours (ms, positive: its clock is ahead) and the round trip of
    the best round (ms); None when it never answered. A round without an answer ends the
    measurement: the device is gone or stalled (its job cancelled, its srun not yet ended), and
    each further round would wait the client's whole time-out."""
    best: tuple[float, float] | None = None
    for _ in range(rounds):
        t1 = time.time()
        try:
            reply = client.request("clock")
        except ControlError:
            break
        t4 = time.time()
        t2, t3 = reply.get("received_s"), reply.get("sent_s")
        if not isinstance(t2, (int, float)) or not isinstance(t3, (int, float)):
            return None  # a node that does not know the command (a user's, an older one)
        trip = (t4 - t1) - (t3 - t2)
        offset = ((t2 - t1) + (t3 - t4)) / 2
        if best is None or trip < best[1]:
            best = (offset, trip)
    if best is None:
        return None
    return {"offset_ms": round(best[0] * 1e3, 3), "round_trip_ms": round(best[1] * 1e3, 3)}


def feeders(topo: Topology) -> dict[str, list[str]]:
    """For each device that takes objects, the devices that send them to it."""
    groups = topo.producer_groups()
    group_of = {p: gi for gi, ids in enumerate(groups) for p in ids}
    out: dict[str, list[str]] = {
        m.node_id: sorted({producer_process_name(group_of[p]) for p in m.producers}) for m in topo.mergers
    }
    out.update({upper: list(lower) for upper, lower in topo.merger_inputs().items()})
    out[VIEWER_NODE] = list(topo.layers()[-1])
    return out


def offset_of(clock: dict[str, Any]) -> float | None:
    """A device's offset: the mean of start and end when both were measured."""
    values = [clock[k] for k in ("offset_start_ms", "offset_end_ms") if clock.get(k) is not None]
    return sum(values) / len(values) if values else None


def correct(summary: dict[str, Any], topo: Topology, clocks: dict[str, dict[str, Any]]) -> list[str]:
    """Correct each node's input latency in ``summary`` by its clock offset from its feeders' (the
    correction kept in the node's input_latency as clock_correction_ms); the warnings to give."""
    offsets = {name: offset_of(c) for name, c in clocks.items()}
    warnings = []
    for name, c in sorted(clocks.items()):
        start, end = c.get("offset_start_ms"), c.get("offset_end_ms")
        worst = max(abs(v) for v in (start, end) if v is not None) if (start, end) != (None, None) else None
        if worst is not None and worst > WARN_MS:
            warnings.append(
                f"{name} on {c.get('host', '?')}: clock off by {worst:.1f} ms from flowstat run's; its input "
                f"latency and its feeders' are corrected by the offsets measured"
            )
        if start is not None and end is not None and abs(end - start) > WARN_MS:
            warnings.append(f"{name} on {c.get('host', '?')}: clock drifted {end - start:+.1f} ms during the run")
    feeding = feeders(topo)
    for node in summary.get("nodes", []):
        latency = node.get("input_latency")
        mine = offsets.get(node["node_id"])
        host = clocks.get(node["node_id"], {}).get("host")
        # a feeder on the node's own host shares its clock: their measured offsets differ by noise only
        theirs = [
            mine if host is not None and clocks.get(f, {}).get("host") == host else offsets.get(f)
            for f in feeding.get(node["node_id"], [])
        ]
        if not latency or mine is None or not theirs or any(t is None for t in theirs):
            continue
        correction = -(mine - sum(t for t in theirs if t is not None) / len(theirs))
        if latency.get("clock_skewed_objects"):  # waits below zero were kept as zero: lost, not shifted
            warnings.append(
                f"{node['node_id']}: input latency not corrected: {latency['clock_skewed_objects']} objects "
                f"arrived stamped after they were taken (its clock {correction:.1f} ms behind its feeders')"
            )
            continue
        latency["clock_correction_ms"] = round(correction, 3)
        for key in ("input_latency_p50_ms", "input_latency_p99_ms", "input_latency_max_ms"):
            if isinstance(latency.get(key), (int, float)):
                latency[key] = round(latency[key] + correction, 3)
    return warnings
