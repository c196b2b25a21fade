"""The suite's Slurm cluster for a test module (flowstat_lab.slurm, flowstat_lab.netns): the cluster
for the module, what it may not leave behind, and `flowstat run --slurm` from inside its namespace."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from flowstat_lab import netns  # noqa: F401  (the namespace's port forwarding, for the tests)
from flowstat_lab import slurm as sc
from support.common import ROOT

MISSING = sc.missing_programs() + ([] if os.geteuid() == 0 else ["root"])

SLURM_PROCESSES = {"slurmctld", "slurmd", "slurmstepd", "slurmscriptd", "munged", "srun"}


def host_addresses() -> str:
    """The machine's interfaces and addresses, as `ip -br addr` shows them."""
    return subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True, check=True).stdout


def processes() -> dict[int, tuple[str, str]]:
    """{pid: (comm, cmdline)} of every live process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                found[int(entry.name)] = (comm, cmdline)
    return found


def leftovers(netns_inode: int | None, marker: str | None = None) -> list[str]:
    """What the cluster may not leave: its namespace, a Slurm or munge process, a process still in
    the namespace's inode, a test task (by its marker)."""
    left = []
    if sc.netns_exists():
        left.append(f"namespace {sc.NETNS}")
    for pid, (comm, cmdline) in processes().items():
        if comm in SLURM_PROCESSES:
            left.append(f"{comm} ({pid})")
        elif marker and marker in cmdline:
            left.append(f"task {cmdline!r} ({pid})")
        elif netns_inode is not None:
            try:
                if os.stat(f"/proc/{pid}/ns/net").st_ino == netns_inode:
                    left.append(f"{comm} ({pid}) in the namespace")
            except OSError:
                pass
    return left


def module_cluster():
    """The cluster, up for a module (owned by this process), down at the end; the machine's
    interfaces and addresses are what they were before. One cluster a machine: a module on another
    worker waits for it (slurmcluster's lock)."""
    before = host_addresses()
    c = sc.Cluster()
    t0 = time.monotonic()
    c.up(owner=os.getpid())
    print(f"slurm cluster up in {time.monotonic() - t0:.2f} s", file=sys.stderr)
    try:
        yield c
    finally:
        t0 = time.monotonic()
        c.down()
        print(f"slurm cluster down in {time.monotonic() - t0:.2f} s", file=sys.stderr)
    assert host_addresses() == before
    assert leftovers(None) == []


ACROSS_THREE = """run_id: across
description: the demo across three hosts
duration: 3
buffer_size: 100
object: {type: TH1F, size: 1kB}
producers: {count: 8, rate: 100, processes: 2}
mergers: 2
"""


# The C agent as this checkout built it (make installs it beside the venv's python too).
C_AGENT_ENV = {"FLOWSTAT_C_AGENT": str(ROOT / "collectors" / "c" / "build" / "flowstat-agent")}


def flowstat_run(c: sc.Cluster, topology: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`flowstat run TOPOLOGY --slurm ...` from inside the cluster's namespace, as a user on a login node."""
    return c.client(
        sys.executable,
        "-m",
        "flowstat",
        "run",
        str(topology),
        "--slurm",
        "--json",
        *map(str, args),
        env=env,
        timeout=120,
    )


def start_flowstat_run(c: sc.Cluster, topology: Path, runs: Path, run_id: str) -> subprocess.Popen:
    """flowstat_run's command in the background (with the C agent), for a test that acts on the run
    while it goes on; its output read with communicate()."""
    return subprocess.Popen(
        [*c.client_prefix(), sys.executable, "-m", "flowstat", "run", str(topology), "--slurm", "--json"]
        + ["--runs-dir", str(runs), "--run-id", run_id],
        env=c.client_env(C_AGENT_ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def jobs(c: sc.Cluster) -> list[str]:
    return c.client("squeue", "-h", "-o", "%i %j %T", check=True).stdout.splitlines()
