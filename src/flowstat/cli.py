"""The ``flowstat`` command line: each command's options and work live with its layer; this module
only puts them together."""

from __future__ import annotations

import argparse
import sys

from . import __version__, stores
from . import replay as replay_command
from .agent import command as agent_command
from .campaign import command as campaign_command
from .harness import command as harness_command
from .inbox import command as inbox_command
from .report import command as report_command
from .stack import command as stack_command
from . import provision as provision_command


STORE_CLIENTS = ("run", "agent", "replay", "campaign", "stack")  # the commands that log in to stores


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowstat",
        description="Monitoring and observability for streaming data-processing pipelines.",
        epilog="Run 'flowstat COMMAND --help' for a command's options. Docs: docs/ in the repository.")
    parser.add_argument("--version", action="version", version=f"flowstat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = [
        ("run", harness_command.RUN_HELP, harness_command.RUN_PARSER, harness_command.configure_run,
         harness_command.run),
        ("validate", harness_command.VALIDATE_HELP, {}, harness_command.configure_validate, harness_command.validate),
        ("ctl", harness_command.CTL_HELP, harness_command.CTL_PARSER, harness_command.configure_ctl,
         harness_command.ctl),
        ("agent", agent_command.HELP, agent_command.PARSER, agent_command.configure, agent_command.main),
        ("stack", stack_command.HELP, stack_command.PARSER, stack_command.configure, stack_command.main),
        ("provision", provision_command.HELP, provision_command.PARSER, provision_command.configure,
         provision_command.main),
        ("replay", replay_command.HELP, replay_command.PARSER, replay_command.configure, replay_command.main),
        ("campaign", campaign_command.HELP, campaign_command.PARSER, campaign_command.configure,
         campaign_command.main),
        ("report", report_command.HELP, report_command.PARSER, report_command.configure, report_command.main),
        ("inbox", inbox_command.HELP, inbox_command.PARSER, inbox_command.configure, inbox_command.main),
    ]
    for name, help_text, parser_kw, configure, func in commands:
        p = sub.add_parser(name, help=help_text, **parser_kw)
        configure(p)
        if name in STORE_CLIENTS and name != "agent":  # the agent's own configure has it
            stores.add_credentials_option(p)
        p.set_defaults(func=func)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        stores.use_credentials_file(getattr(args, "credentials", None))
        return args.func(args)
    except stores.CredentialsError as exc:  # a credentials file others may read, a URL holding a password
        print(f"flowstat {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
