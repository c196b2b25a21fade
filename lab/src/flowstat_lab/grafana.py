"""Grafana's expansion of an InfluxQL panel or rule query, done the way Grafana does it, so that the
generated queries can be run on the real InfluxDB without Grafana (tests and benchmarks do: Grafana
cannot run where flowstat is developed).

Sources (read for Grafana 11-13): the front end's template interpolation and `escapeRegex`
(@grafana/data), a multi-value variable's "All" (grafana/scenes MultiValueVariable.getValue and
CustomAllValue; TemplateSrv.replace before scenes), the InfluxDB back end's `Build`
(pkg/tsdb/influxdb/influxql/models/query.go), and grafana-plugin-sdk-go `backend/gtime`
(`roundInterval`, `FormatInterval`). Variable options from a query follow
`metricNamesToVariableValues` (public/app/features/variables/utils.ts). A panel's
whole request: ``panel_query`` (InfluxDB), ``elasticsearch_request`` (a terms-and-metric target on
Elasticsearch, as the Elasticsearch datasource builds it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from flowstat.views import grafana

REGEX_SPECIALS = set("\\^$*+?.()|[]{}/")
ALL = "$__all"  # a variable's value when "All" is selected (Grafana's ALL_VARIABLE_VALUE)
MS = 1
S = 1000 * MS
# gtime.roundInterval: (upper bound, rounded), in ms.
ROUND_TABLE = (
    (10, 1),
    (15, 10),
    (35, 20),
    (75, 50),
    (150, 100),
    (350, 200),
    (750, 500),
    (1500, 1 * S),
    (3500, 2 * S),
    (7500, 5 * S),
    (12500, 10 * S),
    (17500, 15 * S),
    (25000, 20 * S),
    (45000, 30 * S),
    (90000, 60 * S),
    (210000, 120 * S),
    (450000, 300 * S),
    (750000, 600 * S),
    (1050000, 900 * S),
    (1500000, 1200 * S),
    (2700000, 1800 * S),
    (5400000, 3600 * S),
    (9000000, 7200 * S),
)


def escape_regex(value: str) -> str:
    return "".join("\\" + c if c in REGEX_SPECIALS else c for c in value)


def round_interval(ms: float) -> int:
    for bound, rounded in ROUND_TABLE:
        if ms <= bound:
            return rounded
    raise ValueError(f"interval {ms} ms: beyond this emulator's table")


def format_interval(ms: int) -> str:
    for unit, size in (("y", 365 * 86400 * S), ("d", 86400 * S), ("h", 3600 * S), ("m", 60 * S), ("s", S), ("ms", MS)):
        if ms >= size:
            return f"{ms // size}{unit}"
    return "1ms"


def interval_ms(from_ms: int, to_ms: int, max_data_points: int, min_interval_ms: int) -> int:
    """$__interval: the range over the points the panel can show, rounded, never under the minimum."""
    return max(round_interval((to_ms - from_ms) / max_data_points), min_interval_ms)


def _is_number(value: str) -> bool:
    try:
        float(value)
        return True
    except ValueError:
        return False


def interpolate(
    query: str, variables: dict[str, list[str]], multi: set[str], all_values: dict[str, str] | None = None
) -> str:
    """The front end: each $name or ${name} replaced by its value(s). A multi-value variable is
    regex-formatted (one value escaped, several as (a|b) each escaped); a single-value one is
    inserted raw, except in a regex literal after =~ or !~, where it is escaped; numbers raw.

    "All" (the value [ALL]) is the variable's custom all value (``all_values``, its allValue)
    inserted as it is, never escaped or formatted; a variable without one has no "All" here: Grafana
    then formats every option's value, which the caller passes as the values."""
    all_values = all_values or {}

    def value_for(name: str, in_regex: bool) -> str:
        values = variables[name]
        if values == [ALL]:
            if name not in all_values:
                raise ValueError(f"${name}: All without a custom all value (pass every option's value instead)")
            if "$" in all_values[name]:
                raise ValueError(f"${name}: a custom all value holding variables is beyond this emulator")
            return all_values[name]
        if name in multi:
            escaped = [v if _is_number(v) else escape_regex(v) for v in values]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        (value,) = values
        return escape_regex(value) if in_regex and not _is_number(value) else value

    def replace(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables:
            return m.group(0)  # $timeFilter, $__interval...: the back end's
        before = query[: m.start()]
        in_regex = bool(re.search(r"[=!]~\s*/[^/]*$", before))
        return value_for(name, in_regex)

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, query)


def view_interpolate(view, query: str, variables: dict[str, list[str]]) -> str:
    """``interpolate`` with the view's own variables' definitions: which are multi-value, and their
    custom all values."""
    defined = {v: grafana._variable(v) for v in view.variables}
    multi = {v for v, d in defined.items() if d.get("multi")}
    all_values = {v: d["allValue"] for v, d in defined.items() if d.get("includeAll") and d.get("allValue")}
    return interpolate(query, variables, multi, all_values)


def expand(query: str, from_ms: int, to_ms: int, interval: int) -> str:
    """The back end, plain replacement in Grafana's order."""
    text = format_interval(interval)
    return (
        query.replace("$timeFilter", f"time >= {from_ms}ms and time <= {to_ms}ms")
        .replace("$interval", text)
        .replace("$__interval_ms", str(interval))
        .replace("$__interval", text)
    )


def variable_options(values: list[str], regex: str | None) -> list[tuple[str, str]]:
    """(text, value) of each row's value, through the variable's regex (named groups text and value),
    duplicates by value dropped, order kept (sort 0)."""
    pattern = None
    if regex:
        body = regex[1 : regex.rindex("/")]
        pattern = re.compile(body.replace("(?<", "(?P<"))
    out, seen = [], set()
    for v in values:
        text = value = v
        if pattern:
            m = pattern.search(v)
            if not m:
                continue
            groups = m.groupdict()
            if groups.get("value") or groups.get("text"):
                value = groups.get("value") or groups["text"]
                text = groups.get("text") or groups["value"]
            elif m.groups():
                text = value = m.group(1)
        if value not in seen:
            seen.add(value)
            out.append((text, value))
    return out


def duration_ms(text: str) -> int:
    """A Grafana duration such as "1s" or "10s" (a panel's min interval, a datasource's timeInterval)."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        raise ValueError(f"duration {text!r}: beyond this emulator")
    return int(m.group(1)) * {"ms": MS, "s": S, "m": 60 * S, "h": 3600 * S}[m.group(2)]


def _datasource(uid: str) -> dict:
    return next(d for d in grafana.datasources()["datasources"] if d["uid"] == uid)


def panel_query(
    view, panel, variables: dict[str, list[str]], from_ms: int, to_ms: int, max_data_points: int
) -> tuple[str, int]:
    """A generated panel's InfluxQL as Grafana sends it for the time range, and its $__interval in
    ms: the view's multi-value variables regex-formatted, the others raw, "All" ([ALL]) as the
    variable's custom all value; $__interval from the
    panel's max data points (its width in pixels), never under the panel's own min interval or,
    without one, the datasource's timeInterval."""
    built = grafana._panel(view, panel, 1, 0, 0)
    (target,) = built["targets"]
    floor = built.get("interval") or _datasource(target["datasource"]["uid"])["jsonData"]["timeInterval"]
    interval = interval_ms(from_ms, to_ms, max_data_points, duration_ms(floor))
    return expand(view_interpolate(view, target["query"], variables), from_ms, to_ms, interval), interval


def elasticsearch_request(target: dict, variables: dict[str, list[str]], from_ms: int, to_ms: int) -> tuple[str, dict]:
    """The Elasticsearch datasource's search for a target of terms buckets and one metric: (its
    datasource's index pattern, the body). The time range and the Lucene query (a variable's values
    as ("a" OR "b")) filter; the terms (size "0": 500) hold the metric per bucket."""

    def fill(text: str, lucene: bool) -> str:
        def one(m: re.Match) -> str:
            values = variables.get(m.group(1) or m.group(2))
            if values is None:
                return m.group(0)
            if lucene:
                return "(" + " OR ".join(f'"{v}"' for v in values) + ")"
            (value,) = values
            return value

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)

    (terms,) = target["bucketAggs"]
    (metric,) = target["metrics"]
    settings = terms["settings"]
    size = int(settings["size"]) or 500
    order = {"_key" if settings["orderBy"] == "_term" else settings["orderBy"]: settings["order"]}
    body = {
        "size": 0,
        "query": {
            "bool": {
                "filter": [
                    {"range": {target["timeField"]: {"gte": from_ms, "lte": to_ms, "format": "epoch_millis"}}},
                    {"query_string": {"query": fill(target["query"], True), "analyze_wildcard": True}},
                ]
            }
        },
        "aggs": {
            terms["id"]: {
                "terms": {
                    "field": fill(terms["field"], False),
                    "min_doc_count": int(settings["min_doc_count"]),
                    "order": order,
                    "size": size,
                },
                "aggs": {metric["id"]: {metric["type"]: {"field": metric["field"]}}},
            }
        },
    }
    return _datasource(target["datasource"]["uid"])["jsonData"]["index"], body


# -- alert rules --------------------------------------------------------------------------------

Labels = tuple  # a series' label set: its tags as sorted (name, value) pairs


def labels(tags: dict) -> Labels:
    return tuple(sorted(tags.items()))


def _reduce(model: dict, values: list) -> float | None:
    """A reduce expression over one series' values (None: no value, the label set drops out)."""
    if model["reducer"] != "last" or model.get("settings", {}).get("mode") != "dropNN":
        raise ValueError(f"reduce {model['reducer']} mode {model.get('settings')}: beyond this emulator")
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)]
    return float(numbers[-1]) if numbers else None


_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|\$\{?(\w+)\}?|(&&|\|\||[<>=!]=|[-+*/%<>!()]))")
# Go's binary precedence, as mathexp's parser takes it
_PRECEDENCE = {
    "||": 1,
    "&&": 2,
    "==": 3,
    "!=": 3,
    "<": 3,
    "<=": 3,
    ">": 3,
    ">=": 3,
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
}
_APPLY = {
    "||": lambda a, b: float(bool(a) or bool(b)),
    "&&": lambda a, b: float(bool(a) and bool(b)),
    "==": lambda a, b: float(a == b),
    "!=": lambda a, b: float(a != b),
    "<": lambda a, b: float(a < b),
    "<=": lambda a, b: float(a <= b),
    ">": lambda a, b: float(a > b),
    ">=": lambda a, b: float(a >= b),
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else math.nan,
    "%": lambda a, b: math.fmod(a, b) if b else math.nan,
}


def _tokens(expression: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while expression[at:].strip():
        m = _TOKEN.match(expression, at)
        if not m:
            raise ValueError(f"math expression {expression!r}: cannot read {expression[at:]!r}")
        number, ref, op = m.groups()
        out.append(("number", number) if number else ("ref", ref) if ref else ("op", op))
        at = m.end()
    return out


def math_expression(expression: str, values: dict[str, float]) -> float:
    """A math expression over numbers: $REF is the number of the expression REF (one label set)."""
    tokens = _tokens(expression)
    pos = 0

    def unary() -> float:
        nonlocal pos
        kind, text = tokens[pos]
        pos += 1
        if kind == "number":
            return float(text)
        if kind == "ref":
            return values[text]
        if text == "(":
            v = binary(0)
            if tokens[pos] != ("op", ")"):
                raise ValueError(f"math expression {expression!r}: ) expected")
            pos += 1
            return v
        if text == "!":
            return float(not unary())
        if text == "-":
            return -unary()
        raise ValueError(f"math expression {expression!r}: unexpected {text!r}")

    def binary(floor: int) -> float:
        nonlocal pos
        left = unary()
        while pos < len(tokens) and tokens[pos][0] == "op" and _PRECEDENCE.get(tokens[pos][1], 0) > floor:
            op = tokens[pos][1]
            pos += 1
            left = _APPLY[op](left, binary(_PRECEDENCE[op]))
        return left

    result = binary(0)
    if pos != len(tokens):
        raise ValueError(f"math expression {expression!r}: left over {tokens[pos:]}")
    return result


def _threshold(model: dict, value: float) -> float:
    (condition,) = model["conditions"]
    kind, params = condition["evaluator"]["type"], condition["evaluator"]["params"]
    if kind == "gt":
        return float(value > params[0])
    if kind == "lt":
        return float(value < params[0])
    raise ValueError(f"threshold {kind}: beyond this emulator")


def unions(inputs: dict[str, dict[Labels, float]]) -> dict[Labels, dict[str, float]]:
    """Which numbers of a math expression's inputs go together, as Grafana's union pairs them
    (pkg/expr/mathexp/exp.go): labels equal, or one set contains the other (the result takes the
    larger; empty labels go with any). A label set an input has no match for drops out."""
    out: dict[Labels, dict[str, float]] = {}
    for candidate in {k for series in inputs.values() for k in series}:
        picked = {}
        for name, series in inputs.items():
            within = [k for k in series if set(k) <= set(candidate)]
            if len(within) != 1:
                break
            picked[name] = series[within[0]]
        else:
            out[candidate] = picked
    return {k: v for k, v in out.items() if not any(set(k) < set(other) for other in out)}


def rule_values(rule: dict, results: dict[str, dict[Labels, list]]) -> dict[str, dict[Labels, float]]:
    """Every expression of an alert rule (its provisioned form), given what each of its queries
    returned (refId -> label set -> the series' values in time order): refId -> label set -> number.
    Series are matched by their label sets (``unions``: equal, or one containing the other, as a
    quantity per run goes with each of the run's groups); a label set that an expression's input
    lacks drops out of it, as Grafana's math drops an unmatched series."""
    data = {d["refId"]: d for d in rule["data"]}
    out: dict[str, dict[Labels, float]] = {}

    def value(ref: str) -> dict[Labels, float]:
        if ref in out:
            return out[ref]
        if data[ref]["datasourceUid"] != "__expr__":
            raise ValueError(f"{rule['uid']}: query {ref} used without a reduce")
        model = data[ref]["model"]
        if model["type"] == "reduce":
            reduced = {k: _reduce(model, v) for k, v in results.get(model["expression"], {}).items()}
            got = {k: v for k, v in reduced.items() if v is not None}
        elif model["type"] == "math":
            refs = {name for kind, name in _tokens(model["expression"]) if kind == "ref"}
            got = {k: math_expression(model["expression"], v) for k, v in unions({n: value(n) for n in refs}).items()}
        elif model["type"] == "threshold":
            got = {k: _threshold(model, v) for k, v in value(model["expression"]).items()}
        else:
            raise ValueError(f"expression type {model['type']}: beyond this emulator")
        out[ref] = got
        return got

    for ref, d in data.items():
        if d["datasourceUid"] == "__expr__":
            value(ref)
    return out


def firing(rule: dict, values: dict[str, dict[Labels, float]]) -> dict[Labels, bool]:
    """Per label set, whether the rule's condition is true at this evaluation (non-zero)."""
    return {k: v != 0 and not math.isnan(v) for k, v in values[rule["condition"]].items()}


def alerting(rule: dict, ends_ms: Sequence[int], held: Sequence[bool]) -> list[bool]:
    """At each evaluation (every interval, at ends_ms), whether a label set is Alerting: its condition
    true now and at every evaluation since one at least the rule's ``for`` before (the state
    manager's Pending -> Alerting). An evaluation without the label set counts as false."""
    for_ms = duration_ms(rule["for"])
    out, since = [], None
    for end, now in zip(ends_ms, held, strict=False):
        since = (since if since is not None else end) if now else None
        out.append(since is not None and end - since >= for_ms)
    return out


# -- the Prometheus data source ---------------------------------------------------------------------
# Read for Grafana 11-13: @grafana/prometheus's datasource (interpolateQueryExpr,
# prometheusRegularEscape, prometheusSpecialRegexEscape), its query's step (the interval, never under
# the data source's timeInterval, start and end aligned to it) and $__rate_interval
# (max($__interval + scrape interval, 4 x scrape interval)); a label_values(selector, label) variable
# is the label's values of the selector's series over the time range (/api/v1/label/LABEL/values).


def prometheus_escape(value: str) -> str:
    """A single-value variable without All: backslashes and single quotes escaped, nothing else."""
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def prometheus_regex_escape(value: str) -> str:
    """A value of a multi-value variable (or one with All): regex specials escaped, for a PromQL string."""
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def prometheus_interpolate(view, query: str, variables: dict[str, list[str]]) -> str:
    """The front end's replacement of the view's variables in a PromQL expression (or a
    label_values query), as the Prometheus data source formats them; built-ins ($__interval...)
    left for ``prometheus_expand``."""
    defined = {v: grafana._prometheus_variable(v) for v in view.variables}

    def replace(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables or name not in defined:
            return m.group(0)
        d, values = defined[name], variables[name]
        if values == [ALL]:
            if not d.get("allValue"):
                raise ValueError(f"${name}: All without a custom all value (pass every option's value instead)")
            return d["allValue"]
        if not d.get("multi") and not d.get("includeAll"):
            (value,) = values
            return prometheus_escape(value)
        escaped = [prometheus_regex_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, query)


def prometheus_expand(expr: str, interval: int, scrape_ms: int) -> str:
    """The built-ins: $__interval, $__interval_ms and $__rate_interval (whole names only)."""
    rate = max(interval + scrape_ms, 4 * scrape_ms)
    values = {
        "__interval": format_interval(interval),
        "__interval_ms": str(interval),
        "__rate_interval": format_interval(rate),
    }
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), expr)


def prometheus_panel_queries(
    view,
    panel: dict,
    variables: dict[str, list[str]],
    from_ms: int,
    to_ms: int,
    max_data_points: int,
    scrape_interval_ms: int | None = None,
) -> list[tuple[str, dict]]:
    """A generated Prometheus dashboard panel's range queries as Grafana sends them: (refId, the
    /api/v1/query_range parameters). ``scrape_interval_ms``: the data source's timeInterval (the
    provisioned one unless given)."""
    scrape = scrape_interval_ms or duration_ms(_datasource(grafana.PROMETHEUS["uid"])["jsonData"]["timeInterval"])
    interval = interval_ms(from_ms, to_ms, max_data_points, scrape)
    step_s = interval / 1000
    start = math.floor(from_ms / interval) * interval / 1000
    end = math.ceil(to_ms / interval) * interval / 1000
    out = []
    for target in panel["targets"]:
        expr = prometheus_expand(prometheus_interpolate(view, target["expr"], variables), interval, scrape)
        out.append(
            (target["refId"], {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"})
        )
    return out


def label_values(query: str) -> tuple[str | None, str]:
    """label_values(SELECTOR, LABEL) or label_values(LABEL): (the selector or None, the label)."""
    m = re.fullmatch(r"\s*label_values\((?:(.*),)?\s*(\w+)\s*\)\s*", query)
    if not m:
        raise ValueError(f"{query!r}: not a label_values query")
    return (m.group(1).strip() if m.group(1) else None), m.group(2)
