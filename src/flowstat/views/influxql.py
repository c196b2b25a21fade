"""InfluxQL for the views' panels and variables and for the alerts' quantities, in Grafana's raw
query mode: template variables ($run, $node...), $timeFilter and $__interval are left for Grafana
to expand (docs/dashboards.md says how it does)."""

from __future__ import annotations

from flowstat.schema import flow as flow_schema
from flowstat.schema import run as run_schema
from flowstat.stores import influxdb

from .alerts import SLOPE_BUCKET_S, AlertRule, Quantity
from .panels import AGENT, EDGE, FLOW_SOURCES, NODE, NODES_PER_PANEL, RUN, VERDICT, Metric, Panel, View, per_node

NODE_MEASUREMENT = "flowstat_node"
AGENT_MEASUREMENT = "flowstat_agent"
RUN_MEASUREMENT = run_schema.measurement()
MEASUREMENTS = {
    NODE: NODE_MEASUREMENT,
    AGENT: AGENT_MEASUREMENT,
    RUN: RUN_MEASUREMENT,
    VERDICT: flow_schema.measurement(VERDICT),
    EDGE: flow_schema.measurement(EDGE),
}
TOTALS_EVERY = influxdb.ROLLUP_BUCKETS[0][0]  # the finest rollup: the aggregate view's sums over nodes
TOTALS = f'"{influxdb.ROLLUP_POLICY}"."{influxdb.totals_measurement(TOTALS_EVERY)}"'
RUN_LABEL_REGEX = r"/^(?<text>(?<value>[^ ]+) \| .*)$/"  # the run id before " | " (schema.run.label)

# Which tag each dashboard variable filters (a regex match, so one value, several or All alike).
VARIABLE_TAGS = {"run": "run_id", "runs": "run_id", "agent": "agent", "role": "role", "node": "node_id"}


def ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def literal(value: object) -> str:
    """An InfluxQL literal: booleans and numbers bare, strings single-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _measurement(panel: Panel) -> str:
    if panel.rollup:
        return TOTALS
    return ident(MEASUREMENTS[panel.source])


def _variable_conditions(view: View, panel: Panel) -> list[str]:
    if panel.source == AGENT:
        return []
    wanted = (
        ("run",)
        if panel.source == RUN or panel.source in FLOW_SOURCES  # a run's series, not a node's or an agent's
        else ("run", "agent")
        if panel.rollup
        else ("runs", "agent")
        if "run_id" in panel.group
        else ("run", "agent", "role", "node")
    )
    return [f"{ident(VARIABLE_TAGS[v])} =~ /^${v}$/" for v in wanted if v in view.variables]


def _selector(m: Metric) -> str:
    def one(name: str) -> str:
        f = ident(name)
        return {
            "mean": f"mean({f})",
            "max": f"max({f})",
            "last": f"last({f})",
            "rate": f"non_negative_derivative(max({f}), 1s)",
            "increase": f"non_negative_difference(max({f}))",
        }[m.agg]

    expr = one(m.field) + (f" - {one(m.minus)}" if m.minus else "")
    if m.scale != 1.0:
        expr = f"{expr} * {m.scale!r}"
    return expr


def _table_columns(m: Metric) -> str:
    """A table's columns of one metric: a mean with its standard deviation (the thesis's tables),
    another aggregation as it is."""
    if m.agg == "mean":
        return ", ".join(f"{fn}({ident(m.field)}) AS {ident(f'{m.field} {fn}')}" for fn in ("mean", "stddev"))
    return f"{_selector(m)} AS {ident(m.label or m.field)}"


def panel_query(view: View, panel: Panel) -> str:
    """The panel's one InfluxQL statement (all its metrics as columns)."""
    where = _variable_conditions(view, panel) + [f"{ident(k)} = {literal(v)}" for k, v in panel.where]
    timed = panel.kind in ("timeseries", "state-timeline")
    if timed or panel.source in FLOW_SOURCES:  # a flow table too: over the dashboard's time range
        where.append("$timeFilter")
    if panel.kind == "table":
        cols = ", ".join(_table_columns(m) for m in panel.metrics)
    else:
        cols = ", ".join(f"{_selector(m)} AS {ident(m.label or m.field)}" for m in panel.metrics)
    q = f"SELECT {cols} FROM {_measurement(panel)}"
    if where:
        q += " WHERE " + " AND ".join(where)
    groups = [ident(g) for g in panel.group]
    if timed:
        q += " GROUP BY " + ", ".join(["time($__interval)", *groups]) + " fill(none)"
    elif groups:
        q += " GROUP BY " + ", ".join(groups)
    if per_node(panel):
        q += f" SLIMIT {NODES_PER_PANEL}"  # series come in tag order: the first nodes by name
    return q


def variable_query(name: str) -> str:
    """The query behind a dashboard variable (Grafana takes each row's first column)."""
    if name in ("run", "runs"):
        timed = " WHERE $timeFilter" if name == "runs" else ""
        return f'SELECT "label" FROM {ident(RUN_MEASUREMENT)}{timed} ORDER BY time DESC LIMIT 500'
    if name == "agent":
        return f'SHOW TAG VALUES FROM {ident(NODE_MEASUREMENT)} WITH KEY = "agent" WHERE "run_id" =~ /^$run$/'
    if name == "node":
        return (
            f'SHOW TAG VALUES FROM {ident(NODE_MEASUREMENT)} WITH KEY = "node_id" '
            f'WHERE "run_id" =~ /^$run$/ AND "role" =~ /^$role$/'
        )
    raise ValueError(f"no query for variable {name!r}")


def _condition(q: Quantity) -> list[str]:
    out = [f"{ident(k)} = {literal(v)}" for k, v in q.where] + [f"{ident(k)} >= {literal(v)}" for k, v in q.at_least]
    if q.any_of:
        out.append("(" + " OR ".join(f"{ident(k)} = {literal(v)}" for k, v in q.any_of) + ")")
    return out


def quantity_query(alert: AlertRule, q: Quantity) -> str:
    """One alert quantity per group (the alert's, or the quantity's own) over the rule's time range ($timeFilter)."""
    table = ident(MEASUREMENTS[alert.source])
    where = " AND ".join(_condition(q) + ["$timeFilter"])
    groups = ", ".join(ident(g) for g in q.per or alert.group)
    f = ident(q.field)
    if q.kind in ("slope_per_min", "slope_buckets"):
        outer = "mean" if q.kind == "slope_per_min" else "count"
        return (
            f'SELECT {outer}("slope") FROM (SELECT derivative(mean({f}), 1m) AS "slope" FROM {table} '
            f"WHERE {where} GROUP BY time({SLOPE_BUCKET_S}s), {groups}) GROUP BY {groups}"
        )
    select = {"count": f"count({f})", "last": f"last({f})", "rise": f"last({f}) - first({f})"}[q.kind]
    return f"SELECT {select} AS {ident(q.kind)} FROM {table} WHERE {where} GROUP BY {groups}"
