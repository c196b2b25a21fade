"""The ``flowstat`` command line."""

from __future__ import annotations

import argparse
import json
import os
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
    from flowstat_harness.orchestrator import AgentOptions, RunError, run_topology
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
                               on_progress=progress,
                               agent=AgentOptions(not args.no_agent, args.agent_interval, args.sink or [],
                                                  not args.no_c_agent))
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


def cmd_agent(args: argparse.Namespace) -> int:
    import logging
    import signal

    from flowstat_agent.agent import Agent, AgentConfig
    from flowstat_agent.sinks import SinkURLError
    from flowstat_agent.targets import TargetSpec

    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s flowstat-agent %(levelname)s %(message)s")
    if os.environ.get("FLOWSTAT_DIE_WITH_PARENT"):  # started by flowstat run: never outlive it
        from flowstat.procfs import die_with_parent
        die_with_parent(signal.SIGTERM)
    spec = TargetSpec(args.pid or [], args.pidfile or [], args.pattern or [], args.endpoints or [], args.run_id or "")
    if spec.empty():
        print("flowstat agent: give at least one target: --pid, --pidfile, --pattern or --endpoints", file=sys.stderr)
        return 2
    if not 0.01 <= args.interval <= 3600:
        print("flowstat agent: --interval must be between 0.01 and 3600 s", file=sys.stderr)
        return 2
    params = None
    if args.run_params:
        try:
            params = json.loads(Path(args.run_params).read_text())
        except (OSError, ValueError) as exc:
            print(f"flowstat agent: --run-params {args.run_params}: {exc}", file=sys.stderr)
            return 2
    cfg = AgentConfig(spec, args.sink or ["stdout://"], args.interval, args.rescan, args.control_timeout,
                      args.spool_dir, int(args.spool_max_mb * 1024 * 1024), args.run_file, params, args.name or "",
                      args.duration, args.count, args.exit_when_all_down, max(0.0, args.drain_timeout))
    try:
        agent = Agent(cfg)
    except (SinkURLError, OSError) as exc:
        print(f"flowstat agent: {exc}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop_event.set())
    agent.run()
    stats = agent.stats()
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=1))
    lost = sum(s["lost"] + s["spool_dropped"] for s in stats["sinks"].values())
    return 1 if lost else 0


def cmd_stack(args: argparse.Namespace) -> int:
    from flowstat.stack import Stack, StackError

    from flowstat.stack import SERVICES

    ports = {k: v for k, v in (("influxdb", args.influx_port), ("elasticsearch", args.es_port),
                               ("telegraf", args.telegraf_port)) if v}
    services = tuple(x.strip() for x in args.only.split(",")) if args.only else SERVICES
    unknown = set(services) - set(SERVICES)
    if unknown:
        print(f"flowstat stack: --only: unknown service {sorted(unknown)[0]!r} ({', '.join(SERVICES)})", file=sys.stderr)
        return 2
    stack = Stack(Path(args.cache) if args.cache else None, ports, services)
    try:
        if args.action == "up":
            stack.up()
        elif args.action == "down":
            stack.down()
        else:
            rows = stack.status()
            if args.json:
                print(json.dumps(rows, indent=1))
            for r in rows if not args.json else ():
                state = "healthy" if r["healthy"] else "running, not answering" if r["running"] else "stopped"
                print(f"{r['service']:<14} {state:<24} {r['url']:<24} log: {r['log']}")
            return 0 if all(r["healthy"] for r in rows) else 1
    except StackError as exc:
        print(f"flowstat stack: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from flowstat.progress import Progress
    from flowstat.replay import ReplayError, replay

    if not args.influx and not args.es:
        print("flowstat replay: say where to load: --influx URL and/or --es URL", file=sys.stderr)
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
    bar = Progress(sum(p.stat().st_size for p in paths), "replayed", "bytes", enabled=not args.quiet)
    try:
        reports = replay(paths, args.influx, args.es, db=args.db, index=args.index, rebase=args.rebase_time,
                         batch=args.batch, progress=bar.update)
    except ReplayError as exc:
        bar.close()
        print(f"flowstat replay: {exc}; nothing is lost: replaying again is safe (idempotent)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        bar.close()
        print("\nflowstat replay: interrupted; what was sent is stored, replaying again is safe (idempotent)",
              file=sys.stderr)
        return 130
    bar.close()
    status = 0
    for r in reports:
        print(f"{r.path}: {r.good:,} samples loaded (run {r.run_id}), {len(r.bad)} bad lines skipped")
        for lineno, why in r.bad[:20]:
            print(f"  {r.path}:{lineno}: {why}", file=sys.stderr)
        if len(r.bad) > 20:
            print(f"  ... and {len(r.bad) - 20} more", file=sys.stderr)
        if r.bad:
            status = 1
    return status


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
    p.add_argument("--no-agent", action="store_true", help="do not monitor the run with the agents")
    p.add_argument("--no-c-agent", action="store_true", help="monitor with the Python agent only")
    p.add_argument("--agent-interval", type=float, default=1.0, metavar="S", help="agent sampling interval (default 1)")
    p.add_argument("--sink", action="append", metavar="URL",
                   help="also ship the agent's samples here (see flowstat agent --help; default: RUN_DIR/samples.lp)")
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

    p = sub.add_parser("agent", help="sample running pipeline nodes and ship the samples",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Sample processes (VmRSS, CPU clock, threads from /proc) and, for nodes with a "
                                   "control channel, their own metrics; send the samples to sinks.",
                       epilog="sinks (repeat --sink for several):\n"
                              "  stdout://[?format=json]         file:///PATH[?format=json]\n"
                              "  udp://HOST:PORT                 tcp://HOST:PORT[?format=json]  (json: Logstash json_lines)\n"
                              "  http://HOST:PORT/write          (Telegraf influxdb_listener)\n"
                              "  influxdb://HOST:PORT/DATABASE   elasticsearch://HOST:PORT/INDEX\n"
                              "Samples follow collectors/schema/sample.schema.json.")
    t = p.add_argument_group("targets (at least one)")
    t.add_argument("--pid", type=int, action="append", metavar="PID", help="a process id")
    t.add_argument("--pidfile", action="append", metavar="FILE", help="a file holding a process id (re-read)")
    t.add_argument("--pattern", action="append", metavar="REGEX", help="processes whose command line matches")
    t.add_argument("--endpoints", action="append", metavar="FILE",
                   help="a harness run's endpoints.json: its nodes and their control sockets")
    p.add_argument("--sink", action="append", metavar="URL", help="where samples go (default stdout://)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between samples (default 1, min 0.01)")
    p.add_argument("--rescan", type=float, default=5.0, metavar="S", help="seconds between target searches (default 5)")
    p.add_argument("--control-timeout", type=float, default=0.25, metavar="S", help="control reply time-out (default 0.25)")
    p.add_argument("--spool-dir", metavar="DIR", help="keep batches here while a sink is down (default: none)")
    p.add_argument("--spool-max-mb", type=float, default=64, metavar="MB", help="spool bound per sink (default 64)")
    p.add_argument("--run-id", help="run id to put in samples (default: from --endpoints)")
    p.add_argument("--run-file", metavar="FILE", help="also record every sample in this NDJSON run file")
    p.add_argument("--run-params", metavar="FILE", help="JSON of run parameters for the run file's header")
    p.add_argument("--name", help="instance name, appended to the agent tag")
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    p.add_argument("--count", type=int, metavar="N",
                   help="stop after N sampling rounds (rounds skipped by an overrun do not count)")
    p.add_argument("--exit-when-all-down", action="store_true", help="stop once every target has exited")
    p.add_argument("--drain-timeout", type=float, default=5.0, metavar="S",
                   help="at exit, keep resending what is spooled for a sink that is down, up to S seconds (default 5)")
    p.add_argument("--stats", metavar="FILE", help="write delivery statistics here at exit")
    p.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser("stack", help="start, stop or check the local servers (InfluxDB, Elasticsearch, Telegraf)",
                       description="Real servers on 127.0.0.1 without Docker: InfluxDB 1.x from Debian, Elasticsearch "
                                   "from Maven Central, Telegraf built pinned from the Go module proxy, run as an "
                                   "unprivileged user, cached under --cache. `up` is idempotent and installs the "
                                   "index templates, database, retention policies and continuous queries; `status` "
                                   "exits 1 unless every server answers.")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--cache", metavar="DIR", help="where servers, data and logs live "
                                                   "(default: $FLOWSTAT_CACHE/stack or ~/.cache/flowstat/stack)")
    p.add_argument("--influx-port", type=int, metavar="P", help="InfluxDB HTTP port (default 8086)")
    p.add_argument("--es-port", type=int, metavar="P", help="Elasticsearch HTTP port (default 9200)")
    p.add_argument("--telegraf-port", type=int, metavar="P",
                   help="Telegraf's HTTP listener port (default 8186; UDP/TCP listeners on P+1)")
    p.add_argument("--only", metavar="LIST", help="comma-separated services (default: all)")
    p.add_argument("--json", action="store_true", help="status as JSON")
    p.set_defaults(func=cmd_stack)

    p = sub.add_parser("replay", help="load recorded run files into InfluxDB and Elasticsearch",
                       description="Load run files (runs/RUN/samples.ndjson, or the run directory) into the stores in "
                                   "large batches. Idempotent: replaying twice leaves the same data. A malformed or "
                                   "truncated line is reported with its file and line number and skipped; every good "
                                   "line is still loaded. A run document goes to the flowstat-runs index. Exit status: "
                                   "0 all loaded, 1 some lines skipped, 2 nothing could be done (bad arguments, a "
                                   "store down), 130 interrupted (what was sent is stored).")
    p.add_argument("runfile", nargs="+", help="run files or run directories")
    p.add_argument("--influx", metavar="URL", help="InfluxDB, e.g. http://127.0.0.1:8086")
    p.add_argument("--es", metavar="URL", help="Elasticsearch, e.g. http://127.0.0.1:9200")
    p.add_argument("--db", default="flowstat", help="InfluxDB database (default flowstat)")
    p.add_argument("--index", default="flowstat-samples", help="Elasticsearch index (default flowstat-samples)")
    p.add_argument("--rebase-time", action="store_true",
                   help="shift each run to start now (a new copy in InfluxDB each time: not idempotent)")
    p.add_argument("--batch", type=int, default=5000, metavar="N", help="samples per request (default 5000)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_replay)

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
