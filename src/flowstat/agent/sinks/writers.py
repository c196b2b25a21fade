"""Sinks that write to a store through its flowstat.stores writer, with the stores' one retry policy:
every registered store, as ``NAME://HOST:PORT/TARGET`` (``influxdb://HOST:PORT/DATABASE``,
``elasticsearch://HOST:PORT/INDEX``; ``NAME+https://`` over TLS), and ``http(s)://HOST:PORT/PATH``,
an InfluxDB-compatible write endpoint such as Telegraf's influxdb_listener. Each logs in as the
store's credentials say (docs/security.md). Elasticsearch takes every node of a cluster,
``elasticsearch://HOST:PORT,HOST:PORT,.../INDEX``, and fails over between them (flowstat.stores._base)."""

from __future__ import annotations

from collections.abc import Iterable

from flowstat import stores
from flowstat.stores import CredentialsError, Outcome, StoreDown
from flowstat.stores.influxdb import InfluxDBWriter

from .base import ONE_NODE, Sink, SinkDown, SinkRejected, SinkURLError, host_port

TIMEOUT_S = 5.0  # an agent's batch is small: a store slower than this is treated as down (--sink-timeout)
TLS_SUFFIX = "+https"  # influxdb+https://, elasticsearch+https://: the store over TLS


class StoreSink(Sink):
    """A registered store (see flowstat.stores)."""

    def __init__(self, url: str, writer: stores.Writer):
        super().__init__(url)
        self.writer = writer

    @classmethod
    def from_url(cls, url: str, parts, query) -> StoreSink:
        if "format" in query:
            raise SinkURLError(f"{url}: a store sink has its own encoding: no ?format")
        store = stores.get(parts.scheme.removesuffix(TLS_SUFFIX))
        target = parts.path.strip("/")
        if not target:
            raise SinkURLError(
                f"{url}: needs a {store.target_kind}, e.g. "
                f"{store.name}://127.0.0.1:{store.default_port}/{store.default_target}"
            )
        http = "https" if parts.scheme.endswith(TLS_SUFFIX) else "http"
        try:
            stores.refuse_secrets_in_url(url, store.auth_prefix, store.auth_key[0])
            nodes = stores.parse_nodes(url, parts.netloc, store.default_port)  # each HOST:PORT checked
            if len(nodes) > 1 and not store.multi_node:
                raise SinkURLError(f"{url}: {ONE_NODE}")
            sink = cls(url, store(f"{http}://{','.join(nodes)}", target, timeout_s=TIMEOUT_S, shown_url=url))
        except (CredentialsError, stores.StoreURLError) as exc:
            raise SinkURLError(str(exc)) from None
        sink.scheme = store.name
        return sink

    def configure(self, timeout_s: float | None = None, node_backoff_s: float | None = None) -> None:
        if timeout_s is not None:
            self.writer.timeout_s = timeout_s
        if node_backoff_s is not None:
            self.writer.node_backoff_s = node_backoff_s

    def longest_send_s(self) -> float:
        # each node asked in turn, its connection and its answer each up to the time-out
        return 2 * self.writer.timeout_s * len(self.writer.nodes)

    def encode(self, samples: Iterable[dict]) -> bytes:
        return self.writer.encode(samples)

    def encode_self_samples(self, docs: Iterable[dict]) -> bytes:
        return self.writer.encode_self_samples(docs)

    def encode_run(self, doc: dict) -> bytes:
        return self.writer.encode_run(doc)

    def encode_edges(self, docs: Iterable[dict]) -> bytes:
        return self.writer.encode_flow("edge", docs)

    def send(self, payload: bytes, count: int) -> Outcome:
        try:
            outcome = self.writer.post(payload, count)
        except StoreDown as exc:
            raise SinkDown(str(exc), getattr(exc, "trouble", "down"), exc.timed_out) from exc
        if outcome.refused == count:
            raise SinkRejected(outcome.reasons[0] if outcome.reasons else "refused")
        return outcome

    def failovers(self) -> int:
        return self.writer.failovers

    def close(self) -> None:
        self.writer.close()


class HttpLineSink(StoreSink):
    """Line protocol POSTed to the URL as given (Telegraf's influxdb_listener: http://HOST:PORT/write)."""

    scheme = "http"

    @classmethod
    def from_url(cls, url, parts, query):
        if "format" in query:
            raise SinkURLError(f"{url}: this sink sends line protocol: no ?format")
        host_port(url, parts, 443 if parts.scheme == "https" else 80)
        try:
            stores.refuse_secrets_in_url(url, "FLOWSTAT_INFLUX", "TOKEN")
            return cls(url, InfluxDBWriter(url, endpoint=url, timeout_s=TIMEOUT_S, shown_url=url))
        except (CredentialsError, stores.StoreURLError) as exc:
            raise SinkURLError(str(exc)) from None


class HttpsLineSink(HttpLineSink):
    scheme = "https"
