"""A secured stack for the tests: Elasticsearch with security and TLS on, InfluxDB with
authentication on, both provisioned by the real `flowstat provision` with secrets made at random
for the session (conftest.py's `secured_stack` fixture starts it once per session).

Elasticsearch runs from the session stack's cached install (ROOT/.cache/test-stack/elasticsearch:
the zip is unpacked once, the analysis module compiled once), with its configuration, keystore,
certificates and data in ROOT/.cache/test-stack/elasticsearch-secured; its data is wiped at the
start and the end of each session, so each session's random passwords are the first it sees.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests

ES_NAME, INFLUX_NAME = "elasticsearch-secured", "influxdb-secured"
# The users flowstat provision makes, by what the tests call them: (name variable or name, password variable)
ES_USERS = {
    "logstash": "flowstat_logstash",
    "agent": "flowstat_agent",
    "grafana": "flowstat_grafana",
    "elastalert": "flowstat_elastalert",
    "rollup": "flowstat_rollup",
    "verdict": "flowstat_verdict",
}
INFLUX_WHO = ("ADMIN", "WRITER", "READER", "REPLAY", "VERDICT")


def random_secret() -> str:
    """24 letters and digits (no quote: InfluxDB's admin takes none; no $: compose would expand it)."""
    return secrets.token_hex(12)


def session_secrets() -> dict[str, str]:
    """Every secret provision checks (flowstat.provision.SECRETS), random, and the InfluxDB
    users' names."""
    from flowstat import provision

    env = {s.env: random_secret() + "x" * max(0, s.min_length - 24) for s in provision.SECRETS}
    env.update(
        {
            "INFLUXDB_ADMIN_USER": "admin",
            "INFLUXDB_WRITER_USER": "telegraf",
            "INFLUXDB_READER_USER": "grafana",
            "INFLUXDB_REPLAY_USER": "replay",
            "INFLUXDB_VERDICT_USER": "verdict",
        }
    )
    return env


@contextmanager
def influx_with_admin(cache: Path, name: str, port: int, admin: tuple[str, str]) -> Iterator:
    """A real InfluxDB with authentication on and its first admin made (InfluxDB takes that one
    creation without credentials, then none); stopped, and its data removed, on the way out."""
    from flowstat.stack.influxdb import InfluxDBServer

    server = InfluxDBServer(name, cache, port, extra={"auth": True})
    _wipe(server.home, ("meta", "data", "wal"))
    server.up()
    try:
        q = requests.post(
            f"{server.url}/query",
            params={"q": f'CREATE USER "{admin[0]}" WITH PASSWORD ' f"'{admin[1]}' WITH ALL PRIVILEGES"},
            timeout=10,
        )
        assert q.status_code == 200 and "error" not in q.text, q.text
        yield server
    finally:
        server.down()
        _wipe(server.home, ("meta", "data", "wal"))


@contextmanager
def secured_elasticsearch(cache: Path, port: int, transport_port: int, elastic_password: str) -> Iterator:
    """Elasticsearch with security and TLS on, elastic's password ELASTIC_PASSWORD (in this
    process's environment while it starts and stops, as the service reads it)."""
    from flowstat.stack.elasticsearch import ElasticsearchServer

    es = ElasticsearchServer(
        ES_NAME, cache, port, extra={"security": True, "tls": True, "transport_port": transport_port}
    )
    with _environment(ELASTIC_PASSWORD=elastic_password):
        es.down()  # one a crashed session left
        _wipe(es.home, ("data",))
        try:
            es.up()
        except BaseException:
            es.down()
            raise
    try:
        yield es
    finally:
        es.down()
        _wipe(es.home, ("data",))


@dataclass
class SecuredStack:
    """What the tests get: the servers' URLs, the CA file that signed Elasticsearch's certificate,
    every secret (as provision read them) and helpers to act as each user."""

    es_url: str
    influx_url: str
    ca_file: Path
    env: dict[str, str]  # every secret and user name provision was given, and FLOWSTAT_ES_CA_FILE
    es_service: object = field(repr=False)  # flowstat.stack.elasticsearch.ElasticsearchServer
    influx_service: object = field(repr=False)  # flowstat.stack.influxdb.InfluxDBServer

    # -- who is who ----------------------------------------------------------------------------
    @property
    def elastic(self) -> tuple[str, str]:
        return ("elastic", self.env["ELASTIC_PASSWORD"])

    def es_user(self, who: str) -> tuple[str, str]:
        """``who``: logstash, agent, grafana, elastalert, rollup, verdict (or elastic): (user, password)."""
        if who == "elastic":
            return self.elastic
        from flowstat import provision

        user = next(u for u in provision.USERS if u.name == ES_USERS[who])
        return user.name, self.env[user.password_env]

    def influx_user(self, who: str) -> tuple[str, str]:
        """``who``: admin, writer, reader, replay, verdict: (user, password)."""
        return self.env[f"INFLUXDB_{who.upper()}_USER"], self.env[f"INFLUXDB_{who.upper()}_PASSWORD"]

    # -- acting as someone ---------------------------------------------------------------------
    def es_session(self, who: str | None = None, api_key: str | None = None) -> requests.Session:
        """A session trusting the CA, as ``who`` (basic auth), with an API key (its `encoded`), or
        anonymous. Give ``verify=session.verify`` with each request: requests prefers the
        environment's REQUESTS_CA_BUNDLE, when set, to a session's CA."""
        s = requests.Session()
        s.verify = str(self.ca_file)
        if who:
            s.auth = self.es_user(who)
        if api_key:
            s.headers["Authorization"] = f"ApiKey {api_key}"
        return s

    def es(self, method: str, path: str, who: str | None = None, api_key: str | None = None, **kw) -> requests.Response:
        with self.es_session(who, api_key) as s:
            # verify given each time: requests prefers REQUESTS_CA_BUNDLE to the session's
            return s.request(method, self.es_url + path, timeout=kw.pop("timeout", 30), verify=s.verify, **kw)

    def api_key(self, name: str, expiration: str | None = None, role: str | None = "flowstat_writer") -> dict:
        """A new API key, made by elastic, limited to flowstat's role ``role`` (None: elastic's own
        privileges). The answer of POST /_security/api_key: id, name, api_key, encoded (for
        `Authorization: ApiKey ENCODED`), expiration."""
        from flowstat import provision

        body: dict = {"name": name}
        if expiration:
            body["expiration"] = expiration
        if role:
            body["role_descriptors"] = {role: provision.ROLES[role]}
        resp = self.es("POST", "/_security/api_key", "elastic", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def influx_query(self, statement: str, who: str = "admin", db: str | None = "flowstat") -> requests.Response:
        return requests.post(
            f"{self.influx_url}/query",
            params={"q": statement, **({"db": db} if db else {})},
            auth=self.influx_user(who),
            timeout=30,
        )

    def provision(self, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        """`flowstat provision --es ES --influx INFLUX ARGS`, with this stack's secrets (and ``env``
        over them) in its environment and nothing else of this process's."""
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "flowstat.cli",
                "provision",
                "--es",
                self.es_url,
                "--influx",
                self.influx_url,
                "--timeout",
                "60",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={
                "PATH": os.environ["PATH"],
                "HOME": os.environ.get("HOME", "/root"),
                **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
                **self.env,
                **(env or {}),
            },
        )


@contextmanager
def started(cache: Path, free_port: Callable[[], int]) -> Iterator[SecuredStack]:
    """Start both servers, provision them once (the fixture's own check that provision works:
    a failure stops the session's secured tests with provision's output), yield; stop both."""
    env = session_secrets()
    with ExitStack() as stack:
        influx = stack.enter_context(
            influx_with_admin(
                cache, INFLUX_NAME, free_port(), (env["INFLUXDB_ADMIN_USER"], env["INFLUXDB_ADMIN_PASSWORD"])
            )
        )
        es = stack.enter_context(secured_elasticsearch(cache, free_port(), free_port(), env["ELASTIC_PASSWORD"]))
        env["FLOWSTAT_ES_CA_FILE"] = str(es.ca_file)
        s = SecuredStack(es.url, influx.url, es.ca_file, env, es, influx)
        out = s.provision()
        assert out.returncode == 0, f"flowstat provision failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        yield s


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wipe(home: Path, subfolders: tuple[str, ...]) -> None:
    for sub in subfolders:
        shutil.rmtree(home / sub, ignore_errors=True)
