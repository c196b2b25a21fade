"""``flowstat rollup``: Elasticsearch's per-node 10 s rollup (flowstat.stores.elasticsearch_rollup),
kept up to date as samples arrive, or made again for a time range or a run."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from datetime import datetime
from typing import Any

from flowstat.registry import Command

from . import stores
from .progress import Progress
from .stores.elasticsearch import SAMPLES_INDEX, ElasticsearchWriter
from .stores.elasticsearch_rollup import (
    EVERY_S,
    MAX_BACK_S,
    RESAMPLE_S,
    SETTLE_S,
    Pass,
    Rollup,
    RollupError,
    rollup_index,
    window_of,
)
from .timeutil import iso_utc_from_ms

STATUS_EVERY_S = 5.0  # a long pass (a catch-up) writes its status this often
log = logging.getLogger("flowstat.rollup")

HELP = "keep Elasticsearch's per-node 10 s rollup (flowstat-node-10s) up to date"
PARSER = dict(
    description="Per node and 10 s, the mean of every numeric sample field, written to the daily indices "
    "flowstat-node-10s-YYYY.MM.DD: what InfluxDB's continuous queries keep in rollup.flowstat_node_10s, "
    'for the views that read long runs of many nodes (docs/ingest.md, "Elasticsearch\'s rollup"). '
    "Without --from or --run it runs until stopped (SIGTERM, Ctrl-C), rolling up each window "
    f"{SETTLE_S:g} s after it ends and again, for {RESAMPLE_S} s (or as long after an outage), when late "
    "samples change it; started again, it catches up from where it got to (its --status file says; else "
    "from the last window written; --catch-up at most). With --from or --run it rolls that range up once and "
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
    p.add_argument(
        "--run",
        metavar="RUN_ID",
        help="roll up once this run's samples, over their time range (other runs' windows are left as they are)",
    )
    p.add_argument(
        "--catch-up",
        type=float,
        default=MAX_BACK_S,
        metavar="S",
        help=f"live: after a stop or an outage, catch up at most this far back (default {MAX_BACK_S:g} s)",
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
        seconds = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ValueError(f"{text!r} is not a time")
        return int(seconds * 1000)
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
    aggs = rollup.search(body).get("aggregations") or {}
    if (aggs.get("first") or {}).get("value") is None:
        return None
    return int(aggs["first"]["value"]), int(aggs["last"]["value"]) + 1


def roll_range(rollup: Rollup, start_ms: int, end_ms: int, quiet: bool) -> int:
    """Roll [start_ms, end_ms) up, with a progress bar over the windows."""
    first = window_of(start_ms)
    bar = Progress((end_ms - first + EVERY_S * 1000 - 1) // (EVERY_S * 1000), "rolled up", "windows", enabled=not quiet)

    def one_more(_: Pass) -> bool:
        bar.update(1)
        return True

    try:
        return rollup.roll(start_ms, end_ms, on_window=one_more).documents
    finally:
        bar.close()


def write_status(path: str, done: Pass) -> None:
    """What the rollup has done, replaced whole (a reader never sees half a file)."""
    status = {
        "time": iso_utc_from_ms(int(time.time() * 1000)),
        "rolled_up_until": iso_utc_from_ms(done.until_ms),
        "rolled_up_until_ms": done.until_ms,
        "windows_rolled": done.windows_rolled,
        "documents": done.documents,
        "refused": done.refused,
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, path)


def _status_until(path: str | None) -> int | None:
    """Where the rollup writing ``path`` had got to, when it says so."""
    if not path:
        return None
    try:
        with open(path) as f:
            until = json.load(f).get("rolled_up_until_ms")
    except (OSError, ValueError, AttributeError):
        return None
    return until if isinstance(until, int) else None


def live(rollup: Rollup, stop: threading.Event, status: str | None = None) -> None:
    """Roll up as samples arrive until ``stop``; a store down is waited for, said once. A long
    catch-up writes ``status`` as it goes (a health check sees it work) and stops when told."""
    down: str | None = None
    refused = ""
    resumed = False
    said_at = time.monotonic()

    def progress(done: Pass) -> bool:
        nonlocal said_at
        if status and time.monotonic() - said_at >= STATUS_EVERY_S:
            _write(status, done)
            said_at = time.monotonic()
        return not stop.is_set()

    while not stop.is_set():
        try:
            if not resumed:
                since = rollup.resume(_status_until(status))
                if since is not None:
                    log.info("catching up from %s", iso_utc_from_ms(since))
                resumed = True
            done = rollup.tick(on_window=progress)
            if status:
                _write(status, done)
                said_at = time.monotonic()
            if down is not None:
                log.info("Elasticsearch answers again; rolled up %d windows since", done.windows_rolled)
                down = None
            refused = ""
        except stores.StoreDown as exc:
            if down is None:
                log.warning("%s; the windows from then on wait for it", exc)
            down = str(exc)
        except RollupError as exc:
            if str(exc) != refused:  # said once, not every pass
                log.error("%s", exc)
            refused = str(exc)
        # the next pass once the next window has settled (and a little after, not just before)
        period = EVERY_S
        stop.wait(period - (time.time() - SETTLE_S) % period + 0.05)


def _write(status: str, done: Pass) -> None:
    try:
        write_status(status, done)
    except OSError as exc:  # the health check will say it; the rollup goes on
        log.error("--status %s: %s", status, exc)


def _one_off_span(args: argparse.Namespace, rollup: Rollup, store: ElasticsearchWriter) -> tuple[int, int] | None:
    """What --run or --from/--to ask to roll up (ms); None once said why not. The store is checked
    first: a wrong address fails at once, not after the roll-up's patient retries."""
    if not args.run:
        try:
            span = _epoch_ms(args.start), _epoch_ms(args.end) if args.end else int(time.time() * 1000)
        except ValueError as exc:
            print(f"flowstat rollup: --from/--to: {exc}", file=sys.stderr)
            return None
        if span[1] <= span[0]:
            print(f"flowstat rollup: --to {args.end or 'now'} is not after --from {args.start}", file=sys.stderr)
            return None
    store.check()
    if args.run:
        found = run_range(rollup, args.run)
        if found is None:
            print(f"flowstat rollup: {args.index} holds no sample of run {args.run}", file=sys.stderr)
        return found
    return span


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s flowstat rollup: %(message)s")
    if args.run and (args.start or args.end):
        print("flowstat rollup: --run or --from/--to, not both", file=sys.stderr)
        return 2
    if args.end and not args.start:
        print("flowstat rollup: --to needs --from", file=sys.stderr)
        return 2
    try:
        store = ElasticsearchWriter(args.es, args.index)
    except stores.StoreURLError as exc:
        print(f"flowstat rollup: {exc}", file=sys.stderr)
        return 2
    # A one-off roll-up (--run, --from) asks again while Elasticsearch is down or slow, as a replay's
    # writes do; the live one leaves a pass that fails to the next.
    one_off = bool(args.run or args.start)
    rollup = Rollup(
        store,
        source=args.index,
        target=rollup_index(args.index),
        max_back_s=args.catch_up,
        retry=stores.DEFAULT_RETRY if one_off else None,
        run_id=args.run,  # --run: that run's samples alone; another run of the same minutes keeps its own
    )
    try:
        if one_off:
            span = _one_off_span(args, rollup, store)
            if span is None:
                return 2
            n = roll_range(rollup, *span, quiet=args.quiet)
            print(f"flowstat rollup: {n} rollup documents written to {rollup.target}-*")
            return 0
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        log.info("rolling %s-* up into %s-*, every %d s", args.index, rollup.target, EVERY_S)
        live(rollup, stop, args.status)
        log.info("stopped")
        return 0
    except stores.StoreDown as exc:
        print(f"flowstat rollup: {exc}", file=sys.stderr)
        return 3
    except RollupError as exc:
        print(f"flowstat rollup: {exc}", file=sys.stderr)
        return 2


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
