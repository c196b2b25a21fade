"""How the benchmarks' figures are counted where a benchmark and a test both need it: the
dashboard views' query targets and percentiles (benchmarks/bench_views.py, bench_soak.py), and
what the soak's "back under 2 s after a fault" and its views' verdicts count, which
tests/test_soak_figures.py checks on made-up delays."""

from __future__ import annotations

import bisect
import math

DELAY_TARGET_S = 2.0
TARGET_PANEL_MS, TARGET_CROSS_RUN_MS = 200.0, 1000.0
TARGETS = {"run view": TARGET_PANEL_MS, "run view, per 10 s": TARGET_PANEL_MS, "cross-run": TARGET_CROSS_RUN_MS}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def p95(sorted_ms: list[float]) -> float:
    return sorted_ms[max(0, math.ceil(0.95 * len(sorted_ms)) - 1)]


def in_faults(t: float, faults: list[dict], grace_s: float = 60.0) -> bool:
    """Whether ``t`` falls in a fault window or the recovery minute after it (the targets' 60 s)."""
    return any(f["start"] <= t <= f["end"] + grace_s for f in faults)


def query_verdicts(rounds: dict, faults: list[dict]) -> dict:
    """Per view and store: the worst panel's p95 over the rounds outside fault windows (and their
    recovery minute), judged against its target; failures counted inside and outside the windows."""
    out: dict = {}
    selections: dict[str, set[str]] = {}
    for key in rounds:
        group, _, _, selection = key.split(" | ")
        selections.setdefault(group, set()).add(selection)
    for key, r in rounds.items():
        base, store, title, selection = key.split(" | ")
        # a view asked with several selections (the run view: All, 10 nodes) is judged per selection
        group = f"{base} ({selection})" if len(selections[base]) > 1 else base
        outside = sorted(ms for ms, t in zip(r["ms"], r["at"], strict=True) if not in_faults(t, faults))
        mine = out.setdefault(
            group,
            {},
        ).setdefault(store, {"worst_p95_ms": 0.0, "worst_p95_ms_with_faults": 0.0, "queries": 0})
        mine.setdefault("failed_in_faults", 0)
        mine.setdefault("failed_outside_faults", 0)
        mine["queries"] += 1
        for t in r["failed_at"]:
            mine["failed_in_faults" if in_faults(t, faults) else "failed_outside_faults"] += 1
        if outside and (p := p95(outside)) > mine["worst_p95_ms"]:
            mine["worst_p95_ms"], mine["worst"] = round(p, 1), title
        if r["ms"]:
            mine["worst_p95_ms_with_faults"] = max(mine["worst_p95_ms_with_faults"], round(p95(sorted(r["ms"])), 1))
    targets = {**TARGETS, "stack view": TARGET_PANEL_MS}
    for group, stores in out.items():
        for v in stores.values():
            v["target_ms"] = targets.get(group.split(" (")[0])
            v["met"] = (v["target_ms"] is None or v["worst_p95_ms"] <= v["target_ms"]) and not v[
                "failed_outside_faults"
            ]
    return out


RECOVERY_STEP_S = 5.0
RECOVERY_WINDOW_S = 60.0  # as the delay is reported: a p99 per minute


def recovery(delays: dict[str, list[tuple[float, float]]], faults: list[dict], t_end: float) -> list[dict]:
    """After each fault ends: seconds until the delay is back within target, in each store (delays:
    (stamp, delay) of every probe sample seen, by stamp, as DelayProbe.delays_by_stamp gives): the
    first multiple of RECOVERY_STEP_S, t, from which the p99 of the probe samples stamped in each
    minute of [end + t, next fault) is within DELAY_TARGET_S, the target outside faults said of
    every minute after it. (The p99 per minute, as the delay is reported: one late sample ten
    minutes on, which the hour outside faults has too, is not the fault's; and a late tail right
    after the fault is not averaged away by the quiet minutes after it.) A fault that overlaps
    another ends when the last of them does (an agent killed while its sink stalls is back once both
    are over); a sample stamped less than DELAY_TARGET_S before the next fault starts is that
    fault's, not this one's."""
    out = []
    starts = sorted(f["start"] for f in faults)
    for f in faults:
        row = {"fault": f["fault"]}
        end = max(g["end"] for g in faults if g["start"] <= f["end"] and g["end"] >= f["start"])
        until = min([t for t in starts if t > end] + [t_end]) - DELAY_TARGET_S
        for store in ("influxdb", "elasticsearch"):
            row[f"{store}_back_under_2s_after_s"] = back_within_target(delays[store], end, until)
        out.append(row)
    return out


def back_within_target(delays: list[tuple[float, float]], end: float, until: float) -> float | None:
    """delays: (stamp, delay) of the samples seen, sorted by stamp. See recovery; the whole span
    when never (a store that shows nothing stamped after the fault is not back: the probes write
    samples all along)."""
    if until <= end:  # the soak ended first: nothing to judge by
        return None
    stamps = [stamp for stamp, _ in delays]
    t = 0.0
    while end + t < until:
        if _every_minute_within_target(delays, stamps, end + t, until):
            return t
        t += RECOVERY_STEP_S
    return round(until - end, 1)


def _every_minute_within_target(delays: list[tuple[float, float]], stamps: list[float], t0: float, t1: float) -> bool:
    """Whether the p99 of the samples stamped in each RECOVERY_WINDOW_S from t0 to t1 is within
    target: per window, so that a late tail right after a fault is not diluted by the quiet minutes
    after it (one p99 over the whole span would hide 1% of it), and one late sample among a minute's
    does not count. A window with nothing seen is not within target: nothing is queryable yet."""
    s = t0
    while s < t1:
        e = min(s + RECOVERY_WINDOW_S, t1)
        if e - s >= RECOVERY_STEP_S:  # the span's short tail is too few samples for a p99
            lo, hi = bisect.bisect_left(stamps, s), bisect.bisect_left(stamps, e)
            p99 = pct(sorted(d for _, d in delays[lo:hi]), 0.99)
            if p99 is None or p99 > DELAY_TARGET_S:
                return False
        s = e
    return True
