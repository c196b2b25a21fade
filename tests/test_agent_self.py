"""Both agents' run-ending notice (SIGUSR1: a node gone after it is STOPPED, before it DOWN) and
their self-samples through a sink that is down, against real processes and a real HTTP receiver.
(The self-samples in the stores: test_sinks_real_servers.py and test_ingest.py; their encoding and
fields across the agents: test_c_agent.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flowstat.proc.procfs import catches
from flowstat.schema import agent as agent_schema
from flowstat.schema import sample as sample_schema
from support.agents import HttpReceiver, sleeper, wait_until
from support.common import ROOT

C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
AGENTS = {"c": [str(C_AGENT)], "py": [sys.executable, "-m", "flowstat.agent"]}


def start(agent: str, log: Path, *args) -> subprocess.Popen:
    if agent == "c" and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    with open(log, "w") as err:  # not --quiet: the agent says when it has taken the notice
        return subprocess.Popen([*AGENTS[agent], *map(str, args)], stdout=subprocess.DEVNULL, stderr=err)


def states(path: Path, pid: int) -> list[str]:
    """The node states of the samples of process ``pid`` the agent wrote so far (whole lines)."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines(keepends=True)
    return [d["node_state"] for d in map(json.loads, (x for x in lines if x.endswith("\n"))) if d.get("pid") == pid]


@pytest.mark.parametrize("agent", ["c", "py"])
def test_a_node_gone_before_the_run_ending_notice_is_down_one_gone_after_it_stopped(agent, tmp_path):
    early, late = sleeper(), sleeper()
    out, log = tmp_path / "s.json", tmp_path / "agent.log"
    proc = start(
        agent,
        log,
        *("--pid", early.pid, "--pid", late.pid, "--interval", 0.05, "--self-interval", 0),
        *("--sink", f"file://{out}?format=json"),
    )
    try:
        wait_until(lambda: states(out, early.pid) and states(out, late.pid), "the first samples")
        # what flowstat run checks before it sends the notice (a process without a handler would die of it)
        assert catches(proc.pid, signal.SIGUSR1) and not catches(early.pid, signal.SIGUSR1)
        early.kill()
        early.wait()
        wait_until(lambda: states(out, early.pid)[-1] != "UP", "the first node's last sample")
        proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: "run-ending notice" in log.read_text(), "the agent to take the notice")
        late.kill()
        late.wait()
        wait_until(lambda: states(out, late.pid)[-1] != "UP", "the second node's last sample")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        for p in (early, late, proc):
            p.kill()
    first, second = states(out, early.pid), states(out, late.pid)
    assert first[-1] == "DOWN" and set(first[:-1]) == {"UP"}  # gone while the run went on: DOWN, once
    assert second[-1] == "STOPPED" and set(second[:-1]) == {"UP"}  # gone after the notice: STOPPED, once
    assert "is gone (stopped with its run)" in log.read_text()


def self_samples(lines: list[str]) -> list[dict]:
    """The self-samples among line protocol lines, as {field: value} with their tags."""
    out = []
    for line in lines:
        if line.startswith(agent_schema.measurement() + ","):
            head, fields, _ = line.split(" ")
            doc = dict(kv.split("=", 1) for kv in head.split(",")[1:])
            doc.update(
                (k, float(v) if "." in v else int(v.rstrip("i")))
                for k, v in (kv.split("=", 1) for kv in fields.split(","))
            )
            out.append(doc)
    return out


@pytest.mark.parametrize("agent", ["c", "py"])
def test_a_sink_that_is_down_shows_in_the_self_samples_the_other_sink_gets(agent, tmp_path):
    """The alert "an agent cannot deliver": while one sink is down its spool grows in the
    self-samples another sink receives, and sinks_down is 1; once it is back both fall to 0, and
    the self-samples it missed reach it from the spool, each once."""
    down, up = HttpReceiver(), HttpReceiver()
    down.stop()
    url = f"http://127.0.0.1:{down.port}/write"
    target = sleeper()
    proc = start(
        agent,
        tmp_path / "agent.log",
        *("--pid", target.pid, "--interval", 0.05, "--self-interval", 0.2, "--sink", url),
        *("--sink", f"http://127.0.0.1:{up.port}/write", "--spool-dir", tmp_path / "spool"),
        "--quiet",
    )
    try:
        wait_until(
            lambda: len([s for s in self_samples(up.lines()) if s["sinks_down"] == 1]) >= 3,
            "three self-samples while the sink is down",
        )
        down.start()  # back on the same port
        wait_until(
            lambda: (s := self_samples(up.lines())) and s[-1]["sinks_down"] == 0 and s[-1]["spooled_samples"] == 0,
            "a self-sample after the sink came back",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        for p in (target, proc):
            p.kill()
        down.stop()
        up.stop()
    seen = self_samples(up.lines())
    while_down = [s for s in seen if s["sinks_down"] == 1]
    spooled = [s["spooled_samples"] for s in while_down]
    assert spooled == sorted(spooled) and spooled[-1] > spooled[0] > 0  # it cannot deliver: the spool grows
    assert while_down[-1]["spooled_batches"] > 0 and while_down[-1]["send_failures"] >= 1
    assert all(s["agent"] == f"flowstat-agent-{agent}" for s in seen)
    back = seen[seen.index(while_down[-1]) + 1 :]
    assert back and back[-1]["sinks_down"] == 0 and back[-1]["spooled_samples"] == 0
    assert [s["seq"] for s in seen] == list(range(len(seen)))
    # the sink that was down got everything too: every self-sample once (those since it came back
    # may come before its spool: test_c_agent_delivery)
    assert sorted(s["seq"] for s in self_samples(down.lines())) == list(range(len(seen)))


@pytest.mark.parametrize("agent", ["c", "py"])
def test_self_samples_have_strictly_increasing_times_even_at_exit(agent, tmp_path):
    """InfluxDB keeps one point per series and time: a self-sample in the millisecond of the one
    before it (the last one, taken at exit, often is) would replace it there."""
    target = sleeper()
    out = tmp_path / "s.json"
    try:
        proc = start(
            agent,
            tmp_path / "log",
            *("--pid", target.pid, "--interval", 0.01, "--count", 30, "--self-interval", 0.01),
            *("--sink", f"file://{out}?format=json"),
            "--quiet",
        )
        assert proc.wait(60) == 0, (tmp_path / "log").read_text()
    finally:
        target.kill()
    selves = [d for d in map(json.loads, out.read_text().splitlines()) if "node_id" not in d]
    assert [s["seq"] for s in selves] == list(range(len(selves))) and len(selves) >= 10
    stamps = [sample_schema.time_ns(s["time"]) for s in selves]
    assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False)), [s["time"] for s in selves]


@pytest.mark.parametrize("agent", ["c", "py"])
@pytest.mark.parametrize(
    "runs,given,expected",
    [
        (["run-a"], None, "run-a"),  # from its endpoints file
        (["run-a", "run-a"], None, "run-a"),
        (["run-a", "run-b"], None, None),  # two runs: the self-samples belong to neither
        (["run-a"], "mine", "mine"),  # --run-id wins
    ],
)
def test_self_samples_belong_to_the_run_their_targets_name(agent, tmp_path, runs, given, expected):
    targets = [sleeper() for _ in runs]
    files = []
    for i, (run_id, proc) in enumerate(zip(runs, targets, strict=False)):
        files += ["--endpoints", tmp_path / f"endpoints-{i}.json"]
        files[-1].write_text(
            json.dumps({"run_id": run_id, "nodes": [{"node_id": f"n{i}", "role": "merger", "pid": proc.pid}]})
        )
    out = tmp_path / "s.json"
    try:
        proc = start(
            agent,
            tmp_path / "log",
            *files,
            *(["--run-id", given] if given else []),
            "--interval",
            0.05,
            "--count",
            4,
            "--self-interval",
            0.05,
            "--sink",
            f"file://{out}?format=json",
            "--quiet",
        )
        assert proc.wait(60) == 0, (tmp_path / "log").read_text()
    finally:
        for t in targets:
            t.kill()
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    selves = [d for d in docs if "node_id" not in d]
    assert len(selves) >= 2 and all(s.get("run_id") == expected for s in selves), selves
    assert {d["run_id"] for d in docs if "node_id" in d} == {given} if given else set(runs)
