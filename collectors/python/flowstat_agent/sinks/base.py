"""The interface every sink implements, and the thread that delivers to one sink with its spool."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Iterable

from .. import schema
from ..spool import Spool

log = logging.getLogger("flowstat.agent")


class SinkDown(Exception):
    """The sink cannot take data now (connection refused, 5xx, timeout): keep it and retry."""


class SinkRejected(Exception):
    """The sink refused the data itself (4xx): retrying cannot help."""


class Sink:
    """One destination. ``encode`` turns samples into the bytes ``send`` delivers in one go."""

    scheme = ""
    format = "line"  # line (InfluxDB line protocol) or json (one JSON document a line)
    reliable = True  # a successful send means the data arrived (not so for UDP)

    def __init__(self, url: str):
        self.url = url

    def encode(self, samples: Iterable[dict]) -> bytes:
        encode = schema.to_line_protocol if self.format == "line" else schema.to_json
        return "".join(encode(s) + "\n" for s in samples).encode()

    def send(self, payload: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class SinkRunner(threading.Thread):
    """Delivers batches to one sink in order, spooling them on disk while it is down."""

    def __init__(self, sink: Sink, spool: Spool | None, retry_s: float = 1.0, drain_s: float = 0.0):
        super().__init__(daemon=True, name=f"sink-{sink.scheme}")
        self.sink, self.spool, self.retry_s, self.drain_s = sink, spool, retry_s, drain_s
        self.queue: "queue.Queue[tuple[bytes, int] | None]" = queue.Queue()
        self.delivered = self.rejected = self.lost = 0
        self.down = False
        self.done = threading.Event()

    def submit(self, samples: list[dict]) -> None:
        if samples:
            self.queue.put((self.sink.encode(samples), len(samples)))

    def stop(self) -> None:
        self.queue.put(None)

    def _send(self, payload: bytes, count: int) -> bool:
        try:
            self.sink.send(payload)
        except SinkDown as exc:
            if not self.down:
                log.error("sink %s is down (%s): spooling", self.sink.url, exc)
            self.down = True
            return False
        except SinkRejected as exc:
            self.rejected += count
            log.error("sink %s rejected %d samples: %s", self.sink.url, count, exc)
            return True
        if self.down:
            log.warning("sink %s is back", self.sink.url)
        self.down = False
        self.delivered += count
        return True

    def _drain_spool(self) -> bool:
        """Resend spooled batches in order; True when the spool is empty."""
        while self.spool is not None and (item := self.spool.peek()) is not None:
            if not self._send(*item):
                return False
            self.spool.pop()
        return True

    def _keep(self, payload: bytes, count: int) -> None:
        if self.spool is not None:
            self.spool.push(payload, count)
        else:
            self.lost += count

    def run(self) -> None:
        stopping = False
        while True:
            try:
                item = self.queue.get(timeout=self.retry_s if self.down or (self.spool and len(self.spool)) else None)
            except queue.Empty:
                self._drain_spool()
                continue
            if item is None:
                stopping = True
            elif not self._drain_spool() or not self._send(*item):
                self._keep(*item)
            if stopping:
                # A sink that is down at exit gets drain_s more to come back (a store restarting as
                # a run ends); what it still has not taken stays in the spool for the next start.
                deadline = time.monotonic() + self.drain_s
                while not self._drain_spool() and time.monotonic() < deadline:
                    time.sleep(min(self.retry_s, max(0.0, deadline - time.monotonic())))
                while not self.queue.empty():  # anything submitted after stop: keep it for next time
                    extra = self.queue.get_nowait()
                    if extra is not None and not self._send(*extra):
                        self._keep(*extra)
                self.sink.close()
                self.done.set()
                return
