"""Which node holds the flow back, live (issue 46): every second the orchestrator reads every node
(get-metrics: each reply carries the node's busy, backpressured and idle shares since the previous
reading), and flowstat.flow.held_back_by judges the last 10 s over the topology's edges.

The live verdict judges every point of the last 10 s. The run's verdict is the steady state's:
judged again with start-up's points left out (a node idle while the pipeline started would make
the first windows' shares those of start-up, as harness.online excludes it; the final drain is
never read), the nodes named in at least half of its evaluations, or "none" when at least half
found every node keeping up, else "unknown" with the most frequent reason. Its evaluations begin
at the steady state's MIN_POINTS-th reading: before it no node can have the points a share needs,
and counting them would hold back a short run's verdict for want of time, not of evidence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flowstat.flow import MIN_POINTS, WINDOW_S, Point, Verdict, held_back_by

MAJORITY = 0.5  # of the steady state's evaluations: a node named in at least this share holds the run back


class FlowWatch:
    """The verdicts of one run, as its nodes are read. ``upstream``: each node's feeders (every
    node of the pipeline, sources with none)."""

    def __init__(self, upstream: Mapping[str, Sequence[str]], startup_s: float):
        self.upstream = {node: tuple(ups) for node, ups in upstream.items()}
        self.startup_s = startup_s
        self.points: dict[str, list[Point]] = {}
        self.history: list[tuple[float, Verdict]] = []  # (seconds since the start, live verdict)
        # the steady state's (start-up's points left out), from its MIN_POINTS-th reading on
        self.steady: list[tuple[float, Verdict]] = []
        self.steady_readings = 0

    def add(self, t: float, replies: Iterable[Mapping[str, Any]]) -> Verdict:
        """The nodes' replies read at ``t`` (seconds since the start); the verdict at ``t``."""
        for reply in replies:
            node = reply.get("node_id")
            if node not in self.upstream:
                continue  # an agent, or a node outside the pipeline
            series = self.points.setdefault(node, [])
            series.append(
                Point(
                    t,
                    reply.get("busy_ratio"),
                    reply.get("backpressured_ratio"),
                    reply.get("idle_ratio"),
                    reply.get("input_latency_p50_ms"),
                    reply.get("node_state") or "RUNNING",
                )
            )
            while series and series[0].t <= t - 2 * WINDOW_S:  # only the window is judged
                del series[0]
        verdict = held_back_by(self.points, self.upstream, t)
        self.history.append((t, verdict))
        if t >= self.startup_s:
            self.steady_readings += 1
        if self.steady_readings >= MIN_POINTS:
            steady = {node: [p for p in series if p.t >= self.startup_s] for node, series in self.points.items()}
            self.steady.append((t, held_back_by(steady, self.upstream, t)))
        return verdict

    def latest(self) -> Verdict | None:
        return self.history[-1][1] if self.history else None

    def run_verdict(self) -> dict[str, Any]:
        """The steady state's verdict: ``flow`` (held_back, none, unknown), ``held_back_by`` (node
        ids, most often named first), ``flow_evidence`` (one line); and for every node named at
        least once (held back or not by the majority rule), ``held_back_share`` (the share of
        evaluations naming it) and ``first_named_s`` (seconds from the start to the steady state's
        first verdict naming it)."""
        steady = [v for _, v in self.steady]
        if not steady:
            why = (
                f"no verdict: fewer than {MIN_POINTS} readings after the first {self.startup_s:.0f} s of start-up"
                " (the run was too short)"
            )
            return {"flow": "unknown", "held_back_by": [], "flow_evidence": why}
        named = Counter(n for v in steady if v.kind == "held_back" for n in v.nodes)
        # every node ever named, for the record (how soon a slowdown was seen: benchmarks/bench_flow.py)
        seen: dict[str, Any] = {}
        if named:
            seen["held_back_share"] = {n: round(c / len(steady), 3) for n, c in sorted(named.items())}
            seen["first_named_s"] = {
                n: round(next(t for t, v in self.steady if v.kind == "held_back" and n in v.nodes), 1)
                for n in sorted(named)
            }
        held = sorted((n for n, c in named.items() if c >= MAJORITY * len(steady)), key=lambda n: (-named[n], n))
        if held:
            last = next(v for v in reversed(steady) if v.kind == "held_back" and set(held) & set(v.nodes))
            return {"flow": "held_back", "held_back_by": held, "flow_evidence": last.evidence, **seen}
        kinds = Counter(v.kind for v in steady)
        if kinds["none"] >= MAJORITY * len(steady):
            last = next(v for v in reversed(steady) if v.kind == "none")
            return {"flow": "none", "held_back_by": [], "flow_evidence": last.evidence, **seen}
        reasons = Counter(v.evidence for v in steady if v.kind == "unknown")
        evidence = reasons.most_common(1)[0][0] if reasons else "no verdict held for half of the steady state"
        return {"flow": "unknown", "held_back_by": [], "flow_evidence": evidence, **seen}


def short(verdict: Verdict | None) -> str:
    """The progress line's word for a verdict."""
    if verdict is None or verdict.kind == "unknown":
        return "flow: judging"
    if verdict.kind == "none":
        return "flow: keeps up"
    return "held back by " + ", ".join(verdict.nodes)
