"""How flowstat run judges which node holds the flow back (issue 46), from its evaluations: the
start-up left out of the run's verdict, a node named too briefly, the progress line. The real runs
of topologies whose limit is known (support.flowcases) are made once, with both agents, by
tests/test_verdict_stores.py, which checks the run's own verdict there and the stores'."""

from __future__ import annotations


# -- the run's verdict from its evaluations (no processes) ------------------------------------------
def replies(busy: float, latency: float, t: float) -> list[dict]:
    """A chain source -> m: m busy ``busy``, its input latency ``latency`` ms."""
    return [
        {"node_id": "source", "busy_ratio": 0.0, "backpressured_ratio": 1.0, "idle_ratio": 0.0},
        {
            "node_id": "m",
            "busy_ratio": busy,
            "backpressured_ratio": 0.0,
            "idle_ratio": 1 - busy,
            "input_latency_p50_ms": latency,
            "node_state": "RUNNING",
        },
        {"node_id": "agent-py", "busy_ratio": 1.0},  # not a node of the pipeline: not judged
    ]


def test_start_up_s_points_are_left_out_of_the_run_s_verdict_not_of_the_live_one():
    from flowstat.harness.flowwatch import FlowWatch

    watch = FlowWatch({"source": (), "m": ("source",)}, startup_s=3.0)
    watch.add(1.0, replies(0.2, 10, 1.0))  # start-up: m waited for its first input
    lives = [watch.add(float(t), replies(0.95, 10 * t, float(t))) for t in range(2, 9)]
    # live, start-up's point keeps the busy share under 0.9 while it is in the last 5 s (to 5 s)
    assert [v.kind for v in lives] == ["unknown", "none", "none", "none", "held_back", "held_back", "held_back"]
    run = watch.run_verdict()
    assert run["flow"] == "held_back" and run["held_back_by"] == ["m"], run
    # without it: 3 and 4 s cannot have MIN_POINTS points and are no evaluations, 5 to 8 s name m
    assert run["first_named_s"] == {"m": 5.0} and run["held_back_share"] == {"m": 1.0}


def test_the_steady_state_s_first_readings_do_not_count_against_a_node_named():
    """A 10 s run's 7 steady readings: the first two cannot judge (1 and 2 of MIN_POINTS points), m
    is named in 3 of the 5 others. Counted in, they made the run's verdict "unknown: too few samples"
    (3 of 7 named, 2 of 7 none) though m held the flow back in most of what could be judged."""
    from flowstat.harness.flowwatch import FlowWatch

    watch = FlowWatch({"source": (), "m": ("source",)}, startup_s=3.0)
    for t in range(3, 10):
        slow = t < 8  # at 8 and 9 s its mean busy share falls under 0.9: "none"
        watch.add(float(t), replies(0.95 if slow else 0.3, 10 * t if slow else 10, float(t)))
    assert [v.kind for _, v in watch.steady] == ["held_back"] * 3 + ["none"] * 2
    run = watch.run_verdict()
    assert run["flow"] == "held_back" and run["held_back_share"] == {"m": 0.6}, run


def test_a_node_named_less_than_half_the_steady_time_is_not_the_run_s_verdict():
    from flowstat.harness.flowwatch import FlowWatch, short

    watch = FlowWatch({"source": (), "m": ("source",)}, startup_s=0.0)
    for t in range(1, 25):
        slow = t > 14  # slow from 15 s: named from 19 s, in 6 of the 22 evaluations (3 to 24 s)
        watch.add(float(t), replies(0.95 if slow else 0.3, 10 * t if slow else 10, float(t)))
    assert short(watch.latest()) == "held back by m"
    run = watch.run_verdict()
    assert run["flow"] == "none" and run["held_back_by"] == [], run
    assert FlowWatch({"m": ()}, startup_s=5.0).run_verdict()["flow"] == "unknown"  # too short a run


def test_the_progress_line_shows_the_verdict_the_orchestrator_gives_it():
    """`flowstat run`'s progress line judges nothing itself: it shows the orchestrator's verdict of
    the same reading (one FlowWatch a run)."""
    import io

    from flowstat.flow import Verdict
    from flowstat.harness.command import _progress_printer

    out = io.StringIO()
    show = _progress_printer(out)
    show(6.0, 10.0, [], {}, Verdict("held_back", ("merger-1",), "merger-1: busy 97%", 6.0))
    assert "held back by merger-1" in out.getvalue()
    show(12.0, 20.0, [], {}, None)  # 6 s later: a line every 5 s when not on a terminal
    assert out.getvalue().splitlines()[-1].endswith("flow: judging")
