"""The secured stack, for real: Elasticsearch (the integ-test build) with security and TLS on and
InfluxDB with authentication on, provisioned by `flowstat provision` (conftest.py's
`secured_stack`, one start for the session). Each user provision makes can do what its client
must, and is refused (403) what it must not; API keys work until they expire or are invalidated;
HTTPS is verified against the stack's CA."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from urllib.parse import quote

import pytest
import requests

from flowstat import provision
from flowstat.stores import StoreAuth, StoreAuthError
from flowstat.stores import elasticsearch as es_store
from flowstat.stores import influxdb as influx_store
from flowstat.timeutil import iso_utc_ms


def sample(run_id: str, seq: int = 0, t: float | None = None) -> dict:
    return {
        "time": iso_utc_ms((t or time.time()) + seq),
        "run_id": run_id,
        "host": "h",
        "node_id": "producer-0",
        "role": "producer",
        "agent": "flowstat-agent-py",
        "seq": seq,
        "pid": 4242,
        "node_state": "RUNNING",
        "send_buffer_overloaded": False,
    }


def es_writer(s, index: str, who: str | None = None, api_key: str | None = None) -> es_store.ElasticsearchWriter:
    """flowstat's own Elasticsearch writer (what the agents and replay write with), logged in."""
    user, password = s.es_user(who) if who else (None, None)
    auth = StoreAuth("FLOWSTAT_ES", "API_KEY", "ApiKey", user, password, api_key, str(s.ca_file))
    return es_store.ElasticsearchWriter(s.es_url, index, auth=auth)


def write_sample(s, index: str, **login) -> tuple[int, list[str]]:
    """(samples stored, why not): the store refusing who writes is said, not raised."""
    writer = es_writer(s, index, **login)
    try:
        out = writer.post(writer.encode([sample(f"sec-{uuid.uuid4().hex[:8]}")]), 1)
        return out.accepted, out.reasons
    except StoreAuthError as exc:
        return 0, [str(exc)]
    finally:
        writer.close()


def index_of_elastic(s, prefix: str) -> str:
    """An index holding one sample, written by elastic and searchable at once."""
    index = f"{prefix}-{uuid.uuid4().hex[:8]}"
    resp = s.es("PUT", f"/{index}/_doc/1?refresh=true", "elastic", json=sample("by-elastic"))
    assert resp.status_code == 201, resp.text
    return index


def security_state(s) -> dict:
    """What provision sets up, as the servers tell it (passwords aside)."""
    roles = s.es("GET", "/_security/role/" + ",".join(provision.ROLES), "elastic").json()
    users = s.es("GET", "/_security/user/" + ",".join(u.name for u in provision.USERS), "elastic").json()
    influx_users = s.influx_query("SHOW USERS", db=None).json()["results"][0]["series"][0]["values"]
    grants = {
        u: s.influx_query(f'SHOW GRANTS FOR "{u}"', db=None).json()["results"][0]["series"][0]["values"]
        for u, admin in influx_users
        if not admin
    }
    return {
        "roles": roles,
        "users": {n: (u["roles"], u["enabled"]) for n, u in users.items()},
        "influx": sorted(map(tuple, influx_users)),
        "grants": grants,
    }


# -- provision ------------------------------------------------------------------------------------
def test_provision_converges_and_a_second_run_changes_nothing(secured_stack):
    s = secured_stack
    before = security_state(s)  # after the fixture's own run
    for _ in range(2):
        out = s.provision()
        assert out.returncode == 0, out.stderr
        assert "PUT /_security/user/flowstat_agent" in out.stdout
        assert 'GRANT ALL ON "flowstat" TO "replay"' in out.stdout
    assert security_state(s) == before
    assert set(before["roles"]) == set(provision.ROLES)
    assert before["users"] == {u.name: (list(u.roles), True) for u in provision.USERS}
    assert before["grants"] == {
        "telegraf": [["flowstat", "WRITE"]],
        "grafana": [["flowstat", "READ"]],
        "replay": [["flowstat", "ALL PRIVILEGES"]],
        "verdict": [["flowstat", "ALL PRIVILEGES"]],
    }
    for who in ("logstash", "agent", "grafana", "elastalert", "rollup", "verdict"):  # each logs in, again
        assert s.es("GET", "/_security/_authenticate", who).status_code == 200, who


# -- each Elasticsearch user: what it must do, and no more ----------------------------------------
def test_no_credentials_or_a_wrong_password_answer_401(secured_stack):
    s = secured_stack
    anonymous = s.es("GET", "/_cluster/health")
    assert anonymous.status_code == 401 and "missing authentication credentials" in anonymous.text
    with s.es_session() as session:
        wrong = session.get(
            f"{s.es_url}/_cluster/health",
            auth=("flowstat_agent", "not-its-password"),
            timeout=30,
            verify=session.verify,
        )
    assert wrong.status_code == 401 and "unable to authenticate user [flowstat_agent]" in wrong.text


@pytest.mark.parametrize("who", ["agent", "logstash"])
def test_the_writers_write_flowstats_indices_and_nothing_else(secured_stack, who):
    s = secured_stack
    user = s.es_user(who)[0]
    assert s.es("GET", "/_security/_authenticate", who).json()["roles"] == ["flowstat_writer"]
    for prefix in ("flowstat-samples", "flowstat-runs-probe", "flowstat-agents-probe"):
        index = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if prefix == "flowstat-samples":  # the real writer, as the agents and replay use it
            assert write_sample(s, index, who=who) == (1, [])
        else:  # a new index of each pattern, made by its first document
            resp = s.es("PUT", f"/{index}/_doc/x", who, json={})
            assert resp.status_code in (201, 400), resp.text  # 400: the strict mapping; not a 403
            assert "security_exception" not in resp.text
    mine = index_of_elastic(s, "flowstat-samples")
    other = index_of_elastic(s, "other")
    refused = {
        "search flowstat": s.es("GET", f"/{mine}/_search", who),
        "read a document": s.es("GET", f"/{mine}/_doc/1", who),
        "delete a document": s.es("DELETE", f"/{mine}/_doc/1", who),
        "delete the index": s.es("DELETE", f"/{mine}", who),
        "write elsewhere": s.es("PUT", f"/{other}/_doc/2", who, json={"x": 1}),
        "read elsewhere": s.es("GET", f"/{other}/_search", who),
        "make a user": s.es("PUT", "/_security/user/intruder", who, json={"password": "x" * 12, "roles": []}),
    }
    for what, resp in refused.items():
        assert resp.status_code == 403, (what, resp.status_code, resp.text[:300])
        assert f"for user [{user}]" in resp.text, (what, resp.text[:300])
    assert write_sample(s, other, who=who)[0] == 0  # the writer says so too: refused, not stored


@pytest.mark.parametrize("who", ["grafana", "elastalert"])
def test_the_readers_read_and_write_nothing_of_flowstats(secured_stack, who):
    s = secured_stack
    user = s.es_user(who)[0]
    index = index_of_elastic(s, "flowstat-samples")
    found = s.es("GET", f"/{index}/_search", who)
    assert found.status_code == 200 and found.json()["hits"]["total"]["value"] == 1
    assert s.es("GET", f"/{index}/_mapping", who).status_code == 200  # view_index_metadata
    assert s.es("GET", "/_cluster/health", who).status_code == 200  # monitor
    refused = {
        "write": s.es("PUT", f"/{index}/_doc/2", who, json=sample("r")),
        "delete": s.es("DELETE", f"/{index}/_doc/1", who),
        "read elsewhere": s.es("GET", f"/{index_of_elastic(s, 'other')}/_search", who),
    }
    for what, resp in refused.items():
        assert resp.status_code == 403 and f"for user [{user}]" in resp.text, (what, resp.text[:300])
    assert write_sample(s, f"flowstat-samples-{uuid.uuid4().hex[:8]}", who=who)[0] == 0
    # ElastAlert2 keeps its state in indices of its own; Grafana may not write them either
    state = s.es("PUT", f"/flowstat-elastalert_status-{uuid.uuid4().hex[:8]}/_doc/1", who, json={"rule_name": "r"})
    assert state.status_code == (201 if who == "elastalert" else 403), state.text[:300]


# -- the verdict service's users: the real `flowstat verdict`, logged in as compose logs it in --------
def verdict_samples(run_id: str, t0: float) -> list[dict]:
    """20 s of a producer feeding a merger, a sample a second each: what a verdict is judged on."""
    out = []
    for seq in range(20):
        for node, role, busy in (("producer-0", "producer", 0.3), ("merger-0", "merger", 0.5)):
            out.append(
                {
                    **sample(run_id, seq, t0),
                    "node_id": node,
                    "role": role,
                    "busy_ratio": busy,
                    "backpressured_ratio": 0.0,
                    "idle_ratio": 1 - busy,
                    "input_latency_p50_ms": 1.0,
                    "objects_sent": 50 * seq,
                    "objects_received": 50 * seq,
                }
            )
    return out


def verdict_run_document(run_id: str, started: float) -> dict:
    """The run's document, holding its one edge: what the verdicts are judged along."""
    return {
        "run_id": run_id,
        "label": f"{run_id} | recorded on h",
        "started": iso_utc_ms(started),
        "edges": [{"from": "producer-0", "to": "merger-0"}],
    }


def judge_run(s, store: str, run_id: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`flowstat verdict --run RUN_ID` on one store, with ``env``'s credentials and nothing else of
    this process's environment."""
    url = {"--es": s.es_url, "--influx": s.influx_url}[store]
    return subprocess.run(
        [sys.executable, "-m", "flowstat.cli", "verdict", store, url, *args, "--run", run_id, "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/root"),
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
            **env,
        },
    )


def write_judged_run(writer, run: str, documents: int) -> None:
    """A run of a minute ago to judge, its samples and run document, written (``documents``: what the
    store counts of them) and the writer closed."""
    try:
        body = writer.encode(verdict_samples(run, time.time() - 60))
        body += writer.encode_run(verdict_run_document(run, time.time() - 61))
        assert writer.post(body, documents).accepted == documents
    finally:
        writer.close()


def test_the_verdict_user_judges_a_run_in_elasticsearch_and_may_do_nothing_else(secured_stack):
    """flowstat_verdict, as the compose stack's `verdict` service logs in (FLOWSTAT_ES_USER and
    _PASSWORD): it reads a run's samples and its run document, and writes the verdicts and edge
    rates; it writes no sample or run, deletes no verdict, reads nothing else."""
    s = secured_stack
    run = f"sec-verdict-{uuid.uuid4().hex[:8]}"
    target = f"flowstat-samples-{run}"  # a samples index of this test's own, beside flowstat-samples
    write_judged_run(es_writer(s, target, who="agent"), run, 41)
    s.es("POST", f"/{target}*,flowstat-runs/_refresh", "elastic").raise_for_status()
    user, password = s.es_user("verdict")
    assert s.es("GET", "/_security/_authenticate", "verdict").json()["roles"] == ["flowstat_verdict"]
    env = {"FLOWSTAT_ES_USER": user, "FLOWSTAT_ES_PASSWORD": password, "FLOWSTAT_ES_CA_FILE": str(s.ca_file)}
    out = judge_run(s, "--es", run, env, "--index", target)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    s.es("POST", "/flowstat-verdicts*,flowstat-edges*/_refresh", "elastic").raise_for_status()
    count = {"query": {"term": {"run_id": run}}}
    verdicts = s.es("POST", "/flowstat-verdicts*/_search", "elastic", json={**count, "size": 100}).json()
    flows = {h["_source"]["flow"] for h in verdicts["hits"]["hits"]}
    # judged along the run's edges, read from its run document (without them every verdict is unknown)
    assert flows & {"none", "held_back"} and "holds no edges" not in out.stderr, (flows, out.stderr)
    assert s.es("POST", "/flowstat-edges*/_count", "elastic", json=count).json()["count"] > 0
    # and nothing more than that
    first = verdicts["hits"]["hits"][0]
    verdict_index, verdict_id = first["_index"], quote(first["_id"], safe="")  # run_id/time: a / in it
    refused = {
        "write a sample": s.es("PUT", f"/{target}-2000.01.01/_doc/x", "verdict", json=sample(run)),
        "write a run": s.es("PUT", f"/flowstat-runs/_doc/{run}-x", "verdict", json={"run_id": run}),
        "delete a verdict": s.es("DELETE", f"/{verdict_index}/_doc/{verdict_id}", "verdict"),
        "read elsewhere": s.es("GET", f"/{index_of_elastic(s, 'other')}/_search", "verdict"),
        "make a user": s.es("PUT", "/_security/user/intruder", "verdict", json={"password": "x" * 12, "roles": []}),
    }
    for what, resp in refused.items():
        assert resp.status_code == 403 and f"for user [{user}]" in resp.text, (what, resp.status_code, resp.text[:300])


def test_the_verdict_user_judges_a_run_in_influxdb(secured_stack):
    """The InfluxDB verdict user, as the compose stack's `verdict-influxdb` service logs in: --run
    reads the samples and the run's topology points, deletes the run's verdicts over its span (a
    write, to InfluxDB 1.x) and writes them again; it is not an admin."""
    s = secured_stack
    run = f"sec-verdict-{uuid.uuid4().hex[:8]}"
    write_judged_run(influx_as(s, "writer"), run, 42)  # as Telegraf and the agents write
    user, password = s.influx_user("verdict")
    env = {"FLOWSTAT_INFLUX_USER": user, "FLOWSTAT_INFLUX_PASSWORD": password}
    for _ in range(2):  # again: the delete of the first run's verdicts is allowed too
        out = judge_run(s, "--influx", run, env)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    got = s.influx_query(f'SELECT "flow" FROM "flowstat_verdict" WHERE "run_id" = \'{run}\'', who="reader").json()
    flows = {row[1] for row in got["results"][0]["series"][0]["values"]}
    assert flows & {"none", "held_back"} and "holds no edges" not in out.stderr, (flows, out.stderr)
    refused = s.influx_query('DROP MEASUREMENT "flowstat_verdict"', who="verdict")
    assert refused.status_code == 403 and "requires admin privilege" in refused.text, refused.text


# -- API keys ---------------------------------------------------------------------------------------
def test_an_api_key_works_until_it_is_invalidated(secured_stack):
    s = secured_stack
    key = s.api_key(f"agent-{uuid.uuid4().hex[:6]}")  # limited to flowstat_writer
    me = s.es("GET", "/_security/_authenticate", api_key=key["encoded"])
    assert me.status_code == 200 and me.json()["authentication_type"] == "api_key"
    assert write_sample(s, f"flowstat-samples-{uuid.uuid4().hex[:8]}", api_key=key["encoded"]) == (1, [])
    denied = s.es("GET", f"/{index_of_elastic(s, 'flowstat-samples')}/_search", api_key=key["encoded"])
    assert denied.status_code == 403  # the key has its role's privileges, not its maker's (elastic)
    gone = s.es("DELETE", "/_security/api_key", "elastic", json={"ids": [key["id"]]})
    assert gone.status_code == 200 and gone.json()["invalidated_api_keys"] == [key["id"]]
    after = s.es("GET", "/_security/_authenticate", api_key=key["encoded"])
    assert after.status_code == 401 and f"api key [{key['id']}] has been invalidated" in after.text, after.text


def test_an_expired_api_key_answers_401_saying_so(secured_stack):
    s = secured_stack
    key = s.api_key(f"short-{uuid.uuid4().hex[:6]}", expiration="1s")
    deadline = time.monotonic() + 15
    while True:
        resp = s.es("GET", "/_security/_authenticate", api_key=key["encoded"])
        if resp.status_code != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.25)  # until the second it lives has passed
    assert resp.status_code == 401 and "api key is expired" in resp.text, resp.text
    assert write_sample(s, f"flowstat-samples-{uuid.uuid4().hex[:8]}", api_key=key["encoded"])[0] == 0


# -- TLS --------------------------------------------------------------------------------------------
def test_https_is_verified_against_the_stacks_ca(secured_stack):
    s = secured_stack
    assert s.es_url.startswith("https://127.0.0.1:")
    with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        requests.get(f"{s.es_url}/_cluster/health", auth=s.elastic, timeout=30)  # the system's CAs
    assert requests.get(f"{s.es_url}/_cluster/health", auth=s.elastic, verify=str(s.ca_file), timeout=30).ok
    by_name = s.es_url.replace("127.0.0.1", "localhost")  # the certificate names both
    assert requests.get(f"{by_name}/_cluster/health", auth=s.elastic, verify=str(s.ca_file), timeout=30).ok
    # provision trusts the CA FLOWSTAT_ES_CA_FILE names, and says what to set when it is not given
    out = s.provision(env={"FLOWSTAT_ES_CA_FILE": ""})
    port = s.es_url.rsplit(":", 1)[1]
    assert out.returncode == 1
    assert (
        f"TLS: the certificate of 127.0.0.1:{port} is not trusted (set FLOWSTAT_ES_CA_FILE to the CA that "
        f"signed it)"
    ) in out.stderr, out.stderr
    out = s.provision(env={"FLOWSTAT_ES_CA_FILE": "", "FLOWSTAT_CA_FILE": str(s.ca_file)})  # the default
    assert out.returncode == 0, out.stderr


def test_the_analysis_module_is_compiled_once(secured_stack):
    from flowstat.stack.elasticsearch import ANALYSIS_MODULE

    descriptor = secured_stack.es_service.dist / "modules" / ANALYSIS_MODULE / "plugin-descriptor.properties"
    made = descriptor.stat().st_mtime_ns
    secured_stack.es_service._analysis_module()  # as each start's install does
    assert descriptor.stat().st_mtime_ns == made
    assert "# flowstat source sha256 " in descriptor.read_text()
    # the .security index's email analyzer, as x-pack-security defines it, built from the module's parts
    analyzed = secured_stack.es(
        "POST",
        "/_analyze",
        "elastic",
        json={
            "tokenizer": "uax_url_email",
            "filter": [
                {
                    "type": "pattern_capture",
                    "preserve_original": True,
                    "patterns": ["([^@]+)", "(\\p{L}+)", "(\\d+)", "@(.+)"],
                },
                "lowercase",
                "unique",
            ],
            "text": "Jane.Doe2@Example.org jane.doe2@example.org",
        },
    )
    assert analyzed.status_code == 200, analyzed.text
    tokens = [t["token"] for t in analyzed.json()["tokens"]]
    assert tokens[0] == "jane.doe2@example.org"  # one token per address, kept whole (preserve_original)
    assert set(tokens) == {
        "jane.doe2@example.org",
        "jane.doe2",
        "example.org",
        "jane",
        "doe",
        "example",
        "org",
        "2",
    }, tokens  # each pattern's captures, lowercased
    assert len(tokens) == len(set(tokens)), tokens  # unique: the second address adds nothing


# -- InfluxDB ---------------------------------------------------------------------------------------
def influx_as(s, who: str) -> influx_store.InfluxDBWriter:
    user, password = s.influx_user(who)
    return influx_store.InfluxDBWriter(
        s.influx_url, "flowstat", auth=StoreAuth("FLOWSTAT_INFLUX", "TOKEN", "Token", user, password)
    )


def write_line(s, who: str, line: str) -> requests.Response:
    return requests.post(
        f"{s.influx_url}/write",
        params={"db": "flowstat", "rp": "raw", "precision": "ns"},
        data=line.encode(),
        auth=s.influx_user(who),
        timeout=30,
    )


def test_the_influxdb_users_and_the_replay_backfill(secured_stack):
    s = secured_stack
    run = f"sec-{uuid.uuid4().hex[:8]}"
    now = time.time_ns()
    line = f"flowstat_node,run_id={run},node_id=n1,role=merger,agent=a,host=h threads=3i {now - 60_000_000_000}\n"
    assert write_line(s, "writer", line).status_code == 204  # WRITE: the raw samples
    assert write_line(s, "replay", line).status_code == 204
    refused = write_line(s, "reader", line)
    assert refused.status_code == 403 and "not authorized to write" in refused.text
    assert s.influx_query('SELECT * FROM "raw"."flowstat_node" LIMIT 1', who="writer").status_code == 403

    # replay's rollup backfill (SELECT ... INTO): refused to the writer (it needs READ too), done by replay
    writer = influx_as(s, "writer")
    try:
        with pytest.raises(StoreAuthError, match="requires READ on flowstat"):
            writer.loaded(now - 120_000_000_000, now)
    finally:
        writer.close()
    replay = influx_as(s, "replay")
    try:
        replay.loaded(now - 120_000_000_000, now)
    finally:
        replay.close()
    rolled = s.influx_query(f'SELECT * FROM "rollup"."flowstat_node_10s" WHERE run_id = \'{run}\'', who="reader")
    assert rolled.json()["results"][0]["series"][0]["values"], rolled.text


def test_a_point_older_than_the_raw_retention_is_dropped_and_said(secured_stack):
    old = time.time_ns() - 40 * 86400 * 10**9  # the raw policy keeps 30 days
    resp = write_line(secured_stack, "writer", f"flowstat_node,node_id=n1 threads=1i {old}\n")
    assert resp.status_code == 400
    assert resp.json() == {"error": "partial write: points beyond retention policy dropped=1"}
