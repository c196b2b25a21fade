"""The C agent's --endpoints-dir (issue 26): the endpoints files nodes write in a directory, read at
each search for targets, against real processes (plain `sleep`s, and a stand-in control socket:
support.agents.StubNode) and the agent's own samples (its file sink). What is wrong with a file is
said once per version of it; a node gone with its file is STOPPED, one that left it behind DOWN;
roles are any the sample schema's pattern allows. Nodes whose control channel takes CURVE clients
only (issue 30: a C node of libflowstat-node, a Python flowstat.node.Node) are asked with their
run's client key, or sampled from /proc only when the agent has none."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flowstat.node import curve
from flowstat.schema import sample as sample_schema
from support.agents import StubNode, wait_until
from support.common import C_AGENT, C_BUILD, needs

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
    """The C agent watching `directory`, its samples in a file (JSON lines), its log in another
    (named after `name`, for a test with several agents); `extra`: more options."""

    def __init__(self, tmp_path: Path, *directories: Path, extra: tuple[str, ...] = (), name: str = ""):
        self.samples_path, self.log_path = tmp_path / f"{name}samples.json", tmp_path / f"{name}agent.log"
        args = [arg for d in directories for arg in ("--endpoints-dir", str(d))] + list(extra)
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

    def start(*directories: Path, **kw) -> Agent:
        agents.append(Agent(tmp_path, *directories, **kw))
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
            "integer 1..4194304, role and control strings, curve_server_key a Z85 key of 40 characters, upstream a "
            "list of node ids)",
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


# -- CURVE (issue 30) ---------------------------------------------------------------------------------

PROBE = C_BUILD / "node-probe"  # tests/test_node_c.py's node: libflowstat-node told what to do line by line
PY_NODE = """
import sys
from flowstat.node import Node

node = Node(sys.argv[1], "worker", run_id="run-30", curve_keys=sys.argv[2], endpoints_dir=sys.argv[3])
node.received(7, 700)
node.sent(2, 20)
print(node.endpoint, flush=True)
sys.stdin.read()  # until the test is done with it
node.close()
"""
C_TOLD = {"objects_received": 5, "bytes_received": 500, "objects_sent": 3, "bytes_sent": 30}
PY_TOLD = {"objects_received": 7, "bytes_received": 700, "objects_sent": 2, "bytes_sent": 20}


class SecuredNodes:
    """A C node (node-probe, its keys from FLOWSTAT_CURVE_KEYS) and a Python node
    (flowstat.node.Node(curve_keys=...)) of one run's keys, announced in `folder`, told C_TOLD and
    PY_TOLD."""

    def __init__(self, keys: Path, folder: Path):
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        c_args = ["--node-id", "c-node", "--role", "merger", "--run-id", "run-30", "--endpoints-dir", str(folder)]
        self.c = subprocess.Popen(
            [str(PROBE), *c_args],
            env={**os.environ, curve.ENV_KEYS: str(keys)},
            **pipes,
        )
        self.py = subprocess.Popen(
            [sys.executable, "-c", PY_NODE, "py-node", str(keys), str(folder)],
            **pipes,
        )
        assert self.c.stdout.readline().startswith("endpoint tcp://127.0.0.1:")
        for told in ("received 5 500", "sent 3 30"):
            self.tell(told)
        assert self.py.stdout.readline().startswith("tcp://127.0.0.1:")

    def tell(self, line: str) -> str:
        self.c.stdin.write(line + "\n")
        self.c.stdin.flush()
        answer = self.c.stdout.readline()
        assert answer.startswith("ok"), answer
        return answer[3:].strip()

    def close(self) -> str:
        """Both closed as nodes close (stdin ends: fs_node_close, Node.close): what they logged."""
        for p in (self.c, self.py):
            p.stdin.close()
        for p in (self.c, self.py):
            assert p.wait(timeout=30) == 0
        return "".join(p.stderr.read() for p in (self.c, self.py))

    def kill(self) -> None:
        for p in (self.c, self.py):
            if p.poll() is None:
                p.kill()
                p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()


@pytest.fixture
def secured(tmp_path):
    """A run folder, RUN: its keys in RUN/keys, and the two secured nodes announced in RUN."""
    run = tmp_path / "run"
    run.mkdir()
    nodes = SecuredNodes(curve.create_run_keys(run), run)
    wait_until(lambda: len(list(run.glob("*.json"))) == 2, "both nodes' endpoints files")
    yield run, nodes
    nodes.kill()


def endpoints_file(folder: Path, announced_in: Path) -> Path:
    """folder/endpoints.json naming the nodes announced in another folder (a harness run's file)."""
    nodes = [json.loads(f.read_text())["nodes"][0] for f in sorted(announced_in.glob("*.json"))]
    folder.mkdir(exist_ok=True)
    (folder / "endpoints.json").write_text(json.dumps({"run_id": "run-30", "nodes": nodes}))
    return folder / "endpoints.json"


def keys_said(run: Path, *logs: str) -> list[str]:
    keys = [k for f in (run / "keys").iterdir() for k in re.findall(r'-key = "(.{40})"', f.read_text())]
    return [k for k in keys if any(k in log for log in logs)]


@needs(PROBE)
def test_secured_c_and_python_nodes_are_asked_over_curve_with_their_runs_client_key(tmp_path, secured, agent_of):
    """The client key: by default keys/client.key_secret inside the --endpoints-dir, or in the folder
    of an --endpoints FILE (a run's RUN_DIR/keys); else the one --curve-client-key names. Samples
    carry what each node was told, through its secured channel; no node refuses anyone."""
    run, nodes = secured
    beside = endpoints_file(tmp_path / "copy", run)
    shutil.copytree(run / "keys", tmp_path / "copy" / "keys")  # RUN_DIR/endpoints.json, RUN_DIR/keys
    keyless = endpoints_file(tmp_path / "keyless", run)
    agents = [
        agent_of(run, name="dir-"),
        agent_of(extra=("--endpoints", str(beside)), name="file-"),
        agent_of(extra=("--endpoints", str(keyless), "--curve-client-key", str(run / "keys" / "client.key_secret"))),
    ]
    for agent in agents:
        wait_until(
            lambda agent=agent: all(
                any("objects_received" in d for d in agent.samples(n)) for n in ("c-node", "py-node")
            ),
            f"{agent.samples_path.name}: samples of both nodes with their control figures",
        )
        agent.searches(2)
    logs = [agent.stop() for agent in agents]
    node_logs = nodes.close()
    for agent, log in zip(agents, logs, strict=True):
        for node_id, role, told in (("c-node", "merger", C_TOLD), ("py-node", "worker", PY_TOLD)):
            mine = agent.samples(node_id)
            asked = [d for d in mine if "objects_received" in d]
            assert len(asked) * 2 >= len(mine), (agent.samples_path.name, node_id, log)  # a reply a round, near enough
            assert {(d["role"], d["run_id"], d["node_state"]) for d in asked} == {(role, "run-30", "RUNNING")}
            assert {tuple(d[k] for k in told) for d in asked} == {tuple(told.values())}, (node_id, asked[-1])
        assert "CURVE" not in log, log
    assert "refused" not in node_logs, node_logs
    assert keys_said(run, node_logs, *logs) == []


@needs(PROBE)
def test_a_secured_node_without_a_usable_client_key_is_sampled_from_proc_only_said_once(
    tmp_path, secured, processes, agent_of
):
    """No key file where the agent looks (the default of a folder without keys/, or a path given),
    or one without a secret: each node sampled from /proc only (as a node without a channel), one
    message a node naming it and the file. A node whose curve_server_key is no key is left out as a
    node with a malformed field is, said once."""
    run, nodes = secured
    plain = tmp_path / "plain"
    shutil.copytree(run, plain, ignore=shutil.ignore_patterns("keys"))  # the same nodes' files, no keys/
    odd = processes()
    malformed = announce(run, "malformed", odd.pid, control="tcp://127.0.0.1:1", curve_server_key="short")
    (tmp_path / "bad").mkdir()
    bad = tmp_path / "bad" / "endpoints.json"  # the same node in an --endpoints FILE: said once too
    shutil.copy(malformed, bad)
    nowhere, public = tmp_path / "nowhere" / "client.key_secret", run / "keys" / "client.key"
    agents = {
        plain / "keys" / "client.key_secret": agent_of(plain, extra=("--endpoints", str(bad)), name="plain-"),
        nowhere: agent_of(run, extra=("--curve-client-key", str(nowhere)), name="nowhere-"),
        public: agent_of(run, extra=("--curve-client-key", str(public)), name="public-"),
    }
    for agent in agents.values():
        wait_until(lambda agent=agent: agent.samples("c-node") and agent.samples("py-node"), "both nodes' samples")
        agent.searches(3)
    for looked_for, agent in agents.items():
        log = agent.stop()
        for node_id, pid, role in (("c-node", nodes.c.pid, "merger"), ("py-node", nodes.py.pid, "worker")):
            mine = agent.samples(node_id)
            assert mine and not [d for d in mine if "objects_received" in d or "bytes_sent" in d], mine[-1]
            assert {(d["role"], d["node_state"]) for d in mine} == {(role, "UP")}
            said = [line for line in log.splitlines() if f"{node_id} (pid {pid}): its control channel takes" in line]
            assert len(said) == 1 and f"({looked_for}: " in said[0] and "sampled from /proc only" in said[0], log
        assert not agent.samples("malformed")
    assert agents[public].log().count(f"--endpoints-dir: {malformed}: 1 node(s) left out") == 1
    assert agents[plain / "keys" / "client.key_secret"].log().count(f"--endpoints: {bad}: 1 node(s) left out") == 1
    assert nodes.tell("stop?") == "0"
    assert keys_said(run, nodes.close(), *(agent.log() for agent in agents.values())) == []
