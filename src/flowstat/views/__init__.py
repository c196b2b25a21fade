"""What people look at, defined once: the views (panels: metric, unit, aggregation, grouping) and
the alert conditions. Generated from them: Grafana's dashboards, provisioning and alert rules
(``grafana``), Kibana's saved objects (``kibana``), ElastAlert2's rules (``elastalert``); the
report and the tests apply the alert conditions to run files (``alerts.evaluate``)."""

from .alerts import ALERTS, AlertRule, Span, evaluate
from .panels import VIEWS, Metric, Panel, Row, View

__all__ = ["ALERTS", "VIEWS", "AlertRule", "Metric", "Panel", "Row", "Span", "View", "evaluate"]
