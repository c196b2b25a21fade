"""What every device shares: its control socket, state, counters, and the talk with the orchestrator.

A device writes JSON lines on stdout for the orchestrator (``ready`` once bound, ``final`` with its
totals before it exits) and logs on stderr.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from flowstat.node import curve
from flowstat.node.latency import LatencyRecorder
from flowstat.node.phases import BUSY, IDLE, PhaseClock, PhaseTotals
from flowstat.node.protocol import serve_requests
from flowstat.node.responder import Responder
from flowstat.proc.procfs import die_with_parent, raise_fd_limit

from ..launch import BIND_NODE_ADDRESS, host_name, node_address
from .clock import WallClock

log = logging.getLogger("flowstat.device")

# When the orchestrator dies, the kernel stops every device at once (PDEATHSIG): a merger may be
# gone before its producers' last objects arrive, and nobody is left to send SIGUSR1. An orphaned
# device keeps trying to reach its downstream this long, then gives up (no orphan lingers).
ORPHAN_GRACE_S = 5.0


class Device:
    """Base of producer, merger and viewer processes: a flowstat.node Figures, answered by the
    node library's Responder from the device's own poll loop (one thread, no locks on the hot path)."""

    role = "node"

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.node_id: str = config["node_id"]
        self.run_id: str = config.get("run_id", "")
        self.wall = WallClock(self.node_id)
        self.host: str = config.get("host", "127.0.0.1")
        if self.host == BIND_NODE_ADDRESS:  # a job step on some host of a cluster: that host's address
            self.host = node_address()
        self.state = "STARTING"
        self.stop_requested = False
        self.abandon = False  # stop without waiting for downstream (it is gone): SIGUSR1
        self.parent_pid = os.getppid()  # the orchestrator: when it is gone, we are reparented
        self.orphaned_since: float | None = None
        self.ctx = zmq.Context()
        self.ctx.setsockopt(zmq.LINGER, 60_000)  # let queued objects go at exit, but never hang forever
        self.ctx.set(zmq.MAX_SOCKETS, 65536)
        self.guard: curve.Guard | None = None
        self.node_keys: tuple[bytes, bytes] | None = None  # CURVE: this node's pair, when the run is secured
        self.client_pair: tuple[bytes, bytes] | None = None  # and the pair it connects to others' data with
        self.curve_data = bool(config.get("curve_data"))
        if config.get("curve_keys"):
            self._load_keys(Path(config["curve_keys"]))
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.setsockopt(zmq.LINGER, 0)
        self.serve_securely(self.control)
        self.control_endpoint = self.bind(self.control, config.get("control_port", 0))
        self.started_at = time.monotonic()
        self.receive_buffer_size: int | None = None
        self.send_buffer_size: int | None = None
        self.responder = Responder(self)
        # where the device's one thread spends its time (issue 46): idle in its poll for input,
        # backpressured while a send is refused, busy otherwise (flowstat.node.phases)
        self.phases = PhaseClock()
        self._phase_totals = PhaseTotals()
        self.data_endpoint: str | None = None
        self.latency: LatencyRecorder | None = None  # nodes that take objects measure how long they waited

    # -- set-up ---------------------------------------------------------------------------------
    def _load_keys(self, folder: Path) -> None:
        """The run's keys (flowstat.node.curve); unreadable ones stop the device before it binds
        anything (CurveError names the file): a secured run never falls back to the clear."""
        public, secret, client = curve.node_keys(folder)
        self.node_keys = (public, secret)
        if self.curve_data:
            self.client_pair = curve.client_keys(folder / f"{curve.CLIENT}.key_secret")
        self.guard = curve.Guard(self.ctx, client, self.node_id)

    def serve_securely(self, sock: zmq.Socket) -> None:
        """A socket this node binds: a CURVE server when the run is secured (before bind)."""
        if self.node_keys is not None and self.guard is not None:
            curve.secure_server(sock, *self.node_keys)
            self.guard.watch(sock)

    def secure_data(self, sock: zmq.Socket, bound: bool) -> None:
        """A data socket: secured when the topology secures data (before bind or connect). The
        socket another node binds answers with the run's node key; this node connects with the run's
        client pair."""
        if not self.curve_data:
            return
        if bound:
            self.serve_securely(sock)
        elif self.node_keys is not None and self.client_pair is not None:
            curve.secure_client(sock, self.node_keys[0], self.client_pair)

    def bind(self, sock: zmq.Socket, port: int = 0) -> str:
        """Bind on the configured host (loopback by default); port 0 picks a free one."""
        if port:
            sock.bind(f"tcp://{self.host}:{port}")
        else:
            sock.bind(f"tcp://{self.host}:*")
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def emit(self, event: str, **fields: Any) -> None:
        """One JSON line to the orchestrator. A vanished orchestrator is not an error."""
        if event == "ready":  # where it runs: under srun the orchestrator's child is srun, not the device
            fields = {"pid": os.getpid(), "host": host_name(), **fields}
        try:
            sys.stdout.write(json.dumps({"event": event, "node_id": self.node_id, **fields}) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            pass

    def install_signals(self) -> None:
        # SIGTERM (from the orchestrator, or from the kernel when the orchestrator dies) stops
        # gracefully; Ctrl-C is the orchestrator's to handle, the devices are in their own session.
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        # Standard signals do not queue, so "give up on downstream" needs a signal of its own.
        signal.signal(signal.SIGUSR1, lambda *_: self.request_stop(abandon=True))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent(signal.SIGTERM)

    def downstream_abandoned(self) -> bool:
        """Whether to stop waiting for downstream: SIGUSR1 said so, or the orchestrator is gone and
        downstream has had ORPHAN_GRACE_S to take what we still hold."""
        if self.abandon or os.getppid() == self.parent_pid:
            return self.abandon
        now = time.monotonic()
        if self.orphaned_since is None:
            self.orphaned_since = now
        elif now - self.orphaned_since >= ORPHAN_GRACE_S:
            log.error(
                "%s: the orchestrator is gone and downstream has not taken our last data for %.0f s: "
                "giving up on it",
                self.node_id,
                ORPHAN_GRACE_S,
            )
            self.abandon = True
        return self.abandon

    def linger_ms(self) -> int | None:
        """How long a data socket may hold unsent messages at close: none once downstream is
        abandoned, the grace while orphaned, else the context's (60 s)."""
        if self.abandon:
            return 0
        return int(ORPHAN_GRACE_S * 1000) if os.getppid() != self.parent_pid else None

    def clock(self) -> float:
        """The device's wall clock (its host's, or shifted: devices.clock)."""
        return self.wall.now()

    def request_stop(self, abandon: bool = False) -> None:
        self.stop_requested = True
        self.abandon = self.abandon or abandon

    # -- control channel ------------------------------------------------------------------------
    def serve_control(self) -> None:
        serve_requests(self.control, self.responder.answer)

    def answer(self, client: bytes, command: str | None, request: dict | None, error: str | None) -> dict:
        """One request's reply, as the control socket would send it (tests ask devices directly)."""
        return self.responder.answer(client, command, request, error)

    def receive_until(
        self,
        data: zmq.Socket,
        read: Callable[[], None],
        done: Callable[[], bool],
        every_turn: Callable[[], None] | None = None,
        poll_ms: int = 200,
    ) -> None:
        """Report ready, then answer control requests and read ``data`` until ``done()`` or a stop."""
        self.state = "RUNNING"
        self.emit("ready", control=self.control_endpoint, data=self.data_endpoint)
        poller = zmq.Poller()
        poller.register(data, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        while not done() and not self.stop_requested:
            # idle only when the poll waits: input already there means work. (A busy process is
            # mostly preempted at its next system call, the poll: timed as idle, the time it waited
            # for a CPU would hide that it had work; a node sharing its CPU looked 88% busy at 100%.)
            events = dict(poller.poll(0))
            if not events:
                self.enter(IDLE)  # waiting for input
                events = dict(poller.poll(poll_ms))
            if self.control in events:
                self.serve_control()
            if data in events:
                self.enter(BUSY)
                read()
            if every_turn is not None:
                every_turn()

    def on_start(self) -> None:
        """What a start request does (see Producer)."""

    # -- overridden by devices ------------------------------------------------------------------
    def on_metrics_request(self, request: dict) -> None:
        """What a get-metrics request tells the node before it answers (see Merger)."""

    def counters(self) -> dict[str, Any]:
        return {}

    def merged_total(self) -> int:
        return 0

    def phase_seconds(self) -> tuple[float, float, float] | None:
        return self._phase_totals.read([self.phases])

    def enter(self, phase: int) -> None:
        """The device's thread is in ``phase`` from now (BUSY, BACKPRESSURED or IDLE)."""
        if self.phases.phase != phase:
            self.phases.enter(phase)

    def average_merge_time(self) -> float | None:
        return None

    def merges_apply(self) -> bool:
        return self.role == "merger"

    def send_overloaded(self) -> bool:
        return False

    def overload_events(self) -> tuple[int, int]:
        """Overload episodes so far: on sends, on the input (each counts once, however long)."""
        return 0, 0

    def receive_overloaded(self) -> bool:
        return False

    def run(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        self.control.close(0)
        if self.guard is not None:
            self.guard.close()
        self.ctx.term()


def configure_logging(node_id: str) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s {node_id} %(levelname)s %(message)s"
    )
    raise_fd_limit()
