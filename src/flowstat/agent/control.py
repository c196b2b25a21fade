"""Asking many nodes for their metrics at once: one DEALER socket per node, all requests sent
before any reply is awaited, one deadline for all. A hung node costs the timeout, not a stall."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import zmq

from flowstat.node import curve

log = logging.getLogger("flowstat.agent")
MAX_REPLY_BYTES = 256 * 1024


class ControlPool:
    def __init__(self, timeout_s: float = 0.25):
        self.ctx = zmq.Context.instance()
        self.timeout_s = timeout_s
        self.sockets: dict[str, zmq.Socket] = {}
        self.request_id = 0
        self.errors = 0  # malformed or unanswered replies
        self.secured: dict[str, tuple[str, tuple[bytes, bytes]]] = {}  # endpoint: its key, our pair
        self._pairs: dict[Path, tuple[bytes, bytes]] = {}

    def secure(self, endpoint: str, server_key: str, client_key: Path) -> None:
        """Ask ``endpoint`` over CURVE (a node announced with curve_server_key); CurveError when the
        client key cannot be read (the caller leaves that node's channel alone)."""
        pair = self._pairs.get(client_key)
        if pair is None:
            pair = self._pairs[client_key] = curve.client_keys(client_key)
        if not curve.valid_key(server_key):
            raise curve.CurveError(f"curve_server_key {server_key[:8]!r}...: not a Z85 key of 40 characters")
        self.secured[endpoint] = (server_key, pair)

    def _socket(self, endpoint: str) -> zmq.Socket:
        sock = self.sockets.get(endpoint)
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 4)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
            if endpoint in self.secured:
                curve.secure_client(sock, *self.secured[endpoint])
            sock.connect(endpoint)
            self.sockets[endpoint] = sock
        return sock

    def query(self, endpoints: list[str]) -> dict[str, dict]:
        """get-metrics from every endpoint; the replies that came in time, by endpoint."""
        self.request_id += 1
        rid = self.request_id
        waiting: dict[zmq.Socket, str] = {}
        body = json.dumps({"command": "get-metrics", "id": rid}).encode()
        for ep in endpoints:
            sock = self._socket(ep)
            try:
                # one frame, no REQ-style empty delimiter: the node echoes what envelope came, and
                # with CURVE each frame is encrypted on its own (the delimiter doubled the work)
                sock.send(body, zmq.NOBLOCK)
                waiting[sock] = ep
            except zmq.Again:
                self.errors += 1
        replies: dict[str, dict] = {}
        deadline = time.monotonic() + self.timeout_s
        poller = zmq.Poller()
        for sock in waiting:
            poller.register(sock, zmq.POLLIN)
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for sock, _ in poller.poll(int(remaining * 1000)):  # in ms, as poll() would cut it
                for _ in range(16):  # older, late replies may be queued ahead of ours
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    reply = self._parse(frames, waiting.get(sock, "?"))
                    if reply is not None and reply.get("id") == rid and sock in waiting:
                        replies[waiting.pop(sock)] = reply
                        poller.unregister(sock)
                        break
        self.errors += len(waiting)
        return replies

    def _parse(self, frames: list[bytes], endpoint: str) -> dict | None:
        try:
            reply = json.loads(frames[-1])
            if isinstance(reply, dict) and "error" not in reply:
                return reply
            log.warning("%s: control error reply: %s", endpoint, reply)
        except (ValueError, UnicodeDecodeError):
            log.warning("%s: malformed control reply (%d bytes)", endpoint, len(frames[-1]))
        self.errors += 1
        return None

    def forget(self, endpoint: str) -> None:
        self.secured.pop(endpoint, None)
        sock = self.sockets.pop(endpoint, None)
        if sock is not None:
            sock.close(0)

    def close(self) -> None:
        for ep in list(self.sockets):
            self.forget(ep)
