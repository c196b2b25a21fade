"""Index templates and InfluxDB set-up, derived from the sample schema.

The files under index-templates/ are written by ``python -m flowstat.templates --write`` and
checked by the tests, so the mapping can never drift from collectors/schema/sample.schema.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SAMPLES_INDEX = "flowstat-samples"
RUNS_INDEX = "flowstat-runs"
INFLUX_DB = "flowstat"
ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "index-templates"

ES_TYPES = {"integer": {"type": "long"}, "number": {"type": "double"}, "boolean": {"type": "boolean"},
            "string": {"type": "keyword", "ignore_above": 256}}
DATE = {"type": "date", "format": "strict_date_optional_time||epoch_millis"}


def _schema() -> dict:
    from flowstat_agent import schema

    return schema.schema()


def sample_mapping() -> dict:
    """Explicit mapping of a sample document; strict: a field outside the schema is refused."""
    props = {}
    for name, p in _schema()["properties"].items():
        props[name] = DATE if p.get("format") == "date-time" else ES_TYPES[p["type"]]
    return {"dynamic": "strict", "properties": props}


def runs_mapping() -> dict:
    """One document per run: its parameters (as the harness records them) and its summary."""
    return {
        "dynamic": "strict",
        "properties": {
            "run_id": {"type": "keyword"}, "started": DATE, "finished": DATE, "host": {"type": "keyword"},
            "source": {"type": "keyword"}, "samples": {"type": "long"}, "nodes": {"type": "keyword"},
            # parameters and summary vary with the harness's version: the known ones are indexed,
            # others are kept in _source without changing the mapping (a deliberate choice).
            "parameters": {"type": "object", "dynamic": False, "properties": {
                "topology": {"type": "keyword"}, "object_type": {"type": "keyword"}, "object_bytes": {"type": "long"},
                "producers": {"type": "long"}, "rate_per_producer": {"type": "double"},
                "buffer_size": {"type": "long"}, "mergers": {"type": "long"},
                "producer_processes": {"type": "long"}, "duration_s": {"type": "double"}}},
            "summary": {"type": "object", "dynamic": False, "properties": {
                "ok": {"type": "boolean"}, "seconds": {"type": "double"}, "objects_sent": {"type": "long"},
                "merged_objects": {"type": "long"}, "merged_objects_per_second": {"type": "double"}}},
        },
    }


def elasticsearch_files() -> dict[str, dict]:
    settings = {"template": {"settings": {"number_of_shards": 1, "number_of_replicas": 0,
                                          "refresh_interval": "1s"}}}
    return {
        "component-flowstat-settings.json": settings,
        "component-flowstat-sample-mappings.json": {"template": {"mappings": sample_mapping()},
                                                    "_meta": {"source": "collectors/schema/sample.schema.json"}},
        "component-flowstat-run-mappings.json": {"template": {"mappings": runs_mapping()}},
        "index-template-flowstat-samples.json": {
            "index_patterns": [f"{SAMPLES_INDEX}*"], "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-sample-mappings"],
            "_meta": {"description": "flowstat samples: one document per node per agent per interval"}},
        "index-template-flowstat-runs.json": {
            "index_patterns": [f"{RUNS_INDEX}*"], "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-run-mappings"],
            "_meta": {"description": "flowstat runs: one document per run"}},
        # Used where the server has ILM (the compose stack's Elasticsearch); the Maven test zip has not.
        "ilm-policy-flowstat.json": {"policy": {"phases": {
            "hot": {"actions": {"rollover": {"max_age": "7d", "max_primary_shard_size": "20gb"}}},
            "delete": {"min_age": "90d", "actions": {"delete": {}}}}}},
        "component-flowstat-lifecycle.json": {"template": {"settings": {"index.lifecycle.name": "flowstat"}}},
        "index-template-flowstat-samples-ilm.json": {
            "index_patterns": [f"{SAMPLES_INDEX}*"], "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-sample-mappings", "flowstat-lifecycle"],
            "_meta": {"description": "flowstat samples, with the flowstat lifecycle policy (servers with ILM)"}},
    }


ROLLUP_FIELDS = ("cpu_clock_hz", "cpu_user_hz", "cpu_system_hz", "vmrss_kb", "threads", "average_merge_time_ms",
                 "merged_objects_per_second", "backlog")


def influx_statements(db: str = INFLUX_DB) -> list[str]:
    """Database, retention policies and continuous queries, in order.

    Rollups happen in two steps, as dateStat aggregated: per node, the mean of each bucket
    (flowstat_node_10s, _1m); then per run, role and agent, the sum over nodes of those means
    (flowstat_total_10s, _1m) — the aggregate rate at one time. Per agent, because two agents
    watching the same nodes must not add up to twice the rate. The second step resamples the last
    buckets so that it sees the first step's late results.
    """
    totals = ", ".join(f'sum("mean_{f}") AS "{f}"' for f in ROLLUP_FIELDS)
    out = [f'CREATE DATABASE "{db}"',
           f'CREATE RETENTION POLICY "raw" ON "{db}" DURATION 30d REPLICATION 1 DEFAULT',
           f'CREATE RETENTION POLICY "rollup" ON "{db}" DURATION 730d REPLICATION 1']
    for every, resample in (("10s", "1m"), ("1m", "5m")):
        out.append(f'CREATE CONTINUOUS QUERY "flowstat_node_{every}" ON "{db}" BEGIN SELECT mean(*) INTO '
                   f'"{db}"."rollup"."flowstat_node_{every}" FROM "{db}"."raw"."flowstat_node" '
                   f'GROUP BY time({every}), * END')
        out.append(f'CREATE CONTINUOUS QUERY "flowstat_total_{every}" ON "{db}" RESAMPLE EVERY {every} FOR {resample} '
                   f'BEGIN SELECT {totals} INTO "{db}"."rollup"."flowstat_total_{every}" '
                   f'FROM "{db}"."rollup"."flowstat_node_{every}" GROUP BY time({every}), "run_id", "role", "agent" END')
    return out


def render_files() -> dict[Path, str]:
    """Every generated file of index-templates/ and its content."""
    out = {TEMPLATES / "elasticsearch" / name: json.dumps(doc, indent=2) + "\n"
           for name, doc in elasticsearch_files().items()}
    out[TEMPLATES / "influxdb" / "setup.iql"] = (
        "-- Generated by `python -m flowstat.templates --write`; applied by `flowstat stack up`, and by\n"
        "-- the influxdb container's first start (docker-compose.yml). By hand:\n"
        "--   influx -host 127.0.0.1 -port 8086 -execute \"$(cat setup.iql)\"\n"
        # ';' between statements, none after the last: influx -execute would read an empty statement
        + ";\n".join(influx_statements()) + "\n")
    return out


def write_files() -> list[Path]:
    written = []
    for path, text in render_files().items():
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for p in write_files():
            print(p.relative_to(ROOT))
    else:
        print("usage: python -m flowstat.templates --write", file=sys.stderr)
        sys.exit(2)


def install_elasticsearch(url: str) -> list[str]:
    """PUT every template (idempotent); the lifecycle policy only where the server has ILM."""
    import requests

    files = elasticsearch_files()
    done = []
    has_ilm = requests.get(f"{url}/_ilm/status", timeout=5).status_code == 200

    def put(path: str, body: dict) -> None:
        resp = requests.put(f"{url}/{path}", json=body, timeout=10)
        if resp.status_code >= 300:
            raise RuntimeError(f"elasticsearch {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        done.append(path)

    for name in ("flowstat-settings", "flowstat-sample-mappings", "flowstat-run-mappings"):
        put(f"_component_template/{name}", files[f"component-{name}.json"])
    samples = files["index-template-flowstat-samples.json"]
    if has_ilm:
        put("_ilm/policy/flowstat", files["ilm-policy-flowstat.json"])
        put("_component_template/flowstat-lifecycle", files["component-flowstat-lifecycle.json"])
        samples = files["index-template-flowstat-samples-ilm.json"]
    put("_index_template/flowstat-samples", samples)
    put("_index_template/flowstat-runs", files["index-template-flowstat-runs.json"])
    return done


def install_influxdb(url: str, db: str = INFLUX_DB) -> list[str]:
    """Create the database and retention policies; (re)create the continuous queries so that
    their definitions follow this version."""
    import requests

    def q(statement: str) -> dict:
        resp = requests.post(f"{url}/query", params={"q": statement}, timeout=10)
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        errors = [r["error"] for r in body.get("results", []) if "error" in r]
        if resp.status_code >= 300 or errors:
            raise RuntimeError(f"influxdb {statement[:60]!r}: {errors[0] if errors else resp.text[:300]}")
        return body

    existing = set()
    for series in q("SHOW CONTINUOUS QUERIES")["results"][0].get("series", []):
        if series.get("name") == db:
            existing |= {row[0] for row in series.get("values", [])}
    done = []
    for statement in influx_statements(db):
        if statement.startswith("CREATE CONTINUOUS QUERY"):
            name = statement.split('"')[1]
            if name in existing:
                q(f'DROP CONTINUOUS QUERY "{name}" ON "{db}"')
        q(statement)
        done.append(statement.split(" BEGIN")[0])
    return done
