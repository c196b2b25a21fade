"""flowstat.flow.held_back_by: which node holds a pipeline's flow back (issue 46), on made-up series:
the chains and trees it names, each threshold at its edge, the unknowns, the evidence line; and
points_from_samples on samples as run files hold them."""

from __future__ import annotations

import random

import pytest

from flowstat.flow import (
    BACKPRESSURE_OK,
    BUSY_HIGH,
    LATENCY_GROWTH,
    LATENCY_GROWTH_MIN_MS,
    MIN_POINTS,
    SHARE_WINDOW_S,
    WINDOW_S,
    Point,
    Verdict,
    held_back_by,
    points_from_samples,
)

AT = 1_800_000_000.0
CHAIN = {"merger-0": ["producers-0"], "viewer": ["merger-0"]}


def steady(busy, bp=0.0, latency=None, n=10, state="RUNNING", end=AT):
    """n points a second apart up to end, with these shares; latency: one value, or (first, last)
    with the points between going linearly."""
    points = []
    for i in range(n):
        if isinstance(latency, tuple):
            lat = latency[0] + (latency[1] - latency[0]) * i / (n - 1)
            lat = latency[1] if i == n - 1 else lat  # exactly the last value
        else:
            lat = latency
        idle = None if busy is None else max(0.0, 1.0 - busy - bp)
        points.append(Point(end - (n - 1 - i), busy, None if busy is None else bp, idle, lat, state))
    return points


def slow_merger_chain(**merger):
    """producers-0 -> merger-0 -> viewer, merger-0 the slow one (its keyword arguments changed)."""
    m = {"busy": 0.97, "bp": 0.0, "latency": (40.0, 310.0)} | merger
    return {
        "producers-0": steady(0.30, bp=0.64, latency=None),
        "merger-0": steady(**m),
        "viewer": steady(0.20, latency=2.0),
    }


# -- pipelines ----------------------------------------------------------------------------------------
def test_a_slow_merger_in_a_chain_is_named():
    v = held_back_by(slow_merger_chain(), CHAIN, AT)
    assert v == Verdict(
        "held_back",
        ("merger-0",),
        "merger-0: busy 97%, input latency 40->310 ms, upstream producers-0 backpressured 64%",
        AT,
    )


def test_a_slow_viewer_is_named_and_the_backpressured_merger_before_it_is_not():
    series = {
        "producers-0": steady(0.40, bp=0.55),
        "merger-0": steady(0.15, bp=0.80, latency=(3.0, 40.0)),  # busy low, blocked: the symptom
        "viewer": steady(0.99, bp=0.0, latency=(12.0, 500.0)),
    }
    v = held_back_by(series, CHAIN, AT)
    assert (v.kind, v.nodes) == ("held_back", ("viewer",))
    assert v.evidence == "viewer: busy 99%, input latency 12->500 ms, upstream merger-0 backpressured 80%"


def tree():
    """Eight producers, two to each of four mergers, the mergers to one viewer."""
    upstream = {f"merger-{m}": [f"producers-{2 * m}", f"producers-{2 * m + 1}"] for m in range(4)}
    upstream["viewer"] = [f"merger-{m}" for m in range(4)]
    series = {}
    for m in range(4):
        slow = m in (1, 3)
        busy = {1: 0.95, 3: 0.98}.get(m, 0.45)
        series[f"merger-{m}"] = steady(busy, bp=0.0, latency=(20.0, 300.0) if slow else 5.0)
        for p in (2 * m, 2 * m + 1):
            series[f"producers-{p}"] = steady(0.2, bp=0.7 if slow else 0.0)
    series["viewer"] = steady(0.5, latency=3.0)
    return series, upstream


def test_two_slow_mergers_of_four_are_both_named_most_busy_first_and_nothing_else():
    series, upstream = tree()
    v = held_back_by(series, upstream, AT)
    assert (v.kind, v.nodes) == ("held_back", ("merger-3", "merger-1"))
    assert v.evidence == (
        "merger-3: busy 98%, input latency 20->300 ms, upstream producers-6 backpressured 70%, "
        "producers-7 backpressured 70%; "
        "merger-1: busy 95%, input latency 20->300 ms, upstream producers-2 backpressured 70%, "
        "producers-3 backpressured 70%"
    )


def test_nodes_equally_busy_are_named_in_name_order():
    series, upstream = tree()
    series["merger-3"] = series["merger-1"]
    assert held_back_by(series, upstream, AT).nodes == ("merger-1", "merger-3")


def test_none_slow():
    series = {
        "producers-0": steady(0.30),
        "merger-0": steady(0.41, latency=3.0),
        "viewer": steady(0.20, latency=2.0),
    }
    assert held_back_by(series, CHAIN, AT) == Verdict(
        "none", (), "every node keeps up (busiest: merger-0 busy 41%)", AT
    )


def test_the_verdict_does_not_depend_on_the_order_of_nodes_points_or_upstream():
    series, upstream = tree()
    expected = held_back_by(series, upstream, AT)
    rng = random.Random(46)
    for _ in range(5):
        shuffled = {}
        for node in rng.sample(sorted(series), len(series)):
            shuffled[node] = rng.sample(series[node], len(series[node]))
        ups = {node: rng.sample(list(ups), len(ups)) for node, ups in upstream.items()}
        assert held_back_by(shuffled, ups, AT) == expected


# -- thresholds at their edges --------------------------------------------------------------------------
def test_the_constants():
    assert (WINDOW_S, BUSY_HIGH, BACKPRESSURE_OK, LATENCY_GROWTH, LATENCY_GROWTH_MIN_MS, MIN_POINTS) == (
        10.0,
        0.90,
        0.10,
        1.5,
        10.0,
        3,
    )


@pytest.mark.parametrize("busy, named", [(0.90, True), (0.8999, False)])
def test_busy_share_edge(busy, named):
    v = held_back_by(slow_merger_chain(busy=busy), CHAIN, AT)
    assert v.nodes == (("merger-0",) if named else ())


def test_busy_share_is_the_mean_over_the_window():
    # 0.85, 0.95, 0.90 average 0.90 exactly (after rounding off the float sum's hair)
    points = [Point(AT - 2 + i, b, 0.0, 1 - b, lat) for i, (b, lat) in enumerate([(0.85, 40), (0.95, 50), (0.9, 70)])]
    series = slow_merger_chain() | {"merger-0": points}
    assert held_back_by(series, CHAIN, AT).nodes == ("merger-0",)
    points[0] = Point(AT - 2, 0.8499, 0.0, 0.1501, 40)
    assert held_back_by(slow_merger_chain() | {"merger-0": points}, CHAIN, AT).nodes == ()


def test_a_mean_of_edge_values_is_at_the_edge():
    # float sums put these a hair off the edge (9 x 0.9 / 9 = 0.8999999999999999, 3 x 0.1 / 3 =
    # 0.10000000000000002): the shares are rounded back onto it
    assert held_back_by(slow_merger_chain(busy=0.9, n=9), CHAIN, AT).nodes == ("merger-0",)
    assert held_back_by(slow_merger_chain(busy=0.9, bp=0.1, n=3), CHAIN, AT).nodes == ("merger-0",)
    upstream_at_edge = [Point(AT - i, 0.3, bp, 0.7 - bp, None) for i, bp in enumerate([0.12, 0.09, 0.09])]
    series = slow_merger_chain(latency=40.0) | {"producers-0": upstream_at_edge}  # 0.10 on average
    assert held_back_by(series, CHAIN, AT).nodes == ()


@pytest.mark.parametrize("bp, named", [(0.10, True), (0.1001, False)])
def test_own_backpressure_edge(bp, named):
    v = held_back_by(slow_merger_chain(busy=0.9, bp=bp), CHAIN, AT)
    assert v.nodes == (("merger-0",) if named else ())


@pytest.mark.parametrize("bp, named", [(0.1001, True), (0.10, False)])
def test_upstream_backpressure_edge(bp, named):
    # input latency flat: only the upstream backpressure can name merger-0
    series = slow_merger_chain(latency=40.0) | {"producers-0": steady(0.3, bp=bp)}
    v = held_back_by(series, CHAIN, AT)
    assert v.nodes == (("merger-0",) if named else ())
    if named:
        assert v.evidence == "merger-0: busy 97%, input latency 40->40 ms, upstream producers-0 backpressured 10%"


@pytest.mark.parametrize(
    "first, last, named",
    [
        (20.0, 30.0, True),  # exactly 1.5x and exactly +10 ms
        (20.0, 29.999, False),
        (40.0, 60.0, True),  # exactly 1.5x (+20 ms)
        (40.0, 59.99, False),
        (5.0, 15.0, True),  # exactly +10 ms (3x)
        (5.0, 14.99, False),
        (300.0, 40.0, False),  # falling
    ],
)
def test_input_latency_growth_edge(first, last, named):
    # upstream not backpressured: only the latency's growth can name merger-0
    series = slow_merger_chain(latency=(first, last)) | {"producers-0": steady(0.3, bp=0.0)}
    v = held_back_by(series, CHAIN, AT)
    assert v.nodes == (("merger-0",) if named else ())


def test_input_latency_growth_compares_the_first_and_last_points_in_the_window():
    # neither the point before the window (1 ms at AT - 10) nor the dip in between counts: 25 -> 30 ms
    lats = [1.0, 25.0, 1.0, 1.0, 30.0, 30.0]
    points = [Point(AT - 10 + 2 * i, 0.95, 0.0, 0.05, lat) for i, lat in enumerate(lats)]
    series = slow_merger_chain() | {"merger-0": points, "producers-0": steady(0.3, bp=0.0)}
    assert held_back_by(series, CHAIN, AT).nodes == ()
    points[1] = Point(AT - 8, 0.95, 0.0, 0.05, 20.0)  # 20 -> 30 ms
    assert held_back_by(series, CHAIN, AT).nodes == ("merger-0",)


def test_input_latency_needs_two_points():
    points = [Point(AT - i, 0.95, 0.0, 0.05, None) for i in range(3)]
    points[0] = Point(AT, 0.95, 0.0, 0.05, 400.0)
    series = slow_merger_chain() | {"merger-0": points, "producers-0": steady(0.3, bp=0.0)}
    assert held_back_by(series, CHAIN, AT).nodes == ()
    series["producers-0"] = steady(0.3, bp=0.5)  # named for the backpressure: one latency, no trend
    assert held_back_by(series, CHAIN, AT).evidence == (
        "merger-0: busy 95%, input latency 400 ms, upstream producers-0 backpressured 50%"
    )


@pytest.mark.parametrize("n", [3, 2])
def test_min_points_edge(n):
    series = slow_merger_chain(n=n)
    v = held_back_by(series, CHAIN, AT)
    if n == MIN_POINTS:
        assert v.nodes == ("merger-0",)
    else:
        assert v == Verdict("unknown", (), "too few samples: merger-0 has 2 of 3 in the last 5 s", AT)


def test_min_points_counts_only_points_with_ratios():
    series = slow_merger_chain(n=3)
    series["merger-0"] = series["merger-0"] + [Point(AT - 2.5, None, None, None, 50.0)]
    assert held_back_by(series, CHAIN, AT).nodes == ("merger-0",)
    series["merger-0"][0] = Point(series["merger-0"][0].t, None, None, None, 40.0)
    assert held_back_by(series, CHAIN, AT).evidence == "too few samples: merger-0 has 2 of 3 in the last 5 s"


def test_an_upstream_node_with_too_few_points_is_no_evidence():
    series = slow_merger_chain(latency=40.0) | {"producers-0": steady(0.3, bp=0.9, n=2)}
    assert held_back_by(series, CHAIN, AT).nodes == ()
    series["producers-0"] = steady(0.3, bp=0.9, n=3)
    assert held_back_by(series, CHAIN, AT).nodes == ("merger-0",)


def test_window_edges():
    # the shares over the last SHARE_WINDOW_S: a point exactly at AT - SHARE_WINDOW_S is out, three in
    # (the last exactly at AT), one after AT out
    def merger(first_t, latency_at=AT - 8, first_latency=30.0):
        return [
            Point(latency_at, 0.95, 0.0, 0.05, first_latency),  # in the latency's window only
            Point(first_t, 0.0, 0.0, 1.0, 45.0),
            Point(AT - 4, 0.95, 0.0, 0.05, 40.0),
            Point(AT - 2, 0.95, 0.0, 0.05, 50.0),
            Point(AT, 0.95, 0.0, 0.05, 60.0),
            Point(AT + 0.001, 0.0, 0.0, 1.0, 1.0),
        ]

    series = slow_merger_chain() | {"producers-0": steady(0.3), "merger-0": merger(AT - SHARE_WINDOW_S)}
    v = held_back_by(series, CHAIN, AT)
    assert v.nodes == ("merger-0",)
    assert "busy 95%, input latency 30->60 ms, upstream not backpressured" in v.evidence
    series["merger-0"] = merger(AT - SHARE_WINDOW_S + 0.001)  # now in: busy share 71%
    assert held_back_by(series, CHAIN, AT).nodes == ()
    # the latency's trend over the whole window: a point exactly at AT - WINDOW_S is out
    series["merger-0"] = merger(AT - SHARE_WINDOW_S, latency_at=AT - WINDOW_S, first_latency=1000.0)
    assert held_back_by(series, CHAIN, AT).nodes == ()  # 45 -> 60 ms: x1.33, not growing
    series["merger-0"] = merger(AT - SHARE_WINDOW_S, latency_at=AT - WINDOW_S + 0.001, first_latency=10.0)
    assert held_back_by(series, CHAIN, AT).nodes == ("merger-0",)  # 10 -> 60 ms grows


def test_another_window_length():
    series = slow_merger_chain()  # 10 points, AT-9 .. AT
    assert held_back_by(series, CHAIN, AT, window_s=3.0).nodes == ("merger-0",)
    v = held_back_by(series, CHAIN, AT, window_s=2.0)
    assert v.evidence.startswith("too few samples: merger-0 has 2 of 3, viewer has 2 of 3 in the last 2 s")


# -- sources -----------------------------------------------------------------------------------------------
def test_a_source_is_never_named():
    # producers-0 busy all the time, its input latency growing: the pipeline's own rate
    series = {
        "producers-0": steady(1.0, bp=0.0, latency=(10.0, 900.0)),
        "merger-0": steady(0.4, bp=0.0, latency=3.0),
        "viewer": steady(0.2, latency=2.0),
    }
    up = CHAIN | {"producers-0": []}
    assert held_back_by(series, up, AT) == Verdict("none", (), "every node keeps up (busiest: merger-0 busy 40%)", AT)


def test_a_source_without_time_accounting_is_no_reason_for_unknown():
    series = slow_merger_chain() | {"producers-0": steady(None)}
    v = held_back_by(series, CHAIN, AT)
    assert (v.kind, v.nodes) == ("held_back", ("merger-0",))
    assert v.evidence == "merger-0: busy 97%, input latency 40->310 ms, upstream not backpressured"


# -- unknown -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("upstream", [{}, {"merger-0": [], "viewer": []}, {"merger-0": ["merger-0"]}])
def test_no_edges(upstream):
    assert held_back_by(slow_merger_chain(), upstream, AT) == Verdict(
        "unknown", (), "no edges: the nodes did not say who feeds them", AT
    )


def test_no_time_accounting():
    series = slow_merger_chain() | {"merger-0": steady(None, latency=5.0), "viewer": steady(None)}
    assert held_back_by(series, CHAIN, AT) == Verdict("unknown", (), "no time accounting from merger-0, viewer", AT)


def test_no_accounting_and_too_few_together():
    series = slow_merger_chain() | {"merger-0": steady(None), "viewer": steady(0.2, n=1)}
    assert held_back_by(series, CHAIN, AT).evidence == (
        "no time accounting from merger-0; too few samples: viewer has 1 of 3 in the last 5 s"
    )


def test_a_node_fed_by_another_without_points_in_the_window_is_too_few():
    series = slow_merger_chain(busy=0.5) | {"viewer": steady(0.2, end=AT - 30)}
    assert held_back_by(series, CHAIN, AT) == Verdict(
        "unknown", (), "too few samples: viewer has 0 of 3 in the last 5 s", AT
    )


def test_no_samples_in_the_window():
    assert held_back_by(slow_merger_chain(), CHAIN, AT + 60).evidence == "no samples in the last 10 s"
    assert held_back_by({}, CHAIN, AT).evidence == "no samples in the last 10 s"


def test_held_back_says_what_it_could_not_judge():
    series = slow_merger_chain() | {"viewer": steady(None)}
    v = held_back_by(series, CHAIN, AT)
    assert (v.kind, v.nodes) == ("held_back", ("merger-0",))
    assert v.evidence == (
        "merger-0: busy 97%, input latency 40->310 ms, upstream producers-0 backpressured 64%; "
        "not judged: no time accounting from viewer"
    )


def test_none_needs_every_node_fed_by_another_judged():
    series = slow_merger_chain(busy=0.5) | {"viewer": steady(0.2, n=2)}
    assert held_back_by(series, CHAIN, AT) == Verdict(
        "unknown", (), "too few samples: viewer has 2 of 3 in the last 5 s", AT
    )


# -- ended nodes -------------------------------------------------------------------------------------------
def ended(points, state="STOPPED", t=AT):
    """The points, then one in a final state (at the time of the last: the final state wins a tie)."""
    return points + [Point(t, None, None, None, None, state)]


def test_every_node_stopped():
    series = {node: ended(points) for node, points in slow_merger_chain().items()}
    assert held_back_by(series, CHAIN, AT) == Verdict("unknown", (), "no node running", AT)


@pytest.mark.parametrize("state", ["STOPPED", "DOWN"])
def test_an_ended_node_is_not_named(state):
    series = slow_merger_chain()
    series["merger-0"] = ended(series["merger-0"], state)  # slow in the window, then gone
    assert held_back_by(series, CHAIN, AT) == Verdict("none", (), "every node keeps up (busiest: viewer busy 20%)", AT)


def test_an_ended_node_is_not_asked_for_evidence():
    series = slow_merger_chain() | {"viewer": ended(steady(None), "DOWN")}
    v = held_back_by(series, CHAIN, AT)
    assert (v.kind, v.nodes) == ("held_back", ("merger-0",))
    assert "not judged" not in v.evidence
    # ended before the window: the latest point before AT decides
    series["viewer"] = ended(steady(0.2, n=2, end=AT - 40), "DOWN", t=AT - 30)
    assert "not judged" not in held_back_by(series, CHAIN, AT).evidence


def test_every_node_fed_by_another_ended():
    series = slow_merger_chain()
    series = series | {node: ended(series[node]) for node in ("merger-0", "viewer")}
    assert held_back_by(series, CHAIN, AT) == Verdict("unknown", (), "no node fed by another is running", AT)


def test_an_ended_upstream_node_is_no_evidence():
    series = slow_merger_chain(latency=40.0)  # named for producers-0's backpressure alone
    assert held_back_by(series, CHAIN, AT).nodes == ("merger-0",)
    series["producers-0"] = ended(series["producers-0"], "DOWN")
    assert held_back_by(series, CHAIN, AT).nodes == ()


def test_points_in_a_final_state_are_ignored():
    # merger-0 at the busy edge, a DOWN point (busy 0) in between, then running again: the DOWN
    # point counted would bring its busy share below 90%
    points = steady(0.9, latency=(40.0, 310.0))
    points.insert(5, Point(AT - 4.5, 0.0, 0.0, 1.0, None, "DOWN"))
    assert held_back_by(slow_merger_chain() | {"merger-0": points}, CHAIN, AT).nodes == ("merger-0",)


def test_a_node_that_ended_after_the_window_still_counts():
    series = slow_merger_chain()
    series["merger-0"] = series["merger-0"] + [Point(AT + 1, None, None, None, None, "STOPPED")]
    assert held_back_by(series, CHAIN, AT).nodes == ("merger-0",)


# -- the evidence line -------------------------------------------------------------------------------------
def test_evidence_without_input_latency_and_with_sub_millisecond_latency():
    series = slow_merger_chain(latency=None)
    assert held_back_by(series, CHAIN, AT).evidence == (
        "merger-0: busy 97%, no input latency, upstream producers-0 backpressured 64%"
    )
    series = slow_merger_chain(latency=(0.25, 0.4))
    assert held_back_by(series, CHAIN, AT).evidence == (
        "merger-0: busy 97%, input latency 0.25->0.4 ms, upstream producers-0 backpressured 64%"
    )


def test_evidence_lists_backpressured_upstream_most_first_and_only_those():
    up = {"merger-0": ["producers-0", "producers-1", "producers-2"], "viewer": ["merger-0"]}
    series = slow_merger_chain() | {
        "producers-1": steady(0.3, bp=0.9),
        "producers-2": steady(0.3, bp=0.05),
    }
    assert held_back_by(series, up, AT).evidence == (
        "merger-0: busy 97%, input latency 40->310 ms, upstream producers-1 backpressured 90%, "
        "producers-0 backpressured 64%"
    )


def test_evidence_is_one_line():
    series, upstream = tree()
    for v in (held_back_by(series, upstream, AT), held_back_by(series, {}, AT)):
        assert "\n" not in v.evidence and v.evidence


# -- points from samples -----------------------------------------------------------------------------------
def sample(node, time, **fields):
    s = {"time": time, "run_id": "r1", "host": "vm-1", "node_id": node, "role": "merger", "node_state": "RUNNING"}
    return s | fields


def test_points_from_samples():
    samples = [
        sample(
            "merger-0",
            "2027-01-15T08:00:01.500Z",
            busy_ratio=0.9,
            backpressured_ratio=0.0,
            idle_ratio=0.1,
            input_latency_p50_ms=12.5,
            input_latency_p99_ms=40.0,
        ),
        sample("merger-0", "2027-01-15T08:00:00.500Z", busy_ratio=1, backpressured_ratio=0, idle_ratio=0),
        sample("viewer", 1_800_000_000.25, node_state="STOPPED"),
        sample("viewer", "1800000000.75"),
        {"time": "2027-01-15T08:00:00.000Z", "busy_ratio": 0.5},  # no node_id: skipped
        sample(None, "not a time"),
        sample("", "not a time"),
    ]
    points = points_from_samples(samples)
    assert sorted(points) == ["merger-0", "viewer"]
    iso_epoch = 1_800_000_000  # 2027-01-15T08:00:00Z
    assert points["merger-0"] == [
        Point(iso_epoch + 0.5, 1.0, 0.0, 0.0, None, "RUNNING"),
        Point(iso_epoch + 1.5, 0.9, 0.0, 0.1, 12.5, "RUNNING"),
    ]
    assert points["viewer"] == [
        Point(1_800_000_000.25, None, None, None, None, "STOPPED"),
        Point(1_800_000_000.75, None, None, None, None, "RUNNING"),
    ]
    assert isinstance(points["merger-0"][0].busy, float)


def test_points_from_samples_without_a_state_are_up():
    assert points_from_samples([{"node_id": "a", "time": 1.0}])["a"][0].state == "UP"


@pytest.mark.parametrize(
    "time", ["yesterday", "2027-01-15T08:00:00", "2027-13-15T08:00:00Z", "", None, True, "nan", float("inf")]
)
def test_a_bad_time_raises_naming_the_node_and_time(time):
    with pytest.raises(ValueError, match="merger-0") as e:
        points_from_samples([sample("merger-1", "2027-01-15T08:00:00Z"), sample("merger-0", time)])
    assert repr(time) in str(e.value)


def test_a_ratio_that_is_not_a_number_raises():
    with pytest.raises(ValueError, match="merger-0.*busy_ratio"):
        points_from_samples([sample("merger-0", 1.0, busy_ratio="0.9")])


def test_samples_to_verdict():
    """A run's samples, as a run file holds them, through to the verdict."""
    samples = []
    for i in range(10):
        t = AT - 9 + i
        samples.append(sample("producers-0", t, busy_ratio=0.3, backpressured_ratio=0.64, idle_ratio=0.06))
        samples.append(
            sample(
                "merger-0",
                t,
                busy_ratio=0.97,
                backpressured_ratio=0.0,
                idle_ratio=0.03,
                input_latency_p50_ms=40.0 + 30 * i,
            )
        )
        samples.append(
            sample("viewer", t, busy_ratio=0.2, backpressured_ratio=0.0, idle_ratio=0.8, input_latency_p50_ms=2.0)
        )
    v = held_back_by(points_from_samples(samples), CHAIN, AT)
    assert v == Verdict(
        "held_back",
        ("merger-0",),
        "merger-0: busy 97%, input latency 40->310 ms, upstream producers-0 backpressured 64%",
        AT,
    )
