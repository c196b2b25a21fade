"""Every client of a store against the secured stores (tests/support/secured_stack.py: Elasticsearch with
security and TLS on, InfluxDB with authentication on, provisioned by flowstat provision): each
writes as its least-privileged user; a wrong password, a user without the privilege, an expired
API key and an untrusted certificate each give the message of docs/security.md, and what the
agents kept meanwhile is delivered, once, when the credentials are fixed. And no secret of these
tests shows in any argv, log line or file flowstat writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from support.agents import sleeper
from support.common import C_AGENT, PYTHON_AGENT, TOPOLOGIES

pytestmark = pytest.mark.integration
SAMPLES = 6  # rounds an agent takes per case: 6 samples of one target


# -- who logs in how ----------------------------------------------------------------------------
def es_env(stack, case: str) -> dict[str, str]:
    """The credentials of a case, as the environment gives them (the CA file included unless the
    case is the certificate)."""
    user, password = stack.es_user("agent")
    env = {"FLOWSTAT_ES_CA_FILE": str(stack.ca_file)}
    if case == "good":
        env.update(FLOWSTAT_ES_USER=user, FLOWSTAT_ES_PASSWORD=password)
    elif case == "wrong password":
        env.update(FLOWSTAT_ES_USER=user, FLOWSTAT_ES_PASSWORD=password + "-not")
    elif case == "no privilege":
        env.update(zip(("FLOWSTAT_ES_USER", "FLOWSTAT_ES_PASSWORD"), stack.es_user("grafana"), strict=False))
    elif case == "expired API key":
        key = stack.api_key(f"expiring-{time.monotonic_ns()}", expiration="1s")
        time.sleep(2)  # the key's life, which the server counts: nothing else to wait on
        env["FLOWSTAT_ES_API_KEY"] = key["encoded"]
    elif case == "untrusted certificate":
        env = {"FLOWSTAT_ES_USER": user, "FLOWSTAT_ES_PASSWORD": password}
    return env


def es_said(stack, case: str, shown: str | None = None) -> re.Pattern:
    """The words a client must say for the case (docs/security.md), naming the store as ``shown``
    (an agent: its sink URL; replay: the store's URL)."""
    host, at = re.escape(stack.es_url.split("://")[1]), re.escape(shown or stack.es_url)
    return re.compile(
        {
            "wrong password": rf"authentication failed as flowstat_agent at {at} \(set FLOWSTAT_ES_USER and "
            rf"FLOWSTAT_ES_PASSWORD, or FLOWSTAT_ES_API_KEY\): unable to authenticate user",
            "no privilege": rf"flowstat_grafana may not write flowstat-samples-\d{{4}}\.\d\d\.\d\d at {at}: action "
            rf"\[indices:data/write/bulk",
            "expired API key": rf"authentication failed with the API key \(FLOWSTAT_ES_API_KEY\) at {at} .*api key is "
            rf"expired",
            "untrusted certificate": rf"TLS: the certificate of {host} is not trusted "
            rf"\(set FLOWSTAT_ES_CA_FILE to the CA that signed it\)",
        }[case]
    )


ES_CASES = ["wrong password", "no privilege", "expired API key", "untrusted certificate"]


def base_env() -> dict[str, str]:
    """The environment of a client: nothing of this process's but what every program needs."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
    }


def es_count(stack, run_id: str, index: str = "flowstat-samples*") -> int:
    stack.es("POST", f"/{index}/_refresh", "elastic")
    resp = stack.es("GET", f"/{index}/_count", "elastic", params={"q": f"run_id:{run_id}"})
    return resp.json()["count"] if resp.status_code == 200 else 0


# -- the Python agent ------------------------------------------------------------------------------
def run_agent(command: list[str], sink: str, env: dict, spool: Path, run_id: str, target: int) -> tuple[dict, str]:
    stats = spool.parent / f"stats-{run_id}-{time.monotonic_ns()}.json"
    out = subprocess.run(
        [
            *command,
            "--pid",
            str(target),
            "--run-id",
            run_id,
            "--count",
            str(SAMPLES),
            "--interval",
            "0.2",
            "--self-interval",
            "0",
            "--drain-timeout",
            "0",
            "--sink",
            sink,
            "--spool-dir",
            str(spool),
            "--stats",
            str(stats),
            "--quiet",
        ],
        env={**base_env(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(stats.read_text()), out.stderr


def es_seqs(stack, run_id: str) -> list[int]:
    stack.es("POST", "/flowstat-samples*/_refresh", "elastic")
    hits = stack.es(
        "POST",
        "/flowstat-samples*/_search",
        "elastic",
        json={"size": 1000, "query": {"term": {"run_id": run_id}}, "_source": ["seq"]},
    ).json()["hits"]["hits"]
    return sorted(h["_source"]["seq"] for h in hits)


@pytest.mark.parametrize("case", ES_CASES)
def test_an_agent_is_refused_by_name_keeps_the_samples_and_delivers_them_once_fixed(
    secured_stack, tmp_path, agent_command, case
):
    """Both agents: refused, said once, spooled; started again with good credentials, the spool
    goes first, and every sample of both runs is stored once."""
    stack = secured_stack
    sink = f"elasticsearch+https://{stack.es_url.split('://')[1]}/flowstat-samples"
    run_id = f"{'c' if agent_command == [str(C_AGENT)] else 'py'}-{case.replace(' ', '-')}-{time.monotonic_ns()}"
    target = sleeper()
    try:
        stats, err = run_agent(agent_command, sink, es_env(stack, case), tmp_path / "spool", run_id, target.pid)
        assert len(es_said(stack, case, sink).findall(err)) == 1, err  # said once, not at every retry
        assert stats["sinks"][sink]["delivered"] == 0 and stats["sinks"][sink]["spooled_samples"] == SAMPLES
        assert es_count(stack, run_id) == 0
        stats, err = run_agent(
            agent_command, sink, es_env(stack, "good"), tmp_path / "spool", f"{run_id}-next", target.pid
        )
        assert not es_said(stack, case, sink).search(err), err
        assert stats["sinks"][sink]["spooled_samples"] == 0
        # the spooled ones (sent first), then the new: each once
        assert es_seqs(stack, run_id) == es_seqs(stack, f"{run_id}-next") == list(range(SAMPLES))
    finally:
        target.kill()


def test_an_agent_writes_influxdb_as_the_writer_and_names_a_wrong_password_or_a_reader(
    secured_stack, tmp_path, agent_command
):
    stack = secured_stack
    sink = f"influxdb://{stack.influx_url.split('://')[1]}/flowstat"
    writer, reader = stack.influx_user("writer"), stack.influx_user("reader")
    good = {"FLOWSTAT_INFLUX_USER": writer[0], "FLOWSTAT_INFLUX_PASSWORD": writer[1]}
    target = sleeper()
    try:
        for (user, password), said in (
            ((writer[0], writer[1] + "-not"), f"authentication failed as {writer[0]} at {sink}"),
            (reader, f"{reader[0]} may not write flowstat at {sink}"),
        ):
            run_id = f"influx-{user}-{time.monotonic_ns()}"
            env = {"FLOWSTAT_INFLUX_USER": user, "FLOWSTAT_INFLUX_PASSWORD": password}
            stats, err = run_agent(agent_command, sink, env, tmp_path / run_id, run_id, target.pid)
            assert err.count(said) == 1 and stats["sinks"][sink]["spooled_samples"] == SAMPLES, err
            stats, err = run_agent(agent_command, sink, good, tmp_path / run_id, f"{run_id}-next", target.pid)
            assert stats["sinks"][sink]["spooled_samples"] == 0, err
            for run in (run_id, f"{run_id}-next"):
                rows = stack.influx_query(
                    f'SELECT "seq" FROM "flowstat_node" WHERE "run_id" = \'{run}\'', "reader"
                ).json()["results"][0]["series"][0]["values"]
                assert sorted(seq for _, seq in rows) == list(range(SAMPLES))
    finally:
        target.kill()


# -- replay -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> Path:
    """A small run file of 20 samples of two nodes, a minute ago."""
    from flowstat.timeutil import iso_utc_ms

    d = tmp_path_factory.mktemp("replayed") / f"secured-replay-{time.monotonic_ns()}"
    d.mkdir()
    t0, run_id = time.time() - 60, d.name
    lines = [{"flowstat_run": {"run_id": run_id, "started": iso_utc_ms(t0)}}]
    lines += [
        {
            "time": iso_utc_ms(t0 + i // 2),
            "run_id": run_id,
            "host": "h",
            "node_id": f"n{i % 2}",
            "role": "merger",
            "agent": "flowstat-agent-py",
            "seq": i // 2,
            "pid": 10 + i % 2,
            "node_state": "RUNNING",
            "vmrss_kb": 1000 + i,
        }
        for i in range(20)
    ]
    (d / "samples.ndjson").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def replay(stack, run_dir: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "replay",
            str(run_dir),
            "--es",
            stack.es_url,
            "--influx",
            stack.influx_url,
            "--quiet",
        ],
        env={**base_env(), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def influx_env(stack, who: str = "replay", wrong: bool = False) -> dict[str, str]:
    user, password = stack.influx_user(who)
    return {"FLOWSTAT_INFLUX_USER": user, "FLOWSTAT_INFLUX_PASSWORD": password + ("-not" if wrong else "")}


@pytest.mark.parametrize("case", ES_CASES)
def test_replay_is_refused_by_name_at_once_and_loads_everything_once_fixed(secured_stack, run_file, case):
    stack = secured_stack
    out = replay(stack, run_file, {**es_env(stack, case), **influx_env(stack)})
    assert out.returncode == 2 and es_said(stack, case).search(out.stderr), out.stderr
    assert "gave up after" not in out.stderr  # at once: waiting cannot change who we are


def test_replay_names_an_influxdb_user_that_may_not_roll_up_and_loads_as_the_replay_user(secured_stack, run_file):
    stack = secured_stack
    writer = stack.influx_user("writer")[0]
    out = replay(stack, run_file, {**es_env(stack, "good"), **influx_env(stack, "writer")})
    assert out.returncode == 2 and f"{writer} may not run 'SELECT mean(*) INTO" in out.stderr, out.stderr
    assert "requires READ on flowstat" in out.stderr
    out = replay(stack, run_file, {**es_env(stack, "good"), **influx_env(stack, wrong=True)})
    assert out.returncode == 2 and f"authentication failed as {stack.influx_user('replay')[0]}" in out.stderr
    out = replay(stack, run_file, {**es_env(stack, "good"), **influx_env(stack)})
    assert out.returncode == 0, out.stderr
    assert es_count(stack, run_file.name) == 20
    stack.es("POST", "/flowstat-runs/_refresh", "elastic")
    assert stack.es("GET", f"/flowstat-runs/_doc/{run_file.name}", "grafana").json()["found"]
    rows = stack.influx_query(
        f'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_file.name}\'', "reader"
    ).json()["results"][0]["series"][0]["values"]
    assert rows[0][1] == 20


# -- campaign --replay --------------------------------------------------------------------------------
def test_a_campaign_refuses_to_start_with_credentials_that_fail_and_replays_as_the_least_privileged_users(
    secured_stack, tmp_path
):
    stack = secured_stack
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "campaign": "secured-tiny",
                "title": "two producers, replayed into the secured stores",
                "duration": 2,
                "topology": {
                    "object": {"type": "TH1F", "size": "1kB"},
                    "producers": {"count": 2, "rate": 50},
                    "mergers": 1,
                },
                "sweep": {"parameter": "buffer_size", "label": "buffer", "values": [100]},
            }
        )
    )
    command = [
        sys.executable,
        "-m",
        "flowstat.cli",
        "campaign",
        str(spec),
        "--out",
        str(tmp_path / "out"),
        "--quiet",
        "--replay",
        "--es",
        stack.es_url,
        "--influx",
        stack.influx_url,
    ]
    out = subprocess.run(
        command,
        env={**base_env(), **es_env(stack, "wrong password"), **influx_env(stack)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        out.returncode == 2 and es_said(stack, "wrong password").search(out.stderr) and "nothing was run" in out.stderr
    )
    assert not (tmp_path / "out").exists()
    out = subprocess.run(
        command,
        env={**base_env(), **es_env(stack, "good"), **influx_env(stack)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    run_dir = next((tmp_path / "out").glob("runs/*/samples.ndjson")).parent
    recorded = sum(1 for line in (run_dir / "samples.ndjson").open() if '"node_id"' in line)
    assert recorded > 0 and es_count(stack, run_dir.name) == recorded
    rows = stack.influx_query(
        f'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_dir.name}\'', "reader"
    ).json()["results"][0]["series"][0]["values"]
    assert rows[0][1] == recorded


# -- no secret anywhere -------------------------------------------------------------------------------
def traced(command: list[str], env: dict, log: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``command`` under strace: every program it and its children execute, with its whole argv, in ``log``."""
    return subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=execve", "-s", "65536", "-o", str(log), *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def found_in(secrets: list[str], texts: dict[str, str]) -> list[tuple[str, str]]:
    return [(where, s[:4] + "...") for where, text in texts.items() for s in secrets if s in text]


def test_no_secret_shows_in_any_argv_log_line_or_file_flowstat_writes(secured_stack, tmp_path):
    """A run shipping to both secured stores with its credentials in a file, an agent and a replay
    refused with a wrong password, a spool flushed: every program executed (strace: argv), every
    line printed, every file written under the runs and spool folders, searched for every password
    and key of the test."""
    stack = secured_stack
    user, password = stack.es_user("agent")
    writer = stack.influx_user("writer")
    wrong = password + "-not"
    key = stack.api_key(f"grep-{time.monotonic_ns()}")["encoded"]
    creds = tmp_path / "credentials"
    creds.write_text(
        f"# the run's stores\nFLOWSTAT_ES_USER={user}\nFLOWSTAT_ES_PASSWORD={password}\n"
        f"FLOWSTAT_INFLUX_USER={writer[0]}\nFLOWSTAT_INFLUX_PASSWORD={writer[1]}\n"
    )
    creds.chmod(0o600)
    runs, traces, printed = tmp_path / "runs", [], {}
    env = {**base_env(), "FLOWSTAT_ES_CA_FILE": str(stack.ca_file)}
    sinks = [
        "--sink",
        f"elasticsearch+https://{stack.es_url.split('://')[1]}/flowstat-samples",
        "--sink",
        f"influxdb://{stack.influx_url.split('://')[1]}/flowstat",
    ]
    steps = {
        "run": [
            sys.executable,
            "-m",
            "flowstat.cli",
            "run",
            str(TOPOLOGIES / "smoke.yaml"),
            "--duration",
            "3",
            "--run-id",
            "grep",
            "--runs-dir",
            str(runs),
            "--credentials",
            str(creds),
            *sinks,
        ],
        "agent refused": [
            *PYTHON_AGENT,
            "--pattern",
            "^sleep 600$",
            "--count",
            "3",
            "--interval",
            "0.2",
            "--spool-dir",
            str(runs / "refused-spool"),
            "--drain-timeout",
            "0",
            *sinks,
        ],
        "flush": [*PYTHON_AGENT, "--flush-spool", str(runs / "refused-spool"), "--credentials", str(creds)],
        "replay refused": [sys.executable, "-m", "flowstat.cli", "replay", str(runs / "grep"), "--es", stack.es_url],
        "replay with a key": [sys.executable, "-m", "flowstat.cli", "replay", str(runs / "grep"), "--es", stack.es_url],
    }
    step_env = {
        "agent refused": {
            "FLOWSTAT_ES_USER": user,
            "FLOWSTAT_ES_PASSWORD": wrong,
            "FLOWSTAT_INFLUX_USER": writer[0],
            "FLOWSTAT_INFLUX_PASSWORD": wrong,
        },
        "replay refused": {"FLOWSTAT_ES_USER": user, "FLOWSTAT_ES_PASSWORD": wrong},
        "replay with a key": {"FLOWSTAT_ES_API_KEY": key},
    }
    target = subprocess.Popen(["sleep", "600"])
    try:
        for name, command in steps.items():
            if name == "agent refused" and C_AGENT.exists():  # the C agent too, the same way
                c_out = traced(
                    [
                        str(C_AGENT),
                        *command[len(PYTHON_AGENT) : len(command) - 6],
                        "--spool-dir",
                        str(runs / "c-spool"),
                        *sinks,
                    ],
                    {**env, **step_env[name]},
                    tmp_path / "strace-c.log",
                )
                printed["c agent refused"] = c_out.stdout + c_out.stderr
                traces.append(tmp_path / "strace-c.log")
            log = tmp_path / f"strace-{len(traces)}.log"
            out = traced(command, {**env, **step_env.get(name, {})}, log)
            printed[name] = out.stdout + out.stderr
            traces.append(log)
            if name in ("run", "flush", "replay with a key"):
                assert out.returncode == 0, (name, out.stderr[-3000:])
            else:
                assert "authentication failed as flowstat_agent" in printed[name], (name, printed[name][-3000:])
    finally:
        target.kill()
    assert es_count(stack, "grep") > 0  # the run did ship, with the file's credentials
    written = {str(p): p.read_bytes().decode("utf-8", "replace") for p in runs.rglob("*") if p.is_file()}
    argv = {str(t): "\n".join(re.findall(r'execve\("[^"]*", (\[.*?\]), ', t.read_text())) for t in traces}
    assert sum(a.count("execve") + a.count("[") for a in argv.values()) > 5  # the traces hold every exec
    assert any("flowstat.agent" in a for a in argv.values()) and any("--send-run" in a for a in argv.values())
    secrets = [password, wrong, writer[1], key, key.split(":")[0]]
    assert not found_in(secrets, {**printed, **written, **argv})
    assert len(written) > 10  # logs, run file, run document, summary, stats, spool batches
