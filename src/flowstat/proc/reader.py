"""Reading a process's CPU and memory cheaply: files held open and re-read with pread.

/proc/PID/stat gives utime, stime (clock ticks) and the thread count; /proc/PID/statm's second
number is the resident set in pages, which is VmRSS. Fields of stat are counted after the last ')'
(the command name may hold spaces and parentheses). A read failing with ESRCH, or an empty read,
means the process is gone.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

# Re-exported: one notion of "the process has exited" for the whole project.
from .procfs import ProcessGone as ProcessGone

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


class ProcFormatError(ValueError):
    """A /proc file whose content could not be understood (names the file)."""


@dataclass(frozen=True)
class ProcReading:
    utime_ticks: int
    stime_ticks: int
    threads: int
    rss_kb: int


def parse_stat(text: bytes, where: str = "stat") -> tuple[int, int, int]:
    """(utime, stime, num_threads) from the content of /proc/PID/stat.

    Raises ProcessGone for a zombie (state Z or X): it has exited, only its entry is left.
    """
    close = text.rfind(b")")
    if close < 0:
        raise ProcFormatError(f"{where}: no ')' after the command name")
    rest = text[close + 1 :].split()
    # rest[0] is field 3 (state): utime is field 14, stime 15, num_threads 20.
    if len(rest) < 18:
        raise ProcFormatError(f"{where}: {len(rest) + 2} fields, expected at least 20")
    if rest[0] in (b"Z", b"X"):
        raise ProcessGone(f"{where}: the process has exited (state {rest[0].decode()})")
    try:
        return int(rest[11]), int(rest[12]), int(rest[17])
    except ValueError as exc:
        raise ProcFormatError(f"{where}: non-numeric CPU or thread field") from exc


def parse_statm(text: bytes, where: str = "statm") -> int:
    """Resident set size in kB from the content of /proc/PID/statm."""
    parts = text.split()
    if len(parts) < 2:
        raise ProcFormatError(f"{where}: {len(parts)} fields, expected at least 2")
    try:
        return int(parts[1]) * PAGE_KB
    except ValueError as exc:
        raise ProcFormatError(f"{where}: non-numeric resident pages") from exc


class ProcReader:
    """Keeps /proc/PID/stat and /proc/PID/statm open; each read() is two preads."""

    def __init__(self, pid: int):
        self.pid = pid
        self._stat = self._statm = -1
        try:
            self._stat = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            self._statm = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            self.close()
            raise ProcessGone(f"process {pid} does not exist") from exc

    def _pread(self, fd: int, name: str) -> bytes:
        try:
            data = os.pread(fd, 4096, 0)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                raise ProcessGone(f"process {self.pid} is gone") from exc
            raise
        if not data:
            raise ProcessGone(f"process {self.pid} is gone ({name} read empty)")
        return data

    def read(self) -> ProcReading:
        utime, stime, threads = parse_stat(self._pread(self._stat, "stat"), f"/proc/{self.pid}/stat")
        rss = parse_statm(self._pread(self._statm, "statm"), f"/proc/{self.pid}/statm")
        return ProcReading(utime, stime, threads, rss)

    def close(self) -> None:
        for fd in (self._stat, self._statm):
            if fd >= 0:
                os.close(fd)
        self._stat = self._statm = -1


def cpu_seconds(ticks: int) -> float:
    """CPU time in seconds from clock ticks (utime, stime): the same double the C agent writes."""
    return ticks / CLK_TCK


def cpu_rates(prev: ProcReading, cur: ProcReading, elapsed_s: float) -> tuple[float, float, float]:
    """(total, user, system) in thesis Hz: CPU seconds per wall second x 10^6."""
    if elapsed_s <= 0:
        return 0.0, 0.0, 0.0
    scale = 1e6 / (CLK_TCK * elapsed_s)
    user = max(0, cur.utime_ticks - prev.utime_ticks) * scale
    system = max(0, cur.stime_ticks - prev.stime_ticks) * scale
    return round(user + system, 1), round(user, 1), round(system, 1)
