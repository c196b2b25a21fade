"""The machine a figure was measured on, described one way for runs, campaigns and benchmarks.

Every result flowstat writes names its machine with these keys, so that two results compare
field by field: what a run document records (flowstat.schema.run's ``machine``) is a subset.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TypedDict

from flowstat import __version__

CPUINFO = Path("/proc/cpuinfo")


class Machine(TypedDict):
    host: str  # the host name
    cpus: int  # logical CPUs of the machine (os.cpu_count)
    usable_cpus: int  # the CPUs this process may run on (its affinity: a container or cgroup may hold fewer)
    cpu_model: str  # /proc/cpuinfo's first "model name"; "" where it has none (some ARM kernels)
    kernel: str  # uname -r
    python: str
    flowstat_version: str


def host_identity(given: str | None = None) -> str:
    """This host's name as flowstat names it in samples, run files and views: ``given`` (an
    agent's --host-name), else Slurm's name for the node in a job step ($SLURMD_NODENAME: hosts of a
    cluster, like containers, often share one hostname), else the hostname. The C agent's
    fs_host_identity is the same rule."""
    return given or os.environ.get("SLURMD_NODENAME") or platform.node()


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name, "" when /proc/cpuinfo is unreadable or names none."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return ""


def describe() -> Machine:
    """This machine, now."""
    return Machine(
        host=platform.node(),
        cpus=os.cpu_count() or 0,
        usable_cpus=len(os.sched_getaffinity(0)),
        cpu_model=cpu_model(),
        kernel=platform.release(),
        python=platform.python_version(),
        flowstat_version=__version__,
    )
