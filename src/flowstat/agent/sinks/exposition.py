"""``prometheus://HOST:PORT``: the agent serves ``/metrics`` for a Prometheus to scrape.

A pull sink: what the agent "sends" it is kept, the latest sample of every node and the agent's
latest self-sample, and each scrape is answered from it (flowstat.schema.prometheus: the families,
in OpenMetrics 1.0 when the scraper's Accept header asks for it, else the text format 0.0.4),
with the agent's own process_* metrics. A node reported gone (STOPPED, DOWN, LEFT_TOP) stays with
its last figures for two scrapes, then goes: a scraper sees its final counters once at least.

It listens on loopback only: a /metrics beyond it would need TLS and a password, which this sink
does not do yet (a URL naming another address is refused).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import resource
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flowstat.proc.procfs import start_time
from flowstat.proc.reader import CLK_TCK
from flowstat.schema import prometheus
from flowstat.schema import sample as sample_schema

from .base import Sink, SinkURLError, host_port

log = logging.getLogger("flowstat.agent")

DEFAULT_PORT = 9464
GONE_STATES = (sample_schema.STATE_STOPPED, sample_schema.STATE_DOWN, "LEFT_TOP")
SCRAPES_KEPT_GONE = 2  # a node gone is shown this many more scrapes with its final figures


class _Latest:
    """What the scrapes are answered from: the latest sample of each node, of each agent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nodes: dict[tuple[str, ...], dict[str, Any]] = {}
        self.gone: dict[tuple[str, ...], int] = {}  # a gone node's key: scrapes it was shown in since
        self.agents: dict[tuple[str, ...], dict[str, Any]] = {}

    def put(self, kind: str, doc: dict[str, Any]) -> None:
        with self.lock:
            if kind == "agent":
                self.agents[tuple(str(doc.get(n, "")) for n in prometheus.AGENT_LABELS)] = doc
                return
            key = tuple(str(doc.get(n, "")) for n in ("run_id", "host", "node_id", "agent"))
            if doc.get("node_state") in GONE_STATES:
                # a gone node's report holds no figures: its last ones are its final counters
                self.nodes[key] = {**self.nodes.get(key, {}), **doc}
                self.gone[key] = 0
            else:
                self.nodes[key] = doc
                self.gone.pop(key, None)  # found again

    def scrape(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The nodes and agents to show now; the gone nodes shown long enough are dropped after."""
        with self.lock:
            nodes, agents = list(self.nodes.values()), list(self.agents.values())
            for key in list(self.gone):
                self.gone[key] += 1
                if self.gone[key] >= SCRAPES_KEPT_GONE:
                    del self.gone[key]
                    del self.nodes[key]
        return nodes, agents


def _process_figures() -> dict[str, Any]:
    """The agent's own process_* figures, from /proc/self."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    with open("/proc/self/statm", "rb") as f:
        statm = f.read().split()
    page = os.sysconf("SC_PAGE_SIZE")
    return {
        "cpu_seconds": (int(fields[11]) + int(fields[12])) / CLK_TCK,  # utime, stime: fields 14 and 15
        "resident_memory_bytes": int(statm[1]) * page,
        "virtual_memory_bytes": int(fields[20]),  # vsize: field 23
        "start_time_seconds": _STARTED,
        "open_fds": len(os.listdir("/proc/self/fd")),
        "max_fds": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
    }


_STARTED = start_time(os.getpid())


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, "text/plain; charset=utf-8", b"flowstat agent: /metrics only\n")
            return
        openmetrics = "application/openmetrics-text" in (self.headers.get("Accept") or "")
        nodes, agents = self.server.latest.scrape()
        text = prometheus.exposition(nodes, agents, openmetrics=openmetrics, process=_process_figures())
        self._answer(200, prometheus.OPENMETRICS if openmetrics else prometheus.TEXT_0_0_4, text.encode())

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass  # a line per scrape would fill the agent's log


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    latest: _Latest


class PrometheusSink(Sink):
    scheme = "prometheus"
    format = "json"
    spooled = False  # a scrape shows the latest figures: nothing to keep for later

    def __init__(self, url: str, host: str, port: int):
        super().__init__(url)
        self.latest = _Latest()
        try:
            self.server = _Server((host, port), _Handler)
        except OSError as exc:
            raise SinkURLError(f"{url}: cannot listen on {host}:{port}: {exc.strerror}") from None
        self.server.latest = self.latest
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="prometheus", daemon=True)
        self._thread.start()
        log.info("serving /metrics on http://%s:%d/metrics", host, self.port)

    @classmethod
    def from_url(cls, url, parts, query):
        host, port = host_port(url, parts, DEFAULT_PORT)
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise SinkURLError(f"{url}: /metrics is served on loopback only (127.0.0.1, ::1)")
        return cls(url, host, port)

    def longest_send_s(self) -> float:
        return 0.1  # a send is a dictionary update

    def encode(self, samples: Iterable[dict]) -> bytes:
        return "".join(json.dumps({"node": s}) + "\n" for s in samples).encode()

    def encode_self_samples(self, docs: Iterable[dict]) -> bytes:
        return "".join(json.dumps({"agent": d}) + "\n" for d in docs).encode()

    def encode_run(self, doc: dict) -> bytes:
        return b""  # a run document is no metric

    def send(self, payload: bytes, count: int) -> None:
        for line in payload.splitlines():  # what encode wrote, in this process: never a stranger's
            ((kind, doc),) = json.loads(line).items()
            self.latest.put(kind, doc)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
