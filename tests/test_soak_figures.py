"""The soak's figures (flowstat_lab.figures, which benchmarks/bench_soak.py reports) on made-up
delays: what "back under 2 s after a fault" counts. The soak itself runs an hour (make soak), never in the suite."""

from flowstat_lab import figures as soak


def delays(
    end: float, late_until: float, outlier_at: float | None = None, span: float = 300
) -> list[tuple[float, float]]:
    """A probe sample every 50 ms from 10 s before END to SPAN s after: 5 s late up to LATE_UNTIL,
    0.5 s after it, one sample 9 s late at OUTLIER_AT."""
    out = []
    for i in range(int((span + 10) / 0.05)):
        stamp = end - 10 + i * 0.05
        delay = 5.0 if stamp < late_until else 0.5
        out.append((stamp, 9.0 if outlier_at is not None and abs(stamp - outlier_at) < 0.025 else delay))
    return out


def test_back_under_2_s_is_when_the_p99_from_then_on_is_within_target_not_the_last_late_sample():
    end = 1000.0
    assert soak.back_within_target(delays(end, end + 20), end, end + 290) == 20.0
    # a late sample long after, as the hour outside faults has some: not the fault's
    assert soak.back_within_target(delays(end, end + 20, outlier_at=end + 200), end, end + 290) == 20.0
    assert soak.back_within_target(delays(end, end - 5), end, end + 290) == 0.0


def test_a_store_never_back_within_target_gets_the_whole_span():
    end = 1000.0
    assert soak.back_within_target(delays(end, end + 400), end, end + 290) == 290.0
    assert soak.back_within_target([], end, end + 290) == 290.0  # nothing seen after it: not back


def test_a_view_asked_with_two_selections_is_judged_per_selection_against_its_view_s_target():
    faults = [{"fault": "x", "start": 100.0, "end": 110.0}]
    at = [10.0 * i for i in range(40) if not 90 <= 10.0 * i <= 180]  # outside the fault and its minute
    rounds = {
        "run view | influxdb | CPU clock | all nodes": {"ms": [400.0] * len(at), "at": at, "failed_at": [105.0]},
        "run view | influxdb | CPU clock | 10 nodes": {"ms": [50.0] * len(at), "at": at, "failed_at": []},
        "stack view | influxdb | Samples/s | every agent": {"ms": [20.0] * len(at), "at": at, "failed_at": []},
    }
    judged = soak.query_verdicts(rounds, faults)
    assert sorted(judged) == ["run view (10 nodes)", "run view (all nodes)", "stack view"]
    assert judged["run view (all nodes)"]["influxdb"]["worst_p95_ms"] == 400.0
    assert judged["run view (all nodes)"]["influxdb"]["met"] is False
    assert judged["run view (all nodes)"]["influxdb"]["failed_in_faults"] == 1
    assert judged["run view (10 nodes)"]["influxdb"]["target_ms"] == 200.0
    assert judged["run view (10 nodes)"]["influxdb"]["met"] is True


def test_a_late_tail_right_after_a_fault_is_not_averaged_away_by_the_quiet_minutes_after_it():
    # 5 s late for the 2 s after the fault, then prompt for 288 s: under 1% of the span, all of the first minute's 3%
    end = 1000.0
    assert soak.back_within_target(delays(end, end + 2), end, end + 290) == 5.0
    assert soak.back_within_target(delays(end, end + 2, span=2000), end, end + 1990) == 5.0  # however long the span


def test_a_fault_the_soak_ended_during_is_not_judged():
    end = 1000.0
    assert soak.back_within_target(delays(end, end + 20), end, end - 1.5) is None
