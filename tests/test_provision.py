"""flowstat provision (the compose stack's setup service), run for real wherever it can be:

- the index templates, on the real local Elasticsearch (the integ-test build, without security);
- InfluxDB's database, users and grants, on a real InfluxDB with authentication on;
- Elasticsearch's security calls: each call's method and path are checked against Elasticsearch's
  REST API specification, the `rest-api-spec` JSON that Maven Central ships (9.1.5: no 8.19 is
  published there; these three endpoints are the same in 8.19's source), and each body against the
  documented shape; test_secured_stack.py runs them on the integ-test build with security on;
- Kibana cannot run here: what is sent is recorded by a loopback server and checked against
  Kibana's documented import API, and the answer is judged on the documented answers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from flowstat.stack.elasticsearch import m2_repository
from support.common import ROOT, free_port, reachable_dir

REST_API_SPEC = ("org.elasticsearch", "rest-api-spec", "9.1.5")
# The bodies' documented shapes (elastic.co/docs/api/doc/elasticsearch: security-put-user,
# security-put-role, security-change-password): the keys each takes.
DOCUMENTED_BODY = {
    "security.put_user": {"password", "password_hash", "roles", "full_name", "email", "metadata", "enabled"},
    "security.put_role": {
        "applications",
        "cluster",
        "global",
        "indices",
        "remote_indices",
        "remote_cluster",
        "metadata",
        "run_as",
        "description",
        "transient_metadata",
    },
    "security.change_password": {"password", "password_hash"},
}
# Elasticsearch's cluster and index privileges used by the roles (elastic.co/docs/reference/
# elasticsearch/security-privileges).
CLUSTER_PRIVILEGES = {"monitor", "manage_index_templates", "manage_ilm", "all"}
INDEX_PRIVILEGES = {
    "all",
    "create",
    "create_doc",
    "create_index",
    "index",
    "read",
    "view_index_metadata",
    "write",
    "manage",
    "delete",
    "monitor",
}
SECRETS_ENV = {
    "ELASTIC_PASSWORD": "elastic-pw-1234567",
    "KIBANA_SYSTEM_PASSWORD": "kibana-system-pw-1",
    "LOGSTASH_ES_PASSWORD": "logstash-pw-12345",
    "AGENT_ES_PASSWORD": "agent-es-pw-12345",
    "ROLLUP_ES_PASSWORD": "rollup-es-pw-12345",
    "VERDICT_ES_PASSWORD": "verdict-es-pw-1234",
    "GRAFANA_ES_PASSWORD": "grafana-es-pw-123",
    "ELASTALERT_ES_PASSWORD": "elastalert-pw-123",
}


def flowstat(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    # PYTHONPATH only when set: the flowstat of this checkout when it is run from it uninstalled
    python_path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    return subprocess.run(
        [sys.executable, "-m", "flowstat.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **python_path, **(env or {})},
    )


# -- Elasticsearch's security calls, against the REST API spec ------------------------------------
@pytest.fixture(scope="module")
def rest_api_spec() -> dict[str, dict]:
    group, artifact, version = REST_API_SPEC
    repository = m2_repository()
    jar = repository / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.jar"
    if not jar.exists():
        out = subprocess.run(
            [
                "mvn",
                "-q",
                "dependency:get",
                f"-Dartifact={group}:{artifact}:{version}",
                "-Dtransitive=false",
                f"-Dmaven.repo.local={repository}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0 and jar.exists(), out.stdout[-1000:] + out.stderr[-1000:]
    with zipfile.ZipFile(jar) as z:
        return {
            Path(n).stem: json.loads(z.read(n))
            for n in z.namelist()
            if n.startswith("rest-api-spec/api/") and n.endswith(".json")
        }


def spec_allows(spec: dict, method: str, path: str) -> bool:
    for p in spec["url"]["paths"]:
        pattern = re.sub(r"\\\{\w+\\\}", r"[^/]+", re.escape(p["path"]))
        if re.fullmatch(pattern, path) and method in p["methods"]:
            return True
    return False


def test_the_security_calls_match_elasticsearchs_rest_api_spec(rest_api_spec):
    from flowstat import provision

    calls = provision.security_calls(SECRETS_ENV)
    assert {c.api for c in calls} == set(DOCUMENTED_BODY)
    for call in calls:
        ((name, spec),) = rest_api_spec[call.api].items()
        assert spec_allows(spec, call.method, call.path), f"{call.api}: {call.method} {call.path} is not in the spec"
        assert not spec_allows(spec, call.method, call.path + "/x")  # the check can say no
        if spec.get("body", {}).get("required"):
            assert call.body, f"{call.api} needs a body"
        assert set(call.body) <= DOCUMENTED_BODY[call.api], f"{call.api}: {set(call.body) - DOCUMENTED_BODY[call.api]}"
    roles = {c.path.rsplit("/", 1)[1]: c.body for c in calls if c.api == "security.put_role"}
    for name, role in roles.items():
        assert set(role["cluster"]) <= CLUSTER_PRIVILEGES, name
        for grant in role["indices"]:
            assert set(grant["privileges"]) <= INDEX_PRIVILEGES and grant["names"], name
    users = [c for c in calls if c.api == "security.put_user"]
    assert all(set(u.body["roles"]) <= set(roles) for u in users)  # every role a user gets is put first
    assert [c.api for c in calls].index("security.put_user") > max(
        i for i, c in enumerate(calls) if c.api == "security.put_role"
    )


def test_the_roles_grant_each_client_only_what_it_needs():
    from flowstat import provision

    def privileges(role: str, index: str) -> set[str]:
        return {p for g in provision.ROLES[role]["indices"] if index in g["names"] for p in g["privileges"]}

    samples = provision.ES_INDICES[0]
    assert privileges("flowstat_writer", samples) == {"create_index", "index"}  # no read, no delete
    assert privileges("flowstat_reader", samples) == {"read", "view_index_metadata"}
    assert privileges("flowstat_alerter", samples) == {"read", "view_index_metadata"}
    assert privileges("flowstat_alerter", provision.ELASTALERT_INDEX) == {"all"}
    # the rollup reads the samples and writes only their means; the readers read those too
    rollup = provision.ROLLUP_INDICES[0]
    assert privileges("flowstat_rollup", samples) == {"read", "view_index_metadata"}
    assert privileges("flowstat_rollup", rollup) == {"create_index", "index", "read", "view_index_metadata"}
    assert privileges("flowstat_writer", rollup) == set()
    assert privileges("flowstat_reader", rollup) == {"read", "view_index_metadata"}
    # flowstat verdict's verdicts and edge rates: read by the views and the held-back alert, written
    # by the verdict service alone, which overwrites a verdict by its _id and deletes nothing
    for verdicts in provision.VERDICT_INDICES:
        assert privileges("flowstat_reader", verdicts) == privileges("flowstat_alerter", verdicts)
        assert privileges("flowstat_reader", verdicts) == {"read", "view_index_metadata"}
        assert privileges("flowstat_rollup", verdicts) == set()
        assert privileges("flowstat_verdict", verdicts) == {"create_index", "index", "read"}
    # the agents write their edge counters beside the verdict's edge rates, and no verdict
    verdicts_index, edges_index = provision.VERDICT_INDICES
    assert privileges("flowstat_writer", verdicts_index) == set()
    assert privileges("flowstat_writer", edges_index) == {"create_index", "index"}
    # it reads the samples and the run documents (their edges), and writes nothing else
    runs = provision.ES_INDICES[2]
    assert runs.startswith("flowstat-runs")
    assert privileges("flowstat_verdict", samples) == privileges("flowstat_verdict", runs) == {"read"}
    for other in (provision.ES_INDICES[1], rollup, provision.ELASTALERT_INDEX):
        assert privileges("flowstat_verdict", other) == set(), other
    assert all(r["cluster"] == ["monitor"] for r in provision.ROLES.values())
    # the agents and replay write as Logstash does, as a user of their own
    roles = {u.name: u.roles for u in provision.USERS}
    assert roles["flowstat_agent"] == roles["flowstat_logstash"] == ("flowstat_writer",)
    # the compose stack's services of flowstat, each a user and a role of its own
    assert roles["flowstat_rollup"] == ("flowstat_rollup",) and roles["flowstat_verdict"] == ("flowstat_verdict",)
    # passwords are the environment's, and JSON-encoded (a quote in one cannot break the body)
    env = {**SECRETS_ENV, "LOGSTASH_ES_PASSWORD": 'a"b\\c-pw-123456'}
    body = next(c.body for c in provision.security_calls(env) if c.path.endswith("flowstat_logstash"))
    assert json.loads(json.dumps(body))["password"] == 'a"b\\c-pw-123456'


# -- secrets ----------------------------------------------------------------------------------------
def test_the_check_refuses_placeholders_and_names_each(tmp_path):
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    out = flowstat("provision", "--check", env=example)
    assert out.returncode == 2
    from flowstat import provision

    for s in provision.SECRETS:
        assert f"{s.env} still holds .env.example's placeholder" in out.stderr
    good = {s.env: "x" * s.min_length for s in provision.SECRETS}
    assert flowstat("provision", "--check", env=good).returncode == 0
    short = {**good, "KIBANA_ENCRYPTION_KEY": "x" * 31}
    out = flowstat("provision", "--check", env=short)
    assert out.returncode == 2 and "KIBANA_ENCRYPTION_KEY is 31 characters; 32 at least" in out.stderr
    missing = {k: v for k, v in good.items() if k != "INFLUXDB_READER_PASSWORD"}
    out = flowstat("provision", "--check", env=missing)
    assert out.returncode == 2 and "INFLUXDB_READER_PASSWORD is not set" in out.stderr


def test_nothing_to_do_is_said():
    out = flowstat("provision")
    assert out.returncode == 2 and "give --es, --kibana and/or --influx" in out.stderr


# -- the templates, on the real Elasticsearch -----------------------------------------------------
def test_provision_installs_the_templates_into_the_real_elasticsearch(own_stack):
    es = own_stack["elasticsearch"]
    requests.delete(f"{es.url}/_index_template/flowstat-runs", timeout=10).raise_for_status()
    requests.delete(f"{es.url}/_index_template/flowstat-samples", timeout=10).raise_for_status()
    for _ in range(2):  # idempotent
        out = flowstat("provision", "--es", es.url, "--no-security", "--timeout", "30")
        assert out.returncode == 0, out.stderr
        assert "installed _index_template/flowstat-runs" in out.stdout
    for name in ("flowstat-samples", "flowstat-agents", "flowstat-runs"):
        assert requests.get(f"{es.url}/_index_template/{name}", timeout=10).status_code == 200
    # a new index on this single node: no replica to wait for (auto_expand_replicas 0-1), so green
    probe = f"flowstat-runs-probe-{uuid.uuid4().hex[:8]}"
    requests.put(f"{es.url}/{probe}", timeout=30).raise_for_status()
    try:
        health = requests.get(
            f"{es.url}/_cluster/health/{probe}", params={"wait_for_status": "green", "timeout": "20s"}, timeout=30
        ).json()
        assert health["status"] == "green" and not health["timed_out"]
    finally:
        requests.delete(f"{es.url}/{probe}", timeout=10)


def test_provision_waits_for_a_server_that_does_not_answer_and_names_it():
    port = free_port()
    out = flowstat("provision", "--es", f"http://127.0.0.1:{port}", "--no-security", "--timeout", "3")
    assert out.returncode == 1
    assert f"Elasticsearch at http://127.0.0.1:{port} not ready after 3 s: no answer" in out.stderr


def test_elasticsearch_install_script_installs_the_templates(own_stack):
    """index-templates/elasticsearch/install.sh: the same templates for who installs by hand."""
    es = own_stack["elasticsearch"]
    requests.delete(f"{es.url}/_index_template/flowstat-agents", timeout=10).raise_for_status()
    requests.delete(f"{es.url}/_component_template/flowstat-agent-mappings", timeout=10).raise_for_status()
    # an index of self-samples as an older flowstat made it: without interval_s
    older = f"flowstat-agents-older-{uuid.uuid4().hex[:8]}"
    requests.put(
        f"{es.url}/{older}",
        json={
            "mappings": {"dynamic": "strict", "properties": {"time": {"type": "date"}, "agent": {"type": "keyword"}}}
        },
        timeout=10,
    ).raise_for_status()
    try:
        for _ in range(2):  # idempotent
            out = subprocess.run(
                ["sh", str(ROOT / "index-templates" / "elasticsearch" / "install.sh")],
                env={"ES_URL": es.url, "PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
            )
            assert out.returncode == 0, out.stderr
            assert "installed flowstat-agents*/_mapping" in out.stdout
        got = requests.get(f"{es.url}/{older}/_mapping", timeout=10).json()[older]["mappings"]["properties"]
        assert got["interval_s"] == {"type": "double"} and got["spooled_samples"] == {"type": "long"}
    finally:
        requests.delete(f"{es.url}/{older}", timeout=10)
    mapping = requests.get(f"{es.url}/_component_template/flowstat-agent-mappings", timeout=10).json()
    props = mapping["component_templates"][0]["component_template"]["template"]["mappings"]["properties"]
    assert props["spooled_samples"]["type"] == "long" and props["interval_s"]["type"] == "double"


# -- InfluxDB with authentication on --------------------------------------------------------------
ADMIN = ("admin", "admin-pw-123456")


@pytest.fixture(scope="module")
def secured_influx(reachable_tmp_module):
    """An InfluxDB of this module's own (its tests make users drift): secured_stack.py's, with ADMIN."""
    from support.secured_stack import influx_with_admin

    with influx_with_admin(reachable_tmp_module, "influxdb", free_port(), ADMIN) as server:
        yield server


@pytest.fixture(scope="module")
def reachable_tmp_module():
    yield from reachable_dir()


def influx_env(writer_pw="writer-pw-123456", reader_pw="reader-pw-123456") -> dict[str, str]:
    return {
        "INFLUXDB_ADMIN_USER": ADMIN[0],
        "INFLUXDB_ADMIN_PASSWORD": ADMIN[1],
        "INFLUXDB_WRITER_USER": "telegraf",
        "INFLUXDB_WRITER_PASSWORD": writer_pw,
        "INFLUXDB_READER_USER": "grafana",
        "INFLUXDB_READER_PASSWORD": reader_pw,
        "INFLUXDB_REPLAY_USER": "replay",
        "INFLUXDB_REPLAY_PASSWORD": "replay-pw-123456",
        "INFLUXDB_VERDICT_USER": "verdict",
        "INFLUXDB_VERDICT_PASSWORD": "verdict-pw-123456",
    }


def write(url: str, auth) -> int:
    return requests.post(
        f"{url}/write", params={"db": "flowstat", "rp": "raw"}, auth=auth, timeout=10, data=b"probe,node_id=a value=1\n"
    ).status_code


def read(url: str, auth) -> requests.Response:
    return requests.post(
        f"{url}/query", params={"db": "flowstat", "q": 'SELECT * FROM "raw"."probe"'}, auth=auth, timeout=10
    )


def test_provision_makes_the_database_and_least_privileged_users_on_a_secured_influxdb(secured_influx):
    url = secured_influx.url
    for _ in range(2):  # idempotent: the second run sets the same passwords and grants again
        out = flowstat("provision", "--influx", url, "--timeout", "30", env=influx_env())
        assert out.returncode == 0, out.stderr
    writer, reader = ("telegraf", "writer-pw-123456"), ("grafana", "reader-pw-123456")
    verdict = ("verdict", "verdict-pw-123456")
    assert write(url, None) == 401  # authentication is on
    assert write(url, writer) == 204
    assert write(url, reader) == 403
    assert read(url, writer).status_code == 403
    assert read(url, reader).json()["results"][0]["series"][0]["values"][0][-1] == 1
    # the verdict service reads the samples and writes its verdicts beside them
    assert read(url, verdict).json()["results"][0]["series"][0]["values"][0][-1] == 1
    assert write(url, verdict) == 204
    users = requests.post(f"{url}/query", params={"q": "SHOW USERS"}, auth=ADMIN, timeout=10).json()
    admin_flags = {row[0]: row[1] for row in users["results"][0]["series"][0]["values"]}
    assert admin_flags == {"admin": True, "telegraf": False, "grafana": False, "replay": False, "verdict": False}
    grants = {
        who: requests.post(f"{url}/query", params={"q": f'SHOW GRANTS FOR "{who}"'}, auth=ADMIN, timeout=10).json()[
            "results"
        ][0]["series"][0]["values"]
        for who in ("telegraf", "grafana", "replay", "verdict")
    }
    assert grants == {
        "telegraf": [["flowstat", "WRITE"]],
        "grafana": [["flowstat", "READ"]],
        "replay": [["flowstat", "ALL PRIVILEGES"]],
        "verdict": [["flowstat", "ALL PRIVILEGES"]],
    }
    rps = requests.post(
        f"{url}/query", params={"q": 'SHOW RETENTION POLICIES ON "flowstat"'}, auth=ADMIN, timeout=10
    ).json()["results"][0]["series"][0]["values"]
    assert {r[0] for r in rps} >= {"raw", "rollup"}
    cqs = requests.post(f"{url}/query", params={"q": "SHOW CONTINUOUS QUERIES"}, auth=ADMIN, timeout=10).json()
    assert sum(len(s.get("values", [])) for s in cqs["results"][0]["series"] if s["name"] == "flowstat") == 4


def test_provision_converges_passwords_and_privileges_that_drifted(secured_influx):
    url = secured_influx.url
    assert flowstat("provision", "--influx", url, env=influx_env()).returncode == 0
    # someone made the reader an admin: the next run takes it back
    requests.post(
        f"{url}/query", params={"q": 'GRANT ALL PRIVILEGES TO "grafana"'}, auth=ADMIN, timeout=10
    ).raise_for_status()
    out = flowstat("provision", "--influx", url, env=influx_env(writer_pw="a-new-writer-pw-1", reader_pw="b" * 16))
    assert out.returncode == 0, out.stderr
    assert write(url, ("telegraf", "writer-pw-123456")) == 401  # the old password no longer works
    assert write(url, ("telegraf", "a-new-writer-pw-1")) == 204
    assert write(url, ("grafana", "b" * 16)) == 403  # READ only again
    # passwords holding InfluxQL's quote and backslash are escaped, not spliced
    tricky = "it's\\a-pw-12345"
    assert flowstat("provision", "--influx", url, env=influx_env(writer_pw=tricky)).returncode == 0
    assert write(url, ("telegraf", tricky)) == 204


def test_telegraf_writes_into_the_secured_influxdb_as_the_writer(secured_influx, reachable_tmp_module):
    """The compose stack's telegraf.conf, run by the real Telegraf with the writer's credentials
    from its environment, as docker-compose.yml gives them."""
    from flowstat.stack.telegraf import TelegrafServer

    assert flowstat("provision", "--influx", secured_influx.url, env=influx_env()).returncode == 0
    telegraf = TelegrafServer(
        "telegraf",
        reachable_tmp_module,
        free_port(),
        extra={"influx_url": secured_influx.url, "influx_user": "telegraf", "influx_password": "writer-pw-123456"},
    )
    telegraf.up()
    try:
        mark = uuid.uuid4().hex[:8]
        resp = requests.post(f"{telegraf.url}/write", data=f"probe_{mark},node_id=a value=7\n".encode(), timeout=10)
        assert resp.status_code == 204
        deadline = time.monotonic() + 30
        while True:  # Telegraf flushes every second
            got = requests.post(
                f"{secured_influx.url}/query",
                auth=("grafana", "reader-pw-123456"),
                timeout=10,
                params={"db": "flowstat", "q": f'SELECT value FROM "raw"."probe_{mark}"'},
            ).json()
            if got["results"][0].get("series"):
                break
            assert time.monotonic() < deadline, f"not in InfluxDB after 30 s; Telegraf's log:\n{telegraf.log_tail()}"
            time.sleep(0.5)
        assert got["results"][0]["series"][0]["values"][0][1] == 7
    finally:
        telegraf.down()


def test_a_wrong_influxdb_admin_password_is_named(secured_influx):
    env = {**influx_env(), "INFLUXDB_ADMIN_PASSWORD": "not-the-admin-pw"}
    out = flowstat("provision", "--influx", secured_influx.url, "--timeout", "10", env=env)
    assert out.returncode == 1
    assert "refused admin 'admin' (HTTP 401)" in out.stderr and "first start" in out.stderr


def test_the_influxql_string_escapes_what_would_end_it():
    from flowstat.provision import influx_user_statements
    from flowstat.stores.influxdb import string_literal

    assert string_literal("a'b\\c") == "'a\\'b\\\\c'"
    made = influx_user_statements({"u": ("p", "WRITE")}, {})
    assert made == ["CREATE USER \"u\" WITH PASSWORD 'p'", 'GRANT WRITE ON "flowstat" TO "u"']
    assert influx_user_statements({"u": ("p", "READ")}, {"u": True})[1] == 'REVOKE ALL PRIVILEGES FROM "u"'
    assert len(influx_user_statements({"u": ("p", "READ")}, {"u": False})) == 2
    assert influx_user_statements({"u": ("p", "ALL")}, {})[1] == 'GRANT ALL ON "flowstat" TO "u"'


def test_the_influxdb_users_must_be_distinct_and_not_the_admin(secured_influx):
    env = {**influx_env(), "INFLUXDB_REPLAY_USER": "telegraf"}  # one GRANT would replace the other
    out = flowstat("provision", "--influx", secured_influx.url, "--timeout", "10", env=env)
    assert out.returncode == 1
    assert "the writer, reader, replay and verdict users must be distinct users, none of them the admin" in out.stderr
    assert "INFLUXDB_REPLAY_USER=telegraf" in out.stderr
    # the verdict service's user too: it may be neither another client's nor the admin
    for name in ("grafana", ADMIN[0]):
        out = flowstat(
            "provision",
            "--influx",
            secured_influx.url,
            "--timeout",
            "10",
            env={**influx_env(), "INFLUXDB_VERDICT_USER": name},
        )
        assert out.returncode == 1 and f"INFLUXDB_VERDICT_USER={name}" in out.stderr, out.stderr


# -- Kibana: the request, recorded; the answer, judged ------------------------------------------------
class _Recorder(BaseHTTPRequestHandler):
    """Records each request and answers with what the test put in ``answers`` (path -> (code, body)):
    a loopback witness of the bytes flowstat sends, not a Kibana."""

    seen: list = []
    answers: dict = {}

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append((self.command, self.path, dict(self.headers), body))
        code, answer = self.answers[self.path.split("?")[0]]
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _handle

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder():
    _Recorder.seen, _Recorder.answers = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder
    server.shutdown()
    server.server_close()


def test_the_kibana_import_sends_the_committed_objects_as_the_import_api_documents(recorder):
    url, rec = recorder
    objects = ROOT / "dashboards" / "kibana" / "flowstat.ndjson"
    count = sum(1 for line in objects.read_text().splitlines() if line.strip())
    rec.answers = {
        "/api/status": (200, {"status": {"overall": {"level": "available"}}}),
        "/api/saved_objects/_import": (200, {"success": True, "successCount": count}),
    }
    out = flowstat(
        "provision",
        "--kibana",
        url,
        "--kibana-objects",
        str(objects),
        "--timeout",
        "10",
        env={"ELASTIC_PASSWORD": "elastic-pw-1234567"},
    )
    assert out.returncode == 0, out.stderr
    assert f"imported {count} saved objects" in out.stdout
    method, path, headers, body = rec.seen[-1]
    assert (method, path) == ("POST", "/api/saved_objects/_import?overwrite=true")
    assert headers["kbn-xsrf"] and headers["Authorization"].startswith("Basic ")
    assert headers["Content-Type"].startswith("multipart/form-data; boundary=")
    assert b'name="file"; filename="' in body and objects.read_bytes() in body
    for line in objects.read_text().splitlines():  # every object Kibana gets has what an import needs
        doc = json.loads(line)
        assert {"type", "id", "attributes"} <= set(doc), doc.get("id")


def test_an_incomplete_kibana_import_fails_and_names_the_objects(recorder):
    url, rec = recorder
    objects = ROOT / "dashboards" / "kibana" / "flowstat.ndjson"
    count = sum(1 for line in objects.read_text().splitlines() if line.strip())
    # the shape of Kibana's documented answer to an import with a conflict
    rec.answers = {
        "/api/status": (200, {"status": {"overall": {"level": "available"}}}),
        "/api/saved_objects/_import": (
            200,
            {
                "success": False,
                "successCount": count - 1,
                "errors": [
                    {
                        "id": "flowstat-run",
                        "type": "dashboard",
                        "title": "flowstat run",
                        "error": {"type": "missing_references", "references": [{"type": "lens", "id": "x"}]},
                    }
                ],
            },
        ),
    }
    out = flowstat(
        "provision",
        "--kibana",
        url,
        "--kibana-objects",
        str(objects),
        "--timeout",
        "10",
        env={"ELASTIC_PASSWORD": "elastic-pw-1234567"},
    )
    assert out.returncode == 1
    assert "dashboard/flowstat-run" in out.stderr and "missing_references" in out.stderr
    assert f"{count - 1} of {count} objects imported" in out.stderr


def test_a_degraded_kibana_whose_saved_objects_are_available_takes_the_import(recorder):
    url, rec = recorder
    objects = ROOT / "dashboards" / "kibana" / "flowstat.ndjson"
    count = sum(1 for line in objects.read_text().splitlines() if line.strip())
    rec.answers = {
        "/api/status": (
            200,
            {"status": {"overall": {"level": "degraded"}, "core": {"savedObjects": {"level": "available"}}}},
        ),
        "/api/saved_objects/_import": (200, {"success": True, "successCount": count}),
    }
    out = flowstat(
        "provision",
        "--kibana",
        url,
        "--kibana-objects",
        str(objects),
        "--timeout",
        "10",
        env={"ELASTIC_PASSWORD": "elastic-pw-1234567"},
    )
    assert out.returncode == 0, out.stderr


def test_a_refused_elastic_password_is_waited_for_then_named(recorder, monkeypatch):
    """A restarted Elasticsearch refuses every password until its security index has recovered:
    a 401 is retried for AUTH_GRACE_S, then named with what to do."""
    from flowstat import provision

    url, rec = recorder
    rec.answers = {"/_cluster/health": (401, {"error": "unable to authenticate user [elastic]"})}
    said = []
    monkeypatch.setattr(provision, "AUTH_GRACE_S", 1.0)
    es = provision.ElasticsearchSetup(url, SECRETS_ENV, said.append)
    with pytest.raises(provision.ProvisionError, match="refused user elastic's password .* refused for 1 s"):
        provision.wait_for("Elasticsearch", es._ready, 30, said.append, every_s=0.2)
    assert len(rec.seen) > 1  # asked again before giving up
    assert "first start" in said[0]
    rec.seen.clear()
    rec.answers = {"/_cluster/health": (200, {"status": "green"})}
    provision.wait_for("Elasticsearch", es._ready, 5, said.append, every_s=0.2)  # recovered: ready


def test_import_answers_are_judged_on_every_field():
    from flowstat.provision import import_problems

    assert import_problems({"success": True, "successCount": 3}, 3) == []
    assert import_problems({"success": True, "successCount": 2}, 3) == ["2 of 3 objects imported"]
    assert import_problems({"success": True, "successCount": 3, "errors": []}, 3) == []
    assert "Kibana answered success: false" in import_problems({"success": False, "successCount": 3}, 3)


def test_a_kibana_that_stays_degraded_is_named(recorder):
    url, rec = recorder
    rec.answers = {"/api/status": (200, {"status": {"overall": {"level": "degraded"}}})}
    out = flowstat("provision", "--kibana", url, "--timeout", "3", env={"ELASTIC_PASSWORD": "elastic-pw-1234567"})
    assert out.returncode == 1 and f"Kibana at {url} not ready after 3 s: status degraded" in out.stderr
    assert not any(p.startswith("/api/saved_objects") for _, p, _, _ in rec.seen)


def test_the_command_line_keeps_secrets_out_of_its_options():
    """A command line is visible to every user of the machine: secrets come from the environment."""
    from flowstat import provision

    p = argparse.ArgumentParser()
    provision.configure(p)
    options = [o for a in p._actions for o in a.option_strings]
    assert "--es" in options
    assert not [o for o in options if re.search("pass|secret|key", o)]
