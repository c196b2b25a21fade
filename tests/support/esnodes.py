"""Stand-ins for the nodes of an Elasticsearch cluster that fail, beside a real node, on loopback:
a port that refuses connections (and may later come up as a node), a node that accepts
connections and never answers, one that closes them at once, a node that answers every request
with one status, and a node that passes requests on to the real one (and may store a batch, then
die before it answers). Each records what came to it, with the time (time.monotonic()) it came."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests


class _Recorded:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, bytes, float]] = []  # method, path, body, when it came

    def record(self, method: str, path: str, body: bytes) -> None:
        with self.lock:
            self.requests.append((method, path, body, time.monotonic()))

    def bulks(self) -> list[tuple[bytes, float]]:
        """The _bulk bodies it was sent, and when each came."""
        with self.lock:
            return [(body, at) for method, path, body, at in self.requests if path.startswith("/_bulk")]


def _handler(owner, respond):
    """A request handler that records each request, then calls respond(handler, method, path, body)."""

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            self.came = time.monotonic()  # its head read, its body not yet
            body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
            owner.record(self.command, self.path, body)
            respond(self, self.command, self.path, body)

        do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _any

        def log_message(self, *args):
            pass

    return Handler


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "application/json") -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _client_gone(conn: socket.socket) -> bool:
    """The client closed its end. It sent its whole request (HTTP/1.0, one a connection, its body
    of a Content-Length: no pipelining, no chunks), so anything readable now is the end of the
    stream."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:  # nothing to read: still waiting for the answer
        return False
    except OSError:  # reset: gone too
        return True


class _Server(_Recorded):
    def __init__(self, respond, sock: socket.socket | None = None) -> None:
        super().__init__()
        ThreadingHTTPServer.allow_reuse_address = True
        if sock is None:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, respond))
        else:  # a socket already bound (a port that refused connections until now)
            self.server = ThreadingHTTPServer(sock.getsockname(), _handler(self, respond), bind_and_activate=False)
            self.server.socket.close()
            self.server.socket = sock
            self.server.server_address = sock.getsockname()
            self.server.server_activate()
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class StatusNode(_Server):
    """Answers every request (a health check too) with ``status``: 503, a node that is up but not
    part of a cluster (yet), or any status a test gives."""

    def __init__(self, status: int = 503) -> None:
        body = (
            b'{"error":{"type":"cluster_block_exception","reason":"blocked by: [SERVICE_UNAVAILABLE/1/state not '
            b'recovered / initialized];"},"status":%d}' % status
        )
        super().__init__(lambda h, method, path, _: _reply(h, status, body))


class ProxyNode(_Server):
    """Passes every request on to the real node at ``target`` (http://HOST:PORT) and its answer
    back; a request for which ``dies_after(n)`` holds (n counts the _bulk requests from 0) is
    passed on and stored by the real node, and then no answer comes: the connection closes, as
    when a node is killed between storing a batch and answering it. ``dropped``: the bodies so
    treated. ``sock``: a bound socket to listen on (its port refused connections until now).
    ``delay_s``: how long it holds each request before passing it on (a slow node). ``before(method,
    path)``: called as each request comes, before it is passed on (to act on the real node then).
    ``late``: the requests whose answer came after their client had given up on them (closed its
    connection), or within 0.1 s of ``client_timeout_s`` after their head came; ``in_flight()``:
    the requests being handled (one a client gave up on may still wait for the real node)."""

    def __init__(
        self,
        target: str,
        dies_after=lambda n: False,
        sock: socket.socket | None = None,
        delay_s: float = 0.0,
        before=lambda method, path: None,
        client_timeout_s: float = 30.0,
    ) -> None:
        self.target, self.dies_after, self.delay_s, self.before = target, dies_after, delay_s, before
        self.client_timeout_s = client_timeout_s
        self.dropped: list[bytes] = []
        self.bulk_count = 0
        self.late = 0
        self._in_flight = 0
        self.session = requests.Session()
        super().__init__(self._pass_on, sock)

    def in_flight(self) -> int:
        with self.lock:
            return self._in_flight

    def _pass_on(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: bytes) -> None:
        with self.lock:
            self._in_flight += 1
        try:
            self._pass_on_once(handler, method, path, body)
        finally:
            with self.lock:
                self._in_flight -= 1

    def _pass_on_once(self, handler: BaseHTTPRequestHandler, method: str, path: str, body: bytes) -> None:
        headers = {k: v for k, v in handler.headers.items() if k.lower() in ("content-type", "authorization")}
        self.before(method, path)
        if self.delay_s:
            time.sleep(self.delay_s)  # the slow node itself, not a wait for something
        try:
            resp = self.session.request(method, self.target + path, data=body or None, headers=headers, timeout=30)
        except requests.RequestException:
            handler.close_connection = True  # the real node gave no answer: nor does this one
            return
        finally:
            # Late as its client saw it: its time-out may have begun before this proxy took the
            # request from the kernel, so a connection it closed tells what a duration cannot; and
            # one about to time out as this answer is written is late too (more only loosens a bound).
            if _client_gone(handler.connection) or time.monotonic() - handler.came >= self.client_timeout_s - 0.1:
                with self.lock:
                    self.late += 1
        if path.startswith("/_bulk"):
            with self.lock:
                n, self.bulk_count = self.bulk_count, self.bulk_count + 1
            if self.dies_after(n):
                self.dropped.append(body)
                handler.close_connection = True  # stored, and no answer
                return
        _reply(handler, resp.status_code, resp.content, resp.headers.get("Content-Type", "application/json"))

    def close(self) -> None:
        super().close()
        self.session.close()


class SilentNode:
    """Accepts every connection and never answers (a node that hangs): each connection is kept
    open until close(). ``accepted``: when each came (time.monotonic())."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[float] = []
        self.held: list[socket.socket] = []
        self.lock = threading.Lock()
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted.append(time.monotonic())
                self.held.append(conn)

    def times(self) -> list[float]:
        with self.lock:
            return list(self.accepted)

    def close(self) -> None:
        self.running = False
        self.sock.close()
        with self.lock:
            for conn in self.held:
                conn.close()


class ClosingNode(SilentNode):
    """Accepts every connection and closes it at once (a node killed as a client connects: over
    TLS, the handshake ends in an EOF)."""

    def _accept(self) -> None:
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted.append(time.monotonic())
            conn.close()


class RefusingPort:
    """A port nobody listens on: bound, so that no one else takes it, but not listening, so that
    every connection is refused. ``come_up(target)`` makes it a ProxyNode of the real node at
    ``target`` on the same socket (the node is back)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.node: ProxyNode | None = None

    def come_up(self, target: str) -> ProxyNode:
        self.node = ProxyNode(target, sock=self.sock)
        return self.node

    def close(self) -> None:
        if self.node is not None:
            self.node.close()
        else:
            self.sock.close()
