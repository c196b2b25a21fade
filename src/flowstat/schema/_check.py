"""Checking values against the subset of JSON Schema the flowstat schemas use: type, enum,
minimum, maximum, pattern, properties, required, additionalProperties: false, items."""

from __future__ import annotations

import math
import re
from typing import Any

INT64_MAX = 2**63 - 1  # integers are InfluxDB int64 and Elasticsearch long: a larger one fails the whole batch


def type_ok(value: Any, typ: str) -> bool:
    """JSON's types as JSON decoding gives them: a bool is not a number, NaN and infinities are not numbers."""
    if typ == "string":
        return isinstance(value, str)
    if typ == "boolean":
        return isinstance(value, bool)
    if typ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if typ == "object":
        return isinstance(value, dict)
    if typ == "array":
        return isinstance(value, list)
    return False


def problems(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Everything wrong with a value, as texts naming the field by its path (a.b[2]); [] when it conforms."""
    name = where or "document"
    typ = schema.get("type")
    if typ and not type_ok(value, typ):
        return [f"{name}: expected {typ}, got {type(value).__name__} {str(value)[:60]!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{name}: {value!r} is not one of {', '.join(map(str, schema['enum']))}"]
    if typ == "integer" and not 0 <= value <= INT64_MAX and schema.get("minimum") == 0:
        return [f"{name}: must be between 0 and {INT64_MAX}, got {value}"]
    if typ == "string" and "pattern" in schema and not re.search(schema["pattern"], value):
        return [f"{name}: {value[:60]!r} does not match {schema['pattern']}"]
    if typ in ("integer", "number") and "minimum" in schema and value < schema["minimum"]:
        return [f"{name}: must be >= {schema['minimum']}, got {value}"]
    if typ in ("integer", "number") and "maximum" in schema and value > schema["maximum"]:
        return [f"{name}: must be <= {schema['maximum']}, got {value}"]
    out: list[str] = []
    if typ == "object":
        props = schema.get("properties", {})
        prefix = f"{where}." if where else ""
        out += [f"{prefix}{key}: required field is missing" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if key in props:
                out += problems(item, props[key], f"{prefix}{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{prefix}{key}: not in the schema")
    elif typ == "array" and "items" in schema:
        for i, item in enumerate(value):
            out += problems(item, schema["items"], f"{where}[{i}]")
    return out
