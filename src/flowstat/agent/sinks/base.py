"""The interface every sink implements, the registry of sinks by URL scheme, and the thread that
delivers to one sink with its spool."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from types import EllipsisType
from typing import ClassVar
from urllib.parse import SplitResult

from flowstat.schema import agent as agent_schema
from flowstat.schema import flow as flow_schema
from flowstat.schema import run as run_schema
from flowstat.schema import sample as sample_schema
from flowstat.stores import Outcome

from .. import memory
from ..spool import SEND_MAX_BYTES, Spool

log = logging.getLogger("flowstat.agent")


class SinkDown(Exception):
    """The sink cannot take data now: keep it and retry. ``trouble`` says why: down (connection
    refused, 5xx, timeout), auth (the store refuses the credentials: 401), forbidden (the user may
    not write there: 403), tls (its certificate is not trusted) (docs/security.md)."""

    def __init__(self, why: str, trouble: str = "down", timed_out: bool = False):
        super().__init__(why)
        self.trouble = trouble
        self.timed_out = timed_out  # the sink took the request and gave no answer in time


# What an agent says as each trouble ends (the C agent says the same: collectors/c/agent/delivery.c).
TROUBLE_OVER = {
    "auth": "the credentials work now",
    "forbidden": "it may be written now",
    "tls": "its certificate is trusted now",
}


class SinkRejected(Exception):
    """The sink refused the data itself (4xx): retrying cannot help."""


class SinkURLError(ValueError):
    """A sink URL that names no sink, or lacks what its sink needs; the message says which."""


class Sink:
    """One destination. ``encode`` turns samples into the bytes ``send`` delivers in one go."""

    scheme: str = ""  # a store sink's instance names its store (influxdb, elasticsearch)
    format = "line"  # line (InfluxDB line protocol) or json (one JSON document a line)
    reliable: ClassVar[bool] = True  # a successful send means the data arrived (not so for UDP)
    spooled: ClassVar[bool] = True  # kept on disk while down (not stdout: it is never "down" for long)

    def __init__(self, url: str):
        self.url = url

    @classmethod
    def from_url(cls, url: str, parts: SplitResult, query: dict[str, str]) -> Sink:
        """The sink a URL of this scheme names; SinkURLError says what is missing."""
        raise NotImplementedError

    def configure(self, timeout_s: float | None = None, node_backoff_s: float | None = None) -> None:
        """The agent's --sink-timeout (an HTTP sink's request time-out) and --node-backoff (how long a
        store's node that failed is left alone); None: the default. Only store sinks take them."""

    def longest_send_s(self) -> float:
        """The longest one send may block (TCP's 3 s, an HTTP store's time-out, once a node)."""
        return 5.0

    def encode(self, samples: Iterable[dict]) -> bytes:
        encode = sample_schema.to_line_protocol if self.format == "line" else sample_schema.to_json
        return "".join(encode(s) + "\n" for s in samples).encode()

    def encode_self_samples(self, docs: Iterable[dict]) -> bytes:
        """The agent's self-samples (flowstat.schema.agent), as ``encode`` does samples."""
        encode = agent_schema.to_line_protocol if self.format == "line" else agent_schema.to_json
        return "".join(encode(d) + "\n" for d in docs).encode()

    def encode_edges(self, docs: Iterable[dict]) -> bytes:
        """Edge counters (flowstat.schema.flow's counter points), as ``encode`` does samples."""
        return "".join(
            (flow_schema.to_line_protocol("edge", d) if self.format == "line" else flow_schema.to_json("edge", d))
            + "\n"
            for d in docs
        ).encode()

    def encode_run(self, doc: dict) -> bytes:
        """A run document (flowstat.schema.run): its flowstat_run point, or the document itself in
        JSON (Logstash's pipeline routes it to flowstat-runs)."""
        text = run_schema.to_line_protocol(doc) if self.format == "line" else json.dumps(doc, separators=(",", ":"))
        return (text + "\n").encode()

    def send(self, payload: bytes, count: int) -> Outcome | None:
        """Deliver ``count`` samples. None: all taken. An Outcome: what a store took, refused and
        wants again later. Raises SinkDown (keep it, retry) or SinkRejected (all refused)."""
        raise NotImplementedError

    def failovers(self) -> int:
        """Times the sink moved its requests to another of its nodes (a store with a list of nodes)."""
        return 0

    def drain(self, deadline: float) -> None:
        """At exit, after the last batch was sent: a pull sink (prometheus://) waits here, until
        ``deadline`` (time.monotonic()) at the latest, for its final samples to be taken."""

    def close(self) -> None:
        pass


ONE_NODE = "takes one HOST:PORT, not a list (elasticsearch:// takes a list of nodes)"  # as the C agent says


def host_port(url: str, parts: SplitResult, default_port: int | None = None) -> tuple[str, int]:
    if "," in parts.netloc:
        raise SinkURLError(f"{url}: {ONE_NODE}")
    try:
        port = parts.port or default_port
    except ValueError as exc:
        raise SinkURLError(f"{url}: bad port") from exc
    if not parts.hostname or not port:
        raise SinkURLError(f"{url}: needs HOST:PORT")
    return parts.hostname, port


class SinkRunner(threading.Thread):
    """Delivers batches to one sink in order, on a thread of its own (a sink that hangs never
    delays sampling), through its spool when it has one.

    With a spool, each batch is written there as it is submitted (write-ahead: an agent killed
    while its sink hangs leaves what it sampled on disk, for the next one to send), and leaves it
    once the sink took it; else, or when the spool cannot be written, it is queued in memory. While
    the sink is down, the spool is tried again every ``retry_s``: a sink that is down is not asked
    at every tick. At stop, what is still queued or written ahead gets max(drain_s, 5 s) to go (then
    it stays spooled, unsent), and a sink that is down gets ``drain_s`` more to take the spool; what
    it has not taken stays there for the next start.
    """

    QUEUED_AT_STOP_S = 5.0  # at least this long for the queued batches at stop, however short drain_s
    SEND_MAX_BYTES = SEND_MAX_BYTES  # spooled batches sent together, at most (see spool.py)
    BACKLOG_EVERY = 8  # the backlog's request, at least every this many while fresh batches wait

    def __init__(
        self,
        sink: Sink,
        spool: Spool | None,
        retry_s: float = 1.0,
        drain_s: float = 0.0,
        send_max_bytes: int = SEND_MAX_BYTES,
        fresh_first: bool = True,
    ):
        super().__init__(daemon=True, name=f"sink-{sink.scheme}")
        self.sink, self.spool, self.retry_s, self.drain_s = sink, spool, retry_s, drain_s
        self.send_max_bytes = send_max_bytes
        # What goes together now: halved at each send the sink took and did not answer in time (a
        # request too big to be answered within the time-out would otherwise be sent again as it
        # is, forever), kept while the sink catches up, send_max_bytes again once nothing waits.
        # 0: one batch.
        self._send_limit = send_max_bytes
        self._backlog = False  # the sink was found down since it last caught up (_caught_up)
        # Batches numbered from _fresh_from on were written after the sink was last found down (or
        # after the runner started, behind what an earlier one left): they go first, the backlog
        # when none waits, so that what is sampled after an outage is stored at once, whatever the
        # store can take beside it; the backlog gets a request at least every BACKLOG_EVERY
        # (_fresh_run: fresh requests in a row), so that live batches that never run out cannot
        # stop it (the C agent's delivery.h). fresh_first=False: in order, always (a run document
        # sent at the end of a run must not go before the one sent at its start, still spooled:
        # the same document id).
        self._fresh_first = fresh_first and spool is not None
        self._fresh_from = spool.next_number if self._fresh_first and spool is not None else 0
        self._fresh_run = 0
        # the item _gather took from the queue and could not add to its batch (None too: stop),
        # the next to handle: a list of at most one
        self._held: list[tuple[bytes, int] | EllipsisType | None] = []
        # a batch, ... (written ahead to the spool: look at it), None (stop)
        self.queue: queue.Queue[tuple[bytes, int] | EllipsisType | None] = queue.Queue()
        self.delivered = self.refused = self.lost = 0
        self.send_failures = 0  # sends that found the sink down
        self.failing = False  # the last send found the sink down (``down`` also covers waiting for a retry)
        self.down = False
        self.trouble: str | None = None  # what keeps batches back, as logged when it began (SinkDown.trouble)
        self.next_retry = 0.0
        self.stop_by: float | None = None  # set by stop(): queued batches past it are spooled unsent
        self.late = False  # the sink was too slow for what was queued at stop
        self.ahead_failing = False  # the submitting thread's: the spool could not be written ahead of a send
        # What the spool holds, as of the last batch the thread settled, before it waits for the
        # next (what the self-samples say: not each batch on its way through): batches, samples.
        self.spooled = (len(spool), spool.samples) if spool is not None else (0, 0)
        self.done = threading.Event()

    def submit(self, samples: list[dict], edges: Sequence[dict] = ()) -> None:
        """A round's samples and its edge counters behind them, as one batch (one spool file, one
        send). A sink that takes no edge counters (prometheus://) encodes them as nothing: neither
        sent nor counted as delivered."""
        payload, count = (self.sink.encode(samples), len(samples)) if samples else (b"", 0)
        edge_payload = self.sink.encode_edges(edges) if edges else b""
        if edge_payload:
            payload, count = payload + edge_payload, count + len(edges)
        if payload:
            self._queue(payload, count)

    def submit_self_sample(self, doc: dict) -> None:
        """The agent's self-sample, queued behind the samples before it (a batch of one)."""
        self._queue(self.sink.encode_self_samples([doc]), 1)

    def submit_run(self, doc: dict) -> None:
        """A run document (a batch of one); sent again later, it replaces itself in every store."""
        self._queue(self.sink.encode_run(doc), 1)

    def _queue(self, payload: bytes, count: int) -> None:
        """To the spool before anything else, and the thread woken for it; in memory when there is
        no spool or it cannot be written (a full disk), said once as it begins and as it ends."""
        if self.spool is not None:
            try:
                self.spool.push(payload, count)
            except OSError as exc:
                if not self.ahead_failing:
                    log.error(
                        "spool %s: cannot write: %s: batches wait in memory until sent, lost if the agent is killed",
                        self.spool.folder,
                        exc.strerror or exc,
                    )
                self.ahead_failing = True
            else:
                if self.ahead_failing:
                    log.warning(
                        "spool %s can be written again: batches go to it before they are sent", self.spool.folder
                    )
                self.ahead_failing = False
                self.queue.put(...)  # look at the spool
                return
        self.queue.put((payload, count))

    def stop(self) -> None:
        self.stop_by = time.monotonic() + max(self.drain_s, self.QUEUED_AT_STOP_S)
        self.queue.put(None)

    def failovers(self) -> int:
        """The sink's failovers so far (read by the sampling thread: a counter its thread only grows)."""
        return self.sink.failovers()

    def abandon(self) -> int:
        """Count what is still queued as lost (the thread is stuck, or was stopped by an error)."""
        count = 0
        while True:
            try:
                item = self._next(0)
            except queue.Empty:
                break
            if item is not None and item is not ...:
                count += item[1]
        self.lost += count
        return count

    def _send(self, payload: bytes, count: int) -> tuple[bytes, int] | None:
        """Deliver a batch; what is left to send later (all of it while the sink is down, or the
        part a store could not take for now), or None."""
        try:
            outcome = self.sink.send(payload, count)
        except SinkDown as exc:
            self._trouble_begins(exc.trouble, str(exc))
            if exc.timed_out:  # too big to be answered in time, maybe: a smaller one may go
                self._send_limit //= 2
            self.send_failures += 1
            self.failing = True
            self._went_down()
            if self._fresh_first and self.spool is not None:  # the whole sink down: what comes next is fresh
                self._fresh_from, self._fresh_run = self.spool.next_number, 0
            return payload, count
        except SinkRejected as exc:
            self.refused += count
            self.down = self.failing = False  # it answered
            log.error("sink %s: the store refused %d samples: %s", self.sink.url, count, exc)
            return None
        if outcome is None or not outcome.forbidden:
            self._trouble_ends()
        self.down = self.failing = False
        if outcome is None:
            self.delivered += count
            return None
        self.delivered += outcome.accepted
        self.refused += outcome.refused
        if outcome.refused:
            log.error(
                "sink %s refused %d of %d samples: %s",
                self.sink.url,
                outcome.refused,
                count,
                outcome.reasons[0] if outcome.reasons else "no reason given",
            )
        if outcome.retry is not None:
            if outcome.forbidden:  # documents the user may not write: kept, said once
                self._trouble_begins("forbidden", outcome.forbidden)
            self._went_down()  # the store takes nothing more for now
            return outcome.retry, outcome.retry_count
        return None

    def _trouble_begins(self, trouble: str, why: str) -> None:
        """Said once as it begins, never at each resend (and once as it ends: _trouble_ends)."""
        if self.trouble == trouble:
            return
        if self.trouble is not None:
            self._trouble_ends()
        self.trouble = trouble
        if trouble == "down":
            log.error(
                "sink %s is down (%s): %s",
                self.sink.url,
                why,
                "spooling" if self.spool is not None else "samples are lost meanwhile",
            )
        else:
            log.error(
                "%s; %s",
                why,
                "spooling, to be sent once it works"
                if self.spool is not None
                else "the samples are lost meanwhile (no --spool-dir)",
            )

    def _trouble_ends(self) -> None:
        if self.trouble == "down":
            log.warning("sink %s is back", self.sink.url)
        elif self.trouble is not None:
            log.warning("sink %s takes batches again: %s", self.sink.url, TROUBLE_OVER[self.trouble])
        self.trouble = None

    def _went_down(self) -> None:
        self.down = True
        self._backlog = True
        self.next_retry = time.monotonic() + self.retry_s

    def _caught_up(self) -> None:
        """Nothing waits: what goes together is send_max_bytes again, and what a backlog took is
        given back to the system (flowstat.agent.memory)."""
        self._send_limit = self.send_max_bytes
        if self._backlog:
            self._backlog = False
            memory.trim()

    def _waiting(self) -> bool:
        """Batches wait for the sink: it is down, or its spool is not empty."""
        return self.down or (self.spool is not None and len(self.spool) > 0)

    def _drain_spool(self, until: float | None = None) -> bool:
        """Send spooled batches, the fresh ones first and the backlog after them (each in order:
        see __init__), until ``until`` at the latest (None: until the exit
        deadline, once stop() set it); True when nothing waits. A batch leaves the spool once the
        sink took it: a sink that took it and an agent killed before it could say so get it again
        (the stores overwrite it)."""
        while self.spool is not None and len(self.spool) > 0:
            limit = until if until is not None else self.stop_by
            if limit is not None and time.monotonic() >= limit:
                if until is None:
                    self._too_slow()
                return False
            fresh_from = 0 if self._fresh_run >= self.BACKLOG_EVERY else self._fresh_from
            item = self.spool.peek(self._send_limit, fresh_from)
            if item is None:
                break
            fresh = bool(fresh_from) and self.spool.handed_out_from() >= fresh_from
            self._fresh_run = self._fresh_run + 1 if fresh else 0
            left = self._send(*item)
            if left is not None:
                if left != item:  # the store took part of it: keep only the rest
                    self.spool.replace_oldest(*left)
                else:
                    self.spool.release()
                return False
            self.spool.pop()
        self._caught_up()
        if self.down and time.monotonic() >= self.next_retry:
            self.down = False  # nothing waits: the next batch asks the sink again
        return True

    def _keep(self, payload: bytes, count: int) -> None:
        """A batch the sink did not take waits in the spool; with no spool (or a spool that cannot
        be written) it is lost, and counted."""
        if self.spool is not None:
            try:
                self.spool.push(payload, count)
                return
            except OSError as exc:
                log.error("spool %s: cannot write: %s", self.spool.folder, exc.strerror or exc)
        self.lost += count

    def _too_slow(self) -> None:
        if not self.late:
            self.late = True
            log.error(
                "sink %s is too slow to take what was queued before the exit: %s",
                self.sink.url,
                "the rest is spooled" if self.spool is not None else "the rest is lost (no --spool-dir)",
            )

    def _publish(self) -> None:
        if self.spool is not None:
            self.spooled = (len(self.spool), self.spool.samples)
            if self.down:  # what the sink did not take stays: on disk for good
                self.spool.sync()

    def _take(self, payload: bytes, count: int) -> None:
        if self.stop_by is not None and time.monotonic() >= self.stop_by:
            self._too_slow()
            self._keep(payload, count)
        elif self._waiting():
            self._keep(payload, count)  # behind what waits, in order
        elif (left := self._send(payload, count)) is not None:
            self._keep(*left)
        elif not self._held and self.queue.empty():
            self._caught_up()

    def _next(self, wait: float | None) -> tuple[bytes, int] | EllipsisType | None:
        """The next item: the one _gather held back, else the queue's (queue.Empty past ``wait``)."""
        if self._held:
            return self._held.pop()
        return self.queue.get(timeout=wait) if wait != 0 else self.queue.get_nowait()

    def _gather(self, payload: bytes, count: int) -> tuple[bytes, int]:
        """The batch, and those queued behind it while all fit in send_max_bytes, as one: batches
        queued in memory (no spool) catch up a request at a time, as spooled ones do. The first
        item that is not a batch, or does not fit, is held for _next."""
        parts, size = [payload], len(payload)
        while not self._held:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is None or item is ... or size + len(item[0]) > self._send_limit:
                self._held.append(item)
                break
            parts.append(item[0])
            size, count = size + len(item[0]), count + item[1]
        return (payload if len(parts) == 1 else b"".join(parts)), count

    def _deliver(self) -> None:
        while True:
            self._publish()
            wait = max(0.0, self.next_retry - time.monotonic()) if self._waiting() else None
            item: tuple[bytes, int] | EllipsisType | None  # ...: none came in time
            try:
                item = self._next(wait)
            except queue.Empty:
                item = ...
            if self._waiting() and time.monotonic() >= self.next_retry and not self._drain_spool():
                self.next_retry = time.monotonic() + self.retry_s
            if item is None:
                break
            if item is not ...:
                self._take(*self._gather(*item))
        while self._held or not self.queue.empty():  # submitted after stop: kept for next time
            extra = self._next(0)
            if extra is not None and extra is not ...:
                self._take(*self._gather(*extra))
        # A sink that is down at exit gets drain_s more to come back (a store restarting as a run
        # ends); what it still has not taken stays in the spool for the next start.
        deadline = time.monotonic() + self.drain_s
        while not self._drain_spool(deadline) and time.monotonic() < deadline:
            time.sleep(min(self.retry_s, max(0.0, deadline - time.monotonic())))
        self.sink.drain(deadline)  # a pull sink's final samples: scraped within the same drain_s
        if self.spool is not None:
            self.spool.sync()
        self._publish()

    def run(self) -> None:
        try:
            self._deliver()
        except Exception:  # a bug, a full disk, a closed stdout: say so, and account for what was held
            log.exception("sink %s: delivery stopped by an unexpected error", self.sink.url)
            lost = self.abandon()
            if lost:
                log.error("sink %s: %d queued samples are lost", self.sink.url, lost)
        finally:
            try:
                self.sink.close()
            except Exception:  # closing what broke must not hide why
                log.exception("sink %s: cannot close", self.sink.url)
            self.done.set()
