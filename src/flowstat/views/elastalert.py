"""ElastAlert2 rules for the six alert conditions (flowstat.views.alerts), against the
Elasticsearch indices. A rule names no alerter: the compose stack's config.yaml gives every rule
its default, an HTTP POST to flowstat's alert inbox (the `alerts` service, docs/alerts.md), with the
rule's name and flowstat id (``http_post2_payload``) beside the matching document's fields;
flowstat stack adds its alert log and webhook.

ElastAlert2's rule types cannot take "last minus first" or a slope, so two conditions are
expressed with its nearest types (docs/dashboards.md says how they differ from Grafana's):
falling behind is the window's highest input-latency p99 over the threshold, and memory growth is
a rise of the highest VmRSS between two consecutive windows (spike_aggregation). A frequency rule
counts a key's documents only, not the others': held back is a full window of verdicts naming the
same nodes (at flowstat verdict's interval) within less than the window.
"""

from __future__ import annotations

import yaml

from flowstat.stores import elasticsearch as es_store

from .alerts import ALERTS, VERDICT_EVERY_S, AlertRule
from .panels import AGENT, VERDICT

TIME_FIELD = "time"
# Memory growth (spike_aggregation): the later half window's highest VmRSS at least this many times
# the earlier one's, each from queries of at least SPIKE_MIN_DOCS samples of the node.
SPIKE_HEIGHT = 1.05
SPIKE_MIN_DOCS = 3


def _span(seconds: int) -> dict:
    return {"seconds": seconds}


def _flag_filter(alert: AlertRule) -> list[dict]:
    q = alert.quantities[0]
    terms = [{"term": {k: v}} for k, v in q.where]
    if q.any_of:
        terms.append({"bool": {"should": [{"term": {k: v}} for k, v in q.any_of], "minimum_should_match": 1}})
    return [{"bool": {"filter": terms}}] if terms else []


def rule(alert: AlertRule) -> dict:
    indices = {AGENT: es_store.AGENTS_INDEX, VERDICT: es_store.FLOW_INDICES[VERDICT]}
    index = indices.get(alert.source, es_store.SAMPLES_INDEX)
    base = {
        "name": alert.title,
        "description": alert.why,
        "index": f"{index}*",
        "timestamp_field": TIME_FIELD,
        "query_key": list(alert.group),
        "realert": {"minutes": 1},
        "alert_subject": f"flowstat: {alert.title}",
        "alert_text_type": "alert_text_only",
        **dict(zip(("alert_text", "alert_text_args"), _text(alert), strict=False)),
        "http_post2_payload": {"rule": alert.title, "alert": alert.uid},
    }
    body = _rule_type(alert, base)
    if body["type"] == "spike_aggregation":
        # An aggregation's match holds its query key as one field, "run_id,node_id,agent" = "r,n,a",
        # not each label: the text names that field (the inbox splits it).
        compound = ",".join(alert.group)
        body["alert_text"] = f"{{0}} ({compound}): {alert.summary.split(': ', 1)[-1]}"
        body["alert_text_args"] = [compound]
    return body


def _rule_type(alert: AlertRule, base: dict) -> dict:
    kinds = [q.kind for q in alert.quantities]
    if alert.source == VERDICT:
        # The verdicts naming the group's nodes: as many as a window holds at flowstat verdict's interval
        # (12 at 5 s), within less than the window (ElastAlert's frequency window is shorter than its
        # timeframe). A verdict of another kind between them leaves one fewer: the run's other verdicts,
        # which Grafana's rule counts (B), are seen that way only.
        (named,) = [q for q in alert.quantities if not q.per]
        return {
            **base,
            "type": "frequency",
            "num_events": alert.window_s // VERDICT_EVERY_S,
            "timeframe": _span(alert.window_s),
            "filter": [{"range": {k: {"gte": v}}} for k, v in named.at_least],
        }
    if kinds == ["count"]:
        return {
            **base,
            "type": "frequency",
            "num_events": 1,
            "timeframe": _span(alert.window_s),
            "filter": _flag_filter(alert),
        }
    if alert.uid == "flowstat-merger-behind":
        latency = next(a for conj in alert.condition for a in conj if a.ref == "A")
        return {
            **base,
            "type": "metric_aggregation",
            "metric_agg_key": "input_latency_p99_ms",
            "metric_agg_type": "max",
            "max_threshold": latency.threshold,
            "buffer_time": _span(alert.window_s),
            "bucket_interval": _span(alert.window_s),
            "sync_bucket_interval": True,
            "filter": [{"term": {"role": "merger"}}],
        }
    if kinds == ["slope_per_min", "slope_buckets"]:
        # Two windows of half the alert's, the later one's highest value 5% above the earlier one's.
        # Each query takes the last run_every, in a test as live (not the configuration's
        # buffer_time, which a test stretches over its whole range). max, not avg: ElastAlert 2.19
        # fails on a window holding only its placeholders (a node that stopped) when it averages.
        half = alert.window_s // 2
        return {
            **base,
            "type": "spike_aggregation",
            "metric_agg_key": alert.quantities[0].field,
            "metric_agg_type": "max",
            "timeframe": _span(half),
            "spike_type": "up",
            "spike_height": SPIKE_HEIGHT,
            "threshold_cur": 1,
            "min_doc_count": SPIKE_MIN_DOCS,
            "use_run_every_query_size": True,
            "filter": [],
        }
    if alert.source == "agent":
        # Spooled samples never below zero over the whole window: the spool held something all along.
        return {
            **base,
            "type": "metric_aggregation",
            "metric_agg_key": "spooled_samples",
            "metric_agg_type": "min",
            "max_threshold": 0,
            "buffer_time": _span(alert.window_s),
            "bucket_interval": _span(alert.window_s),
            "sync_bucket_interval": True,
            "filter": [],
        }
    raise ValueError(f"{alert.uid}: no ElastAlert2 rule type for quantities {kinds}")


def _text(alert: AlertRule) -> tuple[str, list[str]]:
    """The summary with each {{ $labels.X }} turned into ElastAlert's {N} and its argument X."""
    text = alert.summary
    args: list[str] = []
    while "{{ $labels." in text:
        head, rest = text.split("{{ $labels.", 1)
        name, tail = rest.split(" }}", 1)
        text = f"{head}{{{len(args)}}}{tail}"
        args.append(name)
    return text, args


def rules() -> dict[str, str]:
    """File name -> rule YAML, one per alert."""
    out = {}
    for alert in ALERTS:
        body = rule(alert)
        out[f"{alert.uid}.yaml"] = (
            f"# Generated by `make generate` (python -m flowstat.generate) from src/flowstat/views, "
            f"do not edit: "
            f"{alert.title}.\n" + yaml.safe_dump(body, sort_keys=False, width=120)
        )
    return out
