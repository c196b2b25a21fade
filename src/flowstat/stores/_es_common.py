"""What Elasticsearch's writer and its rollup share: the indices' names, how a document's day names
its index, a ``_bulk`` action line, the schema types' mapping."""

from __future__ import annotations

import functools
from datetime import date

import orjson

SAMPLES_INDEX = "flowstat-samples"
RUNS_INDEX = "flowstat-runs"
AGENTS_INDEX = "flowstat-agents"  # the agents' self-samples, whatever the samples index is called (the C agent's too)
VERDICTS_INDEX = "flowstat-verdicts"  # flowstat verdict's verdicts (schema/verdict.schema.json), daily
EDGES_INDEX = "flowstat-edges"  # ... and the objects/s on each edge (schema/edge.schema.json), daily
FLOW_INDICES = {"verdict": VERDICTS_INDEX, "edge": EDGES_INDEX}  # flowstat.schema.flow's kinds -> their indices
ES_TYPES = {
    "integer": {"type": "long"},
    "number": {"type": "double"},
    "boolean": {"type": "boolean"},
    "string": {"type": "keyword", "ignore_above": 256},
}
DATE = {"type": "date", "format": "strict_date_optional_time||epoch_millis"}

_DAY_NS = 86_400 * 10**9
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


@functools.lru_cache(maxsize=256)
def _day(days_since_epoch: int) -> str:
    """YYYY.MM.DD, the year in four digits as ILM's origination date parser takes it (the C agent pads too):
    strftime's %Y gives 999 for the year 999 on glibc, a name ILM refuses to create an index by."""
    d = date.fromordinal(_EPOCH_ORDINAL + days_since_epoch)
    return f"{d.year:04d}.{d.month:02d}.{d.day:02d}"


def daily_index(prefix: str, ns: int) -> str:
    """The index of a document of time ``ns``: PREFIX-YYYY.MM.DD, its UTC day."""
    return f"{prefix}-{_day(ns // _DAY_NS)}"


def index_action(index: str, doc_id: str) -> bytes:
    """The ``_bulk`` line that writes the next document into ``index`` under ``doc_id`` (overwriting)."""
    return b'{"index":{"_index":' + orjson.dumps(index) + b',"_id":' + orjson.dumps(doc_id) + b"}}\n"
