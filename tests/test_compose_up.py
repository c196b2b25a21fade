"""docker-compose.yml, up for real: the users' file plus one override
(lab/stand-ins/docker-compose.stand-ins.yml) that only swaps images, puts every service
on the host network and leaves out what has no stand-in here (Kibana, Grafana), on the suite's own
Docker engine (lab/src/flowstat_lab/compose.py: its own sockets and data root, no bridge, run inside a
network namespace that holds only a loopback) with Compose v2.

In order, as a person would: scripts/new-env, the secrets gate, `up` with the prometheus profile
(every service healthy, every one-shot exited 0, scripts/compose-check all well, Prometheus's rule
groups loaded from dashboards/prometheus), the harness profile's runs in both
stores (with InfluxDB killed mid-run and restarted by its policy) and judged there by the verdict
services, an overload run's alert in the
inbox, replay from the host and from the harness container, down then up keeping the data, and
compose-check naming a stopped store. The images are built before (make compose-images); with
CI set, a missing engine fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import requests
import yaml

from flowstat.stores.influxdb import string_literal
from support.agents import wait_until
from support.common import ROOT, with_test_jvm
from support.compose import (
    COMPOSE_FILE,
    FLOWSTAT_SERVICES,
    HOSTNAME,
    LEFT_OUT,
    Project,
    ce,
    compose_config,
    engine_up,
    in_namespace,
    loopback_only,
    needs_engine,
    override_differences,
)
from support.compose import compose_v2 as compose_v2_binary

PROJECT = "flowstat-compose-test"
PY_AGENT, C_AGENT = "flowstat-agent-py", "flowstat-agent-c"
TOPOLOGIES = "/usr/local/share/flowstat/topologies"
SINKS = ["--sink", "http://telegraf:8186/write", "--sink", "tcp://logstash:5044?format=json"]  # the harness's own
PROFILES = ("harness", "prometheus")  # every optional profile of docker-compose.yml
PROMETHEUS = "http://127.0.0.1:9090"  # the prometheus profile's, on the stack's network

pytestmark = needs_engine


@pytest.fixture(scope="module")
def compose_v2() -> Path:
    return compose_v2_binary()


def test_the_override_only_swaps_images_sets_host_networking_and_leaves_out_what_has_no_stand_in(compose_v2):
    env = ROOT / ".env.example"
    base = compose_config(COMPOSE_FILE, env_file=env, profiles=PROFILES)
    merged = compose_config(COMPOSE_FILE, ce.OVERRIDE, env_file=env, profiles=PROFILES)
    assert {"harness", "prometheus"} <= set(merged["services"])
    assert override_differences(base, merged) == []
    # the default network, which a service without network_mode would join, is the host's: compose
    # can never make a bridge for one
    raw = yaml.safe_load(ce.OVERRIDE.read_text().replace("!reset", ""))
    assert raw["networks"] == {"default": {"name": "host", "external": True}}
    assert all(svc["network_mode"] == "host" for svc in merged["services"].values())
    # and the guard catches what it must: another key, a changed value, a port that stays
    broken = json.loads(json.dumps(merged))
    broken["services"]["influxdb"]["mem_limit"] = 99
    broken["services"]["telegraf"]["environment"]["FLOWSTAT_TELEGRAF_BUFFER"] = "1"
    broken["services"]["alerts"]["command"][2] = "127.0.0.1:9096"
    broken["services"]["prometheus"]["profiles"] = []  # started by a plain `up`
    broken["services"]["prometheus"]["volumes"] = [  # without its rule files
        v for v in broken["services"]["prometheus"]["volumes"] if v["target"] != "/etc/prometheus/rules"
    ]
    assert override_differences(base, broken) == [
        "alerts.command: "
        + json.dumps(base["services"]["alerts"]["command"])[:120]
        + " -> "
        + json.dumps(broken["services"]["alerts"]["command"])[:120],
        "influxdb.mem_limit: " + json.dumps(base["services"]["influxdb"]["mem_limit"]) + " -> 99",
        'prometheus.profiles: ["prometheus"] -> []',
        "prometheus.volumes: "
        + json.dumps(base["services"]["prometheus"]["volumes"])[:120]
        + " -> "
        + json.dumps(broken["services"]["prometheus"]["volumes"])[:120],
        "telegraf.environment.FLOWSTAT_TELEGRAF_BUFFER: '200000' -> '1'",
    ]
    # every server the stack runs listens on loopback: none binds 0.0.0.0 any longer
    assert "0.0.0.0" not in json.dumps(merged)
    # the images of the override are the ones the suite builds
    assert {s["image"] for n, s in merged["services"].items() if n not in FLOWSTAT_SERVICES} == set(ce.STANDIN.values())


# -- the stack -------------------------------------------------------------------------------------
class Stack(Project):
    """The compose project under test: compose commands, .env, the engine, the harness's runs."""

    def __init__(self, engine: ce.Engine, env_file: Path):
        super().__init__(engine, env_file, PROJECT, [COMPOSE_FILE, ce.OVERRIDE])

    def check(self, *extra: str) -> tuple[int, dict, str]:
        """scripts/compose-check --json, as a user runs it (with this project's options)."""
        out = subprocess.run(
            [
                str(ROOT / "scripts" / "compose-check"),
                "--json",
                *extra,
                "--env-file",
                str(self.env_file),
                "-f",
                str(COMPOSE_FILE),
                "-f",
                str(ce.OVERRIDE),
                "-p",
                PROJECT,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env={**self.engine.env, **HOSTNAME, "COMPOSE": f"{ce.compose_binary()} --project-directory {ROOT}"},
        )
        try:
            return out.returncode, json.loads(out.stdout), out.stderr
        except ValueError:
            raise AssertionError(f"compose-check: {out.stdout[-2000:]}\n{out.stderr[-2000:]}") from None

    def runs_dir(self) -> Path:
        """The harness-runs volume, read from the engine's data root."""
        return self.volume_dir("harness-runs")

    def new_run(self, before: set[str]) -> Path:
        made = [d for d in self.runs_dir().iterdir() if d.name not in before]
        assert len(made) == 1, f"runs made: {made}"
        return made[0]


def sample_lines(run_dir: Path) -> int:
    return (run_dir / "samples.ndjson").read_bytes().count(b"\n")


def wait_for_samples(run_dir: Path, more_than: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while sample_lines(run_dir) <= more_than:
        assert time.monotonic() < deadline, f"{run_dir.name}: {sample_lines(run_dir)} samples after {timeout_s} s"
        time.sleep(0.5)


def run_file_counts(run_dir: Path) -> dict:
    nodes, selfs, overloaded = 0, 0, set()
    for line in (run_dir / "samples.ndjson").read_text().splitlines():
        doc = json.loads(line)
        if "flowstat_agent" in doc:
            selfs += 1
        elif "node_id" in doc:
            nodes += 1
            if doc.get("send_buffer_overloaded") or doc.get("receive_buffer_overloaded"):
                overloaded.add(doc["node_id"])
    return {
        "nodes": nodes,
        "selfs": selfs,
        "overloaded": overloaded,
        "run": json.loads((run_dir / "run.json").read_text()),
    }


def c_agent_samples(run_dir: Path) -> int:
    """Node samples the C agent took and delivered, by its statistics file."""
    stats = json.loads((run_dir / "agent-c-stats.json").read_text())
    return stats["samples"]


def stored_verdicts(run_id: str, values: dict) -> dict[str, Counter]:
    """The run's verdicts each store holds, counted by flow (held_back, none, unknown), read as the
    alert "pipeline held back" reads them (ElastAlert2's user: flowstat-verdicts-*; Grafana's
    InfluxDB reader: flowstat_verdict), from inside the stack's network (the engine's namespace), with
    no proxy of this machine's environment."""

    def count() -> dict[str, Counter]:
        with requests.Session() as s:
            s.trust_env = False
            es = s.post(
                "http://127.0.0.1:9200/flowstat-verdicts-*/_search",
                json={"size": 0, "query": {"term": {"run_id": run_id}}, "aggs": {"flow": {"terms": {"field": "flow"}}}},
                auth=("flowstat_elastalert", values["ELASTALERT_ES_PASSWORD"]),
                timeout=10,
            )
            es.raise_for_status()
            influx = s.post(
                "http://127.0.0.1:8086/query",
                params={
                    "db": "flowstat",
                    "q": f'SELECT "flow" FROM "flowstat_verdict" WHERE "run_id" = {string_literal(run_id)}',
                },
                auth=(values["INFLUXDB_READER_USER"], values["INFLUXDB_READER_PASSWORD"]),
                timeout=10,
            )
            influx.raise_for_status()
        buckets = es.json().get("aggregations", {}).get("flow", {}).get("buckets", [])  # none before an index
        series = influx.json()["results"][0].get("series") or [{"values": []}]
        return {
            "elasticsearch": Counter({b["key"]: b["doc_count"] for b in buckets}),
            "influxdb": Counter(row[1] for row in series[0]["values"]),
        }

    with in_namespace(1) as ns:
        return ns.submit(count).result()


def profile_args(*profiles: str) -> list[str]:
    return [a for p in profiles or PROFILES for a in ("--profile", p)]


def prometheus_api(path: str) -> dict:
    """GET Prometheus's HTTP API from inside the stack's network (the engine's namespace), with no
    proxy of this machine's environment; its `data`."""

    def get() -> dict:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(PROMETHEUS + path, timeout=10) as answer:
            doc = json.load(answer)
        assert doc["status"] == "success", doc
        return doc["data"]

    with in_namespace(1) as ns:
        return ns.submit(get).result()


@pytest.fixture(scope="module")
def engine():
    """The suite's engine, images ready, started in its namespace; stopped by its pid at the end,
    after which the machine has exactly the interfaces and addresses it had before."""
    with engine_up() as e:
        yield e


def test_the_engine_makes_no_network_and_no_address_outside_loopback(engine):
    assert sorted(engine.networks()) == ["host", "none"]
    addresses = ce.netns_addresses()
    assert loopback_only(addresses), addresses
    # the stack's "host" network is the namespace, not the machine's: no interface of the machine in it
    assert "eth0" not in subprocess.run(["ip", "-n", ce.NETNS, "-br", "link"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def stack(engine, tmp_path_factory):
    env_file = tmp_path_factory.mktemp("compose") / ".env"
    s = Stack(engine, env_file)
    s(*profile_args(), "down", "-v", "--remove-orphans", check=False)  # what an interrupted run left
    yield s
    # the volumes go too: nothing to save, no reason to give a container more than 5 s
    s(*profile_args(), "down", "-v", "--remove-orphans", "--timeout", "5", check=False)


def test_the_secrets_gate_refuses_placeholders_and_a_short_secret_naming_each(stack):
    shutil.copy(ROOT / ".env.example", stack.env_file)
    out = stack("up", "-d", "--wait", check=False, timeout=300)
    assert out.returncode != 0
    log = stack("logs", "--no-color", "secrets").stdout
    for var in ("ELASTIC_PASSWORD", "KIBANA_ENCRYPTION_KEY", "INFLUXDB_ADMIN_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        assert f"{var} still holds .env.example's placeholder" in log, log
    ps = stack.ps()
    assert ps["secrets"]["ExitCode"] == 2
    for store in ("elasticsearch", "influxdb"):  # created, never started: no store took a placeholder
        assert stack.container(store)["State"]["StartedAt"].startswith("0001-01-01"), ps[store]
    stack("down", "-v")
    # scripts/new-env's secrets, one of them made short
    stack.env_file.unlink()
    made = subprocess.run([str(ROOT / "scripts" / "new-env"), str(stack.env_file)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    good = with_test_jvm(stack.env_file.read_text())
    stack.env_file.write_text(re.sub(r"(?m)^INFLUXDB_WRITER_PASSWORD=.*$", "INFLUXDB_WRITER_PASSWORD=short1", good))
    assert stack("up", "-d", "--wait", check=False, timeout=300).returncode != 0
    log = stack("logs", "--no-color", "secrets").stdout
    assert "INFLUXDB_WRITER_PASSWORD is 6 characters; 12 at least" in log, log
    assert "placeholder" not in log
    stack("down", "-v")
    stack.env_file.write_text(good)


def test_up_makes_every_service_healthy_and_every_one_shot_exit_0(stack):
    """With the optional `prometheus` profile too: it is healthy beside the rest, and has loaded
    every rule group of dashboards/prometheus from its read-only mount."""
    t0 = time.monotonic()
    stack(*profile_args("prometheus"), "up", "-d", "--wait", timeout=600)
    print(f"up: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    ps = stack.ps()
    for name in ("secrets", "setup"):
        assert (ps[name]["State"], ps[name]["ExitCode"]) == ("exited", 0), ps[name]
    for name in (
        "elasticsearch",
        "influxdb",
        "telegraf",
        "logstash",
        "rollup",
        "verdict",
        "verdict-influxdb",
        "alerts",
        "elastalert",
        "prometheus",
    ):
        assert (ps[name]["State"], ps[name]["Health"]) == ("running", "healthy"), ps[name]
    assert not set(ps) & LEFT_OUT
    # Prometheus: flowstat's rule groups, each from its file in the mounted folder, every rule loaded
    want = {}
    for path in sorted((ROOT / "dashboards" / "prometheus").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names = [r.get("alert") or r.get("record") for r in group["rules"]]
            want[group["name"]] = (f"/etc/prometheus/rules/{path.name}", names)
    got = {g["name"]: (g["file"], [r["name"] for r in g["rules"]]) for g in prometheus_api("/api/v1/rules")["groups"]}
    assert want and got == want
    assert [t["labels"]["job"] for t in prometheus_api("/api/v1/targets")["activeTargets"]] == ["prometheus"]
    # on the stack's loopback only
    listening = subprocess.run(
        ["nsenter", f"--net={ce.NAMESPACE.path}", "--", "ss", "-Hltn", "sport = :9090"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert [a for a in listening if a.endswith(":9090")] == ["127.0.0.1:9090"], listening
    assert "flowstat provision: done" in stack("logs", "--no-color", "setup").stdout
    code, report, err = stack.check()
    assert (code, report["problems"]) == (0, []), err
    assert all(report["users"].values()) and len(report["users"]) == 12


def arrived(got: dict, samples: dict, *agents: str) -> bool:
    """A store's counts of a run (compose-check's) hold these node samples (of ``agents`` alone, if
    named) and the run document, which the agents send after the last samples."""
    node_samples = got.get("node_samples") or {}
    if agents:
        node_samples = {a: n for a, n in node_samples.items() if a in agents}
    return node_samples == samples and got.get("run_document") is not None


def test_the_harness_profiles_runs_reach_both_stores_even_with_influxdb_killed_mid_run(stack):
    """The users' harness service, as compose ships it: both agents to Telegraf (InfluxDB) and to
    Logstash's input (the relay: Elasticsearch as flowstat_logstash). InfluxDB's process is killed
    with SIGKILL mid-run: its restart policy brings it back, Telegraf's buffer holds the samples
    meanwhile, and none is lost. `docker compose stop harness` ends the run in order."""
    before = {d.name for d in stack.runs_dir().iterdir()} if stack("ps", "-q", "harness").stdout.strip() else set()
    stack("--profile", "harness", "up", "-d", "harness")
    deadline = time.monotonic() + 90
    while not [d for d in stack.runs_dir().iterdir() if d.name not in before and (d / "samples.ndjson").exists()]:
        assert time.monotonic() < deadline, stack("logs", "--tail", "30", "harness", check=False).stdout
        time.sleep(1)
    (live,) = [d for d in stack.runs_dir().iterdir() if d.name not in before]
    wait_for_samples(live, more_than=50)  # the run is well under way before InfluxDB dies
    influx = stack.container("influxdb")
    os.kill(influx["State"]["Pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while stack.container("influxdb")["RestartCount"] < influx["RestartCount"] + 1:
        assert time.monotonic() < deadline, "InfluxDB was not restarted by its policy"
        time.sleep(0.5)
    stack.wait_healthy("influxdb", 90)
    wait_for_samples(live, more_than=sample_lines(live) + 35)  # and goes on after its restart
    stack("--profile", "harness", "stop", "harness", timeout=120)
    run = stack.new_run(before)
    counts = run_file_counts(run)
    assert counts["run"].get("finished") and counts["nodes"] > 50
    c_samples = c_agent_samples(run)
    want = {PY_AGENT: counts["nodes"], C_AGENT: c_samples}
    deadline = time.monotonic() + 60  # Telegraf flushes every second, the relay every half second
    while True:
        code, report, err = stack.check()
        got = report["runs"].get(run.name, {})
        if all(arrived(got.get(s, {}), want) for s in ("elasticsearch", "influxdb")):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(2)
    for store in ("elasticsearch", "influxdb"):
        assert got[store]["node_samples"] == {PY_AGENT: counts["nodes"], C_AGENT: c_samples}, (store, got, err)
        assert got[store]["run_document"] == {"finished": counts["run"]["finished"]}, (store, got)
        assert got[store]["self_samples"] >= counts["selfs"] > 0, (store, got)
    assert code == 0 and report["problems"] == [], report["problems"]
    # judged live by the verdict services, each in its own store (InfluxDB's restart included): the
    # verdicts the alert "pipeline held back" reads, Grafana's in InfluxDB and ElastAlert2's in
    # Elasticsearch; some judged along the run's edges (none or held_back: without the run's
    # document, or before a window holds enough samples, a verdict is unknown)
    verdicts: dict[str, Counter] = {}

    def judged() -> bool:
        verdicts.update(stored_verdicts(run.name, stack.values))
        return all(v["none"] + v["held_back"] for v in verdicts.values())

    try:
        wait_until(judged, f"verdicts of run {run.name} judged along its edges in both stores", timeout=60, poll=2)
    except AssertionError as exc:
        logs = stack("logs", "--no-color", "--tail", "20", "verdict", "verdict-influxdb", check=False).stdout
        raise AssertionError(f"{exc}: {verdicts}\n{logs}") from None
    stack.__dict__["harness_run"] = run


def test_an_overload_run_makes_elastalert_deliver_an_alert_to_the_inbox_naming_its_run_and_nodes(stack):
    before = {d.name for d in stack.runs_dir().iterdir()}
    stack(
        "--profile",
        "harness",
        "run",
        "--rm",
        "--no-deps",
        "harness",
        "run",
        f"{TOPOLOGIES}/demo-overload.yaml",
        *SINKS,
        timeout=180,
    )
    run = stack.new_run(before)
    counts = run_file_counts(run)
    assert counts["overloaded"], "the overload run overloaded no node"

    def alerted(report: dict) -> bool:  # the alert, and the run in both stores (the relay batches)
        got = report["runs"].get(run.name, {})
        return bool([a for a in report["alerts"]["alerts"] if a["run_id"] == run.name]) and all(
            arrived(got.get(s, {}), {PY_AGENT: counts["nodes"]}, PY_AGENT) for s in ("elasticsearch", "influxdb")
        )

    deadline = time.monotonic() + 120
    while True:
        code, report, err = stack.check()
        alerts = [a for a in report["alerts"]["alerts"] if a["run_id"] == run.name]
        if alerted(report) or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert alerts, f"no alert for {run.name} in the inbox after 120 s: {report}"
    assert {a["source"] for a in alerts} == {"elastalert"}
    assert {a["uid"] for a in alerts} >= {"flowstat-buffer-overload"}
    overload = [a for a in alerts if a["uid"] == "flowstat-buffer-overload"]
    assert {a["node_id"] for a in overload} <= counts["overloaded"] and overload[0]["node_id"], overload
    # the run's samples and documents are in both stores too
    got = report["runs"][run.name]
    for store in ("elasticsearch", "influxdb"):
        assert got[store]["node_samples"][PY_AGENT] == counts["nodes"], (store, got)
        assert got[store]["run_document"] == {"finished": counts["run"]["finished"]}


def _replay_env(values: dict) -> dict:
    """The replay users' credentials from .env, as docs/compose.md's recipe passes them."""
    return {
        "FLOWSTAT_ES_USER": "flowstat_agent",
        "FLOWSTAT_ES_PASSWORD": values["AGENT_ES_PASSWORD"],
        "FLOWSTAT_INFLUX_USER": values["INFLUXDB_REPLAY_USER"],
        "FLOWSTAT_INFLUX_PASSWORD": values["INFLUXDB_REPLAY_PASSWORD"],
    }


def test_replay_from_the_harness_container_and_from_the_host_with_envs_credentials(stack, tmp_path):
    values = stack.values
    # a run in the volume that no store has seen (no sinks), replayed by docs/compose.md's recipe
    before = {d.name for d in stack.runs_dir().iterdir()}
    stack(
        *("--profile", "harness", "run", "--rm", "--no-deps", "harness", "run", f"{TOPOLOGIES}/smoke.yaml"),
        *("--duration", "3"),
        timeout=120,
    )
    in_volume = stack.new_run(before)
    out = stack(
        *("--profile", "harness", "run", "--rm", "--no-deps", "-e", "FLOWSTAT_ES_USER", "-e", "FLOWSTAT_ES_PASSWORD"),
        *("-e", "FLOWSTAT_INFLUX_USER", "-e", "FLOWSTAT_INFLUX_PASSWORD", "harness", "replay"),
        *(f"runs/{in_volume.name}", "--es", "http://elasticsearch:9200", "--influx", "http://influxdb:8086"),
        env=_replay_env(values),
        timeout=180,
    )
    assert values["AGENT_ES_PASSWORD"] not in out.stdout + out.stderr
    # a run made on the host, replayed from the host into the published ports (the stack's
    # network is the engine's namespace: the host's flowstat enters it)
    host_runs = tmp_path / "runs"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "run",
            str(ROOT / "benchmark-harness/topologies/smoke.yaml"),
            "--duration",
            "3",
            "--runs-dir",
            str(host_runs),
            "--no-c-agent",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    (on_host,) = host_runs.iterdir()
    replayed = subprocess.run(
        [
            "nsenter",
            f"--net=/run/netns/{ce.NETNS}",
            "--",
            sys.executable,
            "-m",
            "flowstat.cli",
            "replay",
            str(on_host),
            "--es",
            "http://127.0.0.1:9200",
            "--influx",
            "http://127.0.0.1:8086",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **_replay_env(values)},
    )
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr[-2000:]
    # both, counted in the stores against their run files (compose-check reads the volume; the
    # host's run is counted by the same queries)
    code, report, err = stack.check()
    got = report["runs"][in_volume.name]
    counts = run_file_counts(in_volume)
    for store in ("elasticsearch", "influxdb"):
        assert got[store]["node_samples"] == {PY_AGENT: counts["nodes"]}, (
            store,
            got,
        )  # the run file: the Python agent's
        assert got[store]["self_samples"] == counts["selfs"], (store, got)
        assert got[store]["run_document"] == {"finished": counts["run"]["finished"]}
    host_counts = run_file_counts(on_host)
    code, report, err = stack.check("--run", on_host.name)
    got = report["runs"][on_host.name]
    assert got["file"] is None  # not in the volume: counted by its id
    for store in ("elasticsearch", "influxdb"):
        assert got[store]["node_samples"] == {PY_AGENT: host_counts["nodes"]}, (store, got)
        assert got[store]["self_samples"] == host_counts["selfs"], (store, got)
        assert got[store]["run_document"] == {"finished": host_counts["run"]["finished"]}
    assert code == 0 and report["problems"] == [], report["problems"]


def test_down_then_up_keeps_the_data_and_the_setup_converges_again(stack):
    _, before, _ = stack.check()
    stack(*profile_args(), "down", "--timeout", "30")
    assert not stack.ps()
    stack("up", "-d", "--wait", timeout=600)
    assert "flowstat provision: done" in stack("logs", "--no-color", "setup").stdout
    code, after, err = stack.check()
    assert (code, after["problems"]) == (0, []), err
    for run_id, run in before["runs"].items():
        for store in ("elasticsearch", "influxdb"):
            assert after["runs"][run_id][store]["node_samples"] == run[store]["node_samples"], (run_id, store)
            assert after["runs"][run_id][store]["run_document"] == run[store]["run_document"]
    assert len(after["alerts"]["alerts"]) >= len(before["alerts"]["alerts"]) > 0  # the inbox's volume too


def test_compose_check_names_a_store_that_is_down(stack):
    stack("stop", "influxdb")
    code, report, _ = stack.check()
    assert code == 1
    assert any(p.startswith("influxdb: exited") for p in report["problems"]), report["problems"]
    assert any("InfluxDB at http://influxdb:8086 does not answer" in p for p in report["problems"]), report["problems"]
