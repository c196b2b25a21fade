"""``flowstat replay``: load recorded run files into InfluxDB and Elasticsearch.

Idempotent: an Influx point is identified by its series (tags) and time, an Elasticsearch document
by ``run_id/agent/node_id/seq``, both taken from the sample, so replaying twice leaves the same
data. A malformed or truncated line is reported with its file and line number and skipped; every
good line is still loaded. Parsing runs in this process while one process per store posts batches,
so the stores' ingestion and our parsing overlap.
"""

from __future__ import annotations

import json
import select
import signal
import struct
import subprocess
import sys
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


def _field_types() -> tuple[dict[str, tuple], list[str]]:
    return {f.name: schema.PY_TYPES[f.type] for f in schema.fields()}, [f.name for f in schema.fields() if f.required]


_INTEGERS = frozenset(f.name for f in schema.fields() if f.type == "integer")


def _bad_field(doc: dict, types: dict[str, tuple], required: list[str]) -> str | None:
    """What is wrong with a sample, naming the field (schema.validate() explains more, for humans).
    The same checks as schema.Layout's, one field at a time: for the samples the layout cannot vouch for."""
    for key, value in doc.items():
        allowed = types.get(key)
        if allowed is None:
            return f"field {key!r}: not in the schema"
        if (type(value) not in allowed or (key in _INTEGERS and not 0 <= value <= schema.INT64_MAX)
                or value != value):
            return f"field {key!r}: wrong type or value {value!r}"[:120]
    for key in required:
        if key not in doc:
            return f"field {key!r}: missing"
    return None


def read_batches(path: Path, report: FileReport, *, influx: bool, es_index: str | None,
                 rebase_ms: int | None = None, batch: int = BATCH) -> Iterator[tuple[bytes, bytes, int]]:
    """A run file's good samples as batches ready to post: (line protocol, _bulk body, samples);
    a body is empty for a store not asked for. Bad lines go to the report with their number.

    The hot loop of replay (millions of lines): a line's checks and its line protocol come from
    its schema.Layout, worked out once per key order and value types; a line the layout cannot
    vouch for goes through the field-by-field checks and to_line_protocol, with the same result.
    """
    types, required = _field_types()
    layouts: dict[tuple, schema.Layout] = {}
    stamps: dict[str, int] = {}  # time string -> ns: every node sampled in one tick shares it
    action = b'{"index":{"_index":' + orjson.dumps(es_index) + b',"_id":%s}}\n'
    shift_ns = None
    lp: list[str] = []
    bulk: list[bytes] = []
    first = last = None
    n = 0  # good samples in this batch
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                doc = orjson.loads(raw)  # 3x faster than json on these lines, and strict (no NaN, no inf)
            except (ValueError, UnicodeDecodeError) as exc:
                why = "truncated line" if not raw.endswith(b"\n") else f"not JSON ({getattr(exc, 'msg', exc)})"
                report.bad.append((lineno, why))
                continue
            if type(doc) is not dict:
                report.bad.append((lineno, "not a JSON object"))
                continue
            values = tuple(doc.values())
            key = (tuple(doc), tuple(map(type, values)))
            layout = layouts.get(key)
            if layout is None:
                layout = layouts[key] = schema.layout(*key)
            fast = (layout.fast and b"\\" not in raw  # in JSON, a quote or backslash in a string needs one
                    and min(ints := layout.integers(values)) >= 0 and max(ints) <= schema.INT64_MAX)
            if not fast:
                if "flowstat_run" in doc:
                    if lineno != 1:
                        report.bad.append((lineno, "a run header that is not on the first line"))
                    else:
                        report.header = doc["flowstat_run"] if isinstance(doc["flowstat_run"], dict) else {}
                    continue
                why = _bad_field(doc, types, required)
                if why:
                    report.bad.append((lineno, why))
                    continue
            stamp = doc["time"]
            ns = stamps.get(stamp)
            if ns is None:
                try:
                    ns = schema.time_ns(stamp)
                except ValueError:
                    report.bad.append((lineno, f"field 'time': not ISO-8601 ({stamp[:40]!r})"))
                    continue
                if len(stamps) > 65536:
                    stamps.clear()
                stamps[stamp] = ns
            line: bytes | None = raw
            if rebase_ms is not None:
                if shift_ns is None:
                    shift_ns = rebase_ms * 1_000_000 - ns
                ns += shift_ns
                doc["time"] = iso_utc_ms(ns / 1e9)
                fast, line = False, None
            if first is None:
                first = doc
            report.nodes.add(doc["node_id"])
            if influx:
                lp.append(layout.line(values, ns) if fast else schema.to_line_protocol(doc) + "\n")
            if es_index is not None:
                # A validated line is already the document: it is sent as read, not rebuilt.
                body = line.rstrip(b"\r\n") if line is not None else schema.to_json(doc).encode()
                bulk.append(action % orjson.dumps(schema.document_id(doc)) + body + b"\n")
            n += 1
            if n == batch:
                report.good, report.last_time, report.bytes_read = report.good + n, doc["time"], f.tell()
                yield "".join(lp).encode(), b"".join(bulk), n
                lp, bulk, n = [], [], 0
            last = doc
        report.bytes_read = f.tell()
    if first is not None:
        report.first_time, report.run_id, report.host = first["time"], first["run_id"], first["host"]
        report.last_time = last["time"]
    if n:
        report.good += n
        yield "".join(lp).encode(), b"".join(bulk), n


_FRAME = struct.Struct("<Q")  # a batch on a poster's stdin: its length, then its bytes; length 0 ends


def _post_in_order(store: str, url: str, db: str) -> int:
    """A poster process (``python -m flowstat.replay --post STORE URL DB``): batches arrive on stdin
    and are posted in order, retried with back-off while the store refuses them for now (HTTP
    5xx/429). The first fatal error goes to stdout, one line; the batches after it are read and
    dropped (the replay stops). Ends at a zero length, or when the replay's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the replay's to handle
    session = requests.Session()
    post = influx_poster(session, url, db) if store == "influxdb" else es_poster(session, url)
    read = sys.stdin.buffer.read
    failed = False
    while (head := read(_FRAME.size)) and (size := _FRAME.unpack(head)[0]):
        payload = read(size)
        for attempt in range(6) if not failed and len(payload) == size else ():
            try:
                post(payload)
                break
            except ReplayError as exc:
                if "retry" not in str(exc) or attempt == 5:
                    print(" ".join(str(exc).split()), flush=True)
                    failed = True
                    break
                time.sleep(0.5 * 2 ** attempt)  # back off before re-posting a batch the store refused for now
    return 0


class Poster:
    """Posts batches to one store from a process of its own. Parsing holds the GIL nearly all the
    time, and a posting thread beside it waits for the GIL at every socket call: posting 1M points
    took half as long again with the parsing in a thread as in another process (bench_ingest.py,
    posting_contention; docs/benchmarks.md)."""

    def __init__(self, store: str, url: str, db: str = ""):
        self.store, self.name = store, "InfluxDB" if store == "influxdb" else "Elasticsearch"
        self.proc = subprocess.Popen([sys.executable, "-m", "flowstat.replay", "--post", store, url, db],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.error: str | None = None

    def _read_error(self, wait: bool) -> None:
        if self.error is None and (wait or select.select([self.proc.stdout], [], [], 0)[0]):
            line = self.proc.stdout.readline().decode(errors="replace").strip()
            if line:
                self.error = line
            elif self.proc.wait() != 0:
                self.error = f"the process posting to {self.name} ended with exit code {self.proc.returncode}"

    def put(self, payload: bytes) -> None:
        """Hand a batch over (waits while the process still posts the one before)."""
        self._read_error(wait=False)
        if self.error is None:
            try:
                self.proc.stdin.write(_FRAME.pack(len(payload)) + payload)
                return
            except (BrokenPipeError, OSError):
                self._read_error(wait=True)
        raise ReplayError(self.error or f"the process posting to {self.name} ended")

    def close(self, abort: bool = False) -> str | None:
        """Wait until every batch handed over is posted (or, aborting, stop at once); the first error."""
        if abort:
            self.proc.kill()
        else:
            try:
                self.proc.stdin.write(_FRAME.pack(0))
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            self._read_error(wait=True)
        self.proc.wait()
        return self.error


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
    posters = []
    if influx:
        posters.append(Poster("influxdb", influx.rstrip("/"), db))
    if es:
        posters.append(Poster("elasticsearch", es.rstrip("/")))
    rebase_ms = int(time.time() * 1000) if rebase else None
    reports = []
    finished = False
    try:
        for path in paths:
            report = FileReport(str(path))
            reports.append(report)
            shown = 0  # bytes of this file already counted by the progress bar
            for lp, bulk, count in read_batches(path, report, influx=bool(influx), es_index=index if es else None,
                                                rebase_ms=rebase_ms, batch=batch):
                for p in posters:
                    p.put(lp if p.store == "influxdb" else bulk)
                if progress:
                    progress(report.bytes_read - shown)
                    shown = report.bytes_read
            if progress:  # what follows the last batch (bad lines, or a file that ends on a batch)
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
                    posters[0].put(run_point(run).encode())
        finished = True
    finally:
        errors = [e for p in posters if (e := p.close(abort=not finished))]
    if errors:
        raise ReplayError(errors[0])
    return reports


if __name__ == "__main__" and sys.argv[1:2] == ["--post"] and len(sys.argv) == 5:
    sys.exit(_post_in_order(*sys.argv[2:]))
