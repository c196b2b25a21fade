"""HTTP sinks: ``http://HOST:PORT/write`` (line protocol: Telegraf influxdb_listener),
``influxdb://HOST:PORT/DB`` (InfluxDB v1 /write, direct) and ``elasticsearch://HOST:PORT/INDEX``
(_bulk, direct, with deterministic _ids so a resend overwrites instead of duplicating)."""

from __future__ import annotations

import json
from typing import Iterable

import requests

from .. import schema
from .base import Sink, SinkDown, SinkRejected

TIMEOUT_S = 5.0


def _post(session: requests.Session, url: str, payload: bytes, content_type: str, **params) -> requests.Response:
    try:
        resp = session.post(url, data=payload, params=params or None, timeout=TIMEOUT_S,
                            headers={"Content-Type": content_type})
    except requests.RequestException as exc:
        raise SinkDown(f"{url}: {exc.__class__.__name__}") from exc
    if resp.status_code >= 500 or resp.status_code == 429:
        raise SinkDown(f"{url}: HTTP {resp.status_code}")
    if resp.status_code >= 400:
        raise SinkRejected(f"{url}: HTTP {resp.status_code}: {resp.text[:300]}")
    return resp


class HttpLineSink(Sink):
    scheme = "http"

    def __init__(self, url: str):
        super().__init__(url)
        self.session = requests.Session()

    def send(self, payload: bytes) -> None:
        _post(self.session, self.url, payload, "text/plain; charset=utf-8")


class InfluxSink(Sink):
    scheme = "influxdb"

    def __init__(self, url: str, host: str, port: int, database: str):
        super().__init__(url)
        self.endpoint, self.database = f"http://{host}:{port}/write", database
        self.session = requests.Session()

    def send(self, payload: bytes) -> None:
        _post(self.session, self.endpoint, payload, "text/plain; charset=utf-8", db=self.database, precision="ns")


class ElasticsearchSink(Sink):
    scheme = "elasticsearch"
    format = "json"

    def __init__(self, url: str, host: str, port: int, index: str):
        super().__init__(url)
        self.endpoint, self.index = f"http://{host}:{port}/_bulk", index
        self.session = requests.Session()

    def encode(self, samples: Iterable[dict]) -> bytes:
        lines = []
        for s in samples:
            lines.append(json.dumps({"index": {"_index": self.index, "_id": schema.document_id(s)}}))
            lines.append(schema.to_json(s))
        return ("\n".join(lines) + "\n").encode()

    def send(self, payload: bytes) -> None:
        resp = _post(self.session, self.endpoint, payload, "application/x-ndjson")
        body = resp.json()
        if body.get("errors"):
            statuses = [next(iter(item.values())).get("status", 0) for item in body.get("items", [])]
            if any(st >= 500 or st == 429 for st in statuses):
                raise SinkDown(f"{self.endpoint}: some documents refused for now")  # resend is idempotent
            bad = [next(iter(item.values())).get("error") for item in body["items"]
                   if next(iter(item.values())).get("status", 0) >= 400]
            raise SinkRejected(f"{self.endpoint}: {len(bad)} documents refused: {bad[:1]}")
