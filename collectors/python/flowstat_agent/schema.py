"""The sample schema (collectors/schema/sample.schema.json) and the two encodings derived from it.

Nothing about a field is written here: names, types, units and which fields are Influx tags all
come from the schema file, so the agents, the ES mapping and the dashboards cannot drift apart.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schema" / "sample.schema.json"


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # JSON Schema type: string, integer, number, boolean
    influx: str  # tag, field or time
    required: bool
    unit: str | None
    enum: tuple[str, ...] | None
    control: str | None  # the get-metrics reply field this field is copied from


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@lru_cache(maxsize=1)
def fields() -> tuple[Field, ...]:
    s = schema()
    required = set(s["required"])
    return tuple(Field(name, p["type"], p["x-influx"], name in required, p.get("x-unit"),
                       tuple(p["enum"]) if "enum" in p else None, p.get("x-control"))
                 for name, p in s["properties"].items())


def from_control_reply(reply: dict) -> dict:
    """The sample fields a get-metrics reply provides; fields of the wrong type are left out."""
    out = {}
    for f in fields():
        if f.control is None or reply.get(f.control) is None:
            continue
        value = reply[f.control]
        if f.type == "number" and _type_ok(value, "number"):
            out[f.name] = float(value)
        elif _type_ok(value, f.type) and not (f.type == "integer" and value < 0):
            out[f.name] = value
    return out


def measurement() -> str:
    return schema()["x-measurement"]


def _type_ok(value: Any, typ: str) -> bool:
    if typ == "string":
        return isinstance(value, str)
    if typ == "boolean":
        return isinstance(value, bool)
    if typ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return False


def validate(sample: dict) -> list[str]:
    """Everything wrong with a sample, as texts naming the field; [] when it conforms."""
    errors = []
    by_name = {f.name: f for f in fields()}
    for f in fields():
        if f.required and f.name not in sample:
            errors.append(f"{f.name}: required field is missing")
    for name, value in sample.items():
        f = by_name.get(name)
        if f is None:
            errors.append(f"{name}: not in the schema")
        elif not _type_ok(value, f.type):
            errors.append(f"{name}: expected {f.type}, got {type(value).__name__} {value!r}")
        elif f.enum and value not in f.enum:
            errors.append(f"{name}: {value!r} is not one of {', '.join(f.enum)}")
        elif f.type == "integer" and value < 0:
            errors.append(f"{name}: must be >= 0, got {value}")
    return errors


def time_ns(iso: str) -> int:
    """Nanoseconds since the epoch of an ISO-8601 UTC time with milliseconds ('...T10:51:14.123Z')."""
    dt = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return (int(dt.timestamp()) * 1000 + dt.microsecond // 1000) * 1_000_000


def _escape_key(text: str) -> str:
    return text.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _field_value(value: Any, typ: str) -> str:
    if typ == "boolean":
        return "true" if value else "false"
    if typ == "integer":
        return f"{value}i"
    if typ == "number":
        return repr(float(value))
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_line_protocol(sample: dict) -> str:
    """InfluxDB line protocol: tags sorted by key (as Influx prefers), fields in schema order, ns time."""
    tags, values, stamp = [], [], ""
    for f in fields():
        if f.name not in sample:
            continue
        value = sample[f.name]
        if f.influx == "tag":
            if value != "":
                tags.append(f"{_escape_key(f.name)}={_escape_key(str(value))}")
        elif f.influx == "time":
            stamp = str(time_ns(value))
        else:
            values.append(f"{_escape_key(f.name)}={_field_value(value, f.type)}")
    head = ",".join([_escape_key(measurement()), *sorted(tags)])
    return f"{head} {','.join(values)} {stamp}"


def to_json(sample: dict) -> str:
    """The JSON document (what Elasticsearch stores): the sample's fields in schema order."""
    return json.dumps({f.name: sample[f.name] for f in fields() if f.name in sample}, separators=(",", ":"),
                      ensure_ascii=False)


def document_id(sample: dict) -> str:
    """Deterministic Elasticsearch _id: re-sending a sample overwrites it instead of duplicating it."""
    return f"{sample['run_id']}/{sample['agent']}/{sample['node_id']}/{sample['seq']}"


def markdown_table() -> str:
    """The field-by-field documentation of the schema (collectors/schema/README.md embeds it)."""
    rows = ["| field | type | Influx | unit | required | from control reply | meaning |",
            "|---|---|---|---|---|---|---|"]
    props = schema()["properties"]
    for f in fields():
        rows.append(f"| `{f.name}` | {f.type} | {f.influx} | {f.unit or ''} | {'yes' if f.required else ''} | "
                    f"{'`' + f.control + '`' if f.control else ''} | {props[f.name]['description']} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
