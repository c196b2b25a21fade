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
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from flowstat import stores
from flowstat.progress import Progress
from flowstat.registry import Command
from flowstat.schema import runfile
from flowstat.schema import sample as sample_schema
from flowstat.schema.runfile import FileReport
from flowstat.stores import BatchEncoder, WriterProcess
from flowstat.timeutil import iso_utc_ms

BATCH = 5000
TIMEOUT_S = 60.0  # a replay's batches are large: a store may take a while to answer one


class ReplayError(RuntimeError):
    """The replay cannot go on (a store is down or refuses data); the message names it."""


def read_batches(
    path: Path, report: FileReport, encoders: list[BatchEncoder], *, rebase_ms: int | None = None, batch: int = BATCH
) -> Iterator[tuple[list[bytes], int]]:
    """A run file's good samples as batches ready to write: one body per encoder (one per store),
    and the number of samples. Bad lines go to the report with their number (runfile.samples).

    The hot loop of replay (millions of lines): a line's line protocol comes from its
    sample_schema.Layout, and its JSON document is the line as read; each sample is encoded once in each
    of the schema's encodings a store wants, and each store's encoder puts the batch together. A
    line the layout cannot encode goes through to_line_protocol, with the same result.
    """
    wants = {e.wants for e in encoders}
    lines, docs, ids, stamps = [], [], [], []  # this batch, in the encodings the stores want
    lp, js = "line" in wants, "json" in wants
    shift_ns = None
    n = 0  # good samples in this batch
    for doc, values, _, layout, raw, ns in runfile.samples(path, report):
        # In JSON, a quote or backslash in a string needs a backslash: such a line is left to to_line_protocol.
        fast = layout.fast and b"\\" not in raw
        line: bytes | None = raw
        if rebase_ms is not None:
            if shift_ns is None:
                shift_ns = report.shift_ns = rebase_ms * 1_000_000 - ns
            ns += shift_ns
            doc["time"] = iso_utc_ms(ns / 1e9)
            fast, line = False, None
        if lp:
            lines.append(layout.line(values, ns) if fast else sample_schema.to_line_protocol(doc) + "\n")
        if js:  # a validated line is already the document: it is sent as read, not rebuilt
            docs.append(line.rstrip(b"\r\n") if line is not None else sample_schema.to_json(doc).encode())
            ids.append(sample_schema.document_id(doc))
            stamps.append(ns)
        n += 1
        if n == batch:
            yield [e.encode(lines if e.wants == "line" else docs, ids, stamps) for e in encoders], n
            lines, docs, ids, stamps = [], [], [], []
            n = 0
    if n:
        yield [e.encode(lines if e.wants == "line" else docs, ids, stamps) for e in encoders], n


def _rebased(docs: list[dict], report: FileReport, rebase_ms: int) -> list[dict]:
    """Self-samples moved in time as the file's samples were (or, in a file of self-samples only,
    so that the first starts at rebase_ms)."""
    if not report.shift_ns and report.good == 0 and docs:
        report.shift_ns = rebase_ms * 1_000_000 - sample_schema.time_ns(docs[0]["time"])
    return [{**d, "time": iso_utc_ms((sample_schema.time_ns(d["time"]) + report.shift_ns) / 1e9)} for d in docs]


def wrapped_batches(
    report: FileReport, writers: dict, *, rebase_ms: int | None = None, batch: int = BATCH
) -> Iterator[tuple[list[bytes], int]]:
    """The run file's self-samples, then its edge counters, as batches ready to write (moved in time
    as its samples were): one body per writer, and their number."""
    for docs, encode in (
        (report.self_samples, lambda w, chunk: w.encode_self_samples(chunk)),
        (report.edge_counts, lambda w, chunk: w.encode_flow("edge", chunk)),
    ):
        docs = docs if rebase_ms is None else _rebased(docs, report, rebase_ms)
        for start in range(0, len(docs), batch):
            chunk = docs[start : start + batch]
            yield [encode(w, chunk) for w in writers.values()], len(chunk)


def run_document(report: FileReport) -> dict:
    """The run's document (runfile.run_document); with --rebase-time its times move as the samples did."""
    shift = report.shift_ns
    try:
        return runfile.run_document(
            report, retime=(lambda t: iso_utc_ms((sample_schema.time_ns(t) + shift) / 1e9)) if shift else None
        )
    except ValueError as exc:
        raise ReplayError(str(exc)) from None


def replay(
    paths: list[Path],
    targets: dict[str, tuple[str, str]],
    *,
    rebase: bool = False,
    batch: int = BATCH,
    progress=None,
    timeout_s: float = TIMEOUT_S,
    node_backoff_s: float = stores.NODE_BACKOFF_S,
) -> list[FileReport]:
    """Load run files into the stores ``targets`` names: {store: (url, database or index)}; a
    request waits ``timeout_s`` for a node, and a node of a list that failed rests ``node_backoff_s``."""
    writers = {
        name: stores.get(name)(url, target, timeout_s=timeout_s, node_backoff_s=node_backoff_s)
        for name, (url, target) in targets.items()
    }
    for w in writers.values():
        w.log_failovers = False  # the writer processes say it, once each, as they write
        try:
            w.check()
        except stores.StoreDown as exc:
            for each in writers.values():
                each.close()
            raise ReplayError(str(exc)) from None
    procs = {
        name: WriterProcess(stores.get(name), url, target, timeout_s=timeout_s, node_backoff_s=node_backoff_s)
        for name, (url, target) in targets.items()
    }
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
                for proc, body in zip(procs.values(), bodies, strict=False):
                    proc.put(body, count)
                if progress:
                    progress(report.bytes_read - shown)
                    shown = report.bytes_read
            if progress:  # what follows the last batch (bad lines, or a file that ends on a batch)
                progress(report.bytes_read - shown)
            for bodies, count in wrapped_batches(report, writers, rebase_ms=rebase_ms, batch=batch):
                for proc, body in zip(procs.values(), bodies, strict=False):
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
    for result in results.values():
        if result.get("error"):
            raise ReplayError(result["error"])
    for name, result in results.items():
        if result.get("refused"):
            raise ReplayError(
                f"{stores.get(name).title} refused {result['refused']:,} of the samples or run "
                f"documents ({result['reasons'][0] if result['reasons'] else 'no reason given'}); "
                f"everything else is stored"
            )
    return reports


# -- the command --------------------------------------------------------------------------------

HELP = "load recorded run files into the stores"
PARSER = dict(
    description="Load run files (runs/RUN/samples.ndjson, or the run directory) into the stores in large "
    "batches. Idempotent: replaying twice leaves the same data. A malformed or truncated line "
    "is reported with its file and line number and skipped; every good line is still loaded. "
    "Each run gets its run document (run.json beside the run file, else the run file's "
    "header) in flowstat-runs and as a flowstat_run point. Exit status: 0 all loaded, 1 some "
    "lines skipped, 2 nothing could be done (bad arguments, a store down or refusing data), "
    "130 interrupted (what was sent is stored)."
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("runfile", nargs="+", help="run files or run directories")
    for w in stores.writers():
        p.add_argument(
            f"--{w.option}",
            metavar="URL",
            help=f"{w.title}, e.g. http://127.0.0.1:{w.default_port}"
            + (
                f"; every node of a cluster: http://HOST:{w.default_port},HOST:{w.default_port},... (a batch a "
                "node cannot take now, no answer or 502/503/504, goes to the next)"
                if w.multi_node
                else ""
            ),
        )
        p.add_argument(
            f"--{w.target_option}",
            default=w.default_target,
            help=f"{w.title} {w.target_kind} (default {w.default_target})",
        )
    p.add_argument(
        "--prometheus",
        metavar="DIR",
        type=Path,
        help="Prometheus: write the runs as TSDB blocks into DIR (a server's --storage.tsdb.path, or a folder "
        "to move them from; needs promtool: docs/prometheus.md)",
    )
    p.add_argument(
        "--rebase-time",
        action="store_true",
        help="shift each run to start now (a new copy in InfluxDB each time: not idempotent)",
    )
    p.add_argument("--batch", type=int, default=BATCH, metavar="N", help=f"samples per request (default {BATCH})")
    p.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT_S,
        metavar="S",
        help=f"how long a request waits for a store's answer (each node's) (default {TIMEOUT_S:g})",
    )
    p.add_argument(
        "--node-backoff",
        type=float,
        default=stores.NODE_BACKOFF_S,
        metavar="S",
        help="how long a node of a list that failed is left alone before it is asked again "
        f"(default {stores.NODE_BACKOFF_S:g})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _loaded(reports: list[FileReport], writers: dict) -> None:
    """Tell each store which runs it now holds (both roll them up: a file's one run alone, as
    another run of the same minutes may still be arriving; a file of several runs, all there)."""
    for report in reports:
        if not report.good or report.first_time is None or report.last_time is None:  # None: no good sample
            continue
        start = sample_schema.time_ns(report.first_time)  # already moved by --rebase-time
        end = sample_schema.time_ns(report.last_time)
        for w in writers.values():
            try:
                w.loaded(start, end, report.run_id if len(report.run_ids) == 1 else None)
            except (RuntimeError, stores.StoreDown, OSError) as exc:
                raise ReplayError(
                    f"{report.path}: the samples are stored, but {w.title} could not roll them " f"up: {exc}"
                ) from None


def main(args: argparse.Namespace) -> int:
    targets = {
        w.name: (getattr(args, w.option), getattr(args, w.target_option))
        for w in stores.writers()
        if getattr(args, w.option)
    }
    if not targets and not args.prometheus:
        options = " and/or ".join([*(f"--{w.option} URL" for w in stores.writers()), "--prometheus DIR"])
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
    if not 0.001 <= args.timeout <= 3600 or not 0 <= args.node_backoff <= 86400:
        print(
            "flowstat replay: --timeout must be between 0.001 and 3600 s, --node-backoff between 0 and 86400 s",
            file=sys.stderr,
        )
        return 2
    if args.prometheus:
        if args.rebase_time:
            print("flowstat replay: --rebase-time applies to the stores, not to --prometheus", file=sys.stderr)
            return 2
        status = _to_prometheus(paths, args.prometheus, args.quiet)
        if status or not targets:
            return status
    bar = Progress(sum(p.stat().st_size for p in paths), "replayed", "bytes", enabled=not args.quiet)
    try:
        reports = replay(
            paths,
            targets,
            rebase=args.rebase_time,
            batch=args.batch,
            progress=bar.update,
            timeout_s=args.timeout,
            node_backoff_s=args.node_backoff,
        )
    except stores.StoreURLError as exc:
        bar.close()
        print(f"flowstat replay: {exc}", file=sys.stderr)
        return 2
    except ReplayError as exc:
        bar.close()
        print(f"flowstat replay: {exc}; replaying again is safe (idempotent)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        bar.close()
        print(
            "\nflowstat replay: interrupted; what was sent is stored, replaying again is safe (idempotent)",
            file=sys.stderr,
        )
        return 130
    bar.close()
    return _said(reports)


def _to_prometheus(paths: list[Path], folder: Path, quiet: bool) -> int:
    from flowstat import promblocks

    bar = Progress(sum(p.stat().st_size for p in paths), "written as blocks", "bytes", enabled=not quiet)
    try:
        reports = promblocks.create_blocks(paths, folder, bar.update)
    except (promblocks.BlocksError, OSError) as exc:
        bar.close()
        print(f"flowstat replay: --prometheus {folder}: {exc}", file=sys.stderr)
        return 2
    bar.close()
    status = _said(reports, f"as Prometheus blocks in {folder}")
    return status


def _said(reports: list[FileReport], where: str = "") -> int:
    """Each run file's report on stdout, its bad lines on stderr: 1 if there were any."""
    status = 0
    for r in reports:
        print(
            f"{r.path}: {r.good:,} samples loaded{' ' + where if where else ''} (run {r.run_id}), "
            f"{len(r.self_samples):,} agent self-samples, "
            + (f"{len(r.edge_counts):,} edge counters, " if r.edge_counts else "")
            + f"{len(r.bad)} bad lines skipped"
        )
        for note in r.notes:
            print(f"  note: {note}", file=sys.stderr)
        for lineno, why in r.bad[:20]:
            print(f"  {r.path}:{lineno}: {why}", file=sys.stderr)
        if len(r.bad) > 20:
            print(f"  ... and {len(r.bad) - 20} more", file=sys.stderr)
        if r.bad:
            status = 1
    return status


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
