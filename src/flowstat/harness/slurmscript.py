"""``flowstat slurm-script``: an sbatch script that runs a topology across the hosts of its job.

The script is what a user submits on their own cluster (``sbatch run.sh``): it asks for the hosts
the topology's placement needs, with the user's partition, account and time limit, and runs
``flowstat run TOPOLOGY --slurm`` inside the job, which takes the job's hosts (SLURM_JOB_ID) and
ends in the same run directory and summary as a run started by hand. Paths are made absolute, as
the job starts on another host: the topology, the run directory and this Python must be on a
filesystem every host sees.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from flowstat import __version__
from flowstat.registry import Command

SLURM_SCRIPT_HELP = "write an sbatch script that runs a topology across the hosts of a Slurm job"


def configure_slurm_script(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", help="topology YAML file (its placement: says which hosts run what)")
    p.add_argument("--partition", metavar="P", help="#SBATCH --partition (default: the cluster's default)")
    p.add_argument("--account", metavar="A", help="#SBATCH --account")
    p.add_argument("--time-limit", metavar="T", default="30:00", help="#SBATCH --time (default 30:00)")
    p.add_argument("--nodes", type=int, metavar="N", help="hosts to ask for (default: what the placement needs)")
    p.add_argument("--runs-dir", default="runs", metavar="DIR", help="where the run directory goes (default: runs)")
    p.add_argument("--run-id", help="run id (default: the topology's run_id plus a UTC timestamp)")
    p.add_argument("--duration", type=float, metavar="S", help="seconds to run (default: the topology's)")
    p.add_argument("--sink", action="append", metavar="URL", help="where the agents ship samples (repeatable)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the script here (default: stdout)")


def script_text(args: argparse.Namespace, nodes: int, job_name: str) -> str:
    """The sbatch script for ``args`` (configure_slurm_script's options), asking for ``nodes`` hosts."""
    runs_dir = Path(args.runs_dir).resolve()
    # --no-kill: a host lost mid-run ends its own steps, not the job (the run ends as after a dead producer)
    directives = [f"--job-name={job_name}", f"--nodes={nodes}", "--no-kill", f"--output={runs_dir}/slurm-%j.out"]
    directives += [f"--partition={args.partition}"] if args.partition else []
    directives += [f"--account={args.account}"] if args.account else []
    directives += [f"--time={args.time_limit}"] if args.time_limit else []
    run = [sys.executable, "-m", "flowstat", "run", str(Path(args.topology).resolve()), "--slurm"]
    run += ["--runs-dir", str(runs_dir)]
    run += ["--run-id", args.run_id] if args.run_id else []
    run += ["--duration", f"{args.duration:g}"] if args.duration else []
    run += [a for url in args.sink or [] for a in ("--sink", url)]
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives)]
    lines += [
        f"# Written by flowstat {__version__} slurm-script from {Path(args.topology).name}: submit it with",
        "# sbatch. The run takes this job's hosts and ends in the run directory under --runs-dir,",
        "# with summary.json; this Python, the topology and that directory must be on a filesystem",
        "# every host of the job sees.",
        "set -euo pipefail",
        f"mkdir -p {shlex.quote(str(runs_dir))}",
        "exec " + shlex.join(run),
    ]
    return "\n".join(lines) + "\n"


def slurm_script(args: argparse.Namespace) -> int:
    from .command import load_for
    from .launch import hosts_needed
    from .orchestrator import device_names

    topo = load_for("slurm-script", args.topology, slurm=True)
    if topo is None:
        return 2
    wanted, _ = hosts_needed(topo.placement, device_names(topo))
    text = script_text(args, max(wanted, args.nodes or 0), f"flowstat-{topo.run_id}")
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)  # sbatch opens --output there before the script runs
    if args.output:
        Path(args.output).write_text(text)
        Path(args.output).chmod(0o755)
    else:
        sys.stdout.write(text)
    return 0


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(SLURM_SCRIPT_HELP, configure_slurm_script, slurm_script)
