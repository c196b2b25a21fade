"""Where the agent's samples go, by URL (see collectors/README.md). One module per kind of sink,
each class registered in SINKS below under its URL scheme; every store of flowstat.stores is a
sink too:

    stdout://[?format=json]              file:///PATH[?format=json]
    udp://HOST:PORT                      tcp://HOST:PORT[?format=json]
    http://HOST:PORT/write               influxdb://HOST:PORT/DATABASE
    elasticsearch://HOST:PORT/INDEX      (a store's scheme + "+https": over TLS)
    elasticsearch://HOST:PORT,HOST:PORT,.../INDEX   (every node of a cluster: failed over)
    prometheus://127.0.0.1:PORT          (serves /metrics for a Prometheus to scrape; port 9464 by default)
    prometheus://HOST:PORT?web_config=/etc/flowstat/web-config.yml   (TLS and basic auth from an
        exporter-toolkit web-config.yml; beyond loopback only with both: exposition.py, webconfig.py)
    prometheus://127.0.0.1:PORT?families=cpu_user_seconds,vmrss_kb,node_state&drop_labels=run_id
        (only these node families: sample fields or their family names, e.g. vmrss_kb or
        flowstat_node_resident_memory_bytes; node labels left out: run_id, host, role, agent,
        never node_id; options joined by &)
    At exit, a prometheus:// sink that was scraped keeps serving until one scrape took the final
    samples, or --drain-timeout passed.

Credentials come from the environment or a credentials file, never from the URL (docs/security.md).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from flowstat import stores
from flowstat.registry import Registry

from . import console, exposition, sockets, writers
from .base import Sink, SinkDown, SinkRejected, SinkRunner, SinkURLError

__all__ = ["SINKS", "Sink", "SinkDown", "SinkRejected", "SinkRunner", "SinkURLError", "open_sink", "known_schemes"]

# Every sink, by its URL scheme. A store's scheme + "+https" (writers.TLS_SUFFIX) is the store over TLS.
SINKS: Registry[type[Sink]] = Registry(
    "sink",
    {
        "stdout": console.StdoutSink,
        "file": console.FileSink,
        "udp": sockets.UdpSink,
        "tcp": sockets.TcpSink,
        "http": writers.HttpLineSink,
        "https": writers.HttpsLineSink,
        "prometheus": exposition.PrometheusSink,
        **{name: writers.StoreSink for name in stores.names()},  # every store takes an agent's samples
    },
)


PROMETHEUS_OPTIONS = ("web_config", "families", "drop_labels")  # options of prometheus:// only


def known_schemes() -> list[str]:
    return SINKS.names()


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
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    fmt = query.get("format", "line")
    if fmt not in ("line", "json"):
        raise SinkURLError(f"{url}: format must be line or json, not {fmt!r}")
    scheme = parts.scheme
    for option in PROMETHEUS_OPTIONS:
        if option in query and scheme != "prometheus":
            raise SinkURLError(f"{url}: {option} is for prometheus:// only")
    if scheme.endswith(writers.TLS_SUFFIX) and scheme.removesuffix(writers.TLS_SUFFIX) in stores.names():
        scheme = scheme.removesuffix(writers.TLS_SUFFIX)  # the store over TLS: its writer says https
    if scheme not in SINKS:
        raise SinkURLError(f"{url}: unknown sink ({', '.join(known_schemes())})")
    return SINKS.get(scheme).from_url(url, parts, query)
