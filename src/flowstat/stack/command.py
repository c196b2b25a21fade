"""``flowstat stack up|down|status``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from flowstat.registry import Command

HELP = "start, stop or check the local servers (InfluxDB, Elasticsearch, Telegraf, ElastAlert)"
PARSER = dict(
    description="Real servers on 127.0.0.1 without Docker: InfluxDB 1.x from Debian, Elasticsearch from "
    "Maven Central, Telegraf built pinned from the Go module proxy, ElastAlert2 pinned from "
    "PyPI into a virtualenv of its own, run as an unprivileged "
    "user, cached under --cache. `up` is idempotent and installs the index templates, "
    "database, retention policies and continuous queries; `install` only downloads and "
    "builds the servers (up does it when needed); `status` exits 1 unless every server "
    "answers."
)


def configure(p: argparse.ArgumentParser) -> None:
    from . import SERVICES

    p.add_argument(
        "action",
        choices=["up", "down", "status", "install", "alerts"],
        help="alerts: print the alerts ElastAlert has sent, a line each (from CACHE/elastalert/alerts.log)",
    )
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="where servers, data and logs live (default: $FLOWSTAT_CACHE/stack; "
        "for root /var/lib/flowstat/stack; else ~/.cache/flowstat/stack)",
    )
    for name, cls in SERVICES.items():
        if cls.port_option:
            p.add_argument(
                f"--{cls.port_option}",
                type=int,
                metavar="P",
                dest=f"port_{name}",
                help=f"{cls.port_help} (default {cls.default_port})",
            )
    p.add_argument(
        "--alert-webhook",
        metavar="URL",
        default=os.environ.get("FLOWSTAT_ALERT_WEBHOOK") or None,
        help="ElastAlert also POSTs each alert as JSON to URL (default: $FLOWSTAT_ALERT_WEBHOOK; "
        "every alert is in CACHE/elastalert/alerts.log in any case)",
    )
    p.add_argument(
        "--alert-rules",
        metavar="DIR",
        action="append",
        default=[],
        help="a folder of more ElastAlert rules (*.yaml) to run beside flowstat's (repeatable)",
    )
    p.add_argument("--only", metavar="LIST", help=f"comma-separated servers (default: all: {', '.join(SERVICES)})")
    p.add_argument("--json", action="store_true", help="status or alerts as JSON")
    p.add_argument("--run", metavar="RUN_ID", help="alerts: only those of this run")
    p.add_argument(
        "--rule", metavar="NAME", help="alerts: only those of the rule named NAME (e.g. 'Buffer overloaded')"
    )
    p.add_argument(
        "--wait",
        metavar="S",
        type=float,
        default=0.0,
        help="alerts: wait up to S seconds for a first one (exit 1 if none came; default 0)",
    )


def main(args: argparse.Namespace) -> int:
    from . import SERVICES, Stack, StackError
    from .elastalert import ElastAlertServer

    ports = {name: port for name in SERVICES if (port := getattr(args, f"port_{name}", None))}
    options = {"elastalert": {"webhook": args.alert_webhook, "rules_dirs": [Path(d) for d in args.alert_rules]}}
    services = tuple(x.strip() for x in args.only.split(",")) if args.only else tuple(SERVICES)
    unknown = set(services) - set(SERVICES)
    if unknown:
        print(
            f"flowstat stack: --only: unknown service {sorted(unknown)[0]!r} ({', '.join(SERVICES)})", file=sys.stderr
        )
        return 2
    try:
        stack = Stack(Path(args.cache) if args.cache else None, ports, services, options)
        if args.action == "up":
            stack.up()
        elif args.action == "install":
            stack.install()
        elif args.action == "down":
            stack.down()
        elif args.action == "alerts":
            elastalert = stack["elastalert"]
            assert isinstance(elastalert, ElastAlertServer)  # SERVICES["elastalert"]
            return _alerts(elastalert.alerts_log, args)
        else:
            rows = stack.status()
            if args.json:
                print(json.dumps(rows, indent=1))
            for r in rows if not args.json else ():
                state = r.get("state") or (
                    "healthy" if r["healthy"] else "running, not answering" if r["running"] else "stopped"
                )
                print(f"{r['service']:<14} {state:<27} {r['url']:<24} log: {r['log']}")
                for line in r.get("details", ()):  # what else a server has to say (ElastAlert: rules, alerts)
                    print(f"{'':<14} {line}")
            return 0 if all(r["healthy"] for r in rows) else 1
    except (StackError, OSError) as exc:
        print(f"flowstat stack: {exc}", file=sys.stderr)
        return 1
    return 0


def _alerts(log: Path, args: argparse.Namespace) -> int:
    """Print the alerts of the log, waiting up to --wait seconds for a first one: 0 if there is one."""
    from .elastalert import describe_alert, read_alerts

    deadline = time.monotonic() + args.wait
    while True:
        found = read_alerts(log, args.run, args.rule)
        if found.alerts or time.monotonic() >= deadline:
            break
        time.sleep(0.5)  # ElastAlert appends to the log as it alerts: polled until the deadline
    for line in found.bad:
        print(f"flowstat stack alerts: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps(found.alerts, indent=1))
    else:
        for alert in found.alerts:
            print(describe_alert(alert))
    if not found.alerts:
        of = (f" of rule {args.rule!r}" if args.rule else "") + (f" of run {args.run}" if args.run else "")
        waited = f" within {args.wait:g} s" if args.wait else ""
        print(f"flowstat stack alerts: no alert{of}{waited} in {log}", file=sys.stderr)
    return 0 if found.alerts else 1


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
