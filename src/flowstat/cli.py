"""The ``flowstat`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__


def _progress_printer(stream=sys.stderr):
    """A one-line live status: a bar on a terminal, a line every 5 s otherwise."""
    tty = stream.isatty()
    state = {"last": -5.0}

    def show(elapsed: float, duration: float, metrics: list[dict]) -> None:
        mergers = [m for m in metrics if m.get("role") == "merger"]
        producers = [m for m in metrics if m.get("role") == "producer"]
        merged = sum(m.get("merged_objects_per_second") or 0 for m in mergers)
        backlog = sum(m.get("backlog") or 0 for m in mergers)
        overloads = sum(m.get("send_overload_events") or 0 for m in producers)
        cpu = sum(m.get("cpu_clock") or 0 for m in metrics) / 1e6
        frac = min(1.0, elapsed / duration) if duration > 0 else 1.0
        text = (f"{elapsed:5.1f}/{duration:.0f} s  merged {merged:,.0f}/s  backlog {backlog:,}  "
                f"producer overloads {overloads:,}  cpu {cpu:.2f} cores")
        if tty:
            bar = "#" * int(frac * 24)
            stream.write(f"\r[{bar:<24}] {text}   ")
            if frac >= 1.0:
                stream.write("\n")
            stream.flush()
        elif elapsed - state["last"] >= 5.0:
            state["last"] = elapsed
            stream.write(text + "\n")
            stream.flush()

    return show


def cmd_run(args: argparse.Namespace) -> int:
    from flowstat_harness.orchestrator import RunError, run_topology
    from flowstat_harness.summary import format_summary
    from flowstat_harness.topology import TopologyError, load

    try:
        topo = load(args.topology)
    except TopologyError as exc:
        print(f"flowstat run: {exc}", file=sys.stderr)
        return 2
    if args.duration is not None and args.duration <= 0:
        print("flowstat run: --duration must be positive", file=sys.stderr)
        return 2
    progress = None if args.json or args.quiet else _progress_printer()
    try:
        summary = run_topology(topo, duration=args.duration, run_id=args.run_id, runs_dir=Path(args.runs_dir),
                               on_progress=progress)
    except RunError as exc:
        print(f"flowstat run: {exc}", file=sys.stderr)
        return 1
    if progress is not None and sys.stderr.isatty():
        sys.stderr.write("\n")
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(format_summary(summary))
    return 0 if summary["ok"] else 1


def cmd_validate(args: argparse.Namespace) -> int:
    from flowstat_harness.topology import TopologyError, load
    from flowstat.units import format_size

    status = 0
    for path in args.topology:
        try:
            t = load(path)
        except TopologyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
            continue
        print(f"{path}: OK - {t.n_producers} producers x {t.rate:g} obj/s in {t.producer_processes} process(es), "
              f"{len(t.mergers)} merger(s), {t.obj.kind.name} {format_size(t.obj.nbytes)} {list(t.obj.shape)}, "
              f"buffer {t.buffer_size}, {t.duration:g} s")
    return status


def cmd_ctl(args: argparse.Namespace) -> int:
    from flowstat_harness.control import ControlClient, ControlError

    client = ControlClient(args.endpoint, timeout_s=args.timeout)
    try:
        payload = args.raw.encode() if args.raw is not None else json.dumps({"command": args.command}).encode()
        reply = json.loads(client.request_raw(payload))
    except ControlError as exc:
        print(f"flowstat ctl: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(json.dumps(reply, indent=1))
    return 1 if "error" in reply else 0


def cmd_device(args: argparse.Namespace) -> int:
    from flowstat_harness.devices.main import run_device

    return run_device(args.role, args.config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowstat",
        description="Monitoring and observability for streaming data-processing pipelines.",
        epilog="Run 'flowstat COMMAND --help' for a command's options. Docs: docs/ in the repository.")
    parser.add_argument("--version", action="version", version=f"flowstat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run a producer/merger/viewer topology and print its summary",
                       description="Start every device of a topology over ZeroMQ on loopback, run it, stop it "
                                   "cleanly and print per-node figures and the no-loss check. Exit status: 0 when "
                                   "the run was clean and lost nothing, 1 otherwise, 2 for a bad topology.")
    p.add_argument("topology", help="topology YAML file (see benchmark-harness/topologies/)")
    p.add_argument("--duration", type=float, metavar="S", help="seconds to run (default: the topology's)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.add_argument("--run-id", help="run id (default: the topology's run_id plus a UTC timestamp)")
    p.add_argument("--runs-dir", default="runs", metavar="DIR", help="where run directories go (default: runs)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="check topology files without running them")
    p.add_argument("topology", nargs="+")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("ctl", help="send a control command to a running node",
                       description="Send a JSON control request to a node's control endpoint and print the reply "
                                   "(endpoints of a run are in RUN_DIR/endpoints.json).")
    p.add_argument("endpoint", help="e.g. tcp://127.0.0.1:40123")
    p.add_argument("command", nargs="?", default="get-metrics",
                   help="check-state, get-metrics (default), start or stop")
    p.add_argument("--raw", metavar="TEXT", help="send TEXT as the request body instead")
    p.add_argument("--timeout", type=float, default=2.0, metavar="S", help="reply time-out (default 2 s)")
    p.set_defaults(func=cmd_ctl)

    p = sub.add_parser("device", help=argparse.SUPPRESS)
    p.add_argument("role", choices=["producer", "merger", "viewer"])
    p.add_argument("--config", required=True, help="device configuration as JSON")
    p.set_defaults(func=cmd_device)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
