"""``flowstat agent``: its options and what it does with them."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from flowstat import __version__, stores
from flowstat.registry import Command

from . import config, memory
from .spool import SEND_MAX_BYTES

SEND_MAX_KB = SEND_MAX_BYTES // 1024

HELP = "sample running pipeline nodes and ship the samples"
PARSER = dict(
    formatter_class=argparse.RawDescriptionHelpFormatter,
    description="Sample processes (VmRSS, CPU clock, threads from /proc) and, for nodes with a control channel, "
    "their own metrics; send the samples to sinks. With --flush-spool, send instead what an agent "
    "left in its spool.",
    epilog="sinks (repeat --sink for several):\n"
    "  stdout://[?format=json]         file:///PATH[?format=json]\n"
    "  udp://HOST:PORT                 tcp://HOST:PORT[?format=json]  (json: Logstash json_lines)\n"
    "  http://HOST:PORT/write          (Telegraf influxdb_listener)\n"
    "  influxdb://HOST:PORT/DATABASE   elasticsearch://HOST:PORT/INDEX\n"
    "  elasticsearch://HOST:PORT,HOST:PORT,.../INDEX  (every node of a cluster: a batch a node cannot take\n"
    "    now, no answer or 502/503/504, goes to the next; a node that failed rests --node-backoff S)\n"
    "  prometheus://127.0.0.1:PORT     serves /metrics for a Prometheus to scrape (port 9464 by default;\n"
    "    docs/prometheus.md); ?web_config=PATH: TLS and basic auth from an exporter-toolkit\n"
    "    web-config.yml (tls_server_config, basic_auth_users); loopback only without both;\n"
    "    ?families=A,B,...: only these node families, each a sample field (vmrss_kb) or its family's\n"
    "    name (flowstat_node_resident_memory_bytes); ?drop_labels=run_id,...: node labels left out\n"
    "    (run_id, host, role, agent; never node_id); options joined by &. At exit it keeps serving\n"
    "    until a scrape took the final samples, at most --drain-timeout (none if never scraped)\n"
    "Samples follow the sample schema, self-samples (--self-interval) the agent schema (docs/schema.md).\n"
    "signals: SIGTERM, SIGINT stop (one last round, then delivery); SIGUSR1 is the run-ending notice:\n"
    "  a node that exits after it is reported once as STOPPED (it ended with its run) instead of DOWN.\n"
    "Exit status: 0 nothing lost (what a sink that is down did not take stays spooled: see\n"
    "--flush-spool), 1 samples lost, 2 bad arguments.",
)


def configure(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("targets (at least one)")
    t.add_argument("--pid", type=int, action="append", metavar="PID", help="a process id")
    t.add_argument("--pidfile", action="append", metavar="FILE", help="a file holding a process id (re-read)")
    t.add_argument("--pattern", action="append", metavar="REGEX", help="processes whose command line matches")
    t.add_argument("--user", action="append", metavar="USER", help="every process of this user (a name or a uid)")
    t.add_argument(
        "--cgroup",
        action="append",
        metavar="PATH",
        help="every process of this cgroup and its descendants (cgroup v2: a path under its mount, or absolute)",
    )
    t.add_argument("--unit", action="append", metavar="NAME", help="every process of this systemd unit (its cgroup)")
    t.add_argument(
        "--top",
        type=int,
        metavar="N",
        help="only the N heaviest of the processes chosen (--pattern, --user, --cgroup, --unit; without them, "
        "of every process), re-ranked at each rescan; one that leaves them is reported LEFT_TOP once",
    )
    t.add_argument(
        "--allow-remote-control",
        action="store_true",
        default=None,
        help="believe --endpoints-dir files whose control endpoint is not on this host (default: only ipc:// "
        "and loopback TCP, the directory being writable by the host's users)",
    )
    t.add_argument(
        "--top-by",
        choices=("cpu", "rss"),
        help="what --top ranks by: CPU since the last rescan, or VmRSS (default cpu)",
    )
    t.add_argument(
        "--endpoints",
        action="append",
        metavar="FILE",
        help="a harness run's endpoints.json: its nodes and their control sockets",
    )
    t.add_argument(
        "--endpoints-dir",
        action="append",
        metavar="DIR",
        help="a directory where nodes announce themselves (flowstat.node, libflowstat-node: one endpoints "
        "file each), read whenever it changes and at every rescan: nodes that appear are taken, a node "
        "whose file is withdrawn ends STOPPED, one that dies with its file left DOWN",
    )
    p.add_argument(
        "--curve-client-key",
        metavar="FILE",
        help="the client key (a .key_secret file) to ask nodes whose control channel is secured "
        "(curve_server_key in their endpoints); default: keys/client.key_secret beside the endpoints "
        "file, or inside the endpoints directory (a harness run's RUN_DIR/keys)",
    )
    p.add_argument("--sink", action="append", metavar="URL", help="where samples go (default stdout://)")
    p.add_argument("--interval", type=float, metavar="S", help="seconds between samples (default 1, min 0.01)")
    p.add_argument("--rescan", type=float, metavar="S", help="seconds between target searches (default 5)")
    p.add_argument(
        "--self-interval",
        type=float,
        metavar="S",
        help="seconds between the agent's self-samples (measurement flowstat_agent: rounds, samples, "
        "sink errors, spool depth...), after a round, and one at exit (default 5; 0: none)",
    )
    p.add_argument("--control-timeout", type=float, metavar="S", help="control reply time-out (default 0.25)")
    p.add_argument(
        "--sink-timeout",
        type=float,
        metavar="S",
        help="time-out of a request to an HTTP sink (http, influxdb, elasticsearch; each node's, for a "
        "list of nodes) (default 5)",
    )
    p.add_argument(
        "--node-backoff",
        type=float,
        metavar="S",
        help="how long a node of an elasticsearch:// list that failed is left alone before it is asked "
        f"again (default {stores.NODE_BACKOFF_S:g})",
    )
    p.add_argument("--spool-dir", metavar="DIR", help="keep batches here while a sink is down (default: none)")
    p.add_argument("--spool-max-mb", type=float, metavar="MB", help="spool bound per sink (default 64)")
    p.add_argument(
        "--send-max-kb",
        type=float,
        metavar="KB",
        help="batches waiting in the spool (a sink that fell behind) go together, up to KB kibibytes a "
        f"request; a larger batch goes alone (default {SEND_MAX_KB:g}; 1 or more)",
    )
    p.add_argument("--run-id", help="run id to put in samples (default: from --endpoints)")
    p.add_argument("--run-file", metavar="FILE", help="also record every sample in this NDJSON run file")
    p.add_argument(
        "--run-doc", metavar="FILE", help="the run document (run.json) describing the run in the run file's header"
    )
    p.add_argument("--name", help="instance name, appended to the agent tag")
    p.add_argument(
        "--host-name",
        metavar="NAME",
        help="this host's name in samples, and the host whose nodes an endpoints file gives this agent "
        "(default: $SLURMD_NODENAME in a Slurm job step, hosts of a cluster often sharing one hostname; "
        "else the hostname)",
    )
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    p.add_argument(
        "--count",
        type=int,
        metavar="N",
        help="stop after N sampling rounds (rounds skipped by an overrun do not count)",
    )
    p.add_argument("--exit-when-all-down", action="store_true", help="stop once every target has exited")
    p.add_argument(
        "--drain-timeout",
        type=float,
        metavar="S",
        help="at exit, keep resending what is spooled for a sink that is down, up to S seconds (default 5), "
        "and keep serving a prometheus:// sink that was scraped until a scrape took the final samples; "
        "with --flush-spool, how long to wait for a sink that is down",
    )
    p.add_argument(
        "--flush-spool",
        metavar="DIR",
        help="send the batches an agent left in the spools under DIR (e.g. runs/RUN/spool) to the sink "
        "each spool names (or to --sink), then exit; no targets",
    )
    p.add_argument(
        "--send-run",
        metavar="FILE",
        help="send the run document FILE (run.json) to each --sink, spooling it in --spool-dir while a "
        "sink is down, then exit; no targets (flowstat run does so as a run ends)",
    )
    p.add_argument("--stats", metavar="FILE", help="write delivery statistics here at exit")
    stores.add_credentials_option(p)
    p.add_argument("--quiet", action="store_true", default=None, help="log warnings and errors only")
    c = p.add_argument_group(
        "configuration (a file's keys are the options above: docs/farm.md; a flag wins over every file)"
    )
    c.add_argument(
        "--config",
        metavar="FILE",
        help=f"read settings from this TOML file (the service's: {config.SERVICE_FILE}), then from "
        f"{config.DROP_INS}/*.toml beside it; default: none",
    )
    c.add_argument(
        "--config-dir", metavar="DIR", help=f"the drop-in folder (default: {config.DROP_INS} beside --config)"
    )
    c.add_argument("--print-config", action="store_true", help="print the resolved settings (JSON) and exit")
    c.add_argument(
        "--test",
        action="store_true",
        help="print the resolved settings, then one round of samples (line protocol), and exit",
    )
    c.add_argument("--version", action="version", version=f"flowstat agent {__version__}")


def _flush_spools(args: argparse.Namespace) -> int:
    from .flush import FlushError, flush, spool_folders

    top = Path(args.flush_spool)
    if not top.is_dir():
        print(f"flowstat agent: --flush-spool {top}: no such directory", file=sys.stderr)
        return 2
    if args.sink and len(args.sink) > 1:
        print("flowstat agent: --flush-spool takes at most one --sink", file=sys.stderr)
        return 2
    folders = spool_folders(top)
    if not folders:
        print(f"flowstat agent: {top}: no spooled batches")
        return 0
    status = 0
    for folder in folders:
        try:
            done = flush(
                folder,
                args.sink[0] if args.sink else None,
                max(0.0, args.drain_timeout),
                args.sink_timeout,
                args.node_backoff,
                int(args.send_max_kb * 1024),
            )
        except FlushError as exc:
            print(f"flowstat agent: {exc}", file=sys.stderr)
            status = 2
            continue
        left = (
            f"{done.left_batches} batches ({done.left_samples:,} samples) still spooled"
            if done.left_batches
            else "spool empty"
        )
        print(f"{folder}: {done.delivered:,} samples sent to {done.url}, {done.refused:,} refused; {left}")
        if done.left_batches:
            status = max(status, 1)
    return status


def _read_run_doc(path: str, option: str) -> dict | str:
    """The run document in ``path``, or what is wrong with it."""
    from flowstat.schema import run as run_schema

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return f"{option} {path}: {exc}"
    if not isinstance(doc, dict):
        return f"{option} {path}: not a run document (a JSON object)"
    errors = run_schema.validate(doc)
    return f"{option} {path}: not a run document: {'; '.join(errors[:3])}" if errors else doc


def _send_run(args: argparse.Namespace) -> int:
    """--send-run: the run document to every sink; 0 delivered everywhere, 1 spooled (or lost) somewhere."""
    from .agent import open_runner

    doc = _read_run_doc(args.send_run, "--send-run")
    if isinstance(doc, str):
        print(f"flowstat agent: {doc}", file=sys.stderr)
        return 2
    runners = [
        open_runner(
            url,
            args.spool_dir,
            int(args.spool_max_mb * 1024 * 1024),
            max(0.0, args.drain_timeout),
            args.sink_timeout,
            args.node_backoff,
            int(args.send_max_kb * 1024),
            fresh_first=False,  # behind the run's first document, if it still waits in the spool
        )
        for url in args.sink or ["stdout://"]
    ]
    for r in runners:
        r.submit_run(doc)  # in the spool behind what waits there, before the runner looks at it
        r.start()
        r.stop()
    for r in runners:
        r.join()
    late = [r for r in runners if not r.delivered]
    for r in late:
        what = (
            "refused"
            if r.refused
            else f"spooled in {r.spool.folder} (flowstat agent --flush-spool sends it)"
            if r.spool is not None and not r.lost
            else "lost"
        )
        print(
            f"flowstat agent: the run document of {doc['run_id']} did not reach {r.sink.url}: {what}", file=sys.stderr
        )
    return 1 if late else 0


def _resolve(args: argparse.Namespace) -> dict:
    """The settings of the files (--config), under the flags given: set on ``args`` and returned."""
    settings = config.resolve(vars(args), config.read(args.config, args.config_dir))
    for key, value in settings.items():
        setattr(args, config.dest(key), value)
    if settings["credentials"]:  # from a file: as the command line's --credentials is (flowstat.cli)
        stores.use_credentials_file(settings["credentials"])
    return settings


def main(args: argparse.Namespace) -> int:
    from flowstat.proc.procfs import die_with_parent

    from .agent import Agent
    from .sinks import SinkDown

    flags = dict(vars(args))  # as given: a reload resolves the files again under the same flags
    try:
        settings = _resolve(args)
    except (config.ConfigError, stores.CredentialsError) as exc:
        print(f"flowstat agent: {exc}", file=sys.stderr)
        return 2
    if args.print_config or args.test:
        print(json.dumps(settings))
        if args.print_config:
            return 0
        sys.stdout.flush()
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s flowstat-agent %(levelname)s %(message)s",
    )
    if not 1 <= args.send_max_kb <= 1024 * 1024:
        print(
            f"flowstat agent: --send-max-kb: expected kibibytes between 1 and 1048576, got '{args.send_max_kb:g}'",
            file=sys.stderr,
        )
        return 2
    if not 0.001 <= args.sink_timeout <= 3600 or not 0 <= args.node_backoff <= 86400:
        print(
            "flowstat agent: --sink-timeout must be between 0.001 and 3600 s, --node-backoff between 0 and 86400 s",
            file=sys.stderr,
        )
        return 2
    if args.flush_spool:
        return _flush_spools(args)
    if args.send_run:
        return _send_run(args)
    parent = os.environ.get("FLOWSTAT_DIE_WITH_PARENT")  # the pid of the flowstat run that started us
    if parent and not die_with_parent(signal.SIGTERM, int(parent)):
        logging.getLogger("flowstat.agent").warning(
            "the run that started this agent (pid %s) is gone: stopping", parent
        )
        return 0
    spec = _spec(args)
    if spec.empty():
        print(
            "flowstat agent: give at least one target: --pid, --pidfile, --pattern, --user, --cgroup, --unit, --top, "
            "--endpoints or --endpoints-dir",
            file=sys.stderr,
        )
        return 2
    if not 0.01 <= args.interval <= 3600:
        print("flowstat agent: --interval must be between 0.01 and 3600 s", file=sys.stderr)
        return 2
    if not 0 <= args.self_interval <= 86400:
        print("flowstat agent: --self-interval must be between 0 (none) and 86400 s", file=sys.stderr)
        return 2
    if args.test:  # one round, on stdout only: no sink, spool or file of the configuration touched
        args.sink, args.count, args.self_interval = ["stdout://"], 1, 0.0
        args.spool_dir = args.stats = args.run_file = None
    run_doc = _read_run_doc(args.run_doc, "--run-doc") if args.run_doc else None
    if isinstance(run_doc, str):
        print(f"flowstat agent: {run_doc}", file=sys.stderr)
        return 2
    cfg = _agent_config(args, spec, run_doc)
    memory.fix_mmap_threshold()  # before the sinks' first large blocks: see flowstat.agent.memory
    try:
        agent = Agent(cfg)
    except (ValueError, OSError, SinkDown) as exc:  # a bad sink URL, a spool or run file that cannot be used
        print(f"flowstat agent: {exc}", file=sys.stderr)
        return 2
    agent.reloader = lambda: _reloaded(flags, run_doc)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.request_stop())
    signal.signal(signal.SIGUSR1, lambda *_: agent.notice_run_ending())
    signal.signal(signal.SIGHUP, lambda *_: agent.request_reload())
    _say_notice_taken()
    agent.run()
    stats = agent.stats()
    if args.stats:
        Path(args.stats).write_text(json.dumps(stats, indent=1))
    lost = sum(s["lost"] + s["spool_dropped"] for s in stats["sinks"].values())
    return 1 if lost else 0


def _spec(args: argparse.Namespace):
    from .targets import TargetSpec

    return TargetSpec(
        args.pid or [],
        args.pidfile or [],
        args.pattern or [],
        args.endpoints or [],
        args.run_id or "",
        args.endpoints_dir or [],
        args.host_name or "",
        args.curve_client_key or "",
        args.user or [],
        args.cgroup or [],
        args.unit or [],
        args.top or 0,
        args.top_by or "cpu",
        bool(args.allow_remote_control),
    )


def _reloaded(flags: dict, run_doc: dict | None):
    """SIGHUP: the configuration files read again under the command line's flags (ValueError:
    what is wrong, the running configuration kept)."""
    args = argparse.Namespace(**flags)
    _resolve(args)
    spec = _spec(args)
    if spec.empty():
        raise ValueError("no target left: give at least one (pid, pidfile, pattern, endpoints, endpoints_dir)")
    return _agent_config(args, spec, run_doc)


def _agent_config(args: argparse.Namespace, spec, run_doc: dict | None):
    from .agent import AgentConfig

    return AgentConfig(
        spec,
        args.sink or ["stdout://"],
        args.interval,
        args.rescan,
        args.control_timeout,
        args.spool_dir,
        int(args.spool_max_mb * 1024 * 1024),
        args.run_file,
        run_doc,
        args.name or "",
        args.duration,
        args.count,
        args.exit_when_all_down,
        max(0.0, args.drain_timeout),
        args.self_interval,
        args.sink_timeout,
        args.node_backoff,
        int(args.send_max_kb * 1024),
    )


def _say_notice_taken() -> None:
    """$FLOWSTAT_AGENT_READY_FILE, created once the run-ending notice is handled: how flowstat run
    learns it may send it to an agent on another host, whose signal mask it cannot read."""
    path = os.environ.get("FLOWSTAT_AGENT_READY_FILE")
    if path:
        try:
            Path(path).touch()
        except OSError as exc:
            logging.getLogger("flowstat.agent").warning("cannot create the ready file %s: %s", path, exc)


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
