"""Does a merger keep up? The "online" verdict (thesis chapter 5), from what the run reads every second.

Every second the orchestrator reads each merger's producers (objects sent to it), then the merger
(objects merged and received, VmRSS, input latency over the second). The verdict looks only at the
steady state: from the end of start-up (flowstat.schema.run.startup_s: a tenth of the run, at least 3 s) to the
stop signal. The final drain, when the merger empties its queues after the producers stopped, is
never in it: a merger that catches up only then was not online.

A merger is online when, over the steady state,
  1. it merged at least RATE_RATIO_MIN of what its producers sent (totals over the window);
  2. the p99 of its input latency stayed under LATENCY_P99_BOUND_MS every second of the window's
     second half (a queue left by start-up may take the first half to drain), and did not grow:
     its least-squares slope over the window is at most LATENCY_SLOPE_LIMIT_MS_PER_S, or the rise
     it makes over the window at most LATENCY_GROWTH_MIN_MS (a queue that grows by a tenth of the
     offered rate adds 100 ms of waiting every second; jitter of a merger that keeps up is a few ms);
  3. its VmRSS did not grow over the window's second half: least-squares slope at most
     RSS_SLOPE_LIMIT_MB_PER_MIN, or a growth under the noise floor (what its producers' objects
     held for one merge can add, at least RSS_NOISE_MIN_MB);
  4. its producers were not held back: buffer refusals (overload events) on their sends to it are
     at most REFUSALS_MAX of the objects sent. Unthrottled producers fed to a merger that sets their
     pace are "saturated", not online: the merger decides the rate, nobody else.
Fewer than MIN_READINGS readings in the steady state: no verdict (None).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from flowstat.schema.run import startup_s

MIN_READINGS = 5
RATE_RATIO_MIN = 0.95
LATENCY_P99_BOUND_MS = 1000.0
LATENCY_SLOPE_LIMIT_MS_PER_S = 10.0
LATENCY_GROWTH_MIN_MS = 20.0
RSS_SLOPE_LIMIT_MB_PER_MIN = 10.0
RSS_NOISE_MIN_MB = 16.0
REFUSALS_MAX = 0.01


@dataclass(frozen=True)
class Reading:
    """One merger, read once (counters are totals since the node started)."""

    t: float  # seconds since the start command
    merged: int
    received: int
    offered: int  # objects its producers had sent to it, read just before the merger
    refusals: int  # overload events on its producers' sends to it
    vmrss_kb: int | None
    latency_p50_ms: float | None  # over the interval since the previous reading
    latency_p99_ms: float | None
    latency_max_ms: float | None
    latency_objects: int

    @property
    def in_flight(self) -> int:
        """Sent by its producers and not received yet (a lower bound: see Merger.on_metrics_request)."""
        return max(0, self.offered - self.received)


def reading(reply: dict[str, Any], t: float, offered: int, refusals: int) -> Reading:
    """A merger's get-metrics reply, read ``t`` s into the run after its producers' counts."""
    return Reading(
        t,
        int(reply.get("objects_merged") or 0),
        int(reply.get("objects_received") or 0),
        offered,
        refusals,
        reply.get("VmRSS"),
        reply.get("input_latency_p50_ms"),
        reply.get("input_latency_p99_ms"),
        reply.get("input_latency_max_ms"),
        int(reply.get("input_latency_objects") or 0),
    )


def _slope_per_s(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, value) points, per second."""
    try:
        return statistics.linear_regression([t for t, _ in points], [v for _, v in points]).slope
    except statistics.StatisticsError:  # fewer than two points, or all at one time
        return 0.0


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


class OnlineJudge:
    """Keeps the readings of every merger of a run and judges them (see the module's text)."""

    def __init__(self, duration_s: float, held_bytes: dict[str, int]):
        """``held_bytes``: per merger, what one object from each of its producers weighs (the memory a
        merger may hold for one merge)."""
        self.startup_s = startup_s(duration_s)
        self.held_bytes = held_bytes
        self.readings: dict[str, list[Reading]] = {m: [] for m in held_bytes}

    def add(self, merger: str, reading: Reading) -> None:
        self.readings[merger].append(reading)

    def verdicts(self) -> dict[str, dict[str, Any]]:
        return {m: self.verdict(m) for m in self.readings}

    def verdict(self, merger: str) -> dict[str, Any]:
        every = self.readings[merger]
        steady = [r for r in every if r.t >= self.startup_s]
        out: dict[str, Any] = {
            "online": None,
            "state": "judging",
            "why": [],
            "readings": len(steady),
            "in_flight_last": every[-1].in_flight if every else None,
        }
        if len(steady) < MIN_READINGS:
            out["why"].append(
                f"{len(steady)} readings after the first {self.startup_s:.0f} s of start-up; "
                f"{MIN_READINGS} are needed"
            )
            return out
        first, last = steady[0], steady[-1]
        span = last.t - first.t
        offered, merged = last.offered - first.offered, last.merged - first.merged
        ratio = merged / offered if offered > 0 else None
        refusals = last.refusals - first.refusals
        p99_points = [(r.t, r.latency_p99_ms) for r in steady[1:] if r.latency_p99_ms is not None]
        p99s = [v for _, v in p99_points]
        p99_slope = _slope_per_s(p99_points)
        third = max(1, len(p99s) // 3)
        p99_first, p99_last = _mean(p99s[:third]), _mean(p99s[-third:])
        rss_points = [(r.t, r.vmrss_kb / 1024) for r in steady if r.t >= first.t + span / 2 and r.vmrss_kb is not None]
        rss_slope = _slope_per_s(rss_points) * 60 if len(rss_points) >= 2 else None  # of the second half, MB/min
        rss_growth = rss_slope / 60 * (rss_points[-1][0] - rss_points[0][0]) if rss_slope is not None else None
        rss_noise = max(RSS_NOISE_MIN_MB, 2 * self.held_bytes[merger] / 2**20)
        out.update(
            {
                "window_s": [round(first.t, 1), round(last.t, 1)],
                "offered_per_second": round(offered / span, 1),
                "merged_per_second": round(merged / span, 1),
                "merged_to_offered": round(ratio, 4) if ratio is not None else None,
                "latency_p50_ms_median_second": _median(
                    [r.latency_p50_ms for r in steady[1:] if r.latency_p50_ms is not None]
                ),
                "latency_p99_ms_worst_second": max(p99s) if p99s else None,
                "latency_p99_ms_first_third": round(p99_first, 3) if p99_first is not None else None,
                "latency_p99_ms_last_third": round(p99_last, 3) if p99_last is not None else None,
                "latency_p99_slope_ms_per_s": round(p99_slope, 3),
                "latency_max_ms": max(
                    (r.latency_max_ms for r in steady[1:] if r.latency_max_ms is not None), default=None
                ),
                "vmrss_slope_mb_per_min": round(rss_slope, 2) if rss_slope is not None else None,
                "in_flight_max": max(r.in_flight for r in steady),
                "producer_refusals": refusals,
            }
        )
        why = out["why"]
        if ratio is None:
            why.append("its producers sent nothing in the steady state")
        elif ratio < RATE_RATIO_MIN:
            why.append(
                f"merged {ratio:.0%} of what its producers sent ({merged / span:,.0f}/s of {offered / span:,.0f}/s)"
            )
        if not p99s:
            why.append("no input latency was measured")
        else:
            late = [v for t, v in p99_points if t >= first.t + span / 2]
            if late and max(late) > LATENCY_P99_BOUND_MS:
                why.append(
                    f"input latency p99 reached {max(late):,.0f} ms in the second half "
                    f"(bound {LATENCY_P99_BOUND_MS:,.0f} ms)"
                )
            rise = p99_slope * (p99_points[-1][0] - p99_points[0][0])
            if p99_slope > LATENCY_SLOPE_LIMIT_MS_PER_S and rise > LATENCY_GROWTH_MIN_MS:
                why.append(
                    f"input latency p99 grew from {p99_first:,.1f} ms to {p99_last:,.1f} ms "
                    f"({p99_slope:,.0f} ms per second)"
                )
        if (
            rss_slope is not None
            and rss_growth is not None
            and rss_slope > RSS_SLOPE_LIMIT_MB_PER_MIN
            and rss_growth > rss_noise
        ):
            why.append(f"VmRSS grew {rss_slope:,.1f} MB/min over the second half")
        saturated = offered > 0 and refusals > REFUSALS_MAX * offered
        if saturated:
            why.append(f"its producers' sends were refused {refusals:,} times (full buffers): it set their pace")
        out["online"] = not why
        out["state"] = "online" if not why else "saturated" if saturated and len(why) == 1 else "behind"
        return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def short(verdict: dict[str, Any]) -> str:
    """A few words for the live status line."""
    if verdict["online"] is None:
        return "judging"
    if verdict["online"]:
        return "online"
    return f"{verdict['state'].upper()}: {verdict['why'][0]}"
