"""``flowstat report RUN_DIR... [-o FILE]``: the command's options and messages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flowstat.registry import Command

from .load import SHOWN_BAD_LINES, ReportError

DEFAULT_NAME = "report.html"
HELP = "write one self-contained HTML report of recorded runs"
PARSER = dict(
    description="Write one HTML file that shows recorded runs offline. First, per run: the verdicts "
    "(no loss, online, alerts), the pipeline graph (who feeds whom, where each node's time went: "
    "busy, backpressured, idle; objects/s along the edges) and the key figures of the steady state "
    "(merged objects/s, merge time, input latency p99, CPU and memory per role, buffer overloads) "
    "with sparklines and the worst node. Then, for several runs, a table of the steady state (mean "
    "± std of CPU, VmRSS, merge time and merged objects/s, one row per run) and merged objects/s "
    "against a parameter only for runs that differ in it alone; per run, its parameters, which "
    "alert conditions held and when, and per role the dashboards' run panels over time (zoom, pan, "
    "hover) in human units, counters as rates, constants as table rows, heat maps for many nodes. "
    "The file needs no network (its JavaScript is inline). A malformed or truncated line of a run "
    "file is reported with its line number and skipped; every good line is used. Exit status: 0 "
    "written, 1 written but some lines were skipped, 2 nothing written (a run cannot be read). "
    "See docs/report.md."
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run_dir",
        nargs="+",
        type=Path,
        help="run directories made by flowstat run (runs/RUN_ID), or " "their run files (samples.ndjson)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help=f"the HTML file to write (default: RUN_DIR/{DEFAULT_NAME} for one run, ./{DEFAULT_NAME} " f"for several)",
    )


def default_output(runs: list[Path]) -> Path:
    if len(runs) == 1:
        run = runs[0]
        return (run if run.is_dir() else run.parent) / DEFAULT_NAME
    return Path(DEFAULT_NAME)


def main(args: argparse.Namespace) -> int:
    from .build import write_report  # Bokeh: only when a report is written

    out = args.output or default_output(args.run_dir)
    try:
        made = write_report(args.run_dir, out)
    except ReportError as exc:
        print(f"flowstat report: {exc}", file=sys.stderr)
        return 2
    status = 0
    for run in made.runs:
        bad = run.file.bad
        print(f"{run.file.path}: {run.file.good:,} samples, {len(run.series)} nodes, {len(bad)} bad lines skipped")
        for lineno, why in bad[:SHOWN_BAD_LINES]:
            print(f"  {run.file.path}:{lineno}: {why}", file=sys.stderr)
        if len(bad) > SHOWN_BAD_LINES:
            print(f"  ... and {len(bad) - SHOWN_BAD_LINES} more", file=sys.stderr)
        for note in run.file.notes + run.notes:
            print(f"  note: {note}", file=sys.stderr)
        status = max(status, 1 if bad else 0)
    print(f"report: {made.path} ({made.plots} plots, {made.path.stat().st_size / 1e6:.1f} MB)")
    return status


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
