"""Where a run's devices run: the launchers of ``flowstat run``.

The orchestrator starts every device through one launcher and talks to it the same way whatever
the launcher: the device's stdout is a pipe of JSON events (``ready`` with its endpoints, pid and
host; ``final``), signals reach it through the process the launcher returns, and its control and
data sockets are found through the endpoints it reports.

- ``LocalLauncher``: child processes of this machine, bound to the topology's ``host`` (loopback).
- ``SlurmLauncher``: Slurm job steps (``srun --overlap``, one task each) on the hosts of an
  allocation, the one ``flowstat run`` is in (``SLURM_JOB_ID``) or one it asks for (``salloc``) and
  gives back at the end. Each device binds its own host's address (``BIND_NODE_ADDRESS``), placed as
  the topology's ``placement`` says. srun forwards SIGTERM, SIGUSR1 and SIGINT to its task; a kill is
  ``scancel --signal=KILL`` of the step. The run directory must be on a filesystem every host sees
  (as Slurm sites have: the home or a project directory), as the devices' logs and the viewer's file
  are written there.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from flowstat.proc.machine import host_identity

# A device told to bind this resolves its host's address itself (flowstat.harness.devices.device).
BIND_NODE_ADDRESS = "@node"
NODE_ADDR_ENV = "FLOWSTAT_NODE_ADDR"  # the host's address, when a site's TaskProlog exports it
SLURM_PROGRAMS = ("srun", "salloc", "scancel", "scontrol", "sinfo", "squeue")
SLURM_TIMEOUT_S = 20.0  # a Slurm client that has not answered by then: the controller is not answering
COMPLETING_WAIT_S = 30.0  # a job ended from outside is COMPLETING until its processes are killed (KillWait)


class LaunchError(RuntimeError):
    """What keeps devices from being started there, named, before anything starts."""


class Launcher(Protocol):
    """Starts the devices of one run somewhere and signals them."""

    kind: str

    def prepare(self, spec: dict[str, list[str] | int], names: list[str]) -> None:
        """Before anything starts: check what the launcher needs and take its hosts; ``spec`` is the
        topology's placement (role -> host names or a count of hosts), ``names`` every device."""

    def bind_host(self, name: str) -> str:
        """What the device binds (an address, or BIND_NODE_ADDRESS)."""

    def host_of(self, name: str) -> str:
        """The host the device runs on, as the samples and views name it."""

    def start(
        self,
        name: str,
        argv: Sequence[str],
        stderr: IO[bytes],
        host: str | None = None,
        stdout: int = subprocess.PIPE,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """The process (a device's stdout is a pipe of its events); ``host``: where, for a process
        the placement does not name (an agent); ``env``: added to this process's environment."""

    def signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        """Deliver ``sig`` to the device behind ``proc``."""

    def describe(self) -> dict[str, Any]:
        """For the run document: the launcher and its hosts."""

    def hosts_in_use(self) -> list[str]:
        """The hosts that run devices."""

    def ended_by(self) -> str | None:
        """After the run: what ended it from outside (a cancelled job), or None."""

    def close(self) -> None:
        """After the run: nothing left running, the allocation given back if it was ours."""


class LocalLauncher:
    """Child processes of this machine, each in a session of its own (Ctrl-C reaches only the
    orchestrator)."""

    kind = "local"

    def __init__(self, host: str):
        self.host = host

    def prepare(self, spec: dict[str, list[str] | int], names: list[str]) -> None:
        pass

    def bind_host(self, name: str) -> str:
        return self.host

    def host_of(self, name: str) -> str:
        return host_identity()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        stderr: IO[bytes],
        host: str | None = None,
        stdout: int = subprocess.PIPE,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
            env={**os.environ, **env} if env else None,
        )

    def signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass

    def describe(self) -> dict[str, Any]:
        return {"launcher": self.kind, "hosts": [host_identity()]}

    def hosts_in_use(self) -> list[str]:
        return [host_identity()]

    def ended_by(self) -> str | None:
        return None

    def close(self) -> None:
        pass


_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)", re.MULTILINE)


def host_lost(step_log: str) -> str | None:
    """The host a job step's srun saw fail (its last words in the device's log), or None. srun then
    exits 0 without its task's status: the log is all there is to tell."""
    found = _NODE_FAILURE.search(step_log)
    return found.group(1) if found else None


def _slurm(argv: Sequence[str], what: str, timeout: float = SLURM_TIMEOUT_S) -> str:
    """A Slurm client's stdout; LaunchError naming what failed (the program, its words)."""
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{what}: `{' '.join(argv)}` had no answer in {timeout:.0f} s (is slurmctld up?)") from None
    if out.returncode != 0:
        words = (out.stderr or out.stdout).strip().splitlines()
        raise LaunchError(f"{what}: `{' '.join(argv)}` failed: {words[-1] if words else f'exit {out.returncode}'}")
    return out.stdout


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list (n[1-3],gpu7) as names, by scontrol (Slurm's own rules)."""
    return _slurm(["scontrol", "show", "hostnames", hostlist], "expanding the allocation's host list").split()


@dataclass
class SlurmLauncher:
    """Devices as job steps of a Slurm allocation. ``nodes``: hosts to ask for when not inside an
    allocation (default: what the placement needs); ``partition``, ``account``, ``time_limit``: salloc's."""

    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    nodes: int | None = None
    job_name: str = "flowstat"
    kind: str = "slurm"
    job_id: str = ""
    hosts: list[str] = field(default_factory=list)
    placement: dict[str, str] = field(default_factory=dict)
    allocated: bool = False  # we asked for the allocation: we give it back
    names: dict[int, str] = field(default_factory=dict)  # srun's pid -> its device
    steps: dict[str, str] = field(default_factory=dict)  # device -> its job step (JOB.STEP)

    # -- before anything starts ---------------------------------------------------------------------
    def prepare(self, spec: dict[str, list[str] | int], names: list[str]) -> None:
        if self.placement:  # prepared already (flowstat run does it before the run directory is made)
            return
        missing = [p for p in SLURM_PROGRAMS if shutil.which(p) is None]
        if missing:
            raise LaunchError(
                f"flowstat run --slurm needs Slurm's client programs, not on the PATH: {', '.join(missing)}"
            )
        _slurm(["scontrol", "ping"], "asking the Slurm controller")
        wanted, named = hosts_needed(spec, names)
        if self.nodes:
            wanted = max(wanted, self.nodes)
        if os.environ.get("SLURM_JOB_ID"):
            self.job_id = os.environ["SLURM_JOB_ID"]
            self.hosts = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))
            if wanted > len(self.hosts):
                raise LaunchError(f"the topology asks for {wanted} hosts; job {self.job_id} has {len(self.hosts)}")
        else:
            self._check_partition(wanted)
            self._allocate(wanted, named)
        outside = [h for h in named if h not in self.hosts]
        if outside:
            raise LaunchError(
                f"the placement names hosts outside the allocation ({', '.join(outside)}); "
                f"job {self.job_id} has {', '.join(self.hosts)}"
            )
        self.placement = assign(spec, names, self.hosts)

    def _check_partition(self, wanted: int) -> None:
        argv = ["sinfo", "-h", "-o", "%D %P"] + (["-p", self.partition] if self.partition else [])
        rows = [line.split() for line in _slurm(argv, "reading the partition").splitlines() if line.strip()]
        if self.partition is None:  # the default partition is marked with *
            rows = [r for r in rows if r[1].endswith("*")] or rows
        if not rows:
            raise LaunchError(f"Slurm has no partition {self.partition or '(default)'}")
        have, name = int(rows[0][0]), rows[0][1].rstrip("*")
        if wanted > have:
            raise LaunchError(f"the topology asks for {wanted} hosts; partition {name} has {have}")

    def _allocate(self, wanted: int, explicit: list[str]) -> None:
        # --no-kill: a host lost mid-run ends its own steps, not the job; the run then ends as after a
        # dead producer, with every other host's objects conserved and checked
        argv = ["salloc", "--no-shell", "--no-kill", "-N", str(wanted), "--job-name", self.job_name, "--immediate=60"]
        if self.partition:
            argv += ["-p", self.partition]
        if self.account:
            argv += ["-A", self.account]
        if self.time_limit:
            argv += ["-t", self.time_limit]
        if explicit:
            argv += ["-w", ",".join(explicit)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
        granted = re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout)
        if out.returncode != 0 or not granted:
            words = (out.stderr or out.stdout).strip().splitlines()
            raise LaunchError(f"salloc of {wanted} hosts failed: {words[-1] if words else f'exit {out.returncode}'}")
        self.job_id, self.allocated = granted.group(1), True
        nodelist = _slurm(["squeue", "-h", "-j", self.job_id, "-o", "%N"], "reading the allocation").strip()
        self.hosts = expand_hostlist(nodelist)

    # -- devices ------------------------------------------------------------------------------------
    def bind_host(self, name: str) -> str:
        return BIND_NODE_ADDRESS

    def host_of(self, name: str) -> str:
        return self.placement[name]

    def start(
        self,
        name: str,
        argv: Sequence[str],
        stderr: IO[bytes],
        host: str | None = None,
        stdout: int = subprocess.PIPE,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        srun = [
            "srun",
            f"--jobid={self.job_id}",
            "--overlap",  # every device and agent shares the allocation's CPUs, as local processes do
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={host or self.placement[name]}",
            f"--job-name={name}",
            "--kill-on-bad-exit=0",
            "--unbuffered",
            "--quiet",
        ]
        proc = subprocess.Popen(
            srun + list(argv),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            close_fds=True,
            env={**os.environ, **env} if env else None,  # srun passes its environment to the task
        )
        self.names[proc.pid] = name
        return proc

    def step_of(self, name: str) -> str | None:
        """The job step running device ``name`` (its step's name), as squeue lists it."""
        out = subprocess.run(
            ["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j"],
            capture_output=True,
            text=True,
            timeout=SLURM_TIMEOUT_S,
        ).stdout
        return next(
            (
                step
                for step, job_name in (line.split(None, 1) for line in out.splitlines() if " " in line)
                if job_name.strip() == name
            ),
            None,
        )

    def signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        """By scancel --signal to the device's step: srun forwards SIGUSR1 but turns SIGTERM into a
        cancel of the step (its task killed at once), and cannot forward SIGKILL."""
        if proc.poll() is not None:
            return
        name = self.names.get(proc.pid, "")
        step = self.steps.get(name) or self.step_of(name)
        if step:
            self.steps[name] = step
            sent = subprocess.run(
                ["scancel", f"--signal={signal.Signals(sig).name.removeprefix('SIG')}", step],
                capture_output=True,
                timeout=SLURM_TIMEOUT_S,
            )
            if sent.returncode == 0:
                return
        if sig != signal.SIGTERM:  # the step is not listed (yet, or any more): srun forwards the rest
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass

    def describe(self) -> dict[str, Any]:
        return {"launcher": self.kind, "job_id": self.job_id, "hosts": list(self.hosts)}

    def hosts_in_use(self) -> list[str]:
        """The hosts that run devices: each gets an agent."""
        return sorted(set(self.placement.values()))

    def ended_by(self) -> str | None:
        """The job's end from outside (scancel, its time limit, a node lost), as scontrol has it."""
        if not self.job_id:
            return None
        deadline = time.monotonic() + COMPLETING_WAIT_S
        while True:
            out = subprocess.run(
                ["scontrol", "-o", "show", "job", self.job_id], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S
            ).stdout
            found = re.search(r"\bJobState=(\S+)", out)
            state = found.group(1) if found else None
            # a job still RUNNING ended by nothing but us; COMPLETING hides why it ends (the
            # processes of a cancelled job still being killed): its final state follows
            if state != "COMPLETING" or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if state in ("CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "DEADLINE"):
            return f"Slurm job {self.job_id} ended: {state} (every device ended with it)"
        if state == "COMPLETING":
            return f"Slurm job {self.job_id} ended from outside (still completing after {COMPLETING_WAIT_S:g} s)"
        return None

    def close(self) -> None:
        if not self.job_id:
            return
        if self.allocated:
            subprocess.run(["scancel", self.job_id], capture_output=True, timeout=SLURM_TIMEOUT_S)
        self.allocated = False


def _role(name: str) -> str:
    return "producers" if name.startswith("producers-") else ("viewer" if name == "viewer" else "mergers")


def hosts_needed(spec: dict[str, list[str] | int], names: list[str]) -> tuple[int, list[str]]:
    """How many hosts a placement asks for, and those it names. Default: the mergers on a host of
    their own (the viewer with them), the producers spread over up to two others."""
    named = sorted({h for v in spec.values() if isinstance(v, list) for h in v})
    if named and all(isinstance(spec.get(r), list) for r in ("producers", "mergers")):
        return len(named), named
    groups = sum(1 for n in names if _role(n) == "producers")
    mergers = spec.get("mergers", 1)
    producers = spec.get("producers", min(2, groups))
    count = (len(mergers) if isinstance(mergers, list) else mergers) + (
        len(producers) if isinstance(producers, list) else producers
    )
    return max(count, len(named)), named


def assign(spec: dict[str, list[str] | int], names: list[str], hosts: list[str]) -> dict[str, str]:
    """Every device's host, from the hosts of the allocation: a role's named hosts, else its count
    of hosts (mergers from the end of the list, producers from the start), devices of a role
    round-robin over its hosts; the viewer with the first merger host unless placed."""
    if not hosts:
        raise LaunchError("the allocation holds no host")

    def hosts_of(role: str, default: int, from_end: bool) -> list[str]:
        given = spec.get(role, default)
        if isinstance(given, list):
            return given
        count = max(1, min(given, len(hosts)))
        return hosts[-count:] if from_end else hosts[:count]

    merger_hosts = hosts_of("mergers", 1, True)
    producer_default = min(2, max(1, len(hosts) - len(merger_hosts)))
    spare = [h for h in hosts if h not in merger_hosts] or hosts
    given = spec.get("producers")
    producer_hosts = given if isinstance(given, list) else spare[: max(1, given or producer_default)]
    viewer = spec.get("viewer")
    viewer_hosts = viewer if isinstance(viewer, list) else merger_hosts[:1]
    pools: dict[str, list[str]] = {"producers": producer_hosts, "mergers": merger_hosts, "viewer": viewer_hosts}
    turn: dict[str, int] = {}
    out = {}
    for name in names:
        role = _role(name)
        k = turn.get(role, 0)
        out[name] = pools[role][k % len(pools[role])]
        turn[role] = k + 1
    return out


def node_address() -> str:
    """This host's address for a device told to bind BIND_NODE_ADDRESS: FLOWSTAT_NODE_ADDR when set
    (a TaskProlog can export it), else the NodeAddr Slurm has for this node, else what the host
    name resolves to."""
    if os.environ.get(NODE_ADDR_ENV):
        return os.environ[NODE_ADDR_ENV]
    node = os.environ.get("SLURMD_NODENAME")
    if node:
        out = _slurm(["scontrol", "-o", "show", "node", node], f"looking up node {node}'s address")
        found = re.search(r"\bNodeAddr=(\S+)", out)
        if found:
            return socket.gethostbyname(found.group(1))
    return socket.gethostbyname(socket.gethostname())


def host_name() -> str:
    """The name of this host in samples and run files (proc.machine.host_identity: Slurm's name for
    it in a job step, else the hostname)."""
    return host_identity()
