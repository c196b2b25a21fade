"""Elasticsearch (and OpenSearch): ``_bulk`` with deterministic ``_id``s, so that a resend overwrites
instead of duplicating; index templates derived from the schemas as its set-up.

Samples and self-samples go to daily indices named by the UTC day of each document's own time
(flowstat-samples-2026.11.26): a sample resent, even weeks later, lands in the index it went to the
first time and overwrites itself there, and retention deletes whole days (a delete-only lifecycle
policy that dates each index by its name, docs/ingest.md). Run documents go to one index. flowstat
verdict's verdicts and edge rates go to daily indices of their own (flowstat-verdicts-..., flowstat-edges-...)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from flowstat.schema import agent as agent_schema
from flowstat.schema import flow as flow_schema
from flowstat.schema import run as run_schema
from flowstat.schema import sample as sample_schema
from flowstat.timeutil import iso_utc_from_ms

from . import elasticsearch_rollup as rollup
from ._base import (
    DEFAULT_RETRY,
    MAX_REASONS,
    BatchEncoder,
    Outcome,
    StoreAuthError,
    StoreDown,
    Writer,
    error_reason,
    log,
    shortened,
)
from ._es_common import _DAY_NS, ES_TYPES, _day, index_action
from ._es_common import AGENTS_INDEX as AGENTS_INDEX  # the names the other layers import from here
from ._es_common import DATE as DATE
from ._es_common import EDGES_INDEX as EDGES_INDEX
from ._es_common import FLOW_INDICES as FLOW_INDICES
from ._es_common import RUNS_INDEX as RUNS_INDEX
from ._es_common import SAMPLES_INDEX as SAMPLES_INDEX
from ._es_common import VERDICTS_INDEX as VERDICTS_INDEX
from ._es_common import daily_index as daily_index

RETENTION_DAYS = 90  # samples, self-samples, the rollup, verdicts and edge rates; run documents are kept
MIGRATE_PAGE = 5000  # documents moved per request from an older flowstat's index
UPGRADED = {  # index (pattern INDEX*) -> its mapping
    SAMPLES_INDEX: "sample",
    AGENTS_INDEX: "agent",
    RUNS_INDEX: "run",
    VERDICTS_INDEX: "verdict",
    EDGES_INDEX: "edge",
}

# The head of a _bulk answer that stored every document: "errors" before the items, first (Elasticsearch
# 8.19 here) or after "took" (older Elasticsearch, OpenSearch)
_ALL_STORED = re.compile(rb'\s*\{\s*(?:"took"\s*:\s*\d+\s*,\s*)?"errors"\s*:\s*false\s*[,}]')


class _BulkEncoder(BatchEncoder[bytes]):
    wants = "json"

    def __init__(self, index: str) -> None:
        self.index = index
        self.heads: dict[int, bytes] = {}  # a day's action line, made once

    def head(self, day: int) -> bytes:
        if day not in self.heads:
            self.heads[day] = b'{"index":{"_index":' + orjson.dumps(f"{self.index}-{_day(day)}") + b',"_id":%s}}\n'
        return self.heads[day]

    def encode(self, encoded: list[bytes], ids: list[str], stamps: list[int]) -> bytes:
        head, dumps = self.head, orjson.dumps
        return b"".join(
            [head(ns // _DAY_NS) % dumps(i) + doc + b"\n" for i, doc, ns in zip(ids, encoded, stamps, strict=False)]
        )


def _first_index(body: bytes) -> str:
    """The index of a _bulk body's first action (what a 403 to the batch refused)."""
    try:
        index: str = next(iter(orjson.loads(body[: body.index(b"\n")]).values()))["_index"]
    except (ValueError, KeyError, StopIteration, TypeError, AttributeError):
        return ""
    return index


def bulk_outcome(body: bytes, answer: dict[str, Any]) -> Outcome:
    """What a ``_bulk`` answer with ``errors: true`` says about each document of ``body`` (an
    action line and a document line per item, as this module writes them): taken (2xx), to send
    again (429, 5xx, no status at all, and 403: the user may not write that index, which other
    credentials can change), or refused with its reason (any other status). The first 403's
    ``write INDEX`` and reason are in ``forbidden``, a line apart."""
    lines = body.splitlines(keepends=True)
    out = Outcome()
    again: list[bytes] = []
    items = answer.get("items", [])
    for i, item in enumerate(items):
        result = next(iter(item.values()))
        status = result.get("status")
        if isinstance(status, int) and 200 <= status < 300:
            out.accepted += 1
        elif not isinstance(status, int) or status in (403, 429) or status >= 500:
            again += lines[2 * i : 2 * i + 2]
            out.retry_count += 1
            if status == 403 and not out.forbidden:
                out.forbidden = f"write {result.get('_index')}\n{error_reason(result.get('error'))}"
        else:
            out.refused += 1
            if len(out.reasons) < MAX_REASONS:
                error = result.get("error") or {}
                why = f"{error.get('type')}: {error.get('reason')}" if isinstance(error, dict) else str(error)
                out.reasons.append(f"document {result.get('_id')}: HTTP {status}: {shortened(why)}")
    missing = lines[2 * len(items) :]  # documents the answer says nothing of: not known to be stored
    again += missing
    out.retry_count += len(missing) // 2
    if again:
        out.retry = b"".join(again)
    return out


class ElasticsearchWriter(Writer):
    name = "elasticsearch"
    title = "Elasticsearch"
    default_port = 9200
    target_kind = "index"
    default_target = SAMPLES_INDEX
    option = "es"
    target_option = "index"
    health_path = "/_cluster/health"
    content_type = "application/x-ndjson"
    auth_prefix = "FLOWSTAT_ES"
    auth_key = ("API_KEY", "ApiKey")
    multi_node = True  # http://HOST:PORT,HOST:PORT: every node of a cluster, failed over (see _base)

    def encode(self, samples: Iterable[dict[str, Any]]) -> bytes:
        return b"".join(
            index_action(daily_index(self.target, sample_schema.time_ns(s["time"])), sample_schema.document_id(s))
            + sample_schema.to_json(s).encode()
            + b"\n"
            for s in samples
        )

    def encoder(self) -> BatchEncoder[Any]:
        return _BulkEncoder(self.target)

    def encode_run(self, doc: dict[str, Any]) -> bytes:
        return index_action(RUNS_INDEX, doc["run_id"]) + orjson.dumps(doc) + b"\n"

    def encode_self_samples(self, docs: Iterable[dict[str, Any]]) -> bytes:
        return b"".join(
            index_action(daily_index(AGENTS_INDEX, sample_schema.time_ns(d["time"])), agent_schema.document_id(d))
            + agent_schema.to_json(d).encode()
            + b"\n"
            for d in docs
        )

    def encode_flow(self, kind: str, docs: Iterable[dict[str, Any]]) -> bytes:
        index = FLOW_INDICES[kind]
        return b"".join(
            index_action(daily_index(index, sample_schema.time_ns(d["time"])), flow_schema.document_id(kind, d))
            + flow_schema.to_json(kind, d).encode()
            + b"\n"
            for d in docs
        )

    def post(self, body: bytes, count: int) -> Outcome:
        resp = self._http("POST", f"{self.url}/_bulk", body, action=lambda: f"write {_first_index(body)}")
        if resp.status_code >= 300:
            return Outcome(
                refused=count,
                reasons=[f"{self.title} {self.url}/_bulk: HTTP {resp.status_code}: " f"{resp.text.strip()[:300]}"],
            )
        if _ALL_STORED.match(resp.content):
            # Its items (an object per document) are not read: thousands of them for each request
            # of a backlog, parsed and dropped, leave the small-object allocator's arenas grown for
            # good (issue 28, flowstat.agent.memory).
            return Outcome(accepted=count)
        try:
            answer = resp.json()
        except ValueError:
            raise StoreDown(
                f"{self.title} at {self.url}/_bulk: HTTP {resp.status_code} but not a _bulk answer "
                f"({resp.text[:100]!r}): is it {self.title}?"
            ) from None
        if not answer.get("errors"):
            return Outcome(accepted=count)
        out = bulk_outcome(body, answer)
        out.reasons = [self.auth.redact(r) for r in out.reasons]  # a store may echo what it was sent
        if out.forbidden:  # documents answered 403: kept, as a batch answered 403 is; who may not write where
            action, reason = out.forbidden.split("\n", 1)
            out.forbidden = self.forbidden(action, shortened(self.auth.redact(reason)))
        return out

    def loaded(self, start_ns: int, end_ns: int, run_id: str | None = None) -> None:
        """Roll the replayed samples up (the live rollup, flowstat rollup, rolls up recent windows only),
        each request asked again while the store is down or slow, as the samples' writes are.
        A user who may write samples but not read them (the compose stack's flowstat_agent) is told
        how to have them rolled up, and the replay goes on: the samples are stored."""
        try:
            self.ask("POST", f"{self.url}/{self.target}-*/_refresh", action=f"refresh {self.target}-*")
            rollup.Rollup(
                self, source=self.target, target=rollup.rollup_index(self.target), retry=DEFAULT_RETRY, run_id=run_id
            ).roll(start_ns // 1_000_000, end_ns // 1_000_000 + 1)
        except StoreAuthError as exc:
            log.warning(
                "%s: the samples are stored, not rolled up (%s); `flowstat rollup --from %s --to %s` as a user "
                "who may read them (the compose stack's flowstat_rollup) does it",
                self.shown_url,
                exc,
                iso_utc_from_ms(start_ns // 1_000_000),
                iso_utc_from_ms(end_ns // 1_000_000 + 1),
            )

    # -- set-up ---------------------------------------------------------------------------------
    def install(self) -> list[str]:
        """PUT every template (idempotent); the lifecycle policy only where the server has ILM."""
        files = templates()
        done: list[str] = []

        def put(path: str, body: dict[str, Any]) -> None:
            resp = self._http("PUT", f"{self.url}/{path}", json.dumps(body).encode(), "application/json")
            if resp.status_code >= 300:
                raise RuntimeError(f"elasticsearch {path}: HTTP {resp.status_code}: {resp.text[:300]}")
            done.append(path)

        for name in (
            "flowstat-settings",
            "flowstat-sample-mappings",
            "flowstat-run-mappings",
            "flowstat-agent-mappings",
            "flowstat-node-10s-mappings",
            "flowstat-verdict-mappings",
            "flowstat-edge-mappings",
        ):
            put(f"_component_template/{name}", files[f"component-{name}.json"])
        ilm = ""
        if self._http("GET", f"{self.url}/_ilm/status").status_code == 200:
            put("_ilm/policy/flowstat", files["ilm-policy-flowstat.json"])
            put("_component_template/flowstat-lifecycle", files["component-flowstat-lifecycle.json"])
            ilm = "-ilm"
        put("_index_template/flowstat-samples", files[f"index-template-flowstat-samples{ilm}.json"])
        put("_index_template/flowstat-agents", files[f"index-template-flowstat-agents{ilm}.json"])
        put("_index_template/flowstat-runs", files["index-template-flowstat-runs.json"])
        put("_index_template/flowstat-node-10s", files[f"index-template-flowstat-node-10s{ilm}.json"])
        put("_index_template/flowstat-verdicts", files[f"index-template-flowstat-verdicts{ilm}.json"])
        put("_index_template/flowstat-edges", files[f"index-template-flowstat-edges{ilm}.json"])
        done += self._upgrade_indices(files)
        done += self.migrate_legacy()
        return done

    def migrate_legacy(self, page: int = MIGRATE_PAGE) -> list[str]:
        """Move the documents of an index an older flowstat wrote into (flowstat-samples,
        flowstat-agents: one index for all days) into the daily indices this version writes, each
        under its own id, then delete the old index. Safe to interrupt and run again: a document
        copied twice overwrites itself. Returns what was done."""
        done: list[str] = []
        for legacy in (SAMPLES_INDEX, AGENTS_INDEX):
            resp = self._http("GET", f"{self.url}/{legacy}/_count")
            if resp.status_code == 404:
                continue
            if resp.status_code >= 300 or "count" not in resp.json():
                raise RuntimeError(f"elasticsearch {legacy}: cannot count its documents: HTTP {resp.status_code}")
            if self._http("GET", f"{self.url}/_alias/{legacy}").status_code == 200:
                continue  # an alias, not an index of an older flowstat: not ours to move
            total, moved = resp.json()["count"], 0
            for hits in self._scroll(legacy, page):
                body = b"".join(
                    index_action(daily_index(legacy, sample_schema.time_ns(h["_source"]["time"])), h["_id"])
                    + orjson.dumps(h["_source"])
                    + b"\n"
                    for h in hits
                )
                outcome = self.write(body, len(hits))
                if outcome.refused:
                    raise RuntimeError(
                        f"elasticsearch {legacy}: {outcome.refused} documents could not be moved to "
                        f"daily indices ({'; '.join(outcome.reasons)}); the old index is kept"
                    )
                moved += outcome.accepted
            if moved != total:
                raise RuntimeError(
                    f"elasticsearch {legacy}: {moved} of its {total} documents moved to daily "
                    f"indices; the old index is kept (run the set-up again)"
                )
            self._http("POST", f"{self.url}/{legacy}-*/_refresh")
            self._http("DELETE", f"{self.url}/{legacy}")
            done.append(f"{legacy}: {total} documents moved to daily indices {legacy}-YYYY.MM.DD")
        return done

    def _scroll(self, index: str, page: int) -> Iterator[list[dict[str, Any]]]:
        """Every document of ``index``, a page at a time (the scroll API: no sort needed, none missed)."""
        resp = self._http(
            "POST",
            f"{self.url}/{index}/_search",
            json.dumps({"size": page, "sort": ["_doc"]}).encode(),
            "application/json",
            params={"scroll": "2m"},
        )
        answer = resp.json()
        try:
            while answer.get("hits", {}).get("hits"):
                yield answer["hits"]["hits"]
                answer = self._http(
                    "POST",
                    f"{self.url}/_search/scroll",
                    json.dumps({"scroll": "2m", "scroll_id": answer["_scroll_id"]}).encode(),
                    "application/json",
                ).json()
        finally:
            if "_scroll_id" in answer:
                self._http(
                    "DELETE",
                    f"{self.url}/_search/scroll",
                    json.dumps({"scroll_id": answer["_scroll_id"]}).encode(),
                    "application/json",
                )

    def _upgrade_indices(self, files: dict[str, Any]) -> list[str]:
        """A template shapes only the indices created after it: indices made by an older flowstat get
        its new fields too (a strict mapping would refuse a document holding one). A field whose type
        changed cannot be; that index is named, for the person to reindex or delete it."""
        done: list[str] = []
        for index in UPGRADED:
            body = json.dumps(files[f"mapping-{index}.json"]).encode()
            resp = self._http("PUT", f"{self.url}/{index}*/_mapping", body, "application/json")
            if resp.status_code == 404:  # no index yet: the template will shape it
                continue
            if resp.status_code >= 300:
                raise RuntimeError(
                    f"elasticsearch {index}*: an existing index's mapping cannot take this "
                    f"version's fields (HTTP {resp.status_code}: {resp.text[:300]}); reindex "
                    f"or delete that index"
                )
            done.append(f"{index}*/_mapping")
        return done

    @classmethod
    def setup_files(cls) -> dict[str, str]:
        # Compact: sent as they are (install.sh, flowstat provision), never edited (the schemas are the
        # source, docs/schema.md their tables).
        return {name: json.dumps(doc, separators=(",", ":")) + "\n" for name, doc in templates().items()}


def mapping(props: dict[str, Any]) -> dict[str, Any]:
    """An explicit Elasticsearch mapping of a schema's properties: keyword for strings, date for
    date-times, long/double/boolean as the schema says, objects field by field; an array maps as
    its items do (an array of objects as one object: not nested, its items' fields are searched
    together)."""
    out: dict[str, Any] = {}
    for name, p in props.items():
        leaf = p["items"] if p["type"] == "array" else p
        if leaf["type"] == "object":
            out[name] = {"properties": mapping(leaf["properties"])}
        else:
            out[name] = DATE if leaf.get("format") == "date-time" else ES_TYPES[leaf["type"]]
    return out


def templates() -> dict[str, dict[str, Any]]:
    """Every template, by file name. Mappings are strict: a field outside the schema is refused
    rather than guessed."""
    # one replica once a second node is there (docker-compose.es-cluster.yml), none on a single node
    settings: dict[str, Any] = {
        "template": {"settings": {"number_of_shards": 1, "auto_expand_replicas": "0-1", "refresh_interval": "1s"}}
    }
    mappings: dict[str, dict[str, Any]] = {
        name: {"dynamic": "strict", "properties": mapping(module.schema()["properties"])}
        for name, module in (("sample", sample_schema), ("run", run_schema), ("agent", agent_schema))
    }
    for kind in FLOW_INDICES:
        mappings[kind] = {"dynamic": "strict", "properties": mapping(flow_schema.schema(kind)["properties"])}
    flow_files = {"verdict": flow_schema.VERDICT_FILE, "edge": flow_schema.EDGE_FILE}
    flow_what = {
        "verdict": "flowstat verdict's verdicts: which node holds a run's flow back, one per run and evaluation",
        "edge": "flowstat verdict's edge rates: the objects/s on each edge of a run, one per edge and evaluation",
    }
    return {
        "component-flowstat-settings.json": settings,
        "component-flowstat-sample-mappings.json": {
            "template": {"mappings": mappings["sample"]},
            "_meta": {"source": f"flowstat/schema/{sample_schema.SCHEMA_FILE}"},
        },
        "component-flowstat-run-mappings.json": {
            "template": {"mappings": mappings["run"]},
            "_meta": {"source": f"flowstat/schema/{run_schema.SCHEMA_FILE}"},
        },
        "component-flowstat-agent-mappings.json": {
            "template": {"mappings": mappings["agent"]},
            "_meta": {"source": f"flowstat/schema/{agent_schema.SCHEMA_FILE}"},
        },
        "component-flowstat-node-10s-mappings.json": {
            "template": {"mappings": rollup.mappings()},
            "_meta": {"source": f"flowstat/schema/{sample_schema.SCHEMA_FILE} (its tags, and the mean of each number)"},
        },
        **{
            f"component-flowstat-{kind}-mappings.json": {
                "template": {"mappings": mappings[kind]},
                "_meta": {"source": f"flowstat/schema/{flow_files[kind]}"},
            }
            for kind in FLOW_INDICES
        },
        # The same mappings, PUT into the indices an older flowstat made (PATTERN/_mapping): a
        # template shapes only the indices created after it.
        **{f"mapping-{index}.json": mappings[kind] for index, kind in UPGRADED.items()},
        "index-template-flowstat-samples.json": {
            "index_patterns": [f"{SAMPLES_INDEX}*"],
            "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-sample-mappings"],
            "_meta": {"description": "flowstat samples: one document per node per agent per interval"},
        },
        "index-template-flowstat-agents.json": {
            "index_patterns": [f"{AGENTS_INDEX}*"],
            "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-agent-mappings"],
            "_meta": {"description": "flowstat agents' self-samples: one document per agent per --self-interval"},
        },
        "index-template-flowstat-runs.json": {
            "index_patterns": [f"{RUNS_INDEX}*"],
            "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-run-mappings"],
            "_meta": {"description": "flowstat runs: one document per run"},
        },
        "index-template-flowstat-node-10s.json": {
            "index_patterns": [f"{rollup.ROLLUP_INDEX}*"],
            "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-node-10s-mappings"],
            "_meta": {"description": "flowstat's per-node rollup: per node and 10 s, the mean of each sample field"},
        },
        **{
            f"index-template-{index}.json": {
                "index_patterns": [f"{index}*"],
                "priority": 200,
                "composed_of": ["flowstat-settings", f"flowstat-{kind}-mappings"],
                "_meta": {"description": flow_what[kind]},
            }
            for kind, index in FLOW_INDICES.items()
        },
        # Used where the server has ILM (the compose stack's Elasticsearch); the Maven test zip has not.
        # Delete-only: each daily index is dated by its name (the day of its documents, not the day it
        # was made: a replay of last month's runs makes indices that are a month old), and deleted
        # RETENTION_DAYS after it. No rollover: writers choose the index by the document's own day.
        "ilm-policy-flowstat.json": {
            "policy": {
                "phases": {"delete": {"min_age": f"{RETENTION_DAYS}d", "actions": {"delete": {}}}},
                "_meta": {
                    "description": "flowstat's daily indices (PREFIX-YYYY.MM.DD), deleted "
                    f"{RETENTION_DAYS} days after the day they hold"
                },
            }
        },
        "component-flowstat-lifecycle.json": {
            "template": {
                "settings": {"index.lifecycle.name": "flowstat", "index.lifecycle.parse_origination_date": True}
            }
        },
        "index-template-flowstat-samples-ilm.json": {
            "index_patterns": [f"{SAMPLES_INDEX}*"],
            "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-sample-mappings", "flowstat-lifecycle"],
            "_meta": {"description": "flowstat samples, with the flowstat lifecycle policy (servers with ILM)"},
        },
        "index-template-flowstat-node-10s-ilm.json": {
            "index_patterns": [f"{rollup.ROLLUP_INDEX}*"],
            "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-node-10s-mappings", "flowstat-lifecycle"],
            "_meta": {
                "description": "flowstat's per-node rollup, with the flowstat lifecycle policy (servers with ILM)"
            },
        },
        "index-template-flowstat-agents-ilm.json": {
            "index_patterns": [f"{AGENTS_INDEX}*"],
            "priority": 200,
            "composed_of": ["flowstat-settings", "flowstat-agent-mappings", "flowstat-lifecycle"],
            "_meta": {
                "description": "flowstat agents' self-samples, with the flowstat lifecycle policy (servers with ILM)"
            },
        },
        **{
            f"index-template-{index}-ilm.json": {
                "index_patterns": [f"{index}*"],
                "priority": 200,
                "composed_of": ["flowstat-settings", f"flowstat-{kind}-mappings", "flowstat-lifecycle"],
                "_meta": {"description": f"{flow_what[kind]}, with the flowstat lifecycle policy (servers with ILM)"},
            }
            for kind, index in FLOW_INDICES.items()
        },
    }
