"""Where the test suite's CPU goes: every process the suite starts, by command and by test.

    python -m flowstat_lab.suite_cpu [--out DIR] -- -n 4 [pytest arguments...]     (as root)

`--durations` gives each test's wall time, which on a CPU-bound suite is mostly the time it waited
for the other workers' processes. This gives the CPU instead: the kernel's process accounting
(acct(2), one record per process that exits, with its CPU time, its parent and its start) is on
while pytest runs with this module as a plugin, which writes when each test starts and ends on each worker.
A process is charged to the test that was running on the worker it descends from when it started;
what the suite's servers did after they were detached from a worker (the session stack's
Elasticsearch, say) is charged to nobody, by command. Figures in CPU-seconds, from the records'
clock ticks (AHZ: 100 a second).

Also: how busy the cores were each second (/proc/stat; `busy`, by 30 s, and busy.tsv), and the
Python interpreters by what they ran (to the accounting each is "python"): a sitecustomize first on
PYTHONPATH logs each one's argv and CPU as it exits (not one killed, or given a clean environment).

Needs root (acct(2) takes CAP_SYS_PACCT) and a kernel with BSD process accounting; accounting is
switched off whatever happens.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RECORD = struct.Struct("<BBHIIIIIIf8H16s")  # struct acct_v3 (linux/acct.h), 64 bytes
_AHZ = 100  # the records' clock ticks per second
_DIR_VAR = "FLOWSTAT_SUITE_CPU_DIR"  # where the plugin writes each worker's tests


# -- the plugin: loaded into pytest and its workers by `-p flowstat_lab.suite_cpu` ----------------------
_log: Any = None


def _write(doc: dict[str, Any]) -> None:
    global _log
    if _log is None:
        _log = open(Path(os.environ[_DIR_VAR]) / f"tests.{os.getpid()}.jsonl", "a", buffering=1)
    _log.write(json.dumps({"pid": os.getpid(), **doc}) + "\n")


_runs_tests = True  # False in pytest-xdist's controller, which hears of every worker's tests


def pytest_configure(config: Any) -> None:
    global _runs_tests
    # the controller's spans overlap all the workers': charged by them, a worker's process went to
    # whichever test of any worker was running as it started
    _runs_tests = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    if _DIR_VAR in os.environ and _runs_tests:
        _write({"id": nodeid, "start": time.time()})


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    if _DIR_VAR in os.environ and _runs_tests:
        _write({"id": nodeid, "end": time.time()})


# -- the accounting -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    started: int  # Unix s
    cpu_s: float
    command: str


def _comp_t(value: int) -> int:
    """A comp_t: 13 bits of mantissa, 3 of base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def records(path: Path) -> Iterator[Process]:
    data = path.read_bytes()
    for offset in range(0, len(data) - _RECORD.size + 1, _RECORD.size):
        f = _RECORD.unpack_from(data, offset)
        if f[1] != 3:
            raise ValueError(f"{path}: record at {offset}: version {f[1]}, not acct_v3")
        cpu = (_comp_t(f[10]) + _comp_t(f[11])) / _AHZ
        yield Process(f[6], f[7], f[8], cpu, f[18].split(b"\0")[0].decode(errors="replace"))


def _accounting(path: Path | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(path).encode() if path else None) != 0:
        err = ctypes.get_errno()
        raise SystemExit(f"suite_cpu: acct({path}): {os.strerror(err)} (needs root and BSD process accounting)")


def _test_intervals(folder: Path) -> dict[int, list[tuple[float, float, str]]]:
    """Each worker's tests: worker pid -> [(start, end, nodeid)] in order."""
    out: dict[int, list[tuple[float, float, str]]] = {}
    for f in folder.glob("tests.*.jsonl"):
        started: dict[str, float] = {}
        spans = []
        for line in f.read_text().splitlines():
            doc = json.loads(line)
            if "start" in doc:
                started[doc["id"]] = doc["start"]
            else:
                spans.append((started.pop(doc["id"], doc["end"]), doc["end"], doc["id"]))
        if spans:
            out[int(f.name.split(".")[1])] = sorted(spans)
    return out


def attribute(processes: list[Process], workers: dict[int, list[tuple[float, float, str]]]) -> dict:
    """CPU-seconds by test, by test module (and command within it), and what no test owns by command."""
    by_pid: dict[int, list[Process]] = collections.defaultdict(list)
    for p in processes:
        by_pid[p.pid].append(p)

    def worker_of(p: Process) -> int | None:
        parent, hops = p.ppid, 0
        while parent and hops < 64:
            if parent in workers:
                return parent
            before = [q for q in by_pid.get(parent, ()) if q.started <= p.started + 1]
            if not before:
                return None
            parent, hops = before[-1].ppid, hops + 1
        return None

    tests: dict[str, float] = collections.defaultdict(float)
    modules: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    nobody: dict[str, float] = collections.defaultdict(float)
    for p in processes:
        worker = None if p.pid in workers else worker_of(p)  # a worker's own CPU is no one test's
        if worker is None:
            nobody[p.command] += p.cpu_s
            continue
        spans = workers[worker]
        running = [i for s, e, i in spans if s - 1 <= p.started <= e] or [i for s, _, i in spans if s >= p.started]
        test = running[0] if running else "(after its last test)"
        tests[test] += p.cpu_s
        modules[test.split("::")[0]][p.command] += p.cpu_s
    return {
        "total_cpu_s": round(sum(p.cpu_s for p in processes), 1),
        "processes": len(processes),
        "by_command": {c: round(s, 1) for c, s in _top(_sum_by_command(processes))},
        "by_module": {
            m: {"cpu_s": round(sum(c.values()), 1), **{k: round(v, 1) for k, v in _top(c, 4)}}
            for m, c in sorted(modules.items(), key=lambda kv: -sum(kv[1].values()))
        },
        "by_test": {t: round(s, 1) for t, s in _top(tests, 40)},
        "no_test": {c: round(s, 1) for c, s in _top(nobody, 12)},
    }


def _sum_by_command(processes: list[Process]) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for p in processes:
        out[p.command] += p.cpu_s
    return out


# -- how busy the cores were ---------------------------------------------------------------------------
def _cpu_times() -> tuple[int, int]:
    """All the cores' clock ticks since boot, and those idle or waiting on I/O (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


def _sample_busy(path: Path, stop: threading.Event) -> None:
    """Each second until ``stop``: seconds since the start and the share of the cores busy, a line each."""
    start, before = time.monotonic(), _cpu_times()
    with open(path, "w", buffering=1) as out:
        while not stop.wait(1.0):
            now = _cpu_times()
            total, idle = now[0] - before[0], now[1] - before[1]
            if total > 0:
                out.write(f"{time.monotonic() - start:.1f}\t{1 - idle / total:.3f}\n")
            before = now


def busy_summary(path: Path, bucket_s: int = 30) -> dict[str, Any]:
    """The busy share over the run, and its mean in each ``bucket_s`` (from the start of each)."""
    rows = [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []
    points = [(float(t), float(b)) for t, b in rows]
    buckets: dict[int, list[float]] = collections.defaultdict(list)
    for t, b in points:
        buckets[int(t // bucket_s) * bucket_s].append(b)
    return {
        "share": round(sum(b for _, b in points) / len(points), 3) if points else None,
        "seconds": len(points),
        f"by_{bucket_s}s": {str(k): round(sum(v) / len(v), 2) for k, v in sorted(buckets.items())},
    }


# -- which Python interpreters -------------------------------------------------------------------------
_PYTHON_LOG = "python"  # the folder each interpreter writes its line to
_SITECUSTOMIZE = """\
import atexit, json, os, resource, sys

def _flowstat_suite_cpu_python():
    folder = os.environ.get("FLOWSTAT_SUITE_CPU_PYTHON")
    if folder:
        r = resource.getrusage(resource.RUSAGE_SELF)
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump({"argv": list(getattr(sys, "orig_argv", sys.argv))[:6], "cpu_s": r.ru_utime + r.ru_stime}, f)

atexit.register(_flowstat_suite_cpu_python)
"""


def _python_hook(folder: Path) -> dict[str, str]:
    """The environment that has every interpreter of the run write its argv and CPU as it exits."""
    hook, log = folder / "python-hook", folder / _PYTHON_LOG
    for d in (hook, log):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "FLOWSTAT_SUITE_CPU_PYTHON": str(log)}


def python_command(argv: list[str]) -> str:
    """What an interpreter ran, by name: the module and its first word (a device's role, a CLI's
    command), or the script (flowstat's with its command)."""
    args = argv[1:]
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):  # the interpreter's options
        args = args[2:] if args[0] in ("-X", "-W") else args[1:]
    if len(args) >= 2 and args[0] == "-m":
        word = args[2] if len(args) > 2 and not args[2].startswith("-") else ""
        return f"-m {args[1]} {word}".rstrip()
    if args and args[0] == "-c":
        return "-c (a program given inline)"
    if args:
        name = Path(args[0]).name
        return f"{name} {args[1]}" if name == "flowstat" and len(args) > 1 else name
    return "(interactive)"


def python_by_command(folder: Path, n: int = 15) -> list[dict[str, Any]]:
    """The interpreters seen, by what they ran: how many, their CPU in all and each on average."""
    count: collections.Counter[str] = collections.Counter()
    cpu: dict[str, float] = collections.defaultdict(float)
    for f in folder.glob("*.json") if folder.exists() else ():
        try:
            doc = json.loads(f.read_text())
        except ValueError:  # cut short as its interpreter was killed mid-write
            continue
        key = python_command(doc["argv"])
        count[key] += 1
        cpu[key] += doc["cpu_s"]
    return [
        {"command": k, "processes": count[k], "cpu_s": round(c, 1), "each_s": round(c / count[k], 2)}
        for k, c in _top(cpu, n)
    ]


def _top(cpu: dict[str, float], n: int = 15) -> list[tuple[str, float]]:
    return sorted(cpu.items(), key=lambda kv: -kv[1])[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m flowstat_lab.suite_cpu",
        description="Run pytest with process accounting on; print where the CPU went (JSON).",
        epilog="Arguments after -- go to pytest. Needs root.",
    )
    ap.add_argument("--out", type=Path, help="folder for the accounting file and the tests' log (default: a temp dir)")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    folder = args.out or Path(tempfile.mkdtemp(prefix="suite-cpu-"))
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("tests.*.jsonl"):  # a previous run's workers: their spans would be read too
        stale.unlink()
    pytest_args = [a for a in args.pytest_args if a != "--"]
    env = {**os.environ, _DIR_VAR: str(folder), **_python_hook(folder)}
    pacct = folder / "pacct"
    pacct.write_bytes(b"")
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_busy, args=(folder / "busy.tsv", stop), daemon=True)
    _accounting(pacct)
    sampler.start()
    try:
        rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "flowstat_lab.suite_cpu", *pytest_args], env=env)
    finally:
        _accounting(None)
        stop.set()
        sampler.join()
    report = attribute(list(records(pacct)), _test_intervals(folder))
    report["busy"] = busy_summary(folder / "busy.tsv")
    report["python_by_command"] = python_by_command(folder / _PYTHON_LOG)
    (folder / "suite-cpu.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    print(f"suite_cpu: {folder / 'suite-cpu.json'}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
