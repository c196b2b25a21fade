"""``flowstat rollup``: Elasticsearch's per-node 10 s rollup (flowstat.stores.elasticsearch_rollup),
kept up to date as samples arrive, or made again for a time range or a run."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from datetime import datetime
from typing import Any

from . import stores
from .progress import Progress
from .stores.elasticsearch import SAMPLES_INDEX, Elasticsearch
from .stores.elasticsearch_rollup import (
    EVERY_S,
    RESAMPLE_S,
    SETTLE_S,
    Pass,
    Rollup,
    RollupError,
    rollup_index,
    window_of,
)
from .timeutil import iso_utc_from_ms

CATCH_UP_S = 86_400.0  # a live rollup started after a stop rolls up at most this far back
log = logging.getLogger("flowstat.rollup")

HELP = "keep Elasticsearch's per-node 10 s rollup (flowstat-node-10s) up to date"
PARSER = dict(
    description="Per node and 10 s, the mean of every numeric sample field, written to the daily indices "
    "flowstat-node-10s-YYYY.MM.DD: what InfluxDB's continuous queries keep in rollup.flowstat_node_10s, "
    'for the views that read long runs of many nodes (docs/ingest.md, "Elasticsearch\'s rollup"). '
    "Without --from or --run it runs until stopped (SIGTERM, Ctrl-C), rolling up each window "
    f"{SETTLE_S:g} s after it ends and again, for {RESAMPLE_S} s, when late samples change it; started again, it "
    "catches up from the last window it wrote. With --from or --run it rolls that range up once and "
    "exits (replay does this for the runs it loads). Idempotent: a window rolled up twice is "
    "overwritten. Exit status: 0 done (or stopped), 2 bad arguments or the store refused the rollup, "
    "3 the store is down (once only; the live rollup waits).",
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--es",
        metavar="URL",
        default="http://127.0.0.1:9200",
        help="Elasticsearch; every node of a cluster: http://HOST:9200,HOST:9200,... (default http://127.0.0.1:9200)",
    )
    p.add_argument("--index", default=SAMPLES_INDEX, help=f"the samples' index, rolled up (default {SAMPLES_INDEX})")
    p.add_argument("--from", dest="start", metavar="TIME", help="roll up once from TIME (ISO 8601, or epoch seconds)")
    p.add_argument("--to", dest="end", metavar="TIME", help="... to TIME (default now)")
    p.add_argument("--run", metavar="RUN_ID", help="roll up once the time range of this run's samples")
    p.add_argument(
        "--catch-up",
        type=float,
        default=CATCH_UP_S,
        metavar="S",
        help=f"live: after a stop, catch up at most this far back (default {CATCH_UP_S:g} s)",
    )
    p.add_argument(
        "--status",
        metavar="FILE",
        help="live: after each pass that reached the store, write what it did here (JSON): a health check "
        "reads its age",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar (--from, --run)")


def _epoch_ms(text: str) -> int:
    try:
        return int(float(text) * 1000)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither ISO 8601 nor epoch seconds") from None
    if stamp.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone: say Z or +HH:MM")
    return int(stamp.timestamp() * 1000)


def run_range(rollup: Rollup, run_id: str) -> tuple[int, int] | None:
    """The time range (ms) of a run's samples in the rollup's source, or None when it has none."""
    body: dict[str, Any] = {
        "size": 0,
        "query": {"term": {"run_id": run_id}},
        "aggs": {"first": {"min": {"field": "time"}}, "last": {"max": {"field": "time"}}},
    }
    aggs = rollup._search(f"{rollup.source}-*", body)["aggregations"]
    if aggs["first"]["value"] is None:
        return None
    return int(aggs["first"]["value"]), int(aggs["last"]["value"]) + 1


def roll_range(rollup: Rollup, start_ms: int, end_ms: int, quiet: bool) -> int:
    """Roll [start_ms, end_ms) up, an hour of windows per step, with a progress bar over the windows."""
    step = 3_600_000
    first = window_of(start_ms)
    bar = Progress((end_ms - first + EVERY_S * 1000 - 1) // (EVERY_S * 1000), "rolled up", "windows", enabled=not quiet)
    documents = 0
    try:
        for lo in range(first, end_ms, step):
            done = rollup.roll(lo, min(lo + step, end_ms))
            documents += done.documents
            bar.update(done.windows_counted)
    finally:
        bar.close()
    return documents


def write_status(path: str, done: Pass) -> None:
    """The last good pass, replaced whole (a reader never sees half a file)."""
    status = {
        "time": iso_utc_from_ms(int(time.time() * 1000)),
        "rolled_up_until": iso_utc_from_ms(done.until_ms),
        "windows_rolled": done.windows_rolled,
        "documents": done.documents,
        "refused": done.refused,
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, path)


def live(rollup: Rollup, catch_up_s: float, stop: threading.Event, status: str | None = None) -> None:
    """Roll up as samples arrive until ``stop``; a store down is waited for, said once."""
    down: str | None = None
    refused = ""
    resumed = False
    while not stop.is_set():
        try:
            if not resumed:
                since = rollup.resume(catch_up_s)
                if since is not None:
                    log.info("catching up from %s", iso_utc_from_ms(since))
                resumed = True
            done = rollup.tick()
            if status:
                write_status(status, done)
            if down is not None:
                log.info("Elasticsearch answers again; rolled up %d windows since", done.windows_rolled)
                down = None
        except stores.StoreDown as exc:
            if down is None:
                log.warning("%s; the windows from then on wait for it", exc)
            down = str(exc)
        except RollupError as exc:
            if str(exc) != refused:  # said once, not every pass
                log.error("%s", exc)
            refused = str(exc)
        # the next pass when the next window has settled
        now = time.time()
        period = EVERY_S
        stop.wait(period - (now - SETTLE_S) % period + 0.05)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s flowstat rollup: %(message)s")
    if args.run and (args.start or args.end):
        print("flowstat rollup: --run or --from/--to, not both", file=sys.stderr)
        return 2
    try:
        store = Elasticsearch(args.es, args.index)
    except stores.StoreURLError as exc:
        print(f"flowstat rollup: {exc}", file=sys.stderr)
        return 2
    rollup = Rollup(store, source=args.index, target=rollup_index(args.index))
    try:
        if args.run or args.start:
            if args.run:
                span = run_range(rollup, args.run)
                if span is None:
                    print(f"flowstat rollup: {args.index}-* holds no sample of run {args.run}", file=sys.stderr)
                    return 2
            else:
                try:
                    span = _epoch_ms(args.start), _epoch_ms(args.end) if args.end else int(time.time() * 1000)
                except ValueError as exc:
                    print(f"flowstat rollup: --from/--to: {exc}", file=sys.stderr)
                    return 2
            n = roll_range(rollup, *span, quiet=args.quiet)
            print(f"flowstat rollup: {n} rollup documents written to {rollup.target}-*")
            return 0
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        log.info("rolling %s-* up into %s-*, every %d s", args.index, rollup.target, EVERY_S)
        live(rollup, args.catch_up, stop, args.status)
        log.info("stopped")
        return 0
    except stores.StoreDown as exc:
        print(f"flowstat rollup: {exc}", file=sys.stderr)
        return 3
    except RollupError as exc:
        print(f"flowstat rollup: {exc}", file=sys.stderr)
        return 2
