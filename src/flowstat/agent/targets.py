"""What the agent watches: processes given by PID, pid file, name pattern, a harness run's control
endpoints, or the endpoint files nodes announce themselves with in a directory (flowstat.node);
re-found periodically, so restarted and late nodes are picked up."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from flowstat.node import curve
from flowstat.proc.machine import host_identity
from flowstat.proc.reader import ProcessGone, ProcReader, ProcReading
from flowstat.schema import endpoints as endpoints_schema
from flowstat.schema.sample import DEFAULT_ROLE

from . import selection

log = logging.getLogger("flowstat.agent")


@dataclass
class Target:
    pid: int
    node_id: str
    role: str = DEFAULT_ROLE
    run_id: str = ""
    control: str | None = None
    reader: ProcReader | None = None  # open while the agent watches the process (open_reader)
    prev: ProcReading | None = None  # its last reading, taken at prev_t (monotonic)
    prev_t: float = 0.0
    source: str = ""
    announced_by: Path | None = None  # the endpoint file of a directory that named it (gone: a clean stop)
    curve_server_key: str | None = None  # its control channel takes CURVE clients only (flowstat.node.curve)
    curve_client_key: Path | None = None  # the client key to ask it with

    @property
    def key(self) -> tuple[int, str]:
        return (self.pid, self.node_id)

    def read(self) -> ProcReading:
        """A reading of the watched process (ProcessGone, ProcFormatError, OSError as ProcReader.read)."""
        if self.reader is None:
            raise RuntimeError(f"{self.node_id} (pid {self.pid}): not watched, no reader is open")
        return self.reader.read()

    def close(self) -> None:
        """Close the reader, if one is open."""
        if self.reader is not None:
            self.reader.close()


@dataclass
class TargetSpec:
    pids: list[int] = field(default_factory=list)
    pidfiles: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    endpoints_files: list[str] = field(default_factory=list)
    run_id: str = ""
    endpoints_dirs: list[str] = field(default_factory=list)
    host: str = ""  # whose nodes endpoints files give this agent (proc.machine.host_identity)
    curve_client_key: str = ""  # --curve-client-key; else the run's, beside each endpoints file
    users: list[str] = field(default_factory=list)  # --user: every process of these users (names or uids)
    cgroups: list[str] = field(default_factory=list)  # --cgroup: every process of these cgroups (v2)
    units: list[str] = field(default_factory=list)  # --unit: every process of these systemd units
    top: int = 0  # --top N: only the N heaviest of the processes chosen (all of them, without a chooser)
    top_by: str = "cpu"  # --top-by: cpu or rss
    allow_remote_control: bool = False  # --allow-remote-control: endpoints_dir files of other hosts' endpoints

    def empty(self) -> bool:
        return not (
            self.pids
            or self.pidfiles
            or self.patterns
            or self.endpoints_files
            or self.endpoints_dirs
            or self.users
            or self.cgroups
            or self.units
            or self.top
        )

    def choosers(self) -> bool:
        """Whether processes are chosen by what they are (pattern, user, cgroup, unit)."""
        return bool(self.patterns or self.users or self.cgroups or self.units)


HIDDEN = (
    "hidden: /proc is mounted with hidepid and this agent may not see other users' processes "
    "(it needs CAP_SYS_PTRACE, or the group of hidepid's gid=: docs/farm.md)"
)


def _hidden(pid: int) -> bool:
    """A process that runs but whose /proc entry this agent cannot see (hidepid)."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return not Path(f"/proc/{pid}").exists()


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() or "proc"
    except OSError:
        return "proc"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def discover(
    spec: TargetSpec,
    first: bool = True,
    said: set[tuple[str, ...]] | None = None,
    ranker: selection.Ranker | None = None,
) -> list[Target]:
    """Targets as the spec describes them now. Problems are logged, never raised; those of files in
    an endpoints directory once per file version (``said`` remembers them across rescans).

    Explicit PIDs are looked at only the first time: a PID cannot become another process we
    were asked for, and re-reading 1,000 comm files every rescan is not free.
    """
    found: dict[tuple[int, str], Target] = {}

    def add(t: Target) -> None:
        found.setdefault(t.key, t)

    for pid in spec.pids if first else ():
        if not Path(f"/proc/{pid}").exists():
            log.warning("--pid %d: %s", pid, HIDDEN if _hidden(pid) else "no such process")
            continue
        add(Target(pid, f"{process_name(pid)}-{pid}", run_id=spec.run_id, source=f"--pid {pid}"))
    for path in spec.pidfiles:
        try:
            pid = int(Path(path).read_text().split()[0])
            add(Target(pid, f"{process_name(pid)}-{pid}", run_id=spec.run_id, source=f"--pidfile {path}"))
        except (OSError, ValueError, IndexError) as exc:
            log.warning("pid file %s: %s", path, exc)
    chosen = _chosen(spec, set() if said is None else said)
    if spec.top:
        ranked = (ranker or selection.Ranker(spec.top_by)).top(sorted(chosen), spec.top)
        chosen = {pid: f"--top {spec.top} by {spec.top_by}" for pid in ranked}
    for pid, source in chosen.items():
        add(Target(pid, f"{process_name(pid)}-{pid}", run_id=spec.run_id, source=source))
    for path in spec.endpoints_files:
        for t in _from_endpoints_file(Path(path), spec.run_id, lambda *msg: log.warning(*msg), spec.host):
            add(_keyed(t, spec, Path(path)))
    for folder in spec.endpoints_dirs:
        for t in _from_endpoints_dir(
            Path(folder), spec.run_id, set() if said is None else said, spec.host, spec.allow_remote_control
        ):
            add(_keyed(t, spec, Path(folder)))
    return list(found.values())


def _from_endpoints_file(path: Path, run_id: str, warn, host: str = "") -> list[Target]:
    """The nodes of an endpoints file that live on this host (a pid names a process of its host)."""
    try:
        file_run_id, nodes, bad = endpoints_schema.read(path)
    except (OSError, ValueError) as exc:
        warn("endpoints file %s: %s", path, exc)
        return []
    for why in bad:
        warn("endpoints file %s: left out: %s", path, why)
    here = host_identity(host)
    nodes = [n for n in nodes if n.get("host", here) == here]
    return [
        Target(
            node["pid"],
            node["node_id"],
            node.get("role", DEFAULT_ROLE),
            run_id or file_run_id,
            node.get("control"),
            source=str(path),
            curve_server_key=node.get("curve_server_key"),
        )
        for node in nodes
    ]


def _chosen(spec: TargetSpec, said: set[tuple[str, ...]]) -> dict[int, str]:
    """The processes the choosers name (pattern, user, cgroup, unit), each with the first that named
    it; with none of them and --top, every process."""
    me = os.getpid()
    chosen: dict[int, str] = {}
    running = selection.all_pids() if spec.patterns or spec.users or (spec.top and not spec.choosers()) else []
    if spec.patterns or (spec.top and not spec.choosers()):
        regexes = [re.compile(p) for p in spec.patterns]
        for pid in running:
            if pid == me:
                continue
            if not regexes:
                chosen[pid] = "--top"
            elif (cmd := _cmdline(pid)) and any(r.search(cmd) for r in regexes):
                chosen.setdefault(pid, "--pattern")
    if spec.users:
        uids = {}
        for user in spec.users:
            try:
                uids[selection.user_uid(user)] = user
            except KeyError:
                _say_once(said, ("user", user), "--user %s: no such user", user)
        for pid in running:
            uid = selection.process_uid(pid)
            if pid != me and uid in uids and _cmdline(pid):  # a kernel thread has no command line
                chosen.setdefault(pid, f"--user {uids[uid]}")
    root = selection.cgroup2_root() if spec.cgroups or spec.units else None
    groups = [("--cgroup", c, selection.cgroup_dir(c, root)) for c in spec.cgroups]
    groups += [("--unit", u, selection.unit_dir(u, root)) for u in spec.units]
    for option, name, folder in groups:
        if folder is None:
            _say_once(said, (option, name), "%s %s: no such cgroup (the v2 hierarchy: %s)", option, name, root)
            continue
        try:
            pids = selection.cgroup_pids(folder)
        except OSError as exc:
            _say_once(said, (option, name, "read"), "%s %s: %s: %s", option, name, folder, exc.strerror or exc)
            continue
        for pid in sorted(pids - {me}):
            chosen.setdefault(pid, f"{option} {name}")
    return chosen


def _keyed(t: Target, spec: TargetSpec, where: Path) -> Target:
    """A secured node's client key: the one given, else its run's (RUN_DIR/keys beside endpoints.json)."""
    if t.curve_server_key:
        t.curve_client_key = Path(spec.curve_client_key) if spec.curve_client_key else curve.default_client_key(where)
    return t


def _from_endpoints_dir(
    folder: Path, run_id: str, said: set[tuple[str, ...]], host: str = "", remote: bool = False
) -> list[Target]:
    """The live nodes of a directory's endpoint files (``*.json``, dot-files being written are not
    read); a file of dead processes only is stale, and left."""
    try:
        entries = sorted(
            (e for e in os.scandir(folder) if e.name.endswith(".json") and not e.name.startswith(".")),
            key=lambda e: e.name,
        )
    except OSError as exc:
        _say_once(said, ("dir", str(folder), type(exc).__name__), "endpoints directory %s: %s", folder, exc)
        return []
    taken = []
    for entry in entries:
        path = Path(entry.path)
        try:
            st = os.stat(path)
            version = (str(path), str(st.st_size), str(st.st_mtime_ns))
        except OSError as exc:  # a dangling link, or gone since the listing
            _say_once(said, (str(path), type(exc).__name__), "endpoints file %s: %s", path, exc)
            continue
        if not entry.is_file():
            _say_once(said, version, "endpoints file %s: not a regular file", path)
            continue
        found = _from_endpoints_file(
            path, run_id, lambda *msg, v=version: _say_once(said, (*v, str(msg[-1])), *msg), host
        )
        alive = [t for t in found if Path(f"/proc/{t.pid}").exists()]
        if found and not alive:
            pids = ", ".join(str(t.pid) for t in found)
            _say_once(said, (*version, "stale"), "endpoints file %s: stale, left (pid %s gone)", path, pids)
        for t in alive:
            why = _untrusted(t, st.st_uid, remote)
            if why:
                _say_once(said, (*version, "refused", str(t.pid)), "endpoints file %s: refused: %s", path, why)
                continue
            t.announced_by = path
            taken.append(t)
    return taken


def _untrusted(t: Target, file_uid: int, remote: bool = False) -> str:
    """Why a node announced in a directory is not believed ("": it is): the directory is shared by
    the host's users, so a file speaks only for a process of its owner, and only of a control
    endpoint on this host (ipc://, or TCP on loopback), where a request cannot be sent elsewhere."""
    try:
        process_uid = os.stat(f"/proc/{t.pid}").st_uid
    except OSError:
        return f"pid {t.pid} is gone"
    if process_uid != file_uid:
        return f"the file's owner (uid {file_uid}) does not own pid {t.pid} (uid {process_uid})"
    control = t.control or ""
    if control and not remote and not (control.startswith("ipc://") or _on_loopback(control)):
        return f"control endpoint {control} is neither ipc:// nor on loopback"
    return ""


def _on_loopback(endpoint: str) -> bool:
    """tcp://HOST:PORT whose HOST is localhost, [::1] or an IPv4 address of 127.0.0.0/8 (a name
    that only begins so, 127.evil.example, is not)."""
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint.removeprefix("tcp://").rpartition(":")[0]
    if host in ("localhost", "[::1]"):
        return True
    try:
        return ipaddress.IPv4Address(host) in ipaddress.IPv4Network("127.0.0.0/8")
    except ValueError:
        return False


def _say_once(said: set[tuple[str, ...]], key: tuple[str, ...], *msg: object) -> None:
    if key not in said:
        said.add(key)
        log.warning(*msg)


def open_reader(t: Target) -> bool:
    try:
        t.reader = ProcReader(t.pid)
        return True
    except ProcessGone:
        return False
    except OSError as exc:  # out of files (the agent keeps room for them: Agent._fd_room), or else
        log.error("%s (pid %d): cannot open its /proc files: %s", t.node_id, t.pid, exc.strerror or exc)
        return False
