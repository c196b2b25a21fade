"""The agents' configuration file (agent-config.schema.json, beside this file): each key a command
line option of both agents (``x-flag``), its type and range; both agents read the files by it
(flowstat.agent.config, and the C agent's build compiles a table of it)."""

from __future__ import annotations

from functools import cache
from typing import Any

from ._files import load

SCHEMA_FILE = "agent-config.schema.json"


@cache
def schema() -> dict[str, Any]:
    return load(SCHEMA_FILE)


def keys() -> dict[str, dict[str, Any]]:
    """Each key's schema, by key, in the file's order."""
    props: dict[str, dict[str, Any]] = schema()["properties"]
    return props


def markdown_table() -> str:
    """The key-by-key documentation (docs/schema.md embeds it)."""
    rows = ["| key | value | default | flag | meaning |", "|---|---|---|---|---|"]
    for key, spec in keys().items():
        kind = spec["type"] if not spec.get("x-list") else f"list of {spec['items']['type']}s"
        unit = f" ({spec['x-unit']})" if spec.get("x-unit") else ""
        default = spec.get("default")
        shown = (
            ""
            if default is None
            else str(default).lower()
            if isinstance(default, bool)
            else f"{default:g}"
            if isinstance(default, float)
            else str(default)
        )
        rows.append(f"| `{key}` | {kind}{unit} | {shown} | `{spec['x-flag']}` | {spec['description']} |")
    return f"{schema()['description']}\n\n" + "\n".join(rows) + "\n"
