"""The run document (run.schema.json, beside this file): what was run, where, when and how it ended.

One definition for RUN_DIR/run.json (written by the harness), the flowstat-runs documents and their
Elasticsearch mapping, and the InfluxDB flowstat_run point (written by replay). Dashboards group and
compare runs by its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _files
from ._check import problems
from .lineprotocol import point
from .sample import time_ns

SCHEMA_FILE = "run.schema.json"
IN_CODE = "<dict>"  # the ``topology`` of a run whose topology was built in code, not read from a file

# The steady state of a run (its figures and the online verdict) begins after start-up: a tenth of
# the run, at least 3 s. A rule of the run document: the harness judges by it, the report draws it.
STARTUP_MIN_S = 3.0
STARTUP_FRACTION = 0.1


def startup_s(duration_s: float) -> float:
    """How long start-up lasts in a run of ``duration_s``: the steady state begins after it."""
    return max(STARTUP_MIN_S, STARTUP_FRACTION * duration_s)


def schema() -> dict[str, Any]:
    return _files.load(SCHEMA_FILE)


@dataclass(frozen=True)
class Leaf:
    """A field that holds a value (not an object): its path in the document and how it is stored."""

    path: tuple[str, ...]
    type: str  # string, integer, number, boolean, array
    influx: str | None  # tag, field, time, or None: not in the InfluxDB point
    unit: str | None
    description: str
    default: object = None  # what an absent field means (the schema's "default"), None: nothing

    @property
    def name(self) -> str:
        """The field's own name: its key in the InfluxDB point (names are unique across groups)."""
        return self.path[-1]

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def _walk(props: dict[str, Any], path: tuple[str, ...]) -> list[Leaf]:
    out: list[Leaf] = []
    for key, p in props.items():
        if p["type"] == "object":
            out += _walk(p["properties"], path + (key,))
        else:
            out.append(
                Leaf(path + (key,), p["type"], p.get("x-influx"), p.get("x-unit"), p["description"], p.get("default"))
            )
    return out


def leaves() -> tuple[Leaf, ...]:
    """Every leaf of the document, in schema order."""
    return tuple(_walk(schema()["properties"], ()))


def measurement() -> str:
    name: str = schema()["x-measurement"]
    return name


# The roles a run's processes have: the pipeline's and the monitoring agents' (a topology's cpus
# keys them by role, the run document's affinity records them).
AFFINITY_ROLES: tuple[str, ...] = tuple(schema()["properties"]["affinity"]["items"]["properties"]["role"]["enum"])


def validate(doc: dict[str, Any]) -> list[str]:
    """Everything wrong with a run document, naming the field by its path; [] when it conforms."""
    errors = problems(doc, schema())
    for key in ("started", "finished"):
        if isinstance(doc.get(key), str) and not errors:
            try:
                time_ns(doc[key])
            except ValueError:
                errors.append(f"{key}: not an ISO-8601 UTC time ({doc[key][:40]!r})")
    return errors


LABEL_SEPARATOR = " | "  # between the run id and the rest of a label: Grafana's run variable splits there


def _size_text(nbytes: int) -> str:
    for unit, size in (("MB", 1_000_000), ("kB", 1000)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def mergers_text(p: dict[str, Any]) -> str:
    """ "2 mergers", or the mergers of each layer for a layered run: "4+1 mergers"."""
    layers = p.get("merger_layers") or []
    if layers:
        return "+".join(str(n) for n in [p["mergers"] - sum(layers), *layers]) + " mergers"
    return f"{p['mergers']} merger{'s' if p['mergers'] != 1 else ''}"


def cost_text(per_object_ms: float = 0, per_mb_ms: float = 0, factor: float = 1) -> str:
    """One merge cost, "" when it adds nothing: "+1 ms/object +2 ms/MB x3"."""
    parts = [f"+{ms:g} ms/{unit}" for ms, unit in ((per_object_ms, "object"), (per_mb_ms, "MB")) if ms]
    if factor != 1:
        parts.append(f"x{factor:g}")
    return " ".join(parts)


def merge_cost_text(p: dict[str, Any]) -> str:
    """The run's added merge cost, "" when none: every merger's, then the nodes' own:
    "merges +1 ms/object +2 ms/MB x3, node costs: merger-1 +5 ms/object; viewer +20 ms/object"."""
    every = cost_text(
        p.get("merge_cost_per_object_ms", 0), p.get("merge_cost_per_mb_ms", 0), p.get("merge_cost_factor", 1)
    )
    parts = [f"merges {every}"] if every else []
    if p.get("merge_cost_nodes"):
        parts.append(f"node costs: {p['merge_cost_nodes']}")
    return ", ".join(parts)


def label(doc: dict[str, Any]) -> str:
    """The run's ``label``: its id, then what was run (or where, for a run without parameters)."""
    p = doc.get("parameters") or {}
    if {"producers", "rate_per_producer", "object_type", "object_bytes", "buffer_size", "mergers"} <= p.keys():
        rate = f"{p['rate_per_producer']:g}/s" if p["rate_per_producer"] else "unthrottled"
        what = (
            f"{p['producers']} x {rate} {p['object_type']} {_size_text(p['object_bytes'])}, "
            f"buffer {p['buffer_size']}, {mergers_text(p)}"
        )
        cost = merge_cost_text(p)
        what += f", {cost}" if cost else ""
    else:
        what = f"recorded on {doc.get('host', 'an unknown host')}"
    return f"{doc['run_id']}{LABEL_SEPARATOR}{what}"


def _get(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def to_line_protocol(doc: dict[str, Any]) -> str:
    """The run as one InfluxDB point (no newline), so that Grafana can list and group runs too.
    Number fields are written as floats even when the value is whole (InfluxDB fixes a field's
    type at its first write)."""
    tags: dict[str, str] = {}
    fields: dict[str, Any] = {}
    stamp: int | None = None
    for leaf in leaves():
        value = _get(doc, leaf.path)
        if value is None or leaf.influx is None:
            continue
        if leaf.influx == "time":
            stamp = time_ns(value)
        elif leaf.influx == "tag":
            tags[leaf.name] = str(value)
        else:
            fields[leaf.name] = float(value) if leaf.type == "number" else value
    if stamp is None:
        raise ValueError("run document without a start time")
    return point(measurement(), tags, fields, stamp)


def markdown_table() -> str:
    """The field-by-field documentation of the run document (docs/schema.md embeds it)."""
    rows = ["| field | type | Influx | unit | meaning |", "|---|---|---|---|---|"]
    for leaf in leaves():
        rows.append(f"| `{leaf.dotted}` | {leaf.type} | {leaf.influx or ''} | {leaf.unit or ''} | {leaf.description} |")
    return "\n".join(rows) + "\n"
