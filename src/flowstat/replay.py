"""``flowstat replay``: load recorded run files into the stores.

Idempotent: an InfluxDB point is identified by its series (tags) and time, an Elasticsearch
document by ``run_id/agent/node_id/seq``, both taken from the sample, so replaying twice leaves the
same data. A malformed or truncated line is reported with its file and line number and skipped;
every good line is still loaded. Parsing runs in this process while one process per store writes
the batches (flowstat.stores.WriterProcess), so the stores' ingestion and our parsing overlap.
Every run also gets its run document (flowstat.schema.run) in each store, and the agent's
self-samples the run file holds (flowstat.schema.agent: its lines {"flowstat_agent": {...}}) go to
the stores as the agents send them (measurement flowstat_agent, index flowstat-agents).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import orjson

from flowstat import schema, stores
from flowstat.progress import Progress
from flowstat.schema import agent as agent_schema
from flowstat.schema import run as run_schema
from flowstat.stores import BatchEncoder, WriterProcess
from flowstat.timeutil import iso_utc_ms

BATCH = 5000
RUN_DOCUMENT = "run.json"  # beside the run file: the harness's run document


class ReplayError(RuntimeError):
    """The replay cannot go on (a store is down or refuses data); the message names it."""


@dataclass
class FileReport:
    path: str
    run_id: str | None = None
    header: dict | None = None
    good: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    notes: list[str] = field(default_factory=list)  # what a person should know (an unusable run.json)
    first_time: str | None = None
    last_time: str | None = None
    nodes: set = field(default_factory=set)
    host: str | None = None
    bytes_read: int = 0  # for the progress bar: the file is read once, its size comes from stat()
    shift_ns: int = 0  # --rebase-time: how far the samples were moved
    agent_samples: list[dict] = field(default_factory=list)  # the agent's self-samples (a few a minute)


def _field_types() -> tuple[dict[str, tuple], list[str]]:
    return {f.name: schema.PY_TYPES[f.type] for f in schema.fields()}, [f.name for f in schema.fields() if f.required]


_INTEGERS = frozenset(f.name for f in schema.fields() if f.type == "integer")
_ENUMS = {f.name: frozenset(f.enum) for f in schema.fields() if f.enum}


def _bad_field(doc: dict, types: dict[str, tuple], required: list[str]) -> str | None:
    """What is wrong with a sample, naming the field (schema.validate() explains more, for humans).
    The same checks as schema.Layout's, one field at a time: for the samples the layout cannot vouch for."""
    for key, value in doc.items():
        allowed = types.get(key)
        if allowed is None:
            return f"field {key!r}: not in the schema"
        if (type(value) not in allowed or (key in _INTEGERS and not 0 <= value <= schema.INT64_MAX)
                or value != value or (key in _ENUMS and value not in _ENUMS[key])):
            return f"field {key!r}: wrong type or value {value!r}"[:120]
    for key in required:
        if key not in doc:
            return f"field {key!r}: missing"
    return None


def read_batches(path: Path, report: FileReport, encoders: list[BatchEncoder], *, rebase_ms: int | None = None,
                 batch: int = BATCH) -> Iterator[tuple[list[bytes], int]]:
    """A run file's good samples as batches ready to write: one body per encoder (one per store),
    and the number of samples. Bad lines go to the report with their number.

    The hot loop of replay (millions of lines): a line's checks and its line protocol come from its
    schema.Layout, worked out once per key order and value types, and its JSON document is the
    line as read; each sample is encoded once in each of the schema's encodings a store wants, and
    each store's encoder puts the batch together. A line the layout cannot vouch for goes through
    the field-by-field checks and to_line_protocol, with the same result.
    """
    types, required = _field_types()
    layouts: dict[tuple, schema.Layout] = {}
    stamps: dict[str, int] = {}  # time string -> ns: every node sampled in one tick shares it
    wants = {e.wants for e in encoders}
    lines, docs, ids = [], [], []  # this batch, in the encodings the stores want
    lp, js = "line" in wants, "json" in wants
    shift_ns = None
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
                    and min(ints := layout.integers(values)) >= 0 and max(ints) <= schema.INT64_MAX
                    and (layout.enums is None or layout.enums(values) in layout.allowed))
            if not fast:
                if "flowstat_run" in doc:
                    if lineno != 1:
                        report.bad.append((lineno, "a run header that is not on the first line"))
                    else:
                        report.header = doc["flowstat_run"] if isinstance(doc["flowstat_run"], dict) else {}
                    continue
                if agent_schema.RUN_FILE_KEY in doc:
                    _keep_agent_sample(doc, lineno, report)
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
                    shift_ns = report.shift_ns = rebase_ms * 1_000_000 - ns
                ns += shift_ns
                doc["time"] = iso_utc_ms(ns / 1e9)
                fast, line = False, None
            if first is None:
                first = doc
            report.nodes.add(doc["node_id"])
            if lp:
                lines.append(layout.line(values, ns) if fast else schema.to_line_protocol(doc) + "\n")
            if js:  # a validated line is already the document: it is sent as read, not rebuilt
                docs.append(line.rstrip(b"\r\n") if line is not None else schema.to_json(doc).encode())
                ids.append(schema.document_id(doc))
            n += 1
            if n == batch:
                report.good, report.last_time, report.bytes_read = report.good + n, doc["time"], f.tell()
                yield [e.encode(lines if e.wants == "line" else docs, ids) for e in encoders], n
                lines, docs, ids = [], [], []
                n = 0
            last = doc
        report.bytes_read = f.tell()
    if first is not None:
        report.first_time, report.run_id, report.host = first["time"], first["run_id"], first["host"]
        report.last_time = last["time"]
    if n:
        report.good += n
        yield [e.encode(lines if e.wants == "line" else docs, ids) for e in encoders], n


def _keep_agent_sample(line: dict, lineno: int, report: FileReport) -> None:
    """A run file's self-sample line ({"flowstat_agent": {...}}): kept for the stores when it
    conforms, else reported by its line number and the field."""
    doc = line[agent_schema.RUN_FILE_KEY]
    if len(line) != 1 or not isinstance(doc, dict):
        report.bad.append((lineno, f"{agent_schema.RUN_FILE_KEY}: not a self-sample (one object alone on its line)"))
        return
    errors = agent_schema.validate(doc)
    if errors:
        report.bad.append((lineno, f"{agent_schema.RUN_FILE_KEY}.{errors[0]}"[:160]))
    else:
        report.agent_samples.append(doc)


def _rebased(docs: list[dict], report: FileReport, rebase_ms: int) -> list[dict]:
    """Self-samples moved in time as the file's samples were (or, in a file of self-samples only,
    so that the first starts at rebase_ms)."""
    if not report.shift_ns and report.good == 0 and docs:
        report.shift_ns = rebase_ms * 1_000_000 - schema.time_ns(docs[0]["time"])
    return [{**d, "time": iso_utc_ms((schema.time_ns(d["time"]) + report.shift_ns) / 1e9)} for d in docs]


def agent_batches(report: FileReport, writers: dict, *, rebase_ms: int | None = None,
                  batch: int = BATCH) -> Iterator[tuple[list[bytes], int]]:
    """The run file's self-samples as batches ready to write: one body per writer, and their number."""
    docs = report.agent_samples if rebase_ms is None else _rebased(report.agent_samples, report, rebase_ms)
    for start in range(0, len(docs), batch):
        chunk = docs[start:start + batch]
        yield [w.encode_agent(chunk) for w in writers.values()], len(chunk)


def _usable(doc: dict, report: FileReport, source: str) -> dict:
    """``doc`` without the top-level fields that do not conform to the run schema (each named in
    the report's notes): what is good is kept. Missing required fields are the caller's to fill."""
    doc = dict(doc)
    while errors := [e for e in run_schema.validate(doc) if not e.endswith("required field is missing")]:
        key = errors[0].split(":")[0].split(".")[0].split("[")[0]
        report.notes.append(f"{source}: {errors[0]}; left out of the run document")
        doc.pop(key, None)
    return doc


def _run_json(path: Path, report: FileReport) -> dict:
    """The harness's run document beside the run file, if there is one of this run."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        report.notes.append(f"{path}: cannot be read ({exc}); the run document comes from the run file")
        return {}
    if not isinstance(doc, dict) or doc.get("run_id") != report.run_id:
        what = f"run {doc.get('run_id')!r}" if isinstance(doc, dict) else "not a run document"
        report.notes.append(f"{path}: {what}, but the samples are of run {report.run_id!r}; the run document "
                            f"comes from the run file")
        return {}
    return doc


def run_document(report: FileReport) -> dict:
    """The run's document: the harness's run.json beside the run file, or, without one, what the run
    file's header says (run id, start, host, parameters); completed from the samples (start and end
    when missing, nodes, how many samples were loaded). With --rebase-time its times move as the
    samples did."""
    run_fields = run_schema.schema()["properties"]
    path = Path(report.path).with_name(RUN_DOCUMENT)
    doc, source = (_run_json(path, report), str(path)) if path.exists() else ({}, "")
    if not doc:
        doc, source = {k: v for k, v in (report.header or {}).items() if k in run_fields}, f"{report.path}:1"
    doc = _usable({**doc, "run_id": report.run_id}, report, source)
    if report.shift_ns:
        for key in ("started", "finished"):
            if key in doc:
                doc[key] = iso_utc_ms((schema.time_ns(doc[key]) + report.shift_ns) / 1e9)
    for key, value in (("started", report.first_time), ("finished", report.last_time), ("host", report.host),
                       ("nodes", sorted(report.nodes))):
        doc.setdefault(key, value)
    doc.setdefault("label", run_schema.label(doc))
    doc["samples"] = report.good
    errors = run_schema.validate(doc)
    if errors:  # what the samples filled in is ours: a bug, not the user's data
        raise ReplayError(f"{report.path}: the run document does not conform: {errors[0]}")
    return doc


def replay(paths: list[Path], targets: dict[str, tuple[str, str]], *, rebase: bool = False, batch: int = BATCH,
           progress=None) -> list[FileReport]:
    """Load run files into the stores ``targets`` names: {store: (url, database or index)}."""
    writers = {name: stores.get(name)(url, target) for name, (url, target) in targets.items()}
    for w in writers.values():
        try:
            w.check()
        except stores.StoreDown as exc:
            for each in writers.values():
                each.close()
            raise ReplayError(str(exc)) from None
    procs = {name: WriterProcess(name, url, target) for name, (url, target) in targets.items()}
    rebase_ms = int(time.time() * 1000) if rebase else None
    reports = []
    finished = False
    try:
        for path in paths:
            report = FileReport(str(path))
            reports.append(report)
            shown = 0  # bytes of this file already counted by the progress bar
            encoders = [w.encoder() for w in writers.values()]
            for bodies, count in read_batches(path, report, encoders, rebase_ms=rebase_ms, batch=batch):
                for proc, body in zip(procs.values(), bodies):
                    proc.put(body, count)
                if progress:
                    progress(report.bytes_read - shown)
                    shown = report.bytes_read
            if progress:  # what follows the last batch (bad lines, or a file that ends on a batch)
                progress(report.bytes_read - shown)
            for bodies, count in agent_batches(report, writers, rebase_ms=rebase_ms, batch=batch):
                for proc, body in zip(procs.values(), bodies):
                    proc.put(body, count)
            if report.good and report.run_id:
                doc = run_document(report)
                for name, proc in procs.items():
                    proc.put(writers[name].encode_run(doc), 1)
        finished = True
    except RuntimeError as exc:  # a writer process stopped: its error names the store
        raise ReplayError(str(exc)) from None
    finally:
        results = {name: p.close(abort=not finished) for name, p in procs.items()}
        try:
            if finished and not any(r.get("error") for r in results.values()):
                _loaded(reports, writers)
        finally:
            for w in writers.values():
                w.close()
    for name, result in results.items():
        if result.get("error"):
            raise ReplayError(result["error"])
    for name, result in results.items():
        if result.get("refused"):
            raise ReplayError(f"{stores.get(name).title} refused {result['refused']:,} of the samples or run "
                              f"documents ({result['reasons'][0] if result['reasons'] else 'no reason given'}); "
                              f"everything else is stored")
    return reports


def _loaded(reports: list[FileReport], writers: dict) -> None:
    """Tell each store which runs it now holds (InfluxDB rolls them up)."""
    for report in reports:
        if not report.good:
            continue
        start = schema.time_ns(report.first_time)  # already moved by --rebase-time
        end = schema.time_ns(report.last_time)
        for w in writers.values():
            try:
                w.loaded(start, end)
            except (RuntimeError, stores.StoreDown, OSError) as exc:
                raise ReplayError(f"{report.path}: the samples are stored, but {w.title} could not roll them "
                                  f"up: {exc}") from None


# -- the command --------------------------------------------------------------------------------

HELP = "load recorded run files into the stores"
PARSER = dict(description="Load run files (runs/RUN/samples.ndjson, or the run directory) into the stores in large "
                          "batches. Idempotent: replaying twice leaves the same data. A malformed or truncated line "
                          "is reported with its file and line number and skipped; every good line is still loaded. "
                          "Each run gets its run document (run.json beside the run file, else the run file's "
                          "header) in flowstat-runs and as a flowstat_run point. Exit status: 0 all loaded, 1 some "
                          "lines skipped, 2 nothing could be done (bad arguments, a store down or refusing data), "
                          "130 interrupted (what was sent is stored).")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("runfile", nargs="+", help="run files or run directories")
    for w in stores.writers():
        p.add_argument(f"--{w.option}", metavar="URL", help=f"{w.title}, e.g. http://127.0.0.1:{w.default_port}")
        p.add_argument(f"--{w.target_option}", default=w.default_target,
                       help=f"{w.title} {w.target_kind} (default {w.default_target})")
    p.add_argument("--rebase-time", action="store_true",
                   help="shift each run to start now (a new copy in InfluxDB each time: not idempotent)")
    p.add_argument("--batch", type=int, default=BATCH, metavar="N", help=f"samples per request (default {BATCH})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    targets = {w.name: (getattr(args, w.option), getattr(args, w.target_option)) for w in stores.writers()
               if getattr(args, w.option)}
    if not targets:
        options = " and/or ".join(f"--{w.option} URL" for w in stores.writers())
        print(f"flowstat replay: say where to load: {options}", file=sys.stderr)
        return 2
    paths = []
    for name in args.runfile:
        p = Path(name)
        if p.is_dir():
            p = p / "samples.ndjson"
        if not p.is_file():
            print(f"flowstat replay: {name}: no such run file", file=sys.stderr)
            return 2
        paths.append(p)
    bar = Progress(sum(p.stat().st_size for p in paths), "replayed", "bytes", enabled=not args.quiet)
    try:
        reports = replay(paths, targets, rebase=args.rebase_time, batch=args.batch, progress=bar.update)
    except ReplayError as exc:
        bar.close()
        print(f"flowstat replay: {exc}; replaying again is safe (idempotent)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        bar.close()
        print("\nflowstat replay: interrupted; what was sent is stored, replaying again is safe (idempotent)",
              file=sys.stderr)
        return 130
    bar.close()
    status = 0
    for r in reports:
        print(f"{r.path}: {r.good:,} samples loaded (run {r.run_id}), {len(r.agent_samples):,} agent self-samples, "
              f"{len(r.bad)} bad lines skipped")
        for note in r.notes:
            print(f"  note: {note}", file=sys.stderr)
        for lineno, why in r.bad[:20]:
            print(f"  {r.path}:{lineno}: {why}", file=sys.stderr)
        if len(r.bad) > 20:
            print(f"  ... and {len(r.bad) - 20} more", file=sys.stderr)
        if r.bad:
            status = 1
    return status
