"""Elasticsearch's per-node rollup: per node and 10 s, the mean of every numeric sample field, in the
daily indices flowstat-node-10s-YYYY.MM.DD — what InfluxDB's continuous query holds in
rollup.flowstat_node_10s, under the same names (``mean_<field>``, and ``samples``, how many it
averages).

Why: a view of a long run of many nodes reads every sample of it. Over an hour of 3,000 nodes that
is ten million documents, and Elasticsearch's cost is per document matched (issue 28: the run view
with All, 541 ms); the rollup holds a tenth of them. Elasticsearch has no continuous query and the
server the tests run has no transform, so flowstat computes it: one search per 10 s window (a
composite aggregation by the sample's tags, avg of each field), written under a deterministic
``_id`` (run_id/agent/node_id/window start), so that writing a window again overwrites it.

Late samples. A window is first rolled up SETTLE_S after its end. Then, for RESAMPLE_S, each pass
counts the samples of every window (one date histogram of counts: no field is read) and rolls up
again each window whose count changed since it was rolled up: an agent's spool resent after an
outage, a sample a slow link delivered late. A sample
stored later than that is not in the rollup until ``flowstat rollup --from`` (or a replay of its run)
rolls its window up again. A pass that cannot reach the store leaves its windows to the next pass,
which starts where the last complete one ended: an outage of the store, or of the rollup itself
(``Rollup.resume`` starts after the last window in the rollup's indices), loses nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from flowstat.schema import sample as sample_schema
from flowstat.timeutil import iso_utc_from_ms

from ._base import Outcome, StoreDown
from ._es_common import DATE, SAMPLES_INDEX, daily_index, index_action

if TYPE_CHECKING:
    from .elasticsearch import Elasticsearch

ROLLUP_INDEX = "flowstat-node-10s"  # not flowstat-samples-...: the samples' pattern (and views) must not see it
EVERY_S = 10  # InfluxDB's flowstat_node_10s bucket (influxdb.ROLLUP_BUCKETS)
SETTLE_S = 2.0  # a window is first rolled up this long after its end: samples are queryable within about 1 s
RESAMPLE_S = 300  # and again, for this long after, whenever its samples' count changes
PAGE = 10_000  # composite buckets per request: a window of up to this many nodes is one request

log = logging.getLogger("flowstat.stores")


class RollupError(RuntimeError):
    """The store answered a rollup's request with an error that waiting cannot cure (a 4xx)."""


def tags() -> list[str]:
    """The sample's tags: what identifies a node's series (InfluxDB's GROUP BY *)."""
    return [f.name for f in sample_schema.fields() if f.influx == "tag"]


def rolled_fields() -> list[str]:
    """The numeric sample fields, each averaged (InfluxDB's mean(*) takes the same)."""
    return [f.name for f in sample_schema.fields() if f.influx == "field" and f.type in ("integer", "number")]


def mappings() -> dict[str, Any]:
    """The rollup document's mapping: strict, as the samples'."""
    props: dict[str, Any] = {"time": DATE, **{t: {"type": "keyword", "ignore_above": 256} for t in tags()}}
    props["samples"] = {"type": "long"}
    props.update({f"mean_{f}": {"type": "double"} for f in rolled_fields()})
    return {"dynamic": "strict", "properties": props}


def rollup_index(samples_index: str) -> str:
    """Where the samples of ``samples_index`` are rolled up: flowstat-node-10s for flowstat-samples,
    flowstat-node-10s-INDEX for another (a test's, a benchmark's), under the same template."""
    return ROLLUP_INDEX if samples_index == SAMPLES_INDEX else f"{ROLLUP_INDEX}-{samples_index}"


def window_of(ms: int) -> int:
    """The start (ms) of the window holding ``ms``."""
    return ms - ms % (EVERY_S * 1000)


@dataclass
class Pass:
    """What one pass did."""

    windows_counted: int = 0  # windows whose samples were counted
    windows_rolled: int = 0  # windows rolled up (their count changed, or never rolled up)
    documents: int = 0  # rollup documents written
    refused: int = 0  # rollup documents the store refused (their reasons are logged)
    until_ms: int = 0  # the end of the last window rolled up in order: where the next pass may start


@dataclass
class Rollup:
    """Rolls ``source`` (its daily indices SOURCE-*) up into ``target``'s, through ``store`` (its
    nodes, credentials and failover)."""

    store: Elasticsearch
    source: str = SAMPLES_INDEX
    target: str = ROLLUP_INDEX
    resample_s: float = RESAMPLE_S
    settle_s: float = SETTLE_S
    clock: Callable[[], float] = time.time
    rolled: dict[int, int] = field(default_factory=dict)  # window start (ms) -> the sample count rolled up
    resume_ms: int | None = None  # where the last pass ended: the next starts there at the latest

    # -- passes ---------------------------------------------------------------------------------
    def tick(self) -> Pass:
        """One pass of the live rollup: every window ended SETTLE_S ago that is new, or within the
        resample span with a changed count. StoreDown when the store cannot be read or written:
        nothing is lost, the next pass starts where this one could not."""
        now_ms = int(self.clock() * 1000)
        hi = window_of(now_ms - int(self.settle_s * 1000))
        lo = window_of(now_ms - int(self.resample_s * 1000))
        if self.resume_ms is not None:  # where the last pass ended, or could not go on
            lo = min(lo, self.resume_ms)
        done = self.roll(lo, hi, only_changed=True)
        self.resume_ms = hi
        for w in [w for w in self.rolled if w < window_of(now_ms - int(self.resample_s * 1000))]:
            del self.rolled[w]
        return done

    def roll(self, from_ms: int, to_ms: int, *, only_changed: bool = False) -> Pass:
        """Roll up every window starting in [from_ms, to_ms) (aligned down to windows); with
        ``only_changed``, only those whose sample count differs from what was rolled up. On
        StoreDown, ``resume_ms`` says where the windows left begin."""
        out = Pass(until_ms=window_of(from_ms))
        counts = self.counts(window_of(from_ms), to_ms)
        out.windows_counted = len(counts)
        for w, n in sorted(counts.items()):
            if n and (not only_changed or self.rolled.get(w) != n):
                try:
                    written, refused = self.roll_window(w)
                except StoreDown:
                    self.resume_ms = w if self.resume_ms is None else min(self.resume_ms, w)
                    raise
                out.windows_rolled += 1
                out.documents += written
                out.refused += refused
            self.rolled[w] = n
            out.until_ms = w + EVERY_S * 1000
        return out

    def resume(self, max_back_s: float = 86_400.0) -> int | None:
        """Start the next pass after the last window the rollup's indices hold (at most ``max_back_s``
        ago): a rollup stopped for a while catches up. Returns that window's start, or None."""
        body = {"size": 0, "aggs": {"last": {"max": {"field": "time"}}}}
        resp = self._search(f"{self.target}-*", body)
        last = resp.get("aggregations", {}).get("last", {}).get("value")
        if last is None:
            return None
        floor = window_of(int((self.clock() - max_back_s) * 1000))
        self.resume_ms = max(int(last), floor)
        return self.resume_ms

    # -- the store --------------------------------------------------------------------------------
    def counts(self, from_ms: int, to_ms: int) -> dict[int, int]:
        """Samples per window starting in [from_ms, to_ms), empty windows included."""
        if to_ms <= from_ms:
            return {}
        body = {
            "size": 0,
            "query": {"range": {"time": {"gte": from_ms, "lt": to_ms, "format": "epoch_millis"}}},
            "aggs": {
                "w": {
                    "date_histogram": {
                        "field": "time",
                        "fixed_interval": f"{EVERY_S}s",
                        "min_doc_count": 0,
                        "extended_bounds": {"min": from_ms, "max": to_ms - 1},
                    }
                }
            },
        }
        answer = self._search(f"{self.source}-*", body)
        return {int(b["key"]): b["doc_count"] for b in answer["aggregations"]["w"]["buckets"]}

    def roll_window(self, w: int) -> tuple[int, int]:
        """Roll one window up; (documents written, refused)."""
        written = refused = 0
        for docs in self._pages(w):
            index = self.index_of(w)
            body = b"".join(index_action(index, doc_id) + orjson.dumps(doc) + b"\n" for doc_id, doc in docs)
            outcome: Outcome = self.store.post(body, len(docs))
            if outcome.retry is not None:  # some documents not taken for now: the window again, later
                raise StoreDown(
                    f"{self.store.title} at {self.store.url}: {outcome.retry_count} rollup documents refused for now"
                )
            for reason in outcome.reasons:
                log.error("rollup of %s: refused: %s", iso_utc_from_ms(w), reason)
            written += outcome.accepted
            refused += outcome.refused
        return written, refused

    def index_of(self, w: int) -> str:
        """The daily index of the window starting at ``w`` (ms): its UTC day, as the samples'."""
        return daily_index(self.target, w * 1_000_000)

    def _pages(self, w: int) -> Iterator[list[tuple[str, dict[str, Any]]]]:
        """The window's rollup documents, a page of nodes at a time."""
        names, fields = tags(), rolled_fields()
        body: dict[str, Any] = {
            "size": 0,
            "query": {"range": {"time": {"gte": w, "lt": w + EVERY_S * 1000, "format": "epoch_millis"}}},
            "aggs": {
                "nodes": {
                    "composite": {"size": PAGE, "sources": [{t: {"terms": {"field": t}}} for t in names]},
                    "aggs": {f: {"avg": {"field": f}} for f in fields},
                }
            },
        }
        stamp = iso_utc_from_ms(w)
        while True:
            agg = self._search(f"{self.source}-*", body)["aggregations"]["nodes"]
            docs = []
            for b in agg["buckets"]:
                key = b["key"]
                doc: dict[str, Any] = {"time": stamp, **key, "samples": b["doc_count"]}
                doc.update({f"mean_{f}": b[f]["value"] for f in fields if b[f]["value"] is not None})
                docs.append((f"{key['run_id']}/{key['agent']}/{key['node_id']}/{w}", doc))
            if docs:
                yield docs
            if "after_key" not in agg or len(agg["buckets"]) < PAGE:
                return
            body["aggs"]["nodes"]["composite"]["after"] = agg["after_key"]

    def _search(self, index: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.store.url}/{index}/_search?ignore_unavailable=true&allow_no_indices=true"
        resp = self.store._http("POST", url, orjson.dumps(body), "application/json", action=f"read {index}")
        if resp.status_code >= 300:
            raise RollupError(
                f"{self.store.title} at {self.store.url}/{index}/_search: HTTP {resp.status_code}: {resp.text[:300]}"
            )
        answer: dict[str, Any] = resp.json()
        return answer
