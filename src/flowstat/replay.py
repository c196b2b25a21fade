"""``flowstat replay``: load recorded run files into InfluxDB and Elasticsearch.

Idempotent: an Influx point is identified by its series (tags) and time, an Elasticsearch document
by ``run_id/agent/node_id/seq``, both taken from the sample, so replaying twice leaves the same
data. A malformed or truncated line is reported with its file and line number and skipped; every
good line is still loaded. Parsing runs in this thread while one thread per store posts batches,
so the stores' ingestion and our parsing overlap.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import orjson
import requests

from flowstat.templates import INFLUX_DB, RUNS_INDEX, SAMPLES_INDEX
from flowstat.timeutil import iso_utc_ms
from flowstat_agent import schema

BATCH = 5000


class ReplayError(RuntimeError):
    """The replay cannot go on (a store is down or refuses data); the message names it."""


@dataclass
class FileReport:
    path: str
    run_id: str | None = None
    header: dict | None = None
    good: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    first_time: str | None = None
    last_time: str | None = None
    nodes: set = field(default_factory=set)
    host: str | None = None
    bytes_read: int = 0  # for the progress bar: the file is read once, its size comes from stat()


_PY_TYPES = {"string": (str,), "integer": (int,), "number": (float, int), "boolean": (bool,)}


def _field_types() -> tuple[dict[str, tuple], list[str]]:
    return {f.name: _PY_TYPES[f.type] for f in schema.fields()}, [f.name for f in schema.fields() if f.required]


_NON_NEGATIVE = frozenset(f.name for f in schema.fields() if f.type == "integer")


def _bad_field(doc: dict, types: dict[str, tuple], required: list[str]) -> str | None:
    """What is wrong with a sample, cheaply (schema.validate() explains more, for humans)."""
    for key, value in doc.items():
        allowed = types.get(key)
        if allowed is None:
            return f"field {key!r}: not in the schema"
        if type(value) not in allowed or (key in _NON_NEGATIVE and value < 0) or value != value:
            return f"field {key!r}: wrong type or value {value!r}"[:120]
    for key in required:
        if key not in doc:
            return f"field {key!r}: missing"
    return None


def parse_run_file(path: Path, report: FileReport, rebase_ms: int | None = None) -> Iterator[tuple[dict, bytes | None]]:
    """The good samples of a run file, in order, each with its line when that line is still the
    sample's exact document (None once the time was rebased); bad lines go to the report."""
    types, required = _field_types()
    shift_ms = None
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            report.bytes_read += len(raw)
            try:
                doc = orjson.loads(raw)  # 3x faster than json on these lines, and strict (no NaN)
            except (ValueError, UnicodeDecodeError) as exc:
                why = "truncated line" if not raw.endswith(b"\n") else f"not JSON ({exc.msg if hasattr(exc, 'msg') else exc})"
                report.bad.append((lineno, why))
                continue
            if not isinstance(doc, dict):
                report.bad.append((lineno, "not a JSON object"))
                continue
            if "flowstat_run" in doc:
                if lineno != 1:
                    report.bad.append((lineno, "a run header that is not on the first line"))
                    continue
                report.header = doc["flowstat_run"] if isinstance(doc["flowstat_run"], dict) else {}
                continue
            why = _bad_field(doc, types, required)
            if why:
                report.bad.append((lineno, why))
                continue
            try:
                stamp_ms = schema.time_ns(doc["time"]) // 1_000_000
            except ValueError:
                report.bad.append((lineno, f"field 'time': not ISO-8601 ({doc['time'][:40]!r})"))
                continue
            line: bytes | None = raw.rstrip(b"\r\n")
            if rebase_ms is not None:
                if shift_ms is None:
                    shift_ms = rebase_ms - stamp_ms
                doc["time"] = iso_utc_ms((stamp_ms + shift_ms) / 1000)
                line = None
            report.good += 1
            report.first_time = report.first_time or doc["time"]
            report.last_time = doc["time"]
            report.run_id = report.run_id or doc["run_id"]
            report.host = report.host or doc["host"]
            report.nodes.add(doc["node_id"])
            yield doc, line


class Poster(threading.Thread):
    """Posts batches to one store, in order, with retries on 5xx/429; keeps the first fatal error."""

    def __init__(self, name: str, post):
        super().__init__(daemon=True, name=f"replay-{name}")
        self.store, self.post = name, post
        self.queue: "queue.Queue[tuple[bytes, int] | None]" = queue.Queue(maxsize=4)
        self.error: str | None = None
        self.sent = 0

    def run(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.error:
                continue
            payload, count = item
            for attempt in range(6):
                try:
                    self.post(payload)
                    self.sent += count
                    break
                except ReplayError as exc:
                    if "retry" not in str(exc) or attempt == 5:
                        self.error = str(exc)
                        break
                    time.sleep(0.5 * 2 ** attempt)  # back off before re-posting a batch the store refused for now


def _check(resp: requests.Response, what: str) -> requests.Response:
    if resp.status_code in (429, 502, 503, 504):
        raise ReplayError(f"{what}: HTTP {resp.status_code} (retry)")
    if resp.status_code >= 300:
        raise ReplayError(f"{what}: HTTP {resp.status_code}: {resp.text[:300]}")
    return resp


def influx_poster(session: requests.Session, url: str, db: str):
    def post(payload: bytes) -> None:
        try:
            resp = session.post(f"{url}/write", params={"db": db, "precision": "ns"}, data=payload, timeout=60)
        except requests.RequestException as exc:
            raise ReplayError(f"InfluxDB at {url} cannot be reached ({exc.__class__.__name__})") from exc
        _check(resp, f"InfluxDB {url}/write")
    return post


def es_poster(session: requests.Session, url: str):
    def post(payload: bytes) -> None:
        try:
            resp = session.post(f"{url}/_bulk", data=payload, timeout=120,
                                headers={"Content-Type": "application/x-ndjson"})
        except requests.RequestException as exc:
            raise ReplayError(f"Elasticsearch at {url} cannot be reached ({exc.__class__.__name__})") from exc
        body = _check(resp, f"Elasticsearch {url}/_bulk").json()
        if body.get("errors"):
            items = [next(iter(i.values())) for i in body["items"]]
            failed = [i for i in items if i.get("status", 200) >= 300]
            if any(i["status"] in (429, 503) for i in failed):
                raise ReplayError(f"Elasticsearch {url}: {len(failed)} documents refused for now (retry)")
            raise ReplayError(f"Elasticsearch {url}: {len(failed)} documents refused: {failed[0].get('error')}")
    return post


def run_document(report: FileReport) -> dict:
    header = report.header or {}
    doc = {"run_id": report.run_id, "started": report.first_time, "finished": report.last_time,
           "host": report.host, "source": report.path, "samples": report.good, "nodes": sorted(report.nodes),
           "parameters": header.get("parameters") or {}}
    summary_path = Path(report.path).with_name("summary.json")
    try:
        s = json.loads(summary_path.read_text())
        c = s.get("conservation", {})
        doc["summary"] = {"ok": bool(s.get("ok")), "seconds": s.get("seconds"), "objects_sent": c.get("objects_sent"),
                          "merged_objects": c.get("merged_objects"),
                          "merged_objects_per_second": (sum(n.get("objects_merged", 0) for n in s.get("nodes", []))
                                                        / s["seconds"]) if s.get("seconds") else None}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return doc


def run_point(doc: dict) -> str:
    """The run as an Influx point (measurement flowstat_run), so Grafana can list runs too."""
    p = doc.get("parameters", {})
    fields = {k: p[k] for k in ("producers", "mergers", "buffer_size", "object_bytes", "rate_per_producer")
              if isinstance(p.get(k), (int, float)) and not isinstance(p.get(k), bool)}
    fields["samples"] = doc["samples"]
    body = ",".join(f"{k}={v}i" if isinstance(v, int) else f"{k}={float(v)!r}" for k, v in fields.items())
    tag = schema._escape_key(str(doc["run_id"]))
    otype = schema._escape_key(str(p.get("object_type", "unknown")))
    return f"flowstat_run,run_id={tag},object_type={otype} {body} {schema.time_ns(doc['started'])}\n"


def replay(paths: list[Path], influx: str | None, es: str | None, *, db: str = INFLUX_DB,
           index: str = SAMPLES_INDEX, rebase: bool = False, batch: int = BATCH, progress=None) -> list[FileReport]:
    session = requests.Session()
    posters = []
    if influx:
        posters.append(Poster("influxdb", influx_poster(session, influx.rstrip("/"), db)))
    if es:
        posters.append(Poster("elasticsearch", es_poster(requests.Session(), es.rstrip("/"))))
    for p in posters:
        p.start()
    rebase_ms = int(time.time() * 1000) if rebase else None
    reports = []

    def flush(lines_influx: list[str], lines_es: list[str], count: int) -> None:
        for p in posters:
            if p.error:
                raise ReplayError(p.error)
            payload = ("".join(lines_influx) if p.store == "influxdb" else "".join(lines_es)).encode()
            p.queue.put((payload, count))

    try:
        for path in paths:
            report = FileReport(str(path))
            reports.append(report)
            lp: list[str] = []
            bulk: list[str] = []
            n = 0
            shown = 0  # bytes of this file already counted by the progress bar
            action = '{"index":{"_index":%s,"_id":%s}}\n'
            index_json = json.dumps(index)
            for doc, line in parse_run_file(path, report, rebase_ms):
                if influx:
                    lp.append(schema.to_line_protocol(doc) + "\n")
                if es:
                    # A validated line is already the document: it is sent as read, not rebuilt.
                    body = line.decode() if line is not None else schema.to_json(doc)
                    bulk.append(action % (index_json, orjson.dumps(schema.document_id(doc)).decode()) + body + "\n")
                n += 1
                if n == batch:
                    flush(lp, bulk, n)
                    if progress:
                        progress(report.bytes_read - shown)
                        shown = report.bytes_read
                    lp, bulk, n = [], [], 0
            if n:
                flush(lp, bulk, n)
            if progress:
                progress(report.bytes_read - shown)
            if report.good and report.run_id:
                run = run_document(report)
                if es:
                    try:
                        resp = requests.put(f"{es.rstrip('/')}/{RUNS_INDEX}/_doc/"
                                            f"{requests.utils.quote(run['run_id'], safe='')}", json=run, timeout=30)
                    except requests.RequestException as exc:
                        raise ReplayError(f"Elasticsearch at {es} cannot be reached ({exc.__class__.__name__})") from exc
                    _check(resp, f"Elasticsearch {es} run document")
                if influx:
                    posters[0].queue.put((run_point(run).encode(), 0))
    finally:
        for p in posters:
            p.queue.put(None)
        for p in posters:
            p.join()
    errors = [p.error for p in posters if p.error]
    if errors:
        raise ReplayError(errors[0])
    return reports
