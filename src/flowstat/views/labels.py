"""What a person reads for each sample field, defined once: its label, what kind of quantity it is
and its unit in human terms. Grafana's and Kibana's panels are titled with these labels
(panels.py), and ``flowstat report`` titles its figures, axes, tables and key figures with them.

The unit comes from the sample schema (its ``x-unit``), converted by HUMAN_UNITS into what people
read: kB -> MB, the CPU clock's Hz -> % of one core, bytes -> MB, 1/s -> objects/s. A field without
a unit counts things: ``count`` says what (objects, threads, overloads).

The kind says how a field is shown over time:

- ``gauge``: a value at the moment of the sample (memory, CPU, latency): drawn as it is.
- ``counter``: a total since the node started (objects_sent, bytes_sent): drawn as its rate, the
  increase per second between consecutive samples of a node (Grafana's and Kibana's "rate").
- ``constant``: a setting of the node (the buffer sizes): a table row, not a flat line.
- ``flag``: true at some moment since the previous sample (a buffer overloaded): spans of time.
- ``state``: the node's state (RUNNING, DRAINING...).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from flowstat.schema import sample as sample_schema

KINDS = ("gauge", "counter", "constant", "flag", "state")

HUMAN_UNITS: dict[str, tuple[str, float]] = {
    # the schema's x-unit -> (the unit people read, the factor from the schema's value to it)
    "kB": ("MB", 1e-3),
    "Hz (10^6 = one full core)": ("% of one core", 1e-4),  # 10^6 Hz = 100 %
    "bytes": ("MB", 1e-6),
    "1/s": ("objects/s", 1.0),
    "ms": ("ms", 1.0),
    "messages": ("messages", 1.0),
}


@dataclass(frozen=True)
class Label:
    """A sample field as people read it."""

    field: str
    label: str  # "VmRSS", "Merged objects/s": the dashboards' panel titles
    kind: str
    count: str = ""  # what a field without a unit counts: "objects", "threads"
    lower_is_worse: bool = False  # for "the worst node": the lowest value, not the highest

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.field}: kind {self.kind!r} is not one of {KINDS}")

    @property
    def schema_unit(self) -> str | None:
        return _units().get(self.field)

    @property
    def amount_unit(self) -> str:
        """The human unit of a value as recorded (a counter's total: objects, MB)."""
        return HUMAN_UNITS[self.schema_unit][0] if self.schema_unit else self.count

    @property
    def unit(self) -> str:
        """What a shown value is in: a gauge's or constant's human unit, a counter's per second."""
        return f"{self.amount_unit}/s" if self.kind == "counter" else self.amount_unit

    @property
    def scale(self) -> float:
        """The factor from the schema's value (a counter's: its increase per second) to the shown one."""
        return HUMAN_UNITS[self.schema_unit][1] if self.schema_unit else 1.0

    def titled(self) -> str:
        """The label with its unit, as an axis or a column says it: "VmRSS (MB)"."""
        return f"{self.label} ({self.unit})" if self.unit and self.unit not in self.label else self.label


@lru_cache(maxsize=1)
def _units() -> dict[str, str | None]:
    return {f.name: f.unit for f in sample_schema.fields()}


_LABELS = (
    Label("node_state", "Node state", "state"),
    Label("vmrss_kb", "VmRSS", "gauge"),
    Label("cpu_clock_hz", "CPU", "gauge"),
    Label("cpu_user_hz", "CPU, user mode", "gauge"),
    Label("cpu_system_hz", "CPU, system mode", "gauge"),
    Label("threads", "Threads", "gauge", count="threads"),
    Label("average_merge_time_ms", "Average merge time", "gauge"),
    Label("merged_objects_per_second", "Merged objects/s", "gauge", lower_is_worse=True),
    Label("objects_sent", "Objects out", "counter", count="objects"),
    Label("objects_received", "Objects in", "counter", count="objects"),
    Label("objects_merged", "Objects merged in", "counter", count="objects"),
    Label("bytes_sent", "Bytes out", "counter"),
    Label("bytes_received", "Bytes in", "counter"),
    Label("objects_held", "Objects held", "gauge", count="objects"),
    Label("objects_in_flight", "Objects in flight", "gauge", count="objects"),
    Label("input_latency_p50_ms", "Input latency p50", "gauge"),
    Label("input_latency_p99_ms", "Input latency p99", "gauge"),
    Label("input_latency_max_ms", "Input latency max", "gauge"),
    Label("input_latency_objects", "Objects the input latency covers", "gauge", count="objects"),
    Label("receive_buffer_size", "Receive buffer size", "constant"),
    Label("send_buffer_size", "Send buffer size", "constant"),
    Label("receive_buffer_overloaded", "Receive buffer overloaded", "flag"),
    Label("send_buffer_overloaded", "Send buffer overloaded", "flag"),
    Label("send_overload_events", "Send overloads", "counter", count="overloads"),
    Label("receive_overload_events", "Receive overloads", "counter", count="overloads"),
    Label("sequence_gaps", "Sequence gaps", "counter", count="objects"),
)
LABELS: dict[str, Label] = {lab.field: lab for lab in _LABELS}


def label(field: str) -> str:
    """A field's label ("vmrss_kb" -> "VmRSS"); KeyError for a field without one."""
    return LABELS[field].label


def shown_fields() -> list[str]:
    """The sample fields a person reads (with a label): every optional numeric, boolean or state field."""
    return [f.name for f in sample_schema.fields() if f.name in LABELS]


# The run parameters (run.schema.json's parameters, and the machine's CPUs) as people read them; the
# unit comes from the run schema the same way (HUMAN_UNITS), a size in bytes is written as one (1 kB).
PARAMETER_LABELS = {
    "object_type": "object type",
    "object_bytes": "object size",
    "producers": "producers",
    "rate_per_producer": "rate per producer",
    "buffer_size": "buffer size",
    "mergers": "mergers",
    "producer_processes": "producer processes",
    "duration_s": "duration",
    "cpus": "pinned CPUs",
    "merge_cost_per_object_ms": "merge cost per object",
    "merge_cost_per_mb_ms": "merge cost per MB",
    "merge_cost_factor": "merge cost factor",
    "merge_cost_nodes": "merge cost per node",
    "kernel_buffer_bytes": "kernel buffers",
}


def parameter_label(name: str, path: tuple[str, ...] = ()) -> str:
    """A run parameter's label (its name with spaces when it has none here); the machine's CPUs are "CPUs"."""
    if path == ("machine", "cpus"):
        return "CPUs"
    return PARAMETER_LABELS.get(name, name.replace("_", " "))
