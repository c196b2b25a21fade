"""Processes as a farm chooses them: every process of a cgroup or a systemd unit, of a user, and the
N heaviest (by CPU or resident memory) of those, re-ranked at each rescan.

cgroups are read from the cgroup v2 hierarchy wherever it is mounted (/sys/fs/cgroup, or
/sys/fs/cgroup/unified on a hybrid host): a cgroup's processes are those of its cgroup.procs and of
its descendants'. A systemd unit is the cgroup directory of its name (system.slice/NAME, or deeper
under user.slice). The C agent reads the same files the same way (collectors/c/agent/targets.c).
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass, field
from pathlib import Path

TOP_BY = ("cpu", "rss")
UNIT_DEPTH = 4  # how deep under the hierarchy's root a unit's cgroup is looked for


def cgroup2_root(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, or None."""
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def cgroup_dir(name: str, root: Path | None) -> Path | None:
    """A cgroup given as an absolute path, or relative to the v2 root."""
    if name.startswith("/sys/"):
        return Path(name)
    return None if root is None else root / name.lstrip("/")


def unit_dir(unit: str, root: Path | None) -> Path | None:
    """The cgroup of a systemd unit: the first directory named so, breadth first."""
    if root is None:
        return None
    level = [root]
    for _ in range(UNIT_DEPTH):
        below = []
        for folder in level:
            try:
                entries = [e for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for e in sorted(entries, key=lambda e: e.name):
                if e.name == unit:
                    return Path(e.path)
                below.append(Path(e.path))
        level = below
    return None


def cgroup_pids(folder: Path) -> set[int]:
    """The processes of a cgroup and of its descendants (OSError: it cannot be read)."""
    pids: set[int] = set()
    for here, _dirs, files in os.walk(folder, onerror=_raise):
        if "cgroup.procs" in files:
            try:
                pids.update(int(x) for x in Path(here, "cgroup.procs").read_text().split())
            except FileNotFoundError:  # removed between the listing and the read
                continue
    return pids


def _raise(exc: OSError) -> None:
    raise exc


def user_uid(user: str) -> int:
    """A user's uid, by name or number (KeyError: no such user)."""
    if user.isdigit():
        return int(user)
    return pwd.getpwnam(user).pw_uid


def process_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def all_pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


@dataclass
class Ranker:
    """The N heaviest of some processes: by CPU (the rate since the last ranking; a process seen
    first, since it started) or by resident memory. Kernel threads (no memory) are left out."""

    by: str = "cpu"
    last: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # pid: (start, ticks, at)
    ticks_per_s: int = field(default_factory=lambda: os.sysconf("SC_CLK_TCK"))
    page_kb: int = field(default_factory=lambda: os.sysconf("SC_PAGE_SIZE") // 1024)

    def top(self, pids: list[int], n: int) -> list[int]:
        now, boot = time.monotonic(), _boot_ticks()
        weights: dict[int, float] = {}
        seen = {}
        for pid in pids:
            stat = _stat_fields(pid)
            if stat is None or stat[3] == 0:  # gone, or a kernel thread
                continue
            start, ticks, rss_pages = stat[0], stat[1] + stat[2], stat[3]
            seen[pid] = (start, ticks, now)
            if self.by == "rss":
                weights[pid] = rss_pages * self.page_kb
                continue
            before = self.last.get(pid)
            if before is not None and before[0] == start and now > before[2]:
                weights[pid] = (ticks - before[1]) / (now - before[2])
            else:  # first seen (or a new process with a reused pid): its rate since it started
                age = max(boot - start, 1) / self.ticks_per_s
                weights[pid] = ticks / age
        self.last = seen
        return sorted(weights, key=lambda p: (-weights[p], p))[:n]


def _stat_fields(pid: int) -> tuple[int, int, int, int] | None:
    """(starttime, utime, stime, rss pages) of /proc/PID/stat, read after the command's ')'."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:  # fields[0] is the state (field 3): utime is field 14, stime 15, starttime 22, rss 24
        return int(fields[19]), int(fields[11]), int(fields[12]), int(fields[21])
    except (IndexError, ValueError):
        return None


def _boot_ticks() -> int:
    """Clock ticks since boot (the unit of a process's starttime)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))
