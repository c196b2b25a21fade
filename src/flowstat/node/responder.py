"""The control protocol's answers (docs/control-protocol.md), for any node that can tell its figures.

A harness device and a user's node (flowstat.node.Node) are both a ``Figures``: they say their state
and counters, and the Responder turns a request into the reply, with the per-client rates, latched
overload flags and input latency the protocol defines. One implementation of the protocol for both.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Protocol

from flowstat.proc.procfs import vmrss_kb
from flowstat.timeutil import iso_utc_ms

from .latency import LatencyRecorder
from .phases import phase_fields
from .rates import Interval, RateTracker

log = logging.getLogger("flowstat.node")


class Figures(Protocol):
    """What a node tells the Responder. Read by the thread that answers: values, not promises."""

    node_id: str
    role: str
    run_id: str
    state: str
    receive_buffer_size: int | None
    send_buffer_size: int | None
    latency: LatencyRecorder | None  # nodes that take objects measure how long they waited
    started_at: float  # time.monotonic() at start

    def counters(self) -> dict[str, Any]: ...
    def merged_total(self) -> int: ...
    def phase_seconds(self) -> tuple[float, float, float] | None: ...  # busy, backpressured, idle; None: not accounted
    def average_merge_time(self) -> float | None: ...
    def merges_apply(self) -> bool: ...  # merged_objects_per_second is a number (else null)
    def send_overloaded(self) -> bool: ...
    def receive_overloaded(self) -> bool: ...
    def overload_events(self) -> tuple[int, int]: ...  # episodes so far: on sends, on the input
    def on_metrics_request(self, request: dict[str, Any]) -> None: ...
    def on_start(self) -> None: ...
    def request_stop(self) -> None: ...
    def clock(self) -> float: ...  # the node's wall clock (Unix s): what it stamps objects and waits with


class Responder:
    """Answers one node's control requests; keeps its clients' baselines and its refusals."""

    def __init__(self, figures: Figures):
        self.figures = figures
        self.rates = RateTracker()
        self.control_errors = 0

    def answer(
        self, client: bytes, command: str | None, request: dict[str, Any] | None, error: str | None
    ) -> dict[str, Any]:
        f = self.figures
        received = iso_utc_ms()
        received_s = f.clock()
        if error is None and command == "clock":  # a round of an NTP-style offset measurement
            assert request is not None
            reply: dict[str, Any] = {"command": command, "node_id": f.node_id, "received_s": received_s}
            if isinstance(request.get("id"), (int, str)):
                reply["id"] = request["id"]
            reply["sent_s"] = f.clock()
            return reply
        if error is None:
            if command == "get-metrics":
                assert request is not None
                reply = self.metrics(client, request)
            else:
                if command == "start":
                    f.on_start()
                elif command == "stop":
                    f.request_stop()
                reply = self.state_fields()
            reply["command"] = command
        else:
            self.control_errors += 1
            log.warning("%s: control request refused: %s", f.node_id, error)
            reply = {"command": command, "node_id": f.node_id, "error": error}
        if request is not None and isinstance(request.get("id"), (int, str)):
            reply["id"] = request["id"]  # lets an asynchronous client match replies to requests
        reply["request_timestamp"] = received
        reply["response_timestamp"] = iso_utc_ms()
        return reply

    def metrics(self, client: bytes, request: dict[str, Any]) -> dict[str, Any]:
        f = self.figures
        f.on_metrics_request(request)
        phases = f.phase_seconds()
        since = self.rates.interval(client, f.merged_total(), f.overload_events(), phases)
        reply = self.state_fields(since)
        try:
            rss: int | None = vmrss_kb()
        except (OSError, ValueError):
            rss = None
        reply.update(
            {
                "average_merge_time": f.average_merge_time(),
                "VmRSS": rss,
                "cpu_clock": round(since.cpu_hz, 1),
                "merged_objects_per_second": round(since.merged_per_second, 3) if f.merges_apply() else None,
                "role": f.role,
                "run_id": f.run_id,
                "uptime_s": round(time.monotonic() - f.started_at, 3),
                "control_errors": self.control_errors,
                **f.counters(),
            }
        )
        if phases is not None:
            reply.update(phase_fields(phases, since.phase_shares))
        if f.latency is not None:
            reply.update(f.latency.interval(client))
        return reply

    def state_fields(self, since: Interval | None = None) -> dict[str, Any]:
        """The node's state; its overload flags say whether a buffer is overloaded now, and, given
        the client's interval (get-metrics), whether one was at any moment of it."""
        f = self.figures
        return {
            "command": None,
            "node_id": f.node_id,
            "node_state": f.state,
            "PID": os.getpid(),
            "request_timestamp": None,
            "response_timestamp": None,
            "receive_buffer_size": f.receive_buffer_size,
            "receive_buffer_overloaded": f.receive_overloaded() or bool(since and since.receive_overloads),
            "send_buffer_size": f.send_buffer_size,
            "send_buffer_overloaded": f.send_overloaded() or bool(since and since.send_overloads),
        }
