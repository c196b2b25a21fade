"""What the flat schemas (a sample, an agent's self-sample: one level of fields, each an Influx tag,
field or time) share: their fields as read from the file, checking a document against them, its
JSON document and the documentation table."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ._check import INT64_MAX, type_ok


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # JSON Schema type: string, integer, number, boolean
    influx: str  # tag, field or time
    required: bool
    unit: str | None
    enum: tuple[str, ...]  # () when the field is not enumerated
    control: str | None  # the get-metrics reply field this field is copied from
    rollup: str | None = None  # "sum": totalled over a run's nodes by the InfluxDB rollups
    pattern: str | None = None  # a string's regular expression (JSON Schema's pattern), matched whole

    def matches(self, value: str) -> bool:
        """Whether a string value is one the field allows: in its enumeration, and matching its
        pattern. The pattern must match the whole value (re.fullmatch: a `$` that let a trailing
        newline through, as re.search's does, would let in a tag the C agent refuses)."""
        return (not self.enum or value in self.enum) and (
            not self.pattern or _compiled(self.pattern).fullmatch(value) is not None
        )


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _compiled(pattern: str) -> re.Pattern[str]:
    compiled = _PATTERNS.get(pattern)
    if compiled is None:
        compiled = _PATTERNS[pattern] = re.compile(pattern)
    return compiled


def read_fields(schema: dict[str, Any]) -> tuple[Field, ...]:
    """A flat schema's fields, in schema order."""
    required = set(schema["required"])
    return tuple(
        Field(
            name,
            p["type"],
            p["x-influx"],
            name in required,
            p.get("x-unit"),
            tuple(p.get("enum", ())),
            p.get("x-control"),
            p.get("x-rollup"),
            p.get("pattern"),
        )
        for name, p in schema["properties"].items()
    )


def problems(doc: dict[str, Any], fields: tuple[Field, ...]) -> list[str]:
    """Everything wrong with a document of a flat schema, as texts naming the field; [] when it conforms."""
    errors = [f"{f.name}: required field is missing" for f in fields if f.required and f.name not in doc]
    by_name = {f.name: f for f in fields}
    for name, value in doc.items():
        f = by_name.get(name)
        if f is None:
            errors.append(f"{name}: not in the schema")
        elif not type_ok(value, f.type):
            errors.append(f"{name}: expected {f.type}, got {type(value).__name__} {value!r}")
        elif f.enum and value not in f.enum:
            errors.append(f"{name}: {value!r} is not one of {', '.join(f.enum)}")
        elif f.pattern and not f.matches(value):
            errors.append(f"{name}: {value!r} does not match {f.pattern}")
        elif f.type == "integer" and not 0 <= value <= INT64_MAX:
            errors.append(f"{name}: must be between 0 and {INT64_MAX}, got {value}")
    return errors


def to_json(doc: dict[str, Any], fields: tuple[Field, ...]) -> str:
    """The JSON document (what Elasticsearch stores): the fields present, in schema order."""
    return json.dumps({f.name: doc[f.name] for f in fields if f.name in doc}, separators=(",", ":"), ensure_ascii=False)


def markdown_table(fields: tuple[Field, ...], props: dict[str, Any], control: bool) -> str:
    """The field-by-field documentation of a flat schema; ``control``: with the control reply column."""
    head = ["field", "type", "Influx", "unit", "required"] + (["from control reply"] if control else []) + ["meaning"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in fields:
        cells = [f"`{f.name}`", f.type, f.influx, f.unit or "", "yes" if f.required else ""]
        cells += [f"`{f.control}`" if f.control else ""] if control else []
        rows.append("| " + " | ".join(cells + [props[f.name]["description"]]) + " |")
    return "\n".join(rows) + "\n"
