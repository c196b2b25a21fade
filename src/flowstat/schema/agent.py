"""An agent's self-sample (agent.schema.json, beside this file): how much the agent sampled and how
its delivery goes. Both agents emit one every --self-interval seconds and at exit; the stack view
dashboard and the alert on an agent that cannot deliver read them.

Encoded like a sample (measurement x-measurement, tags sorted, fields in schema order; the JSON
document in schema order), byte for byte alike in both agents. In a run file a self-sample is a
line of its own, wrapped: ``{"flowstat_agent": {...}}`` (``RUN_FILE_KEY``), as the header is
``{"flowstat_run": {...}}``, so that it is never taken for a node sample.
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

SCHEMA_FILE = "agent.schema.json"


def schema() -> dict[str, Any]:
    return _files.load(SCHEMA_FILE)


@lru_cache(maxsize=1)
def fields() -> tuple[Field, ...]:
    return read_fields(schema())


def measurement() -> str:
    name: str = schema()["x-measurement"]
    return name


RUN_FILE_KEY = measurement()  # a run file's line {"flowstat_agent": {...}} holds one self-sample
_NUMBERS = frozenset(f.name for f in fields() if f.type == "number")


# Fields renamed since: a self-sample written before under the old name is read under the new one
# (run files recorded earlier still replay).
RENAMED = {"rejected": "refused"}


def upgraded(doc: dict[str, Any]) -> dict[str, Any]:
    """The self-sample with its fields under today's names (RENAMED); the same dict when none is old."""
    if not any(old in doc for old in RENAMED):
        return doc
    return {RENAMED.get(k, k) if RENAMED.get(k, k) not in doc else k: v for k, v in doc.items()}


def validate(doc: dict[str, Any]) -> list[str]:
    """Everything wrong with a self-sample, as texts naming the field; [] when it conforms."""
    return problems_with_time(doc, fields())


def _as_written(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with its number fields as floats, as the C agent holds them: a whole number
    is written 5.0 in both encodings (and InfluxDB fixes a field's type at its first write)."""
    return {k: float(v) if k in _NUMBERS else v for k, v in doc.items()}


def to_line_protocol(doc: dict[str, Any]) -> str:
    """InfluxDB line protocol, without its newline: tags sorted by key, fields in schema order, ns time."""
    doc = _as_written(doc)
    tags = {f.name: doc[f.name] for f in fields() if f.influx == "tag" and f.name in doc}
    values = {f.name: doc[f.name] for f in fields() if f.influx == "field" and f.name in doc}
    return point(measurement(), tags, values, time_ns(doc["time"]))


def to_json(doc: dict[str, Any]) -> str:
    """The JSON document (what the flowstat-agents index stores): its fields in schema order."""
    return _to_json(_as_written(doc), fields())


def document_id(doc: dict[str, Any]) -> str:
    """Deterministic Elasticsearch _id: a resend overwrites. The time keeps apart agents of the same
    name on one host that have no run id, or were restarted (their seq restarts from 0)."""
    return f"{doc['host']}/{doc['agent']}/{doc['time']}/{doc['seq']}"


def markdown_table() -> str:
    """The field-by-field documentation of the schema (docs/schema.md embeds it)."""
    return _markdown_table(fields(), schema()["properties"], control=False)
