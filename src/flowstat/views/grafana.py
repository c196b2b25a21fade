"""Grafana (11 to 13) provisioning generated from the views and the alerts: datasources with fixed
uids, a file dashboard provider, the dashboards' JSON, and unified-alerting rules with a webhook
contact point and a notification policy. ``files()`` is what dashboards/grafana/ holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml

from flowstat.schema import flow as flow_schema
from flowstat.schema import sample as sample_schema
from flowstat.stores import elasticsearch as es_store
from flowstat.stores import influxdb

from . import influxql, promql
from .alerts import ALERTS, AlertRule
from .panels import PARAMETERS, RUN, VERDICT, VIEWS, Panel, View, description, grafana_unit, per_node, schema_type

INFLUX = {"type": "influxdb", "uid": "flowstat-influxdb"}
ES_RUNS = {"type": "elasticsearch", "uid": "flowstat-es-runs"}
ES_SAMPLES = {"type": "elasticsearch", "uid": "flowstat-es-samples"}
PROMETHEUS = promql.DATASOURCE
EXPRESSION = "__expr__"
FOLDER = "flowstat"
CONTACT_POINT = "flowstat-webhook"
SCHEMA_VERSION = 39  # Grafana 11's dashboard schema; 12 and 13 migrate it on load
ALERT_GROUP_INTERVAL = "10s"
# The flow verdict's values (verdict.schema.json's flow), as its state timeline colours them.
FLOW_COLORS = {"held_back": "red", "none": "green", "unknown": "text"}


def datasources() -> dict:
    """URLs and credentials come from the environment (set by docker-compose.yml from .env)."""
    influx = {
        "name": "flowstat InfluxDB",
        **INFLUX,
        "access": "proxy",
        "url": "${FLOWSTAT_INFLUX_URL}",
        "user": "${FLOWSTAT_INFLUX_READER}",
        "secureJsonData": {"password": "${FLOWSTAT_INFLUX_READER_PASSWORD}"},
        "jsonData": {"version": "InfluxQL", "dbName": influxdb.DATABASE, "httpMode": "POST", "timeInterval": "1s"},
        "isDefault": True,
        "editable": False,
    }

    def elastic(ds: dict, name: str, index: str, time_field: str) -> dict:
        return {
            "name": name,
            **ds,
            "access": "proxy",
            "url": "${FLOWSTAT_ES_URL}",
            "basicAuth": True,
            "basicAuthUser": "${FLOWSTAT_ES_READER}",
            "secureJsonData": {"basicAuthPassword": "${FLOWSTAT_ES_READER_PASSWORD}"},
            "jsonData": {"index": index, "timeField": time_field, "timeInterval": "1s"},
            "editable": False,
        }

    return {
        "apiVersion": 1,
        "datasources": [
            influx,
            elastic(ES_SAMPLES, "flowstat Elasticsearch samples", f"{es_store.SAMPLES_INDEX}*", "time"),
            elastic(ES_RUNS, "flowstat Elasticsearch runs", f"{es_store.RUNS_INDEX}*", "started"),
            {
                "name": "flowstat Prometheus",
                **PROMETHEUS,
                "access": "proxy",
                "url": "${FLOWSTAT_PROMETHEUS_URL}",
                # the scrape interval: $__interval's floor and $__rate_interval's base (docs/prometheus.md)
                "jsonData": {"httpMethod": "POST", "timeInterval": promql.SCRAPE_INTERVAL},
                "editable": False,
            },
        ],
    }


def dashboard_provider() -> dict:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "flowstat",
                "orgId": 1,
                "folder": FOLDER,
                "type": "file",
                "disableDeletion": True,
                "updateIntervalSeconds": 30,
                "allowUiUpdates": False,
                "options": {"path": "/etc/grafana/dashboards/flowstat", "foldersFromFilesStructure": False},
            }
        ],
    }


# -- dashboards ---------------------------------------------------------------------------------


def _variable(name: str) -> dict:
    base = {"name": name, "hide": 0, "skipUrlSync": False}
    if name in ("run", "runs"):
        return {
            **base,
            "type": "query",
            "datasource": INFLUX,
            "query": influxql.variable_query(name),
            "label": "run" if name == "run" else "runs to compare",
            "regex": influxql.RUN_LABEL_REGEX,
            "refresh": 2 if name == "runs" else 1,
            "sort": 0,
            "multi": name == "runs",
            "includeAll": False,
        }
    if name in ("agent", "node"):
        out = {
            **base,
            "type": "query",
            "datasource": INFLUX,
            "query": influxql.variable_query(name),
            "refresh": 1,
            "sort": 1,
            "multi": name == "node",
            "includeAll": name == "node",
            "label": "samples of" if name == "agent" else "nodes",
        }
        if name == "node":
            # All as the regex .* (sent as it is), not every node id of the run as (a|b|...): on
            # thousands of nodes that alternation made each panel's InfluxQL tens of kB for InfluxDB to
            # parse and match against every node id (issue 28). The other conditions ($run, $role)
            # keep All to the run's nodes.
            out["allValue"] = ".*"
        return out
    if name == "role":
        # The harness's roles and the default to pick from; All is every role, any other the sample
        # schema's pattern allows included (a role not listed would be left out of an All of the list).
        roles = (*sample_schema.PIPELINE_ROLES, sample_schema.DEFAULT_ROLE)
        return {
            **base,
            "type": "custom",
            "query": ",".join(roles),
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {"text": ["All"], "value": ["$__all"]},
            "options": [{"text": r, "value": r, "selected": False} for r in roles],
        }
    if name == "param":
        return {
            **base,
            "type": "custom",
            "label": "compared by",
            "query": ",".join(PARAMETERS),
            "multi": False,
            "includeAll": False,
            "current": {"text": PARAMETERS[0], "value": PARAMETERS[0]},
            "options": [{"text": p, "value": p, "selected": i == 0} for i, p in enumerate(PARAMETERS)],
        }
    raise ValueError(f"unknown variable {name!r}")


def _field_config(panel: Panel) -> dict:
    units = {grafana_unit(panel, m) for m in panel.metrics}
    defaults: dict[str, Any] = {"unit": units.pop() if len(units) == 1 else "none"}
    overrides = []
    if len(panel.metrics) > 1 and panel.kind != "table":
        overrides = [
            {
                "matcher": {"id": "byName", "options": m.label or m.field},
                "properties": [{"id": "unit", "value": grafana_unit(panel, m)}],
            }
            for m in panel.metrics
        ]
    if panel.kind == "state-timeline" or any(schema_type(panel.source, m.field) == "boolean" for m in panel.metrics):
        defaults["mappings"] = [
            {
                "type": "value",
                "options": {
                    "true": {"text": "yes", "color": "green", "index": 0},
                    "false": {"text": "NO", "color": "red", "index": 1},
                },
            }
        ]
        defaults["color"] = {"mode": "thresholds"}
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}]}
    if panel.source == VERDICT and panel.kind == "state-timeline":
        flows = flow_schema.schema(VERDICT)["properties"]["flow"]["enum"]
        options = {v: {"text": v.replace("_", " "), "color": FLOW_COLORS[v], "index": i} for i, v in enumerate(flows)}
        defaults["mappings"] = [{"type": "value", "options": options}]
    return {"defaults": defaults, "overrides": overrides}


def _target(view: View, panel: Panel) -> dict:
    if panel.kind == "bargauge" and panel.source == RUN:
        # Grouped by a parameter's value: Elasticsearch can bucket by any field, InfluxQL only by tags.
        m = panel.metrics[0]
        return {
            "refId": "A",
            "datasource": ES_RUNS,
            "query": "run_id:$runs",
            "timeField": "started",
            "metrics": [{"id": "1", "type": "avg", "field": f"summary.{m.field}"}],
            "bucketAggs": [
                {
                    "id": "2",
                    "type": "terms",
                    "field": "parameters.$param",
                    "settings": {"min_doc_count": "1", "order": "asc", "orderBy": "_term", "size": "0"},
                }
            ],
        }
    alias = "$tag_node_id" if panel.group == ("node_id",) else " ".join(f"$tag_{g}" for g in panel.group)
    if len(panel.metrics) > 1 and panel.kind in ("timeseries", "state-timeline") and panel.group:
        alias += " $col"
    target = {
        "refId": "A",
        "datasource": INFLUX,
        "query": influxql.panel_query(view, panel),
        "rawQuery": True,
        "resultFormat": "table" if panel.kind == "table" else "time_series",
    }
    if panel.group and panel.kind != "table":
        target["alias"] = alias
    return target


def _options(panel: Panel) -> dict:
    if panel.kind == "stat":
        return {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value_and_name",
            "orientation": "auto",
            "justifyMode": "auto",
        }
    if panel.kind == "bargauge":
        return {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "basic",
            "showUnfilled": True,
        }
    if panel.kind == "table":
        return {"showHeader": True, "cellHeight": "sm"}
    if panel.kind == "state-timeline":
        return {
            "showValue": "auto",
            "mergeValues": True,
            "rowHeight": 0.9,
            "alignValue": "left",
            "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom"},
        }
    return {
        "legend": {"showLegend": True, "displayMode": "table", "placement": "right", "calcs": ["mean", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }


def _panel(view: View, panel: Panel, pid: int, x: int, y: int) -> dict:
    out = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": description(panel),
        "gridPos": {"h": 4 if panel.kind == "stat" else 8, "w": panel.width, "x": x, "y": y},
        "datasource": ES_RUNS if panel.kind == "bargauge" and panel.source == RUN else INFLUX,
        "targets": [_target(view, panel)],
        "fieldConfig": _field_config(panel),
        "options": _options(panel),
    }
    if panel.rollup:
        out["interval"] = influxql.TOTALS_EVERY  # the rollup's bucket: a finer $__interval would ask for empty buckets
    if panel.kind == "table":
        out["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]
    return out


def _annotations(view: View) -> list[dict]:
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    if "run" not in view.variables:
        return [builtin]
    return [
        builtin,
        {
            "datasource": ES_RUNS,
            "enable": True,
            "iconColor": "purple",
            "name": "run start and end",
            "target": {"refId": "Anno", "query": "run_id:$run", "limit": 10},
            "timeField": "started",
            "timeEndField": "finished",
            "textField": "label",
            "tagsField": "host",
        },
    ]


def _laid_out(rows: list[tuple[str, list[Panel]]], build: Callable[[Panel, int, int, int], dict]) -> list[dict]:
    """Grafana's grid (24 wide): a row header, then the row's panels left to right, wrapping under the
    tallest of the line; ``build(panel, id, x, y)`` makes each panel."""
    panels: list[dict] = []
    pid, y = 1, 0
    for title, row_panels in rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        pid, y, x, height = pid + 1, y + 1, 0, 0
        for panel in row_panels:
            if x + panel.width > 24:
                x, y = 0, y + height
            built = build(panel, pid, x, y)
            panels.append(built)
            pid, x, height = pid + 1, x + panel.width, max(height, built["gridPos"]["h"])
        y += height
    return panels


def dashboard(view: View) -> dict:
    panels = _laid_out([(r.title, list(r.panels)) for r in view.rows], lambda p, i, x, y: _panel(view, p, i, x, y))
    return {
        "uid": view.uid,
        "title": view.title,
        "description": view.description,
        "tags": ["flowstat"],
        "timezone": "utc",
        "editable": False,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "graphTooltip": 1,
        "templating": {"list": [_variable(v) for v in view.variables]},
        "annotations": {"list": _annotations(view)},
        "panels": panels,
        "links": [{"title": "flowstat", "type": "dashboards", "tags": ["flowstat"], "asDropdown": True}],
    }


# -- dashboards for a Prometheus data source ------------------------------------------------------


def _prometheus_variable(name: str) -> dict:
    if name == "role":
        return _variable(name)  # a custom list: the same
    query = promql.variable_query(name)
    out = {
        **_variable(name),
        "datasource": PROMETHEUS,
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "definition": query,
        "refresh": 2,  # on a time range change: label_values asks for the series of the range
        "sort": 1 if name != "run" else 0,
    }
    out.pop("regex", None)
    if name == "run":
        out["label"] = "run"
    return out


def _prometheus_field_config(panel: Panel) -> dict:
    out = _field_config(panel)
    if len(panel.metrics) > 1:
        # one target per metric: each matched by its query (the series are named by the legend)
        out["overrides"] = [
            {
                "matcher": {"id": "byFrameRefID", "options": chr(ord("A") + i)},
                "properties": [{"id": "unit", "value": grafana_unit(panel, m)}],
            }
            for i, m in enumerate(panel.metrics)
        ]
    if "mappings" in out["defaults"]:
        options = (
            promql.state_mappings()
            if any(m.field == "node_state" for m in panel.metrics)
            else {
                "1": {"text": "yes", "color": "green", "index": 0},
                "0": {"text": "NO", "color": "red", "index": 1},
            }
        )
        out["defaults"]["mappings"] = [{"type": "value", "options": options}]
    return out


def _prometheus_description(panel: Panel) -> str:
    if not per_node(panel):
        return panel.description
    every = "Every selected node (PromQL has no first-N-by-name: pick nodes to see fewer)."
    return f"{panel.description} {every}".lstrip()


def _prometheus_panel(view: View, panel: Panel, pid: int, x: int, y: int) -> dict:
    targets = [
        {
            "refId": chr(ord("A") + i),
            "datasource": PROMETHEUS,
            "expr": expr,
            "legendFormat": legend,
            "range": True,
            "instant": False,
            "editorMode": "code",
        }
        for i, (expr, legend) in enumerate(promql.queries(view, panel))
    ]
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": _prometheus_description(panel),
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "datasource": PROMETHEUS,
        "targets": targets,
        "fieldConfig": _prometheus_field_config(panel),
        "options": _options(panel),
    }


def prometheus_dashboard(view: View) -> dict:
    """The view's panels that PromQL can draw (promql.left_out says which it cannot), on the
    Prometheus data source, with the same variables as the InfluxDB dashboard."""
    kept = set(map(id, promql.panels(view)))
    rows = [(r.title, [p for p in r.panels if id(p) in kept]) for r in view.rows]
    panels = _laid_out(
        [(title, shown) for title, shown in rows if shown], lambda p, i, x, y: _prometheus_panel(view, p, i, x, y)
    )
    gone = promql.left_out(view)
    note = f" Left out (not in Prometheus): {', '.join(gone)}." if gone else ""
    return {
        "uid": promql.uid(view),
        "title": f"{view.title} (Prometheus)",
        "description": f"{view.description}{note}",
        "tags": ["flowstat", "prometheus"],
        "timezone": "utc",
        "editable": False,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "graphTooltip": 1,
        "templating": {"list": [_prometheus_variable(v) for v in view.variables]},
        "annotations": {"list": _annotations(view)[:1]},  # Grafana's own; the run's span is Elasticsearch's
        "panels": panels,
        "links": [{"title": "flowstat", "type": "dashboards", "tags": ["flowstat"], "asDropdown": True}],
    }


# -- alerting -----------------------------------------------------------------------------------


def _query(ref: str, text: str, seconds: int) -> dict:
    return {
        "refId": ref,
        "relativeTimeRange": {"from": seconds, "to": 0},
        "datasourceUid": INFLUX["uid"],
        "model": {
            "refId": ref,
            "datasource": INFLUX,
            "query": text,
            "rawQuery": True,
            "resultFormat": "time_series",
            "intervalMs": 1000,
            "maxDataPoints": 43200,
        },
    }


def _expression(ref: str, model: dict) -> dict:
    return {
        "refId": ref,
        "relativeTimeRange": {"from": 0, "to": 0},
        "datasourceUid": EXPRESSION,
        "model": {"refId": ref, "datasource": {"type": EXPRESSION, "uid": EXPRESSION}, **model},
    }


def math_expression(alert: AlertRule) -> str:
    """The condition in Grafana's math syntax, over the reduced quantities ($RA, $RB...)."""

    def one(conj) -> str:
        text = " && ".join(f"$R{a.ref}{f' - $R{a.minus}' if a.minus else ''} > {a.threshold:g}" for a in conj)
        return f"({text})" if len(conj) > 1 and len(alert.condition) > 1 else text

    return " || ".join(one(conj) for conj in alert.condition)


def rule(alert: AlertRule) -> dict:
    """Queries -> reduce (last: each query gives one value per group over the window) -> math over
    them when there are several -> threshold: the shape Grafana's rule editor makes."""
    data = [_query(q.ref, influxql.quantity_query(alert, q), alert.window_s) for q in alert.quantities]
    data += [
        _expression(
            f"R{q.ref}", {"type": "reduce", "expression": q.ref, "reducer": "last", "settings": {"mode": "dropNN"}}
        )
        for q in alert.quantities
    ]
    if len(alert.quantities) == 1:
        (only,) = alert.condition[0]
        subject, threshold = f"R{only.ref}", only.threshold
    else:
        data.append(_expression("CONDITION", {"type": "math", "expression": math_expression(alert)}))
        subject, threshold = "CONDITION", 0
    data.append(
        _expression(
            "THRESHOLD",
            {
                "type": "threshold",
                "expression": subject,
                "conditions": [{"evaluator": {"type": "gt", "params": [threshold]}}],
            },
        )
    )
    return {
        "uid": alert.uid,
        "title": alert.title,
        "condition": "THRESHOLD",
        "data": data,
        "noDataState": "OK",
        "execErrState": "Error",
        "for": f"{alert.for_s}s",
        "labels": {"source": "flowstat", "alert": alert.uid},
        "annotations": {"summary": alert.summary, "description": alert.why},
        "isPaused": False,
    }


def alert_rules() -> dict:
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": "flowstat",
                "folder": FOLDER,
                "interval": ALERT_GROUP_INTERVAL,
                "rules": [rule(a) for a in ALERTS],
            }
        ],
    }


def contact_points() -> dict:
    return {
        "apiVersion": 1,
        "contactPoints": [
            {
                "orgId": 1,
                "name": CONTACT_POINT,
                "receivers": [
                    {
                        "uid": "flowstat-webhook",
                        "type": "webhook",
                        "disableResolveMessage": False,
                        "settings": {"url": "${FLOWSTAT_ALERT_WEBHOOK}", "httpMethod": "POST"},
                    }
                ],
            }
        ],
    }


def notification_policies() -> dict:
    return {
        "apiVersion": 1,
        "policies": [
            {
                "orgId": 1,
                "receiver": CONTACT_POINT,
                "group_by": ["alertname", "run_id"],
                "group_wait": "10s",
                "group_interval": "1m",
                "repeat_interval": "4h",
            }
        ],
    }


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:  # a dict used twice is written twice, not as &id001/*id001
        return True


def _yaml(doc: dict, what: str) -> str:
    return (
        f"# Generated by `make generate` (python -m flowstat.generate) from src/flowstat/views: {what}. Do not edit.\n"
        + yaml.dump(doc, Dumper=_NoAliases, sort_keys=False, width=120)
    )


COMPACT = (",", ":")  # json.dumps separators without spaces


def files() -> dict[str, str]:
    """dashboards/grafana/...: path -> content."""
    out = {
        "provisioning/datasources/flowstat.yaml": _yaml(datasources(), "datasources with fixed uids"),
        "provisioning/dashboards/flowstat.yaml": _yaml(dashboard_provider(), "the dashboards' provider"),
        "provisioning/alerting/rules.yaml": _yaml(alert_rules(), "alert rules"),
        "provisioning/alerting/contact-points.yaml": _yaml(contact_points(), "the webhook contact point"),
        "provisioning/alerting/policies.yaml": _yaml(notification_policies(), "the notification policy"),
    }
    # Compact: Grafana reads them and nobody edits them (the views are the source); indented, a
    # quarter of their bytes was whitespace.
    for view in VIEWS:
        out[f"dashboards/{view.uid}.json"] = json.dumps(dashboard(view), separators=COMPACT) + "\n"
    for view in promql.VIEWS:
        out[f"dashboards/{promql.uid(view)}.json"] = json.dumps(prometheus_dashboard(view), separators=COMPACT) + "\n"
    return out
