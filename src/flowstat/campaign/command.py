"""``flowstat campaign CAMPAIGN.yaml``: the command's options, its progress bar and messages."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from flowstat import stores
from flowstat.registry import Command

HELP = "run a benchmark campaign: one topology, one parameter swept, every run recorded"
PARSER = dict(
    description="Run each configuration of a campaign file (benchmark-harness/campaigns/ in flowstat's "
    "repository; format: docs/campaigns.md) as a monitored, recorded harness run, then write "
    "the thesis-style table (mean ± std of CPU clock, VmRSS, merge time and merged objects/s "
    "over the steady state, with offered rate, input latency p99, VmRSS slope and the online "
    "verdict) as Markdown with SVG plots and as an HTML report. Resumes an interrupted campaign "
    "without rerunning what finished; a configuration that fails is recorded and the campaign "
    "goes on. Exit status: 0 every configuration clean, 1 some failed or lost data, 2 a bad "
    "campaign file or a store down, 130 interrupted (what finished is kept)."
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("campaign", type=Path, help="campaign YAML file")
    p.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="seconds per configuration (default: the file's, " "300 s for the thesis's campaigns)",
    )
    p.add_argument(
        "--only",
        metavar="CONFIG",
        action="append",
        help="run only this configuration (its id, value or label, e.g. 4 or buffer-size-4); repeat "
        "or give a comma-separated list. The tables show every finished configuration",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="the campaign's directory: its runs and its state (default: runs/campaigns/NAME-DURATIONs); "
        "running again into it resumes",
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="where the tables and plots go: DIR/NAME.md, DIR/NAME/*.svg, DIR/NAME.html (default: the "
        "campaign's directory)",
    )
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="run again the configurations that failed or lost " "data (default: kept as they are)",
    )
    p.add_argument(
        "--replay",
        action="store_true",
        help="load every run into the stores given below (idempotent), for the Grafana and Kibana " "aggregate views",
    )
    for w in stores.writers():
        p.add_argument(
            f"--{w.option}", metavar="URL", help=f"with --replay: {w.title}, e.g. " f"http://127.0.0.1:{w.default_port}"
        )
        p.add_argument(
            f"--{w.target_option}",
            default=w.default_target,
            help=f"{w.title} {w.target_kind} (default {w.default_target})",
        )
    p.add_argument("--list", action="store_true", help="list the configurations and what is finished; run nothing")
    p.add_argument("--no-c-agent", action="store_true", help="monitor with the Python agent only")
    p.add_argument("--quiet", action="store_true", help="no progress bar (a line per configuration all the same)")


class Bar:
    """One bar over the whole campaign: finished configurations plus the running one's seconds."""

    def __init__(self, todo: int, duration: float, stream=sys.stderr, bar: bool = True):
        self.total_s = max(1.0, todo * duration)
        self.done_s = 0.0
        self.stream, self.tty = stream, stream.isatty() and bar  # without the bar: a line per configuration
        self.current = ""
        self.last = 0.0
        self.started = time.monotonic()

    def starting(self, index: int, total: int, config, duration: float) -> None:
        self.current = f"{index + 1}/{total} {config.key}"
        self.duration = duration
        if not self.tty:
            self.stream.write(f"campaign: {self.current}: running {duration:g} s\n")
            self.stream.flush()

    def progress(self):
        def show(elapsed: float, duration: float, metrics: list[dict], verdicts: dict, flow: object) -> None:
            merged = sum(m.get("merged_objects_per_second") or 0 for m in metrics if m.get("role") == "merger")
            self.draw(
                self.done_s + min(elapsed, duration),
                f"{self.current} {elapsed:4.0f}/{duration:g} s " f"merged {merged:,.0f}/s",
            )

        return show

    def draw(self, done: float, text: str) -> None:
        if not self.tty or time.monotonic() - self.last < 0.2:
            return
        self.last = time.monotonic()
        frac = min(1.0, done / self.total_s)
        left = (self.total_s - done) if done else self.total_s
        self.stream.write(f"\r[{'#' * int(frac * 30):<30}] {frac:4.0%} {text}  ~{left / 60:.0f} min left   ")
        self.stream.flush()

    def finished(self, index: int, total: int, outcome) -> None:
        if outcome.skipped:
            line = f"campaign: {index + 1}/{total} {outcome.config.key}: finished before ({outcome.status}), skipped"
        else:
            self.done_s += self.duration
            why = f": {outcome.error.splitlines()[0][:200]}" if outcome.error else ""
            line = f"campaign: {index + 1}/{total} {outcome.config.key}: {outcome.status}{why}"
        self.stream.write(("\r" + " " * 110 + "\r" if self.tty else "") + line + "\n")
        self.stream.flush()


def _targets(args: argparse.Namespace) -> dict[str, tuple[str, str]]:
    return {
        w.name: (getattr(args, w.option), getattr(args, w.target_option))
        for w in stores.writers()
        if getattr(args, w.option)
    }


def _check_stores(targets: dict[str, tuple[str, str]]) -> str | None:
    for name, (url, target) in targets.items():
        writer = stores.get(name)(url, target)
        try:
            writer.check()
        except stores.StoreDown as exc:
            return str(exc)
        finally:
            writer.close()
    return None


def command_text(args: argparse.Namespace) -> str:
    """The command that makes the tables as a reader can repeat it: every finished configuration
    is in them, whichever invocation (--only) ran it."""
    text = f"flowstat campaign {args.campaign}"
    if args.duration is not None:
        text += f" --duration {args.duration:g}"
    return text


def main(args: argparse.Namespace) -> int:
    from flowstat.harness.agents import AgentOptions
    from flowstat.harness.orchestrator import RunError

    from . import report
    from .runner import CampaignInterrupted, default_dir, recorded, run_campaign
    from .spec import CampaignError, load

    try:
        campaign = load(args.campaign)
        if args.duration is not None:
            if args.duration <= 0:
                raise CampaignError("--duration must be positive")
            campaign = campaign.with_duration(args.duration)
        chosen = campaign
        if args.only:
            chosen = campaign.select([k.strip() for o in args.only for k in o.split(",") if k.strip()])
    except CampaignError as exc:
        print(f"flowstat campaign: {exc}", file=sys.stderr)
        return 2
    out = args.out or default_dir(campaign)
    try:
        finished = {o.config.key: o for o in recorded(campaign, out)}
    except RunError as exc:  # a campaign.json that is not one
        print(f"flowstat campaign: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for c in chosen.configurations:
            done = finished.get(c.key)
            print(f"{c.key:<32} {campaign.parameter}={c.value!s:<12} {done.status if done else 'to run'}")
        return 0
    targets = _targets(args)
    if args.replay and not targets:
        print(
            "flowstat campaign: --replay needs a store: " + ", ".join(f"--{w.option} URL" for w in stores.writers()),
            file=sys.stderr,
        )
        return 2
    if args.replay and (down := _check_stores(targets)):
        print(f"flowstat campaign: {down}; nothing was run", file=sys.stderr)
        return 2
    todo = sum(
        1
        for c in chosen.configurations
        if c.key not in finished or (args.retry_failed and finished[c.key].status != "ok")
    )
    bar = Bar(todo, campaign.duration, bar=not args.quiet)
    status = 0
    try:
        outcomes = run_campaign(
            chosen, out, agent=AgentOptions(c_agent=not args.no_c_agent), retry_failed=args.retry_failed, events=bar
        )
    except (CampaignInterrupted, KeyboardInterrupt) as exc:
        print(
            f"\nflowstat campaign: {str(exc) or 'interrupted'}; what finished is kept in {out}: run the same "
            f"command again to go on",
            file=sys.stderr,
        )
        return 130
    except RunError as exc:
        print(f"flowstat campaign: {exc}", file=sys.stderr)
        return 2
    made = report.write(campaign, recorded(campaign, out), out, args.report or out, command_text(args))
    for path in made.files:
        print(f"campaign: wrote {path}")
    if args.replay:
        from flowstat.replay import ReplayError, replay

        runs = [o.run_dir / "samples.ndjson" for o in outcomes if o.run_dir is not None]
        try:
            replay(runs, targets)
            print(f"campaign: {len(runs)} runs loaded into {', '.join(targets)}")
        except ReplayError as exc:
            print(f"flowstat campaign: the runs are recorded, but loading them failed: {exc}", file=sys.stderr)
            status = 1
    bad = [o for o in outcomes if o.status != "ok"]
    for o in bad:
        print(
            f"campaign: {o.config.key}: {o.status}" + (f": {o.error.splitlines()[0][:300]}" if o.error else ""),
            file=sys.stderr,
        )
    return 1 if bad else status


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
