"""What the agent watches: processes given by PID, pid file, name pattern, or a harness run's
control endpoints; re-found periodically, so restarted nodes are picked up again."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from flowstat.proc.reader import ProcessGone, ProcReader, ProcReading
from flowstat.schema import endpoints as endpoints_schema
from flowstat.schema.sample import DEFAULT_ROLE

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

    def empty(self) -> bool:
        return not (self.pids or self.pidfiles or self.patterns or self.endpoints_files)


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


def discover(spec: TargetSpec, first: bool = True) -> list[Target]:
    """Targets as the spec describes them now. Problems are logged, never raised.

    Explicit PIDs are looked at only the first time: a PID cannot become another process we
    were asked for, and re-reading 1,000 comm files every rescan is not free.
    """
    found: dict[tuple[int, str], Target] = {}

    def add(t: Target) -> None:
        found.setdefault(t.key, t)

    for pid in spec.pids if first else ():
        if not Path(f"/proc/{pid}").exists():
            log.warning("--pid %d: no such process", pid)
            continue
        add(Target(pid, f"{process_name(pid)}-{pid}", run_id=spec.run_id, source=f"--pid {pid}"))
    for path in spec.pidfiles:
        try:
            pid = int(Path(path).read_text().split()[0])
            add(Target(pid, f"{process_name(pid)}-{pid}", run_id=spec.run_id, source=f"--pidfile {path}"))
        except (OSError, ValueError, IndexError) as exc:
            log.warning("pid file %s: %s", path, exc)
    if spec.patterns:
        regexes = [re.compile(p) for p in spec.patterns]
        me = os.getpid()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            cmd = _cmdline(int(entry.name))
            if cmd and any(r.search(cmd) for r in regexes):
                pid = int(entry.name)
                add(Target(pid, f"{process_name(pid)}-{pid}", run_id=spec.run_id, source="--pattern"))
    for path in spec.endpoints_files:
        try:
            run_id, nodes, bad = endpoints_schema.read(path)
        except (OSError, ValueError) as exc:
            log.warning("endpoints file %s: %s", path, exc)
            continue
        for why in bad:
            log.warning("endpoints file %s: left out: %s", path, why)
        for node in nodes:
            add(
                Target(
                    node["pid"],
                    node["node_id"],
                    node.get("role", DEFAULT_ROLE),
                    spec.run_id or run_id,
                    node.get("control"),
                    source=path,
                )
            )
    return list(found.values())


def open_reader(t: Target) -> bool:
    try:
        t.reader = ProcReader(t.pid)
        return True
    except ProcessGone:
        return False
