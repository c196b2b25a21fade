"""The topology's merge_cost: CPU time a merger spends on each merge beyond its own work, so that a
merger's capacity is known on any machine (harness/mergecost.py)."""

import time

import numpy as np
import pytest
import zmq

from flowstat.harness import wire
from flowstat.harness.devices.merger import MIN_BATCH, Merger
from flowstat.harness.mergecost import MergeCost, burn_cpu_ns
from flowstat.harness.qcobjects import Kind, make_desc

H1 = make_desc("TH1F_0", Kind.TH1F, (250,))  # 1,000 bytes of payload
TREE = make_desc("tree", Kind.TTree, (2, 125))
PRODUCERS = [0, 1]


def test_the_extra_cpu_time_is_per_object_per_byte_and_a_factor_on_what_was_measured():
    c = MergeCost(per_object_s=1e-3, per_byte_s=2e-9, factor=3.0)
    assert c.extra_ns(4, 1000, 500) == 4 * 1_000_000 + 1000 * 2 + 2 * 500
    assert MergeCost(per_object_s=1e-3).extra_ns(2, 10**6, 10**6) == 2_000_000
    assert MergeCost(factor=2.0).extra_ns(5, 10**6, 70_000) == 70_000
    assert not MergeCost() and MergeCost(factor=1.5) and MergeCost(per_byte_s=1e-12)
    assert MergeCost.from_config(c.config()) == c and MergeCost.from_config(None) is None
    assert MergeCost.from_config(MergeCost().config()) is None


def test_burning_spends_this_thread_s_cpu_time_not_a_sleep():
    cpu0, wall0 = time.thread_time_ns(), time.monotonic_ns()
    burn_cpu_ns(30_000_000)
    cpu, wall = time.thread_time_ns() - cpu0, time.monotonic_ns() - wall0
    assert cpu >= 30_000_000 and wall >= cpu * 0.99  # CPU time is spent, and takes at least as long


@pytest.fixture
def merger_with_cost():
    made = []

    def make(cost: MergeCost | None):
        ctx = zmq.Context()
        out = ctx.socket(zmq.PULL)
        port = out.bind_to_random_port("tcp://127.0.0.1")
        m = Merger(
            {
                "node_id": "m",
                "index": 0,
                "producers": PRODUCERS,
                "buffer_size": 1000,
                "send_buffer": 100_000,
                "downstream_endpoint": f"tcp://127.0.0.1:{port}",
                "merge_cost": cost.config() if cost else None,
            }
        )
        made.append((ctx, out, m))
        return m

    yield make
    for ctx, out, m in made:
        for s in (m.out, m.data, m.control):
            s.close(0)
        m.ctx.term()
        out.close(0)
        ctx.term()


def messages(desc, rounds: int) -> list[list]:
    """Each producer's objects, round by round, as the frames of their messages."""
    data = np.ones(desc.shape, np.float32)
    return [
        wire.encode(desc, data, source=p, seq=s, entries=float(data.size), t_sent=time.time())
        for s in range(rounds)
        for p in PRODUCERS
    ]


@pytest.mark.parametrize("desc", [H1, TREE], ids=["histogram", "tree"])
@pytest.mark.parametrize("batched", [True, False], ids=["a batch at once", "one by one"])
def test_a_merger_spends_the_cost_of_every_object_inside_its_merge_time(merger_with_cost, desc, batched):
    """Per object and per MB: at least the cost in CPU time for what it took, and each merge's time
    (average_merge_time) includes the cost of the objects it merged."""
    per_object_s, per_byte_s = 2e-3, 1e-3 / 1e6  # 2 ms per object, 1 ms per MB
    m = merger_with_cost(MergeCost(per_object_s, per_byte_s))
    msgs = messages(desc, MIN_BATCH)  # 64 objects: the batch path takes them a run at a time
    cpu0 = time.thread_time_ns()
    if batched:
        m.on_batch([frames[0] for frames in msgs])
    else:
        for frames in msgs:
            m.on_message(frames[0])
    spent_ns = time.thread_time_ns() - cpu0
    m.flush()
    cost_each_ns = (per_object_s + desc.nbytes * per_byte_s) * 1e9
    assert m.objects_merged == len(msgs) and m.merges == MIN_BATCH
    assert spent_ns >= len(msgs) * cost_each_ns
    # a batch's time is shared evenly among the merges it completes: exact in total, near for each
    assert m.merge_time_total_ms / m.merges >= len(PRODUCERS) * cost_each_ns / 1e6
    assert m.average_merge_time() >= cost_each_ns / 1e6  # ms, over the last 10 merges


def test_a_factor_makes_every_merge_dearer_by_what_it_measured(merger_with_cost, monkeypatch):
    """Against what the merger measured itself, not against another merger's time: on a busy machine
    two mergers' sums of the same objects may take times apart by more than any factor."""
    measured: list[int] = []
    spend = MergeCost.spend
    monkeypatch.setattr(
        MergeCost, "spend", lambda cost, n, nbytes, ns: (measured.append(ns), spend(cost, n, nbytes, ns))
    )
    dearer = merger_with_cost(MergeCost(factor=50.0))
    msgs = messages(make_desc("big", Kind.TH1F, (2_000_000,)), 4)  # 8 MB each: sums that take a while
    for frames in msgs:
        dearer.on_message(frames[0], [f.tobytes() for f in frames[1:]])  # a header frame, then the payload's
    assert dearer.merges == 4 and len(measured) >= 4 and min(measured) > 0
    assert dearer.merge_time_total_ms * 1e6 >= 50 * sum(measured)


@pytest.mark.parametrize(
    "cost,received,want",
    [
        (None, None, 256),
        (MergeCost(factor=3.0), None, 256),  # unknown in advance: proportional to the merge's own work
        (MergeCost(per_object_s=2e-3), None, 5),  # 5 x 2 ms: a turn's 10 ms
        (MergeCost(per_object_s=1e-6), None, 256),
        (MergeCost(per_object_s=1.0), None, 1),
        (MergeCost(per_byte_s=1e-3 / 1e6), None, 1),  # per MB, before the first object: its size unknown
        (MergeCost(per_byte_s=1e-3 / 1e6), 1_000_000, 10),  # 1 ms per object of 1 MB
    ],
)
def test_a_dear_merger_reads_as_many_messages_at_once_as_cost_a_turn(merger_with_cost, cost, received, want):
    m = merger_with_cost(cost)
    if received:
        m.objects_received, m.bytes_received = 4, 4 * received
    assert m.batch_size() == want


def test_a_turn_of_a_dear_merger_ends_after_one_batch_and_the_control_socket_gets_its_turn(merger_with_cost):
    m = merger_with_cost(MergeCost(per_object_s=2e-3))
    push = m.ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    m.data.bind("inproc://dear")
    push.connect("inproc://dear")
    try:
        for frames in messages(H1, 25):  # 50 queued: over inproc, in the queue once sent
            push.send(frames[0])
        m.drain_input()  # 5 objects cost 10 ms of CPU, so at least 10 ms: the turn is over
        assert m.objects_received == 5 and m.receive_overloaded()
    finally:
        push.close(0)
