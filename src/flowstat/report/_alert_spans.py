"""The source of the "which alert conditions held and when" section, kept apart from the page:
flowstat.views.alerts.evaluate over the run's arrays (the nodes' samples, by the agent the report
shows) and the agents' self-samples."""

from __future__ import annotations

import numpy as np

from flowstat.schema import sample as sample_schema
from flowstat.views.alerts import Columns, Span, columns, needed_fields
from flowstat.views.alerts import evaluate as evaluate_columns
from flowstat.views.panels import AGENT, NODE

from .load import Run

_STATES = np.array([*sample_schema.NODE_STATES, None], dtype=object)  # index -1 (a state outside the schema): None


def node_columns(run: Run) -> list[Columns]:
    """The run's node series as the alerts read them (the fields they need, straight from its arrays)."""
    wanted = needed_fields(NODE)
    t = run.ns / 1e9
    out = []
    for s in run.series:
        fields = {f: run.values[f][s.lo : s.hi] for f in wanted if f in run.values}
        if "node_state" in wanted:
            fields["node_state"] = _STATES[run.state[s.lo : s.hi]]
        labels = {"run_id": run.file.run_id or run.name, "agent": run.agent or "", "node_id": s.node_id, "role": s.role}
        out.append(Columns(labels, t[s.lo : s.hi], fields))
    return out


def evaluate(run: Run) -> list[Span]:
    """Where each alert condition held over the run: its spans, in epoch seconds."""
    return evaluate_columns(node_columns(run), columns(run.file.self_samples, AGENT))
