"""``flowstat run``, ``flowstat validate`` and ``flowstat ctl``: the harness's commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from flowstat.registry import Command

if TYPE_CHECKING:
    from flowstat.flow import Verdict

    from .topology import Topology


def _progress_printer(stream=sys.stderr):
    """A one-line live status: a bar on a terminal, a line every 5 s otherwise; with which node holds
    the flow back (the orchestrator's verdict of the same reading)."""
    tty = stream.isatty()
    state = {"last": -5.0}

    from .flowwatch import short as flow_word
    from .online import short

    def show(
        elapsed: float, duration: float, metrics: list[dict], verdicts: dict[str, dict], flow: Verdict | None
    ) -> None:
        mergers = [m for m in metrics if m.get("role") == "merger"]
        producers = [m for m in metrics if m.get("role") == "producer"]
        merged = sum(m.get("merged_objects_per_second") or 0 for m in mergers)
        in_flight = sum(m.get("objects_in_flight") or 0 for m in mergers)
        p99 = max((m.get("input_latency_p99_ms") or 0 for m in mergers), default=0)
        overloads = sum(m.get("send_overload_events") or 0 for m in producers)
        cpu = sum(m.get("cpu_clock") or 0 for m in metrics) / 1e6
        frac = min(1.0, elapsed / duration) if duration > 0 else 1.0
        judged = "; ".join(f"{m} {short(v)}" if len(verdicts) > 1 else short(v) for m, v in verdicts.items())
        judged += f"  {flow_word(flow)}"
        text = (
            f"{elapsed:5.1f}/{duration:.0f} s  merged {merged:,.0f}/s  in flight {in_flight:,}  "
            f"latency p99 {p99:,.1f} ms  overloads {overloads:,}  cpu {cpu:.2f} cores  {judged}"
        )
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


RUN_HELP = "run a producer/merger/viewer topology and print its summary"
RUN_PARSER = dict(
    description="Start every device of a topology over ZeroMQ on loopback, run it, stop it cleanly and "
    "print per-node figures and the no-loss check. Exit status: 0 when the run was clean "
    "and lost nothing, 1 otherwise, 2 for a bad topology."
)


def configure_run(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "topology",
        help="topology YAML file (examples: benchmark-harness/topologies/ in flowstat's "
        "repository; format: docs/harness.md)",
    )
    p.add_argument("--duration", type=float, metavar="S", help="seconds to run (default: the topology's)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no live progress line")
    p.add_argument("--run-id", help="run id (default: the topology's run_id plus a UTC timestamp)")
    p.add_argument("--runs-dir", default="runs", metavar="DIR", help="where run directories go (default: runs)")
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="how long a node may take to start and bind before the run is stopped, naming it and its host "
        "(default 60: building a producer's pool of 50 MB objects takes a while)",
    )
    p.add_argument("--no-agent", action="store_true", help="do not monitor the run with the agents")
    p.add_argument("--no-c-agent", action="store_true", help="monitor with the Python agent only")
    p.add_argument("--agent-interval", type=float, default=1.0, metavar="S", help="agent sampling interval (default 1)")
    p.add_argument(
        "--agent-self-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="how often the agents report on themselves (flowstat_agent; default 5)",
    )
    p.add_argument(
        "--sink",
        action="append",
        metavar="URL",
        help="ship the agents' samples here instead of RUN_DIR/samples-AGENT.lp (see flowstat agent --help); "
        "prometheus://HOST:PORT serves the Python agent's /metrics on PORT and the C agent's on PORT+1, and "
        "the run's files are still written when every sink only serves scrapes",
    )
    slurm = p.add_argument_group(
        "across hosts (Slurm)",
        "Start the devices as Slurm job steps on the hosts of an allocation: the one this command runs "
        "in (SLURM_JOB_ID, e.g. in an sbatch script), or one it asks salloc for and gives back. The "
        "topology's placement: says which hosts run what; --runs-dir must be on a filesystem every host "
        "sees (docs/compose.md: Past one machine).",
    )
    slurm.add_argument("--slurm", action="store_true", help="run across the hosts of a Slurm allocation")
    slurm.add_argument("--partition", metavar="P", help="salloc's partition (default: Slurm's default)")
    slurm.add_argument("--account", metavar="A", help="salloc's account")
    slurm.add_argument("--time-limit", metavar="T", help="salloc's time limit (e.g. 30:00)")
    slurm.add_argument("--nodes", type=int, metavar="N", help="hosts to ask for (default: what the placement needs)")


def load_for(command: str, path: str, slurm: bool = False) -> Topology | None:
    """The topology of a command, or None once its error was said (a topology pinning CPUs cannot
    run under Slurm, which pins with its own options)."""
    from .topology import TopologyError, load

    try:
        topo = load(path)
    except TopologyError as exc:
        print(f"flowstat {command}: {exc}", file=sys.stderr)
        return None
    if slurm and topo.cpus:
        print(
            f"flowstat {command}: cpus: pins processes of one machine; under Slurm use its --cpu-bind", file=sys.stderr
        )
        return None
    return topo


def run(args: argparse.Namespace) -> int:
    from .agents import AgentOptions
    from .orchestrator import RunError, run_topology
    from .summary import format_summary

    topo = load_for("run", args.topology, slurm=args.slurm)
    if topo is None:
        return 2
    if args.duration is not None and args.duration <= 0:
        print("flowstat run: --duration must be positive", file=sys.stderr)
        return 2
    launcher = None
    if args.slurm:
        from .launch import LaunchError, SlurmLauncher
        from .orchestrator import device_names

        launcher = SlurmLauncher(args.partition, args.account, args.time_limit, args.nodes, f"flowstat-{topo.run_id}")
        try:  # before anything starts or is written: what is missing, or does not fit, is said now
            launcher.prepare(topo.placement, device_names(topo))
        except LaunchError as exc:
            print(f"flowstat run: {exc}", file=sys.stderr)
            launcher.close()
            return 2
    progress = None if args.json or args.quiet else _progress_printer()
    try:
        summary = run_topology(
            topo,
            duration=args.duration,
            run_id=args.run_id,
            runs_dir=Path(args.runs_dir),
            on_progress=progress,
            agent=AgentOptions(
                not args.no_agent, args.agent_interval, args.sink or [], not args.no_c_agent, args.agent_self_interval
            ),
            launcher=launcher,
            ready_timeout_s=args.ready_timeout,
        )
    except RunError as exc:
        print(f"flowstat run: {exc}", file=sys.stderr)
        return 1
    finally:
        if launcher is not None:
            launcher.close()  # the allocation it asked for is given back, however the run ended
    if progress is not None and sys.stderr.isatty():
        sys.stderr.write("\n")
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(format_summary(summary))
    return 0 if summary["ok"] else 1


VALIDATE_HELP = "check topology files without running them"


def configure_validate(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", nargs="+")


def validate(args: argparse.Namespace) -> int:
    from flowstat.schema.run import merge_cost_text
    from flowstat.units import format_size

    from .summary import mergers_text, parameters
    from .topology import TopologyError, load

    status = 0
    for path in args.topology:
        try:
            t = load(path)
        except TopologyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
            continue
        cost = merge_cost_text(parameters(t))
        print(
            f"{path}: OK - {t.n_producers} producers x {t.rate:g} obj/s in {t.producer_processes} process(es), "
            f"{mergers_text(parameters(t))}, {t.obj.kind.name} {format_size(t.obj.nbytes)} {list(t.obj.shape)}, "
            f"buffer {t.buffer_size}, {t.duration:g} s"
            + (f", pinned {t.cpus_text()}" if t.cpus else "")
            + (f", {cost}" if cost else "")
        )
    return status


CTL_HELP = "send a control command to a running node"
CTL_PARSER = dict(
    description="Send a JSON control request to a node's control endpoint and print the reply "
    "(endpoints of a run are in RUN_DIR/endpoints.json)."
)


def configure_ctl(p: argparse.ArgumentParser) -> None:
    from flowstat.node.protocol import COMMANDS

    p.add_argument("endpoint", help="e.g. tcp://127.0.0.1:40123")
    p.add_argument("command", nargs="?", default="get-metrics", help=f"{', '.join(COMMANDS)} (default get-metrics)")
    p.add_argument("--raw", metavar="TEXT", help="send TEXT as the request body instead")
    p.add_argument("--timeout", type=float, default=2.0, metavar="S", help="reply time-out (default 2 s)")
    p.add_argument(
        "--keys",
        metavar="DIR",
        help="a secured run's keys (RUN_DIR/keys: its nodes' public key and the client key); "
        "without them a secured node does not answer",
    )


def ctl(args: argparse.Namespace) -> int:
    from flowstat.node import curve
    from flowstat.node.protocol import ControlClient, ControlError

    keyed = None
    if args.keys:
        try:
            keys = Path(args.keys)
            keyed = (curve.read_key_file(keys / "node.key")[0], curve.client_keys(keys / "client.key_secret"))
        except curve.CurveError as exc:
            print(f"flowstat ctl: {exc}", file=sys.stderr)
            return 2
    client = ControlClient(args.endpoint, timeout_s=args.timeout, curve=keyed)
    try:
        payload = args.raw.encode() if args.raw is not None else json.dumps({"command": args.command}).encode()
        raw = client.request_raw(payload)
        reply = json.loads(raw)
    except ControlError as exc:
        print(f"flowstat ctl: {exc}", file=sys.stderr)
        return 1
    except (ValueError, UnicodeDecodeError):
        print(f"flowstat ctl: {args.endpoint}: the reply is not JSON ({len(raw)} bytes)", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(json.dumps(reply, indent=1))
    return 1 if "error" in reply else 0


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
RUN_COMMAND = Command(RUN_HELP, configure_run, run, RUN_PARSER)
VALIDATE_COMMAND = Command(VALIDATE_HELP, configure_validate, validate)
CTL_COMMAND = Command(CTL_HELP, configure_ctl, ctl, CTL_PARSER)
