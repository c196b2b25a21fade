"""flowstat's control channel for a node of the user's own pipeline.

    from flowstat.node import Node

    node = Node("merger-0", "merger", run_id="night-7")   # answers on its own thread
    ...
    node.waiting(); frame = sock.recv()                   # idle until the input comes
    node.received(1, len(frame), sent_at=stamp)           # an object taken, stamped by its sender
    t0 = time.perf_counter(); merge(); node.merged(n, time.perf_counter() - t0)
    node.sending()                                        # a send that waits is backpressure
    try: sock.send(out, zmq.NOBLOCK); node.sent(1, len(out))
    except zmq.Again: node.send_refused()                 # the buffer is full: an overload episode
    ...
    node.close()                                          # STOPPED; its endpoint file withdrawn

Counting is a few attribute updates on the caller's thread, and each thread's time is accounted as
busy, backpressured or idle (flowstat.node.phases); a thread of the library's answers
check-state and get-metrics (docs/control-protocol.md) with the same fields, units and per-client
rates as flowstat's harness nodes, so agents, stores, dashboards, alerts and reports treat the node
as one of theirs. Each thread that counts uses its own Tally (``node.tally()``; the node's methods
are its first thread's): a Tally is written by one thread and read by the control thread, never
locked on the node's path.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import zmq

from . import curve
from .announce import announce, directory, withdraw
from .latency import LatencyRecorder, _numpy
from .phases import BACKPRESSURED, BUSY, IDLE, PhaseClock, PhaseTotals
from .protocol import serve_requests
from .responder import Responder

log = logging.getLogger("flowstat.node")

STATES = ("STARTING", "READY", "RUNNING", "DRAINING", "STOPPED")
FINAL_REPORT_MAX_S = 5.0  # the longest close() waits for an agent to take the final counters
FINAL_REPORT_SLACK_S = 1.0  # how late past its interval an agent's next request may be: a loaded host
MERGES_AVERAGED = 10  # average_merge_time: the mean of the last this many merges (thesis section 4.2.3)
_ONE_STAMP = (float, int)  # numpy's float64 is a float
# Waits kept before they are bucketed: bucketing costs a few numpy calls per chunk whatever its size
# (about 10 us), and the control thread records what is left whenever a monitor asks.
WAITS_CHUNK = 4096
# The most upstream nodes one node counts apart (received(source=...)): a reply and a store hold a
# counter per source, and a source id made per message (an address with its port, say) would grow
# them without end. Past this many, a new source's objects count in the totals only.
MAX_SOURCES = 256


class Tally(PhaseClock):
    """What one thread of a node tells: counts, merges, overload episodes, waits, and where its
    time goes (a PhaseClock: each call below that changes the phase reads the clock once). Written
    only by that thread; read by the control thread (ints and floats: no torn reads in CPython)."""

    def __init__(self, latency_every: int = 1) -> None:
        super().__init__()
        self.latency_every = latency_every  # the stamps of one call in this many are measured (Node's)
        self._calls_to_skip = 0  # stamped calls to pass over before the next one measured
        self.objects_received = 0
        self.bytes_received = 0
        self.objects_sent = 0
        self.bytes_sent = 0
        self.objects_merged = 0
        self.merges = 0
        self.send_overload_events = 0
        self.receive_overload_events = 0
        self.send_blocked = False
        self.backlogged = False
        self.merge_ms: collections.deque[float] = collections.deque(maxlen=MERGES_AVERAGED)
        self.waits: list[float] = []  # told one by one, recorded WAITS_CHUNK at a time (record_waits)
        self._drain = threading.Lock()  # never taken by the counting thread but once per chunk
        self.latency: LatencyRecorder | None = None  # the node's, set by Node
        self.received_from: dict[str, int] = {}  # objects by the upstream node that sent them
        self.sources_refused = 0  # calls whose source was past MAX_SOURCES (counted in the totals only)

    def received(
        self,
        objects: int = 1,
        nbytes: int = 0,
        sent_at: float | Sequence[float] | None = None,
        source: str | None = None,
    ) -> None:
        """Objects taken from the input; ``sent_at`` the Unix time their sender stamped on them, when
        the pipeline carries one (one stamp, or a batch's: a sequence or a numpy array): the input
        latency is now minus that, for the stamps of one such call in ``latency_every`` (Node's).
        Every object is then measured with the same chance, one in ``latency_every``, whatever
        the size of its read: the percentiles are the stream's, from a sample. ``source``: the id of
        the upstream node that sent them, where a PULL socket takes from several and the rate of
        each edge matters (a PUSH cannot tell which peer took a message, so edges are counted
        where objects arrive; get-metrics' received_from). The node is busy from here."""
        if self.phase:
            self.enter(BUSY)
        self.objects_received += objects
        self.bytes_received += nbytes
        if source is not None:
            counts = self.received_from
            got = counts.get(source)
            if got is not None:
                counts[source] = got + objects
            else:
                self._first_from(source, objects)
        if sent_at is None:
            return
        if self._calls_to_skip:  # passing over a call costs one test; measuring one, 65 ns a stamp
            self._calls_to_skip -= 1
            return
        self._calls_to_skip = self.latency_every - 1
        waits = self.waits
        if isinstance(sent_at, _ONE_STAMP):  # tested, not caught: a raised exception costs a microsecond
            waits.append(time.time() - sent_at)
        elif (np := _numpy()) is not None and isinstance(sent_at, np.ndarray):
            # a vectorised node's batch: its waits in one subtraction, kept with the others (bucketing
            # a small batch at once costs some ten numpy calls, about 12 us)
            waits.extend((time.time() - sent_at.astype(np.float64, copy=False)).tolist())
        else:  # a batch's stamps, taken now
            now = time.time()
            waits.extend([now - s for s in sent_at])
        if len(waits) >= WAITS_CHUNK:
            self.record_waits()

    def _first_from(self, source: str, objects: int) -> None:
        """A source not seen before (checked here, once, not on every call)."""
        if not isinstance(source, str) or not source:
            raise ValueError(f"received(source=...): the id of the upstream node, a non-empty string, not {source!r}")
        if len(self.received_from) >= MAX_SOURCES:
            if not self.sources_refused:
                log.warning("received(source=%r): past %d sources, counted in the totals only", source, MAX_SOURCES)
            self.sources_refused += 1
            return
        self.received_from = {**self.received_from, source: objects}  # replaced: the control thread iterates

    def sent(self, objects: int = 1, nbytes: int = 0) -> None:
        """Objects sent downstream (a send that went through ends an overload episode, and
        backpressure: the node is busy from here)."""
        if self.phase:
            self.enter(BUSY)
        self.objects_sent += objects
        self.bytes_sent += nbytes
        self.send_blocked = False

    def merged(self, objects: int, seconds: float) -> None:
        """A merge of ``objects`` objects that took ``seconds`` (the node is busy from here)."""
        if self.phase:
            self.enter(BUSY)
        self.merges += 1
        self.objects_merged += objects
        self.merge_ms.append(seconds * 1e3)

    def send_refused(self) -> None:
        """A send refused because the buffer is full: an overload episode begins (once, however
        many retries), until the next send that goes through. The node is backpressured from here:
        held by its downstream."""
        if self.phase != BACKPRESSURED:
            self.enter(BACKPRESSURED)
        if not self.send_blocked:
            self.send_blocked = True
            self.send_overload_events += 1

    def waiting(self) -> None:
        """The node begins to wait for input (before a blocking receive, or a poll): idle until the
        next ``received``. Only the node knows when it starts to wait, hence this call."""
        if self.phase != IDLE:
            self.enter(IDLE)

    def sending(self) -> None:
        """A send begins: backpressured until ``sent`` (a blocking send that waits is held by the
        downstream as a refused one is; the library sees only its end, hence this call)."""
        if self.phase != BACKPRESSURED:
            self.enter(BACKPRESSURED)

    def input_backlog(self, backlogged: bool) -> None:
        """Whether the input had work waiting after a read cycle; an episode begins on each change
        to True."""
        if backlogged and not self.backlogged:
            self.receive_overload_events += 1
        self.backlogged = backlogged

    def record_waits(self) -> None:
        """Move the waits told so far into the latency distribution (either thread may). The counting
        thread only appends to ``waits``; this takes its head and deletes it, each one step under the
        GIL, so an append made meanwhile stays for the next time."""
        if self.latency is None:
            return
        with self._drain:
            waits = self.waits
            n = len(waits)
            if not n:
                return
            chunk = waits[:n]
            del waits[:n]
        self.latency.record_waits(chunk)


class Node:
    """A node of the user's pipeline, monitored by flowstat (see the module's text)."""

    def __init__(
        self,
        node_id: str,
        role: str = "other",
        *,
        run_id: str = "",
        bind: str = "tcp://127.0.0.1:*",
        endpoints_dir: str | os.PathLike[str] | None = None,
        receive_buffer_size: int | None = None,
        send_buffer_size: int | None = None,
        on_stop: Callable[[], None] | None = None,
        on_start: Callable[[], None] | None = None,
        curve_keys: str | os.PathLike[str] | None = None,
        latency_every: int = 1,
        upstream: Sequence[str] = (),
    ):
        if not node_id:
            raise ValueError("a node needs an id (its samples' node_id)")
        if not isinstance(latency_every, int) or latency_every < 1:
            raise ValueError(f"latency_every: a whole number of calls, 1 or more, not {latency_every!r}")
        self.latency_every = latency_every
        if isinstance(upstream, str) or not all(isinstance(u, str) and u for u in upstream):
            raise ValueError(f"upstream: the node ids that feed this node, a list of strings, not {upstream!r}")
        self.upstream = tuple(upstream)
        self.node_id, self.role, self.run_id = node_id, role, run_id
        self.receive_buffer_size, self.send_buffer_size = receive_buffer_size, send_buffer_size
        self.started_at = time.monotonic()
        self.latency: LatencyRecorder | None = LatencyRecorder()
        self._state = "RUNNING"
        self._stop = threading.Event()
        self._on_stop, self._on_start = on_stop, on_start
        self._tallies: list[Tally] = []
        first = self.tally()
        # the first thread's counting is the node's own: bound methods, no extra call
        self.received, self.sent, self.merged = first.received, first.sent, first.merged
        self.send_refused, self.input_backlog = first.send_refused, first.input_backlog
        self.waiting, self.sending = first.waiting, first.sending
        self._phase_totals = PhaseTotals()
        self.responder = Responder(self)
        self.endpoint: str | None = None
        self.endpoint_file: Path | None = None
        self._closing = threading.Event()
        self._asked_at: list[float] = []  # the last two get-metrics requests (monotonic s)
        self._told_stopped = threading.Event()  # a get-metrics answered once the node was STOPPED
        self._wake: zmq.Socket[bytes] | None = None  # close()'s end of an inproc pair: ends the control thread
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._guard: curve.Guard | None = None
        self.curve_server_key: str | None = None
        self._open_control(bind, endpoints_dir, curve.keys_from_env(curve_keys))

    # -- what the node tells ---------------------------------------------------------------------
    def tally(self) -> Tally:
        """A Tally for another thread of this node (each counting thread needs its own)."""
        t = Tally(self.latency_every)
        t.latency = self.latency
        self._tallies = [*self._tallies, t]  # replaced, not appended: the control thread iterates
        return t

    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        if value not in STATES:
            raise ValueError(f"node state {value!r}: one of {', '.join(STATES)}")
        self._state = value

    @property
    def stop_requested(self) -> bool:
        """Whether a monitor sent `stop` (the node should end as on SIGTERM)."""
        return self._stop.is_set()

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        return self._stop.wait(timeout)

    # -- the control thread ----------------------------------------------------------------------
    def _open_control(self, bind: str, endpoints_dir: str | os.PathLike[str] | None, keys: Path | None) -> None:
        """Bind and start answering; a node that cannot bind, or cannot read the keys it was given,
        says why and runs on unmonitored (never in the clear when keys were asked for)."""
        secured = None
        if keys is not None:
            try:
                secured = curve.node_keys(keys)
            except curve.CurveError as exc:
                log.warning("%s: cannot secure the control channel (%s): running unmonitored", self.node_id, exc)
                return
        elif not curve.is_loopback(bind):
            log.warning(
                "%s: the control channel binds %s without CURVE: anyone who reaches it may ask and stop "
                "(give curve_keys, or $%s)",
                self.node_id,
                bind,
                curve.ENV_KEYS,
            )
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 0)  # a client that does not read loses its reply; we never wait
        if secured is not None:
            public, secret, client = secured
            self._guard = curve.Guard(self._ctx, client, self.node_id)
            curve.secure_server(sock, public, secret)
            self._guard.watch(sock)
            self.curve_server_key = public.decode()
        try:
            sock.bind(bind)
        except zmq.ZMQError as exc:
            log.warning("%s: cannot bind the control channel on %s (%s): running unmonitored", self.node_id, bind, exc)
            sock.close(0)
            self._close_context()
            return
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        folder = directory(endpoints_dir)
        if folder is not None:
            node = {
                "node_id": self.node_id,
                "role": self.role,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "control": self.endpoint,
            }
            if self.curve_server_key is not None:
                node["curve_server_key"] = self.curve_server_key
            if self.upstream:
                node["upstream"] = list(self.upstream)
            try:
                self.endpoint_file = announce(folder, node, self.run_id)
            except (OSError, ValueError) as exc:
                log.warning(
                    "%s: cannot announce itself in %s (%s): agents must be told its endpoint", self.node_id, folder, exc
                )
        # the control thread sleeps until a request or close() comes: no timed wake-ups, which cost an
        # idle node 1.5 ms of CPU a second (10 a second), 1% of a node that takes 100,000 messages a second
        woken, self._wake = curve.wake_pair(self._ctx, self)
        self._thread = threading.Thread(
            target=self._serve, args=(sock, woken), name=f"flowstat-node {self.node_id}", daemon=True
        )
        self._thread.start()

    def _serve(self, sock: zmq.Socket[bytes], woken: zmq.Socket[bytes]) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(woken, zmq.POLLIN)
        try:
            while not self._closing.is_set():
                if sock in dict(poller.poll()):
                    serve_requests(sock, self._answer)
        finally:
            sock.close(0)
            woken.close(0)

    def _answer(
        self, client: bytes, command: str | None, request: dict[str, Any] | None, error: str | None
    ) -> dict[str, Any]:
        if command == "get-metrics":
            for t in self._tallies:
                t.record_waits()
            self._asked_at = [*self._asked_at[-1:], time.monotonic()]
            stopped = self._state == "STOPPED"  # read before the reply: the reply says at least this
            reply = self.responder.answer(client, command, request, error)
            if stopped:
                self._told_stopped.set()
            return reply
        return self.responder.answer(client, command, request, error)

    # -- Figures (flowstat.node.responder) -------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        tallies = self._tallies
        names = (
            "objects_received",
            "bytes_received",
            "objects_sent",
            "bytes_sent",
            "objects_merged",
            "merges",
            "send_overload_events",
            "receive_overload_events",
        )
        out: dict[str, Any] = {n: sum(getattr(t, n) for t in tallies) for n in names}
        if any(t.received_from for t in tallies):
            by_source: collections.Counter[str] = collections.Counter()
            for t in tallies:
                by_source.update(dict(t.received_from))  # a copy: its thread goes on counting
            out["received_from"] = dict(sorted(by_source.items()))
        return out

    def merged_total(self) -> int:
        return sum(t.objects_merged for t in self._tallies)

    def phase_seconds(self) -> tuple[float, float, float] | None:
        return self._phase_totals.read(self._tallies)

    def average_merge_time(self) -> float | None:
        times = [ms for t in self._tallies for ms in list(t.merge_ms)]
        return round(sum(times) / len(times), 3) if times else None

    def merges_apply(self) -> bool:
        return self.role == "merger" or any(t.merges for t in self._tallies)

    def send_overloaded(self) -> bool:
        return any(t.send_blocked for t in self._tallies)

    def receive_overloaded(self) -> bool:
        return any(t.backlogged for t in self._tallies)

    def overload_events(self) -> tuple[int, int]:
        tallies = self._tallies
        return sum(t.send_overload_events for t in tallies), sum(t.receive_overload_events for t in tallies)

    def on_metrics_request(self, request: dict[str, Any]) -> None:
        pass

    def on_start(self) -> None:
        if self._state == "READY":
            self._state = "RUNNING"
        if self._on_start is not None:
            self._on_start()

    def clock(self) -> float:
        """The wall clock the node's stamps and waits are read from (the control channel's clock)."""
        return time.time()

    def request_stop(self) -> None:
        self._stop.set()
        if self._on_stop is not None:
            self._on_stop()

    # -- the end ---------------------------------------------------------------------------------
    def close(self) -> None:
        """A clean stop: STOPPED, its final counters told, the endpoint file withdrawn (an agent reports
        the node STOPPED, not DOWN), the control thread ended.

        A node an agent has been asking waits for one more request, so that its STOPPED sample carries
        its final counts rather than those of up to an interval before: one interval after the last
        request and one more, or a second (FINAL_REPORT_SLACK_S) if that is longer, for an agent
        a loaded host makes late (FINAL_REPORT_MAX_S at most; a node not asked twice does not wait)."""
        self._state = "STOPPED"
        self._wait_to_tell_the_end()
        withdraw(self.endpoint_file)
        self.endpoint_file = None
        self._closing.set()
        if self._wake is not None:
            try:
                self._wake.send(b"", zmq.NOBLOCK)  # never blocks: the pair's pipe holds it
            except zmq.Again:  # the thread, awake, saw _closing and closed its end first: none to wake
                pass
            if self._thread is not None:
                self._thread.join()
            self._wake.close(0)
            self._wake = None
        self._thread = None
        self._close_context()

    def _wait_to_tell_the_end(self) -> None:
        asked = self._asked_at
        if self._thread is None or len(asked) < 2:  # not asked at an interval: nobody to wait for
            return
        period = asked[-1] - asked[0]
        deadline = asked[-1] + period + max(period, FINAL_REPORT_SLACK_S)  # the next request, or a late one
        self._told_stopped.wait(max(0.0, min(deadline - time.monotonic(), FINAL_REPORT_MAX_S)))

    def _close_context(self) -> None:
        if self._guard is not None:
            self._guard.close()
            self._guard = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
