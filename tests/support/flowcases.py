"""Harness topologies whose limit is known (issue 46), made so by a CPU cost per object on one node
or two (merge_cost.nodes), never by this machine's speed: run once by test_verdict_stores.py, which
checks both the harness's own verdict and the stores'."""

from __future__ import annotations

# 100 objects/s at most: offered 4 producers x 30 = 120/s, it is the limit (a small excess: the queue
# left at the end drains in a second or two)
SLOW = {"per_object": "10ms"}
SLOW_VIEWER = {"per_object": "20ms"}

# name: (the topology's shape, the slow nodes, nodes never to be named)
CASES = {
    # one slow merger of the first layer, under an upper one (2 layers)
    "slow merger in layer 1 of 2": (
        {"producers": {"count": 8, "rate": 30}, "mergers": 2, "merger_layers": [1]},
        ["merger-1"],
        ["merger-0", "merger-l2-0", "viewer", "producer"],
    ),
    # the viewer at 20 ms an object takes 50/s of the 60 merged objects/s offered: a queue builds
    # in front of it (a small excess: the queue left at the end drains in seconds)
    # (its input queue holds 200 in the process: a viewer sharing its CPU with other busy nodes finds
    # input there, not waiting for its ZeroMQ thread to move it from the kernel's buffers)
    "slow viewer": (
        {"producers": {"count": 2, "rate": 60}, "mergers": 1, "buffer_size": 200},
        ["viewer"],
        ["merger-0", "producer"],
    ),
    "two slow mergers of four": (
        {"producers": {"count": 16, "rate": 30}, "mergers": 4},
        ["merger-1", "merger-3"],
        ["merger-0", "merger-2", "viewer", "producer"],
    ),
    "none slow": (
        {"producers": {"count": 4, "rate": 50}, "mergers": 2},
        [],
        ["merger-0", "merger-1", "viewer", "producer"],
    ),
}


def costs(slow: list[str]) -> dict[str, dict[str, str]] | None:
    """merge_cost.nodes for the slow nodes (None: none slow)."""
    return {n: (SLOW_VIEWER if n == "viewer" else SLOW) for n in slow} or None


def pins(slow: list[str], nodes: list[str]) -> dict[str, int]:
    """The slow nodes on CPU 0, the others on CPU 1: a node that burns CPU on purpose is busy all
    the time whatever it shares its CPU with, and no other is named because the machine was full."""
    return {**{n: 0 for n in slow}, **{n: 1 for n in nodes if n not in slow}}
