"""Issue 9: input latency, objects in flight, and the online verdict: on their own, in a merger fed
directly, and in real runs (one a merger keeps up with, one it cannot)."""

from __future__ import annotations

import json
import time
from datetime import datetime

import numpy as np
import pytest
import zmq

from flowstat.harness import wire
from flowstat.harness.devices.merger import Merger
from flowstat.harness.online import OnlineJudge, Reading
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.qcobjects import Kind, make_desc
from flowstat.harness.topology import from_dict
from flowstat.node.latency import LatencyRecorder
from support.common import topology_dict


# -- the latency distribution --------------------------------------------------------------------
def test_latency_percentiles_are_within_one_percent_and_the_max_is_exact():
    rng = np.random.default_rng(1)
    waits = rng.lognormal(mean=-4, sigma=1.5, size=50_000)  # ms to seconds, skewed like queues
    rec = LatencyRecorder()
    now = 1_800_000_000.0
    for chunk in np.array_split(waits, 37):
        rec.record(now - chunk, now)
    got = rec.interval(b"a")
    assert got["input_latency_objects"] == 50_000
    for q, key in ((50, "input_latency_p50_ms"), (99, "input_latency_p99_ms")):
        want = float(np.percentile(waits, q)) * 1e3
        assert got[key] == pytest.approx(want, rel=0.012), q
    assert got["input_latency_max_ms"] == pytest.approx(waits.max() * 1e3, abs=1e-3)


def test_each_client_gets_the_interval_since_its_own_previous_request():
    rec = LatencyRecorder()
    rec.record([99.0, 99.5], 100.0)  # waits of 1 s and 0.5 s
    assert rec.interval(b"a")["input_latency_objects"] == 2
    rec.record([99.99], 100.0)  # 10 ms
    a, b = rec.interval(b"a"), rec.interval(b"b")
    assert a["input_latency_objects"] == 1 and a["input_latency_max_ms"] == pytest.approx(10, abs=1e-6)
    assert b["input_latency_objects"] == 3 and b["input_latency_max_ms"] == pytest.approx(1000, abs=1e-6)
    assert rec.interval(b"a") == {
        "input_latency_p50_ms": None,
        "input_latency_p99_ms": None,
        "input_latency_max_ms": None,
        "input_latency_objects": 0,
    }


def test_a_stamp_from_the_future_is_counted_as_clock_skew():
    rec = LatencyRecorder()
    rec.record([101.0, 99.0], 100.0)
    assert rec.total()["clock_skewed_objects"] == 1 and rec.total()["input_latency_objects"] == 2


# -- the verdict on readings ---------------------------------------------------------------------
def readings(seconds=30, offered=1000.0, merged=1000.0, p99=lambda t: 5.0, rss=lambda t: 200_000, refusals=0):
    return [
        Reading(
            t=float(t),
            merged=int(merged * t),
            received=int(merged * t),
            offered=int(offered * t),
            refusals=int(refusals * t),
            vmrss_kb=int(rss(t)),
            latency_p50_ms=p99(t) / 2,
            latency_p99_ms=p99(t),
            latency_max_ms=p99(t) * 1.2,
            latency_objects=int(merged),
        )
        for t in range(1, seconds + 1)
    ]


def judged(rs, duration=30):
    judge = OnlineJudge(duration, {"m": 100_000})
    for r in rs:
        judge.add("m", r)
    return judge.verdict("m")


def test_a_merger_that_keeps_up_is_online():
    v = judged(readings())
    assert v["online"] is True and v["state"] == "online" and v["why"] == []
    assert v["merged_per_second"] == pytest.approx(1000, rel=0.01) and v["window_s"][0] >= 3


@pytest.mark.parametrize(
    "case, words",
    [
        (dict(merged=900.0), "merged 90%"),
        (dict(p99=lambda t: 5.0 + 20 * t), "grew from"),
        (dict(p99=lambda t: 700.0 + 25 * t), "grew from"),  # already high after start-up, and rising
        (dict(p99=lambda t: 1500.0), "reached"),
        (dict(rss=lambda t: 200_000 + 2048 * t), "VmRSS grew"),  # 2 MB/s
        (dict(refusals=50), "refused"),
    ],
)
def test_a_merger_that_falls_behind_is_not_online_and_says_why(case, words):
    v = judged(readings(**case))
    assert v["online"] is False and any(words in w for w in v["why"]), v["why"]


def test_a_queue_left_by_start_up_that_drains_in_the_first_half_is_not_falling_behind():
    v = judged(readings(p99=lambda t: max(5.0, 2500.0 - 250 * t)))
    assert v["online"] is True, v["why"]


def test_latency_jitter_is_not_growth():
    v = judged(readings(p99=lambda t: 5.0 + 6 * (t % 3)))
    assert v["online"] is True, v["why"]


def test_memory_wobbling_within_one_merge_of_objects_is_not_growth():
    v = judged(readings(rss=lambda t: 200_000 + (t % 2) * 8_000))
    assert v["online"] is True, v["why"]


def test_start_up_is_left_out_and_a_short_run_gets_no_verdict():
    slow_start = readings(p99=lambda t: 3000.0 if t < 3 else 5.0)
    assert judged(slow_start)["online"] is True
    assert judged(readings(seconds=6), duration=6)["online"] is None


# -- a merger fed directly -----------------------------------------------------------------------
@pytest.fixture
def merger():
    ctx = zmq.Context()
    out = ctx.socket(zmq.PULL)
    port = out.bind_to_random_port("tcp://127.0.0.1")
    m = Merger(
        {
            "node_id": "m",
            "index": 0,
            "producers": [0, 1],
            "buffer_size": 100,
            "send_buffer": 100,
            "downstream_endpoint": f"tcp://127.0.0.1:{port}",
        }
    )
    push = ctx.socket(zmq.PUSH)
    push.connect(m.data_endpoint)
    yield m, push
    push.close(0)
    for s in (m.out, m.data, m.control):
        s.close(0)
    m.ctx.term()
    out.close(0)
    ctx.term()


def test_the_merger_reports_how_long_its_inputs_waited_and_what_is_in_flight(merger):
    m, push = merger
    desc = make_desc("TH1F_0", Kind.TH1F, (12,))
    data = np.ones(12, np.float32)
    sent = time.time() - 0.25  # as if each had waited a quarter of a second in the queues
    for seq in range(50):
        for source in (0, 1):
            push.send_multipart(wire.encode(desc, data, source=source, seq=seq, entries=12.0, t_sent=sent))
    deadline = time.monotonic() + 10
    while m.objects_received < 100:
        assert time.monotonic() < deadline, "the objects did not arrive"
        if m.data.poll(100):
            m.drain_input()
    taken = time.time()
    reply = m.answer(b"monitor", "get-metrics", {"command": "get-metrics", "upstream_sent": 130}, None)
    assert reply["input_latency_objects"] == 100
    assert 250 * 0.99 <= reply["input_latency_p50_ms"] <= reply["input_latency_max_ms"] <= (taken - sent) * 1e3 + 1
    assert reply["objects_in_flight"] == 30 and reply["objects_held"] == 0 and m.merges == 50
    again = m.answer(b"monitor", "get-metrics", {"command": "get-metrics"}, None)
    assert again["input_latency_objects"] == 0 and again["objects_in_flight"] == 30


# -- real runs -----------------------------------------------------------------------------------
def merger_samples(run_dir):
    lines = (run_dir / "samples.ndjson").read_text().splitlines()[1:]
    return [d for d in map(json.loads, lines) if d.get("role") == "merger" and d.get("input_latency_objects")]


def check_latency_samples(s, runs_dir):
    """Every merger sample's latencies come from the objects' stamps: positive, ordered, and shorter
    than the run (nothing can wait longer than the run has lasted)."""
    samples = merger_samples(runs_dir / s["run_id"])
    assert samples
    started, finished = (datetime.fromisoformat(s[k].replace("Z", "+00:00")) for k in ("started", "finished"))
    run_s = (finished - started).total_seconds()
    for d in samples:
        assert 0 < d["input_latency_p50_ms"] <= d["input_latency_p99_ms"] <= d["input_latency_max_ms"] < run_s * 1e3
    return samples


def test_a_paced_small_topology_is_judged_and_the_run_document_carries_the_verdict(runs_dir):
    """Whether this merger keeps up, and how low its latency stays, depends on the machine: those
    are benchmark figures (paced_8_producers_1_merger in benchmarks/run_benchmarks.py). Here: a 10 s run
    is judged, its latencies come from the objects' stamps, and run.json says what the verdict says."""
    topo = from_dict(topology_dict(duration=10, producers={"count": 8, "rate": 100}))
    s = run_topology(topo, runs_dir=runs_dir)
    assert s["conservation"]["ok"], s["failures"]
    v = s["online"]["merger-0"]
    assert isinstance(v["online"], bool) and v["window_s"][0] >= 3, v  # judged, start-up left out
    assert v["merged_per_second"] > 0 and v["offered_per_second"] > 0
    merger = next(n for n in s["nodes"] if n["role"] == "merger")
    lat = merger["input_latency"]
    assert 0 < lat["input_latency_p50_ms"] <= lat["input_latency_p99_ms"] <= lat["input_latency_max_ms"]
    assert lat["input_latency_objects"] == merger["objects_received"] and lat["clock_skewed_objects"] == 0
    check_latency_samples(s, runs_dir)
    doc = json.loads((runs_dir / s["run_id"] / "run.json").read_text())
    assert doc["verdict"]["online"] is v["online"]
    assert doc["summary"]["steady_merged_objects_per_second"] == round(v["merged_per_second"], 1)


def test_a_merger_that_cannot_keep_up_is_reported_behind_with_latency_growing(fixture_runs):
    # 760 objects/s offered to a merger that takes at most 500/s on any machine (fixture_runs.BEHIND):
    # the session's run of it, which the alert and report tests read too
    run_dir = fixture_runs["behind"]
    s, runs_dir = json.loads((run_dir / "summary.json").read_text()), run_dir.parent
    assert s["conservation"]["ok"]  # behind, and still nothing lost
    v = s["online"]["merger-0"]
    assert v["online"] is False and v["state"] == "behind", v
    assert v["latency_p99_ms_last_third"] > v["latency_p99_ms_first_third"]
    assert any("grew from" in w for w in v["why"]) and v["in_flight_max"] > 0
    samples = check_latency_samples(s, runs_dir)
    steady = [d["input_latency_p99_ms"] for d in samples if d["node_state"] == "RUNNING"]
    assert steady[-1] > steady[len(steady) // 3]  # the samples show the growth too
    doc = json.loads((runs_dir / s["run_id"] / "run.json").read_text())
    assert doc["verdict"]["online"] is False and doc["verdict"]["not_online"][0].startswith("merger-0: behind")
    assert doc["verdict"]["ok"]  # the verdict is information: a lossless run is ok


@pytest.mark.parametrize("garbage", ["130", -5, 1.5, True, None])
def test_a_bad_upstream_count_is_ignored_and_keeps_the_last_good_one(merger, garbage):
    m, _ = merger
    m.answer(b"monitor", "get-metrics", {"command": "get-metrics", "upstream_sent": 7}, None)
    reply = m.answer(b"monitor", "get-metrics", {"command": "get-metrics", "upstream_sent": garbage}, None)
    assert "error" not in reply and reply["objects_in_flight"] == 7


def test_a_feeder_on_the_node_s_own_host_shares_its_clock_and_corrects_nothing():
    """Offsets measured over the control channel differ by their noise on one host: a merger fed
    from its own host is not corrected (a short latency would go below zero), one fed from another
    host is, by the difference."""
    from flowstat.harness import clocks

    topo = from_dict(topology_dict(duration=10, producers={"count": 2, "rate": 100}))
    merger, feeding = next(iter(clocks.feeders(topo).items()))
    for host, want in (("h1", 0.0), ("h2", -0.3)):
        offsets = {merger: {"host": "h1", "offset_start_ms": 0.4, "offset_end_ms": 0.4}}
        offsets |= {f: {"host": host, "offset_start_ms": 0.1, "offset_end_ms": 0.1} for f in feeding}
        summary = {"nodes": [{"node_id": merger, "input_latency": {"input_latency_p50_ms": 0.2}}]}
        clocks.correct(summary, topo, offsets)
        latency = summary["nodes"][0]["input_latency"]
        assert latency["clock_correction_ms"] == want and latency["input_latency_p50_ms"] == round(0.2 + want, 3)
