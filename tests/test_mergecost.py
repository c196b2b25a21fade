"""The topology's merge_cost: CPU time a merger (or, given one of its own, the viewer) spends on each
object beyond its own work, so that its capacity is known on any machine (harness/mergecost.py)."""

import json
import time
from datetime import datetime

import numpy as np
import pytest
import zmq

from flowstat.harness import wire
from flowstat.harness.agents import AgentOptions
from flowstat.harness.devices.merger import MIN_BATCH, Merger
from flowstat.harness.mergecost import MergeCost, burn_cpu_ns
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.qcobjects import Kind, make_desc
from flowstat.harness.topology import from_dict
from flowstat.node.latency import CHUNK
from support.common import topology_dict
from support.runs import assert_no_loss

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


@pytest.mark.parametrize(
    "cost,mean_nbytes,want",
    [
        (MergeCost(factor=3.0), None, 256),
        (MergeCost(per_object_s=2e-3), None, 5),
        (MergeCost(per_object_s=20e-3), 1000, 1),
        (MergeCost(per_byte_s=1e-3 / 1e6), None, 1),
        (MergeCost(per_byte_s=1e-3 / 1e6), 1_000_000, 10),
    ],
)
def test_a_dear_node_takes_as_many_objects_at_once_as_cost_a_turn(cost, mean_nbytes, want):
    assert cost.objects_per_turn(256, 0.01, mean_nbytes) == want


@pytest.fixture
def viewer_with_cost():
    from flowstat.harness.devices.viewer import Viewer

    made = []

    def make(cost: MergeCost | None):
        v = Viewer({"node_id": "viewer", "mergers": 1, "merge_cost": cost.config() if cost else None})
        made.append(v)
        return v

    yield make
    for v in made:
        v.data.close(0)
        v.close()


def merged(desc, n: int) -> list[list]:
    """A merger's first ``n`` merged objects, as the frames of their messages."""
    data = np.ones(desc.shape, np.float32)
    return [
        wire.encode(desc, data, source=0, seq=s, entries=float(data.size), flags=wire.FLAG_MERGED, t_sent=time.time())
        for s in range(n)
    ]


def test_a_dear_viewer_spends_its_cost_on_every_object_it_takes(viewer_with_cost):
    """merge_cost.nodes.viewer: CPU time per object taken (and per MB of its payload), so that the viewer
    takes at most 1 / per_object objects/s on any machine; an end of stream costs nothing."""
    per_object_s, per_byte_s = 5e-3, 1e-3 / 1e6
    v = viewer_with_cost(MergeCost(per_object_s, per_byte_s))
    cpu0 = time.thread_time_ns()
    for frames in merged(H1, 10):
        v.on_message(frames)
    v.on_message([wire.encode_eos(0, 10)])
    spent_ns = time.thread_time_ns() - cpu0
    assert v.objects_received == 10 and all(v.eos) and v.content_mismatches == 0
    assert spent_ns >= 10 * (per_object_s + H1.nbytes * per_byte_s) * 1e9
    cheap = viewer_with_cost(None)
    cpu0 = time.thread_time_ns()
    for frames in merged(H1, 10):
        cheap.on_message(frames)
    assert time.thread_time_ns() - cpu0 < 10 * per_object_s * 1e9 / 5  # without a cost: far less
    assert v.batch_size() == 1 and cheap.batch_size() == CHUNK  # 2 x (5 ms + 1 ms/MB of 1 kB): over a turn's 10 ms


def test_a_turn_of_a_dear_viewer_reads_one_batch_and_the_control_socket_gets_its_turn(viewer_with_cost):
    v = viewer_with_cost(MergeCost(per_object_s=20e-3))
    push = v.ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(v.data_endpoint)
    try:
        for frames in merged(H1, 5):
            push.send(frames[0])
        deadline = time.monotonic() + 10
        while v.objects_received < 5 and time.monotonic() < deadline:
            if v.data.poll(100):
                before = v.objects_received
                v.read_batch()  # 20 ms an object: one a turn
                assert v.objects_received == before + 1
        assert v.objects_received == 5
    finally:
        push.close(0)


# -- real runs: a cost of its own for one node (merge_cost.nodes) ----------------------------------


@pytest.mark.integration
def test_a_merger_with_a_cost_of_its_own_is_slow_and_the_other_is_not(runs_dir):
    """Two mergers, merger-1 at 20 ms an object, merger-0 at none: each one's merge time says so
    (40 objects/s offered to each: below merger-1's 50/s, so the run ends when its producers do)."""
    topo = from_dict(
        topology_dict(
            duration=2,
            producers={"count": 4, "rate": 20},
            mergers=2,
            merge_cost={"nodes": {"merger-1": {"per_object": "20ms"}}},
        )
    )
    s = run_topology(topo, runs_dir=runs_dir, agent=AgentOptions(enabled=False))
    assert_no_loss(s)
    nodes = {n["node_id"]: n for n in s["nodes"]}

    def ms_per_object(n: dict) -> float:
        """Merge time per object merged, over the whole run."""
        return n["mean_merge_time"] * n["merges"] / n["objects_merged"]

    slow, fast = nodes["merger-1"], nodes["merger-0"]
    assert slow["objects_merged"] >= 40 and fast["objects_merged"] >= 40
    # every merge holds an object at least (the last ones, at the end, may hold fewer than 2)
    assert ms_per_object(slow) >= 20.0 and slow["average_merge_time"] >= 20.0
    # a 1 kB TH1F merges in microseconds (a busy machine may stretch a merge or two)
    assert ms_per_object(fast) < 5.0 and fast["average_merge_time"] < 5.0
    run_doc = json.loads((runs_dir / s["run_id"] / "run.json").read_text())
    assert run_doc["parameters"]["merge_cost_nodes"] == "merger-1 +20 ms/object"
    assert "merge_cost_per_object_ms" not in run_doc["parameters"]
    assert run_doc["label"].endswith(", node costs: merger-1 +20 ms/object")


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.mark.integration
def test_a_viewer_with_a_cost_takes_no_more_than_its_cost_allows(runs_dir):
    """The viewer at 20 ms an object takes at most 50 objects/s, whatever it is offered (100 merged
    objects/s here): its samples say so, one after another, and its CPU time holds the cost."""
    topo = from_dict(
        topology_dict(
            duration=1.5,
            producers={"count": 2, "rate": 100},
            mergers=1,
            merge_cost={"nodes": {"viewer": {"per_object": "20ms"}}},
        )
    )
    s = run_topology(topo, runs_dir=runs_dir, agent=AgentOptions(interval_s=0.5, c_agent=False))
    assert_no_loss(s)
    received = next(n for n in s["nodes"] if n["node_id"] == "viewer")["objects_received"]
    assert received >= 100
    lines = (runs_dir / s["run_id"] / "samples.ndjson").read_text().splitlines()[1:]
    samples = [d for d in map(json.loads, lines) if d.get("node_id") == "viewer" and "objects_received" in d]
    rates = [
        (b["objects_received"] - a["objects_received"])
        / (stamp(b["response_timestamp"]) - stamp(a["response_timestamp"]))
        for a, b in zip(samples, samples[1:], strict=False)
    ]
    busy = [r for r in rates if r > 0]
    assert busy and max(busy) <= 55.0, rates  # 1 / 20 ms, and an object either side of each sample
    assert len(busy) >= 2, rates  # 100 objects/s offered for 1.5 s: 3 s to take them at 50/s
    # CPU time, not a sleep: by its last sample the viewer had spent 20 ms of it on each object (ticks of 10 ms)
    last = samples[-1]
    assert last["cpu_user_seconds"] + last["cpu_system_seconds"] >= 0.9 * last["objects_received"] * 0.02
    assert json.loads((runs_dir / s["run_id"] / "run.json").read_text())["parameters"]["merge_cost_nodes"] == (
        "viewer +20 ms/object"
    )


def test_a_node_cost_that_starts_later_spends_nothing_before():
    from flowstat.harness.mergecost import NodeCost

    late = NodeCost(MergeCost(per_object_s=0.02, after_s=0.2))
    late.spend(1, 0, 0)  # not begun: no first object yet
    t0 = time.monotonic()
    late.begin(t0)
    c0 = time.thread_time()
    late.spend(1, 0, 0)  # within the delay
    assert time.thread_time() - c0 < 0.01
    while time.monotonic() < t0 + 0.2:
        time.sleep(0.01)  # the delay itself is what is tested
    late.begin(time.monotonic())  # a later first object does not move it
    c0 = time.thread_time()
    late.spend(1, 0, 0)
    assert time.thread_time() - c0 >= 0.02
    now = NodeCost(MergeCost(per_object_s=0.02))  # no delay: spends before begin too
    c0 = time.thread_time()
    now.spend(1, 0, 0)
    assert time.thread_time() - c0 >= 0.02
