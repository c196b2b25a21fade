"""The control channel's wire: JSON requests and replies over a ZeroMQ ROUTER socket per node, the
requests' checks, and the client that asks.

In the role of the thesis's DDS custom commands (section 3.2.2). See docs/control-protocol.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import zmq

from .curve import secure_client

MAX_REQUEST_BYTES = 64 * 1024
COMMANDS = ("check-state", "get-metrics", "start", "stop", "clock")


class ControlError(RuntimeError):
    """A control request failed: timeout, or an error reply."""


def parse_request(payload: bytes) -> tuple[str | None, dict[str, Any] | None, str | None]:
    """(command, request, error). Bad requests give an error text, never an exception."""
    if len(payload) > MAX_REQUEST_BYTES:
        return None, None, f"request of {len(payload)} bytes exceeds {MAX_REQUEST_BYTES}"
    try:
        request = json.loads(payload)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested or a number too deep for Python
        return None, None, f"malformed request: not JSON ({exc})"
    if not isinstance(request, dict):
        return None, None, "malformed request: expected a JSON object"
    command = request.get("command")
    if not isinstance(command, str):
        return None, request, 'malformed request: missing "command" string'
    if command not in COMMANDS:
        return command, request, f"unknown command {command!r} (known: {', '.join(COMMANDS)})"
    return command, request, None


class ControlClient:
    """A request/reply client for one node's control endpoint, with a timeout.

    A REQ socket cannot be reused after a lost reply, so it is rebuilt after a timeout.
    """

    def __init__(
        self,
        endpoint: str,
        ctx: zmq.Context[zmq.Socket[bytes]] | None = None,
        timeout_s: float = 2.0,
        curve: tuple[bytes | str, tuple[bytes, bytes]] | None = None,
    ):
        """``curve``: (the node's public key, the client's key pair) for a node whose channel is
        secured (flowstat.node.curve)."""
        self.endpoint, self.timeout_ms = endpoint, int(timeout_s * 1000)
        self._ctx = ctx or zmq.Context.instance()
        self._sock: zmq.Socket[bytes] | None = None
        self._curve = curve

    def _socket(self) -> zmq.Socket[bytes]:
        if self._sock is None:
            self._sock = self._ctx.socket(zmq.REQ)
            self._sock.setsockopt(zmq.LINGER, 0)
            # A REQ socket's send waits for a connection to take the message, and one whose
            # handshake failed (a stranger to a CURVE node) is gone until the next reconnect: the
            # timeout holds for the send too, never an endless wait.
            self._sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)
            if self._curve is not None:
                secure_client(self._sock, *self._curve)
            self._sock.connect(self.endpoint)
        return self._sock

    def request_raw(self, payload: bytes) -> bytes:
        sock = self._socket()
        try:
            sock.send(payload)
        except zmq.Again:
            self.close()
            raise ControlError(f"{self.endpoint}: could not send within {self.timeout_ms} ms") from None
        if sock.poll(self.timeout_ms, zmq.POLLIN):
            return sock.recv()
        self.close()
        raise ControlError(f"{self.endpoint}: no reply within {self.timeout_ms} ms")

    def request(self, command: str, **fields: Any) -> dict[str, Any]:
        reply: dict[str, Any] = json.loads(self.request_raw(json.dumps({"command": command, **fields}).encode()))
        if "error" in reply:
            raise ControlError(f"{self.endpoint}: {reply['error']}")
        return reply

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None


def serve_requests(
    sock: zmq.Socket[bytes],
    handle: Callable[[bytes, str | None, dict[str, Any] | None, str | None], dict[str, Any]],
    limit: int = 64,
) -> int:
    """Answer the control requests waiting on a ROUTER socket; returns how many were answered."""
    answered = 0
    while answered < limit:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            break
        envelope, payload = frames[:-1], frames[-1]
        reply = handle(envelope[0], *parse_request(payload))
        sock.send_multipart(envelope + [json.dumps(reply).encode()])
        answered += 1
    return answered
