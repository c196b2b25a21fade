"""The source of the "which alert conditions held and when" section, kept apart from the page:
flowstat.views.alerts.evaluate over the run file's samples (the nodes') and self-samples (the
agents'), read again as documents."""

from __future__ import annotations

from flowstat.schema import runfile
from flowstat.views.alerts import Span, evaluate as evaluate_samples

from .load import Run, run_file


def evaluate(run: Run) -> list[Span]:
    """Where each alert condition held over the run: its spans, in epoch seconds."""
    path = run_file(run.path)
    report = runfile.FileReport(str(path))
    nodes = [doc for doc, *_ in runfile.samples(path, report)]
    return evaluate_samples(nodes, report.agent_samples)
