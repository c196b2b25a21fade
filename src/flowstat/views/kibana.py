"""Kibana 8.19 saved objects generated from the views: a data view per index with fixed ids, one
Lens visualization per panel, one dashboard per view. ``files()`` is what dashboards/kibana/
holds: one NDJSON file for Kibana's saved objects import API (docs/kibana.md).

Lens has no template variables: where Grafana picks a run, an agent or a node from a list, Kibana
filters with its query bar (``run_id : "demo-..."``), and the Lens objects aggregate whatever the
time range and the filters leave. Field names and their types come from the index templates
(flowstat.stores.elasticsearch.templates(), generated from the schemas), never restated here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from flowstat.schema import flow as flow_schema
from flowstat.schema import run as run_schema
from flowstat.stores import elasticsearch as es_store
from flowstat.stores import elasticsearch_rollup as es_rollup

from .panels import (
    AGENT,
    EDGE,
    FLOW_SOURCES,
    NODE,
    NODE_10S,
    NODES_PER_PANEL,
    PARAMETERS,
    RUN,
    RUN_VIEW_10S,
    VERDICT,
    VIEWS,
    Metric,
    Panel,
    View,
    description,
    schema_unit,
)

# -- migration versions ---------------------------------------------------------------------------
# Kibana migrates an imported object from the versions it says it is at; a version newer than the
# Kibana knows makes the import fail, an older one runs the migrations in between.
#
# coreMigrationVersion: "8.8.0" is what every 8.8+ Kibana writes on export (elastic/kibana
#   src/platform/test/api_integration/apis/saved_objects/bulk_get.ts reads objects back with it).
# index-pattern "8.0.0": the data view type has no model versions, its last migration is 8.0.0
#   (elastic/kibana src/platform/plugins/shared/data_views/server/saved_objects/data_views.ts).
# lens "8.9.0": Lens's last migration is 8.9.0; its first model version (10.1.0) came with
#   elastic/kibana#229534 (September 2025, 9.2), after 8.19.0.
# dashboard "10.2.0": model version 2 (controlGroupInput.showApplySelections), the schema these
#   attributes follow; bulk_get.ts (above) reads dashboards back at 10.2.0. Kibana 8.19 also has
#   model version 3 (collapsible sections, elastic/kibana#222450, backported with #222103), which
#   only adds the optional `sections`: 8.19 and 9.x take 10.2.0 and migrate it on import.
CORE_MIGRATION_VERSION = "8.8.0"
TYPE_MIGRATION_VERSIONS = {"index-pattern": "8.0.0", "lens": "8.9.0", "dashboard": "10.2.0"}

GRID_COLUMNS = 48  # Kibana's dashboard grid; the views' widths are on Grafana's 24
LAYER_REFERENCE = "indexpattern-datasource-layer-"  # + the layer id: the data view a Lens layer reads
COUNT_FIELD = "___records___"  # Lens's "count of records" pseudo-field
TERMS_SIZE = {"node_id": NODES_PER_PANEL, "run_id": 100, "from": 1000}  # how many values a split shows (default 20)


@dataclass(frozen=True)
class DataView:
    id: str
    title: str  # the index pattern
    time_field: str
    name: str


DATA_VIEWS = {
    NODE: DataView("flowstat-samples", f"{es_store.SAMPLES_INDEX}*", "time", "flowstat samples"),
    RUN: DataView("flowstat-runs", f"{es_store.RUNS_INDEX}*", "started", "flowstat runs"),
    AGENT: DataView("flowstat-agents", f"{es_store.AGENTS_INDEX}*", "time", "flowstat agents"),
    NODE_10S: DataView("flowstat-node-10s", f"{es_rollup.ROLLUP_INDEX}*", "time", "flowstat nodes per 10 s"),
    VERDICT: DataView("flowstat-verdicts", f"{es_store.FLOW_INDICES[VERDICT]}*", "time", "flowstat verdicts"),
    EDGE: DataView("flowstat-edges", f"{es_store.FLOW_INDICES[EDGE]}*", "time", "flowstat edge rates"),
}
KIBANA_VIEWS = (*VIEWS, RUN_VIEW_10S)  # the 10 s view is Kibana's only (panels.RUN_VIEW_10S says why)

AGENT_MAPPINGS = "component-flowstat-agent-mappings.json"

NUMERIC = ("long", "integer", "short", "byte", "double", "float", "half_float", "scaled_float")
LENS_TYPES = {"keyword": "string", "boolean": "boolean", "date": "date", **{t: "number" for t in NUMERIC}}


# -- fields -----------------------------------------------------------------------------------------


def flatten(props: dict, prefix: str = "") -> dict[str, str]:
    """An Elasticsearch mapping's properties as field path -> type (objects field by field)."""
    out = {}
    for name, p in props.items():
        if "properties" in p:
            out.update(flatten(p["properties"], f"{prefix}{name}."))
        else:
            out[prefix + name] = p["type"]
    return out


@cache
def fields(source: str) -> dict[str, str]:
    """Field path -> Elasticsearch type, from the index template behind the source's data view (for
    the flow series, the mapping their templates are made of: es_store.mapping of their schemas)."""
    if source in FLOW_SOURCES:
        return flatten(es_store.mapping(flow_schema.schema(source)["properties"]))
    templates = es_store.templates()
    name = {
        NODE: "component-flowstat-sample-mappings.json",
        RUN: "component-flowstat-run-mappings.json",
        AGENT: AGENT_MAPPINGS,
        NODE_10S: "component-flowstat-node-10s-mappings.json",
    }[source]
    return flatten(templates[name]["template"]["mappings"]["properties"])


def _run_paths() -> dict[str, list[str]]:
    """A run document leaf's name -> its paths (summary.objects_sent): the views name leaves."""
    out: dict[str, list[str]] = {}
    for leaf in run_schema.leaves():
        out.setdefault(leaf.path[-1], []).append(".".join(leaf.path))
    return out


def field_path(panel: Panel, name: str) -> str:
    """Where a panel's field is in its data view's documents; an unknown field names the panel."""
    if name == "$param":  # the parameter runs are compared by: the first one, Lens has no variables
        name = PARAMETERS[0]
    path = name
    if panel.source == RUN and name in _run_paths():
        paths = _run_paths()[name]
        if len(paths) > 1:
            raise ValueError(f"panel {panel.title!r}: field {name!r} is ambiguous in the run document: {paths}")
        path = paths[0]
    if panel.source == NODE_10S and f"mean_{name}" in fields(NODE_10S):  # a field's mean; the tags as they are
        path = f"mean_{name}"
    if path not in fields(panel.source):
        raise ValueError(
            f"panel {panel.title!r}: field {name!r} is not in the {DATA_VIEWS[panel.source].title} " f"index template"
        )
    return path


def _require(panel: Panel, path: str, types: tuple[str, ...], use: str) -> str:
    es_type = fields(panel.source)[path]
    if es_type not in types:
        raise ValueError(f"panel {panel.title!r}: {use} needs a {'/'.join(types)} field; {path} is {es_type}")
    return LENS_TYPES[es_type]


# -- columns ----------------------------------------------------------------------------------------


@dataclass
class _Layer:
    """One Lens layer being built: its columns (buckets first, as Lens orders them)."""

    id: str
    panel: Panel
    buckets: dict[str, dict] = field(default_factory=dict)
    metrics: dict[str, dict] = field(default_factory=dict)
    shown: list[str] = field(default_factory=list)  # the metric columns the chart draws (not their parts)

    # A column's id need only be unique in its layer (Kibana makes UUIDs): the key alone, not the
    # layer's id again in each of the many places a column is named (a tenth of the export's bytes)
    def bucket(self, key: str, column: dict) -> str:
        cid = key
        self.buckets[cid] = column
        return cid

    def metric(self, key: str, column: dict, shown: bool = True) -> str:
        cid = key
        self.metrics[cid] = column
        if shown:
            self.shown.append(cid)
        return cid

    def state(self) -> dict:
        columns = {**self.buckets, **self.metrics}
        return {
            "columns": columns,
            "columnOrder": list(columns),
            "incompleteColumns": {},
            "sampling": 1,
            "ignoreGlobalFilters": False,
        }


def _date_histogram(layer: _Layer) -> str:
    view = DATA_VIEWS[layer.panel.source]
    # The rollup panels sum over nodes per 10 s, as the InfluxDB rollup does, and the 10 s view's
    # points are 10 s means (a finer bucket would be empty every other time, and a counter's rate
    # between two buckets undefined); the others let Lens choose the interval from the time range.
    interval = "10s" if layer.panel.rollup or layer.panel.source == NODE_10S else "auto"
    return layer.bucket(
        "time",
        {
            "label": view.time_field,
            "dataType": "date",
            "operationType": "date_histogram",
            "sourceField": view.time_field,
            "isBucketed": True,
            "scale": "interval",
            "params": {"interval": interval, "includeEmptyRows": True, "dropPartials": False},
        },
    )


def _terms(layer: _Layer, key: str, paths: list[str]) -> str:
    """A split by one field's values, or by several fields' combinations (multi terms)."""
    data_type = [_require(layer.panel, path, ("keyword", *NUMERIC), "a split (terms)") for path in paths][0]
    params: dict[str, Any] = {
        "size": TERMS_SIZE.get(paths[0], 20),
        "orderDirection": "asc",
        "orderBy": {"type": "alphabetical", "fallback": False},
        "otherBucket": False,
        "missingBucket": False,
        "parentFormat": {"id": "multi_terms" if len(paths) > 1 else "terms"},
        "include": [],
        "exclude": [],
        "includeIsRegex": False,
        "excludeIsRegex": False,
    }
    if len(paths) > 1:
        params["secondaryFields"] = paths[1:]
    label = " › ".join(paths)
    return layer.bucket(
        key,
        {
            "label": label,
            "customLabel": True,
            "dataType": data_type,
            "operationType": "terms",
            "sourceField": paths[0],
            "isBucketed": True,
            "scale": "ordinal",
            "params": params,
        },
    )


def _unit(panel: Panel, m: Metric) -> str:
    unit = schema_unit(panel.source, m.field)
    if m.agg in ("rate", "increase") or m.minus or m.scale != 1.0 or not unit:
        return ""
    return f" ({unit})"


def _label(panel: Panel, m: Metric) -> str:
    name = m.label or (panel.title if m.scale != 1.0 or m.minus else m.field)
    suffix = {"rate": " per second", "increase": " per interval"}.get(m.agg, "")
    return f"{name}{suffix}{_unit(panel, m)}"


# The view's aggregation -> Lens's operation over one field ("rate" and "increase" reference a max).
SIMPLE = {"mean": "average", "max": "max", "last": "last_value"}


def _simple(layer: _Layer, op: str, path: str, label: str) -> dict:
    view = DATA_VIEWS[layer.panel.source]
    if op == "last_value":
        data_type = _require(layer.panel, path, (*NUMERIC, "keyword", "boolean", "date"), "a last value")
        return {
            "label": label,
            "customLabel": True,
            "dataType": data_type,
            "operationType": "last_value",
            "sourceField": path,
            "isBucketed": False,
            "scale": "ratio" if data_type == "number" else "ordinal",
            "filter": {"query": f'"{path}": *', "language": "kuery"},
            "params": {"sortField": view.time_field, "showArrayValues": False},
        }
    _require(layer.panel, path, NUMERIC, op)
    return {
        "label": label,
        "customLabel": True,
        "dataType": "number",
        "operationType": op,
        "sourceField": path,
        "isBucketed": False,
        "scale": "ratio",
        "params": {"emptyAsNull": True},
    }


def _flag_count(layer: _Layer, key: str, path: str, label: str) -> str:
    """A boolean flag over time: the samples per interval that had it set."""
    return layer.metric(
        key,
        {
            "label": label,
            "customLabel": True,
            "dataType": "number",
            "operationType": "count",
            "sourceField": COUNT_FIELD,
            "isBucketed": False,
            "scale": "ratio",
            "filter": {"query": f"{path} : true", "language": "kuery"},
            "params": {"emptyAsNull": True},
        },
    )


def _reference_based(layer: _Layer, key: str, op: str, path: str, label: str) -> str:
    """Lens's counter rate (per second) or differences (per interval) of the max per interval."""
    _require(layer.panel, path, NUMERIC, op)
    ref = layer.metric(
        f"{key}X0", {**_simple(layer, "max", path, f"Maximum of {path}"), "customLabel": False}, shown=False
    )
    column = {
        "label": label,
        "customLabel": True,
        "dataType": "number",
        "operationType": op,
        "isBucketed": False,
        "scale": "ratio",
        "references": [ref],
    }
    if op == "counter_rate":
        column["timeScale"] = "s"
    return layer.metric(key, column)


def _part(column: dict) -> dict:
    """A formula's part as Kibana stores it: empty buckets count as 0, not as missing."""
    if column["operationType"] in ("average", "max", "unique_count"):
        return {**column, "params": {"emptyAsNull": False}}
    return column


def _math(left: Any, op: str, right: Any, text: str) -> dict:
    return {
        "type": "function",
        "name": op,
        "args": [left, right],
        "location": {"min": 0, "max": len(text)},
        "text": text,
    }


def _formula(layer: _Layer, key: str, m: Metric, label: str) -> str:
    """Scaled or subtracted metrics: a Lens formula, stored as Kibana stores one (the formula, its
    parts as hidden columns, a math column over them)."""
    if m.agg not in SIMPLE:
        raise ValueError(f"panel {layer.panel.title!r}: {m.agg} of {m.field} cannot be scaled or subtracted in Lens")
    op = SIMPLE[m.agg]
    paths = [field_path(layer.panel, m.field)] + ([field_path(layer.panel, m.minus)] if m.minus else [])
    parts = [
        layer.metric(f"{key}X{i}", _part(_simple(layer, op, p, f"Part of {label}")), shown=False)
        for i, p in enumerate(paths)
    ]
    texts = [f"{op}({p})" for p in paths]
    text = texts[0]
    ast: str | dict[str, Any] = parts[0]  # a part's column id, or a math expression over parts
    if m.minus:
        text = f"{texts[0]} - {texts[1]}"
        ast = _math(parts[0], "subtract", parts[1], text)
    if m.scale != 1.0:
        text = f"({text}) * {m.scale!r}" if m.minus else f"{text} * {m.scale!r}"
        ast = _math(ast, "multiply", m.scale, text)
    return _formula_columns(layer, key, label, text, ast, parts)


def _formula_columns(layer: _Layer, key: str, label: str, text: str, ast: Any, parts: list[str]) -> str:
    """The formula column and the math column over its parts (the parts are already in the layer)."""
    math = layer.metric(
        f"{key}X{len(parts)}",
        {
            "label": f"Part of {label}",
            "customLabel": True,
            "dataType": "number",
            "operationType": "math",
            "isBucketed": False,
            "scale": "ratio",
            "params": {"tinymathAst": ast},
            "references": parts,
        },
        shown=False,
    )
    return layer.metric(
        key,
        {
            "label": label,
            "customLabel": True,
            "dataType": "number",
            "operationType": "formula",
            "isBucketed": False,
            "scale": "ratio",
            "params": {"formula": text, "isFormulaBroken": False},
            "references": [math],
        },
    )


def _metric(layer: _Layer, key: str, m: Metric) -> list[str]:
    """The columns one metric of the view becomes; their ids (what the chart draws)."""
    panel, label = layer.panel, _label(layer.panel, m)
    if m.scale != 1.0 or m.minus:
        return [_formula(layer, key, m, label)]
    path = field_path(panel, m.field)
    es_type = fields(panel.source)[path]
    if m.agg in ("rate", "increase"):
        return [_reference_based(layer, key, "counter_rate" if m.agg == "rate" else "differences", path, label)]
    if es_type == "boolean" and panel.kind != "table" and panel.kind != "stat":
        return [_flag_count(layer, key, path, label)]
    return [layer.metric(key, _simple(layer, SIMPLE[m.agg], path, label))]


# -- one Lens visualization per panel -----------------------------------------------------------------


def _kql(panel: Panel) -> str:
    return " and ".join(f'{k} : "{v}"' for k, v in panel.where)


def _keyword_metrics(panel: Panel) -> list[str]:
    """Keyword fields shown over time (a node's state): Lens counts the samples per value instead."""
    return [
        field_path(panel, m.field)
        for m in panel.metrics
        if m.agg == "last" and fields(panel.source).get(field_path(panel, m.field)) == "keyword"
    ]


def _xy(layer: _Layer, series: str) -> dict:
    panel = layer.panel
    states = _keyword_metrics(panel)
    groups = [field_path(panel, g) for g in panel.group] + states
    # The split first: Lens nests the aggregations in column order, the series' values outside.
    split = _terms(layer, "split", groups) if groups else None
    x = _date_histogram(layer)
    if states:
        layer.metric(
            "count",
            {
                "label": "samples",
                "customLabel": True,
                "dataType": "number",
                "operationType": "count",
                "sourceField": COUNT_FIELD,
                "isBucketed": False,
                "scale": "ratio",
                "params": {"emptyAsNull": True},
            },
        )
    for i, m in enumerate(panel.metrics):
        if panel.rollup:
            _node_sum(layer, f"m{i}", m)
        elif field_path(panel, m.field) not in states:
            _metric(layer, f"m{i}", m)
    return _xy_visualization(series, _data_layer(layer, series, x, split))


def _node_sum(layer: _Layer, key: str, m: Metric) -> str:
    """A sum over nodes per bucket, as the InfluxDB rollup (flowstat_total_10s) holds it: the mean
    per sample times the nodes seen, i.e. the sum of the nodes' means when each node is sampled as
    often as the others."""
    path, label = field_path(layer.panel, m.field), _label(layer.panel, m)
    parts = [
        layer.metric(f"{key}X0", _part(_simple(layer, "average", path, f"Part of {label}")), shown=False),
        layer.metric(
            f"{key}X1",
            _part(
                {
                    "label": f"Part of {label}",
                    "customLabel": True,
                    "dataType": "number",
                    "operationType": "unique_count",
                    "sourceField": "node_id",
                    "isBucketed": False,
                    "scale": "ratio",
                }
            ),
            shown=False,
        ),
    ]
    text = f"average({path}) * unique_count(node_id)"
    return _formula_columns(layer, key, label, text, _math(parts[0], "multiply", parts[1], text), parts)


def _data_layer(layer: _Layer, series: str, x: str, split: str | None) -> dict:
    out = {
        "layerId": layer.id,
        "layerType": "data",
        "seriesType": series,
        "xAccessor": x,
        "accessors": list(layer.shown),
        "position": "top",
        "showGridlines": False,
    }
    if split:
        out["splitAccessor"] = split
    return out


def _xy_visualization(series: str, data_layer: dict) -> dict:
    both = {"x": True, "yLeft": True, "yRight": True}
    return {
        "legend": {"isVisible": True, "position": "right"},
        "valueLabels": "hide",
        "fittingFunction": "None",
        "curveType": "LINEAR",
        "axisTitlesVisibilitySettings": both,
        "tickLabelsVisibilitySettings": both,
        "gridlinesVisibilitySettings": both,
        "labelsOrientation": {"x": 0, "yLeft": 0, "yRight": 0},
        "preferredSeriesType": series,
        "layers": [data_layer],
    }


def _table(layer: _Layer) -> dict:
    """A row per group (per run for the run document's panels); mean and standard deviation of a
    table's mean, the metric itself otherwise (another aggregation of a table; the stat panels Lens's
    metric cannot show)."""
    panel = layer.panel
    groups = [field_path(panel, g) for g in panel.group] or ["run_id"]
    rows = [_terms(layer, f"row{i}", [g]) for i, g in enumerate(groups)]
    for i, m in enumerate(panel.metrics):
        if panel.kind == "table" and m.agg == "mean":
            path = field_path(panel, m.field)
            layer.metric(f"m{i}mean", _simple(layer, "average", path, f"{m.field} mean{_unit(panel, m)}"))
            _require(panel, path, NUMERIC, "standard deviation")
            layer.metric(
                f"m{i}sd",
                {
                    "label": f"{m.field} sd{_unit(panel, m)}",
                    "customLabel": True,
                    "dataType": "number",
                    "operationType": "standard_deviation",
                    "sourceField": path,
                    "isBucketed": False,
                    "scale": "ratio",
                    "params": {"emptyAsNull": True},
                },
            )
        else:
            _metric(layer, f"m{i}", m)
    return {
        "layerId": layer.id,
        "layerType": "data",
        "columns": [{"columnId": c, "isTransposed": False} for c in rows + layer.shown],
    }


def _stat(layer: _Layer) -> dict:
    """The newest value in the time range (last value sorts by the time field): the run's figure
    when the time range or a run_id filter holds one run."""
    shown = [_metric(layer, f"m{i}", m)[0] for i, m in enumerate(layer.panel.metrics)]
    vis = {"layerId": layer.id, "layerType": "data", "metricAccessor": shown[0]}
    if len(shown) > 1:
        vis["secondaryMetricAccessor"] = shown[1]
    return vis


def _metric_fits(panel: Panel) -> bool:
    """Lens's metric shows a primary and a secondary number; more values, or flags, go in a table."""
    return len(panel.metrics) <= 2 and all(
        m.minus or m.scale != 1.0 or fields(panel.source)[field_path(panel, m.field)] in NUMERIC for m in panel.metrics
    )


def _bars(layer: _Layer) -> dict:
    """A metric against a field's values (the parameter runs differ in), one bar each."""
    panel = layer.panel
    x = _terms(layer, "x", [field_path(panel, g) for g in panel.group])
    for i, m in enumerate(panel.metrics):
        _metric(layer, f"m{i}", m)
    return _xy_visualization("bar", _data_layer(layer, "bar", x, None))


def lens_id(view: View, panel: Panel) -> str:
    slug = "".join(c if c.isalnum() else "-" for c in panel.title.lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return f"{view.uid}-{slug}"


def lens(view: View, panel: Panel) -> dict:
    """The Lens saved object of one panel."""
    oid = lens_id(view, panel)
    layer = _Layer("layer", panel)  # the one layer of its Lens: the id need only be unique in it
    if panel.kind in ("timeseries", "state-timeline"):
        vis_type, vis = "lnsXY", _xy(layer, "line" if panel.kind == "timeseries" else "bar_stacked")
    elif panel.kind == "stat" and _metric_fits(panel):
        vis_type, vis = "lnsMetric", _stat(layer)
    elif panel.kind in ("stat", "table"):
        vis_type, vis = "lnsDatatable", _table(layer)
    elif panel.kind == "bargauge":
        vis_type, vis = "lnsXY", _bars(layer)
    else:
        raise ValueError(f"panel {panel.title!r}: no Lens visualization for kind {panel.kind!r}")
    state = {
        "visualization": vis,
        "query": {"query": _kql(panel), "language": "kuery"},
        "filters": [],
        "datasourceStates": {"formBased": {"layers": {layer.id: layer.state()}}},
        "internalReferences": [],
        "adHocDataViews": {},
    }
    return _saved_object(
        "lens",
        oid,
        {"title": panel.title, "description": description(panel), "visualizationType": vis_type, "state": state},
        [{"type": "index-pattern", "id": DATA_VIEWS[panel.source].id, "name": LAYER_REFERENCE + layer.id}],
    )


# -- data views and dashboards -------------------------------------------------------------------------


def _saved_object(kind: str, oid: str, attributes: dict, references: list[dict]) -> dict:
    return {
        "type": kind,
        "id": oid,
        "attributes": attributes,
        "references": references,
        "coreMigrationVersion": CORE_MIGRATION_VERSION,
        "typeMigrationVersion": TYPE_MIGRATION_VERSIONS[kind],
    }


def data_view(view: DataView) -> dict:
    return _saved_object(
        "index-pattern",
        view.id,
        {
            "title": view.title,
            "name": view.name,
            "timeFieldName": view.time_field,
            "fields": "[]",
            "fieldFormatMap": "{}",
            "fieldAttrs": "{}",
            "runtimeFieldMap": "{}",
            "sourceFilters": "[]",
            "typeMeta": "{}",
            "allowNoIndex": True,
        },
        [],
    )


def _height(panel: Panel) -> int:
    return 8 if panel.kind == "stat" else 15


def dashboard(view: View) -> dict:
    """Panels in the view's order, rows one after another (Kibana has no row headers): a panel's
    width doubled onto Kibana's 48 columns."""
    panels: list[dict[str, Any]] = []
    references: list[dict[str, str]] = []
    y, x, height = 0, 0, 0
    for row in view.rows:
        for panel in row.panels:
            w = panel.width * GRID_COLUMNS // 24
            if x + w > GRID_COLUMNS:
                x, y, height = 0, y + height, 0
            index = str(len(panels) + 1)
            panels.append(
                {
                    "type": "lens",
                    "panelIndex": index,
                    "panelRefName": f"panel_{index}",
                    "gridData": {"x": x, "y": y, "w": w, "h": _height(panel), "i": index},
                    "embeddableConfig": {"enhancements": {}},
                }
            )
            # Named as Kibana names them on export: "<panelIndex>:panel_<panelIndex>".
            references.append({"type": "lens", "id": lens_id(view, panel), "name": f"{index}:panel_{index}"})
            x, height = x + w, max(height, _height(panel))
        x, y, height = 0, y + height, 0
    options = {
        "useMargins": True,
        "syncColors": False,
        "syncCursor": True,
        "syncTooltips": False,
        "hidePanelTitles": False,
    }
    search = {"query": {"query": "", "language": "kuery"}, "filter": []}
    return _saved_object(
        "dashboard",
        view.uid,
        {
            "title": view.title,
            "description": _description(view),
            "panelsJSON": _json(panels),
            "optionsJSON": _json(options),
            "timeRestore": True,
            "timeFrom": "now-1h",
            "timeTo": "now",
            "refreshInterval": {"pause": False, "value": 10000},
            "version": 1,
            "kibanaSavedObjectMeta": {"searchSourceJSON": _json(search)},
        },
        references,
    )


def _description(view: View) -> str:
    if not view.variables:
        return view.description
    return (
        f'{view.description} In Kibana the query bar picks them: e.g. run_id : "..." and '
        f'agent : "flowstat-agent-py" (the panels aggregate whatever the filters leave).'
    )


def saved_objects() -> list[dict]:
    """Every object, data views first: what the NDJSON file holds, in its order."""
    out = [data_view(v) for v in DATA_VIEWS.values()]
    out += [lens(view, panel) for view in KIBANA_VIEWS for panel in view.panels()]
    return out + [dashboard(view) for view in KIBANA_VIEWS]


def files() -> dict[str, str]:
    """dashboards/kibana/...: path -> content."""
    return {"flowstat.ndjson": "".join(_json(o, sort_keys=True) + "\n" for o in saved_objects())}


def _json(value: object, sort_keys: bool = False) -> str:
    """Compact, as Kibana's own export writes saved objects (JSON.stringify)."""
    return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"))
