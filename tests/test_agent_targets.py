"""Targets as a farm chooses them, both agents: every process of a cgroup (v2, with its
descendants) or of a user, and the N heaviest of them, by CPU or by resident memory, re-ranked at
each rescan: a process that leaves the top-N is reported LEFT_TOP once (not DOWN: it still runs).
The processes' CPU and memory are set by the test (busy loops, buffers of known sizes)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flowstat.agent.selection import cgroup2_root
from support.agents import wait_until
from support.cgroups import HOLDER, start_in


def one_round(agent: list[str], *args: str) -> dict[int, dict]:
    out = subprocess.run([*agent, *args, "--test"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = {}
    for line in out.stdout.splitlines()[1:]:
        if line.startswith("flowstat_node,"):
            pid = int(line.split("pid=")[1].split("i")[0])
            found[pid] = {"line": line}
    return found


def test_every_process_of_a_cgroup_and_of_its_descendants(agent_command, cgroup):
    (cgroup / "child").mkdir()
    inside = start_in(cgroup, "sleep", "300")
    below = start_in(cgroup / "child", "sleep", "300")
    outside = subprocess.Popen(["sleep", "300"])
    try:
        wait_until(lambda: len((cgroup / "cgroup.procs").read_text().split()) == 1, "joined", timeout=10)
        wait_until(lambda: len((cgroup / "child" / "cgroup.procs").read_text().split()) == 1, "joined", timeout=10)
        relative = str(cgroup.relative_to(cgroup2_root()))
        assert set(one_round(agent_command, "--cgroup", relative)) == {inside.pid, below.pid}
        assert set(one_round(agent_command, "--cgroup", str(cgroup / "child"))) == {below.pid}
    finally:
        outside.kill()
        outside.wait()


def test_every_process_of_a_user(agent_command):
    if os.geteuid() != 0:
        pytest.skip("needs root: processes of another user")
    uid = str(random.randrange(50_000, 60_000))  # one no other process has
    theirs = [
        subprocess.Popen(["setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "sleep", "300"])
        for _ in range(2)
    ]
    mine = subprocess.Popen(["sleep", "300"])
    try:
        wait_until(lambda: all(os.stat(f"/proc/{p.pid}").st_uid == int(uid) for p in theirs), "setpriv", timeout=10)
        assert set(one_round(agent_command, "--user", uid)) == {p.pid for p in theirs}
    finally:
        for p in (*theirs, mine):
            p.kill()
            p.wait()


def test_the_heaviest_by_cpu_and_by_memory(agent_command, cgroup):
    busy = start_in(cgroup, sys.executable, "-c", "while True: pass")
    holders = {
        mb: start_in(cgroup, sys.executable, "-c", HOLDER, str(mb), stdin=subprocess.PIPE) for mb in (30, 90, 150)
    }
    try:
        wait_until(lambda: len((cgroup / "cgroup.procs").read_text().split()) == 4, "joined", timeout=10)
        wait_until(lambda: all(_rss_mb(p.pid) >= mb for mb, p in holders.items()), "memory held", timeout=30)
        # A process first seen is ranked by its CPU rate since it started: a holder that has just
        # filled its buffer can outrank a busy loop starved by a loaded machine until it has idled.
        wait_until(
            lambda: _cpu_rate(busy.pid) > 2 * max(_cpu_rate(p.pid) for p in holders.values()),
            "the busy loop the busiest since it started",
            timeout=60,
        )
        where = str(cgroup.relative_to(cgroup2_root()))
        assert set(one_round(agent_command, "--cgroup", where, "--top", "1", "--top-by", "cpu")) == {busy.pid}
        assert set(one_round(agent_command, "--cgroup", where, "--top", "2", "--top-by", "rss")) == {
            holders[90].pid,
            holders[150].pid,
        }
    finally:
        busy.kill()


def test_a_process_that_leaves_the_top_n_is_reported_left_top_once(agent_command, cgroup, tmp_path):
    holders = {
        mb: start_in(
            cgroup, sys.executable, "-c", HOLDER, str(mb), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for mb in (30, 90, 150)
    }
    wait_until(lambda: all(_rss_mb(p.pid) >= mb for mb, p in holders.items()), "memory held", timeout=30)
    samples = tmp_path / "samples.json"
    where = str(cgroup.relative_to(cgroup2_root()))
    proc = subprocess.Popen(
        [*agent_command, "--cgroup", where, "--top", "2", "--top-by", "rss", "--interval", "0.05", "--rescan", "0.2"]
        + ["--self-interval", "0", "--sink", f"file://{samples}?format=json"],
        stderr=subprocess.DEVNULL,
    )
    try:
        states = lambda: [json.loads(x) for x in samples.read_text().splitlines()] if samples.exists() else []  # noqa: E731
        wait_until(
            lambda: {d["pid"] for d in states()} == {holders[90].pid, holders[150].pid}, "the top two", timeout=30
        )
        holders[30].stdin.write("200\n")  # now the heaviest: the 90 MB one leaves the top two
        holders[30].stdin.flush()
        assert holders[30].stdout.readline() == "held\n"
        left = holders[90].pid
        wait_until(
            lambda: any(d["pid"] == left and d["node_state"] == "LEFT_TOP" for d in states()), "LEFT_TOP", timeout=30
        )
        wait_until(lambda: any(d["pid"] == holders[30].pid for d in states()), "the new heaviest sampled", timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    of_left = [d for d in states() if d["pid"] == left]
    assert [d["node_state"] for d in of_left].count("LEFT_TOP") == 1 and of_left[-1]["node_state"] == "LEFT_TOP"
    assert all(d["node_state"] != "DOWN" for d in states() if d["pid"] != holders[30].pid)


def _cpu_rate(pid: int) -> float:
    """The CPU a process has used since it started, per second of its age (as --top-by cpu ranks
    a process seen first)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks, start = int(fields[11]) + int(fields[12]), int(fields[19])
    uptime_ticks = float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK")
    return ticks / max(uptime_ticks - start, 1)


def _rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
