"""``udp://HOST:PORT`` (line protocol, Telegraf socket_listener) and ``tcp://HOST:PORT`` (line
protocol, or JSON lines for Logstash's tcp input with ``?format=json``)."""

from __future__ import annotations

import socket

from .base import Sink, SinkDown, SinkURLError, host_port

UDP_MAX = 60_000  # keep datagrams under the 64 KiB limit; lines are never split
SEND_TIMEOUT_S = 3.0  # a receiver that stops reading: the sink is down (as the C agent's)


class UdpSink(Sink):
    scheme = "udp"
    reliable = False  # nothing tells a sender that a datagram was dropped

    def __init__(self, url: str, host: str, port: int):
        super().__init__(url)
        self.addr = (host, port)
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)

    @classmethod
    def from_url(cls, url, parts, query):
        if query.get("format", "line") != "line":
            raise SinkURLError(f"{url}: UDP carries line protocol only")
        return cls(url, *host_port(url, parts))

    def send(self, payload: bytes, count: int) -> None:
        start = 0
        while start < len(payload):
            end = payload.rfind(b"\n", start, start + UDP_MAX) + 1 if len(payload) - start > UDP_MAX else len(payload)
            if end <= start:  # one line longer than a datagram: send it alone, let the receiver judge
                end = payload.find(b"\n", start) + 1 or len(payload)
            try:
                self.sock.sendto(payload[start:end], self.addr)
            except OSError as exc:
                raise SinkDown(f"udp {self.addr}: {exc.strerror}") from exc
            start = end

    def close(self) -> None:
        self.sock.close()


class TcpSink(Sink):
    scheme = "tcp"

    def __init__(self, url: str, host: str, port: int, fmt: str):
        super().__init__(url)
        self.addr, self.format = (host, port), fmt
        self.sock: socket.socket | None = None

    @classmethod
    def from_url(cls, url, parts, query):
        return cls(url, *host_port(url, parts), query.get("format", "line"))

    def send(self, payload: bytes, count: int) -> None:
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.addr, timeout=SEND_TIMEOUT_S)
            self.sock.sendall(payload)
        except OSError as exc:
            if self.sock is not None:
                self.sock.close()
                self.sock = None
            raise SinkDown(f"tcp {self.addr}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
