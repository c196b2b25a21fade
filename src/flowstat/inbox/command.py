"""``flowstat inbox``: its options."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from flowstat.registry import Command

HELP = "receive, show, log and forward the alerts of Grafana and ElastAlert2 (the compose stack's alerts service)"
PARSER = dict(
    description="An HTTP server for alerts: Grafana's webhook contact point POSTs to /grafana, ElastAlert2's "
    "HTTP POST alerter to /elastalert. Each alert is printed as a line, appended to --log, "
    "shown at / (a page that refreshes itself) and /alerts.json, and forwarded to "
    "$FLOWSTAT_RELAY_WEBHOOK and by e-mail to $FLOWSTAT_RELAY_EMAIL_TO through $FLOWSTAT_SMTP_HOST "
    "(_PORT, _USER, _PASSWORD, _FROM, _STARTTLS) when they are set."
)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        default="127.0.0.1:9095",
        metavar="HOST:PORT",
        help="where to listen (default 127.0.0.1:9095; the compose stack: 0.0.0.0 in its container)",
    )
    p.add_argument("--log", metavar="FILE", help="append every alert here, a JSON line each (read back at start)")
    p.add_argument(
        "--grafana-url",
        default=os.environ.get("FLOWSTAT_GRAFANA_URL", "http://127.0.0.1:3000"),
        metavar="URL",
        help="Grafana as people reach it, for the links to the run view "
        "(default $FLOWSTAT_GRAFANA_URL, else http://127.0.0.1:3000)",
    )


def _stop(*_) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    from .relay import Relay, RelayError, from_environment
    from .server import Inbox, serve

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s flowstat-inbox %(levelname)s %(message)s"
    )
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"flowstat inbox: --listen {args.listen}: expected HOST:PORT", file=sys.stderr)
        return 2
    try:
        relays = [Relay(target) for target in from_environment(os.environ)]
    except RelayError as exc:
        print(f"flowstat inbox: {exc}", file=sys.stderr)
        return 2
    inbox = Inbox(Path(args.log) if args.log else None, args.grafana_url, relays)
    signal.signal(signal.SIGTERM, _stop)  # docker stop: end as Ctrl-C does
    try:
        serve(
            inbox,
            host.strip("[]"),
            int(port),
            ready=lambda s: logging.getLogger("flowstat.inbox").info(
                "listening on http://%s:%d/ (alerts: POST /grafana, POST /elastalert); forwarding to %s",
                *s.server_address[:2],
                ", ".join(f"{r.target.name} {r.target.where()}" for r in relays) or "nothing else",
            ),
        )
    except OSError as exc:
        print(f"flowstat inbox: cannot listen on {args.listen}: {exc.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
