"""The C agent's --endpoints-dir (issue 26): the endpoints files nodes write in a directory, read at
each search for targets, against real processes (plain `sleep`s, and a stand-in control socket:
support.agents.StubNode) and the agent's own samples (its file sink). What is wrong with a file is
said once per version of it; a node gone with its file is STOPPED, one that left it behind DOWN;
roles are any the sample schema's pattern allows."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from flowstat.schema import sample as sample_schema
from support.agents import StubNode, wait_until
from support.common import C_AGENT, needs

pytestmark = needs(C_AGENT)

INTERVAL, RESCAN = 0.05, 0.1


def node_process() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"])


def announce(directory: Path, node_id: str, pid: int, **fields) -> Path:
    """A node's endpoints file, NODE_ID.PID.json, written as a node writes it: to .NAME.tmp, then
    renamed."""
    path = directory / f"{node_id}.{pid}.json"
    run_id = fields.pop("run_id", None)
    doc = {**({"run_id": run_id} if run_id else {}), "nodes": [{"node_id": node_id, "pid": pid, **fields}]}
    tmp = directory / f".{path.name}.tmp"
    tmp.write_text(json.dumps(doc))
    os.rename(tmp, path)
    return path


class Agent:
    """The C agent watching `directory`, its samples in a file (JSON lines), its log in another."""

    def __init__(self, tmp_path: Path, *directories: Path):
        self.samples_path, self.log_path = tmp_path / "samples.json", tmp_path / "agent.log"
        args = [arg for d in directories for arg in ("--endpoints-dir", str(d))]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [str(C_AGENT), *args, "--interval", str(INTERVAL), "--rescan", str(RESCAN), "--self-interval", "0"]
                + ["--sink", f"file://{self.samples_path}?format=json"],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def samples(self, node_id: str | None = None) -> list[dict]:
        """The samples written so far (whole lines), of one node if named."""
        if not self.samples_path.exists():
            return []
        lines = [x for x in self.samples_path.read_text().splitlines(keepends=True) if x.endswith("\n")]
        return [d for d in map(json.loads, lines) if node_id is None or d["node_id"] == node_id]

    def log(self) -> str:
        return self.log_path.read_text()

    def rounds(self) -> int:
        """The sampling rounds written so far that sampled something (their samples share a time)."""
        return len({d["time"] for d in self.samples()})

    def searches(self, n: int) -> None:
        """Wait until the agent has searched for targets at least n more times: n rescans' worth of
        sampling rounds (of a node it samples all along)."""
        start = self.rounds()
        wait_until(lambda: self.rounds() >= start + n * RESCAN / INTERVAL, f"{n} more searches")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.log()
        return self.log()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        started.append(node_process())
        return started[-1]

    yield start
    for p in started:
        p.kill()
        p.wait()


@pytest.fixture
def agent_of(tmp_path):
    agents: list[Agent] = []

    def start(*directories: Path) -> Agent:
        agents.append(Agent(tmp_path, *directories))
        return agents[-1]

    yield start
    for a in agents:
        a.kill()


@pytest.fixture
def endpoints_dir(tmp_path) -> Path:
    d = tmp_path / "endpoints"
    d.mkdir()
    return d


def test_a_node_announced_after_the_agent_started_is_sampled_with_its_role_run_and_control(
    endpoints_dir, processes, agent_of
):
    """Found at a later search: the directory is read again at each, not only at start. Its role,
    run id and control channel are the file's; a role the schema's pattern allows is kept, and one
    it does not is recorded as other."""
    first = processes()
    announce(endpoints_dir, "first", first.pid, role="producer")
    agent = agent_of(endpoints_dir)
    wait_until(lambda: agent.samples("first"), "the first node's samples")
    agent.searches(3)  # searches that found nothing more
    assert {d["node_id"] for d in agent.samples()} == {"first"}
    worker, odd, long, controlled = processes(), processes(), processes(), processes()
    node = StubNode("ok")
    try:
        announce(endpoints_dir, "worker-1", worker.pid, role="worker", run_id="run-26")
        announce(endpoints_dir, "odd", odd.pid, role="Bad Role!")
        announce(endpoints_dir, "long", long.pid, role="r" * 80)  # cut to what a target holds: still too long
        announce(endpoints_dir, "controlled", controlled.pid, role="merger", control=node.endpoint)
        wait_until(
            lambda: all(agent.samples(n) for n in ("worker-1", "odd", "long", "controlled")), "the later nodes' samples"
        )
        agent.searches(2)
        agent.stop()
    finally:
        node.close()
    assert {(d["role"], d["run_id"], d["pid"]) for d in agent.samples("worker-1")} == {("worker", "run-26", worker.pid)}
    assert {d["role"] for d in agent.samples("odd") + agent.samples("long")} == {sample_schema.DEFAULT_ROLE}
    controlled_samples = agent.samples("controlled")
    assert {(d["role"], d["node_state"], d["objects_received"]) for d in controlled_samples} == {
        ("merger", "RUNNING", 10)
    }
    assert node.requests >= len(controlled_samples)
    assert all(sample_schema.validate(d) == [] for d in agent.samples())


def test_every_problem_of_a_file_is_said_once_while_the_other_nodes_are_sampled(
    tmp_path, endpoints_dir, processes, agent_of
):
    """Junk, a file no one can read (a dangling link: root too), a FIFO (never opened: it would
    block), nodes that do not conform and a stale file (its process dead): each said once over many
    searches, the good nodes sampled meanwhile; a file that changes is said again. Names that are not
    a node's file (hidden, being written, not .json) are not even looked at."""
    good, also_good, dead = processes(), processes(), processes()
    dead.kill()
    dead.wait()
    announce(endpoints_dir, "good", good.pid, role="viewer")
    junk = endpoints_dir / "junk.json"
    junk.write_text("{not json")
    (endpoints_dir / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    os.mkfifo(endpoints_dir / "fifo.json")
    partly = endpoints_dir / "partly.json"
    partly.write_text(json.dumps({"nodes": [{"node_id": "also-good", "pid": also_good.pid}, {"node_id": "no-pid"}]}))
    announce(endpoints_dir, "dead", dead.pid)
    for ignored in (".hidden.json", ".dead.1.json.tmp", "notes.txt", "json"):
        (endpoints_dir / ignored).write_text("{not json")
    agent = agent_of(endpoints_dir)
    wait_until(lambda: agent.samples("good") and agent.samples("also-good"), "the good nodes' samples")
    agent.searches(5)
    junk.write_text("[1, 2, 3]")  # another version (of the same size: a later time): said again
    wait_until(lambda: agent.log().count("junk.json") == 2, "the new version of junk.json to be said")
    agent.searches(5)
    log = agent.stop()
    said = [line.split("--endpoints-dir: ", 1)[1] for line in log.splitlines() if "--endpoints-dir: " in line]
    d = str(endpoints_dir)
    assert sorted(said) == sorted(
        [
            f"{d}/junk.json: not a flowstat endpoints document",
            f"{d}/junk.json: not a flowstat endpoints document",
            f"{d}/dangling.json: cannot be read (No such file or directory)",
            f"{d}/fifo.json: not a regular file: left alone",
            f"{d}/partly.json: 1 node(s) left out: not as endpoints.schema.json says (node_id a string, pid an "
            "integer 1..4194304, role and control strings)",
            f"{d}/dead.{dead.pid}.json: 1 node(s) of a process that is not running: left out (a stale file)",
        ]
    ), log
    rounds = agent.rounds()
    assert rounds >= 10 * RESCAN / INTERVAL
    assert {d["node_id"] for d in agent.samples()} == {"good", "also-good"}
    for node_id in ("good", "also-good"):  # in every round since it was found, and never ended
        states = [d["node_state"] for d in agent.samples(node_id)]
        assert states[-1] == "UP" and set(states) == {"UP"}
        assert len(states) >= rounds - 2, (node_id, len(states), rounds)


def ended(agent: Agent, node_id: str) -> list[str]:
    states = [d["node_state"] for d in agent.samples(node_id)]
    return states if states and states[-1] != "UP" else []


def test_a_node_that_crashed_leaving_its_file_ends_down(endpoints_dir, processes, agent_of):
    node, bystander = processes(), processes()  # the bystander's samples count the rounds
    path = announce(endpoints_dir, "crashed", node.pid, role="merger")
    announce(endpoints_dir, "bystander", bystander.pid)
    agent = agent_of(endpoints_dir)
    wait_until(lambda: agent.samples("crashed"), "the node's samples")
    node.kill()  # SIGKILL: no clean close, the file stays
    node.wait()
    wait_until(lambda: ended(agent, "crashed"), "the node's last sample")
    agent.searches(3)  # its file is read again: stale now, and said so once
    log = agent.stop()
    states = [d["node_state"] for d in agent.samples("crashed")]
    assert states[-1] == "DOWN" and set(states[:-1]) == {"UP"}, states
    assert path.exists() and log.count(f"{path.name}: 1 node(s) of a process that is not running") == 1, log


def test_a_node_that_removed_its_file_before_it_exited_ends_stopped(endpoints_dir, processes, agent_of):
    """A clean close: the file goes, then the process; one DOWN-less STOPPED, and nothing said of the
    file. Beside it a node that crashed in the same directory still ends DOWN."""
    closing, crashing, bystander = processes(), processes(), processes()
    path = announce(endpoints_dir, "closing", closing.pid, role="worker")
    announce(endpoints_dir, "crashing", crashing.pid, role="worker")
    announce(endpoints_dir, "bystander", bystander.pid, role="worker")
    agent = agent_of(endpoints_dir)
    wait_until(lambda: agent.samples("closing") and agent.samples("crashing"), "the nodes' samples")
    path.unlink()
    closing.send_signal(signal.SIGTERM)
    closing.wait()
    crashing.kill()
    crashing.wait()
    wait_until(lambda: ended(agent, "closing") and ended(agent, "crashing"), "the nodes' last samples")
    agent.searches(2)
    log = agent.stop()
    closed = [d["node_state"] for d in agent.samples("closing")]
    assert closed[-1] == "STOPPED" and set(closed[:-1]) == {"UP"}, closed
    assert f"closing (pid {closing.pid}) is gone (stopped: its endpoints file" in log
    assert not [line for line in log.splitlines() if "--endpoints-dir" in line and path.name in line], log
    crashed = [d["node_state"] for d in agent.samples("crashing")]
    assert crashed[-1] == "DOWN" and set(crashed[:-1]) == {"UP"}, crashed
    assert {d["role"] for d in agent.samples()} == {"worker"}


def test_a_missing_directory_is_said_once_and_read_once_it_is_there(tmp_path, endpoints_dir, processes, agent_of):
    """Nodes create the directory when they start: an agent may be first."""
    bystander = processes()  # in another directory: its samples count the rounds
    announce(endpoints_dir, "bystander", bystander.pid)
    directory = tmp_path / "later"
    agent = agent_of(endpoints_dir, directory)
    wait_until(lambda: agent.samples("bystander"), "the bystander's samples")
    agent.searches(3)
    directory.mkdir()
    node = processes()
    announce(directory, "late", node.pid)
    wait_until(lambda: agent.samples("late"), "the node's samples")
    agent.searches(2)
    log = agent.stop()
    assert log.count(f"{directory}: cannot be opened (No such file or directory)") == 1, log


ROLES = ["producer", "other", "worker", "w", "a-b_c9", "x" * 32, "", "Bad Role!", "Worker", "9lives", "-x", "x" * 33]
ROLES += ["worker\n", "wörker", "a.b"]


def test_the_c_agent_allows_exactly_the_roles_the_schema_allows():
    """The role's pattern, compiled into the C agent's table (a POSIX regular expression there):
    --encode takes a sample exactly when the schema's own validator does."""
    samples = [
        {
            "time": "2026-11-26T10:00:00.000Z",
            "run_id": "r",
            "host": "h",
            "node_id": "n",
            "role": role,
            "agent": "a",
            "seq": 0,
            "pid": 1,
            "node_state": "UP",
        }
        for role in ROLES
    ]
    text = "".join(json.dumps(s) + "\n" for s in samples)
    out = subprocess.run([str(C_AGENT), "--encode", "json"], input=text, capture_output=True, text=True, timeout=30)
    taken = [json.loads(line)["role"] for line in out.stdout.splitlines()]
    allowed = [s["role"] for s in samples if sample_schema.validate(s) == []]
    assert taken == allowed and allowed == ROLES[:6], (taken, out.stderr)
