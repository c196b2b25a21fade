"""The suite's own Slurm cluster (lab/src/flowstat_lab/slurm.py): slurmctld at 127.0.0.10 and three slurmd,
n1-n3, at 127.0.0.11-13, with munged, all in the network namespace flowstat-slurm. What later tests
of issue 30 build on: one task per node, each knowing and binding its own node's address; ZeroMQ
between nodes; a lost node noticed; and nothing left behind, however the cluster ended.

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (make installs them); without them
it skips, and with CI set a skip fails (conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from support.agents import wait_until
from support.slurm import (
    ACROSS_THREE,
    C_AGENT_ENV,
    MISSING,
    flowstat_run,
    host_addresses,
    jobs,
    leftovers,
    module_cluster,
    netns,
    processes,
    sc,
    start_flowstat_run,
)

pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} (make installs slurmctld slurmd slurm-client munge)"
)


@pytest.fixture(scope="module")
def cluster():
    yield from module_cluster()


@pytest.fixture(autouse=True)
def slurm_logs_on_failure(request):
    """A failed test shows the daemons' logs: node states and refusals are there, not in the test."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        c = sc.Cluster()
        nodes = c.node_states() if c.running() else "not running"
        print(f"daemons: {c.daemon_pids()}; nodes: {nodes}", file=sys.stderr)
        print(c.log_tails(), file=sys.stderr)


def node_addresses(c: sc.Cluster) -> dict[str, str]:
    """NodeAddr of every node, as the controller has it."""
    out = c.client("scontrol", "-o", "show", "node", check=True).stdout
    fields = [dict(w.split("=", 1) for w in line.split() if "=" in w) for line in out.splitlines()]
    return {f["NodeName"]: f["NodeAddr"] for f in fields}


def listening(pid: int) -> list[str]:
    """The TCP addresses process PID listens on (its sockets matched in its namespace's table)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:
            host, port = f[1].split(":")
            found.append(f"{'.'.join(str(b) for b in bytes.fromhex(host)[::-1])}:{int(port, 16)}")
    return sorted(found)


def test_the_cluster_is_three_idle_nodes_each_daemon_on_its_own_address_in_its_own_namespace(cluster):
    assert cluster.node_states() == {"n1": "idle", "n2": "idle", "n3": "idle"}
    assert node_addresses(cluster) == {"n1": "127.0.0.11", "n2": "127.0.0.12", "n3": "127.0.0.13"}
    pids = cluster.daemon_pids()
    assert listening(pids["slurmctld"]) == [f"127.0.0.10:{sc.CTLD_PORT}"]
    assert {n: listening(pids[f"slurmd-{n}"]) for n in sc.NODES} == {
        "n1": [f"127.0.0.11:{sc.SLURMD_PORT}"],
        "n2": [f"127.0.0.12:{sc.SLURMD_PORT}"],
        "n3": [f"127.0.0.13:{sc.SLURMD_PORT}"],
    }
    addresses = sc.netns_addresses()
    assert sorted(addresses) == sorted(
        ["127.0.0.1/8", "::1/128", "127.0.0.10/8", "127.0.0.11/8", "127.0.0.12/8", "127.0.0.13/8"]
    )
    # the daemons are in the namespace, not the machine's network
    inode = sc.netns_inode()
    assert all(os.stat(f"/proc/{p}/ns/net").st_ino == inode for p in pids.values())


TASK_BINDS = """
import json, os, socket
s = socket.socket()
s.bind((os.environ["FLOWSTAT_NODE_ADDR"], 0))
s.listen()
print(json.dumps({"node": os.environ["SLURMD_NODENAME"], "bound": s.getsockname()[0],
                  "procid": os.environ["SLURM_PROCID"], "hostname": socket.gethostname()}))
"""


def test_srun_places_one_task_per_node_and_each_binds_its_own_nodes_address(cluster):
    out = cluster.client(
        "srun", "-N3", "--ntasks-per-node=1", sys.executable, "-c", TASK_BINDS, timeout=60, check=True
    ).stdout
    tasks = sorted((json.loads(line) for line in out.splitlines()), key=lambda t: t["node"])
    addresses = node_addresses(cluster)
    assert [(t["node"], t["bound"]) for t in tasks] == [(n, addresses[n]) for n in ("n1", "n2", "n3")]
    assert sorted(t["procid"] for t in tasks) == ["0", "1", "2"]
    # every node shares the machine's hostname: a task knows its node from Slurm, not gethostname()
    assert {t["hostname"] for t in tasks} == {os.uname().nodename}


ZMQ_TASK = """
import json, os, sys, zmq
n, port, sink = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
node, ctx = os.environ["SLURMD_NODENAME"], zmq.Context()
if node == "n1":
    pull = ctx.socket(zmq.PULL)
    pull.bind(f"tcp://{os.environ['FLOWSTAT_NODE_ADDR']}:{port}")
    pull.setsockopt(zmq.RCVTIMEO, 20000)
    got = {}
    try:
        for _ in range(2 * n):
            sender, seq = pull.recv().decode().split(":")
            got.setdefault(sender, []).append(int(seq))
    except zmq.Again:
        pass  # reported below, short
    pull.setsockopt(zmq.RCVTIMEO, 300)
    try:
        extra = pull.recv().decode()
    except zmq.Again:
        extra = None
    print(json.dumps({"node": node, "bound": pull.getsockopt(zmq.LAST_ENDPOINT).decode(), "got": got,
                      "extra": extra}))
else:
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://{sink}:{port}")
    push.setsockopt(zmq.SNDTIMEO, 20000)  # a PUSH without a peer blocks once its queue is full
    sent = 0
    try:
        for i in range(n):
            push.send(f"{node}:{i}".encode())
            sent += 1
    except zmq.Again:
        pass  # reported below, short
    push.close(linger=25000)  # what is not delivered by then never will be
    print(json.dumps({"node": node, "sent": sent}))
"""


def test_zeromq_from_n2_and_n3_to_a_pull_bound_on_n1s_address_moves_every_message_once(cluster):
    n = 20_000
    sink = node_addresses(cluster)["n1"]
    out = cluster.client(
        "srun", "-N3", "--ntasks-per-node=1", sys.executable, "-c", ZMQ_TASK, str(n), "5601", sink, timeout=90
    )
    assert out.returncode == 0, out.stderr
    by_node = {r["node"]: r for r in (json.loads(line) for line in out.stdout.splitlines())}
    assert by_node["n2"]["sent"] == by_node["n3"]["sent"] == n
    pull = by_node["n1"]
    assert pull["bound"] == f"tcp://{sink}:5601"
    assert {s: len(seqs) for s, seqs in pull["got"].items()} == {"n2": n, "n3": n}
    assert {s: seqs == list(range(n)) for s, seqs in pull["got"].items()} == {"n2": True, "n3": True}
    assert pull["extra"] is None


def start_orphan(c: sc.Cluster, node: str, marker: str) -> subprocess.Popen:
    """A job step on NODE whose task runs until killed, named by MARKER in its command line."""
    proc = subprocess.Popen(
        [*c.client_prefix(), "srun", "-N1", "-w", node, "sleep", "600"],
        env=c.client_env({"FLOWSTAT_MARKER": marker}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_until(lambda: bool(marked_tasks(marker)), f"the task on {node}", timeout=30)
    return proc


def _env_has(pid: int, marker: str) -> bool:
    try:
        return f"FLOWSTAT_MARKER={marker}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


# -- flowstat run --slurm -------------------------------------------------------------------------------


def test_a_run_across_three_slurm_nodes_places_binds_and_conserves_every_object(cluster, tmp_path):
    topo = tmp_path / "across.yaml"
    topo.write_text(ACROSS_THREE + "placement: {producers: [n1, n2], mergers: [n3]}\n")
    out = flowstat_run(cluster, topo, "--runs-dir", tmp_path / "runs", "--run-id", "across", env=C_AGENT_ENV)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["ok"] and summary["conservation"]["ok"], summary.get("failures")
    sent = {n["node_id"]: n["objects_sent"] for n in summary["nodes"] if n["role"] == "producer"}
    assert set(sent) == {"producers-0", "producers-1"} and all(v > 0 for v in sent.values())
    assert set(summary["online"]) == {"merger-0", "merger-1"}  # every merger got its verdict
    nodes = {
        n["node_id"]: n for n in json.loads((tmp_path / "runs" / "across" / "endpoints.json").read_text())["nodes"]
    }
    where = {name: (n["host"], n["control"].split("//")[1].split(":")[0]) for name, n in nodes.items()}
    assert where == {
        "producers-0": ("n1", "127.0.0.11"),
        "producers-1": ("n2", "127.0.0.12"),
        "merger-0": ("n3", "127.0.0.13"),
        "merger-1": ("n3", "127.0.0.13"),
        "viewer": ("n3", "127.0.0.13"),
    }
    assert all(
        n["data"].startswith("tcp://127.0.0.13:")
        for name, n in nodes.items()
        if name != "producers-0" and name != "producers-1"
    )
    # an agent pair on each host, each sampling its host's nodes only, named by Slurm's host names
    # (every node has the machine's hostname), the run ending them STOPPED; one run file of all
    lines = [json.loads(line) for line in (tmp_path / "runs" / "across" / "samples.ndjson").read_text().splitlines()]
    assert lines[0]["flowstat_run"]["run_id"] == "across"
    samples = [line for line in lines[1:] if "node_id" in line]
    seen = {(s["node_id"], s["host"], s["agent"]) for s in samples}
    assert seen == {(name, host, f"flowstat-agent-py/{host}") for name, (host, _) in where.items()}
    last = {s["node_id"]: s["node_state"] for s in sorted(samples, key=lambda s: s["seq"])}
    assert last == dict.fromkeys(where, "STOPPED")
    agents = {k for k in summary["agent"] if k.startswith("agent-")}
    assert agents == {f"agent-{kind}-{h}" for kind in ("py", "c") for h in ("n1", "n2", "n3")}
    for name in agents:  # each samples its own host's nodes, and delivered every sample
        stats = summary["agent"][name]
        assert stats["samples"] > 0 and all(v["lost"] == 0 for v in stats["sinks"].values()), (name, stats)
    # the allocation it asked for is given back: scancel'd, it is COMPLETING until every step's
    # processes are gone on their hosts, which a loaded machine makes take a while
    wait_until(lambda: jobs(cluster) == [], "the run's allocation given back", timeout=60)
    assert not [cmd for _, cmd in processes().values() if str(tmp_path) in cmd]  # no device, agent or srun of it


def stored_per_agent(stack, run_id: str) -> dict[str, dict[tuple[str, str, str], int]]:
    """{store: {(host, agent, node): samples}} of a run."""
    q = f'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_id}\' GROUP BY "host", "agent", "node_id"'
    series = stack["influxdb"].query(q, "flowstat")["results"][0].get("series", [])
    influx = {(s["tags"]["host"], s["tags"]["agent"], s["tags"]["node_id"]): s["values"][0][1] for s in series}
    es_url = stack["elasticsearch"].url
    requests.post(f"{es_url}/flowstat-*/_refresh", timeout=30)
    sources = [{k: {"terms": {"field": k}}} for k in ("host", "agent", "node_id")]
    body = {
        "size": 0,
        "query": {"term": {"run_id": run_id}},
        "aggs": {"k": {"composite": {"size": 100, "sources": sources}}},
    }
    answer = requests.post(f"{es_url}/flowstat-samples*/_search", json=body, timeout=30).json()
    assert "aggregations" in answer, answer
    es = {
        (b["key"]["host"], b["key"]["agent"], b["key"]["node_id"]): b["doc_count"]
        for b in answer["aggregations"]["k"]["buckets"]
    }
    return {"influxdb": influx, "elasticsearch": es}


def test_each_host_s_agents_ship_its_samples_to_both_stores_tagged_by_host_and_node(cluster, stack, tmp_path):
    """The stores run outside the cluster's namespace (the session's stack): a port of the
    namespace's loopback is forwarded to each (netns.Forward), as a cluster's login node reaches
    the site's stores."""
    topo = tmp_path / "across.yaml"
    topo.write_text(ACROSS_THREE + "placement: {producers: [n1, n2], mergers: [n3]}\n")
    run_id = f"across-stores-{uuid.uuid4().hex[:8]}"
    influx, es = stack["influxdb"].port, stack["elasticsearch"].port
    forwards = [netns.Forward(port, port, sc.NETNS_PATH) for port in (influx, es)]
    try:
        out = flowstat_run(
            cluster,
            topo,
            "--runs-dir",
            tmp_path / "runs",
            "--run-id",
            run_id,
            "--sink",
            f"influxdb://127.0.0.1:{influx}/flowstat",
            "--sink",
            f"elasticsearch://127.0.0.1:{es}/flowstat-samples",
            env=C_AGENT_ENV,
        )
    finally:
        for f in forwards:
            f.close()
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["ok"], summary.get("failures")
    stored = stored_per_agent(stack, run_id)
    assert stored["influxdb"] == stored["elasticsearch"]
    by_agent: dict[str, int] = {}
    for (host, agent, _node), n in stored["influxdb"].items():
        assert agent.endswith(f"/{host}")  # each host's agents sampled that host's nodes only
        by_agent[agent] = by_agent.get(agent, 0) + n
    nodes_of = {(h, n) for h, _, n in stored["influxdb"]}
    assert nodes_of == {("n1", "producers-0"), ("n2", "producers-1")} | {
        ("n3", n) for n in ("merger-0", "merger-1", "viewer")
    }
    expected = {
        f"flowstat-agent-{kind}/{host}": summary["agent"][f"agent-{kind}-{host}"]["samples"]
        for kind in ("py", "c")
        for host in ("n1", "n2", "n3")
    }
    assert by_agent == expected  # every sample each agent took, once, in both stores
    lines = (tmp_path / "runs" / run_id / "samples.ndjson").read_text().splitlines()
    recorded = sum(1 for line in lines[1:] if '"node_id"' in line)
    assert recorded == sum(v for k, v in expected.items() if "-py/" in k)  # the run file: the Python agents'


def test_the_sbatch_script_runs_the_topology_in_its_job_and_ends_in_the_run_directory(cluster, tmp_path):
    topo = tmp_path / "across.yaml"
    topo.write_text(ACROSS_THREE + "placement: {producers: [n1, n2], mergers: [n3]}\n")
    script, runs = tmp_path / "run.sh", tmp_path / "runs"
    made = subprocess.run(
        [sys.executable, "-m", "flowstat", "slurm-script", str(topo), "--runs-dir", str(runs), "--run-id", "batch"]
        + ["--duration", "3", "--partition", sc.PARTITION, "--time-limit", "5:00", "-o", str(script)],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    directives = [line for line in script.read_text().splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=flowstat-across",
        "#SBATCH --nodes=3",
        "#SBATCH --no-kill",
        f"#SBATCH --output={runs}/slurm-%j.out",
        f"#SBATCH --partition={sc.PARTITION}",
        "#SBATCH --time=5:00",
    ]
    job = cluster.client("sbatch", "--parsable", str(script), env=C_AGENT_ENV, check=True).stdout.strip()
    wait_until(lambda: jobs(cluster) == [], f"batch job {job} to end", timeout=90, poll=0.5)
    summary = json.loads((runs / "batch" / "summary.json").read_text())
    assert summary["ok"] and summary["conservation"]["ok"], (runs / f"slurm-{job}.out").read_text()[-2000:]
    assert summary["launcher"] == {"launcher": "slurm", "job_id": job, "hosts": ["n1", "n2", "n3"]}
    assert {summary["placement"][n] for n in ("producers-0", "producers-1", "merger-0")} == {"n1", "n2", "n3"}
    assert "across hosts (Slurm job" in (runs / f"slurm-{job}.out").read_text()


def test_scancel_ends_every_step_and_the_summary_says_the_job_was_cancelled(cluster, tmp_path):
    topo = tmp_path / "long.yaml"
    topo.write_text(ACROSS_THREE.replace("duration: 3", "duration: 120") + "placement: {producers: 2}\n")
    run = start_flowstat_run(cluster, topo, tmp_path / "runs", "cancelled")
    try:
        wait_until(lambda: (tmp_path / "runs" / "cancelled" / "run.json").exists(), "the run to start", timeout=60)
        (job,) = [line.split()[0] for line in jobs(cluster)]
        cluster.client("scancel", job, check=True)
        try:
            out, err = run.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            run.kill()
            raise AssertionError(
                f"the run did not end 90 s after scancel; its stderr: {run.communicate()[1][-3000:]}"
            ) from None
    finally:
        run.kill()
    summary = json.loads(out)
    assert summary["cancelled"] and not summary["ok"]
    assert summary["failures"][0] == f"Slurm job {job} ended: CANCELLED (every device ended with it)", err[-2000:]
    assert jobs(cluster) == []
    assert not [cmd for _, cmd in processes().values() if str(tmp_path) in cmd]


def test_a_clock_off_by_200_ms_on_one_host_is_measured_warned_of_and_its_latency_corrected(cluster, tmp_path):
    topo = tmp_path / "across.yaml"
    topo.write_text(ACROSS_THREE + "placement: {producers: [n1, n2], mergers: [n3]}\n")
    env = {**C_AGENT_ENV, "FLOWSTAT_CLOCK_OFFSETS": "merger-0=0.2"}  # merger-0's clock source, 200 ms ahead
    out = flowstat_run(cluster, topo, "--no-agent", "--runs-dir", tmp_path / "runs", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    clocks = summary["clocks"]
    assert set(clocks) == {"producers-0", "producers-1", "merger-0", "merger-1", "viewer"}
    for name, c in clocks.items():
        expected = 200.0 if name == "merger-0" else 0.0
        for when in ("start", "end"):  # within half the best round trip of the truth, and 1 ms for sleep jitter
            assert abs(c[f"offset_{when}_ms"] - expected) <= c[f"round_trip_{when}_ms"] / 2 + 1, (name, c)
    assert clocks["merger-0"]["host"] == "n3"
    latency = {n["node_id"]: n["input_latency"] for n in summary["nodes"] if n.get("input_latency")}
    assert -201 < latency["merger-0"]["clock_correction_ms"] < -199
    assert latency["merger-0"]["input_latency_p50_ms"] < 100  # measured 200 ms + its true wait, corrected
    assert abs(latency["merger-1"]["clock_correction_ms"]) < 1
    warned = "\n".join(summary["warnings"])
    assert "merger-0 on n3: clock off by 200." in warned
    assert "viewer: input latency not corrected:" in warned  # merger-0's objects reach it stamped ahead


def test_a_run_that_needs_more_hosts_than_the_partition_has_is_refused_with_both_numbers(cluster, tmp_path):
    topo = tmp_path / "wide.yaml"
    topo.write_text(ACROSS_THREE + "placement: {producers: 3, mergers: 2}\n")
    out = flowstat_run(cluster, topo, "--no-agent", "--runs-dir", tmp_path / "runs")
    assert out.returncode == 2
    assert "the topology asks for 5 hosts; partition flowstat has 3" in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists() and jobs(cluster) == []  # refused before anything started


def test_without_slurm_s_programs_the_run_says_which_are_missing_before_anything_starts(cluster, tmp_path):
    topo = tmp_path / "across.yaml"
    topo.write_text(ACROSS_THREE)
    bare = tmp_path / "bin"
    bare.mkdir()
    for program in ("scontrol", "sinfo", "nsenter"):  # some of Slurm's clients, not srun, salloc, scancel, squeue
        (bare / program).symlink_to(sc.which(program))
    out = flowstat_run(cluster, topo, "--no-agent", "--runs-dir", tmp_path / "runs", env={"PATH": str(bare)})
    assert out.returncode == 2
    assert "needs Slurm's client programs, not on the PATH: srun, salloc, scancel, squeue" in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()


def test_a_node_that_never_reports_ready_stops_the_run_after_the_timeout_naming_it_and_its_host(cluster, tmp_path):
    topo = tmp_path / "across.yaml"
    topo.write_text(ACROSS_THREE + "placement: {producers: [n1, n2], mergers: [n3]}\n")
    slurmd = cluster.daemon_pids()["slurmd-n3"]
    os.kill(slurmd, signal.SIGSTOP)  # n3 is allocated but starts no step: its nodes never start
    try:
        t0 = time.monotonic()
        out = flowstat_run(cluster, topo, "--no-agent", "--ready-timeout", "4", "--runs-dir", tmp_path / "runs")
        took = time.monotonic() - t0
    finally:
        os.kill(slurmd, signal.SIGCONT)
    assert out.returncode == 1, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    # the last layer starts first: the viewer, on n3
    assert summary["failures"][0].startswith("viewer on n3 did not become ready in 4 s; log: "), summary["failures"]
    assert not summary["ok"] and summary["placement"]["viewer"] == "n3"
    assert took < 60, took
    wait_until(lambda: jobs(cluster) == [], "the run's allocation given back", timeout=60)
    wait_until(
        lambda: not [cmd for _, cmd in processes().values() if str(tmp_path) in cmd],
        "nothing of the run left",
        timeout=60,
    )


def kill_host(c: sc.Cluster, node: str) -> list[int]:
    """As if the host went away: its slurmd, its job steps and their tasks, all at once, SIGKILL."""
    tasks = [pid for pid in processes() if _environ(pid).get("SLURMD_NODENAME") == node]
    steps = {
        ppid for pid in tasks if (ppid := _parent(pid)) and processes().get(ppid, ("",))[0].startswith("slurmstep")
    }
    victims = [c.daemon_pids()[f"slurmd-{node}"], *steps, *tasks]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return victims


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def merger_has_received(c: sc.Cluster, run: Path, merger: str) -> bool:
    endpoints = run / "endpoints.json"
    if not endpoints.exists():
        return False
    node = next(n for n in json.loads(endpoints.read_text())["nodes"] if n["node_id"] == merger)
    asked = c.client(
        sys.executable, "-m", "flowstat", "ctl", node["control"], "get-metrics", "--keys", str(run / "keys"), timeout=30
    )
    return asked.returncode == 0 and json.loads(asked.stdout)["objects_received"] > 0


def test_a_host_lost_mid_run_ends_it_as_a_dead_producer_does_naming_that_host_s_producers(cluster, tmp_path):
    topo = tmp_path / "long.yaml"
    topo.write_text(
        ACROSS_THREE.replace("duration: 3", "duration: 120") + "placement: {producers: [n1, n2], mergers: [n3]}\n"
    )
    run_dir = tmp_path / "runs" / "lost"
    run = start_flowstat_run(cluster, topo, tmp_path / "runs", "lost")
    killed: list[int] = []
    try:
        # the run is secured (it binds beyond 127.0.0.1): asked with its keys, as flowstat ctl --keys does
        wait_until(lambda: merger_has_received(cluster, run_dir, "merger-1"), "n2's producers' objects", timeout=60)
        # a stop without the run's key, to a node bound to n3's address: refused, changes nothing
        merger0 = next(
            n for n in json.loads((run_dir / "endpoints.json").read_text())["nodes"] if n["node_id"] == "merger-0"
        )
        stranger = cluster.client(sys.executable, "-m", "flowstat", "ctl", merger0["control"], "stop", "--timeout", "1")
        assert stranger.returncode == 1 and "no reply" in stranger.stderr, stranger.stderr
        killed = kill_host(cluster, "n2")
        out, err = run.communicate(timeout=120)
        check_host_lost(cluster, json.loads(out), err, run_dir, killed)
    finally:
        run.kill()
        if killed:  # n2's slurmd is gone: a fresh cluster for the tests after this one, whatever was found
            cluster.down()
            cluster.up(owner=os.getpid())
    assert not [cmd for _, cmd in processes().values() if str(tmp_path) in cmd]


def check_host_lost(cluster, summary: dict, err: str, run_dir: Path, killed: list[int]) -> None:
    c = summary["conservation"]
    assert not summary["ok"] and c["ok"] is False, err[-2000:]
    assert c["producers_not_conserved"] == [4, 5, 6, 7], err[-3000:]  # producers-1's, on n2: merger-1's
    assert summary["failures"][0].startswith(
        "producers-1 (producer) on n2 lost with its host (n2: Slurm's node failure) during the run; log: "
    ), summary["failures"]
    assert sorted(c["failed_checks"]) == [  # as after a dead producer on one host (test_harness_runs)
        "entries_conserved_in_every_layer",
        "entries_sent_eq_entries_at_viewer",
        "every_producer_sent_eq_received_eq_merged",
        "viewer_inputs_eq_objects_sent",
    ]
    sent = {n["node_id"]: n.get("objects_sent") for n in summary["nodes"] if n["role"] == "producer"}
    merged = {n["node_id"]: n for n in summary["nodes"] if n["role"] == "merger"}
    # everyone else's objects are conserved and checked: n1's producers fed merger-0 alone
    assert sent["producers-0"] > 0 and merged["merger-0"]["objects_received"] == sent["producers-0"]
    assert "merger-0" not in c.get("mergers_entries_not_conserved", []), c
    log = (run_dir / "logs" / "merger-0.log").read_text()
    # its inputs all sent their end of stream: it ended on them, never stopped early by a signal (its
    # step cancelled, as merger-1's is), which would leave behind what was still on its way
    assert "CANCELLED" not in log, log[-2000:]
    refusals = [line for line in log.splitlines() if "refused" in line]
    assert sum("further refusals are counted, not logged" in line for line in refusals) == 1, refusals
    assert jobs(cluster) == [] or "n2" in " ".join(jobs(cluster))  # what is left waits for n2 only
    assert not set(killed) & set(processes())


def marked_tasks(marker: str) -> list[int]:
    return [pid for pid, (comm, _) in processes().items() if comm == "sleep" and _env_has(pid, marker)]


def test_down_stops_a_running_job_and_leaves_no_namespace_process_or_address(cluster):
    before = host_addresses()  # the cluster runs: its addresses are in its namespace, not here
    marker = uuid.uuid4().hex
    srun = start_orphan(cluster, "n2", marker)
    inode = sc.netns_inode()
    cluster.down()
    srun.wait(timeout=10)
    assert leftovers(inode) == [] and marked_tasks(marker) == []
    assert host_addresses() == before
    assert not Path(sc.LOCK_DIR / "owner.json").exists()
    cluster.down()  # idempotent
    assert leftovers(inode) == []
    cluster.up(owner=os.getpid())  # for the tests after this one


def test_a_slurmd_killed_with_sigkill_goes_down_its_task_outlives_it_and_down_still_leaves_nothing(cluster):
    marker = uuid.uuid4().hex
    srun = start_orphan(cluster, "n3", marker)
    inode = sc.netns_inode()
    t0 = time.monotonic()
    os.kill(cluster.daemon_pids()["slurmd-n3"], signal.SIGKILL)
    # the controller pings every SlurmdTimeout/3 and marks a node DOWN after SlurmdTimeout without an
    # answer: 16-28 s measured with SlurmdTimeout=10
    deadline = 5 * sc.SLURMD_TIMEOUT_S + 10
    wait_until(lambda: "DOWN" in cluster.node_state("n3"), "n3 DOWN", timeout=deadline, poll=0.5)
    print(f"n3 DOWN {time.monotonic() - t0:.1f} s after its slurmd was killed", file=sys.stderr)
    assert cluster.node_states()["n1"] == cluster.node_states()["n2"] == "idle"
    assert marked_tasks(marker), "the killed slurmd's task no longer runs: nothing left for down to reap"
    cluster.down()
    srun.wait(timeout=10)
    assert leftovers(inode) == [] and marked_tasks(marker) == []
