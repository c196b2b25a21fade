"""CPU pinning (a topology's cpus:): refused where the CPUs do not exist, applied to every thread of
every process a run starts, as /proc/PID/status shows while the run goes, and recorded in run.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flowstat.harness import topology as topology_module
from flowstat.harness.agents import find_c_agent
from flowstat.harness.orchestrator import run_topology
from flowstat.harness.topology import TopologyError, from_dict, load
from flowstat.proc.procfs import ProcessGone, descendants, format_cpu_list, status_fields
from flowstat.schema import run as run_schema
from support.common import TOPOLOGIES, topology_dict

TWO_CPUS = {0, 1} <= os.sched_getaffinity(0)
needs_two_cpus = pytest.mark.skipif(not TWO_CPUS, reason="pinning apart needs CPUs 0 and 1")
PINS = {"merger": 1, "producer": 0, "viewer": 0, "agent": 0}


# -- loading --------------------------------------------------------------------------------------


def test_a_cpu_that_does_not_exist_is_refused_naming_the_field(tmp_path):
    count = os.cpu_count()
    p = tmp_path / "t.yaml"
    p.write_text(
        f"run_id: t\nobject: {{type: TH1F, size: 1kB}}\nproducers: {{count: 2}}\n"
        f"cpus: {{producer: 0, merger: {count}}}\n"
    )
    with pytest.raises(TopologyError) as err:
        load(p)
    here = format_cpu_list(os.sched_getaffinity(0))
    assert str(err.value) == f"{p}: cpus.merger: CPU {count} does not exist here (CPUs {here})"


def test_an_unknown_key_is_refused_naming_the_field(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text(
        "run_id: t\nobject: {type: TH1F, size: 1kB}\nproducers: {count: 2}\nmergers: 1\n"
        "cpus: {merger: 0, merger-7: 0}\n"
    )
    with pytest.raises(TopologyError) as err:
        load(p)
    assert str(err.value).startswith(
        f"{p}: cpus.merger-7: neither a role (producer, merger, viewer, agent) nor "
        f"a node of this topology (viewer, merger-0, producers-0, agent-py, agent-c)"
    )


def test_a_cpu_outside_flowstats_own_affinity_is_refused(monkeypatch):
    # As under `taskset -c 0` on a machine of two CPUs: CPU 1 exists, but nothing flowstat starts may use it.
    monkeypatch.setattr(topology_module, "_usable_cpus", lambda: (frozenset({0}), 2))
    with pytest.raises(TopologyError, match=r"^t.yaml: cpus.merger-0: CPU 1 is not available here \(CPUs 0; "):
        from_dict(topology_dict(cpus={"merger-0": "0-1"}), "t.yaml")


@pytest.mark.parametrize(
    "value,error",
    [
        ([], "no CPUs: a node needs at least one to run on"),
        ("1-0", "range 1-0 is empty"),
        (-1, "bad CPU or range '-1'"),
        (True, 'expected CPUs such as 1, [0, 1] or "0-1,3", got True'),
        (1.0, 'expected CPUs such as 1, [0, 1] or "0-1,3", got 1.0'),
        ([0, [1]], "bad CPU or range [1]"),
        ("0-99999999999", "CPU {count} does not exist here"),  # refused before a set that large is built
    ],
)
def test_bad_cpu_lists_name_the_field(value, error):
    with pytest.raises(TopologyError) as err:
        from_dict(topology_dict(cpus={"viewer": value}), "t.yaml")
    assert str(err.value).startswith("t.yaml: cpus.viewer: " + error.format(count=os.cpu_count()))


def test_cpu_lists_are_written_as_the_kernel_writes_them():
    assert format_cpu_list({8, 0, 1, 2, 5, 7}) == "0-2,5,7-8" and format_cpu_list([3]) == "3"


def test_cpu_lists_and_a_nodes_entry_over_its_roles():
    top = max(os.sched_getaffinity(0))
    t = from_dict(
        topology_dict(
            producers={"count": 4, "processes": 2},
            mergers=2,
            cpus={"merger": [0], "merger-1": f"0-{top}", "producer": "0", "agent-c": 0},
        )
    )
    assert t.cpus_for("merger-0", "merger") == {0}
    assert t.cpus_for("merger-1", "merger") == set(range(top + 1))  # the node's entry wins
    assert t.cpus_for("producers-1", "producer") == {0}
    assert t.cpus_for("agent-c", "agent") == {0} and t.cpus_for("agent-py", "agent") is None
    assert t.cpus_for("viewer", "viewer") is None
    # one canonical line, whatever the order in the file: roles in pipeline order, then nodes
    assert t.cpus_text() == f"producer=0 merger=0 merger-1={format_cpu_list(range(top + 1))} agent-c=0"
    assert from_dict(topology_dict()).cpus == {} and from_dict(topology_dict(cpus=None)).cpus == {}


def test_a_merger_cannot_take_a_name_the_cpus_keys_use():
    for name in ("agent", "viewer", "producers-0", "agent-py"):
        with pytest.raises(TopologyError, match=r"^t.yaml: mergers\[0\].id: .* is a role's name or one the harness"):
            from_dict(topology_dict(mergers=[{"id": name, "producers": "0-3"}]), "t.yaml")


# -- pinning a process ------------------------------------------------------------------------------

THREADED_CHILD = """
import sys, threading
stop = threading.Event()
def start():
    t = threading.Thread(target=stop.wait)
    t.start()
    return t
for _ in range(3):
    start()
print("ready", flush=True)
for line in sys.stdin:  # each line: one more thread, its id printed
    print(start().native_id, flush=True)
stop.set()
"""


@needs_two_cpus
def test_every_thread_is_pinned_those_running_and_those_started_after():
    import subprocess
    import sys

    from flowstat.proc.procfs import pin_threads

    child = subprocess.Popen(
        [sys.executable, "-c", THREADED_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "ready\n"  # its threads are running
        assert pin_threads(child.pid, {1}) == {1}
        threads = allowed_cpus(child.pid)
        assert len(threads) == 1 + 4 and all(cpus == {1} for cpus in threads.values()), threads
        child.stdin.write("\n")
        child.stdin.flush()
        tid = child.stdout.readline().strip()
        assert parse(status_fields(f"{child.pid}/task/{tid}")["Cpus_allowed_list"]) == {1}
    finally:
        child.stdin.close()
        child.wait(10)


# -- a real run -------------------------------------------------------------------------------------


def allowed_cpus(pid: int) -> dict[str, set[int]]:
    """Cpus_allowed_list of the process (/proc/PID/status) and of each of its threads, by "PID" and
    "PID/TID"."""
    out = {str(pid): status_fields(pid)["Cpus_allowed_list"]}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[f"{pid}/{task.name}"] = status_fields(f"{pid}/task/{task.name}")["Cpus_allowed_list"]
        except ProcessGone:
            pass  # a thread that ended between the listing and the reading
    return {k: parse(v) for k, v in out.items()}


def parse(cpu_list: str) -> set[int]:
    cpus = set()
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def agent_pids() -> dict[str, int]:
    """The monitoring agents among this test's descendants, by their command line."""
    found = {}
    for pid in descendants(os.getpid()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"flowstat.agent" in argv:
            found["agent-py"] = pid
        elif argv[0].endswith(b"flowstat-agent"):
            found["agent-c"] = pid
    return found


@pytest.fixture(scope="module")
def pinned_run(tmp_path_factory):
    """A short run of the smoke topology with mergers on CPU 1 and everything else on CPU 0; while it
    goes, every progress report (once a second, the run going) reads what /proc says of each process."""
    if not TWO_CPUS:
        pytest.skip("pinning apart needs CPUs 0 and 1")
    runs_dir = tmp_path_factory.mktemp("runs")
    smoke = load(TOPOLOGIES / "smoke.yaml")
    topo = from_dict({**smoke.raw, "duration": 3, "cpus": PINS}, "smoke-pinned")
    run_dir = runs_dir / "pinned"
    seen: list[dict[str, dict[str, set[int]]]] = []

    def on_progress(elapsed, duration, metrics, verdicts, flow):
        nodes = json.loads((run_dir / "endpoints.json").read_text())["nodes"]
        pids = {n["node_id"]: n["pid"] for n in nodes} | agent_pids()
        seen.append({name: allowed_cpus(pid) for name, pid in pids.items()})

    summary = run_topology(topo, run_id="pinned", runs_dir=runs_dir, on_progress=on_progress)
    return summary, seen, run_dir


@pytest.mark.integration
@needs_two_cpus
def test_every_thread_of_every_process_runs_where_the_topology_says(pinned_run):
    summary, seen, _ = pinned_run
    assert summary["ok"], summary["failures"]
    assert seen, "the run ended before its first progress report"
    agents = {"agent-py", "agent-c"} if find_c_agent() is not None else {"agent-py"}
    for observed in seen:
        assert set(observed) == {"viewer", "merger-0", "producers-0"} | agents
        for name, threads in observed.items():
            want = {1} if name.startswith("merger") else {0}
            assert len(threads) >= 2, (name, threads)  # the process and at least its main thread
            assert all(cpus == want for cpus in threads.values()), (name, threads)


@pytest.mark.integration
@needs_two_cpus
def test_run_json_records_each_process_cpus(pinned_run):
    summary, _, run_dir = pinned_run
    doc = json.loads((run_dir / "run.json").read_text())
    assert run_schema.validate(doc) == []
    assert doc["parameters"]["cpus"] == "producer=0 merger=1 viewer=0 agent=0"
    agents = ["agent-py", "agent-c"] if find_c_agent() is not None else ["agent-py"]
    assert doc["affinity"] == [
        {"node_id": "viewer", "role": "viewer", "cpus": [0]},
        {"node_id": "merger-0", "role": "merger", "cpus": [1]},
        {"node_id": "producers-0", "role": "producer", "cpus": [0]},
        *({"node_id": a, "role": "agent", "cpus": [0]} for a in agents),
    ]
    assert summary["affinity"] == doc["affinity"]


@pytest.mark.integration
def test_a_process_the_kernel_will_not_pin_stops_the_run_naming_it(runs_dir, monkeypatch):
    import errno

    from flowstat.harness import orchestrator

    def refuse(pid, cpus):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(orchestrator, "pin_threads", refuse)  # as if CPU 0 had gone offline since loading
    s = run_topology(from_dict(topology_dict(cpus={"viewer": 0})), run_id="refused", runs_dir=runs_dir)
    assert not s["ok"]
    assert s["failures"][0] == "cannot pin viewer to CPUs 0: Invalid argument"
