"""``flowstat provision``: bring running servers to what flowstat needs, converging on every run.

It is the compose stack's one-shot ``setup`` service, and what a site with its own Elasticsearch,
Kibana or InfluxDB runs against them. Each step runs when its server's URL is given:

- ``elasticsearch``: waits for it; sets ``kibana_system``'s password; puts flowstat's roles and
  the users of Logstash, the agents (and replay), Grafana, ElastAlert2, the rollup and the verdict
  service (each the least it needs: write, write, read, read plus its own state, read the samples
  and write their means, read the samples and runs and write the verdicts); installs the index
  templates (the same code as ``flowstat stack up``).
- ``kibana``: waits for ``/api/status`` to say available; imports the saved objects with
  ``overwrite=true`` and fails unless every object was imported.
- ``influxdb``: as the admin, the database, retention policies and rollups (as ``flowstat stack
  up``); the writer (Telegraf, the agents), reader (Grafana), replay and verdict users, their
  passwords and grants. Replay needs ALL on the database: its rollup backfill (SELECT ... INTO)
  needs READ and WRITE, and a second GRANT on a database replaces the first instead of adding to
  it. The verdict service reads the samples and writes its verdicts (and ``--run`` deletes a run's
  verdicts before writing them again): ALL too.

``https://`` URLs are verified against the CA in FLOWSTAT_ES_CA_FILE / FLOWSTAT_INFLUX_CA_FILE
(default FLOWSTAT_CA_FILE, else the system's CAs).

Secrets come from the environment only (a command line is visible to every user of the machine),
named as docker-compose.yml and .env.example name them. ``--check`` only checks them: every one is
set, is not .env.example's placeholder and is long enough. The compose stack runs that check before
Elasticsearch and InfluxDB first start, because both keep the admin password of their first start.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import requests

from flowstat.registry import Command
from flowstat.stores import StoreDown
from flowstat.stores import elasticsearch as es_store
from flowstat.stores import elasticsearch_rollup as es_rollup
from flowstat.stores import influxdb as influx_store

HELP = "set up users, roles, templates and dashboards on running servers (the compose stack's setup)"
PARSER = dict(
    description="Converge running servers to what flowstat needs; idempotent, run it as often as you "
    "like. Each step runs when its server's URL is given. Secrets come from the environment "
    "(see .env.example): ELASTIC_PASSWORD, KIBANA_SYSTEM_PASSWORD, LOGSTASH_ES_PASSWORD, "
    "AGENT_ES_PASSWORD, GRAFANA_ES_PASSWORD, ELASTALERT_ES_PASSWORD, ROLLUP_ES_PASSWORD, "
    "VERDICT_ES_PASSWORD, INFLUXDB_ADMIN_USER/_PASSWORD, INFLUXDB_WRITER_USER/_PASSWORD, "
    "INFLUXDB_READER_USER/_PASSWORD, INFLUXDB_REPLAY_USER/_PASSWORD, "
    "INFLUXDB_VERDICT_USER/_PASSWORD. For https:// URLs, "
    "FLOWSTAT_ES_CA_FILE, FLOWSTAT_INFLUX_CA_FILE or FLOWSTAT_CA_FILE: the CA to trust.",
    epilog="Exit status: 0 done, 1 a step failed (it is named), 2 a secret is missing or unusable.",
)

PLACEHOLDER = "change-me"  # what .env.example holds instead of each secret
ELASTIC_USER = "elastic"
INFLUX_DB = influx_store.DATABASE
ES_INDICES = [f"{es_store.SAMPLES_INDEX}*", f"{es_store.AGENTS_INDEX}*", f"{es_store.RUNS_INDEX}*"]
ROLLUP_INDICES = [f"{es_rollup.ROLLUP_INDEX}*"]  # the samples' per-node 10 s means (flowstat rollup)
VERDICT_INDICES = [f"{es_store.VERDICTS_INDEX}*", f"{es_store.EDGES_INDEX}*"]  # flowstat verdict's (read by the views)
ELASTALERT_INDEX = "flowstat-elastalert*"  # ElastAlert's writeback index and its _status, _error... siblings
AUTH_GRACE_S = 90.0  # how long a restarted Elasticsearch may refuse the right password (security index recovering)


class ProvisionError(RuntimeError):
    """A step that failed: the message names the server, the call and what to do."""


@dataclass(frozen=True)
class Secret:
    env: str
    min_length: int
    what: str


# Every secret of the compose stack, checked before anything starts. Kibana's encryption keys must
# be 32 characters at least (Kibana refuses shorter ones).
SECRETS = [
    Secret("ELASTIC_PASSWORD", 12, "Elasticsearch's superuser `elastic`"),
    Secret("KIBANA_SYSTEM_PASSWORD", 12, "the built-in user Kibana connects as"),
    Secret("KIBANA_ENCRYPTION_KEY", 32, "Kibana's encryption key for saved objects, sessions and reports"),
    Secret("LOGSTASH_ES_PASSWORD", 12, "the user Logstash writes the samples with"),
    Secret("AGENT_ES_PASSWORD", 12, "the user the agents and replay write to Elasticsearch with"),
    Secret("GRAFANA_ES_PASSWORD", 12, "the user Grafana reads Elasticsearch with"),
    Secret("ELASTALERT_ES_PASSWORD", 12, "the user ElastAlert2 reads and keeps its state with"),
    Secret("ROLLUP_ES_PASSWORD", 12, "the user the rollup reads the samples and writes their 10 s means with"),
    Secret("VERDICT_ES_PASSWORD", 12, "the user the verdict service reads the samples and writes its verdicts with"),
    Secret("INFLUXDB_ADMIN_PASSWORD", 12, "InfluxDB's admin"),
    Secret("INFLUXDB_WRITER_PASSWORD", 12, "the InfluxDB user Telegraf writes with"),
    Secret("INFLUXDB_READER_PASSWORD", 12, "the InfluxDB user Grafana reads with"),
    Secret("INFLUXDB_REPLAY_PASSWORD", 12, "the InfluxDB user replay writes and rolls up with"),
    Secret("INFLUXDB_VERDICT_PASSWORD", 12, "the InfluxDB user the verdict service reads and writes its verdicts with"),
    Secret("GRAFANA_ADMIN_PASSWORD", 12, "Grafana's admin (used at Grafana's first start)"),
]


# -- Elasticsearch's security: roles and users ------------------------------------------------------
ROLES: dict[str, dict] = {
    # Logstash, the agents and replay index each document with its own id (a resent sample
    # overwrites itself): `index`, not only `create_doc`; the first document of a day's index
    # creates it from the template. The edges' indices too: the agents' edge counters go there.
    "flowstat_writer": {
        "cluster": ["monitor"],
        "indices": [{"names": ES_INDICES + [f"{es_store.EDGES_INDEX}*"], "privileges": ["create_index", "index"]}],
    },
    # Grafana: the version (monitor), the mappings (view_index_metadata), the searches (read).
    "flowstat_reader": {
        "cluster": ["monitor"],
        "indices": [
            {"names": ES_INDICES + ROLLUP_INDICES + VERDICT_INDICES, "privileges": ["read", "view_index_metadata"]}
        ],
    },
    # flowstat rollup reads the samples and writes their per-node means, overwriting a window again.
    "flowstat_rollup": {
        "cluster": ["monitor"],
        "indices": [
            {"names": [f"{es_store.SAMPLES_INDEX}*"], "privileges": ["read", "view_index_metadata"]},
            {"names": ROLLUP_INDICES, "privileges": ["create_index", "index", "read", "view_index_metadata"]},
        ],
    },
    # flowstat verdict reads the samples and the run documents (their edges) and writes the verdicts
    # and edge rates, each under its own _id, overwriting itself when a run is judged again: `index`,
    # not `write` (no delete: --run clears nothing in Elasticsearch).
    "flowstat_verdict": {
        "cluster": ["monitor"],
        "indices": [
            {"names": [f"{es_store.SAMPLES_INDEX}*", f"{es_store.RUNS_INDEX}*"], "privileges": ["read"]},
            {"names": VERDICT_INDICES, "privileges": ["create_index", "index", "read"]},
        ],
    },
    # ElastAlert2 reads the samples (and the verdicts: "pipeline held back") and keeps its state in
    # indices of its own, which it creates.
    "flowstat_alerter": {
        "cluster": ["monitor"],
        "indices": [
            {"names": ES_INDICES + VERDICT_INDICES, "privileges": ["read", "view_index_metadata"]},
            {"names": [ELASTALERT_INDEX], "privileges": ["all"]},
        ],
    },
}


@dataclass(frozen=True)
class EsUser:
    name: str
    password_env: str
    roles: tuple[str, ...]


USERS = [
    EsUser("flowstat_logstash", "LOGSTASH_ES_PASSWORD", ("flowstat_writer",)),
    EsUser("flowstat_agent", "AGENT_ES_PASSWORD", ("flowstat_writer",)),  # the agents, replay
    EsUser("flowstat_grafana", "GRAFANA_ES_PASSWORD", ("flowstat_reader",)),
    EsUser("flowstat_elastalert", "ELASTALERT_ES_PASSWORD", ("flowstat_alerter",)),
    EsUser("flowstat_rollup", "ROLLUP_ES_PASSWORD", ("flowstat_rollup",)),
    EsUser("flowstat_verdict", "VERDICT_ES_PASSWORD", ("flowstat_verdict",)),
]
BUILTIN_PASSWORDS = {"kibana_system": "KIBANA_SYSTEM_PASSWORD"}


@dataclass(frozen=True)
class Call:
    """One request of the set-up: what the tests check against Elasticsearch's REST API spec."""

    api: str  # the spec's name for it, e.g. security.put_user
    method: str
    path: str
    body: dict


def security_calls(env: Mapping[str, str]) -> list[Call]:
    """Elasticsearch's security set-up, in order: built-in passwords, roles, then users. Putting a
    role or a user again replaces it, and a user's password with it: each run converges."""
    calls = [
        Call("security.change_password", "POST", f"/_security/user/{user}/_password", {"password": env[var]})
        for user, var in BUILTIN_PASSWORDS.items()
    ]
    calls += [Call("security.put_role", "PUT", f"/_security/role/{name}", body) for name, body in ROLES.items()]
    calls += [
        Call(
            "security.put_user",
            "PUT",
            f"/_security/user/{u.name}",
            {"password": env[u.password_env], "roles": list(u.roles), "enabled": True},
        )
        for u in USERS
    ]
    return calls


# -- secrets ----------------------------------------------------------------------------------------
def secret_problems(env: Mapping[str, str], secrets: list[Secret] = SECRETS) -> list[str]:
    """What is wrong with the secrets, one line each (empty: all usable)."""
    out = []
    for s in secrets:
        value = env.get(s.env, "")
        if not value:
            out.append(f"{s.env} is not set ({s.what})")
        elif PLACEHOLDER in value.lower():
            out.append(
                f"{s.env} still holds .env.example's placeholder ({s.what}): put a secret of your own "
                f"(scripts/new-env writes random ones)"
            )
        elif len(value) < s.min_length:
            out.append(f"{s.env} is {len(value)} characters; {s.min_length} at least ({s.what})")
        elif "'" in value and s.env == "INFLUXDB_ADMIN_PASSWORD":
            out.append(f"{s.env} holds ', which InfluxDB's first start cannot take (it quotes the password with it)")
    return out


# -- waiting ----------------------------------------------------------------------------------------
def wait_for(
    what: str, probe: Callable[[], str | None], timeout_s: float, say: Callable[[str], None], every_s: float = 2.0
) -> None:
    """Call ``probe`` until it answers None (ready) or ``timeout_s`` pass; it returns why not yet.
    A ProvisionError from the probe is final (e.g. a wrong password): no use waiting."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        why = probe()
        if why is None:
            return
        if why != last:
            say(f"waiting for {what}: {why}")
            last = why
        if time.monotonic() >= deadline:
            raise ProvisionError(f"{what} not ready after {timeout_s:.0f} s: {why}")
        time.sleep(every_s)


# The variable naming the CA file each session trusts (trust()), for the message when a certificate is not trusted.
_CA_ENV: weakref.WeakKeyDictionary[requests.Session, str] = weakref.WeakKeyDictionary()


def _request(session: requests.Session, method: str, url: str, **kw) -> requests.Response | str:
    """The answer, or why there is none (for wait_for). A certificate not trusted is final."""
    # verify given each time: requests prefers REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE to the session's
    kw.setdefault("verify", session.verify)
    try:
        return session.request(method, url, timeout=kw.pop("timeout", 10.0), allow_redirects=False, **kw)
    except requests.exceptions.SSLError as exc:
        ca_env = _CA_ENV.get(session, "FLOWSTAT_CA_FILE")
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            raise ProvisionError(
                f"TLS: the certificate of {urlsplit(url).netloc} is not trusted "
                f"(set {ca_env} to the CA that signed it)"
            ) from exc
        return f"no answer at {url} (TLS: {exc})"
    except requests.RequestException as exc:
        return f"no answer at {url} ({type(exc).__name__})"


def trust(session: requests.Session, env: Mapping[str, str], ca_env: str) -> None:
    """Verify https:// answers against the CA file ``ca_env`` (else FLOWSTAT_CA_FILE, else the
    system's CAs) names."""
    name = ca_env if env.get(ca_env) else "FLOWSTAT_CA_FILE"
    _CA_ENV[session] = ca_env  # named when a certificate is not trusted
    path = env.get(name)
    if path:
        if not Path(path).is_file():
            raise ProvisionError(f"{name}={path}: no such file (the PEM file of the CA that signed the certificate)")
        session.verify = path


# -- Elasticsearch --------------------------------------------------------------------------------
class ElasticsearchSetup:
    def __init__(self, url: str, env: Mapping[str, str], say: Callable[[str], None], secured: bool = True):
        self.url = url.rstrip("/")
        self.env = env
        self.say = say
        self.secured = secured
        self.session = requests.Session()
        trust(self.session, env, "FLOWSTAT_ES_CA_FILE")
        self._refused_since: float | None = None
        if secured:
            self.session.auth = (ELASTIC_USER, env["ELASTIC_PASSWORD"])

    def _ready(self) -> str | None:
        resp = _request(self.session, "GET", f"{self.url}/_cluster/health")
        if isinstance(resp, str):
            return resp
        if resp.status_code == 401:
            # A restarted node answers before its security index has recovered, and refuses every
            # password meanwhile: a refusal is final only once it has lasted.
            refused = (
                f"Elasticsearch at {self.url} refused user {ELASTIC_USER}'s password (HTTP 401). "
                f"ELASTIC_PASSWORD is taken once, at Elasticsearch's first start, into its data volume: "
                f"put back the one it started with, or change it there first "
                f"(bin/elasticsearch-reset-password -u elastic)"
            )
            self._refused_since = self._refused_since or time.monotonic()
            if time.monotonic() - self._refused_since > AUTH_GRACE_S:
                raise ProvisionError(f"{refused}; refused for {AUTH_GRACE_S:.0f} s")
            return refused
        self._refused_since = None
        if resp.status_code != 200:
            return f"HTTP {resp.status_code}"
        status = resp.json().get("status")
        return None if status in ("green", "yellow") else f"cluster status {status}"

    def wait(self, timeout_s: float) -> None:
        wait_for(f"Elasticsearch at {self.url}", self._ready, timeout_s, self.say)

    def apply(self, call: Call) -> dict:
        resp = _request(self.session, call.method, self.url + call.path, json=call.body)
        if isinstance(resp, str) or resp.status_code >= 300:
            why = resp if isinstance(resp, str) else f"HTTP {resp.status_code}: {resp.text[:300]}"
            raise ProvisionError(f"Elasticsearch {call.method} {call.path} failed: {why}")
        return resp.json()

    def security(self) -> None:
        for call in security_calls(self.env):
            self.apply(call)
            self.say(f"elasticsearch: {call.method} {call.path}")

    def templates(self) -> None:
        writer = es_store.ElasticsearchWriter(self.url)
        writer.session.auth, writer.session.verify = self.session.auth, self.session.verify
        try:
            for path in writer.install():
                self.say(f"elasticsearch: installed {path}")
        except (RuntimeError, StoreDown) as exc:
            raise ProvisionError(f"Elasticsearch templates: {exc}") from exc
        finally:
            writer.close()


# -- Kibana ---------------------------------------------------------------------------------------
def import_problems(answer: dict, expected: int) -> list[str]:
    """Why a saved objects import answer is not a complete import of ``expected`` objects."""
    out = [f"{e.get('type')}/{e.get('id')}: {json.dumps(e.get('error'))}" for e in answer.get("errors") or []]
    if not answer.get("success"):
        out.append("Kibana answered success: false")
    if answer.get("successCount") != expected:
        out.append(f"{answer.get('successCount')} of {expected} objects imported")
    return out


class KibanaSetup:
    def __init__(self, url: str, env: Mapping[str, str], say: Callable[[str], None], secured: bool = True):
        self.url = url.rstrip("/")
        self.say = say
        self.session = requests.Session()
        trust(self.session, env, "FLOWSTAT_CA_FILE")
        if secured:
            self.session.auth = (ELASTIC_USER, env["ELASTIC_PASSWORD"])
        self.session.headers["kbn-xsrf"] = "flowstat"  # Kibana refuses API writes without it

    def _ready(self) -> str | None:
        resp = _request(self.session, "GET", f"{self.url}/api/status")
        if isinstance(resp, str):
            return resp
        if resp.status_code != 200:
            return f"HTTP {resp.status_code}"
        try:
            status = resp.json()["status"]
            level = status["overall"]["level"]
        except (ValueError, KeyError, TypeError):
            return "an answer without status.overall.level"
        # Kibana can say degraded for long (its task manager, on a small machine) while the saved
        # objects service, all an import needs, is available.
        objects = (status.get("core") or {}).get("savedObjects", {}).get("level")
        if level == "available" or objects == "available":
            return None
        return f"status {level}, saved objects {objects or 'unknown'}"

    def wait(self, timeout_s: float) -> None:
        wait_for(f"Kibana at {self.url}", self._ready, timeout_s, self.say)

    def import_objects(self, ndjson: bytes, name: str) -> int:
        expected = sum(1 for line in ndjson.splitlines() if line.strip())
        resp = _request(
            self.session,
            "POST",
            f"{self.url}/api/saved_objects/_import",
            params={"overwrite": "true"},
            files={"file": (name, ndjson, "application/ndjson")},
            timeout=120.0,
        )
        if isinstance(resp, str):
            raise ProvisionError(f"Kibana import of {name}: {resp}")
        try:
            answer = resp.json()
        except ValueError:
            answer = {}
        problems = (
            import_problems(answer, expected)
            if resp.status_code == 200
            else [f"HTTP {resp.status_code}: " f"{resp.text[:300]}"]
        )
        if problems:
            raise ProvisionError(f"Kibana import of {name} incomplete: " + "; ".join(problems[:5]))
        self.say(f"kibana: imported {expected} saved objects from {name}")
        return expected


# -- InfluxDB ---------------------------------------------------------------------------------------
def influx_user_statements(
    users: dict[str, tuple[str, str]], existing: dict[str, bool], db: str = INFLUX_DB
) -> list[str]:
    """What makes each of ``users`` (name -> (password, privilege READ|WRITE|ALL)) exist with that
    password and exactly that privilege on ``db``, given ``existing`` (name -> is admin). InfluxDB
    1.x keeps one privilege per user and database: a GRANT replaces the one before."""
    out = []
    for name, (password, privilege) in users.items():
        if name not in existing:
            out.append(f'CREATE USER "{name}" WITH PASSWORD {influx_store.string_literal(password)}')
        else:
            out.append(f'SET PASSWORD FOR "{name}" = {influx_store.string_literal(password)}')
            if existing[name]:
                out.append(f'REVOKE ALL PRIVILEGES FROM "{name}"')
        out.append(f'GRANT {privilege} ON "{db}" TO "{name}"')
    return out


# InfluxDB's users besides the admin, and their privilege on the flowstat database. Replay's
# rollup backfill (SELECT ... INTO) answers 403 "requires READ" with WRITE alone and "requires
# WRITE" with READ alone; a second GRANT replaces the first, so both is ALL on the database. The
# verdict service reads the samples and writes the verdicts: ALL as well.
INFLUX_USERS = {"WRITER": "WRITE", "READER": "READ", "REPLAY": "ALL", "VERDICT": "ALL"}


class InfluxSetup:
    def __init__(self, url: str, env: Mapping[str, str], say: Callable[[str], None]):
        self.url = url.rstrip("/")
        self.env = env
        self.say = say
        self.writer = influx_store.InfluxDBWriter(self.url, INFLUX_DB)
        trust(self.writer.session, env, "FLOWSTAT_INFLUX_CA_FILE")
        self.writer.session.auth = (env["INFLUXDB_ADMIN_USER"], env["INFLUXDB_ADMIN_PASSWORD"])

    def _ready(self) -> str | None:
        resp = _request(self.writer.session, "POST", f"{self.url}/query", params={"q": "SHOW USERS"})
        if isinstance(resp, str):
            return resp
        if resp.status_code in (401, 403):
            raise ProvisionError(
                f"InfluxDB at {self.url} refused admin {self.env['INFLUXDB_ADMIN_USER']!r} (HTTP {resp.status_code}). "
                f"The admin is made at InfluxDB's first start only: INFLUXDB_ADMIN_USER and _PASSWORD must be "
                f"the ones it started with"
            )
        return None if resp.status_code == 200 else f"HTTP {resp.status_code}"

    def wait(self, timeout_s: float) -> None:
        wait_for(f"InfluxDB at {self.url}", self._ready, timeout_s, self.say)

    def _query(self, statement: str) -> dict:
        try:
            return self.writer.query(statement)
        except (RuntimeError, StoreDown) as exc:
            raise ProvisionError(f"InfluxDB: {exc}") from exc

    def database(self) -> None:
        try:
            for done in self.writer.install():
                self.say(f"influxdb: {done}")
        except (RuntimeError, StoreDown) as exc:
            raise ProvisionError(f"InfluxDB set-up: {exc}") from exc

    def users(self) -> None:
        names = [self.env[f"INFLUXDB_{who}_USER"] for who in INFLUX_USERS]
        if len(set(names)) < len(names) or self.env["INFLUXDB_ADMIN_USER"] in names:
            whos = [who.lower() for who in INFLUX_USERS]
            raise ProvisionError(
                f"InfluxDB: the {', '.join(whos[:-1])} and {whos[-1]} users must be distinct users, "
                "none of them the admin ("
                + ", ".join(f"INFLUXDB_{who}_USER={name}" for who, name in zip(INFLUX_USERS, names, strict=False))
                + ")"
            )
        wanted = {
            self.env[f"INFLUXDB_{who}_USER"]: (self.env[f"INFLUXDB_{who}_PASSWORD"], privilege)
            for who, privilege in INFLUX_USERS.items()
        }
        series = self._query("SHOW USERS")["results"][0].get("series", [{}])[0]
        existing = {row[0]: bool(row[1]) for row in series.get("values", [])}
        for statement in influx_user_statements(wanted, existing):
            self._query(statement)
            self.say("influxdb: " + statement.split(" WITH PASSWORD")[0].split(" = ")[0])


# -- the command --------------------------------------------------------------------------------------
STEPS = ("elasticsearch", "kibana", "influxdb")
# What each step reads from the environment: derived from the users it makes.
NEEDS = {
    "elasticsearch": ["ELASTIC_PASSWORD", *BUILTIN_PASSWORDS.values(), *(u.password_env for u in USERS)],
    "kibana": ["ELASTIC_PASSWORD"],
    "influxdb": [f"INFLUXDB_{who}_{what}" for who in ("ADMIN", *INFLUX_USERS) for what in ("USER", "PASSWORD")],
}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--es", metavar="URL", help="Elasticsearch (e.g. http://elasticsearch:9200): security, templates")
    p.add_argument("--kibana", metavar="URL", help="Kibana (e.g. http://kibana:5601): the saved objects")
    p.add_argument(
        "--kibana-objects",
        metavar="FILE",
        type=Path,
        help="the saved objects to import (default: the ones this flowstat generates, as in "
        "dashboards/kibana/flowstat.ndjson)",
    )
    p.add_argument("--influx", metavar="URL", help="InfluxDB 1.x with authentication on (e.g. http://influxdb:8086)")
    p.add_argument(
        "--no-security",
        action="store_true",
        help="Elasticsearch and Kibana run without security: no users, roles or credentials",
    )
    p.add_argument(
        "--timeout",
        metavar="S",
        type=float,
        default=300.0,
        help="how long to wait for each server to answer (default 300)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="only check the secrets in the environment (every one " "of the compose stack), then exit",
    )


def _kibana_objects(path: Path | None) -> tuple[bytes, str]:
    if path is None:
        from flowstat.views import kibana

        ((name, text),) = kibana.files().items()
        return text.encode(), name
    try:
        return path.read_bytes(), str(path)
    except OSError as exc:
        raise ProvisionError(f"--kibana-objects {path}: {exc.strerror}") from exc


def provision(args: argparse.Namespace, env: Mapping[str, str], say: Callable[[str], None] = print) -> None:
    if args.es:
        es = ElasticsearchSetup(args.es, env, say, secured=not args.no_security)
        es.wait(args.timeout)
        if es.secured:
            es.security()
        es.templates()
    if args.influx:
        influx = InfluxSetup(args.influx, env, say)
        influx.wait(args.timeout)
        influx.database()
        influx.users()
    if args.kibana:  # last: Kibana is the slowest to start, and nothing else waits on its objects
        ndjson, name = _kibana_objects(args.kibana_objects)
        kibana = KibanaSetup(args.kibana, env, say, secured=not args.no_security)
        kibana.wait(args.timeout)
        kibana.import_objects(ndjson, name)


def main(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env

    def say(line: str) -> None:
        print(f"flowstat provision: {line}", flush=True)

    if args.check:
        problems = secret_problems(env)
    else:
        steps = [
            s for s, url in (("elasticsearch", args.es), ("kibana", args.kibana), ("influxdb", args.influx)) if url
        ]
        if not steps:
            print(
                "flowstat provision: nothing to do: give --es, --kibana and/or --influx (see --help)", file=sys.stderr
            )
            return 2
        needed = {var for s in steps for var in NEEDS[s] if not (args.no_security and s in ("elasticsearch", "kibana"))}
        problems = secret_problems(env, [s for s in SECRETS if s.env in needed])
        problems += [f"{var} is not set" for var in sorted(needed) if var.endswith("_USER") and not env.get(var)]
    if problems:
        for line in problems:
            print(f"flowstat provision: {line}", file=sys.stderr)
        return 2
    if args.check:
        say(f"the {len(SECRETS)} secrets are set")
        return 0
    try:
        provision(args, env, say)
    except ProvisionError as exc:
        print(f"flowstat provision: {exc}", file=sys.stderr)
        return 1
    say("done")
    return 0


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
