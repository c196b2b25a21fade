"""The samples as Prometheus metrics: one family per field marked ``x-prometheus`` in the sample
and agent schemas, and the exposition an agent's ``/metrics`` serves, in OpenMetrics 1.0 or in
the text format 0.0.4.

A family is named ``flowstat_node_NAME`` (a sample's field) or ``flowstat_agent_NAME`` (a
self-sample's), NAME being the field's own unless ``x-prometheus`` gives one; a family with a unit
ends with it (``flowstat_node_sent_bytes``), a counter's sample with ``_total``. Values are in the
family's base unit: the field's value times ``scale``. The schema's tags are every family's labels
(``run_id``, ``host``, ``node_id``, ``role``, ``agent``; an empty one left out). The node state is a
stateset (one sample per state, 1 for the node's). HELP is the field's description.

Which node families and labels are shown is a Selection (the sink URL's ``families=`` and
``drop_labels=``: ``selection``); the agent's own families and the process_* ones are always shown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import agent as agent_schema
from . import flow as flow_schema
from . import sample as sample_schema

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
DEFAULT_PORT = 9464  # prometheus:// without a port: where both agents serve /metrics
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Family:
    name: str  # OpenMetrics family name (a counter's samples add _total)
    type: str  # counter, gauge or stateset
    unit: str  # base unit ("" if none): the name's last word
    help: str
    field: str  # the sample field it shows
    scale: float  # the family's value = the field's value x scale
    states: tuple[str, ...] = ()  # a stateset's states

    def sample_name(self, openmetrics: bool = True) -> str:
        return self.name + "_total" if self.type == "counter" else self.name


def _families(schema: dict[str, Any], prefix: str) -> tuple[Family, ...]:
    out = []
    for field, p in schema["properties"].items():
        spec = p.get("x-prometheus")
        if spec is None:
            continue
        name = f"{prefix}_{spec.get('name', field)}"
        unit = spec.get("unit", "")
        if unit and not name.endswith("_" + unit):
            raise ValueError(f"{field}: x-prometheus family {name} must end with its unit {unit}")
        out.append(
            Family(
                name,
                spec["type"],
                unit,
                p["description"],
                field,
                float(spec.get("scale", 1)),
                tuple(p.get("enum", ())) if spec["type"] == "stateset" else (),
            )
        )
    return tuple(out)


NODE_FAMILIES: tuple[Family, ...] = _families(sample_schema.schema(), "flowstat_node")
AGENT_FAMILIES: tuple[Family, ...] = _families(agent_schema.schema(), "flowstat_agent")
NODE_LABELS: tuple[str, ...] = tuple(f.name for f in sample_schema.fields() if f.influx == "tag")
AGENT_LABELS: tuple[str, ...] = tuple(f.name for f in agent_schema.fields() if f.influx == "tag")
# flowstat verdict --listen: each run's latest verdict and edge rates (issue 46's alert, for Prometheus)
VERDICT_FAMILIES: tuple[Family, ...] = _families(flow_schema.schema("verdict"), "flowstat_verdict")
EDGE_FAMILIES: tuple[Family, ...] = _families(flow_schema.schema("edge"), "flowstat_edge")
VERDICT_LABELS: tuple[str, ...] = tuple(f.name for f in flow_schema.fields("verdict") if f.influx == "tag")
EDGE_LABELS: tuple[str, ...] = tuple(f.name for f in flow_schema.fields("edge") if f.influx == "tag")


KEPT_LABELS = ("node_id",)  # tells the nodes' series apart: never dropped


@dataclass(frozen=True)
class Selection:
    """The node families (in schema order) and node labels (in schema order) an exposition shows."""

    families: tuple[Family, ...] = NODE_FAMILIES
    labels: tuple[str, ...] = NODE_LABELS


ALL = Selection()


def selection(families: str | None = None, drop_labels: str | None = None) -> Selection:
    """The Selection of a sink URL's options: ``families`` (comma-separated names, each a sample
    field marked x-prometheus, e.g. ``vmrss_kb``, or its family's name, e.g.
    ``flowstat_node_resident_memory_bytes``; None: all) and ``drop_labels`` (comma-separated node
    labels left out; None: none). ValueError names the option and the name it does not take, in the
    C agent's words too (collectors/c/agent/exposition.c: expo_select_parse)."""
    shown = NODE_FAMILIES
    if families is not None:
        names = [n for n in families.split(",") if n]
        if not names:
            raise ValueError("families needs at least one name (a sample field, or its flowstat_node_ family)")
        for name in names:
            if not any(name in (f.field, f.name) for f in NODE_FAMILIES):
                raise ValueError(
                    f"families: no node family {name} (a sample field marked x-prometheus, e.g. vmrss_kb,"
                    " or its family's name, e.g. flowstat_node_resident_memory_bytes)"
                )
        shown = tuple(f for f in NODE_FAMILIES if f.field in names or f.name in names)
    labels = NODE_LABELS
    if drop_labels is not None:
        dropped = [n for n in drop_labels.split(",") if n]
        for name in dropped:
            if name in KEPT_LABELS:
                raise ValueError(f"drop_labels: {name} cannot be dropped: it tells the nodes' series apart")
            if name not in NODE_LABELS:
                can = ", ".join(n for n in NODE_LABELS if n not in KEPT_LABELS)
                raise ValueError(f"drop_labels: no node label {name} ({can})")
        labels = tuple(n for n in NODE_LABELS if n not in dropped)
    return Selection(shown, labels)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def label_parts(doc: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    """A document's labels, each NAME="VALUE" (an empty one left out): made once per document and
    scrape, not once per family (they were two thirds of a rendering)."""
    return [f'{n}="{_escape_label(str(doc[n]))}"' for n in names if doc.get(n) not in (None, "")]


def _braced(parts: list[str], extra: str = "") -> str:
    if extra:
        parts = [*parts, extra]
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def sample_lines(
    family: Family, doc: dict[str, Any], labels: tuple[str, ...], stamp: str = "", parts: list[str] | None = None
) -> list[str]:
    """One document's samples of a family (none if it lacks the field), each ending with ``stamp``
    (" SECONDS": a timestamp, OpenMetrics only; "": none). A counter's sample is NAME_total in both
    formats. ``parts``: the document's label_parts, when the caller has them already."""
    value = doc.get(family.field)
    if value is None:
        return []
    if parts is None:
        parts = label_parts(doc, labels)
    if family.type == "stateset":
        out = []
        for state in family.states:
            extra = f'{family.name}="{_escape_label(state)}"'
            out.append(f"{family.name}{_braced(parts, extra)} {1 if value == state else 0}{stamp}")
        return out
    return [f"{family.sample_name(True)}{_braced(parts)} {_number(_scaled(family, value))}{stamp}"]


def _scaled(family: Family, value: Any) -> Any:
    if family.scale == 1 or isinstance(value, bool):
        return value
    if isinstance(value, int) and family.scale.is_integer():
        return int(value * family.scale)  # kB to bytes stays a whole number
    return value * family.scale


def family_head(family: Family, openmetrics: bool) -> list[str]:
    """A family's HELP, TYPE and (OpenMetrics) UNIT lines."""
    # 0.0.4 knows no stateset, and names a counter's family with its _total
    kind = family.type if openmetrics or family.type != "stateset" else "gauge"
    name = family.name if openmetrics or family.type != "counter" else family.sample_name(False)
    head = [f"# HELP {name} {_escape_help(family.help)}", f"# TYPE {name} {kind}"]
    if openmetrics and family.unit:
        head.append(f"# UNIT {name} {family.unit}")
    return head


def _family_lines(
    family: Family, docs: list[tuple[dict[str, Any], list[str]]], labels: tuple[str, ...], openmetrics: bool
) -> list[str]:
    lines = [line for doc, parts in docs for line in sample_lines(family, doc, labels, parts=parts)]
    return family_head(family, openmetrics) + lines if lines else []


# The standard process_* metrics of an exporter, as Prometheus's client libraries name them and
# word them: (name, type, unit, help), each shown from the field of the process document that is
# its name without process_.
_PROCESS = (
    ("process_cpu_seconds", "counter", "seconds", "Total user and system CPU time spent in seconds."),
    ("process_resident_memory_bytes", "gauge", "bytes", "Resident memory size in bytes."),
    ("process_virtual_memory_bytes", "gauge", "bytes", "Virtual memory size in bytes."),
    ("process_start_time_seconds", "gauge", "seconds", "Start time of the process since unix epoch in seconds."),
    ("process_open_fds", "gauge", "", "Number of open file descriptors."),
    ("process_max_fds", "gauge", "", "Maximum number of open file descriptors."),
)
PROCESS_FAMILIES: tuple[Family, ...] = tuple(
    Family(name, kind, unit, text, name.removeprefix("process_"), 1.0) for name, kind, unit, text in _PROCESS
)


def exposition(
    samples: Iterable[dict[str, Any]],
    self_samples: Iterable[dict[str, Any]] = (),
    openmetrics: bool = True,
    process: dict[str, Any] | None = None,
    select: Selection = ALL,
) -> str:
    """The families of the latest ``samples`` (one per node), ``self_samples`` (one per agent) and
    ``process`` (the exporter's own process_* figures, PROCESS_FAMILIES' fields), in OpenMetrics
    1.0 (ending with ``# EOF``) or the text format 0.0.4; of the nodes', those ``select`` shows,
    with its labels."""
    nodes = [(doc, label_parts(doc, select.labels)) for doc in samples]
    agents = [(doc, label_parts(doc, AGENT_LABELS)) for doc in self_samples]
    lines: list[str] = []
    for family in select.families:
        lines += _family_lines(family, nodes, select.labels, openmetrics)
    for family in AGENT_FAMILIES:
        lines += _family_lines(family, agents, AGENT_LABELS, openmetrics)
    return _ended(lines, process, openmetrics)


def _ended(lines: list[str], process: dict[str, Any] | None, openmetrics: bool) -> str:
    """The exposition's text: ``lines``, then the process_* families, then (OpenMetrics) # EOF."""
    if process is not None:
        for family in PROCESS_FAMILIES:
            lines += _family_lines(family, [(process, [])], (), openmetrics)
    if openmetrics:
        lines.append("# EOF")
    return "\n".join(lines) + "\n"


def verdict_exposition(
    verdicts: Iterable[dict[str, Any]],
    edges: Iterable[dict[str, Any]],
    openmetrics: bool = True,
    process: dict[str, Any] | None = None,
) -> str:
    """What ``flowstat verdict --listen`` serves: the families of ``verdicts`` (verdict documents,
    one per run: its latest) and ``edges`` (edge rate documents of those evaluations), with the
    service's own process_* figures, in OpenMetrics 1.0 or the text format 0.0.4."""
    lines: list[str] = []
    for families, docs, labels in (
        (VERDICT_FAMILIES, list(verdicts), VERDICT_LABELS),
        (EDGE_FAMILIES, list(edges), EDGE_LABELS),
    ):
        parted = [(doc, label_parts(doc, labels)) for doc in docs]
        for family in families:
            lines += _family_lines(family, parted, labels, openmetrics)
    return _ended(lines, process, openmetrics)
