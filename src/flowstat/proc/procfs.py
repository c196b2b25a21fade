"""Reading a process's memory and CPU from /proc, and pinning it to CPUs.

/proc/PID/status is parsed by key, never by line number: the set and order of its lines
changes between kernels.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import threading


class ProcessGone(Exception):
    """The process no longer exists (its /proc entry vanished)."""


def status_fields(pid: int | str = "self") -> dict[str, str]:
    """All ``Key: value`` pairs of /proc/PID/status, values stripped."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(f"/proc/{pid}/status: process {pid} is gone") from exc
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields


def vmrss_kb(pid: int | str = "self") -> int:
    """Resident set size in kB, from the VmRSS line of /proc/PID/status.

    Kernel threads and zombies have no VmRSS line: they hold no user memory, so 0.
    """
    value = status_fields(pid).get("VmRSS")
    if value is None:
        return 0
    number, _, unit = value.partition(" ")
    if unit.strip() not in ("kB", ""):
        raise ValueError(f"/proc/{pid}/status: unexpected VmRSS unit in {value!r}")
    return int(number)


def is_alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def write_pid_file(path: Path, pid: int) -> None:
    """PID and its start (clock ticks after boot): the pair names one process for the life of the
    machine, where a pid alone is reused once pids wrap (32768 here; a suite starts more)."""
    path.write_text(f"{pid} {start_ticks(pid)}\n")


def pid_file_process(path: Path) -> int | None:
    """The pid a file of write_pid_file names while that very process runs; None once it has ended,
    also when a later process has taken its pid (a stale file must never have a stranger signalled).
    A file of the pid alone (flowstat before this) is taken at its word."""
    try:
        words = path.read_text().split()
        pid = int(words[0])
        ticks = int(words[1]) if len(words) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    if not is_alive(pid):
        return None
    try:
        return pid if ticks is None or start_ticks(pid) == ticks else None
    except ProcessGone:
        return None


def catches(pid: int, signum: int) -> bool:
    """The process has a handler for ``signum`` (SigCgt of /proc/PID/status): sending it will not
    kill a process that has not installed its handler yet. False when the process is gone."""
    try:
        caught = int(status_fields(pid).get("SigCgt", "0"), 16)
    except (ProcessGone, ValueError):
        return False
    return bool(caught >> (signum - 1) & 1)


def start_ticks(pid: int) -> int:
    """When the process started, in clock ticks after boot (/proc/PID/stat's field 22, starttime)."""
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError) as exc:
        raise ProcessGone(f"/proc/{pid}/stat: process {pid} is gone") from exc


def start_time(pid: int) -> float:
    """When the process started, in seconds since the epoch, to 10 ms: its start ticks against
    /proc/uptime (/proc/stat's boot time is rounded to the second)."""
    ticks = start_ticks(pid)
    uptime = float(open("/proc/uptime").read().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def log_tail(path: str | os.PathLike[str], lines: int = 15) -> str:
    """The last lines of a log file, for error messages that say what went wrong."""
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def raise_fd_limit() -> int:
    """Raise the soft open-files limit to the hard limit; return the new soft limit.

    A process hosting hundreds of ZeroMQ sockets needs several descriptors per socket.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def die_with_parent(signum: int, parent: int | None = None) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent dies (no orphans). False when
    ``parent`` (the pid that started us) is gone already: it died before the request was made, so
    no signal will ever come, and the caller should stop by itself.

    The request is a no-op where prctl is unavailable.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return parent is None or os.getppid() == parent


def set_from_signal(event: threading.Event) -> None:
    """Set a threading.Event from a signal handler. Event.set takes a lock the interrupted thread
    may be holding (inside Event.wait), which would deadlock: a thread of its own sets it."""
    import threading

    threading.Thread(target=event.set, name="signal", daemon=True).start()


def cpu_seconds(pid: int) -> float:
    """CPU time of all the process's threads, in ns resolution (schedstat), not 10 ms ticks."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError as exc:
        raise ProcessGone(f"/proc/{pid}/task: process {pid} is gone") from exc
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended between listing and reading
    return total / 1e9


def descendants(pid: int) -> list[int]:
    """The process's children, theirs, and so on (from /proc/PID/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in task.read_text().split()]
            except (OSError, ValueError):
                continue  # it ended meanwhile
            found += kids
            todo += kids
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and its living descendants (a server started through runuser)."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            total += cpu_seconds(p)
        except ProcessGone:
            pass
    return total


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPU numbers as the kernel writes them in Cpus_allowed_list: ascending ranges, "0-1,3"."""
    out: list[tuple[int, int]] = []  # (first, last) of each range
    for c in sorted(cpus):
        if out and out[-1][1] == c - 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in out)


def pin_threads(pid: int, cpus: Collection[int]) -> set[int]:
    """Restrict every thread of process ``pid`` to ``cpus``; return the process's affinity as the
    kernel then reports it.

    Affinity belongs to each thread, and a thread inherits its creator's when it is created, so
    setting the threads that exist is enough once none appears unset: the listing is repeated
    until it shows no thread not yet set (one created while the others were being set would
    otherwise keep the old affinity). Raises ProcessLookupError when the process is gone, OSError
    (EINVAL) when the kernel allows none of ``cpus`` (offline, or outside the cpuset)."""
    done: set[int] = set()
    while True:
        try:
            tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
        except FileNotFoundError:
            raise ProcessLookupError(pid) from None
        new = tids - done
        if not new:
            return os.sched_getaffinity(pid)
        for tid in sorted(new):
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                if tid == pid:
                    raise
                # a thread that ended between the listing and now
        done |= new
