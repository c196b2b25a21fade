"""Where a node's time goes (issue 46): the Python node library accounts each counting thread's time
as busy, backpressured or idle, tells the seconds (counters) and each client's shares in its
get-metrics replies, and both agents carry them into samples. Edges: a node says who feeds it."""

from __future__ import annotations

import threading
import time

import pytest

from flowstat.node import ControlClient, Node
from flowstat.node.phases import BUSY, IDLE, PhaseClock, PhaseTotals, shares
from flowstat.schema import endpoints
from support.agents import wait_until
from support.nodes import agent_samples, stop_agent, watching_agent

PHASE_FIELDS = ("busy_seconds", "backpressured_seconds", "idle_seconds")
SHARE_FIELDS = ("busy_ratio", "backpressured_ratio", "idle_ratio")


def test_each_call_sets_the_phase_the_time_after_it_belongs_to():
    began = time.monotonic()
    with Node("m-0", "merger") as node:
        node.waiting()
        time.sleep(0.3)  # idle: waiting for input
        node.received(1, 10)
        time.sleep(0.2)  # busy: working on it
        node.sending()
        time.sleep(0.1)  # backpressured: in a send
        node.sent(1, 10)
        node.send_refused()
        time.sleep(0.1)  # backpressured: retrying a refused send
        node.sent(1, 10)
        reply = ControlClient(node.endpoint).request("get-metrics")
        # what the test did besides its 0.7 s of sleeps: the only time a phase may have beyond its own
        outside = time.monotonic() - began - 0.7
    busy, held, idle = (reply[f] for f in PHASE_FIELDS)
    for phase, seconds, slept in (("busy", busy, 0.2), ("held", held, 0.2), ("idle", idle, 0.3)):
        # each phase its own sleeps, not its neighbours': only what happened outside them may join
        assert slept <= seconds <= slept + outside, (phase, outside, reply)
    # the node is always in one phase: the three are its counting thread's whole life, read just
    # before its uptime (to the millisecond), the clock begun just after it
    assert reply["uptime_s"] - outside - 1e-3 <= busy + held + idle <= reply["uptime_s"] + 1e-3, (outside, reply)


def test_a_node_that_only_counts_is_busy_and_the_shares_add_up_to_one():
    with Node("p", "producer") as node:
        client = ControlClient(node.endpoint)
        client.request("get-metrics")
        node.sent(5, 50)
        node.received(1, 1)  # no phase change: no clock read, still busy
        reply = client.request("get-metrics")
    assert reply["busy_ratio"] == 1.0 and reply["backpressured_ratio"] == 0.0 and reply["idle_ratio"] == 0.0


def test_each_client_has_its_own_shares_of_its_own_interval():
    with Node("m", "merger") as node:
        a, b = ControlClient(node.endpoint), ControlClient(node.endpoint)
        a.request("get-metrics"), b.request("get-metrics")
        node.sending()
        time.sleep(0.3)  # held by the downstream
        node.sent(1, 1)
        node.waiting()
        time.sleep(0.3)  # waiting for input
        first = a.request("get-metrics")  # a: held, then waiting
        time.sleep(0.3)  # still waiting
        only_idle = a.request("get-metrics")  # a again: waiting only
        both = b.request("get-metrics")  # b: all of it since its first request
    for reply in (first, only_idle, both):
        assert sum(reply[f] for f in SHARE_FIELDS) == pytest.approx(1.0, abs=1e-3), reply
    assert first["backpressured_ratio"] > 0.3 and first["idle_ratio"] > 0.3, first
    assert only_idle["idle_ratio"] > 0.9, only_idle
    assert both["idle_ratio"] > first["idle_ratio"] and both["backpressured_ratio"] < first["backpressured_ratio"]


def test_threads_account_their_own_time_and_the_shares_are_over_all_of_them():
    with Node("w", "worker") as node:
        client = ControlClient(node.endpoint)
        client.request("get-metrics")
        done = threading.Event()

        def waiter():
            t = node.tally()
            t.waiting()  # this thread waits the whole time
            done.wait(5)

        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.4)  # the first thread busy, the other idle
        done.set()
        thread.join()
        reply = client.request("get-metrics")
    assert 0.3 < reply["busy_ratio"] < 0.7 and 0.3 < reply["idle_ratio"] < 0.7, reply
    assert reply["busy_seconds"] + reply["idle_seconds"] > reply["uptime_s"] + 0.35  # two threads' time


def test_the_seconds_are_counters_even_when_a_reading_overshoots():
    class Overshooting(PhaseClock):
        """A clock read just before its thread stored a change: the old phase's slice runs on."""

        def __init__(self):
            super().__init__()
            self.readings = [(1.0, 0.0, 0.5), (0.9, 0.0, 0.7), (1.2, 0.1, 0.7)]

        def seconds(self, now):
            return self.readings.pop(0)

    totals, clock = PhaseTotals(), Overshooting()
    assert [totals.read([clock]) for _ in range(3)] == [(1.0, 0.0, 0.5), (1.0, 0.0, 0.7), (1.2, 0.1, 0.7)]


def test_a_racing_reader_sees_counters_that_never_go_down():
    with Node("r", "merger") as node:
        stop = threading.Event()

        def flip():
            while not stop.is_set():
                node.waiting()
                node.received(1, 1)

        thread = threading.Thread(target=flip)
        thread.start()
        client = ControlClient(node.endpoint)
        try:
            replies = [client.request("get-metrics") for _ in range(200)]
        finally:
            stop.set()
            thread.join()
    for f in PHASE_FIELDS:
        values = [r[f] for r in replies]
        assert values == sorted(values), f


def test_phase_clock_and_shares_by_hand():
    clock = PhaseClock()
    assert clock.phase == BUSY
    clock.enter(IDLE)
    start = clock.seconds(time.monotonic())
    assert clock.phase == IDLE and start[1] == 0.0
    assert shares((1.0, 1.0, 1.0), (2.0, 1.0, 4.0)) == (0.25, 0.0, 0.75)
    assert shares((1.0, 1.0, 1.0), (1.0, 1.0, 1.0)) is None  # no time passed: no shares


def test_a_node_says_who_feeds_it_in_its_endpoint_file(tmp_path):
    with Node("merger-1", "merger", endpoints_dir=tmp_path, upstream=["producers-0", "producers-1"]) as node:
        _, nodes, bad = endpoints.read(node.endpoint_file)
    assert bad == [] and nodes[0]["upstream"] == ["producers-0", "producers-1"]
    with Node("source", "producer", endpoints_dir=tmp_path) as node:  # feeds, fed by none: not said
        _, nodes, _ = endpoints.read(node.endpoint_file)
    assert "upstream" not in nodes[0]
    for wrong in ("producers-0", ["ok", 3], [""]):
        with pytest.raises(ValueError, match="upstream"):
            Node("m", "merger", upstream=wrong)  # type: ignore[arg-type]


def test_both_agents_carry_the_phases_into_samples(agent_command, tmp_path):
    folder, out = tmp_path / "endpoints", tmp_path / "samples.ndjson"
    with Node("m-1", "merger", endpoints_dir=folder) as node:
        node.waiting()  # idle from here, as a node waiting for its input
        agent = watching_agent(agent_command, folder, out)
        try:
            wait_until(lambda: sum(s["node_id"] == "m-1" for s in agent_samples(out)) >= 3, "the node sampled")
        finally:
            err = stop_agent(agent)
    samples = [s for s in agent_samples(out) if s["node_id"] == "m-1" and "idle_seconds" in s]
    assert len(samples) >= 3, err
    idle = [s["idle_seconds"] for s in samples]
    assert idle == sorted(idle) and idle[-1] > idle[0]
    assert samples[-1]["idle_ratio"] > 0.9 and samples[-1]["busy_ratio"] < 0.1, samples[-1]
