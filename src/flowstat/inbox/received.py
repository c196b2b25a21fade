"""Alerts as the inbox keeps them: one shape for what Grafana's webhook contact point and
ElastAlert2's HTTP POST alerter send, with the run, the node and a link to the run's dashboard.

Grafana posts its notification payload ({"alerts": [{"status", "labels", "annotations",
"startsAt", ...}], ...}): the labels hold the rule's query's tags (run_id, node_id, agent) and
the rule's own (alert: its uid). ElastAlert2 posts one JSON object per match: the matching
document's fields, and those its rule adds (rule, alert: see views.elastalert).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from flowstat.timeutil import iso_utc_ms
from flowstat.views import ALERTS
from flowstat.views.panels import RUN_VIEW

TITLES = {a.uid: a.title for a in ALERTS}
LINK_MARGIN = timedelta(minutes=15)  # the dashboard link shows this much either side of the alert


class BadAlert(ValueError):
    """A payload that is neither Grafana's nor ElastAlert2's: the message says what is missing."""


@dataclass(frozen=True)
class ReceivedAlert:
    received: str  # when the inbox took it (ISO-8601 UTC)
    source: str  # grafana or elastalert
    rule: str  # the rule's title, as people read it
    uid: str  # flowstat's id of the rule (views.alerts), "" for a rule that is not flowstat's
    status: str  # firing or resolved
    run_id: str
    node_id: str
    agent: str
    host: str
    at: str  # when the condition held (Grafana: startsAt; ElastAlert: the matching sample's time)
    summary: str
    dashboard: str  # the run view at that run, node and time

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def line(self) -> str:
        """One line for a person (a log, a terminal)."""
        where = " ".join(
            f"{k}={v}"
            for k, v in (("run_id", self.run_id), ("node_id", self.node_id), ("host", self.host), ("agent", self.agent))
            if v
        )
        state = "" if self.status == "firing" else f" [{self.status}]"
        return f"{self.received}  {self.rule}{state}: {where} ({self.source}, at {self.at}) {self.dashboard}"


def dashboard_link(grafana_url: str, run_id: str, node_id: str, at: str) -> str:
    """The run view of ``run_id`` around ``at``, its node selected; "" without a run."""
    if not run_id:
        return ""
    params: list[tuple[str, Any]] = [("var-run", run_id)]
    if node_id:
        params.append(("var-node", node_id))
    try:
        t = datetime.fromisoformat(at)
        params += [
            ("from", int((t - LINK_MARGIN).timestamp() * 1000)),
            ("to", int((t + LINK_MARGIN).timestamp() * 1000)),
        ]
    except (TypeError, ValueError):
        pass  # no time: Grafana's default range
    return f"{grafana_url.rstrip('/')}/d/{RUN_VIEW.uid}/?{urlencode(params)}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def from_grafana(payload: dict, grafana_url: str) -> list[ReceivedAlert]:
    alerts = payload.get("alerts")
    if not isinstance(alerts, list):
        raise BadAlert("a Grafana notification holds a list `alerts`")
    now = iso_utc_ms()
    out = []
    for item in alerts:
        if not isinstance(item, dict):
            raise BadAlert("each of a Grafana notification's `alerts` is an object")
        labels: dict[str, Any] = item["labels"] if isinstance(item.get("labels"), dict) else {}
        notes: dict[str, Any] = item["annotations"] if isinstance(item.get("annotations"), dict) else {}
        uid = _text(labels.get("alert"))
        run_id, node_id, at = _text(labels.get("run_id")), _text(labels.get("node_id")), _text(item.get("startsAt"))
        out.append(
            ReceivedAlert(
                now,
                "grafana",
                TITLES.get(uid) or _text(labels.get("alertname")) or "Grafana alert",
                uid,
                _text(item.get("status")) or "firing",
                run_id,
                node_id,
                _text(labels.get("agent")),
                _text(labels.get("host")),
                at,
                _text(notes.get("summary")),
                dashboard_link(grafana_url, run_id, node_id, at),
            )
        )
    return out


def _compound_key(payload: dict) -> dict:
    """The labels of an aggregation rule's match, which holds its query key as one field
    ("run_id,node_id,agent": "r,n,a"); {} when there is none."""
    for key, value in payload.items():
        if "," in key and isinstance(value, str):
            names = key.split(",")
            values = value.split(",", len(names) - 1)
            if len(values) == len(names):
                return dict(zip(names, values, strict=True))
    return {}


def from_elastalert(payload: dict, grafana_url: str) -> list[ReceivedAlert]:
    if not isinstance(payload.get("rule"), str):
        raise BadAlert("an ElastAlert2 alert holds its rule's name in `rule` (see dashboards/elastalert/config.yaml)")
    uid = _text(payload.get("alert"))
    payload = {**_compound_key(payload), **payload}
    run_id, node_id, at = _text(payload.get("run_id")), _text(payload.get("node_id")), _text(payload.get("time"))
    summary = f"{payload['rule']}: {node_id or payload.get('agent') or 'a node'} of run {run_id or '?'}"
    return [
        ReceivedAlert(
            iso_utc_ms(),
            "elastalert",
            TITLES.get(uid) or payload["rule"],
            uid,
            "firing",
            run_id,
            node_id,
            _text(payload.get("agent")),
            _text(payload.get("host")),
            at,
            summary,
            dashboard_link(grafana_url, run_id, node_id, at),
        )
    ]


SOURCES = {"grafana": from_grafana, "elastalert": from_elastalert}


def parse(source: str, payload: Any, grafana_url: str) -> list[ReceivedAlert]:
    """The alerts a POST from ``source`` holds; BadAlert says what is wrong with it."""
    if not isinstance(payload, dict):
        raise BadAlert("expected a JSON object")
    if source not in SOURCES:
        raise BadAlert(f"unknown source {source!r} (POST to /{' or /'.join(SOURCES)})")
    return SOURCES[source](payload, grafana_url)
