"""Verdict and edge points as flowstat verdict writes them (verdict.schema.json, edge.schema.json),
written straight into the stack's InfluxDB and Elasticsearch: the service is not needed to test
what reads them (the run view's flow panels, the held-back alert)."""

from __future__ import annotations

import json

import requests

from flowstat.schema import flow as flow_schema
from flowstat.schema.sample import time_ns
from flowstat.stores import elasticsearch as es_store
from flowstat.timeutil import iso_utc_from_ms


def verdict(run_id: str, t_ms: int, nodes: str = "", flow: str | None = None) -> dict:
    """A verdict at t_ms (epoch ms): held back by ``nodes`` (comma-joined), or none."""
    doc = {"time": iso_utc_from_ms(t_ms), "run_id": run_id}
    named = [n for n in nodes.split(",") if n]
    if named:
        doc["held_back_by"] = nodes
    doc |= {
        "flow": flow or ("held_back" if named else "none"),
        "held": len(named),
        "evidence": f"{named[0]}: busy 97%" if named else "every node keeps up (busiest: merger-0 busy 40%)",
        "window_s": 10.0,
    }
    return doc


def edge(run_id: str, t_ms: int, source: str, target: str, rate: float, estimated: bool = False) -> dict:
    return {
        "time": iso_utc_from_ms(t_ms),
        "run_id": run_id,
        "from": source,
        "to": target,
        "objects_per_second": rate,
        "estimated": estimated,
    }


def write(stack, kind: str, docs: list[dict]) -> None:
    """The points into InfluxDB (line protocol) and Elasticsearch (_bulk into the daily index, made
    first with the schema's mapping when no template made it), searchable when this returns."""
    for doc in docs:
        assert not flow_schema.validate(kind, doc), flow_schema.validate(kind, doc)
    body = "".join(flow_schema.to_line_protocol(kind, d) + "\n" for d in docs)
    r = requests.post(f"{stack['influxdb'].url}/write", params={"db": "flowstat"}, data=body.encode(), timeout=30)
    assert r.status_code == 204, r.text
    es = stack["elasticsearch"].url
    prefix = es_store.FLOW_INDICES[kind]
    mapping = {"properties": es_store.mapping(flow_schema.schema(kind)["properties"])}
    for index in {es_store.daily_index(prefix, time_ns(d["time"])) for d in docs}:
        made = requests.put(f"{es}/{index}", json={"mappings": mapping}, timeout=30)
        assert made.status_code == 200 or "already_exists" in made.text, made.text
    lines = []
    for d in docs:
        index = es_store.daily_index(prefix, time_ns(d["time"]))
        ident = "/".join([d["run_id"], d.get("from", ""), d.get("to", ""), d["time"]])
        lines += [json.dumps({"index": {"_index": index, "_id": ident}}), json.dumps(d)]
    r = requests.post(
        f"{es}/_bulk", data="\n".join(lines) + "\n", headers={"Content-Type": "application/x-ndjson"}, timeout=30
    )
    assert r.status_code == 200 and not r.json()["errors"], r.text[:2000]
    requests.post(f"{es}/{prefix}*/_refresh", timeout=30).raise_for_status()
