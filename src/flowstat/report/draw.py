"""Drawing the plots, in parallel: each plot becomes a Bokeh item (bokeh.embed.json_item: one small
document of its own, serialised to JSON) that the page embeds.

Bokeh builds and serialises its models in Python, some milliseconds a plot; a report holds tens to
hundreds of plots. They are independent, so one process per CPU draws a share of them: the workers
fork from this process once the runs are read, and inherit them (nothing is sent to them but plot
numbers).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

from bokeh.core.json_encoder import serialize_json
from bokeh.embed import json_item
from bokeh.model import Model
from bokeh.settings import settings

PARALLEL_FROM = 8  # plots from which drawing them in other processes pays for starting them

_jobs: list[Callable[[], Model]] = []  # what the forked workers draw: set just before they start


def target(index: int) -> str:
    """The id of the page element plot ``index`` is drawn into."""
    return f"plot-{index}"


def _draw(indices: list[int]) -> list[tuple[int, str]]:
    # JSON in a <script> element: "<" escaped, so that no "</script>" in a string ends it early
    return [(i, serialize_json(json_item(_jobs[i](), target(i))).replace("<", "\\u003c")) for i in indices]


def draw(jobs: list[Callable[[], Model]]) -> list[str]:
    """Each job's plot as a Bokeh item in JSON, in the jobs' order."""
    global _jobs
    workers = min(len(os.sched_getaffinity(0)), len(jobs))
    shares = [list(range(k, len(jobs), workers)) for k in range(workers)]
    _jobs = jobs
    settings.simple_ids.set_value(False)  # ids unique across the workers' documents, not "p1001" in each
    try:
        if workers < 2 or len(jobs) < PARALLEL_FROM:
            drawn = _draw(list(range(len(jobs))))
        else:
            # fork: the workers start with the runs and Bokeh already in memory (the command runs no threads)
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                drawn = [item for share in pool.map(_draw, shares) for item in share]
    finally:
        _jobs = []
        settings.simple_ids.unset_value()
    return [item for _, item in sorted(drawn)]
