"""PromQL for the run view's and the stack view's panels, over the families an agent's /metrics serves
and ``flowstat replay --prometheus`` writes (flowstat.schema.prometheus): what the Grafana dashboards
for a Prometheus data source show (flowstat.views.grafana), the same figures as the InfluxQL panels.

Each metric of a panel is one expression, in the panel's unit (the family's base unit scaled back to
the field's, then by the metric's scale), one series per the panel's group:

    mean        avg by (GROUP) (avg_over_time(F[$__interval]))     (InfluxQL: mean() per bucket)
    max         max by (GROUP) (max_over_time(F[$__interval]))
    last        max by (GROUP) (last_over_time(F[$__interval]))
    rate        sum by (GROUP) (rate(F_total[$__rate_interval]))   (non_negative_derivative(max(F), 1s))
    increase    the rate times $__interval                         (non_negative_difference(max(F)))

Windows of $__interval, which Grafana keeps at least the data source's scrape interval, so that a
step without a scrape is a gap as InfluxQL's fill(none) leaves one; counters over $__rate_interval
(at least four scrapes). The node state, a stateset, is drawn as the index of the node's state in
the schema's list, which the panel's value mappings name. A panel whose field has no family (the
run document's: run parameters and verdicts) is not translated: ``left_out`` says which and why.
Template variables ($run, $agent, $role, $node) are those of the InfluxDB dashboards, filled by
``label_values`` queries; Grafana expands them (a single value raw, a multi-value one as a regex).
"""

from __future__ import annotations

from flowstat.schema import prometheus
from flowstat.schema import sample as sample_schema

from .panels import AGENT, FLOW_SOURCES, NODE, RUN, RUN_VIEW, STACK_VIEW, Metric, Panel, View

DATASOURCE = {"type": "prometheus", "uid": "flowstat-prometheus"}
SCRAPE_INTERVAL = "15s"  # the data source's: $__interval's floor, and $__rate_interval's base
VIEWS: tuple[View, ...] = (RUN_VIEW, STACK_VIEW)
STATES: tuple[str, ...] = tuple(sample_schema.schema()["properties"]["node_state"]["enum"])

# Which label each variable sets, and how: a single-value variable matched exactly, a multi-value
# one (and one with an All) as a regex.
VARIABLE_LABELS = {"run": "run_id", "agent": "agent", "role": "role", "node": "node_id"}
MULTI = {"role", "node"}
_NODE_FAMILIES = {f.field: f for f in prometheus.NODE_FAMILIES}
_AGENT_FAMILIES = {f.field: f for f in prometheus.AGENT_FAMILIES}
_STATE = _NODE_FAMILIES["node_state"]
VARIABLE_METRIC = _STATE.name  # every node has a state at every sample: the variables' series


def uid(view: View) -> str:
    return f"{view.uid}-prometheus"


def family(source: str, field: str) -> prometheus.Family | None:
    if source == NODE:
        return _NODE_FAMILIES.get(field)
    if source == AGENT:
        return _AGENT_FAMILIES.get(field)
    return None


def left_out(view: View) -> dict[str, str]:
    """The view's panels that the Prometheus dashboard leaves out: title -> why."""
    out = {}
    for panel in view.panels():
        if panel.source == RUN:
            out[panel.title] = "the run document (parameters, verdicts, summary) is not exposed to Prometheus"
            continue
        if panel.source in FLOW_SOURCES:
            out[panel.title] = (
                "flowstat verdict writes its verdicts and edge rates to InfluxDB and Elasticsearch; to "
                "Prometheus it serves only each live run's latest (--listen), for the held-back alert"
            )
            continue
        if panel.rollup:
            out[panel.title] = "read from InfluxDB's rollup, which Prometheus has no counterpart of"
            continue
        fields = [name for m in panel.metrics for name in (m.field, m.minus) if name]
        missing = [name for name in fields if family(panel.source, name) is None]
        if missing:
            out[panel.title] = f"no Prometheus family for {', '.join(missing)} (no x-prometheus in its schema)"
        elif panel.kind not in ("timeseries", "state-timeline"):
            out[panel.title] = f"a {panel.kind} panel: not translated to PromQL"
    return out


def panels(view: View) -> list[Panel]:
    """The view's panels that the Prometheus dashboard has."""
    gone = left_out(view)
    return [p for p in view.panels() if p.title not in gone]


def _number(x: float) -> str:
    return f"{x:.12g}"


def _matchers(view: View, panel: Panel) -> list[str]:
    out = []
    if panel.source == NODE:
        for v in view.variables:
            if v in VARIABLE_LABELS:
                op = "=~" if v in MULTI else "="
                out.append(f'{VARIABLE_LABELS[v]}{op}"${v}"')
    labels = prometheus.NODE_LABELS if panel.source == NODE else prometheus.AGENT_LABELS
    for k, value in panel.where:
        if k not in labels:
            raise ValueError(f"panel {panel.title!r}: a condition on {k}, which is no label")
        out.append(f'{k}="{value}"')
    return out


def selector(view: View, panel: Panel, fam: prometheus.Family, extra: tuple[str, ...] = ()) -> str:
    matchers = _matchers(view, panel) + list(extra)
    body = "{" + ",".join(matchers) + "}" if matchers else ""
    return fam.sample_name() + body


def _state_index(view: View, panel: Panel) -> str:
    """The node's state as its index in STATES: one 0/1 series per state, the one at 1 kept and
    given its index."""
    by = ", ".join(panel.group)
    parts = []
    for i, state in enumerate(STATES):
        x = selector(view, panel, _STATE, (f'{_STATE.name}="{state}"',))
        parts.append(f"(last_over_time({x}[$__interval]) == 1) * 0 + {i}")
    return f"max by ({by}) (" + " or ".join(parts) + ")"


def _one(view: View, panel: Panel, field: str, agg: str, scale: float) -> str:
    fam = family(panel.source, field)
    if fam is None:
        raise ValueError(f"panel {panel.title!r}: no Prometheus family for {field}")
    by = ", ".join(panel.group)
    if fam.type == "stateset":
        if agg != "last" or scale != 1.0:
            raise ValueError(f"panel {panel.title!r}: a state is only shown as it is (last)")
        return _state_index(view, panel)
    x = selector(view, panel, fam)
    if agg in ("rate", "increase") and fam.type != "counter":
        raise ValueError(f"panel {panel.title!r}: {field} is a gauge in Prometheus, not a counter")
    if agg == "mean":
        expr = f"avg by ({by}) (avg_over_time({x}[$__interval]))"
    elif agg == "max":
        expr = f"max by ({by}) (max_over_time({x}[$__interval]))"
    elif agg == "last":
        expr = f"max by ({by}) (last_over_time({x}[$__interval]))"
    elif agg == "rate":
        expr = f"sum by ({by}) (rate({x}[$__rate_interval]))"
    else:  # increase per $__interval
        expr = f"sum by ({by}) (rate({x}[$__rate_interval])) * $__interval_ms / 1000"
    factor = scale / fam.scale  # the family's base unit back to the field's, then the metric's scale
    return expr if factor == 1.0 else f"{expr} * {_number(factor)}"


def metric_expression(view: View, panel: Panel, m: Metric) -> str:
    """One metric of a panel as PromQL, in the panel's unit."""
    expr = _one(view, panel, m.field, m.agg, m.scale)
    if m.minus:
        expr = f"{expr} - {_one(view, panel, m.minus, m.agg, m.scale)}"
    return expr


def legend(panel: Panel, m: Metric) -> str:
    text = " ".join(f"{{{{{g}}}}}" for g in panel.group)
    return f"{text} {m.label or m.field}" if len(panel.metrics) > 1 else text


def queries(view: View, panel: Panel) -> list[tuple[str, str]]:
    """The panel's targets: (expression, legend) per metric."""
    return [(metric_expression(view, panel, m), legend(panel, m)) for m in panel.metrics]


def variable_query(name: str) -> str:
    """A variable's ``label_values`` query: the runs, then the run's agents, then its nodes of the
    roles picked."""
    if name == "run":
        return f"label_values({VARIABLE_METRIC}, run_id)"
    if name == "agent":
        return f'label_values({VARIABLE_METRIC}{{run_id="$run"}}, agent)'
    if name == "node":
        return f'label_values({VARIABLE_METRIC}{{run_id="$run",agent="$agent",role=~"$role"}}, node_id)'
    raise ValueError(f"no label_values query for variable {name!r}")


def state_mappings() -> dict[str, dict]:
    """Value mappings for the node state panel: each state's index named."""
    return {str(i): {"text": s, "index": i} for i, s in enumerate(STATES)}
