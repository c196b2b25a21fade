"""What ``flowstat top`` knows of a pipeline: each node's recent samples, from one agent's scrapes
or several, who feeds whom (from the nodes' endpoints files), and the verdict over the window.

A scrape shows each node's latest sample; a sample seen again (the agent has not sampled since, its
figures all the same) adds nothing. A node's points keep ``WINDOW_S`` of history plus a little: the
verdict (flowstat.flow.held_back_by) judges the last ``WINDOW_S``. Several agents may report the
same node (a run's Python and C agents): each node is taken from the first agent, in the order
given, that has it.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowstat.flow import WINDOW_S, Point, Verdict, held_back_by
from flowstat.schema import endpoints as endpoints_schema

from .scrape import NodeSample, Scrape

RATE_SPAN_S = 3.0  # objects/s: the counter's increase over the scrapes of the last 3 s (an agent
# sampling at the scrape interval is sometimes seen twice, then skipped once: one pair would jump)
KEEP_S = WINDOW_S + 2 * RATE_SPAN_S  # history kept a node (a little more than the window judged)
FORGET_S = WINDOW_S  # a node no agent reports for this long goes (unless an endpoints file names it)
# A sample without the node's own figures (its control reply came too late for the agent's round:
# /proc's only) shows the figures of the one before, if that is at most this old: a row does not
# flicker to "—" for a round, nor shows a silent node's old figures for long.
FIGURES_KEPT_S = 3.0


@dataclass
class NodeView:
    """One node as a row shows it (None: not known yet, or not reported)."""

    node_id: str
    role: str
    state: str | None
    in_rate: float | None  # objects/s received
    busy: float | None
    backpressured: float | None
    idle: float | None
    latency_ms: float | None  # input latency p50
    reported: bool  # in the latest scrape of an agent that answered


@dataclass
class _History:
    points: deque[tuple[float, float | None, Point]] = field(default_factory=deque)  # (t, objects_received, point)
    fingerprint: tuple[Any, ...] | None = None
    sample: NodeSample | None = None
    seen_at: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)  # the latest sample's with the node's own figures
    figures_at: float = 0.0
    reported: bool = False

    def at_most(self, age_s: float) -> bool:
        """Whether the node's own figures were seen at most ``age_s`` before its latest sample."""
        return bool(self.figures) and self.seen_at - self.figures_at <= age_s


class EndpointsError(ValueError):
    """An endpoints path that cannot be read (missing, not an endpoints document): in a few words."""


class Edges:
    """Who feeds whom, from an endpoints file (a run's RUN_DIR/endpoints.json) or directory (the
    nodes' endpoints directory: one file a node; a run directory holding endpoints.json reads that
    one). Read again when the file or directory changes; a node's edges stay known after its file
    goes (a node that closed cleanly withdraws it)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.upstream: dict[str, tuple[str, ...]] = {}  # the nodes that said who feeds them
        self.roles: dict[str, str] = {}
        self.problems: list[str] = []
        self._stamp: tuple[int, ...] | None = None
        if path is not None:
            if not path.exists():
                raise EndpointsError(f"{path}: no such file or directory")
            self.refresh(strict=True)

    def _files(self) -> list[Path]:
        assert self.path is not None
        if not self.path.is_dir():
            return [self.path]
        if (self.path / "endpoints.json").is_file():
            return [self.path / "endpoints.json"]
        return sorted(p for p in self.path.glob("*.json") if not p.name.startswith("."))

    def refresh(self, strict: bool = False) -> None:
        """Read the endpoints again if they changed. ``strict`` (the first read): a file that is not
        an endpoints document is an EndpointsError; later, a problem is kept in ``problems``."""
        if self.path is None:
            return
        stamp = _stamp(self.path)
        if stamp is not None and stamp == self._stamp:
            return
        problems = []
        for path in self._files():
            try:
                _, nodes, bad = endpoints_schema.read(path)
            except FileNotFoundError:  # withdrawn between the listing and the read
                continue
            except (OSError, ValueError) as exc:
                if strict and not self.path.is_dir():
                    raise EndpointsError(f"{path}: {_short(exc)}") from None
                problems.append(f"{path.name}: {_short(exc)}")
                continue
            problems += [f"{path.name}: {b}" for b in bad]
            self.take(nodes)
        self.problems = problems
        self._stamp = stamp

    def take(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        """The edges and roles of endpoints nodes (the schema's items)."""
        for node in nodes:
            node_id = str(node["node_id"])
            self.roles[node_id] = str(node.get("role") or "")
            if isinstance(node.get("upstream"), list):
                self.upstream[node_id] = tuple(str(u) for u in node["upstream"] if u != node_id)


def _stamp(path: Path) -> tuple[int, ...] | None:
    """When the endpoints last changed: a file's mtime, or a directory's and its endpoints.json's
    (files are put in place by a rename, which changes the directory's). None: cannot tell."""
    try:
        stamp = [os.stat(path).st_mtime_ns]
        if path.is_dir() and (path / "endpoints.json").exists():
            stamp.append(os.stat(path / "endpoints.json").st_mtime_ns)
    except OSError:
        return None
    return tuple(stamp)


def _short(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc})"
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return text.splitlines()[0][:160] if text else type(exc).__name__


class Watch:
    """The pipeline as the scrapes show it. ``update`` takes a round of scrapes (one per agent, in
    the order the agents were given); ``views`` and ``verdict`` say what to draw."""

    def __init__(self, urls: Sequence[str], edges: Edges | None = None, window_s: float = WINDOW_S):
        self.urls = list(urls)
        self.edges = edges or Edges(None)
        self.window_s = window_s
        self.errors: dict[str, str] = {}  # agent URL -> what went wrong in the latest round
        self.reporting: dict[str, int] = {}  # agent URL -> nodes taken from it in the latest round
        self.at: float | None = None  # the latest round's time (Unix s)
        self.rounds = 0
        self._nodes: dict[str, _History] = {}

    def update(self, scrapes: Sequence[Scrape], now: float) -> None:
        self.edges.refresh()
        self.at, self.rounds = now, self.rounds + 1
        self.errors = {s.url: s.error for s in scrapes if s.error}
        taken: dict[str, NodeSample] = {}
        self.reporting = {}
        for s in scrapes:
            fresh = {k: v for k, v in s.nodes.items() if k not in taken}
            taken.update(fresh)
            if not s.error:
                self.reporting[s.url] = len(fresh)
        for history in self._nodes.values():
            history.reported = False
        for node_id, sample in taken.items():
            self._take(node_id, sample, now)
        for node_id in [n for n, h in self._nodes.items() if now - h.seen_at > FORGET_S]:
            if node_id not in self.edges.roles:
                del self._nodes[node_id]

    def _take(self, node_id: str, sample: NodeSample, now: float) -> None:
        history = self._nodes.setdefault(node_id, _History())
        history.sample, history.seen_at, history.reported = sample, now, True
        if "objects_received" in sample.values or "busy_ratio" in sample.values:
            history.figures, history.figures_at = sample.values, now
        fingerprint = (sample.state, *sorted(sample.values.items()))
        if fingerprint == history.fingerprint:
            return  # the same sample again: the agent has not sampled since
        history.fingerprint = fingerprint
        v = sample.values
        point = Point(
            t=now,
            busy=v.get("busy_ratio"),
            backpressured=v.get("backpressured_ratio"),
            idle=v.get("idle_ratio"),
            input_latency_ms=v.get("input_latency_p50_ms"),
            state=sample.state or "UP",
        )
        history.points.append((now, v.get("objects_received"), point))
        while history.points and history.points[0][0] < now - KEEP_S:
            history.points.popleft()

    def series(self) -> dict[str, list[Point]]:
        return {node_id: [p for _, _, p in h.points] for node_id, h in self._nodes.items()}

    def verdict(self) -> Verdict | None:
        """The verdict over the window ending at the latest round; None before the first round."""
        if self.at is None:
            return None
        return held_back_by(self.series(), self.edges.upstream, self.at, self.window_s)

    def views(self) -> list[NodeView]:
        """Every node known: reported by an agent, or named by the endpoints (not reported yet)."""
        out = []
        for node_id in sorted(set(self._nodes) | set(self.edges.roles) | _fed_by(self.edges.upstream)):
            h = self._nodes.get(node_id)
            sample = h.sample if h else None
            role = (sample.role if sample else "") or self.edges.roles.get(node_id, "")
            if sample is None or h is None:
                out.append(NodeView(node_id, role, None, None, None, None, None, None, False))
                continue
            v = sample.values
            if h.at_most(FIGURES_KEPT_S) and h.figures is not v:
                v = {**h.figures, **v}
            out.append(
                NodeView(
                    node_id,
                    role,
                    sample.state,
                    _rate(h.points) if h.reported else None,
                    v.get("busy_ratio"),
                    v.get("backpressured_ratio"),
                    v.get("idle_ratio"),
                    v.get("input_latency_p50_ms"),
                    h.reported,
                )
            )
        return out


def _fed_by(upstream: Mapping[str, Sequence[str]]) -> set[str]:
    return {u for ups in upstream.values() for u in ups}


def _rate(points: Sequence[tuple[float, float | None, Point]]) -> float | None:
    """Objects/s received: the counter's increase from the oldest point of the last RATE_SPAN_S
    (or the one just before, so that two points at least are used) to the latest."""
    counted = [(t, n) for t, n, _ in points if n is not None]
    if len(counted) < 2:
        return None
    t1, n1 = counted[-1]
    older = [(t, n) for t, n in counted[:-1] if t >= t1 - RATE_SPAN_S] or [counted[-2]]
    t0, n0 = older[0]
    if t1 <= t0 or n1 < n0:  # a restarted node's counter starts again: no rate until the next one
        return None
    return (n1 - n0) / (t1 - t0)
