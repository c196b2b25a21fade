"""The C agent on a farm (beside tests/test_agent_targets.py, tests/test_endpoints_trust.py and
tests/test_agent_reload.py, which hold both agents to the same behaviour): past its open files
limit it says so and samples what it could open; a process that leaves the top N and is ranked back
goes on with its seq; a systemd unit is found as its cgroup; the endpoints directory's loopback
check takes no name that only starts like one; and --help names the options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flowstat.agent.selection import cgroup2_root
from support.agents import wait_until
from support.cgroups import HOLDER, start_in
from support.common import C_AGENT, C_ASAN, PYTHON_AGENT, needs


def samples(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def sanitized(stderr: str) -> None:
    assert "AddressSanitizer" not in stderr and "runtime error" not in stderr, stderr[-3000:]


@pytest.mark.parametrize("which", ["c", "py"])
def test_past_the_open_files_limit_it_says_so_and_samples_what_it_could_open(tmp_path, which):
    """50 processes, 64 open files: the agent watches those it can (2 files each, a reserve kept
    for its sinks and searches), says at each rescan how many it left out and why, and samples the
    others every round; it never crashes or spins. Both agents (the C one under ASan)."""
    if which == "c" and not C_ASAN.exists():
        pytest.skip("run `make c-agent-tests` (make test does)")
    agent = [str(C_ASAN)] if which == "c" else PYTHON_AGENT
    duration = f"299.{uuid.uuid4().int % 10**9:09d}"  # these sleeps' own command line
    sleepers = [subprocess.Popen(["sleep", duration]) for _ in range(50)]
    out_path = tmp_path / "samples.json"
    try:
        out = subprocess.run(
            ["prlimit", "--nofile=64", *agent, "--pattern", f"^sleep {duration}$", "--interval", "0.05"]
            + ["--rescan", "0.25", "--count", "30", "--self-interval", "0", "--stats", str(tmp_path / "stats.json")]
            + ["--sink", f"file://{out_path}?format=json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    sanitized(out.stderr)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in out.stderr.splitlines() if "cannot watch more processes" in line]
    assert said and all("open files limit (64, RLIMIT_NOFILE)" in line and "LimitNOFILE" in line for line in said)
    assert len(said) <= 10, "once a rescan, not once a process or a round"
    watched = int(said[-1].split(" watched")[0].rsplit(" ", 1)[1])
    left_out = int(said[-1].split(" left out")[0].rsplit(" ", 1)[1])
    assert watched + left_out == 50 and 10 <= watched < 50, said[-1]
    got = samples(out_path)
    by_pid: dict[int, list[dict]] = {}
    for d in got:
        by_pid.setdefault(d["pid"], []).append(d)
    assert len(by_pid) == watched and set(by_pid) <= {p.pid for p in sleepers}
    assert all(d["node_state"] == "UP" for d in got)
    assert all(len(v) == 30 for v in by_pid.values()), "each one watched sampled at every round"
    assert json.loads((tmp_path / "stats.json").read_text())["targets"] == watched


@needs(C_ASAN)
def test_a_process_ranked_back_into_the_top_goes_on_with_its_seq(tmp_path, cgroup):
    """--top 1 by rss: A, then B heavier (A LEFT_TOP once, not gone), then A heavier again: A is
    watched again, its seq going on after its LEFT_TOP sample; nothing is reported DOWN."""
    a, b = (
        start_in(
            cgroup, sys.executable, "-c", HOLDER, str(mb), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for mb in (60, 20)
    )
    out_path = tmp_path / "samples.json"
    where = str(cgroup.relative_to(cgroup2_root()))
    with open(tmp_path / "agent.log", "w") as log:
        agent = subprocess.Popen(
            [str(C_ASAN), "--cgroup", where, "--top", "1", "--top-by", "rss", "--interval", "0.05"]
            + ["--rescan", "0.2", "--self-interval", "0", "--sink", f"file://{out_path}?format=json"],
            stderr=log,
        )

    def grow(holder: subprocess.Popen, mb: int) -> None:
        holder.stdin.write(f"{mb}\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "held\n"

    def states(pid: int) -> list[str]:
        return [d["node_state"] for d in samples(out_path) if d["pid"] == pid]

    try:
        wait_until(lambda: len(states(a.pid)) >= 3, "A sampled", timeout=30)
        grow(b, 100)  # B 120 MB, A 60
        wait_until(lambda: "LEFT_TOP" in states(a.pid) and states(b.pid), "A left, B taken", timeout=30)
        grow(a, 120)  # A 180 MB, B 120
        wait_until(lambda: "LEFT_TOP" in states(b.pid), "B left", timeout=30)
        wait_until(lambda: states(a.pid)[-1:] == ["UP"] and states(a.pid).count("UP") > 5, "A back", timeout=30)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
    sanitized((tmp_path / "agent.log").read_text())
    of_a = [d for d in samples(out_path) if d["pid"] == a.pid]
    assert [d["seq"] for d in of_a] == list(range(len(of_a))), "A's seq goes on across its leaving"
    assert [d["node_state"] for d in of_a].count("LEFT_TOP") == 1
    left = next(d for d in of_a if d["node_state"] == "LEFT_TOP")
    assert set(left) <= {"time", "run_id", "host", "node_id", "role", "agent", "seq", "pid", "node_state"}, left
    assert all(d["node_state"] in ("UP", "LEFT_TOP") for d in samples(out_path))


@needs(C_AGENT)
def test_a_unit_is_the_first_cgroup_of_its_name_breadth_first(tmp_path, cgroup):
    """--unit NAME: the cgroup folder so named nearest the v2 root (a deeper one of the same name is
    not it); its processes and its descendants'; a unit no folder is named for is said once."""
    unit = f"flowstat-farm-{uuid.uuid4().hex[:6]}.service"
    (cgroup / "slice" / unit / "child").mkdir(parents=True)
    (cgroup / "a-deeper" / "x" / unit).mkdir(parents=True)
    inside = start_in(cgroup / "slice" / unit, "sleep", "300")
    below = start_in(cgroup / "slice" / unit / "child", "sleep", "300")
    deeper = start_in(cgroup / "a-deeper" / "x" / unit, "sleep", "300")
    for p, folder in ((inside, unit), (below, "child"), (deeper, unit)):
        wait_until(lambda p=p, f=folder: Path(f"/proc/{p.pid}/cgroup").read_text().rstrip().endswith(f), "joined")
    out = subprocess.run(
        [str(C_AGENT), "--unit", unit, "--unit", "flowstat-farm-none.service", "--test", "--interval", "0.01"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    pids = {int(line.split("pid=")[1].split("i")[0]) for line in out.stdout.splitlines() if "pid=" in line}
    assert pids == {inside.pid, below.pid}, out.stdout
    said = [line for line in out.stderr.splitlines() if "flowstat-farm-none.service" in line]
    assert len(said) == 1 and "no such cgroup" in said[0], out.stderr


@needs(C_AGENT)
def test_the_endpoints_directory_takes_only_loopback_addresses_not_names_that_start_like_them(tmp_path):
    """A control endpoint on 127.x.x.x, localhost or [::1] (or ipc://) is believed; a host name that
    only begins with "127." or "localhost" could be any host's, and is refused (the C agent reads
    the address). Not with --allow-remote-control here: the agent would then ask those names."""
    folder = tmp_path / "endpoints"
    folder.mkdir()
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in range(6)]
    controls = {
        "v4": "tcp://127.0.0.2:9",
        "name": "tcp://localhost:9",
        "v6": "tcp://[::1]:9",
        "ipc": f"ipc://{tmp_path}/none.sock",
        "lookalike": "tcp://127.0.0.1.example.com:9",
        "lookalike2": "tcp://localhost.example.com:9",
    }
    try:
        for (name, control), p in zip(controls.items(), sleepers, strict=True):
            doc = {"nodes": [{"node_id": name, "pid": p.pid, "control": control}]}
            (folder / f"{name}.{p.pid}.json").write_text(json.dumps(doc))

        def sampled(*extra: str) -> tuple[set[str], str]:
            out = subprocess.run(
                [str(C_AGENT), "--endpoints-dir", str(folder), "--test", "--control-timeout", "0.01", *extra],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            return {line.split("node_id=")[1].split(",")[0] for line in out.stdout.splitlines()[1:]}, out.stderr

        nodes, err = sampled()
        assert nodes == {"v4", "name", "v6", "ipc"}, err
        assert err.count("refused") == 2 and "neither ipc:// nor on loopback" in err, err
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


@needs(C_AGENT)
def test_help_names_the_farm_options():
    out = subprocess.run([str(C_AGENT), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for option in ("--user USER", "--cgroup PATH", "--unit NAME", "--top N", "--top-by cpu|rss"):
        assert f"\n  {option} " in out.stdout, option
    assert "\n  --allow-remote-control " in out.stdout and "SIGHUP" in out.stdout


@needs(C_ASAN)
@pytest.mark.parametrize("where", ["file", "flag"])
def test_top_by_takes_only_the_schemas_values(tmp_path, where):
    """top_by's enum (cpu, rss), held by the option: a file's other value is refused naming its place,
    as every config error; so is the flag's."""
    (tmp_path / "agent.toml").write_text('top = 5\n\ntop_by = "mem"\n' if where == "file" else "top = 5\n")
    flags = ["--top-by", "vsz"] if where == "flag" else []
    out = subprocess.run(
        [str(C_ASAN), "--config", "agent.toml", *flags, "--print-config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    sanitized(out.stderr)
    place = "agent.toml:3: top_by: " if where == "file" else ""
    got = "mem" if where == "file" else "vsz"
    assert out.returncode == 2 and not out.stdout, out
    assert out.stderr == f"flowstat-agent: {place}--top-by: expected one of cpu, rss, got '{got}'\n", out.stderr


@needs(C_ASAN)
def test_a_sink_a_reload_removed_keeps_its_counts_in_the_statistics(tmp_path):
    """SIGHUP with one sink fewer: it is stopped, what it held delivered, and its figures are still
    in --stats at exit (a sink kept keeps counting); a value the schema does not allow (top_by) is
    a configuration refused, nothing changed."""
    out = {n: tmp_path / f"{n}.json" for n in ("kept", "removed")}
    url = {n: f"file://{p}?format=json" for n, p in out.items()}
    conf = tmp_path / "agent.toml"
    conf.write_text(f"pid = [{os.getpid()}]\nsink = {json.dumps(list(url.values()))}\ninterval = 0.05\n")
    log = tmp_path / "agent.log"
    with open(log, "w") as err:
        agent = subprocess.Popen(
            [str(C_ASAN), "--config", str(conf), "--self-interval", "0", "--stats", str(tmp_path / "stats.json")],
            stderr=err,
        )
    try:
        wait_until(lambda: len(samples(out["removed"])) >= 3, "samples in both", timeout=30)
        conf.write_text(f"pid = [{os.getpid()}]\nsink = [{json.dumps(url['kept'])}]\ninterval = 0.05\n")
        agent.send_signal(signal.SIGHUP)
        wait_until(lambda: "reload: 1 targets, 1 sinks" in log.read_text(), "the reload", timeout=30)
        conf.write_text(f'pid = [{os.getpid()}]\ntop_by = "mem"\n')
        agent.send_signal(signal.SIGHUP)
        wait_until(lambda: "reload refused" in log.read_text(), "the bad value refused", timeout=30)
        before = len(samples(out["kept"]))
        wait_until(lambda: len(samples(out["kept"])) > before + 2, "samples after the refused reload", timeout=30)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
    text = log.read_text()
    sanitized(text)
    assert f"reload refused, the running configuration kept: {conf}:2: top_by: --top-by: expected one of" in text
    assert "reload: sink " + url["removed"] + " removed" in text
    stats = json.loads((tmp_path / "stats.json").read_text())["sinks"]
    assert {n: stats[url[n]]["delivered"] for n in out} == {n: len(samples(p)) for n, p in out.items()}
    assert len(samples(out["kept"])) > len(samples(out["removed"])) > 0
