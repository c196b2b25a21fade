"""Elasticsearch's per-node rollup: per node and 10 s, the mean of every numeric sample field, in the
daily indices flowstat-node-10s-YYYY.MM.DD — what InfluxDB's continuous query holds in
rollup.flowstat_node_10s, under the same names (``mean_<field>``, and ``samples``, how many it
averages).

Why: a view of a long run of many nodes reads every sample of it. Over an hour of 3,000 nodes that
is millions of documents, and Elasticsearch's cost is per document matched (issue 28: the run view
with All, 541 ms); the rollup holds a tenth of them. Elasticsearch has no continuous query and the
server the tests run has no transform, so flowstat computes it: one search per 10 s window (a
composite aggregation by the sample's tags, avg of each field), a document per series and window
under a deterministic ``_id`` (document_id), so that writing a window again overwrites it.

Late samples. A window is first rolled up SETTLE_S after its end. Then, for RESAMPLE_S, each pass
counts the samples of every window (one date histogram of counts: no field is read) and rolls up
again each window whose count changed since it was rolled up: a sample a slow link delivered late.
After an outage of the store (a pass that could not read, or write), every window since the outage
began is counted again for RESAMPLE_S after the store answers again, however old: the agents'
spools resend what waited once it is back. A sample stored later than that is not in the rollup
until ``flowstat rollup --from`` (or a replay of its run) rolls its window up again. A rollup
stopped for a while catches up from where it got to (``Rollup.resume``).
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

from ._base import Outcome, RetryPolicy, StoreAuthError, StoreDown
from ._es_common import DATE, SAMPLES_INDEX, daily_index, index_action

if TYPE_CHECKING:
    from .elasticsearch import ElasticsearchWriter

ROLLUP_INDEX = "flowstat-node-10s"  # not flowstat-samples-...: the samples' pattern (and views) must not see it
EVERY_S = 10  # InfluxDB's flowstat_node_10s bucket (influxdb.ROLLUP_BUCKETS)
SETTLE_S = 2.0  # a window is first rolled up this long after its end: samples are queryable within about 1 s
RESAMPLE_S = 300  # and again, for this long after, whenever its samples' count changes
PAGE = 2_000  # composite buckets (series) per request: bounded memory, whatever the number of nodes
MAX_BACK_S = 86_400.0  # a rollup catches up at most this far back (an outage, a stop)
COUNT_SPAN_MS = 3_600_000  # windows counted per request: an hour (well under search.max_buckets)

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
    until_ms: int = 0  # the end of the last window counted, and rolled up where it had to be
    stopped: bool = False  # stopped early (asked to): the windows after until_ms wait for the next pass


@dataclass
class Rollup:
    """Rolls ``source`` (its daily indices SOURCE-YYYY.MM.DD) up into ``target``'s, through ``store``
    (its nodes, credentials and failover)."""

    store: ElasticsearchWriter
    source: str = SAMPLES_INDEX
    target: str = ROLLUP_INDEX
    resample_s: float = RESAMPLE_S
    settle_s: float = SETTLE_S
    max_back_s: float = MAX_BACK_S
    clock: Callable[[], float] = time.time
    counted: dict[int, int] = field(default_factory=dict)  # window start (ms) -> samples its rollup averages
    # The first window still to recount however old (None: only the resample span), and until when
    # (clock seconds; None: until RESAMPLE_S after the next good pass). Set by a pass the store did not
    # let finish: what arrives late after an outage (the agents' spools) is counted again for as long
    # after the store's return as a late sample of any window is.
    hold_ms: int | None = None
    hold_until_s: float | None = None
    next_ms: int | None = None  # where the last complete pass ended: the next one starts there at the latest
    # None: a request the store does not answer now fails the pass (the live rollup's next pass starts
    # there). A policy: each request is asked again while the store is down or slow, as a write is (a
    # one-off roll-up: a replay's, `flowstat rollup --run`), every one of them idempotent.
    retry: RetryPolicy | None = None
    run_id: str | None = None  # one run's samples alone (a replay's)

    # -- passes ---------------------------------------------------------------------------------
    def tick(self, on_window: Callable[[Pass], bool] | None = None) -> Pass:
        """One pass of the live rollup: every window ended SETTLE_S ago that is new, or whose count
        changed within the resample span (or since an outage began: ``hold_ms``). StoreDown when the
        store cannot be read or written: the next pass starts at this one's beginning.
        ``on_window``: called after each window; False stops the pass there."""
        now_s = self.clock()
        now_ms = int(now_s * 1000)
        hi = window_of(now_ms - int(self.settle_s * 1000))
        lo = window_of(now_ms - int(self.resample_s * 1000))
        for since in (self.next_ms, self.hold_ms):
            if since is not None:
                lo = min(lo, max(since, window_of(now_ms - int(self.max_back_s * 1000))))
        try:
            done = self.roll(lo, hi, only_changed=True, on_window=on_window)
        except StoreDown:
            self.hold_ms, self.hold_until_s = (lo if self.hold_ms is None else min(lo, self.hold_ms)), None
            raise
        self.next_ms = done.until_ms if done.stopped else hi
        if done.stopped:  # asked to stop: the rest next time, and what it did held as after an outage
            self.hold_ms, self.hold_until_s = (lo if self.hold_ms is None else min(lo, self.hold_ms)), None
        elif self.hold_ms is not None:
            if self.hold_until_s is None:
                self.hold_until_s = now_s + self.resample_s
            elif now_s >= self.hold_until_s:
                self.hold_ms = self.hold_until_s = None
        for w in [w for w in self.counted if w < lo]:
            del self.counted[w]
        return done

    def roll(
        self,
        from_ms: int,
        to_ms: int,
        *,
        only_changed: bool = False,
        on_window: Callable[[Pass], bool] | None = None,
    ) -> Pass:
        """Roll up every window starting in [from_ms, to_ms) (aligned down to windows), an hour of
        windows per count; with ``only_changed``, only those whose sample count differs from what
        their rollup averages."""
        out = Pass(until_ms=window_of(from_ms))
        for lo in range(window_of(from_ms), to_ms, COUNT_SPAN_MS):
            counts = self.counts(lo, min(lo + COUNT_SPAN_MS, to_ms))
            for w, n in sorted(counts.items()):
                out.windows_counted += 1
                if n and (not only_changed or self.counted.get(w) != n):
                    written, refused, averaged = self.roll_window(w)
                    out.windows_rolled += 1
                    out.documents += written
                    out.refused += refused
                    n = averaged  # what arrives between the count and the rollup is counted next pass
                self.counted[w] = n
                out.until_ms = w + EVERY_S * 1000
                if on_window is not None and not on_window(out):
                    out.stopped = True
                    return out
        return out

    def resume(self, since_ms: int | None = None) -> int | None:
        """Start the next pass at ``since_ms`` (the end of what a stopped rollup had done, from its
        status file), else at the last window the rollup's indices hold: a rollup stopped for a
        while catches up (MAX_BACK_S at most). Returns where, or None."""
        if since_ms is None:
            body = {"size": 0, "aggs": {"last": {"max": {"field": "time"}}}}
            aggs = self._search(daily_indices(self.target), body).get("aggregations") or {}
            last = (aggs.get("last") or {}).get("value")
            if last is None:
                return None
            since_ms = int(last)
        self.next_ms = max(window_of(since_ms), window_of(int((self.clock() - self.max_back_s) * 1000)))
        return self.next_ms

    # -- the store --------------------------------------------------------------------------------
    def counts(self, from_ms: int, to_ms: int) -> dict[int, int]:
        """Samples per window starting in [from_ms, to_ms), empty windows included."""
        if to_ms <= from_ms:
            return {}
        body = {
            "size": 0,
            "query": self._samples_between(from_ms, to_ms),
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
        aggs = self.search(body).get("aggregations")
        if not aggs:  # no samples index yet: nothing to count
            return {}
        return {int(b["key"]): b["doc_count"] for b in aggs["w"]["buckets"]}

    def roll_window(self, w: int) -> tuple[int, int, int]:
        """Roll one window up; (documents written, refused, samples they average)."""
        written = refused = averaged = 0
        for docs in self._pages(w):
            index = self.index_of(w)
            body = b"".join(index_action(index, doc_id) + orjson.dumps(doc) + b"\n" for doc_id, doc in docs)
            outcome: Outcome = (
                self.store.write(body, len(docs), self.retry) if self.retry else self.store.post(body, len(docs))
            )
            if outcome.forbidden:  # who we are, not the data: as a request answered 403
                raise StoreAuthError(outcome.forbidden, "forbidden")
            if outcome.retry is not None:  # some documents not taken for now: the window again, later
                raise StoreDown(
                    f"{self.store.title} at {self.store.url}: {outcome.retry_count} rollup documents refused for now"
                )
            for reason in outcome.reasons:
                log.error("rollup of %s: refused: %s", iso_utc_from_ms(w), reason)
            written += outcome.accepted
            refused += outcome.refused
            averaged += sum(doc["samples"] for _, doc in docs)
        return written, refused, averaged

    def index_of(self, w: int) -> str:
        """The daily index of the window starting at ``w`` (ms): its UTC day, as the samples'."""
        return daily_index(self.target, w * 1_000_000)

    def _pages(self, w: int) -> Iterator[list[tuple[str, dict[str, Any]]]]:
        """The window's rollup documents, a page of series at a time. A document per series, as
        InfluxDB's GROUP BY *: a node whose role or host changes within a window (its last sample,
        taken once it is gone, may know no role) has a document for each."""
        names, fields = tags(), rolled_fields()
        body: dict[str, Any] = {
            "size": 0,
            "query": self._samples_between(w, w + EVERY_S * 1000),
            "aggs": {
                "nodes": {
                    "composite": {"size": PAGE, "sources": [{t: {"terms": {"field": t}}} for t in names]},
                    "aggs": {f: {"avg": {"field": f}} for f in fields},
                }
            },
        }
        stamp = iso_utc_from_ms(w)
        while True:
            agg = (self.search(body).get("aggregations") or {}).get("nodes")
            if not agg:  # the index went away (retention) since it was counted
                return
            docs = []
            for b in agg["buckets"]:
                key = b["key"]
                doc: dict[str, Any] = {"time": stamp, **key, "samples": b["doc_count"]}
                doc.update({f"mean_{f}": b[f]["value"] for f in fields if b[f]["value"] is not None})
                docs.append((document_id(key, w), doc))
            if docs:
                yield docs
            if "after_key" not in agg or len(agg["buckets"]) < PAGE:
                return
            body["aggs"]["nodes"]["composite"]["after"] = agg["after_key"]

    def _samples_between(self, from_ms: int, to_ms: int) -> dict[str, Any]:
        """The query of the samples in [from_ms, to_ms) (of run_id alone, if set)."""
        span: dict[str, Any] = {"range": {"time": {"gte": from_ms, "lt": to_ms, "format": "epoch_millis"}}}
        return span if self.run_id is None else {"bool": {"filter": [span, {"term": {"run_id": self.run_id}}]}}

    def search(self, body: dict[str, Any]) -> dict[str, Any]:
        """A search of the source's daily indices (the answer, parsed)."""
        return self._search(daily_indices(self.source), body)

    def _search(self, index: str, body: dict[str, Any]) -> dict[str, Any]:
        """The answer, parsed; asked again while the store cannot give it whole when ``retry`` says so."""
        if self.retry is None:
            return self._search_once(index, body)
        return self.store.retried(lambda: self._search_once(index, body), self.retry)

    def _search_once(self, index: str, body: dict[str, Any]) -> dict[str, Any]:
        """The answer, parsed. StoreDown also when a shard failed or the search timed out: a part of
        the answer must not pass for the whole."""
        url = f"{self.store.url}/{index}/_search?ignore_unavailable=true&allow_no_indices=true"
        resp = self.store._http("POST", url, orjson.dumps(body), "application/json", action=f"read {index}")
        if resp.status_code >= 300:
            raise RollupError(
                f"{self.store.title} at {self.store.url}/{index}/_search: HTTP {resp.status_code}: {resp.text[:300]}"
            )
        answer: dict[str, Any] = orjson.loads(resp.content)
        shards = answer.get("_shards") or {}
        if shards.get("failed") or answer.get("timed_out"):
            raise StoreDown(
                f"{self.store.title} at {self.store.url}/{index}/_search: a partial answer "
                f"({shards.get('failed', 0)} of {shards.get('total', '?')} shards failed, timed out: "
                f"{bool(answer.get('timed_out'))})"
            )
        return answer


def document_id(key: dict[str, str], w: int) -> str:
    """A rollup document's id: its series (every tag, in schema order) and its window's start (ms)."""
    return "/".join(key[t] for t in tags()) + f"/{w}"


def daily_indices(prefix: str) -> str:
    """The daily indices PREFIX-YYYY.MM.DD of the years 1000 to 2999, and only those: PREFIX-* would
    also take PREFIX-OTHER-... (a test's samples beside flowstat-samples, the rollup of another index
    beside flowstat-node-10s)."""
    return f"{prefix}-1*,{prefix}-2*"
