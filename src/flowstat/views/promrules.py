"""Prometheus alerting rules for the alert conditions on samples (flowstat.views.alerts), over the
families an agent's /metrics serves (flowstat.schema.prometheus): the same quantities, thresholds,
windows, ``for`` and groups as Grafana's and ElastAlert2's rules, in PromQL.

The conditions on flowstat verdict's verdicts ("pipeline held back") read what ``flowstat verdict
--listen`` serves: each run's latest verdict, a series per set of nodes held back (the verdict's
tags are its labels). "Every verdict in the window names them, at least W/every - 3" becomes the
series above 0 at every evaluation for W (``for``): a verdict naming others, or none, ends the
series and starts the wait again, as one that does not name them does in the other engines.

Prometheus holds what each scrape saw, not every sample, so each quantity is taken over the scrapes
of the window (docs/prometheus.md says what that changes):

    count of samples with a flag   sum_over_time(FLAG[W])           (a flag is 1 or 0)
    count of samples in a state    sum_over_time(STATE{state="S"}[W])
    last                           the instant value
    rise (last minus first)        X - X offset W                   (no extrapolation, unlike delta())
    slope_per_min                  deriv(X[W]) * 60
    slope_buckets > N              X offset (N x 10 s)               (the series is that old)

Each is taken ``max by`` the rule's group, and thresholds are scaled to the family's base unit (a
latency in ms to seconds, VmRSS in kB to bytes).

A second group records (``record:``, named ``level:metric:operations`` as Prometheus's practice
has it) the alerts' quantities, each per the rule's group, and what the heavier panels sum over
nodes: each counter a panel rates, per run and role, and the aggregate view's totals per run and
role. The alerts and the dashboards keep their own expressions: a recorded series exists only from
when a server began evaluating the rules, not for runs replayed as blocks (flowstat replay
--prometheus), nor back over a window at the rules' start.
"""

from __future__ import annotations

import yaml

from flowstat.schema import prometheus

from .alerts import ALERTS, SLOPE_BUCKET_S, AlertRule, Quantity
from .panels import AGENT, AGGREGATE_VIEW, NODE, RUN_VIEW, STACK_VIEW, VERDICT

GROUP = "flowstat"
RECORDING_GROUP = "flowstat-recording"
RATE_WINDOW = "1m"  # the recorded rates' window: four scrapes at 15 s
_FAMILIES = {f.field: f for f in prometheus.NODE_FAMILIES}
_AGENT_FAMILIES = {f.field: f for f in prometheus.AGENT_FAMILIES}
_VERDICT_FAMILIES = {f.field: f for f in prometheus.VERDICT_FAMILIES}
RULED = ALERTS  # every alert has a rule here


def _number(x: float) -> str:
    return repr(float(x)).removesuffix(".0") if float(x).is_integer() else repr(float(x))


def _family(alert: AlertRule, field: str) -> prometheus.Family:
    families = _AGENT_FAMILIES if alert.source == AGENT else _FAMILIES
    return families[field]


def _selector(alert: AlertRule, q: Quantity, field: str) -> str:
    """The series of one field, with the quantity's conditions on labels (role) as matchers."""
    family = _family(alert, field)
    labels = [f'{k}="{v}"' for k, v in q.where if k in prometheus.NODE_LABELS]
    name = family.name + ("_total" if family.type == "counter" else "")
    if family.type == "stateset":
        raise ValueError(f"{alert.uid}: a stateset is read through a where on its field")
    return f"{name}{{{','.join(labels)}}}" if labels else name


def _window(alert: AlertRule) -> str:
    return f"{alert.window_s}s"


def _quantity(alert: AlertRule, q: Quantity) -> list[str]:
    """The PromQL expressions whose value is the quantity (several: any of them above the threshold,
    for a count of samples with any of several flags)."""
    w = _window(alert)
    if q.kind == "count":
        states = [(k, v) for k, v in q.where if k == "node_state"]
        if states:
            family = _family(alert, "node_state")
            return [f'sum_over_time({family.name}{{{family.name}="{states[0][1]}"}}[{w}])']
        if not q.any_of:
            return [f"count_over_time({_selector(alert, q, q.field)}[{w}])"]
        return [f"sum_over_time({_selector(alert, q, flag)}[{w}])" for flag, _ in q.any_of]
    x = _selector(alert, q, q.field)
    if q.kind == "last":
        return [x]
    if q.kind == "rise":
        return [f"({x} - {x} offset {w})"]
    if q.kind == "slope_per_min":
        return [f"(deriv({x}[{w}]) * 60)"]
    raise ValueError(f"{alert.uid}: no PromQL for a {q.kind} quantity")


def _above(alert: AlertRule, ref: str, threshold: float) -> str:
    q = alert.quantity(ref)
    by = f"max by ({', '.join(alert.group)})"
    if q.kind == "slope_buckets":  # the series began at least one bucket more than that ago
        age = (int(threshold) + 1) * SLOPE_BUCKET_S
        return f"{by} ({_selector(alert, q, q.field)} offset {age}s)"
    scale = 1.0 if q.kind == "count" else _family(alert, q.field).scale
    parts = [f"{by} ({e}) > {_number(threshold * scale)}" for e in _quantity(alert, q)]
    return parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"


def _verdict_expression(alert: AlertRule) -> str:
    """A condition on verdicts: its group's verdicts meet the first quantity's at_least (the others,
    every verdict of the run, are what ``for`` stands for)."""
    q = alert.quantities[0]
    ((field, least),) = q.at_least
    name = _VERDICT_FAMILIES[field].name
    return f"max by ({', '.join(alert.group)}) ({name}) >= {_number(least)}"


def expression(alert: AlertRule) -> str:
    """The rule's condition: any of (all of (quantity > threshold))."""
    if alert.source == VERDICT:
        return _verdict_expression(alert)
    conjunctions = [" and ".join(_above(alert, a.ref, a.threshold) for a in conj) for conj in alert.condition]
    return conjunctions[0] if len(conjunctions) == 1 else " or ".join(f"({c})" for c in conjunctions)


def alert_name(alert: AlertRule) -> str:
    """Prometheus's style: FlowstatBufferOverloaded."""
    return "Flowstat" + "".join(w[:1].upper() + w[1:] for w in alert.title.split())


def rule(alert: AlertRule) -> dict:
    body: dict = {"alert": alert_name(alert), "expr": expression(alert)}
    for_s = alert.window_s if alert.source == VERDICT else alert.for_s  # see the module's docstring
    if for_s:
        body["for"] = f"{for_s}s"
    body["labels"] = {"flowstat_alert": alert.uid}
    body["annotations"] = {"summary": alert.summary, "description": alert.why}
    return body


def _level(group: tuple[str, ...]) -> str:
    """A recorded series' level: the labels it is per (run_id, node_id, agent: run_node_agent)."""
    return "_".join(g.removesuffix("_id") for g in group)


def _operations(alert: AlertRule, q: Quantity, expr: str) -> str:
    w = _window(alert)
    if q.kind == "count":
        return f"{'count' if expr.startswith('count') else 'sum'}_over_time{w}"
    return {"last": "max", "rise": f"rise{w}", "slope_per_min": f"deriv{w}_per_min"}[q.kind]


def _recorded_metric(alert: AlertRule, q: Quantity, expr: str) -> str:
    """The quantity's family, the state's value or the flag's family as the metric part of the name."""
    states = [v for k, v in q.where if k == "node_state"]
    if states:
        return f"{_family(alert, 'node_state').name}_{str(states[0]).lower()}"
    families = _AGENT_FAMILIES if alert.source == AGENT else _FAMILIES
    used = [f for f in families.values() if f.sample_name() in expr and f.type != "stateset"]
    return max(used, key=lambda f: len(f.name)).name  # the longest: a name may hold a shorter one


def recording_rules() -> list[dict]:
    """record: rules, deduplicated by name, in the order the alerts and views name them."""
    out: dict[str, str] = {}
    for alert in RULED:
        if alert.source == VERDICT:
            continue  # the verdict is the quantity: nothing to record
        by = f"max by ({', '.join(alert.group)})"
        for q in alert.quantities:
            if q.kind == "slope_buckets":
                continue  # the series' age: an offset, nothing to record
            for e in _quantity(alert, q):
                name = f"{_level(alert.group)}:{_recorded_metric(alert, q, e)}:{_operations(alert, q, e)}"
                out.setdefault(name, f"{by} ({e})")
    for view, source, group in ((RUN_VIEW, NODE, ("run_id", "role")), (STACK_VIEW, AGENT, ("host", "agent"))):
        families = _AGENT_FAMILIES if source == AGENT else _FAMILIES
        for panel in view.panels():
            for m in panel.metrics:
                if panel.source != source or m.agg not in ("rate", "increase") or m.field not in families:
                    continue
                f = families[m.field]
                out.setdefault(
                    f"{_level(group)}:{f.name}:rate{RATE_WINDOW}",
                    f"sum by ({', '.join(group)}) (rate({f.sample_name()}[{RATE_WINDOW}]))",
                )
    for panel in AGGREGATE_VIEW.panels():
        if panel.rollup:
            (m,) = panel.metrics
            f = _FAMILIES[m.field]
            out.setdefault(f"run_role:{f.name}:sum", f"sum by (run_id, role) ({f.sample_name()})")
    return [{"record": name, "expr": expr} for name, expr in out.items()]


def rules() -> dict:
    return {
        "groups": [
            {"name": GROUP, "interval": "10s", "rules": [rule(a) for a in RULED]},
            {"name": RECORDING_GROUP, "interval": "10s", "rules": recording_rules()},
        ]
    }


def rules_text() -> str:
    return (
        "# Generated by flowstat.views.promrules from flowstat.views.alerts: do not edit (make generate).\n"
        "# FlowstatPipelineHeldBack reads flowstat verdict --listen's /metrics: scrape it (docs/prometheus.md).\n"
        + yaml.safe_dump(rules(), sort_keys=False, width=120)
    )
