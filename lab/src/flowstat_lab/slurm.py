"""The suite's own Slurm cluster: Debian's slurmctld, three slurmd and munged (Slurm 22.05, built
with MULTIPLE_SLURMD), all on this machine, inside a network namespace of their own, NETNS, that
holds only its loopback with the cluster's addresses: the controller at 127.0.0.10 and the compute
nodes n1, n2, n3 at 127.0.0.11-13 (partition ``flowstat``, CPUs=2 each), so that a process bound to
the wrong node's address shows. ../shared/STACK.md ("Slurm") has the facts this follows:

- **SLURM_CONF always set** (daemons and clients): without it Slurm looks its configuration up in
  DNS. Nothing here listens on or connects to an address outside 127.0.0.0/8, or resolves a name.
- **nsenter --net**, not ``ip netns exec`` (which remounts /sys). Clients too: ``client_prefix()``
  and ``client_env()``, or ``Cluster.client(...)``, run sinfo, srun, sbatch, scontrol, scancel.
- **Each daemon at its own address**: with NoInAddrAny a Slurm daemon binds what its hostname
  resolves to, so each starts in a UTS namespace of its own with its address as hostname; once it
  listens, that namespace's hostname is set back to the machine's (left changed, srun's I/O hangs).
- munged with its own socket and key (0400) under the state directory (AuthInfo=socket=...).
- **Stopped by pid**, and then every process left in the namespace is killed: a slurmd killed
  with SIGKILL leaves its slurmstepd and tasks running. Then the namespace is deleted.
- **One cluster a machine**: ``up`` takes a lock (fcntl) that a keeper process inside the namespace
  holds for the cluster's life; another ``up`` waits for it. A cluster whose owner (the test process
  that started it) died is taken down and replaced; one started from this CLI belongs to no process.

The state (slurm.conf, munge key and socket, controller state, spools, pid files, logs) is in
/var/lib/flowstat/slurm or FLOWSTAT_SLURM_ROOT; ``up`` starts from empty controller state and
spools, logs are kept until the next ``up``.

    python -m flowstat_lab.slurm up               start (or find running) and wait for 3 idle nodes
    python -m flowstat_lab.slurm status           the nodes as sinfo sees them (exit 1: not up)
    python -m flowstat_lab.slurm run -- CMD...   CMD inside the namespace with SLURM_CONF set
    python -m flowstat_lab.slurm down             stop everything; idempotent
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from flowstat_lab.netns import Namespace, alive, pid_file_alive, process_state, read_pid, run_checked

NETNS = "flowstat-slurm"
NETNS_PATH = Path("/run/netns") / NETNS
CONTROLLER_ADDR = "127.0.0.10"
NODES = {"n1": "127.0.0.11", "n2": "127.0.0.12", "n3": "127.0.0.13"}
PARTITION = "flowstat"
CPUS_PER_NODE = 2
CTLD_PORT = 6817  # one port for every slurmd (each on its own address)
SLURMD_PORT = 6818
SLURMD_TIMEOUT_S = 10  # Slurm's default, 300 s, notices a lost node after minutes
LOCK_DIR = Path("/run/flowstat-slurm")  # machine-wide, whatever the state root: one cluster a machine
DAEMONS = ("slurmctld", "slurmd", "munged")
PROGRAMS = ("slurmctld", "slurmd", "munged", "sinfo", "srun", "scontrol", "scancel", "squeue", "nsenter", "unshare")
ADDR_ENV = "FLOWSTAT_NODE_ADDR"  # what the TaskProlog exports to every task: its node's address


def say(msg: str) -> None:
    print(f"slurmcluster: {msg}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    """What did not come up or go down, named."""


def state_root() -> Path:
    return Path(os.environ.get("FLOWSTAT_SLURM_ROOT", "/var/lib/flowstat/slurm"))


def which(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin:/usr/bin:/bin")


def missing_programs() -> list[str]:
    """What the cluster needs and this machine lacks (make installs slurmctld slurmd slurm-client munge)."""
    return [p for p in PROGRAMS if not which(p)]


# -- the namespace ----------------------------------------------------------------------------------
NAMESPACE = Namespace(NETNS, ClusterError)


def netns_exists() -> bool:
    return NAMESPACE.exists()


def netns_inode() -> int | None:
    return NAMESPACE.inode()


def netns_pids(inode: int | None = None) -> list[int]:
    """Every process whose network namespace is NETNS, or the one of that inode (daemons, keeper,
    slurmstepd, tasks)."""
    return NAMESPACE.pids(inode)


def netns_addresses() -> list[str]:
    return NAMESPACE.addresses()


def _run(cmd: list, what: str, **kw) -> subprocess.CompletedProcess:
    return run_checked(cmd, what, ClusterError, **kw)


_state, _alive, _read_pid = process_state, alive, read_pid


def _listening(addr: str, port: int, pid: int) -> bool:
    """Whether ADDR:PORT listens in the network namespace of process PID (its /proc/PID/net/tcp)."""
    want = "{:08X}:{:04X}".format(int.from_bytes(socket.inet_aton(addr), "little"), port)
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(f[1] == want and f[3] == "0A" for f in (line.split() for line in lines) if len(f) > 3)


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return f"--- {path} (end) ---\n{path.read_text(errors='replace')[-chars:]}"
    except OSError:
        return f"--- {path}: none ---"


# -- the cluster ------------------------------------------------------------------------------------
@dataclass
class Cluster:
    root: Path = field(default_factory=state_root)

    # where things are
    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def pid_file(self, daemon: str, node: str | None = None) -> Path:
        return self.run_dir / (f"{daemon}-{node}.pid" if node else f"{daemon}.pid")

    def log(self, daemon: str, node: str | None = None) -> Path:
        return self.log_dir / (f"{daemon}-{node}.log" if node else f"{daemon}.log")

    @property
    def task_prolog(self) -> Path:
        return self.root / "task-prolog.sh"

    def daemon_pids(self) -> dict[str, int]:
        """The daemons whose pid file names a live process: {'slurmctld': pid, 'slurmd-n1': pid, ...}."""
        found = {}
        for f in sorted(self.run_dir.glob("*.pid")) if self.run_dir.exists() else []:
            pid = pid_file_alive(f)
            if pid is not None:
                found[f.stem] = pid
        return found

    # clients
    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """For sinfo, srun, sbatch, scontrol, scancel: SLURM_CONF always (else Slurm asks DNS)."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "SLURM_CONF": str(self.conf),
        }
        for k in ("PYTHONPATH", "VIRTUAL_ENV"):
            if k in os.environ:
                env[k] = os.environ[k]
        return {**env, **(extra or {})}

    @staticmethod
    def client_prefix() -> list[str]:
        """The argv prefix that puts a client in the cluster's namespace."""
        return ["nsenter", f"--net={NETNS_PATH}", "--"]

    def client(self, *argv: str, timeout: float | None = 60, check: bool = False, **kw) -> subprocess.CompletedProcess:
        """A client command (sinfo, srun ...) in the namespace with SLURM_CONF set; text output captured."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        env = self.client_env(kw.pop("env", None))
        return subprocess.run([*self.client_prefix(), *argv], env=env, timeout=timeout, check=check, **kw)

    def node_states(self) -> dict[str, str]:
        """{node: state} as sinfo reports it ('idle', 'down*', 'alloc', ...); {} when nothing answers."""
        try:
            out = self.client("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t", timeout=15)
        except subprocess.TimeoutExpired:
            return {}
        if out.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())

    def running(self) -> bool:
        pids = self.daemon_pids()
        return netns_exists() and "slurmctld" in pids and "munged" in pids

    # configuration
    def slurm_conf_text(self) -> str:
        r = self.root
        lines = [
            "# made by flowstat_lab.slurm: the suite's own cluster (../shared/STACK.md, Slurm)",
            "ClusterName=flowstat",
            f"SlurmctldHost={CONTROLLER_ADDR}",
            f"SlurmctldPort={CTLD_PORT}",
            f"SlurmdPort={SLURMD_PORT}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerParameters=bf_interval=1",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "PropagateResourceLimits=NONE",
            f"StateSaveLocation={r / 'ctld'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={self.pid_file('slurmctld')}",
            f"SlurmdPidFile={self.run_dir / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log('slurmctld')}",
            f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
            f"TaskProlog={self.task_prolog}",
        ]
        for name, addr in NODES.items():
            lines.append(
                f"NodeName={name} NodeAddr={addr} CPUs={CPUS_PER_NODE} Sockets=1 "
                f"CoresPerSocket={CPUS_PER_NODE} ThreadsPerCore=1 State=UNKNOWN"
            )
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def task_prolog_text(self) -> str:
        cases = "\n".join(f"    {n}) echo 'export {ADDR_ENV}={a}' ;;" for n, a in NODES.items())
        return f'#!/bin/sh\n# every task gets its node\'s address\ncase "$SLURMD_NODENAME" in\n{cases}\nesac\n'

    def _prepare(self) -> None:
        """A fresh state: configuration, munge key, empty controller state and spools, new logs."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        if (self.root / "log").exists():  # the last cluster's logs, for a failure that restarted it
            shutil.rmtree(self.root / "log.previous", ignore_errors=True)
            (self.root / "log").rename(self.root / "log.previous")
        for d in ("ctld", "spool", "run", "log", "munge"):
            shutil.rmtree(self.root / d, ignore_errors=True)
            (self.root / d).mkdir(mode=0o755)
            os.chmod(self.root / d, 0o755)  # munged refuses group- or world-writable directories
        for n in NODES:
            (self.root / "spool" / n).mkdir(mode=0o755)
        fd = os.open(self.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))
        self.conf.write_text(self.slurm_conf_text())
        self.task_prolog.write_text(self.task_prolog_text())
        os.chmod(self.task_prolog, 0o755)

    # up
    def up(self, timeout_s: float = 60.0, lock_wait_s: float = 1800.0, owner: int | None = None) -> None:
        """Start the cluster and wait for sinfo to show every node idle. ``owner``: the pid whose
        death makes a running cluster an orphan another ``up`` may replace (None: belongs to no one,
        as the CLI's). Idempotent: a running cluster of this root, all nodes idle, is kept."""
        missing = missing_programs()
        if missing:
            raise ClusterError(
                f"missing: {', '.join(missing)} (make installs slurmctld slurmd slurm-client munge, nsenter)"
            )
        if os.geteuid() != 0:
            raise ClusterError("the cluster needs root (network namespace, daemons as root)")
        if self.running() and set(self.node_states().values()) == {"idle"} and self._owner_root() == self.root:
            return
        lock = self._take_lock(lock_wait_s)
        try:
            self.down()  # whatever an interrupted run of this root left
            self._start(timeout_s, lock, owner)
        except BaseException:
            self.down()
            raise
        finally:
            os.close(lock)  # the keeper holds it now (or, after a failure, nothing)

    def _owner_root(self) -> Path | None:
        try:
            return Path(json.loads((LOCK_DIR / "owner.json").read_text())["root"])
        except (OSError, ValueError, KeyError):
            return None

    def _take_lock(self, wait_s: float) -> int:
        """The machine's cluster lock, as an open fd; waits for another cluster's end. A cluster whose
        owner process died (a test run killed before its down) is stopped and its lock taken over."""
        LOCK_DIR.mkdir(mode=0o755, exist_ok=True)
        fd = os.open(LOCK_DIR / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                pass
            try:
                info = json.loads((LOCK_DIR / "owner.json").read_text())
            except (OSError, ValueError):
                info = {}
            if info.get("owner") and not _alive(info["owner"]):
                say(f"the cluster of {info.get('root')} outlived its owner (pid {info['owner']}): stopping it")
                Cluster(Path(info["root"])).down()
            elif time.monotonic() > deadline:
                os.close(fd)
                raise ClusterError(
                    f"{LOCK_DIR / 'lock'} held for {wait_s:.0f} s: a cluster runs ({info}); "
                    "`python -m flowstat_lab.slurm down` stops it"
                )
            time.sleep(0.5)

    def _spawn(self, argv: list[str], log: Path, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(self.conf), "LANG": "C.UTF-8"}
        with open(log, "ab") as out:
            return subprocess.Popen(
                [*self.client_prefix(), *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,
                pass_fds=pass_fds,
            )

    def _start_at(self, addr: str, argv: list[str], name: str, log: Path, port: int, deadline: float) -> int:
        """A Slurm daemon in a UTS namespace whose hostname is ADDR (so it binds ADDR), the hostname
        set back to the machine's once it listens on ADDR:PORT."""
        cmd = " ".join(argv)
        proc = self._spawn(["unshare", "--uts", "sh", "-c", f"hostname {addr} && exec {cmd}"], log)
        self.pid_file(*name.split("-", 1)).write_text(str(proc.pid))
        while not _listening(addr, port, proc.pid):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"{name} did not listen on {addr}:{port} (exit code {proc.poll()})\n{_tail(log)}")
            time.sleep(0.02)
        _run(["nsenter", f"--target={proc.pid}", "--uts", "hostname", socket.gethostname()], f"{name}'s hostname back")
        return proc.pid

    def _start(self, timeout_s: float, lock: int, owner: int | None) -> None:
        deadline = time.monotonic() + timeout_s
        self._prepare()
        NAMESPACE.add((CONTROLLER_ADDR, *NODES.values()))
        (self.run_dir / "netns.inode").write_text(str(netns_inode()))
        # the keeper: holds the machine's lock while it lives, in the namespace (down kills it with the rest)
        keeper = self._spawn(["sleep", "infinity"], self.log("keeper"), pass_fds=(lock,))
        self.pid_file("keeper").write_text(str(keeper.pid))
        (LOCK_DIR / "owner.json").write_text(json.dumps({"root": str(self.root), "owner": owner, "keeper": keeper.pid}))
        munged = self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={self.munge_key}",
                f"--pid-file={self.munge_dir / 'munged.pid'}",
                f"--log-file={self.log('munged')}",
                f"--seed-file={self.munge_dir / 'munged.seed'}",
            ],
            self.log("munged"),
        )
        self.pid_file("munged").write_text(str(munged.pid))
        while not self.munge_socket.exists():
            if munged.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"munged did not start (exit code {munged.poll()})\n{_tail(self.log('munged'))}")
            time.sleep(0.02)
        self._start_at(
            CONTROLLER_ADDR, ["slurmctld", "-D", "-c"], "slurmctld", self.log("slurmctld"), CTLD_PORT, deadline
        )
        for name, addr in NODES.items():
            self._start_at(
                addr, ["slurmd", "-D", "-N", name], f"slurmd-{name}", self.log("slurmd", name), SLURMD_PORT, deadline
            )
        self.wait_idle(deadline - time.monotonic())

    def wait_idle(self, timeout_s: float, nodes: list[str] | None = None) -> None:
        """Until sinfo shows NODES (all by default) idle; past the deadline, an error naming each
        node that is not, and the logs' tails."""
        want = nodes or list(NODES)
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.node_states()
            if all(states.get(n) == "idle" for n in want):
                return
            if time.monotonic() > deadline:
                bad = {n: states.get(n, "not reported") for n in want if states.get(n) != "idle"}
                pids = self.daemon_pids()
                dead = [d for d in ("munged", "slurmctld", *(f"slurmd-{n}" for n in NODES)) if d not in pids]
                logs = [self.log("slurmctld"), *(self.log("slurmd", n) for n in bad if n in NODES)]
                raise ClusterError(
                    f"not idle after {timeout_s:.0f} s: {bad}; daemons not running: {dead or 'none'}\n"
                    + "\n".join(_tail(p) for p in logs)
                )
            time.sleep(0.1)

    def log_tails(self, lines: int = 30) -> str:
        """The last LINES timestamped lines of each daemon's log, this cluster's and the one before
        (what a failed test shows: a test that restarts the cluster would have wiped them)."""
        parts = []
        for d in (self.root / "log.previous", self.log_dir):
            for log in sorted(d.glob("slurm*.log")) if d.exists() else []:
                stamped = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("[")]
                parts.append(f"--- {log} (last {lines} lines)\n" + "\n".join(stamped[-lines:]))
        return "\n".join(parts)

    def node_state(self, node: str) -> str:
        """scontrol's State= of a node (e.g. IDLE, DOWN+NOT_RESPONDING)."""
        out = self.client("scontrol", "-o", "show", "node", node, timeout=15)
        for word in out.stdout.split():
            if word.startswith("State="):
                return word.split("=", 1)[1]
        return ""

    # down
    def down(self, timeout_s: float = 15.0) -> None:
        """scancel everything, SIGTERM the slurmds and slurmctld by pid (SIGKILL past the deadline),
        then munged, then kill whatever still runs in the namespace (a killed slurmd's steps and
        tasks), then delete the namespace. Idempotent."""
        pids = self.daemon_pids()
        if "slurmctld" in pids and netns_exists():
            try:
                jobs = self.client("squeue", "-h", "-o", "%A", timeout=10).stdout.split()
                if jobs:
                    self.client("scancel", *jobs, timeout=10)
                    # until they have completed: a slurmd or slurmctld stopped while its jobs complete
                    # takes the whole SIGTERM deadline (15 s measured), then 0.1 s
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline and self.client("squeue", "-h", timeout=10).stdout.strip():
                        time.sleep(0.05)
            except subprocess.TimeoutExpired:
                pass
        slurm = [p for name, p in pids.items() if name.startswith(("slurmd", "slurmctld"))]
        _stop(slurm, timeout_s)
        _stop([p for name, p in pids.items() if name == "munged"], timeout_s)
        # what outlives its daemon, and the keeper: everything in the namespace (found by the inode
        # it had at up, should its name be gone already)
        inode = netns_inode() or _read_pid(self.run_dir / "netns.inode")
        for _ in range(50):
            left = netns_pids(inode)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _wait_gone(left, 5.0)
        else:
            raise ClusterError(f"processes left in {NETNS}: {netns_pids(inode)}")
        for f in [*self.run_dir.glob("*.pid"), self.run_dir / "netns.inode"] if self.run_dir.exists() else []:
            f.unlink(missing_ok=True)
        self.munge_socket.unlink(missing_ok=True)
        NAMESPACE.delete()
        if self._owner_root() == self.root:
            (LOCK_DIR / "owner.json").unlink(missing_ok=True)


def _wait_gone(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _stop(pids: list[int], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL past the deadline."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if _wait_gone(pids, timeout_s):
            return


def main(argv: list[str]) -> int:
    cluster = Cluster()
    cmd = argv[0] if argv else ""
    try:
        if cmd == "up":
            t0 = time.monotonic()
            cluster.up()
            say(
                f"up in {time.monotonic() - t0:.1f} s: {cluster.node_states()}; clients: SLURM_CONF={cluster.conf} "
                f"{' '.join(cluster.client_prefix())} sinfo"
            )
        elif cmd == "down":
            t0 = time.monotonic()
            cluster.down()
            say(f"down in {time.monotonic() - t0:.1f} s")
        elif cmd == "status":
            states = cluster.node_states() if cluster.running() else {}
            print(json.dumps({"running": cluster.running(), "daemons": cluster.daemon_pids(), "nodes": states}))
            return 0 if states else 1
        elif cmd == "run":
            rest = argv[1:]
            if rest[:1] == ["--"]:
                rest = rest[1:]
            if not rest or not cluster.running():
                say("usage: run -- CMD... (with the cluster up)")
                return 2
            return subprocess.run(
                [*cluster.client_prefix(), *rest], env={**os.environ, **cluster.client_env()}
            ).returncode
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except ClusterError as exc:
        say(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
