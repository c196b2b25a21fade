"""Elasticsearch's per-node 10 s rollup (flowstat.stores.elasticsearch_rollup, flowstat rollup)
against the real server: the means it holds against the samples written, a late sample, an outage
of the store between passes, a restart, replay, and the command."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import defaultdict

import pytest
import requests

from flowstat.stores import StoreDown
from flowstat.stores.elasticsearch import ElasticsearchWriter
from flowstat.stores.elasticsearch_rollup import EVERY_S, Rollup, rollup_index, window_of
from flowstat.timeutil import iso_utc_from_ms
from support.common import free_port

pytestmark = pytest.mark.integration

NODES = ("n0", "n1", "n2")


def base_ms() -> int:
    """A window start an hour ago: the samples' time, before any clock the tests set."""
    import time

    return window_of(int((time.time() - 3600) * 1000))


def sample(run_id: str, node: str, t_ms: int, seq: int, vmrss: int, cpu: float | None = None) -> dict:
    doc = {
        "time": iso_utc_from_ms(t_ms),
        "run_id": run_id,
        "host": "h",
        "node_id": node,
        "role": "merger",
        "agent": "flowstat-agent-py",
        "seq": seq,
        "pid": 100,
        "node_state": "RUNNING",
        "vmrss_kb": vmrss,
    }
    if cpu is not None:
        doc["cpu_clock_hz"] = cpu
    return doc


def write(es: ElasticsearchWriter, docs: list[dict]) -> None:
    assert es.write(es.encode(docs), len(docs)).accepted == len(docs)
    requests.post(f"{es.url}/{es.target}-*/_refresh", timeout=30).raise_for_status()


def rollup_docs(url: str, target: str) -> dict[str, dict]:
    requests.post(f"{url}/{target}-*/_refresh", timeout=30).raise_for_status()
    resp = requests.post(f"{url}/{target}-*/_search", json={"size": 10000}, timeout=30)
    resp.raise_for_status()
    return {h["_id"]: h["_source"] for h in resp.json()["hits"]["hits"]}


@pytest.fixture
def es_samples(stack):
    """A samples index of the test's own (its rollup too: flowstat-node-10s-INDEX, under the template)."""
    index = f"flowstat-samples-t{uuid.uuid4().hex[:10]}"
    return ElasticsearchWriter(stack["elasticsearch"].url, index)


def test_the_rollup_holds_each_nodes_mean_per_window(es_samples):
    run_id, t0 = f"r-{uuid.uuid4().hex[:8]}", base_ms()
    docs = [
        sample(
            run_id, node, t0 + i * 1000, i, vmrss=1000 * (k + 1) + i * i, cpu=1.5 * i if k < 2 and i % 4 == 0 else None
        )
        for k, node in enumerate(NODES)
        for i in range(25)  # 2.5 windows: 10, 10 and 5 samples per node
    ]
    write(es_samples, docs)
    rollup = Rollup(es_samples, source=es_samples.target, target=rollup_index(es_samples.target))
    done = rollup.roll(t0, t0 + 25_000)
    assert (done.windows_counted, done.windows_rolled, done.documents, done.refused) == (3, 3, 9, 0)
    expected: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for d in docs:
        t = t0 + d["seq"] * 1000
        expected[(d["node_id"], window_of(t))].append(d)
    got = rollup_docs(es_samples.url, rollup.target)
    assert len(got) == 9
    for (node, w), members in expected.items():
        doc = got[f"{run_id}/h/{node}/merger/flowstat-agent-py/{w}"]  # the series (every tag) and window
        assert doc["time"] == iso_utc_from_ms(w)
        assert (doc["node_id"], doc["role"], doc["host"], doc["samples"]) == (node, "merger", "h", len(members))
        assert doc["mean_vmrss_kb"] == pytest.approx(sum(m["vmrss_kb"] for m in members) / len(members))
        cpus = [m["cpu_clock_hz"] for m in members if "cpu_clock_hz" in m]
        if cpus:  # the mean of the samples that have the field
            assert doc["mean_cpu_clock_hz"] == pytest.approx(sum(cpus) / len(cpus))
        else:  # none has it: no field, not a zero
            assert "mean_cpu_clock_hz" not in doc
        assert "node_state" not in doc and "mean_node_state" not in doc  # strings are not averaged
    rollup.roll(t0, t0 + 25_000)  # again: the same documents, overwritten
    assert rollup_docs(es_samples.url, rollup.target) == got


def test_a_late_sample_rolls_its_window_up_again_and_no_other(es_samples):
    run_id, t0 = f"r-{uuid.uuid4().hex[:8]}", base_ms()
    write(es_samples, [sample(run_id, n, t0 + i * 1000, i, vmrss=100) for n in NODES for i in range(30)])
    now = [t0 / 1000 + 30 + EVERY_S]  # the clock: 30 s of samples, then a window later
    rollup = Rollup(es_samples, source=es_samples.target, target=rollup_index(es_samples.target), clock=lambda: now[0])
    first = rollup.tick()
    assert first.windows_rolled >= 3 and first.documents == 9
    late = sample(run_id, "n1", t0 + 12_500, 1000, vmrss=1200)  # in the second window, arriving now
    write(es_samples, [late])
    now[0] += EVERY_S
    again = rollup.tick()
    assert (again.windows_rolled, again.documents) == (1, 3)  # its window only
    doc = rollup_docs(es_samples.url, rollup.target)[f"{run_id}/h/n1/merger/flowstat-agent-py/{t0 + 10_000}"]
    assert (doc["samples"], doc["mean_vmrss_kb"]) == (11, pytest.approx((10 * 100 + 1200) / 11))
    quiet = rollup.tick()
    assert (quiet.windows_rolled, quiet.documents) == (0, 0)  # nothing changed: nothing written


def test_windows_of_an_outage_are_rolled_up_when_the_store_answers_again(es_samples, stack):
    run_id, t0 = f"r-{uuid.uuid4().hex[:8]}", base_ms()
    write(es_samples, [sample(run_id, n, t0 + i * 1000, i, vmrss=100 + i) for n in NODES for i in range(20)])
    now = [t0 / 1000 + 10 + 3]
    target = rollup_index(es_samples.target)
    rollup = Rollup(es_samples, source=es_samples.target, target=target, clock=lambda: now[0], resample_s=30)
    assert rollup.tick().documents == 3  # the first window
    # The store goes away for longer than the resample span, while samples keep arriving.
    rollup.store = ElasticsearchWriter(f"http://127.0.0.1:{free_port()}", es_samples.target, timeout_s=2)
    write(es_samples, [sample(run_id, n, t0 + i * 1000, i, vmrss=100 + i) for n in NODES for i in range(20, 300)])
    for _ in range(3):
        now[0] += 200
        with pytest.raises(StoreDown):
            rollup.tick()
    rollup.store = es_samples
    back = rollup.tick()
    assert back.documents == 3 * 29  # every window since the first, though most are older than 30 s
    # What the agents' spools deliver after the store is back, into windows minutes old, is counted
    # again as long after the store's return as a late sample of any window.
    write(es_samples, [sample(run_id, n, t0 + i * 1000, i, vmrss=100 + i) for n in NODES for i in range(300, 600)])
    now[0] += 20
    late = rollup.tick()
    assert late.documents == 3 * 30  # the 30 windows the spools filled
    got = rollup_docs(es_samples.url, target)
    assert sum(d["samples"] for d in got.values()) == 3 * 600
    now[0] += 31  # the hold ends RESAMPLE_S after the store came back: old windows are left alone again
    rollup.tick()
    assert rollup.hold_ms is None


def test_windows_the_store_refused_to_take_are_rolled_up_once_it_takes_them(es_samples):
    run_id, t0 = f"r-{uuid.uuid4().hex[:8]}", base_ms()
    target = rollup_index(es_samples.target)
    now = [t0 / 1000 + 40 + 3]
    rollup = Rollup(es_samples, source=es_samples.target, target=target, clock=lambda: now[0], resample_s=60)
    if rollup.index_of(t0) != rollup.index_of(t0 + 40_000):  # the windows in one day's index
        t0 -= 3_600_000
        now[0] -= 3600
    write(es_samples, [sample(run_id, n, t0 + i * 1000, i, vmrss=3) for n in NODES for i in range(40)])
    url, blocked = es_samples.url, rollup.index_of(t0)
    # their daily index refuses writes (403, as a user who may not write there would be refused)
    requests.put(f"{url}/{blocked}", json={"settings": {"index.blocks.write": True}}, timeout=30).raise_for_status()
    try:
        with pytest.raises(StoreDown):
            rollup.tick()
    finally:
        requests.put(f"{url}/{blocked}/_settings", json={"index.blocks.write": False}, timeout=30).raise_for_status()
    now[0] += 100  # later than the resample span: the windows are held, not forgotten
    rollup.tick()
    assert sum(d["samples"] for d in rollup_docs(url, target).values()) == 3 * 40


def test_a_node_whose_role_changes_within_a_window_has_a_document_per_role(es_samples):
    """An agent's last sample of a node that is gone may know no role ("other"): a series of its own,
    as InfluxDB's GROUP BY * keeps it, not an overwrite of the node's mean."""
    run_id, t0 = f"r-{uuid.uuid4().hex[:8]}", base_ms()
    docs = [sample(run_id, "n0", t0 + i * 1000, i, vmrss=10) for i in range(9)]
    docs.append({**sample(run_id, "n0", t0 + 9_000, 9, vmrss=90), "role": "other"})
    write(es_samples, docs)
    target = rollup_index(es_samples.target)
    Rollup(es_samples, source=es_samples.target, target=target).roll(t0, t0 + 10_000)
    got = rollup_docs(es_samples.url, target)
    assert {(d["role"], d["samples"], d["mean_vmrss_kb"]) for d in got.values()} == {
        ("merger", 9, 10),
        ("other", 1, 90),
    }


def test_no_samples_index_yet_is_nothing_to_do(stack):
    index = f"flowstat-samples-none{uuid.uuid4().hex[:8]}"
    rollup = Rollup(ElasticsearchWriter(stack["elasticsearch"].url, index), source=index, target=rollup_index(index))
    done = rollup.tick()
    assert (done.windows_counted, done.documents) == (0, 0)
    assert rollup.resume() is None


def test_a_restarted_rollup_resumes_after_its_last_window(es_samples):
    run_id, t0 = f"r-{uuid.uuid4().hex[:8]}", base_ms()
    write(es_samples, [sample(run_id, n, t0 + i * 1000, i, vmrss=1) for n in NODES for i in range(100)])
    target = rollup_index(es_samples.target)
    Rollup(es_samples, source=es_samples.target, target=target).roll(t0, t0 + 30_000)
    requests.post(f"{es_samples.url}/{target}-*/_refresh", timeout=30).raise_for_status()  # as a second later
    later = Rollup(es_samples, source=es_samples.target, target=target, clock=lambda: t0 / 1000 + 3600, resample_s=30)
    assert later.resume() == t0 + 20_000  # the last window written
    later.tick()
    got = rollup_docs(es_samples.url, target)
    assert sum(d["samples"] for d in got.values()) == 3 * 100  # windows 3-9 caught up, none twice


def test_replay_rolls_up_what_it_loads_of_its_run_alone(es_samples):
    """Another run's samples in its windows are left to their own rollup."""
    run_id, t0 = f"r-{uuid.uuid4().hex[:8]}", base_ms() + 3_000
    docs = [sample(run_id, n, t0 + i * 1000, i, vmrss=7) for n in NODES for i in range(15)]
    es_samples.write(es_samples.encode(docs + [sample("other", "n0", t0, 0, vmrss=9)]), len(docs) + 1)
    es_samples.loaded(t0 * 1_000_000, (t0 + 14_000) * 1_000_000, run_id)  # what replay calls once a run is loaded
    got = rollup_docs(es_samples.url, rollup_index(es_samples.target))
    assert {d["run_id"] for d in got.values()} == {run_id}
    assert sum(d["samples"] for d in got.values()) == len(docs)
    assert {d["time"] for d in got.values()} == {
        iso_utc_from_ms(window_of(t0)),
        iso_utc_from_ms(window_of(t0) + 10_000),
    }


def flowstat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flowstat", "rollup", *args], capture_output=True, text=True, timeout=120
    )


def test_the_command_rolls_a_run_up_and_names_what_is_wrong(es_samples):
    run_id, t0 = f"r-{uuid.uuid4().hex[:8]}", base_ms()
    other = sample("other", "n0", t0, 0, vmrss=9)  # another run of the same minutes: left to its own rollup
    write(es_samples, [sample(run_id, n, t0 + i * 1000, i, vmrss=1) for n in NODES for i in range(20)] + [other])
    url, index = es_samples.url, es_samples.target
    done = flowstat("--es", url, "--index", index, "--run", run_id, "--quiet")
    assert done.returncode == 0, done.stderr
    assert "6 rollup documents written" in done.stdout
    assert {d["run_id"] for d in rollup_docs(url, rollup_index(index)).values()} == {run_id}
    assert len(rollup_docs(url, rollup_index(index))) == 6
    none = flowstat("--es", url, "--index", index, "--run", "no-such-run")
    assert none.returncode == 2 and "holds no sample of run no-such-run" in none.stderr
    nothing = flowstat("--es", url, "--index", f"{index}-absent", "--run", run_id)
    assert nothing.returncode == 2 and f"holds no sample of run {run_id}" in nothing.stderr
    backwards = flowstat("--es", url, "--from", "2026-11-27T10:00:00Z", "--to", "2026-11-27T09:00:00Z")
    assert backwards.returncode == 2 and "is not after --from" in backwards.stderr
    alone = flowstat("--es", url, "--to", "2026-11-27T09:00:00Z")
    assert alone.returncode == 2 and "--to needs --from" in alone.stderr
    infinite = flowstat("--es", url, "--from", "inf")
    assert infinite.returncode == 2 and "'inf' is not a time" in infinite.stderr
    bad = flowstat("--es", url, "--index", index, "--from", "yesterday")
    assert bad.returncode == 2 and "'yesterday' is neither ISO 8601 nor epoch seconds" in bad.stderr
    naive = flowstat("--es", url, "--index", index, "--from", "2026-11-27T10:00:00")
    assert naive.returncode == 2 and "no time zone" in naive.stderr
    down = flowstat("--es", f"http://127.0.0.1:{free_port()}", "--from", "2026-11-27T10:00:00Z")
    assert down.returncode == 3 and "Elasticsearch at http://127.0.0.1:" in down.stderr


def test_the_live_rollup_rolls_samples_up_as_they_arrive_and_stops_on_sigterm(es_samples, tmp_path):
    import json
    import signal
    import time

    from support.agents import wait_until

    run_id, now_ms = f"r-{uuid.uuid4().hex[:8]}", int(time.time() * 1000)
    docs = [sample(run_id, n, now_ms - 25_000 + i * 1000, i, vmrss=5) for n in NODES for i in range(24)]
    write(es_samples, docs)
    status = tmp_path / "status.json"
    command = [sys.executable, "-m", "flowstat", "rollup", "--es", es_samples.url, "--index", es_samples.target]
    proc = subprocess.Popen([*command, "--status", str(status)], stderr=subprocess.PIPE, text=True)
    target = rollup_index(es_samples.target)
    try:

        def rolled() -> int:
            if not status.exists():
                return 0
            return sum(d["samples"] for d in rollup_docs(es_samples.url, target).values() if d["run_id"] == run_id)

        last_window_end = window_of(now_ms - 2_000) + EVERY_S * 1000  # of the last sample's window

        def said_done() -> bool:
            return status.exists() and json.loads(status.read_text())["rolled_up_until_ms"] >= last_window_end

        wait_until(
            lambda: said_done() and rolled() == len(docs),
            "the live rollup to average every sample, and say so",
            timeout=60,
            poll=1,
        )
        said = json.loads(status.read_text())
        assert said["rolled_up_until"] == iso_utc_from_ms(said["rolled_up_until_ms"]) and said["refused"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "flowstat rollup: stopped" in err
