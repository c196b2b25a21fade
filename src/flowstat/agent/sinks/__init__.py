"""Where the agent's samples go, by URL (see collectors/README.md). One module per kind of sink,
each class registered under its URL scheme; every store of flowstat.stores is a sink too:

    stdout://[?format=json]              file:///PATH[?format=json]
    udp://HOST:PORT                      tcp://HOST:PORT[?format=json]
    http://HOST:PORT/write               influxdb://HOST:PORT/DATABASE
    elasticsearch://HOST:PORT/INDEX      (a store's scheme + "+https": over TLS)
    elasticsearch://HOST:PORT,HOST:PORT,.../INDEX   (every node of a cluster: failed over)

Credentials come from the environment or a credentials file, never from the URL (docs/security.md).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from flowstat import stores

from . import console, sockets, writers
from .base import Sink, SinkDown, SinkRejected, SinkRunner, SinkURLError, registered, schemes

__all__ = ["Sink", "SinkDown", "SinkRejected", "SinkRunner", "SinkURLError", "open_sink", "known_schemes"]
_MODULES = (console, sockets, writers)  # imported for their registrations


def known_schemes() -> list[str]:
    return schemes() + [s for s in stores.names() if s not in schemes()]


def open_sink(url: str, timeout_s: float | None = None, node_backoff_s: float | None = None) -> Sink:
    """A sink from its URL; a URL that names no sink is an error naming what is wrong. ``timeout_s``
    and ``node_backoff_s``: see Sink.configure (None: the defaults)."""
    sink = _open(url)
    sink.configure(timeout_s, node_backoff_s)
    return sink


def _open(url: str) -> Sink:
    parts = urlsplit("stdout://" if url == "-" else url)
    try:  # first: every message below names the URL, which must not show who logs in
        es = parts.scheme.startswith("elasticsearch")
        stores.refuse_secrets_in_url(url, "FLOWSTAT_ES" if es else "FLOWSTAT_INFLUX", "API_KEY" if es else "TOKEN")
    except stores.CredentialsError as exc:
        raise SinkURLError(str(exc)) from None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    fmt = query.get("format", "line")
    if fmt not in ("line", "json"):
        raise SinkURLError(f"{url}: format must be line or json, not {fmt!r}")
    cls = registered(parts.scheme)
    if cls is not None:
        return cls.from_url(url, parts, query)
    if parts.scheme.removesuffix(writers.TLS_SUFFIX) in stores.names():
        return writers.StoreSink.for_store(url, parts, query)
    raise SinkURLError(f"{url}: unknown sink ({', '.join(known_schemes())})")
