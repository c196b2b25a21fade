"""Drawing the plots, in parallel: each share of the plots becomes a Bokeh document, serialised to
JSON, which the page embeds (Bokeh.embed.embed_items, as Bokeh's own standalone pages do), each
plot into its own element.

Bokeh builds and serialises its models in Python, tens of milliseconds a plot; a report holds tens
to hundreds of plots. They are independent, so one process per CPU draws a share of them: the
workers fork from this process once the runs are read, and inherit them (nothing is sent to them
but plot numbers). A document per share, not per plot: a document costs as much as a few plots.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bokeh.core.json_encoder import serialize_json
from bokeh.document import Document
from bokeh.model import Model
from bokeh.settings import settings

PARALLEL_FROM = 8  # plots from which drawing them in other processes pays for starting them

_jobs: list[Callable[[], Model]] = []  # what the forked workers draw: set just before they start


def target(index: int) -> str:
    """The id of the page element plot ``index`` is drawn into."""
    return f"plot-{index}"


@dataclass(frozen=True)
class Drawn:
    """A share of the plots: its document in JSON, and which root goes into which element."""

    doc_json: str
    roots: dict[str, str]  # root model id -> page element id


def _draw(indices: list[int]) -> Drawn:
    doc = Document()
    roots: dict[str, str] = {}  # a plot's id -> the element it is drawn in
    with doc.models.freeze():  # the models are collected once, not again for every plot added
        for i in indices:
            plot = _jobs[i]()
            doc.add_root(plot)
            roots[plot.id] = target(i)
    doc.validate()
    # JSON in a <script> element: "<" escaped, so that no "</script>" in a string ends it early
    return Drawn(serialize_json(doc.to_json(deferred=False)).replace("<", "\\u003c"), roots)


def draw(jobs: list[Callable[[], Model]]) -> list[Drawn]:
    """The jobs' plots, drawn in one share per CPU (or here, for a few)."""
    global _jobs
    workers = min(len(os.sched_getaffinity(0)), len(jobs)) if len(jobs) >= PARALLEL_FROM else 1
    shares = [list(range(k, len(jobs), workers)) for k in range(workers)]
    _jobs = jobs
    settings.simple_ids.set_value(False)  # ids unique across the workers' documents, not "p1001" in each
    try:
        if workers < 2:
            return [_draw(share) for share in shares]
        # fork: the workers start with the runs and Bokeh already in memory (the command runs no threads)
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_draw, shares))
    finally:
        _jobs = []
        settings.simple_ids.unset_value()
