"""``prometheus://HOST:PORT``: the agent serves ``/metrics`` for a Prometheus to scrape.

A pull sink: what the agent "sends" it is kept, the latest sample of every node and the agent's
latest self-sample, and each scrape is answered from it (flowstat.schema.prometheus: the families,
in OpenMetrics 1.0 when the scraper's Accept header asks for it, else the text format 0.0.4),
with the agent's own process_* metrics. A node reported gone (STOPPED, DOWN, LEFT_TOP) stays with
its last figures for two scrapes, then goes: a scraper sees its final counters once at least.

``?web_config=PATH``: TLS and basic authentication from an exporter-toolkit web-config.yml
(webconfig.py). The sink listens on loopback only (127.0.0.0/8, ::1, localhost) unless that file
gives both TLS and at least one user: a URL naming another address without them is refused. A
scrape without the right credentials is answered 401 and changes nothing (a gone node's count of
scrapes included). The file is read again at a connection when it changed (webconfig.Watched): one
that became unusable refuses the connections (no TLS handshake; plain HTTP answered 500) until fixed.

``?families=A,B``: only these node families (sample fields, or their family names); ``?drop_labels=
run_id,...``: labels left out of every node series (node_id cannot be): prometheus.selection.

At exit (``drain``, after the last samples were put), the sink keeps serving until one scrape was
answered whole (200) with them, or the agent's --drain-timeout passed (said in one line); a sink
nobody ever scraped does not wait.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import resource
import socket
import ssl
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Protocol

from flowstat.proc.procfs import start_time
from flowstat.proc.reader import CLK_TCK
from flowstat.schema import prometheus
from flowstat.schema import sample as sample_schema

from . import webconfig
from .base import Sink, SinkURLError, host_port

log = logging.getLogger("flowstat.agent")

DEFAULT_PORT = 9464
GONE_STATES = (sample_schema.STATE_STOPPED, sample_schema.STATE_DOWN, "LEFT_TOP")
SCRAPES_KEPT_GONE = 2  # a node gone is shown this many more scrapes with its final figures
SERVING_THREADS = 4
CLIENT_TIMEOUT_S = 5.0  # a scraper that sends nothing (or reads nothing) is let go after it
TLS_HANDSHAKE = 0x16  # the first byte a TLS client sends
NOT_TLS = b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" + (
    b"Client sent an HTTP request to an HTTPS server.\n"
)  # exporter-toolkit's (Go's) answer
BEYOND_LOOPBACK = (
    "/metrics is served on loopback only (127.0.0.1, ::1) unless a web_config gives it TLS and basic_auth_users"
    " (?web_config=PATH: docs/prometheus.md)"
)


class _Latest:
    """What the scrapes are answered from: the latest sample of each node, of each agent."""

    def __init__(self, select: prometheus.Selection = prometheus.ALL) -> None:
        self.select = select
        self.lock = threading.Lock()
        self.nodes: dict[tuple[str, ...], dict[str, Any]] = {}
        self.gone: dict[tuple[str, ...], int] = {}  # a gone node's key: scrapes it was shown in since
        self.agents: dict[tuple[str, ...], dict[str, Any]] = {}
        self.version = 0  # +1 at each sample put
        # the drain at exit: a scrape came (ever); the version of the last one answered whole (200)
        self.asked = False
        self.answered = -1
        self.answers = threading.Condition(self.lock)
        # One rendering at a time, kept per format until a sample comes: a thousand scrapes between
        # two rounds cost one rendering, not a thousand turns of the interpreter taken from sampling.
        self._render_lock = threading.Lock()
        self._rendered: dict[bool, tuple[int, bytes]] = {}

    def rendered(self, openmetrics: bool) -> tuple[int, bytes]:
        """The exposition, and the version of the samples it shows."""
        with self._render_lock:
            with self.lock:
                version = self.version
                self.asked = True
            kept = self._rendered.get(openmetrics)
            if kept is not None and kept[0] == version:
                return kept
            nodes, agents = self.scrape()
            body = prometheus.exposition(
                nodes, agents, openmetrics=openmetrics, process=process_figures(), select=self.select
            ).encode()
            self._rendered[openmetrics] = (version, body)
            return version, body

    def answered_whole(self, version: int) -> None:
        """A scrape showing the samples up to ``version`` was answered whole (200)."""
        with self.answers:
            if version > self.answered:
                self.answered = version
                self.answers.notify_all()

    def drain(self, deadline: float) -> bool:
        """Until a scrape showing every sample put so far was answered whole, or ``deadline``
        (time.monotonic()); at once when no scrape ever came. False: the deadline passed first."""
        with self.answers:
            final = self.version
            return not self.asked or self.answers.wait_for(
                lambda: self.answered >= final, max(0.0, deadline - time.monotonic())
            )

    def put(self, kind: str, doc: dict[str, Any]) -> None:
        with self.lock:
            self.version += 1
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


def process_figures() -> dict[str, Any]:
    """This process's own process_* figures (an agent's, flowstat verdict's), from /proc/self."""
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


class MetricsBoard(Protocol):
    """What a /metrics server answers from (the agent's latest samples, flowstat verdict's verdicts)."""

    def rendered(self, openmetrics: bool) -> tuple[int, bytes]:
        """The exposition, and a version of what it shows (growing)."""
        ...

    def answered_whole(self, version: int) -> None:
        """A scrape showing ``version`` was answered whole (200)."""
        ...


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = CLIENT_TIMEOUT_S

    def __init__(self, request: Any, client_address: Any, server: _Server, web: webconfig.WebConfig | None) -> None:
        self.web = web  # the web-config as it was at the connection; None: the file cannot be used
        super().__init__(request, client_address, server)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.web is None:  # as exporter-toolkit answers a request when its file cannot be used
            self._answer(500, "text/plain; charset=utf-8", b"Internal Server Error\n")
            return
        auth = self.web.auth
        if auth is not None and not auth.allows(self.headers.get("Authorization")):
            self._answer(401, "text/plain; charset=utf-8", b"Unauthorized\n", f'Basic realm="{webconfig.REALM}"')
            return  # before anything is read: the scrape changes nothing
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, "text/plain; charset=utf-8", b"flowstat: /metrics only\n")
            return
        openmetrics = "application/openmetrics-text" in (self.headers.get("Accept") or "")
        version, body = self.server.latest.rendered(openmetrics)
        self._answer(200, prometheus.OPENMETRICS if openmetrics else prometheus.TEXT_0_0_4, body)
        self.wfile.flush()
        self.server.latest.answered_whole(version)  # written: a client gone mid-answer raised before

    def _answer(self, status: int, content_type: str, body: bytes, authenticate: str = "") -> None:
        self.send_response(status)
        if authenticate:
            self.send_header("WWW-Authenticate", authenticate)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass  # a line per scrape would fill the agent's log


class _Server(HTTPServer):
    """Connections served by a few threads: many scrapers at once queue, they do not each take a
    thread (and the interpreter) from sampling."""

    request_queue_size = 1024
    latest: MetricsBoard
    address_family = socket.AF_INET

    def __init__(self, address: tuple[str, int], handler: type[_Handler], web: webconfig.Watched):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.web, self.handler = web, handler
        # made before the bind: a port taken makes HTTPServer close the server, which shuts the pool
        self.pool = ThreadPoolExecutor(SERVING_THREADS, thread_name_prefix="metrics")
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.pool.submit(self._serve_one, request, client_address)

    def _serve_one(self, request: Any, client_address: Any) -> None:
        conn = request
        try:
            web = self.web.current()  # the file read again if it changed
            if self.web.tls:  # no handshake when the file cannot be used (exporter-toolkit's fails)
                conn = self._tls_accept(request, web.context) if web and web.context is not None else None
            if conn is not None:
                self.handler(conn, client_address, self, web)
        except Exception:  # a client gone mid-answer: its connection closed, the next served
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(conn if conn is not None else request)

    def _tls_accept(self, request: socket.socket, tls: ssl.SSLContext) -> ssl.SSLSocket | None:
        """The TLS connection, its handshake done on this serving thread within the client time-out
        (a client that stalls in it is let go as a silent one); None when there is none: plain HTTP
        is answered 400 as exporter-toolkit does, a failed handshake is only closed."""
        request.settimeout(CLIENT_TIMEOUT_S)
        try:
            first = request.recv(1, socket.MSG_PEEK)
            if first and first[0] != TLS_HANDSHAKE:
                request.setblocking(False)
                try:  # what it sent so far, read: its close is then no reset that could lose the answer
                    request.recv(65536)
                except BlockingIOError:
                    pass
                request.setblocking(True)
                request.settimeout(CLIENT_TIMEOUT_S)
                request.sendall(NOT_TLS)
                return None
            return tls.wrap_socket(request, server_side=True) if first else None
        except (OSError, ValueError):  # ssl.SSLError, a time-out, a reset: the wrapped socket is closed
            return None

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # socketserver prints a traceback on stderr: a scraper that hung up is no error of ours

    def server_close(self) -> None:
        super().server_close()
        self.pool.shutdown(wait=False, cancel_futures=True)


class MetricsServer:
    """/metrics served from ``board`` on HOST:PORT by a thread of its own (OSError: cannot listen)."""

    def __init__(
        self, board: MetricsBoard, host: str, port: int, web: webconfig.WebConfig | None = None, where: str = ""
    ) -> None:
        web = web or webconfig.WebConfig("")
        watched = webconfig.Watched(web, beyond_loopback=not is_loopback(host), where=where)
        self.server = _Server((host, port), _Handler, watched)
        self.server.latest = board
        self.port: int = self.server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        users = f", basic authentication ({len(web.users)} users)" if web.users else ""
        scheme = "https" if web.context is not None else "http"
        self.said = f"{scheme}://{shown}:{self.port}/metrics{users}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="prometheus", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def is_loopback(host: str) -> bool:
    """Whether host is 127.0.0.0/8, ::1 or localhost."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def web_config_for(host: str, path: str | None) -> webconfig.WebConfig | None:
    """The web-config a /metrics server on ``host`` is to use (None: plain HTTP, anyone). ValueError
    when ``path`` is empty or unreadable, or when ``host`` is beyond loopback without TLS and users
    (BEYOND_LOOPBACK)."""
    loopback = is_loopback(host)
    if path == "":
        raise ValueError("web_config needs a file (?web_config=PATH)")
    if not loopback and path is None:
        raise ValueError(BEYOND_LOOPBACK)
    try:
        web = webconfig.load(path) if path is not None else None
    except webconfig.WebConfigError as exc:
        raise ValueError(f"web_config {exc}") from None
    if not loopback and (web is None or web.context is None or not web.users):
        raise ValueError(BEYOND_LOOPBACK)
    return web


class PrometheusSink(Sink):
    scheme = "prometheus"
    format = "json"
    spooled = False  # a scrape shows the latest figures: nothing to keep for later

    def __init__(
        self,
        url: str,
        host: str,
        port: int,
        web: webconfig.WebConfig | None = None,
        select: prometheus.Selection = prometheus.ALL,
    ):
        super().__init__(url)
        self.latest = _Latest(select)
        try:
            self.metrics = MetricsServer(self.latest, host, port, web, where=f"sink {url}: ")
        except OSError as exc:
            raise SinkURLError(f"{url}: cannot listen on {host}:{port}: {exc.strerror}") from None
        self.port = self.metrics.port
        log.info("serving /metrics on %s", self.metrics.said)

    @classmethod
    def from_url(cls, url, parts, query):
        host, port = host_port(url, parts, DEFAULT_PORT)
        try:
            select = prometheus.selection(query.get("families"), query.get("drop_labels"))
            web = web_config_for(host, query.get("web_config"))
        except ValueError as exc:
            raise SinkURLError(f"{url}: {exc}") from None
        return cls(url, host, port, web, select)

    def longest_send_s(self) -> float:
        return 0.1  # a send is a dictionary update

    def encode(self, samples: Iterable[dict]) -> bytes:
        return "".join(json.dumps({"node": s}) + "\n" for s in samples).encode()

    def encode_self_samples(self, docs: Iterable[dict]) -> bytes:
        return "".join(json.dumps({"agent": d}) + "\n" for d in docs).encode()

    def encode_run(self, doc: dict) -> bytes:
        return b""  # a run document is no metric

    def encode_edges(self, docs: Iterable[dict]) -> bytes:
        return b""  # flowstat verdict reads edge counters from the stores; /metrics serves the nodes

    def send(self, payload: bytes, count: int) -> None:
        for line in payload.splitlines():  # what encode wrote, in this process: never a stranger's
            ((kind, doc),) = json.loads(line).items()
            self.latest.put(kind, doc)

    def drain(self, deadline: float) -> None:
        if not self.latest.drain(deadline):
            log.warning(
                "sink %s: no scrape came within the drain time-out (--drain-timeout) after the last samples:"
                " the final samples may not have been scraped",
                self.url,
            )

    def close(self) -> None:
        self.metrics.close()
