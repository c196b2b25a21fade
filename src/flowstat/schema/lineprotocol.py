"""InfluxDB line protocol: escaping, and a point from tags and fields.

The sample encoder (sample.py) has a faster path of its own for millions of samples; it uses the
same escaping, so both write the same bytes for the same data.
"""

from __future__ import annotations

from collections.abc import Mapping


def escape_key(text: str) -> str:
    """A measurement, tag key, tag value or field key (commas, '=' and spaces are significant)."""
    return text.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def escape_string(text: str) -> str:
    """A string field value, quoted."""
    if '"' in text or "\\" in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def field_value(value: bool | int | float | str) -> str:
    """A field value as line protocol writes it: 42i, 1.5, true, "text"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        return repr(value)
    return escape_string(value)


def point(
    measurement: str, tags: Mapping[str, str], fields: Mapping[str, bool | int | float | str], time_ns: int
) -> str:
    """One line, without its newline: tags sorted by key (as InfluxDB prefers), empty tags left out."""
    if not fields:
        raise ValueError(f"{measurement}: a point needs at least one field")
    head = ",".join(
        [escape_key(measurement)] + [f"{escape_key(k)}={escape_key(v)}" for k, v in sorted(tags.items()) if v != ""]
    )
    body = ",".join(f"{escape_key(k)}={field_value(v)}" for k, v in fields.items())
    return f"{head} {body} {time_ns}"
