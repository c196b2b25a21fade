"""The ``flowstat`` command line: each command's options and work live with its layer; this module
only puts them together."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

from . import __version__, stores
from .registry import Command, Registry

# the commands that log in to stores
STORE_CLIENTS = ("run", "agent", "replay", "rollup", "verdict", "campaign", "stack")

# Every command, where it lives (imported only when it runs: see build_parser).
COMMANDS: Registry[Command] = Registry(
    "command",
    {
        "run": "flowstat.harness.command:RUN_COMMAND",
        "validate": "flowstat.harness.command:VALIDATE_COMMAND",
        "ctl": "flowstat.harness.command:CTL_COMMAND",
        "slurm-script": "flowstat.harness.slurmscript:COMMAND",
        "agent": "flowstat.agent.command:COMMAND",
        "stack": "flowstat.stack.command:COMMAND",
        "provision": "flowstat.provision:COMMAND",
        "replay": "flowstat.replay:COMMAND",
        "rollup": "flowstat.rollup:COMMAND",
        "verdict": "flowstat.verdicts:COMMAND",
        "campaign": "flowstat.campaign.command:COMMAND",
        "report": "flowstat.report.command:COMMAND",
        "inbox": "flowstat.inbox.command:COMMAND",
        "top": "flowstat.top.command:COMMAND",
    },
)
# The extra of pyproject.toml each command needs beyond what every install has (none: nothing
# more). An agent-only install has no numpy, PyYAML, Bokeh, boost-histogram or uproot: a command that
# needs them says which extra to install, without importing its module.
NEEDS_EXTRA: dict[str, str] = {
    "run": "harness",
    "validate": "harness",
    "slurm-script": "harness",
    "stack": "stack",
    "campaign": "all",
    "report": "report",
}
# The modules each extra brings (import names), as pyproject.toml lists them (a test holds them
# alike); only their absence is a missing extra.
OPTIONAL_MODULES = {
    "numpy": "numpy",
    "yaml": "PyYAML",
    "bokeh": "bokeh",
    "boost_histogram": "boost-histogram",
    "uproot": "uproot",
}  # import name -> what pip calls it
EXTRAS: dict[str, tuple[str, ...]] = {
    "harness": ("numpy", "yaml", "boost_histogram", "uproot"),
    "report": ("numpy", "bokeh"),
    "stack": ("yaml",),
    "all": tuple(OPTIONAL_MODULES),
}


class MissingExtra(Exception):
    def __init__(self, command: str, extra: str | None, module: str):
        package = OPTIONAL_MODULES.get(module.split(".")[0], module)
        super().__init__(
            f"flowstat {command}: needs {package}, which this install does not have: "
            f"pip install 'flowstat[{extra or 'all'}]'"
        )


def _missing(exc: ModuleNotFoundError) -> bool:
    return (exc.name or "").split(".")[0] in OPTIONAL_MODULES


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; ``only``: with that command's parser alone, the others' modules not
    imported (a command's start costs its own imports, not every command's)."""
    parser = argparse.ArgumentParser(
        prog="flowstat",
        description="Monitoring and observability for streaming data-processing pipelines.",
        epilog="Run 'flowstat COMMAND --help' for a command's options. Docs: docs/ in the repository.",
    )
    parser.add_argument("--version", action="version", version=f"flowstat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if only is not None and name != only:
            continue
        extra = NEEDS_EXTRA.get(name)
        absent = [m for m in EXTRAS.get(extra or "", ()) if importlib.util.find_spec(m) is None]
        if absent:
            _add_unavailable(sub, name, extra, absent[0])
            continue
        command = COMMANDS.get(name)
        p = sub.add_parser(name, help=command.help, **command.parser)
        command.configure(p)
        if name in STORE_CLIENTS and name != "agent":  # the agent's own configure has it
            stores.add_credentials_option(p)
        p.set_defaults(func=command.main, extra=extra)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only=named)
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "unavailable", False):
        args = parser.parse_args(argv)  # argparse's own error, naming what it does not know
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        stores.use_credentials_file(getattr(args, "credentials", None))
        return args.func(args)
    except stores.CredentialsError as exc:  # a credentials file others may read, a URL holding a password
        print(f"flowstat {args.command}: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a module imported only when the work needs it (Bokeh, for a page)
        if not _missing(exc):
            raise
        print(MissingExtra(args.command, args.extra, exc.name or ""), file=sys.stderr)
        return 2


def _add_unavailable(sub: Any, name: str, extra: str | None, module: str) -> None:
    """The command, in --help and on the command line, where this install lacks what it needs."""
    missing = MissingExtra(name, extra, module)
    p = sub.add_parser(name, help=f"(not installed: pip install 'flowstat[{extra or 'all'}]')", add_help=False)
    p.add_argument("rest", nargs="*")  # whatever was asked (--help included): the answer is the same

    def unavailable(_args: argparse.Namespace) -> int:
        print(missing, file=sys.stderr)
        return 2

    p.set_defaults(func=unavailable, extra=extra, unavailable=True)


if __name__ == "__main__":
    sys.exit(main())
