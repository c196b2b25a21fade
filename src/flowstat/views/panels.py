"""The views, defined once: which metric each panel shows, how it is aggregated and grouped.

Grafana dashboards, Kibana saved objects and the report are generated from these definitions
(flowstat.views.grafana, .kibana); field names and units come from the schemas, never restated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from flowstat.schema import agent as agent_schema
from flowstat.schema import flow as flow_schema
from flowstat.schema import run as run_schema
from flowstat.schema import sample as sample_schema

from .labels import label

# How a metric is reduced per time bucket. "mean", "max" and "last" are what they say; "rate" is
# the per-second increase of a counter (cumulative since the node started), "increase" its
# increase per bucket.
AGGREGATIONS = ("mean", "max", "last", "rate", "increase")
KINDS = ("timeseries", "stat", "table", "bargauge", "state-timeline")

NODE = "node"  # the sample schema's measurement (flowstat_node)
RUN = "run"  # the run document (flowstat_run, flowstat-runs)
AGENT = "agent"  # the agents' self-samples (flowstat_agent)
NODE_10S = "node_10s"  # the samples' per-node rollup: per node and 10 s, each numeric field's mean (mean_FIELD)
VERDICT = "verdict"  # flowstat verdict's verdicts: which node holds a run's flow back (verdict.schema.json)
EDGE = "edge"  # ... and the objects/s on each edge of the run (edge.schema.json)
FLOW_SOURCES = (VERDICT, EDGE)  # flowstat.schema.flow's kinds, named alike

ONE_CORE_HZ = 1e6  # cpu_clock_hz of one fully busy core (the sample schema's unit says so)

# The schemas' x-unit, as Grafana names it (https://grafana.com/docs/grafana/latest/panels-visualizations/
# configure-standard-options/#unit); an x-unit missing here is a test failure, not a silent "none".
GRAFANA_UNITS = {
    "kB": "deckbytes",
    "Hz (10^6 = one full core)": "hertz",
    "ms": "ms",
    "1/s": "suffix: obj/s",
    "bytes": "decbytes",
    "messages": "suffix: msg",
    "s": "s",
    "MB/min": "suffix: MB/min",
    "ISO-8601 UTC, ms": "dateTimeAsIso",
}


def _one_of(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{what} {value!r} is not one of {allowed}")


@dataclass(frozen=True)
class Metric:
    """One series per group: a schema field reduced by ``agg`` and multiplied by ``scale``."""

    field: str
    agg: str = "mean"
    scale: float = 1.0
    unit: str | None = None  # a Grafana unit when the schema's would be wrong (a scaled or rated field)
    label: str = ""  # how the series is named when a panel holds several metrics
    minus: str | None = None  # a field of the same source subtracted from this one (same aggregation)

    def __post_init__(self) -> None:
        _one_of(self.agg, AGGREGATIONS, f"metric {self.field}: aggregation")


@dataclass(frozen=True)
class Panel:
    title: str
    metrics: tuple[Metric, ...]
    kind: str = "timeseries"
    source: str = NODE  # node, node_10s, run, agent, verdict or edge
    group: tuple[str, ...] = ("node_id",)  # the tags a series is per
    description: str = ""
    width: int = 12  # of Grafana's 24 columns
    rollup: bool = False  # from the InfluxDB rollup (sums over nodes per 10 s) instead of the raw samples
    where: tuple[tuple[str, str], ...] = ()  # fixed tag or field conditions (field, value)
    in_report: bool = True  # drawn by flowstat report too (a node panel; see flowstat.report.plots)

    def __post_init__(self) -> None:
        _one_of(self.kind, KINDS, f"panel {self.title!r}: kind")


NODES_PER_PANEL = 10
"""A per-node panel draws the first NODES_PER_PANEL of the selected nodes, by name (InfluxQL's
SLIMIT; Lens's top values, alphabetical): the same nodes in Grafana and Kibana. 500 nodes at a
sample a second are 150,000 points a panel for a 300 s run, which InfluxDB takes 1-3 s to send
(docs/benchmarks.md) and nobody reads as 500 lines; the aggregate view sums over every node."""


def per_node(panel: Panel) -> bool:
    """Whether the panel draws a series per node over time (and so at most NODES_PER_PANEL)."""
    return panel.group == ("node_id",) and panel.kind in ("timeseries", "state-timeline")


def description(panel: Panel) -> str:
    """The panel's description as the dashboards show it."""
    if not per_node(panel):
        return panel.description
    limit = f"At most {NODES_PER_PANEL} nodes: the first selected, by name (pick nodes to see others)."
    return f"{panel.description} {limit}".lstrip()


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class View:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    variables: tuple[str, ...] = field(default=())  # run, runs, role, node, agent, param

    def panels(self) -> list[Panel]:
        return [p for r in self.rows for p in r.panels]


# -- units --------------------------------------------------------------------------------------


def _schema_field(source: str, name: str) -> tuple[str, str | None] | None:
    """A field's (type, unit) in the schema of ``source``; None when it has no such field."""
    if source == RUN:
        return next(((leaf.type, leaf.unit) for leaf in run_schema.leaves() if leaf.name == name), None)
    if source in FLOW_SOURCES:
        return next(((f.type, f.unit) for f in flow_schema.fields(source) if f.name == name), None)
    fields = self_sample_fields() if source == AGENT else {f.name: (f.type, f.unit) for f in sample_schema.fields()}
    return fields.get(name)


def schema_type(source: str, name: str) -> str | None:
    found = _schema_field(source, name)
    return found[0] if found else None


def schema_unit(source: str, name: str) -> str | None:
    """A field's x-unit in the schema of ``source``; None when it has none."""
    found = _schema_field(source, name)
    return found[1] if found else None


def grafana_unit(panel: Panel, metric: Metric) -> str:
    if metric.unit:
        return metric.unit
    unit = schema_unit(panel.source, metric.field)
    return GRAFANA_UNITS[unit] if unit else "none"


@lru_cache(maxsize=1)
def self_sample_fields() -> dict[str, tuple[str, str | None]]:
    """The agents' self-sample fields (agent.schema.json), their types and units."""
    return {f.name: (f.type, f.unit) for f in agent_schema.fields()}


def _series(title: str, name: str, agg: str = "mean", *, scale: float = 1.0, unit: str | None = None, **panel) -> Panel:
    """A panel of one metric."""
    return Panel(title, (Metric(name, agg, scale=scale, unit=unit),), **panel)


RATE = "suffix: obj/s"

RUN_VIEW = View(
    "flowstat-run",
    "flowstat: run",
    "One run, node by node: pick the run (newest first), the agent whose samples to show, the roles and nodes.",
    (
        Row(
            "The run",
            (
                Panel(
                    "Parameters",
                    tuple(
                        Metric(n, "last")
                        for n in (
                            "producers",
                            "rate_per_producer",
                            "object_bytes",
                            "buffer_size",
                            "mergers",
                            "duration_s",
                        )
                    ),
                    kind="stat",
                    source=RUN,
                    group=(),
                    width=12,
                    description="What the run was asked to do (the run document's parameters).",
                ),
                Panel(
                    "Verdicts",
                    (
                        Metric("conserved", "last", label="no loss"),
                        Metric("online", "last", label="online"),
                        Metric("ok", "last", label="run ok"),
                    ),
                    kind="stat",
                    source=RUN,
                    group=(),
                    width=6,
                    description="no loss: every object sent was received and merged in; online: every merger "
                    "kept up in the steady state (docs/harness.md).",
                ),
                Panel(
                    "Lost and steady rate",
                    (
                        Metric("objects_sent", "last", label="lost objects", unit="none", minus="objects_received"),
                        Metric("steady_merged_objects_per_second", "last", label="merged/s steady"),
                    ),
                    kind="stat",
                    source=RUN,
                    group=(),
                    width=6,
                    description="lost: objects sent minus objects received; merged/s in the steady state.",
                ),
            ),
        ),
        Row(
            "Which node holds the flow back",
            (
                Panel(
                    "Flow verdict",
                    (Metric("flow", "last"),),
                    kind="state-timeline",
                    source=VERDICT,
                    group=(),
                    width=24,
                    in_report=False,
                    description="flowstat verdict's judgement every few seconds over the last 10 s: held_back "
                    "(the table names the nodes), none (every node keeps up) or unknown (evidence missing).",
                ),
                Panel(
                    "Held back by",
                    (Metric("held", "last", label="nodes"), Metric("evidence", "last")),
                    kind="table",
                    source=VERDICT,
                    group=("held_back_by",),
                    in_report=False,
                    description="Each set of nodes named in the time range and the last verdict's evidence "
                    "(an empty set: the last verdict naming none).",
                ),
                Panel(
                    "Edges",
                    (Metric("objects_per_second", "last"), Metric("estimated", "last")),
                    kind="table",
                    source=EDGE,
                    group=("from", "to"),
                    in_report=False,
                    description="Objects/s on each edge, the last value in the time range (estimated: the "
                    "downstream's intake split over its feeders).",
                ),
            ),
        ),
        Row(
            "CPU and memory",
            (
                _series(
                    f"{label('cpu_clock_hz')} clock",
                    "cpu_clock_hz",
                    in_report=False,
                    description="CPU time per second, in Hz (10^6 Hz = one full core).",
                ),
                _series(
                    f"{label('cpu_clock_hz')}, % of one core", "cpu_clock_hz", scale=100 / ONE_CORE_HZ, unit="percent"
                ),
                _series(label("vmrss_kb"), "vmrss_kb", description="Resident memory (/proc/PID/status VmRSS)."),
                _series(label("threads"), "threads"),
            ),
        ),
        Row(
            "Merging",
            (
                _series(label("average_merge_time_ms"), "average_merge_time_ms", where=(("role", "merger"),)),
                _series(label("merged_objects_per_second"), "merged_objects_per_second", where=(("role", "merger"),)),
                _series(
                    label("input_latency_p99_ms"),
                    "input_latency_p99_ms",
                    description="How long objects waited between being sent and being taken (p99 per sample).",
                ),
                _series(
                    label("objects_in_flight"),
                    "objects_in_flight",
                    "max",
                    where=(("role", "merger"),),
                    description="Sent to the merger and not yet received: a lower bound of its queue.",
                ),
            ),
        ),
        Row(
            "Flow",
            (
                Panel(
                    "Objects in and out",
                    (
                        Metric("objects_received", "rate", unit=RATE, label="in"),
                        Metric("objects_sent", "rate", unit=RATE, label="out"),
                    ),
                    description="Per second, from the nodes' cumulative counters.",
                ),
                Panel(
                    "Bytes in and out",
                    (
                        Metric("bytes_received", "rate", unit="Bps", label="in"),
                        Metric("bytes_sent", "rate", unit="Bps", label="out"),
                    ),
                ),
            ),
        ),
        Row(
            "Buffers",
            (
                Panel(
                    "Buffer overload events",
                    (
                        Metric("send_overload_events", "increase", label="send", unit="none"),
                        Metric("receive_overload_events", "increase", label="receive", unit="none"),
                    ),
                    description="New overload events per interval: a send refused by a full buffer; an input "
                    "queue not emptied in a read cycle.",
                ),
                Panel(
                    "Buffer overloaded",
                    (
                        Metric("send_buffer_overloaded", "last", label="send"),
                        Metric("receive_buffer_overloaded", "last", label="receive"),
                    ),
                    kind="state-timeline",
                    description="Whether a node's buffer overloaded at any moment since the sample before.",
                ),
                Panel(
                    label("node_state"),
                    (Metric("node_state", "last"),),
                    kind="state-timeline",
                    width=24,
                    in_report=False,
                ),
            ),
        ),
    ),
    variables=("run", "agent", "role", "node"),
)

TOTALS = ("merged_objects_per_second", "vmrss_kb", "cpu_clock_hz", "objects_in_flight")
THESIS_TABLE = ("cpu_clock_hz", "vmrss_kb", "average_merge_time_ms", "merged_objects_per_second")
PARAMETERS = ("producers", "buffer_size", "object_bytes", "object_type", "mergers", "rate_per_producer")

AGGREGATE_VIEW = View(
    "flowstat-aggregate",
    "flowstat: aggregate",
    "Sums over a run's nodes per 10 s (as dateStat showed them), and runs side by side.",
    (
        Row(
            "Sums over nodes, per role",
            tuple(_series(f"Total {name}", name, rollup=True, group=("role",), width=12) for name in TOTALS),
        ),
        Row(
            "Runs side by side (merger samples while RUNNING)",
            (
                Panel(
                    "Mean and standard deviation per run",
                    tuple(Metric(n) for n in THESIS_TABLE),
                    kind="table",
                    group=("run_id",),
                    where=(("role", "merger"), ("node_state", "RUNNING")),
                    width=24,
                    description="The thesis's tables: per run, over every merger sample taken while the merger "
                    "was RUNNING, mean and standard deviation.",
                ),
                Panel(
                    "Merged objects/s (steady) against the parameter",
                    (Metric("steady_merged_objects_per_second", "mean"),),
                    kind="bargauge",
                    source=RUN,
                    group=("$param",),
                    width=24,
                    description="Thesis figure 29: the steady merged rate of the chosen runs, by the value of "
                    "the parameter they differ in (mean over runs with the same value).",
                ),
            ),
        ),
    ),
    variables=("run", "runs", "agent", "param"),
)

STACK_VIEW = View(
    "flowstat-stack",
    "flowstat: agents",
    "The agents themselves: are they sampling on time and delivering?",
    (
        Row(
            "Agents",
            (
                _series("Samples/s", "samples", "rate", source=AGENT, group=("host", "agent"), unit=RATE),
                _series("Spool depth", "spooled_samples", "max", source=AGENT, group=("host", "agent")),
                _series("Sink errors", "send_failures", "increase", source=AGENT, group=("host", "agent")),
                _series("Dropped rounds", "skipped_rounds", "increase", source=AGENT, group=("host", "agent")),
                _series("Sinks down", "sinks_down", "max", source=AGENT, group=("host", "agent")),
                _series("Node failovers", "failovers", "increase", source=AGENT, group=("host", "agent")),
                _series("Nodes watched", "targets", "max", source=AGENT, group=("host", "agent")),
            ),
        ),
    ),
)


def _per_10s(panel: Panel) -> Panel | None:
    """A run view panel as the 10 s view shows it: a per-node panel of numbers read from the rollup,
    a run document panel as it is; None for a panel of strings or flags, which the rollup does not
    average (node state, buffer overloaded), and for the flow verdicts (their own series, in the run
    view)."""
    if panel.source in FLOW_SOURCES:
        return None
    if panel.source != NODE:
        return panel
    names = [name for m in panel.metrics for name in (m.field, m.minus) if name]
    if not per_node(panel) or any(schema_type(NODE, name) not in ("integer", "number") for name in names):
        return None
    return replace(panel, source=NODE_10S)


RUN_VIEW_10S = View(
    "flowstat-run-10s",
    "flowstat: run, per 10 s",
    "The run view read from the per-node 10 s rollup (flowstat rollup): a tenth of the documents of a run "
    "sampled every second, for runs of many nodes over long times (Elasticsearch reads every sample in the "
    "time range; over an hour of 3,000 nodes the run view takes half a second). Its points are 10 s means; "
    "node states, overload flags and the flow verdicts are in the run view.",
    tuple(
        Row(row.title, kept)
        for row in RUN_VIEW.rows
        if (kept := tuple(q for q in (_per_10s(p) for p in row.panels) if q is not None))
    ),
    variables=RUN_VIEW.variables,
)
"""Kibana's only: Grafana's run view reads the first 10 series of InfluxDB whatever the selection
(SLIMIT acts before any block is read), so it has no need of it."""

VIEWS: tuple[View, ...] = (RUN_VIEW, AGGREGATE_VIEW, STACK_VIEW)
