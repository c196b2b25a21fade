"""The source of the "which alert conditions held and when" section, kept apart from the page.

The spans come from ``flowstat.views.alerts.evaluate(node_samples, agent_samples) -> list[Span]``
(each with ``.alert.title``, ``.alert.uid``, ``.labels``, ``.start`` and ``.end`` in epoch seconds),
written beside this report. Until that module exists, ``evaluate`` returns None and the section
says the alerts could not be evaluated: no span is ever made up here. It is imported by name
(importlib) so that this package works before it lands; once it has, a plain import is the
better form (lint-imports then checks its layer).
"""

from __future__ import annotations

import importlib
from typing import Any

from flowstat.schema import runfile

from .load import Run, run_file

MODULE = "flowstat.views.alerts"


def _module():
    try:
        return importlib.import_module(MODULE)
    except ModuleNotFoundError as exc:
        if exc.name in ("flowstat.views", MODULE):
            return None
        raise


def available() -> bool:
    return _module() is not None


def evaluate(run: Run) -> list[Any] | None:
    """The alert spans of a run, or None when alerts cannot be evaluated by this flowstat. The run
    file is read again, as documents: the agents' own samples (the nodes the run document's
    affinity lists with role agent) apart from the pipeline's."""
    alerts = _module()
    if alerts is None:
        return None
    agents = {a.get("node_id") for a in run.doc.get("affinity") or [] if a.get("role") == "agent"}
    nodes, own = [], []
    path = run_file(run.path)
    for doc, *_ in runfile.samples(path, runfile.FileReport(str(path))):
        (own if doc["node_id"] in agents else nodes).append(doc)
    return alerts.evaluate(nodes, own)
