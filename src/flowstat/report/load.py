"""A run directory read into arrays: the run document, and every numeric metric of every sample.

The run file is read by the run-file reader replay uses (flowstat.schema.runfile): a bad line is
recorded with its number and skipped, every good one kept. A large file is read in parts, one
process per CPU, each part straight into arrays (a million samples as Python dicts would not fit
the time a report may take).
"""

from __future__ import annotations

import multiprocessing
import os
import struct
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import numpy as np

from flowstat.schema import runfile
from flowstat.schema import sample as sample_schema

RUN_FILE = "samples.ndjson"
PARALLEL_BYTES = 32 * 2**20  # a smaller run file is read in this process: starting others costs more
SHOWN_BAD_LINES = 20  # bad lines named one by one (the rest are counted)
_STATE = {s: i for i, s in enumerate(sample_schema.NODE_STATES)}
_CHUNK = 65536  # samples turned into an array at a time (a million as tuples would take gigabytes)


class ReportError(Exception):
    """A run cannot be reported; the message names the file and what is wrong."""


@dataclass(frozen=True)
class SchemaMetric:
    """A numeric field of the sample schema, as the report plots it."""

    name: str
    type: str  # integer, number or boolean
    unit: str | None
    description: str


def metrics() -> tuple[SchemaMetric, ...]:
    """The sample schema's metrics: its optional numeric and boolean fields (the required ones, seq
    and pid, identify a sample; they measure nothing)."""
    props = sample_schema.schema()["properties"]
    return tuple(
        SchemaMetric(f.name, f.type, f.unit, props[f.name]["description"])
        for f in sample_schema.fields()
        if not f.required and f.type in ("integer", "number", "boolean")
    )


@dataclass(frozen=True)
class Series:
    """One node's samples (by one agent): rows [lo, hi) of its Run's arrays, in time order."""

    node_id: str
    role: str
    lo: int
    hi: int


@dataclass
class Run:
    """A run as the report shows it: its document, and its samples as arrays, series after series."""

    path: Path  # the run directory
    doc: dict  # the run document (runfile.run_document)
    file: runfile.FileReport
    start_ns: int  # time 0 of the report: the run's start (run.json's started)
    t: np.ndarray  # seconds since start_ns, per sample
    ns: np.ndarray  # the sample's time, ns since the epoch
    state: np.ndarray  # the node_state per sample, as its index in sample_schema.NODE_STATES
    values: dict[str, np.ndarray]  # metric -> its value per sample (float64; NaN where absent)
    series: list[Series]
    agent: str | None  # the agent whose samples these are
    left_out: int = 0  # samples of other agents, not reported
    notes: list[str] = field(default_factory=list)

    @property
    def span(self) -> tuple[float, float]:
        """From the first sample to the last, in seconds since the start."""
        return float(self.t.min()), float(self.t.max())

    @property
    def name(self) -> str:
        return self.doc.get("run_id") or self.path.name

    def of(self, metric: str, s: Series) -> tuple[np.ndarray, np.ndarray]:
        """A series' samples of one metric: times and values, where it has one."""
        t, y = self.t[s.lo : s.hi], self.values[metric][s.lo : s.hi]
        has = ~np.isnan(y)
        return t[has], y[has]


def _getter(positions: list[int]) -> Callable[[tuple], tuple]:
    if len(positions) == 1:
        (i,) = positions
        return lambda values: (values[i],)
    return itemgetter(*positions)


@dataclass
class _Part:
    """One span of the run file read into arrays (in a worker process, or here)."""

    report: runfile.FileReport
    series: list[tuple[str, str, str, str]]  # (node_id, role, agent, node_state) by the part's series number
    sid: np.ndarray
    ns: np.ndarray
    columns: list[np.ndarray]  # by metrics(): the values per sample (NaN where absent)


class _Plan:
    """How to take the metrics out of samples of one Layout, and those taken in the current chunk
    (packed as C doubles at once: half the cost of numpy converting tuples of Python numbers)."""

    def __init__(self, keys: tuple[str, ...], column: dict[str, int]):
        positions = [i for i, k in enumerate(keys) if k in column]
        self.metrics = _getter(positions) if positions else None
        self.pack = struct.Struct(f"{len(positions)}d").pack
        self.columns = [column[keys[i]] for i in positions]
        # A series of the part: a node's samples by one agent in one state (the state, a few values
        # a run, is taken apart from the series after the read: nothing more to do per sample)
        self.who = itemgetter(keys.index("node_id"), keys.index("role"), keys.index("agent"), keys.index("node_state"))
        self.rows: list[int] = []
        self.got: list[bytes] = []


def _read_part(path: Path, span: tuple[int, int] | None) -> _Part:
    names = [m.name for m in metrics()]
    column = {name: j for j, name in enumerate(names)}
    report = runfile.FileReport(str(path))
    plans: dict[int, _Plan] = {}  # by id of the Layout (samples keep their layouts alive while read)
    series: dict[tuple, int] = {}
    sids, stamps, blocks = [], [], []

    def flush(n: int) -> None:
        block = np.full((n, len(names)), np.nan)
        for plan in plans.values():
            if plan.got:
                got = np.frombuffer(b"".join(plan.got), dtype=np.float64).reshape(len(plan.rows), len(plan.columns))
                block[np.asarray(plan.rows)[:, None], plan.columns] = got
                plan.rows, plan.got = [], []
        blocks.append(block)

    row = 0
    for _, values, keys, lay, _, ns in runfile.samples(path, report, span):
        plan = plans.get(id(lay))
        if plan is None:
            plan = plans[id(lay)] = _Plan(keys, column)
        who = plan.who(values)
        sid = series.get(who)
        if sid is None:
            sid = series[who] = len(series)
        sids.append(sid)
        stamps.append(ns)
        if plan.metrics is not None:
            plan.rows.append(row)
            plan.got.append(plan.pack(*plan.metrics(values)))
        row += 1
        if row == _CHUNK:
            flush(row)
            row = 0
    flush(row)
    matrix = np.concatenate(blocks)
    return _Part(
        report,
        list(series),
        np.array(sids, dtype=np.int32),
        np.array(stamps, dtype=np.int64),
        [matrix[:, j] for j in range(len(names))],
    )


def _merged(parts: list[_Part]) -> runfile.FileReport:
    """The parts' reports as one, line numbers counted from the file's first line."""
    out = runfile.FileReport(parts[0].report.path, header=parts[0].report.header)
    read = [p.report for p in parts if p.report.good]
    for r in (p.report for p in parts):
        out.bad += [(lineno + out.lines, why) for lineno, why in r.bad]
        out.lines += r.lines
        out.good += r.good
        out.bytes_read += r.bytes_read
        out.nodes |= r.nodes
        out.self_samples += r.self_samples
    if read:
        out.run_id, out.host, out.first_time, out.last_time = (
            read[0].run_id,
            read[0].host,
            read[0].first_time,
            read[-1].last_time,
        )
    return out


def _read(path: Path, meanwhile: Callable[[], None]) -> list[_Part]:
    """The run file in parts: one per CPU this process may use, each read by a process of its own
    while this one does ``meanwhile``."""
    workers = len(os.sched_getaffinity(0))
    if workers < 2 or path.stat().st_size < PARALLEL_BYTES:
        meanwhile()
        return [_read_part(path, None)]
    spans = runfile.spans(path, workers)
    # fork: the workers start at once with everything imported (the command runs no threads)
    with ProcessPoolExecutor(len(spans), mp_context=multiprocessing.get_context("fork")) as pool:
        parts = pool.map(_read_part, [path] * len(spans), spans)  # submitted: the workers are reading
        meanwhile()
        return list(parts)


def run_file(path: Path) -> Path:
    """The run file of a run directory (or a run file named directly)."""
    if not path.exists():
        raise ReportError(f"{path}: no such run directory")
    found = path / RUN_FILE if path.is_dir() else path
    if not found.is_file():
        raise ReportError(f"{path}: not a run directory: it has no run file ({RUN_FILE})")
    return found


def _recording_agent(header: dict | None, samples_by_agent: dict[str, int]) -> str:
    """Whose samples to report: the agent that recorded the run file (its header says), else the
    agent with the most samples. One agent's samples make one series per node."""
    named = (header or {}).get("agent")
    return named if named in samples_by_agent else max(samples_by_agent, key=samples_by_agent.__getitem__)


def _by_series_then_time(sid: np.ndarray, ns: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The samples of the kept series (``kept`` by series number), ordered by series, then time. A run
    file is written tick by tick: a stable sort by series alone already leaves each in time order
    (checked; a file put together otherwise gets the full sort)."""
    keep = np.flatnonzero(kept[sid])
    order = keep[np.argsort(sid[keep], kind="stable")]
    s, t = sid[order], ns[order]
    if np.any((np.diff(t) < 0) & (np.diff(s) == 0)):
        order = keep[np.lexsort((ns[keep], sid[keep]))]
    return order


def _column(parts: list[_Part], j: int) -> np.ndarray:
    """Metric ``j`` over the parts: the part's own column when there is one part (taken in the series'
    order by the caller: one copy, contiguous, instead of copying the whole sample matrix)."""
    return parts[0].columns[j] if len(parts) == 1 else np.concatenate([p.columns[j] for p in parts])


def load_run(path: Path, meanwhile: Callable[[], None] = lambda: None) -> Run:
    """A run directory (or run file) read for the report; ReportError names what cannot be read.
    ``meanwhile``: what this process can do while other processes read a large run file."""
    found = run_file(path)
    parts = _read(found, meanwhile)
    report = _merged(parts)
    if not report.good:
        why = "; ".join(f"line {n}: {w}" for n, w in report.bad[:3]) or "the file is empty"
        raise ReportError(f"{found}: no sample could be read ({why})")
    try:
        doc = runfile.run_document(report)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    every = sorted({who[:3] for p in parts for who in p.series})  # (node_id, role, agent)
    number = {who: i for i, who in enumerate(every)}
    sid = np.concatenate([np.array([number[w[:3]] for w in p.series], dtype=np.int32)[p.sid] for p in parts])
    state = np.concatenate([np.array([_STATE.get(w[3], -1) for w in p.series], dtype=np.int8)[p.sid] for p in parts])
    ns = np.concatenate([p.ns for p in parts])
    by_agent: dict[str, int] = {}
    for (_, _, agent), n in zip(every, np.bincount(sid, minlength=len(every)), strict=False):
        by_agent[agent] = by_agent.get(agent, 0) + int(n)
    agent = _recording_agent(report.header, by_agent)
    order = _by_series_then_time(sid, ns, np.array([who[2] == agent for who in every]))
    sid, ns, state = sid[order], ns[order], state[order]
    values = {m.name: _column(parts, j)[order] for j, m in enumerate(metrics())}
    bounds = np.searchsorted(sid, np.arange(len(every) + 1))
    series = [
        Series(node, role, int(bounds[i]), int(bounds[i + 1])) for i, (node, role, a) in enumerate(every) if a == agent
    ]
    start_ns = sample_schema.time_ns(doc["started"])
    left_out = report.good - len(order)
    run = Run(path, doc, report, start_ns, (ns - start_ns) / 1e9, ns, state, values, series, agent, left_out)
    if left_out:
        run.notes.append(f"{left_out:,} samples of other agents than {agent} left out (one series per node)")
    return run
