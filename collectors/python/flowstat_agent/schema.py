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


_TIME_CACHE: dict[str, int] = {}


def time_ns(iso: str) -> int:
    """Nanoseconds since the epoch of an ISO-8601 UTC time with milliseconds ('...T10:51:14.123Z').

    Cached: every node sampled in one tick shares the time string.
    """
    ns = _TIME_CACHE.get(iso)
    if ns is None:
        dt = datetime.fromisoformat(iso.replace("Z", "+00:00"))
        ns = (int(dt.timestamp()) * 1000 + dt.microsecond // 1000) * 1_000_000
        if len(_TIME_CACHE) > 4096:
            _TIME_CACHE.clear()
        _TIME_CACHE[iso] = ns
    return ns


def _escape_key(text: str) -> str:
    return text.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _escape_string(text: str) -> str:
    if '"' in text or "\\" in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


@lru_cache(maxsize=1)
def _line_plan() -> tuple[str, tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    """What to_line_protocol needs, worked out once: the measurement, the tag names sorted (as
    Influx prefers), and each field's name, escaped key and type, in schema order."""
    tags = tuple(sorted(f.name for f in fields() if f.influx == "tag"))
    plan = tuple((f.name, _escape_key(f.name), f.type) for f in fields() if f.influx == "field")
    return _escape_key(measurement()), tags, plan


_SERIES_CACHE: dict[tuple, str] = {}


def to_line_protocol(sample: dict) -> str:
    """InfluxDB line protocol: tags sorted by key, fields in schema order, ns time.

    On every sample's path (agents, replay of millions): the series prefix is cached per tag values.
    """
    measurement_key, tags, plan = _line_plan()
    tag_values = tuple(sample.get(t) for t in tags)
    head = _SERIES_CACHE.get(tag_values)
    if head is None:
        head = ",".join([measurement_key] + [f"{_escape_key(t)}={_escape_key(str(v))}"
                                             for t, v in zip(tags, tag_values) if v not in (None, "")])
        if len(_SERIES_CACHE) > 65536:
            _SERIES_CACHE.clear()
        _SERIES_CACHE[tag_values] = head
    parts = []
    get = sample.get
    for name, key, typ in plan:
        value = get(name)
        if value is None:
            continue
        if typ == "integer":
            parts.append(f"{key}={value}i")
        elif typ == "number":
            parts.append(f"{key}={float(value)!r}")
        elif typ == "boolean":
            parts.append(f"{key}=true" if value else f"{key}=false")
        else:
            parts.append(f"{key}={_escape_string(value)}")
    return f"{head} {','.join(parts)} {time_ns(sample['time'])}"


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
