"""The flow series (verdict.schema.json and edge.schema.json, beside this file): which node holds a
run's flow back, judged over what a store holds, and the objects per second on each of its edges.
`flowstat verdict` writes them back beside the samples; the run and stack dashboards and the alerts
"pipeline held back by NODE for 60 s" read them.

Flat schemas like the self-sample's: encoded as a sample is (measurement x-measurement, tags
sorted, fields in schema order), checked field by field.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from . import _files
from ._flat import Field, read_fields
from ._flat import markdown_table as _markdown_table
from ._flat import to_json as _to_json
from .lineprotocol import point
from .sample import problems_with_time, time_ns

VERDICT_FILE = "verdict.schema.json"
EDGE_FILE = "edge.schema.json"
EDGE_RUN_FILE_KEY = "flowstat_edge"  # a run file's line {"flowstat_edge": {...}} holds an agent's edge counter


def schema(kind: str) -> dict[str, Any]:
    """``kind``: "verdict" or "edge"."""
    return _files.load(VERDICT_FILE if kind == "verdict" else EDGE_FILE)


@lru_cache(maxsize=2)
def fields(kind: str) -> tuple[Field, ...]:
    return read_fields(schema(kind))


def measurement(kind: str) -> str:
    name: str = schema(kind)["x-measurement"]
    return name


def validate(kind: str, doc: dict[str, Any]) -> list[str]:
    """Everything wrong with a verdict or edge point, naming the field; [] when it conforms."""
    return problems_with_time(doc, fields(kind))


def document_id(kind: str, doc: dict[str, Any]) -> str:
    """The Elasticsearch ``_id`` of a verdict (run_id/time) or an edge's rate (run_id/from/to/time),
    the time in epoch milliseconds: the same evaluation written again overwrites itself. An edge's
    counter: run_id/from/to/agent/time, the time as written (as Logstash's pipeline and the C agent
    make it, neither of which parses a time)."""
    if kind == "edge" and "agent" in doc:
        return f"{doc['run_id']}/{doc['from']}/{doc['to']}/{doc['agent']}/{doc['time']}"
    ms = time_ns(doc["time"]) // 1_000_000
    if kind == "verdict":
        return f"{doc['run_id']}/{ms}"
    return f"{doc['run_id']}/{doc['from']}/{doc['to']}/{ms}"


# The most a counter may hold: JSON's exact integers (what both agents take from a reply).
_COUNT_MAX = 2**53
SOURCE_MAX_BYTES = 127  # the longest source id an agent takes (the C agent's strings hold 127 bytes)


def _whole(count: Any) -> bool:
    return (
        isinstance(count, int | float)
        and not isinstance(count, bool)
        and 0 <= count <= _COUNT_MAX
        and count == int(count)
    )


def counter_points(sample: dict[str, Any], received_from: Any) -> list[dict[str, Any]]:
    """An agent's edge counters for one node sample: a point per upstream node of the reply's
    received_from ({source: objects}), from the sample's time, run, node and agent. A source that is
    not a non-empty id of at most SOURCE_MAX_BYTES, a count that is not a whole number from 0 to
    2^53, or a sample without a run, is passed over (a node's reply is not trusted): as the C agent
    does (control_edge_count)."""
    if not isinstance(received_from, dict) or not sample.get("run_id"):
        return []
    base = {"time": sample["time"], "run_id": sample["run_id"]}
    return [
        {**base, "from": source, "to": sample["node_id"], "agent": sample["agent"], "objects_received": int(count)}
        for source, count in received_from.items()
        if isinstance(source, str) and 0 < len(source.encode(errors="replace")) <= SOURCE_MAX_BYTES and _whole(count)
    ]


def to_json(kind: str, doc: dict[str, Any]) -> str:
    """The JSON document (what Elasticsearch stores): the fields present, in schema order."""
    return _to_json(doc, fields(kind))


def markdown_table(kind: str) -> str:
    """The field-by-field documentation of the verdict or the edge point (docs/schema.md embeds it)."""
    return _markdown_table(fields(kind), schema(kind)["properties"], control=False)


def to_line_protocol(kind: str, doc: dict[str, Any]) -> str:
    """InfluxDB line protocol, without its newline: tags sorted by key, fields in schema order, ns
    time; numbers as floats (InfluxDB fixes a field's type at its first write)."""
    tags = {f.name: doc[f.name] for f in fields(kind) if f.influx == "tag" and f.name in doc}
    values = {
        f.name: float(doc[f.name]) if f.type == "number" else doc[f.name]
        for f in fields(kind)
        if f.influx == "field" and f.name in doc
    }
    return point(measurement(kind), tags, values, time_ns(doc["time"]))
