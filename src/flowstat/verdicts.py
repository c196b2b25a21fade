"""``flowstat verdict``: which node holds each run's flow back (issue 46), judged over what a store
holds, and written back to it.

Every evaluation reads the samples of a run's nodes in the last flowstat.flow.WINDOW_S seconds
(busy, backpressured and idle shares, input latency, node state, objects sent and received) and
the run's edges (Elasticsearch: the run document in flowstat-runs; InfluxDB: the run's
flowstat_edge topology points, written with its run document), calls flowstat.flow.held_back_by,
and writes to the same store one verdict (flowstat_verdict, schema/verdict.schema.json) and one
rate per edge (flowstat_edge, schema/edge.schema.json): the objects per second over the window.

- **When.** Evaluations fall on multiples of ``--every`` seconds since the epoch (5 s by default),
  whichever mode judges them: live (every run with samples in the last window, each evaluation
  SETTLE_S after its time, as the samples of its window have arrived), or ``--run RUN_ID`` (a
  past run's span, from its first sample to its last, once). So a run judged twice, live and
  then with --run, writes the same times and the same ids, and overwrites itself: an
  Elasticsearch document by its ``_id`` (run_id/time, run_id/from/to/time), an InfluxDB point by
  its series and time. The verdict's held_back_by is an InfluxDB tag (an alert's series is one
  set of nodes), so a verdict whose nodes changed would be another series: --run deletes the
  run's InfluxDB verdicts over its span before it writes them again.
- **One agent a node.** Two agents watching the same node (flowstat run starts both) would count
  its intervals twice: each node is judged from the agent with the most accounted samples in the
  window (then the most samples, then the first name).
- **Edge rates.** From the edge's own counter first: the agents' edge counters (a node that counts
  what it receives by source, edge.schema.json's counter points), from one agent an edge (the one
  with the most points). Else from a node that feeds one node only: its objects_sent's rate (all
  it sent went there). Otherwise (a node feeding several, or one without objects_sent): the
  downstream node's objects_received rate, less what the edges known so far bring it, split evenly
  among its other feeders (``estimated`` when there are several: nodes count per node, not per
  edge). A counter's rate: its increases from point to point in the window (a decrease, a restart,
  skipped) over the time they span. An edge that only counters name is an edge of the run too.
  (The report's graph draws the sender and split rules over the steady window; it reads no counters.)
- **Bad samples** (a time or a share that is not one) are skipped and counted, never a crash. An
  evaluation whose window holds no sample of the run writes nothing.
- **A store down.** --run checks the store first (a wrong address fails at once), then reads and
  writes as replay does: asked again while the store is down, for up to 2 minutes
  (flowstat.stores' RetryPolicy). Live, a pass that cannot reach the store is said once and left
  to the next pass, which judges what was missed (CATCH_UP_S at most).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import orjson

from flowstat import stores
from flowstat.agent.sinks import exposition
from flowstat.flow import VERDICT_EVERY_S, WINDOW_S, Point, Verdict, epoch_seconds, held_back_by, points_from_samples
from flowstat.progress import Progress
from flowstat.registry import Command
from flowstat.schema import prometheus
from flowstat.schema import sample as sample_schema
from flowstat.stores.elasticsearch import EDGES_INDEX, RUNS_INDEX, SAMPLES_INDEX, ElasticsearchWriter
from flowstat.stores.elasticsearch_rollup import daily_indices
from flowstat.stores.influxdb import DATABASE, InfluxDBWriter, string_literal
from flowstat.timeutil import iso_utc_from_ms

# between evaluations: the alert "pipeline held back" counts on this many a minute (views.alerts)
EVERY_S = float(VERDICT_EVERY_S)
SETTLE_S = 2.0  # live: an evaluation this long after its time (a sample is queryable about 1 s after its time)
CATCH_UP_S = 60.0  # live: after an outage, the evaluations missed are judged this far back at most
CHUNK_MS = 60_000  # --run reads a run's samples this much at a time
PAGE = 5_000  # Elasticsearch: samples per search
BATCH = 100  # evaluations written per request (each a verdict and its edges)
STATUS_EVERY_S = 5.0
LIVE_RETRY = stores.RetryPolicy(first_s=0.5, max_s=2.0, give_up_s=4.0)  # a live write: a short wait, then the next pass
# What an evaluation reads of each sample (the sample schema's names)
FIELDS = (
    "busy_ratio",
    "backpressured_ratio",
    "idle_ratio",
    "input_latency_p50_ms",
    "objects_sent",
    "objects_received",
    "node_state",
)

log = logging.getLogger("flowstat.verdict")
Parsed = TypeVar("Parsed")


class VerdictError(RuntimeError):
    """The store answered with an error that waiting cannot cure (a 4xx, a verdict refused)."""


# -- judging (pure: no store, no clock) ----------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """What an evaluation reads of one sample."""

    node: str
    agent: str
    t: float  # Unix seconds
    point: Point
    sent: float | None
    received: float | None


def parse_sample(doc: Mapping[str, Any]) -> Sample:
    """A stored sample (time: ISO 8601 or Unix seconds); ValueError naming what is wrong."""
    found = points_from_samples([doc])
    if not found:
        raise ValueError(f"sample at {doc.get('time')!r}: no node_id")
    ((node, (point,)),) = found.items()
    return Sample(
        node,
        str(doc.get("agent") or ""),
        point.t,
        point,
        _counter(doc, "objects_sent", node),
        _counter(doc, "objects_received", node),
    )


@dataclass(frozen=True)
class EdgeCount:
    """An agent's edge counter point: the objects ``to`` has received from ``frm`` by time ``t``."""

    frm: str
    to: str
    agent: str
    t: float  # Unix seconds
    count: float


def parse_edge_count(doc: Mapping[str, Any]) -> EdgeCount:
    """A stored edge counter (time: ISO 8601 or Unix seconds); ValueError naming what is wrong."""
    frm, to, count = doc.get("from"), doc.get("to"), doc.get("objects_received")
    if not isinstance(frm, str) or not isinstance(to, str) or not frm or not to:
        raise ValueError(f"edge counter at {doc.get('time')!r}: no from or to")
    if not isinstance(count, int | float) or isinstance(count, bool) or not math.isfinite(count) or count < 0:
        raise ValueError(f"edge counter {frm} -> {to} at {doc.get('time')!r}: objects_received {count!r}")
    t = epoch_seconds(doc.get("time"), f"edge counter {frm} -> {to}")
    return EdgeCount(frm, to, str(doc.get("agent") or ""), t, float(count))


def counted_rates(counts: Iterable[EdgeCount]) -> dict[tuple[str, str], float]:
    """Each counted edge's objects/s: from one agent (the most points, then the first name), its
    counter's increases (a decrease skipped: a restart) over the time they span; an edge with
    fewer than two points of that agent has none."""
    by: dict[tuple[str, str], dict[str, list[EdgeCount]]] = defaultdict(lambda: defaultdict(list))
    for c in counts:
        by[(c.frm, c.to)][c.agent].append(c)
    out: dict[tuple[str, str], float] = {}
    for edge, agents in by.items():
        _, points = min(agents.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        rate = increase_rate(sorted((c.t, c.count) for c in points))
        if rate is not None:
            out[edge] = rate
    return out


def _counter(doc: Mapping[str, Any], key: str, node: str) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise ValueError(f"sample of {node} at {doc.get('time')!r}: {key} is not a number: {value!r}")


def upstream_of(edges: Iterable[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    """Each node's feeders (every node of the edges; sources with none)."""
    ups: dict[str, set[str]] = defaultdict(set)
    for u, d in edges:
        ups[d].add(u)
        ups.setdefault(u, set())
    return {node: tuple(sorted(feeders)) for node, feeders in ups.items()}


def one_agent_each(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    """Each node's samples from one agent: the one with the most accounted samples (then the most
    samples, then the first name). Time order is kept."""
    by: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for s in samples:
        by[(s.node, s.agent)].append(s)
    best: dict[str, tuple[tuple[int, int, str], list[Sample]]] = {}
    for (node, agent), got in by.items():
        accounted = sum(1 for s in got if s.point.busy is not None and s.point.backpressured is not None)
        key = (-accounted, -len(got), agent)
        if node not in best or key < best[node][0]:
            best[node] = (key, got)
    return {node: got for node, (_, got) in best.items()}


def counter_rate(samples: Sequence[Sample], which: str) -> float | None:
    """Per second: a counter's increases from sample to sample (a decrease skipped) over the time
    they span; None for fewer than two values."""
    return increase_rate([(s.t, v) for s in samples if (v := getattr(s, which)) is not None])


def increase_rate(values: Sequence[tuple[float, float]]) -> float | None:
    """Per second: a counter's increases from value to value (``values``: (time, value) in time
    order; a decrease, a restart, skipped) over the time they span; None for fewer than two."""
    if len(values) < 2 or values[-1][0] <= values[0][0]:
        return None
    increase = math.fsum(b - a for (_, a), (_, b) in zip(values, values[1:], strict=False) if b >= a)
    return increase / (values[-1][0] - values[0][0])


def edge_rates(
    edges: Iterable[tuple[str, str]],
    sent: Mapping[str, float | None],
    received: Mapping[str, float | None],
    counted: Mapping[tuple[str, str], float] | None = None,
) -> dict[tuple[str, str], tuple[float | None, bool]]:
    """Each edge's objects/s and whether it is estimated (see the module): (rate, False) from the
    edge's own counters (``counted``), the upstream's objects_sent or all the downstream's intake
    (its one feeder left), (rate, True) the downstream's intake split among several feeders,
    (None, False) unknown."""
    edges = sorted(set(edges))
    downs: dict[str, set[str]] = defaultdict(set)
    ups: dict[str, set[str]] = defaultdict(set)
    for u, d in edges:
        downs[u].add(d)
        ups[d].add(u)
    edge_set = set(edges)
    out: dict[tuple[str, str], tuple[float | None, bool]] = {
        e: (rate, False) for e, rate in (counted or {}).items() if e in edge_set
    }
    for u, d in edges:
        rate = sent.get(u)
        if (u, d) not in out and len(downs[u]) == 1 and rate is not None:
            out[(u, d)] = (rate, False)
    for d, feeders in ups.items():
        rest = sorted(u for u in feeders if (u, d) not in out)
        if not rest:
            continue
        got = received.get(d)
        if got is None:
            out.update({(u, d): (None, False) for u in rest})
            continue
        known = math.fsum(out[(u, d)][0] or 0.0 for u in feeders if (u, d) in out)
        left = max(0.0, got - known)
        out.update({(u, d): (left / len(rest), len(rest) > 1) for u in rest})  # one feeder left: all of it
    return out


def evaluate(
    run_id: str,
    window: Sequence[Sample],
    edges: Sequence[tuple[str, str]],
    at_ms: int,
    window_s: float = WINDOW_S,
    counts: Sequence[EdgeCount] = (),
) -> tuple[Verdict, dict[str, Any], list[dict[str, Any]]]:
    """One evaluation at ``at_ms`` of a run's samples (and its agents' edge counters, ``counts``)
    in the window ``at - window_s < t <= at``: the verdict, its document (verdict.schema.json) and a
    rate document per edge (edge.schema.json)."""
    at = at_ms / 1000
    counted = counted_rates(c for c in counts if at - window_s < c.t <= at)
    edges = sorted(set(edges) | set(counted))
    inside = [s for s in window if at - window_s < s.t <= at]
    chosen = one_agent_each(inside)
    upstream = upstream_of(edges)
    if upstream:  # the pipeline's nodes (an agent sampling itself is none of them)
        chosen = {node: got for node, got in chosen.items() if node in upstream}
    verdict = held_back_by({node: [s.point for s in got] for node, got in chosen.items()}, upstream, at, window_s)
    stamp = iso_utc_from_ms(at_ms)
    doc: dict[str, Any] = {"time": stamp, "run_id": run_id}
    if verdict.kind == "held_back":
        doc["held_back_by"] = ",".join(verdict.nodes)
    doc.update(
        flow=verdict.kind,
        held=len(verdict.nodes) if verdict.kind == "held_back" else 0,
        evidence=verdict.evidence,
        window_s=float(window_s),
    )
    sent = {node: counter_rate(got, "sent") for node, got in chosen.items()}
    received = {node: counter_rate(got, "received") for node, got in chosen.items()}
    rate_docs = []
    for (u, d), (rate, estimated) in sorted(edge_rates(edges, sent, received, counted).items()):
        edge: dict[str, Any] = {"time": stamp, "run_id": run_id, "from": u, "to": d}
        if rate is not None:
            edge["objects_per_second"] = float(rate)
            edge["estimated"] = estimated
        edge["window_s"] = float(window_s)
        rate_docs.append(edge)
    return verdict, doc, rate_docs


def grid(first_ms: int, last_ms: int, every_ms: int) -> list[int]:
    """The evaluation times (multiples of ``every_ms``) after ``first_ms`` up to the first at or
    after ``last_ms``: every sample from first to last is in some evaluation's window."""
    start = first_ms // every_ms * every_ms + every_ms
    end = -(-last_ms // every_ms) * every_ms
    return list(range(start, max(start, end) + 1, every_ms))


# -- the stores --------------------------------------------------------------------------------------
class Source:
    """A store flowstat verdict reads samples and edges from and writes its verdicts to. ``retry``:
    each read and write asked again while the store is down, as a replay's (--run); None: a read
    fails at once (live: the next pass tries again)."""

    def __init__(self, writer: stores.Writer, retry: stores.RetryPolicy | None):
        self.writer, self.retry = writer, retry
        self.said = f"{writer.title} at {writer.shown_url}"

    @property
    def where(self) -> str:
        """What the summary names: the store and where the verdicts went."""
        raise NotImplementedError

    def span(self, run_id: str) -> tuple[int, int] | None:
        """The times (ms) of the run's first and last sample, or None when the store holds none."""
        raise NotImplementedError

    def live_runs(self, lo_ms: int, hi_ms: int) -> list[str]:
        """The runs with samples in (lo, hi]."""
        raise NotImplementedError

    def samples(self, run_id: str, lo_ms: int, hi_ms: int) -> list[dict[str, Any]]:
        """The run's samples in (lo, hi]: time, node_id, agent and FIELDS."""
        raise NotImplementedError

    def edges(self, run_id: str) -> list[tuple[str, str]]:
        """The run's edges, as its run document says them."""
        raise NotImplementedError

    def edge_counts(self, run_id: str, lo_ms: int, hi_ms: int) -> list[dict[str, Any]]:
        """The agents' edge counters of the run in (lo, hi]: time, from, to, agent, objects_received
        (a store that keeps none: none)."""
        return []

    def clear(self, run_id: str, lo_ms: int, hi_ms: int) -> None:
        """Before --run writes the run's verdicts over [lo, hi] again: remove what would not be
        overwritten."""

    def write(self, verdicts: list[dict[str, Any]], rates: list[dict[str, Any]]) -> stores.Outcome:
        """The documents, waiting while the store is down (``retry``, else LIVE_RETRY)."""
        body = self.writer.encode_flow("verdict", verdicts) + self.writer.encode_flow("edge", rates)
        return self.writer.write(body, len(verdicts) + len(rates), self.retry or LIVE_RETRY)

    def _again(self, attempt: Callable[[], Any]) -> Any:
        return self.writer.retried(attempt, self.retry) if self.retry else attempt()


class ElasticsearchSource(Source):
    writer: ElasticsearchWriter

    def __init__(self, writer: ElasticsearchWriter, retry: stores.RetryPolicy | None):
        super().__init__(writer, retry)
        self.samples_index = daily_indices(writer.target)

    @property
    def where(self) -> str:
        return f"{self.said} (flowstat-verdicts-*, flowstat-edges-*)"

    def _search(self, body: dict[str, Any], index: str | None = None) -> dict[str, Any]:
        index = index or self.samples_index

        def once() -> dict[str, Any]:
            url = f"{self.writer.url}/{index}/_search?ignore_unavailable=true&allow_no_indices=true"
            resp = self.writer._http("POST", url, orjson.dumps(body), "application/json", action=f"read {index}")
            if resp.status_code >= 300:
                raise VerdictError(f"{self.said}: searching {index}: HTTP {resp.status_code}: {resp.text[:300]}")
            answer: dict[str, Any] = orjson.loads(resp.content)
            shards = answer.get("_shards") or {}
            if shards.get("failed") or answer.get("timed_out"):  # a part of the answer must not pass for the whole
                raise stores.StoreDown(
                    f"{self.said}: a partial answer searching {index} ({shards.get('failed', 0)} of "
                    f"{shards.get('total', '?')} shards failed, timed out: {bool(answer.get('timed_out'))})"
                )
            return answer

        found: dict[str, Any] = self._again(once)
        return found

    def span(self, run_id: str) -> tuple[int, int] | None:
        body = {
            "size": 0,
            "query": {"term": {"run_id": run_id}},
            "aggs": {"first": {"min": {"field": "time"}}, "last": {"max": {"field": "time"}}},
        }
        aggs = self._search(body).get("aggregations") or {}
        if (aggs.get("first") or {}).get("value") is None:
            return None
        return int(aggs["first"]["value"]), int(aggs["last"]["value"])

    def live_runs(self, lo_ms: int, hi_ms: int) -> list[str]:
        body = {
            "size": 0,
            "query": {"range": {"time": {"gt": lo_ms, "lte": hi_ms, "format": "epoch_millis"}}},
            "aggs": {"runs": {"terms": {"field": "run_id", "size": 10_000}}},
        }
        aggs = self._search(body).get("aggregations") or {}
        return sorted(b["key"] for b in (aggs.get("runs") or {}).get("buckets", []))

    def samples(self, run_id: str, lo_ms: int, hi_ms: int) -> list[dict[str, Any]]:
        # unique: a sample's _id is run_id/agent/node_id/seq
        keys = ["node_id", "agent", "seq"]
        return self._run_docs(self.samples_index, run_id, lo_ms, hi_ms, ["time", "node_id", "agent", *FIELDS], keys)

    def edge_counts(self, run_id: str, lo_ms: int, hi_ms: int) -> list[dict[str, Any]]:
        # unique: a counter's _id is run_id/from/to/agent/time
        fields = ["time", "from", "to", "agent", "objects_received"]
        index = daily_indices(EDGES_INDEX)  # beside the verdict's rates: only the counters hold objects_received
        return self._run_docs(index, run_id, lo_ms, hi_ms, fields, ["from", "to", "agent"], "objects_received")

    def _run_docs(
        self, index: str, run_id: str, lo_ms: int, hi_ms: int, fields: list[str], keys: list[str], has: str = ""
    ) -> list[dict[str, Any]]:
        """The run's documents in (lo, hi] (those holding ``has``, if given), their ``fields``, page
        by page, sorted by time then ``keys`` (which make each unique)."""
        body: dict[str, Any] = {
            "size": PAGE,
            "query": {
                "bool": {
                    "filter": [
                        {"term": {"run_id": run_id}},
                        {"range": {"time": {"gt": lo_ms, "lte": hi_ms, "format": "epoch_millis"}}},
                        *([{"exists": {"field": has}}] if has else []),
                    ]
                }
            },
            "_source": fields,
            "sort": [{"time": "asc"}, *({k: "asc"} for k in keys)],
            "track_total_hits": False,
        }
        out: list[dict[str, Any]] = []
        while True:
            hits = (self._search(body, index).get("hits") or {}).get("hits") or []
            out += [h["_source"] for h in hits]
            if len(hits) < PAGE:
                return out
            body["search_after"] = hits[-1]["sort"]

    def edges(self, run_id: str) -> list[tuple[str, str]]:
        url = f"{self.writer.url}/{RUNS_INDEX}/_doc/{quote(run_id, safe='')}"

        def once() -> Any:
            return self.writer._http("GET", url, action=f"read {RUNS_INDEX}")

        resp = self._again(once)
        if resp.status_code == 404:  # no run document (or no runs index): no edges
            return []
        if resp.status_code >= 300:
            raise VerdictError(f"{self.said}: reading the run document of {run_id}: HTTP {resp.status_code}")
        return _edges((resp.json().get("_source") or {}).get("edges"))


class InfluxDBSource(Source):
    writer: InfluxDBWriter

    @property
    def where(self) -> str:
        return f"{self.said}, database {self.writer.target} (flowstat_verdict, flowstat_edge)"

    def _query(self, statement: str) -> dict[str, Any]:
        try:
            return self.writer.query(statement, self.writer.target, retry=self.retry)
        except RuntimeError as exc:  # an error answer (a 4xx): not cured by waiting
            raise VerdictError(f"{self.said}: {exc}") from None

    def _series(self, statement: str) -> list[dict[str, Any]]:
        result = (self._query(statement).get("results") or [{}])[0]
        series: list[dict[str, Any]] = result.get("series") or []
        return series

    def _first(self, statement: str) -> int | None:
        for s in self._series(statement):
            for row in s.get("values") or []:
                return int(row[0]) // 1_000_000
        return None

    def span(self, run_id: str) -> tuple[int, int] | None:
        node, run = _ident(sample_schema.measurement()), string_literal(run_id)
        first = self._first(f'SELECT first("seq") FROM {node} WHERE "run_id" = {run}')
        last = self._first(f'SELECT last("seq") FROM {node} WHERE "run_id" = {run}')
        return None if first is None or last is None else (first, last)

    def live_runs(self, lo_ms: int, hi_ms: int) -> list[str]:
        node = _ident(sample_schema.measurement())
        statement = f'SELECT count("seq") FROM {node} WHERE {_span(lo_ms, hi_ms)} GROUP BY "run_id"'
        return sorted({(s.get("tags") or {}).get("run_id", "") for s in self._series(statement)} - {""})

    def samples(self, run_id: str, lo_ms: int, hi_ms: int) -> list[dict[str, Any]]:
        node = _ident(sample_schema.measurement())
        statement = (
            f"SELECT {', '.join(map(_ident, FIELDS))} FROM {node} WHERE \"run_id\" = {string_literal(run_id)} AND "
            f'{_span(lo_ms, hi_ms)} GROUP BY "node_id", "agent"'
        )
        out: list[dict[str, Any]] = []
        for s in self._series(statement):
            tags, columns = s.get("tags") or {}, s["columns"]
            for row in s.get("values") or []:
                doc = {k: v for k, v in zip(columns, row, strict=False) if v is not None}
                doc["time"] = row[0] / 1e9
                doc.update(node_id=tags.get("node_id"), agent=tags.get("agent", ""))
                out.append(doc)
        return out

    def edges(self, run_id: str) -> list[tuple[str, str]]:
        run = string_literal(run_id)
        statement = f'SELECT "topology" FROM "flowstat_edge" WHERE "run_id" = {run} GROUP BY "from", "to"'
        return _edges([s.get("tags") for s in self._series(statement)])

    def edge_counts(self, run_id: str, lo_ms: int, hi_ms: int) -> list[dict[str, Any]]:
        statement = (
            f'SELECT "objects_received" FROM "flowstat_edge" WHERE "run_id" = {string_literal(run_id)} AND '
            f'{_span(lo_ms, hi_ms)} GROUP BY "from", "to", "agent"'
        )
        out: list[dict[str, Any]] = []
        for s in self._series(statement):
            tags = s.get("tags") or {}
            for row in s.get("values") or []:
                if row[1] is not None:
                    out.append({"time": row[0] / 1e9, **tags, "objects_received": row[1]})
        return out

    def clear(self, run_id: str, lo_ms: int, hi_ms: int) -> None:
        self._query(
            f'DELETE FROM "flowstat_verdict" WHERE "run_id" = {string_literal(run_id)} AND '
            f"time >= {lo_ms * 1_000_000} AND time <= {hi_ms * 1_000_000}"
        )


def _edges(items: object) -> list[tuple[str, str]]:
    """The edges of a list of {"from", "to"} (the run document's, the topology points' tags);
    what is not one is left out."""
    out = set()
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("from"), str) and isinstance(item.get("to"), str):
            out.add((item["from"], item["to"]))
    return sorted(out)


def _ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _span(lo_ms: int, hi_ms: int) -> str:
    return f"time > {lo_ms * 1_000_000} AND time <= {hi_ms * 1_000_000}"


# -- judging a run ---------------------------------------------------------------------------------
@dataclass
class Judging:
    """What the judging did."""

    evaluations: int = 0  # verdicts written
    documents: int = 0  # verdicts and edge rates the store took
    refused: int = 0
    reasons: list[str] = field(default_factory=list)
    skipped: int = 0  # bad samples
    bad: list[str] = field(default_factory=list)  # the first few, why
    kinds: Counter[str] = field(default_factory=Counter)  # held back by NODES / none / unknown -> evaluations
    # each run's last verdict, its document and its edge rates' (what --listen serves)
    latest: dict[str, tuple[Verdict, dict[str, Any], list[dict[str, Any]]]] = field(default_factory=dict)

    def take(self, outcome: stores.Outcome) -> None:
        self.documents += outcome.accepted
        self.refused += outcome.refused
        self.reasons = (self.reasons + outcome.reasons)[:5]


def judge(
    source: Source,
    run_id: str,
    times_ms: Sequence[int],
    edges: Sequence[tuple[str, str]],
    tally: Judging,
    window_s: float = WINDOW_S,
    on_evaluation: Callable[[], None] | None = None,
) -> None:
    """Judge a run at each of ``times_ms`` (ascending), writing each evaluation's verdict and edge
    rates; samples are read CHUNK_MS at a time, and only the window is kept."""
    if not times_ms:
        return
    window_ms = int(round(window_s * 1000))
    buffer: list[Sample] = []
    counts: list[EdgeCount] = []  # the agents' edge counters, read with the samples
    loaded = times_ms[0] - window_ms  # the samples up to here are read
    verdicts: list[dict[str, Any]] = []
    rates: list[dict[str, Any]] = []

    def flush() -> None:
        if verdicts:
            tally.take(source.write(verdicts, rates))
            verdicts.clear()
            rates.clear()

    for at in times_ms:
        if at > loaded:
            hi = max(at, min(loaded + CHUNK_MS, times_ms[-1]))
            buffer += sorted(
                _parsed(parse_sample, source.samples(run_id, loaded, hi), run_id, tally), key=lambda s: s.t
            )
            counts += sorted(
                _parsed(parse_edge_count, source.edge_counts(run_id, loaded, hi), run_id, tally), key=lambda c: c.t
            )
            loaded = hi
        del buffer[: bisect_right([s.t for s in buffer], (at - window_ms) / 1000)]
        del counts[: bisect_right([c.t for c in counts], (at - window_ms) / 1000)]
        window = buffer[: bisect_right([s.t for s in buffer], at / 1000)]
        if window:  # no sample of the run in the window: nothing to say
            verdict, doc, edge_docs = evaluate(run_id, window, edges, at, window_s, counts)
            verdicts.append(doc)
            rates += edge_docs
            tally.evaluations += 1
            tally.kinds["held back by " + doc["held_back_by"] if "held_back_by" in doc else verdict.kind] += 1
            tally.latest[run_id] = (verdict, doc, edge_docs)
            if len(verdicts) >= BATCH:
                flush()
        if on_evaluation is not None:
            on_evaluation()
    flush()


def _parsed(
    parse: Callable[[Mapping[str, Any]], Parsed], raws: Iterable[Mapping[str, Any]], run_id: str, tally: Judging
) -> list[Parsed]:
    """The stored documents (samples, edge counters) that parse; the others skipped and counted."""
    out = []
    for raw in raws:
        try:
            out.append(parse(raw))
        except ValueError as exc:
            tally.skipped += 1
            if len(tally.bad) < 5:
                tally.bad.append(f"run {run_id}: {exc}")
    return out


# -- served to Prometheus ----------------------------------------------------------------------------
class VerdictBoard:
    """What ``--listen``'s /metrics shows: each live run's latest verdict and edge rates, as the last
    pass left them (none while the store is down: a verdict the service cannot renew is not shown
    as current, so an alert's ``for`` starts again when it answers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shown: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        self._version = 0
        self._rendered: dict[bool, tuple[int, bytes]] = {}

    def show(self, shown: Mapping[str, tuple[dict[str, Any], list[dict[str, Any]]]]) -> None:
        with self._lock:
            self._shown = dict(shown)
            self._version += 1

    def rendered(self, openmetrics: bool) -> tuple[int, bytes]:
        with self._lock:
            version, shown = self._version, list(self._shown.values())
            kept = self._rendered.get(openmetrics)
        if kept is not None and kept[0] == version:
            return kept
        body = prometheus.verdict_exposition(
            [doc for doc, _ in shown],
            [e for _, edges in shown for e in edges],
            openmetrics=openmetrics,
            process=exposition.process_figures(),
        ).encode()
        with self._lock:
            self._rendered[openmetrics] = (version, body)
        return version, body

    def answered_whole(self, version: int) -> None:
        pass  # nothing waits for a scrape: the service's verdicts are in its store too


# -- the command -----------------------------------------------------------------------------------
HELP = "judge which node holds each run's flow back, over what a store holds, and write the verdict to it"
PARSER = dict(
    description="Which node holds each run's flow back (flowstat.flow.held_back_by, as flowstat run judges its "
    "own nodes), judged over what one store holds: every --every seconds, the run's nodes' samples in the last "
    f"{WINDOW_S:g} s (their busy, backpressured and idle shares, input latency and state) and the run's edges "
    "(Elasticsearch: the run document in flowstat-runs; InfluxDB: its flowstat_edge topology points). Each "
    "evaluation writes to the same store one verdict (measurement flowstat_verdict; Elasticsearch "
    "flowstat-verdicts-YYYY.MM.DD) and the objects/s on each edge over the window (flowstat_edge; "
    "flowstat-edges-YYYY.MM.DD), at multiples of --every since the epoch: judged again, a run overwrites "
    "itself. With --run, a past run's span once (with a progress bar); else live until stopped (SIGTERM, "
    "Ctrl-C): every run with samples in the last window, each evaluation "
    f'{SETTLE_S:g} s after its time (docs/ingest.md, "The verdict written back").',
    epilog="Exit status: 0 done (or stopped), 1 --run done but bad samples were skipped (counted), 2 bad arguments, "
    "no sample of the run, or the store refused the verdicts, 3 the store is down or will not have us "
    "(--run; live waits for it).",
)


def configure(p: argparse.ArgumentParser) -> None:
    store = p.add_argument_group("the store (one)")
    store.add_argument(
        "--influx",
        "--influxdb",
        metavar="URL",
        help=f"InfluxDB, e.g. http://127.0.0.1:8086; --db says the database (default {DATABASE})",
    )
    store.add_argument("--db", default=DATABASE, help=f"the InfluxDB database (default {DATABASE})")
    store.add_argument(
        "--es",
        metavar="URL",
        help="Elasticsearch, e.g. http://127.0.0.1:9200; every node of a cluster: http://HOST:9200,HOST:9200,...",
    )
    store.add_argument(
        "--index", default=SAMPLES_INDEX, help=f"the Elasticsearch samples' index, read (default {SAMPLES_INDEX})"
    )
    p.add_argument("--run", metavar="RUN_ID", help="judge this past run once, over its span, and exit")
    p.add_argument(
        "--every",
        type=float,
        default=EVERY_S,
        metavar="S",
        help=f"seconds between evaluations, each over the last {WINDOW_S:g} s (default {EVERY_S:g}; 0.5 to 3600)",
    )
    p.add_argument(
        "--status",
        metavar="FILE",
        help="live: after each pass that reached the store, write what it did here (JSON): a health check "
        "reads its age",
    )
    p.add_argument("--quiet", action="store_true", help="--run: no progress bar")
    served = p.add_argument_group("for Prometheus (live)")
    served.add_argument(
        "--listen",
        metavar="[HOST:]PORT",
        help="serve each live run's latest verdict and edge rates on http://HOST:PORT/metrics (host 127.0.0.1 "
        f"unless given; {prometheus.VERDICT_FAMILIES[0].name}, ..., docs/prometheus.md), what the "
        'Prometheus rule "pipeline held back" reads',
    )
    served.add_argument(
        "--web-config",
        metavar="FILE",
        help="an exporter-toolkit web-config.yml for --listen: TLS and basic authentication (required beyond "
        "loopback)",
    )


def _source(args: argparse.Namespace, retry: stores.RetryPolicy | None) -> Source:
    if args.es:
        return ElasticsearchSource(ElasticsearchWriter(args.es, args.index), retry)
    return InfluxDBSource(InfluxDBWriter(args.influx, args.db), retry)


def _said(tally: Judging) -> str:
    kinds = ", ".join(f"{what} {n}" for what, n in tally.kinds.most_common())
    return f"{tally.evaluations} evaluations ({kinds or 'none'})"


def one_run(source: Source, run_id: str, every_ms: int, quiet: bool) -> int:
    """--run: the run's span judged once; the exit status."""
    source.writer.check()  # a wrong address fails at once, not after the patient retries
    span = source.span(run_id)
    if span is None:
        print(f"flowstat verdict: {source.said} holds no sample of run {run_id}", file=sys.stderr)
        return 2
    edges = source.edges(run_id)
    if not edges:
        print(
            f"flowstat verdict: {source.said} holds no edges of run {run_id} (its run document: replay the run, "
            "or run it with flowstat run --sink): every verdict is unknown",
            file=sys.stderr,
        )
    times = grid(*span, every_ms)
    source.clear(run_id, times[0], times[-1])
    bar = Progress(len(times), "judged", "evaluations", enabled=not quiet)
    tally = Judging()
    try:
        judge(source, run_id, times, edges, tally, on_evaluation=lambda: bar.update(1))
    finally:
        bar.close()
    for why in tally.bad:
        print(f"  bad sample skipped: {why}", file=sys.stderr)
    if tally.refused:
        why = tally.reasons[0] if tally.reasons else "no reason given"
        print(f"flowstat verdict: {source.said} refused {tally.refused} of the documents ({why})", file=sys.stderr)
        return 2
    print(
        f"flowstat verdict: run {run_id}: {_said(tally)} written to {source.where}, "
        f"{tally.documents - tally.evaluations} edge rates; {tally.skipped} bad samples skipped"
    )
    return 1 if tally.skipped else 0


def live(
    source: Source, every_ms: int, stop: threading.Event, status: str | None = None, board: VerdictBoard | None = None
) -> None:
    """Judge every run with samples in the last window, every ``every_ms``, until ``stop``; a store
    down is said once and waited for, the evaluations it made us miss judged once it answers
    (CATCH_UP_S at most)."""
    window_ms = int(WINDOW_S * 1000)
    last: int | None = None  # the last evaluation time judged
    edges: dict[str, list[tuple[str, str]]] = {}
    said: dict[str, tuple[str, tuple[str, ...]]] = {}
    down: str | None = None
    refused = ""
    totals = Judging()
    while not stop.is_set():
        at = (int(time.time() * 1000) - int(SETTLE_S * 1000)) // every_ms * every_ms
        if last is None or at > last:
            back = int(CATCH_UP_S * 1000) // every_ms * every_ms
            first = at if last is None else max(last + every_ms, at - back)
            times = list(range(first, at + 1, every_ms))
            try:
                runs = source.live_runs(times[0] - window_ms, at)
                for run_id in runs:
                    if not edges.get(run_id):  # its run document may come later than its first samples
                        edges[run_id] = source.edges(run_id)
                    judge(source, run_id, times, edges[run_id], totals)
                    latest = totals.latest.get(run_id)
                    _say_change(run_id, latest[0] if latest else None, said)
                for run_id in set(edges) - set(runs):  # no sample in the last window: ended
                    del edges[run_id]
                    said.pop(run_id, None)
                    totals.latest.pop(run_id, None)
                if board is not None:
                    board.show({run_id: (doc, edges) for run_id, (_, doc, edges) in totals.latest.items()})
                last = at
                if down is not None:
                    log.info("%s answers again", source.said)
                    down = None
                if totals.refused and str(totals.reasons) != refused:
                    refused = str(totals.reasons)
                    log.error("%s refused %d documents so far: %s", source.said, totals.refused, totals.reasons[0])
                for why in totals.bad:
                    log.warning("bad sample skipped: %s", why)
                totals.bad.clear()
                if status:
                    _write_status(status, at, len(runs), totals)
            except stores.StoreDown as exc:
                if down is None:
                    log.warning("%s; the evaluations wait for it", exc)
                down = str(exc)
                if board is not None:
                    board.show({})
            except VerdictError as exc:
                if str(exc) != refused:
                    log.error("%s", exc)
                refused = str(exc)
        # the next evaluation's time, once its window has settled (a pass that failed is tried again then)
        next_at = at + every_ms + int(SETTLE_S * 1000)
        stop.wait(max(0.05, next_at / 1000 - time.time() + 0.05))


def _say_change(run_id: str, verdict: Verdict | None, said: dict[str, tuple[str, tuple[str, ...]]]) -> None:
    """A run's verdict, logged when it changes (not every evaluation)."""
    if verdict is None:
        return
    now = (verdict.kind, verdict.nodes)
    if said.get(run_id) != now:
        said[run_id] = now
        what = "held back by " + ",".join(verdict.nodes) if verdict.kind == "held_back" else verdict.kind
        log.info("run %s: %s (%s)", run_id, what, verdict.evidence)


def _write_status(path: str, at_ms: int, runs: int, tally: Judging) -> None:
    status = {
        "time": iso_utc_from_ms(int(time.time() * 1000)),
        "judged_until": iso_utc_from_ms(at_ms),
        "judged_until_ms": at_ms,
        "runs": runs,
        "evaluations": tally.evaluations,
        "documents": tally.documents,
        "refused": tally.refused,
        "bad_samples": tally.skipped,
    }
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, path)
    except OSError as exc:  # the health check will say it; the judging goes on
        log.error("--status %s: %s", path, exc)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s flowstat verdict: %(message)s")
    if bool(args.es) == bool(args.influx):
        print("flowstat verdict: say which store to judge: --influx URL or --es URL (one)", file=sys.stderr)
        return 2
    if not 0.5 <= args.every <= 3600 or not math.isfinite(args.every):
        print("flowstat verdict: --every must be between 0.5 and 3600 s", file=sys.stderr)
        return 2
    every_ms = int(round(args.every * 1000))
    if args.run and (args.listen or args.web_config):
        print("flowstat verdict: --listen serves live verdicts: not with --run", file=sys.stderr)
        return 2
    try:
        source = _source(args, stores.DEFAULT_RETRY if args.run else None)
    except stores.StoreURLError as exc:
        print(f"flowstat verdict: {exc}", file=sys.stderr)
        return 2
    board, served = None, None
    if args.listen:
        try:
            board = VerdictBoard()
            served = _serve(args.listen, args.web_config, board)
        except ValueError as exc:
            print(f"flowstat verdict: --listen {args.listen}: {exc}", file=sys.stderr)
            source.writer.close()
            return 2
    try:
        if args.run:
            return one_run(source, args.run, every_ms, args.quiet)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        log.info(
            "judging every run with samples in the last %g s, every %g s, written back to %s",
            WINDOW_S,
            args.every,
            source.where,
        )
        if served is not None:
            log.info("serving the latest verdicts on %s", served.said)
        live(source, every_ms, stop, args.status, board)
        log.info("stopped")
        return 0
    except stores.StoreDown as exc:
        print(f"flowstat verdict: {exc}", file=sys.stderr)
        return 3
    except VerdictError as exc:
        print(f"flowstat verdict: {exc}", file=sys.stderr)
        return 2
    finally:
        if served is not None:
            served.close()
        source.writer.close()


def _serve(listen: str, web_config: str | None, board: VerdictBoard) -> exposition.MetricsServer:
    """The /metrics server of --listen [HOST:]PORT (ValueError: what is wrong with it)."""
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError("a port (0 to 65535) is needed, as [HOST:]PORT")
    web = exposition.web_config_for(host, web_config)
    try:
        return exposition.MetricsServer(board, host, int(port_text), web)
    except OSError as exc:
        raise ValueError(f"cannot listen: {exc.strerror}") from None


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
