"""The store-side half of scripts/compose-check, run inside the compose stack by the flowstat image
(`docker compose run --rm --no-deps -T --entrypoint python harness - < this file`): there the
service names resolve and the harness's runs are mounted. Reads .env's credentials from its
environment (passed by name, never on a command line) and prints one JSON object:

- ``users``: each Elasticsearch and InfluxDB user of .env, and whether the store takes its
  password (a refusal: .env and the stores disagree; `docker compose up setup` converges them);
- ``runs``: for the newest harness runs (runs/RUN_ID in the harness-runs volume), what the run
  file holds (node samples, self-samples, finished) beside what each store holds of that run:
  node samples per agent, self-samples, and the run document (finished or pending); in
  Elasticsearch, also the samples the rollup service averages per agent (checked once the run has
  been over for ROLLUP_LAG_S);
- ``alerts``: whether the alert inbox answers, the alerts it holds per run, and whether ElastAlert2
  has run its rules in the last 2 minutes (its status index, read as its own user).

Every problem found is also a line of ``problems``, saying what is wrong and where to look.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import requests

ES = os.environ.get("CHECK_ES", "http://elasticsearch:9200")
INFLUX = os.environ.get("CHECK_INFLUX", "http://influxdb:8086")
INBOX = os.environ.get("CHECK_INBOX", "http://alerts:9095")
RUNS = Path(os.environ.get("CHECK_RUNS", "/var/lib/flowstat/runs"))
NEWEST = int(os.environ.get("CHECK_RUNS_NEWEST", "5"))
ALSO = [r for r in os.environ.get("CHECK_RUN_IDS", "").split(",") if r]  # runs to count that are not in the volume
ES_USERS = {
    "elastic": "ELASTIC_PASSWORD",
    "flowstat_logstash": "LOGSTASH_ES_PASSWORD",
    "flowstat_agent": "AGENT_ES_PASSWORD",
    "flowstat_grafana": "GRAFANA_ES_PASSWORD",
    "flowstat_elastalert": "ELASTALERT_ES_PASSWORD",
    "flowstat_rollup": "ROLLUP_ES_PASSWORD",
    "flowstat_verdict": "VERDICT_ES_PASSWORD",
}
INFLUX_WHO = ("ADMIN", "WRITER", "READER", "REPLAY", "VERDICT")
problems: list[str] = []


def es_auth(user: str) -> tuple[str, str]:
    return user, os.environ.get(ES_USERS[user], "")


def es(method: str, path: str, user: str = "flowstat_grafana", **kw) -> requests.Response:
    return requests.request(method, ES + path, auth=es_auth(user), timeout=30, **kw)


def influx(q: str, who: str = "READER") -> requests.Response:
    return requests.post(
        f"{INFLUX}/query",
        params={"q": q, "db": "flowstat", "epoch": "ns"},
        timeout=30,
        auth=(os.environ.get(f"INFLUXDB_{who}_USER", ""), os.environ.get(f"INFLUXDB_{who}_PASSWORD", "")),
    )


def check_users() -> dict:
    out = {}
    for user, var in ES_USERS.items():
        try:
            r = es("GET", "/_security/_authenticate", user)
            out[f"elasticsearch:{user}"] = r.status_code == 200
            if r.status_code != 200:
                problems.append(
                    f"Elasticsearch refuses {user} (HTTP {r.status_code}): .env's {var} is not its "
                    f"password there (`docker compose up setup` sets it; ELASTIC_PASSWORD is taken at "
                    f"the first start only)"
                )
        except requests.RequestException as exc:
            out[f"elasticsearch:{user}"] = False
            problems.append(
                f"Elasticsearch at {ES} does not answer ({type(exc).__name__}): " f"`docker compose logs elasticsearch`"
            )
            break
    for who in INFLUX_WHO:
        user = os.environ.get(f"INFLUXDB_{who}_USER", "")
        try:
            r = influx("SHOW DATABASES", who)
            # 401 is a wrong password; a 403 (the writer may not read) is a login that worked
            ok = r.status_code in (200, 403) and "authorization failed" not in r.text
            out[f"influxdb:{user}"] = ok
            if not ok:
                problems.append(
                    f"InfluxDB refuses {user} (HTTP {r.status_code}: {r.text.strip()[:120]}): .env's "
                    f"INFLUXDB_{who}_PASSWORD is not its password there (`docker compose up setup`)"
                )
        except requests.RequestException as exc:
            out[f"influxdb:{user}"] = False
            problems.append(
                f"InfluxDB at {INFLUX} does not answer ({type(exc).__name__}): `docker compose logs influxdb`"
            )
            break
    return out


def run_file(run_dir: Path) -> dict:
    """What the run's file holds: node samples and self-samples (the Python agent's), and the run."""
    nodes = selfs = 0
    for line in (run_dir / "samples.ndjson").open("rb"):
        if line.startswith(b'{"flowstat_agent"'):
            selfs += 1
        elif line.startswith(b'{"flowstat_run"'):
            continue
        elif line.strip():
            nodes += 1
    try:
        doc = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        doc = {}
    return {
        "node_samples": nodes,
        "self_samples": selfs,
        "finished": doc.get("finished"),
        "verdict": (doc.get("verdict") or {}).get("ok") if isinstance(doc.get("verdict"), dict) else doc.get("verdict"),
    }


def es_counts(run_id: str) -> dict:
    body = {"size": 0, "query": {"term": {"run_id": run_id}}, "aggs": {"agents": {"terms": {"field": "agent"}}}}
    r = es("POST", "/flowstat-samples*/_search", json=body)
    counts = {b["key"]: b["doc_count"] for b in r.json()["aggregations"]["agents"]["buckets"]} if r.ok else {}
    r = es("POST", "/flowstat-agents*/_count", json={"query": {"term": {"run_id": run_id}}})
    r_doc = es("GET", f"/flowstat-runs/_doc/{run_id}")
    doc = r_doc.json().get("_source") if r_doc.status_code == 200 else None
    body["aggs"]["agents"]["aggs"] = {"n": {"sum": {"field": "samples"}}}
    r_roll = es("POST", "/flowstat-node-10s*/_search", json=body)
    rolled = (
        {b["key"]: int(b["n"]["value"]) for b in r_roll.json()["aggregations"]["agents"]["buckets"]}
        if r_roll.ok
        else {}
    )
    return {
        "node_samples": counts,
        "rolled_up": rolled,  # samples the rollup service averages, per agent
        "self_samples": r.json().get("count") if r.ok else None,
        "run_document": None if doc is None else {"finished": doc.get("finished")},
    }


def influx_counts(run_id: str) -> dict:
    def series(q: str) -> list[dict]:
        r = influx(q)
        return (r.json()["results"][0].get("series") or []) if r.ok else []

    rid = run_id.replace("'", "\\'")
    nodes = {
        s["tags"]["agent"]: s["values"][0][1]
        for s in series(
            f"""SELECT count("seq") FROM "flowstat"."raw"."flowstat_node" WHERE "run_id" = '{rid}' GROUP BY "agent" """
        )
    }
    selfs = sum(
        s["values"][0][1]
        for s in series(
            f"""SELECT count("seq") FROM "flowstat"."raw"."flowstat_agent" WHERE "run_id" = '{rid}' GROUP BY "agent" """
        )
    )
    docs = series(f"""SELECT "finished" FROM "flowstat"."raw"."flowstat_run" WHERE "run_id" = '{rid}' """)
    return {
        "node_samples": nodes,
        "self_samples": selfs,
        "run_document": {"finished": docs[0]["values"][-1][1]} if docs else None,
    }


ROLLUP_LAG_S = 30  # the rollup service rolls a window up 2 s after its end, in a pass every 10 s


def _ended_a_while_ago(finished: str) -> bool:
    """Whether a run ended long enough ago for the rollup service to have rolled its last window up."""
    try:
        end = datetime.fromisoformat(finished.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return time.time() - end > ROLLUP_LAG_S


def check_runs() -> dict:
    dirs = (
        sorted((d for d in RUNS.iterdir() if (d / "samples.ndjson").exists()), key=lambda d: d.stat().st_mtime)
        if RUNS.is_dir()
        else []
    )
    out = {}
    for d in [*dirs[-NEWEST:], *(RUNS / r for r in ALSO if not (RUNS / r).exists())]:
        f = run_file(d) if d.exists() else None
        try:
            e, i = es_counts(d.name), influx_counts(d.name)
        except (requests.RequestException, ValueError, KeyError) as exc:
            problems.append(f"run {d.name}: the stores could not be read ({type(exc).__name__}: {exc})")
            continue
        out[d.name] = {"file": f, "elasticsearch": e, "influxdb": i}
        for store, got in (("Elasticsearch", e), ("InfluxDB", i)):
            if got["run_document"] is None:
                problems.append(f"run {d.name}: no run document in {store}")
            elif f and f["finished"] and got["run_document"]["finished"] != f["finished"]:
                problems.append(
                    f"run {d.name}: {store}'s run document is not the final one "
                    f"(finished {got['run_document']['finished']!r}, the run file's {f['finished']!r})"
                )
            if f and f["finished"] and store == "Elasticsearch" and _ended_a_while_ago(f["finished"]):
                stored, rolled = (
                    got["node_samples"].get("flowstat-agent-py", 0),
                    got["rolled_up"].get("flowstat-agent-py", 0),
                )
                if rolled != stored:
                    problems.append(
                        f"run {d.name}: the rollup averages {rolled} of the Python agent's {stored} samples in "
                        "Elasticsearch (`docker compose logs rollup`)"
                    )
            if f and f["finished"]:
                py = got["node_samples"].get("flowstat-agent-py", 0)
                if py != f["node_samples"]:
                    problems.append(
                        f"run {d.name}: {store} holds {py} of the Python agent's samples, its run file "
                        f"{f['node_samples']}"
                        + (" (Logstash's path)" if store == "Elasticsearch" else " (Telegraf's path)")
                    )
    return out


def check_alerts() -> dict:
    out: dict = {}
    try:
        out["inbox"] = requests.get(f"{INBOX}/health", timeout=10).status_code == 200
        alerts = requests.get(f"{INBOX}/alerts.json", timeout=10).json()
        alerts = alerts.get("alerts", alerts) if isinstance(alerts, dict) else alerts
        out["alerts"] = [
            {k: a.get(k) for k in ("rule", "uid", "run_id", "node_id", "source", "agent", "at")} for a in alerts
        ]
    except (requests.RequestException, ValueError) as exc:
        out["inbox"] = False
        problems.append(
            f"the alert inbox at {INBOX} does not answer ({type(exc).__name__}): `docker compose logs alerts`"
        )
    try:
        r = es(
            "POST",
            "/flowstat-elastalert_status/_count",
            "flowstat_elastalert",
            json={"query": {"range": {"@timestamp": {"gt": "now-2m"}}}},
        )
        out["elastalert_runs_2min"] = r.json().get("count") if r.ok else None
        if not out["elastalert_runs_2min"]:
            problems.append("ElastAlert2 ran no rule in the last 2 minutes: `docker compose logs elastalert`")
    except (requests.RequestException, ValueError) as exc:
        problems.append(f"ElastAlert2's status could not be read ({type(exc).__name__})")
    return out


def main() -> int:
    report = {"users": check_users()}
    if not any("does not answer" in p for p in problems):
        report["runs"] = check_runs()
    report["alerts"] = check_alerts()
    report["problems"] = problems
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
