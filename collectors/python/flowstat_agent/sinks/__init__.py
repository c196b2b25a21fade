"""Sinks, by URL (see collectors/README.md):

    stdout://[?format=json]              file:///PATH[?format=json]
    udp://HOST:PORT                      tcp://HOST:PORT[?format=json]
    http://HOST:PORT/write               influxdb://HOST:PORT/DATABASE
    elasticsearch://HOST:PORT/INDEX
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from .base import Sink, SinkDown, SinkRejected, SinkRunner
from .console import FileSink, StdoutSink
from .http import ElasticsearchSink, HttpLineSink, InfluxSink
from .sockets import TcpSink, UdpSink

__all__ = ["Sink", "SinkDown", "SinkRejected", "SinkRunner", "open_sink", "SinkURLError"]


class SinkURLError(ValueError):
    pass


def open_sink(url: str) -> Sink:
    """A sink from its URL; a URL that names no sink is an error naming what is wrong."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    fmt = query.get("format", "line")
    if fmt not in ("line", "json"):
        raise SinkURLError(f"{url}: format must be line or json, not {fmt!r}")

    def host_port(default_port: int | None = None) -> tuple[str, int]:
        try:
            port = parts.port or default_port
        except ValueError as exc:
            raise SinkURLError(f"{url}: bad port") from exc
        if not parts.hostname or not port:
            raise SinkURLError(f"{url}: needs HOST:PORT")
        return parts.hostname, port

    scheme = parts.scheme
    if scheme == "stdout" or url == "-":
        sink: Sink = StdoutSink(url)
    elif scheme == "file":
        if not parts.path:
            raise SinkURLError(f"{url}: needs a path, e.g. file:///tmp/samples.lp")
        sink = FileSink(url, parts.path)
    elif scheme == "udp":
        if fmt != "line":
            raise SinkURLError(f"{url}: UDP carries line protocol only")
        sink = UdpSink(url, *host_port())
    elif scheme == "tcp":
        sink = TcpSink(url, *host_port(), fmt)
    elif scheme in ("http", "https"):
        sink = HttpLineSink(url)
    elif scheme == "influxdb":
        db = parts.path.strip("/")
        if not db:
            raise SinkURLError(f"{url}: needs a database, e.g. influxdb://127.0.0.1:8086/flowstat")
        sink = InfluxSink(url, *host_port(8086), db)
    elif scheme == "elasticsearch":
        index = parts.path.strip("/")
        if not index:
            raise SinkURLError(f"{url}: needs an index, e.g. elasticsearch://127.0.0.1:9200/flowstat-samples")
        sink = ElasticsearchSink(url, *host_port(9200), index)
    else:
        raise SinkURLError(f"{url}: unknown sink (stdout, file, udp, tcp, http, influxdb, elasticsearch)")
    if scheme in ("stdout", "file"):
        sink.format = fmt
    return sink
