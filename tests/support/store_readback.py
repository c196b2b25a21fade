"""Reading samples and self-samples back from the real InfluxDB and Elasticsearch, and holding
them to what was written, field by field: every field the written document holds is stored with
its value (integers exactly, numbers within 1e-9 relative, booleans as booleans, times to the ms),
as the kind its schema says (tags as tags and keywords, fields of their type, times as dates), and
nothing more."""

from __future__ import annotations

import math

import requests

from flowstat.schema.sample import time_ns

INFLUX_TYPES = {"integer": "integer", "number": "float", "boolean": "boolean", "string": "string"}
ES_MAPPED = {"integer": "long", "number": "double", "boolean": "boolean", "string": "keyword"}


# How a sample and a self-sample are found again in a store: by node and seq, and by seq.
NODE_KEY, SEQ = (lambda d: (d["node_id"], d["seq"])), (lambda d: d["seq"])


def is_date(module, name: str) -> bool:
    return module.schema()["properties"][name].get("format") == "date-time"


def same_value(module, field, written, stored, time_in_ns: bool = False) -> bool:
    """A stored value equal to the written one as its schema type reads it."""
    if field.influx == "time" and time_in_ns:  # InfluxDB's point time, queried with epoch=ns
        return stored == time_ns(written)
    if is_date(module, field.name):
        return isinstance(stored, str) and time_ns(stored) == time_ns(written)
    if field.type == "integer":
        return type(stored) is int and stored == written
    if field.type == "number":
        return type(stored) in (int, float) and math.isclose(stored, written, rel_tol=1e-9)
    if field.type == "boolean":
        return stored is written
    return stored == written


def assert_stored_as_written(module, written: dict, stored: dict, where: str, time_in_ns: bool = False) -> None:
    """Every field the written document holds is in the stored one with its value, and nothing else."""
    held = {k for k, v in stored.items() if v is not None}
    assert held == set(written), (where, "missing:", set(written) - held, "extra:", held - set(written))
    for f in module.fields():
        if f.name in written:
            assert same_value(module, f, written[f.name], stored[f.name], time_in_ns), (
                where,
                f.name,
                written[f.name],
                stored[f.name],
            )


def influx_points(influx, db: str, measurement: str, where: str) -> list[dict]:
    """Every point of a measurement that `where` (InfluxQL) selects: tags and fields, time in ns."""
    body = influx.query(f'SELECT * FROM "{measurement}" WHERE {where}', db)
    return [
        dict(zip(s["columns"], row, strict=False)) for s in body["results"][0].get("series", []) for row in s["values"]
    ]


def assert_influx_kinds(influx, db: str, module, written: list[dict]) -> None:
    """Tags stored as tags and fields as fields of their schema type (InfluxDB fixes a field's type
    at its first write: a float written as an integer would refuse every later point)."""
    held = {k for doc in written for k in doc}
    measurement = module.measurement()
    tags = influx.query(f'SHOW TAG KEYS FROM "{measurement}"', db)["results"][0]["series"][0]["values"]
    fields = dict(influx.query(f'SHOW FIELD KEYS FROM "{measurement}"', db)["results"][0]["series"][0]["values"])
    tags = {t for (t,) in tags}
    for f in module.fields():
        if f.name in held and f.influx == "tag":
            assert f.name in tags and f.name not in fields, (measurement, f.name)
        elif f.name in held and f.influx == "field":
            assert fields.get(f.name) == INFLUX_TYPES[f.type] and f.name not in tags, (measurement, f.name)


def compare_influx(influx, db: str, module, written: dict, key, where: str) -> None:
    """The points `where` selects are `written` (by `key`), each once, field by field."""
    points = influx_points(influx, db, module.measurement(), where)
    assert sorted(map(key, points)) == sorted(written)
    for point in points:
        assert_stored_as_written(module, written[key(point)], point, f"{db} {key(point)}", time_in_ns=True)
    assert_influx_kinds(influx, db, module, list(written.values()))


def es_documents(es, index: str, query: dict) -> list[dict]:
    """The documents `query` finds: their _source, and the time as Elasticsearch indexed it (ms)."""
    requests.post(f"{es.url}/{index}/_refresh", timeout=30).raise_for_status()
    hits = requests.post(
        f"{es.url}/{index}/_search",
        json={"size": 10000, "query": query, "docvalue_fields": [{"field": "time", "format": "epoch_millis"}]},
        timeout=30,
    ).json()["hits"]["hits"]
    return [{**h["_source"], "_indexed_ms": int(h["fields"]["time"][0])} for h in hits]


def assert_es_kinds(es, index: str, module, written: list[dict]) -> None:
    """Each field mapped as its schema type says (strings as keywords, times as dates)."""
    held = {k for doc in written for k in doc}
    for name, mapping in requests.get(f"{es.url}/{index}/_mapping", timeout=30).json().items():
        props = mapping["mappings"]["properties"]
        for f in module.fields():
            if f.name in held:
                assert props[f.name]["type"] == ("date" if is_date(module, f.name) else ES_MAPPED[f.type]), (
                    name,
                    f.name,
                )


def compare_es(es, index: str, module, written: dict, key, query: dict) -> None:
    """The documents `query` finds are `written` (by `key`), each once, field by field."""
    docs = es_documents(es, index, query)
    assert sorted(map(key, docs)) == sorted(written)
    for doc in docs:
        want = written[key(doc)]
        assert doc.pop("_indexed_ms") == time_ns(want["time"]) // 1_000_000, key(doc)
        assert_stored_as_written(module, want, doc, f"{index} {key(doc)}")
    assert_es_kinds(es, index, module, list(written.values()))
