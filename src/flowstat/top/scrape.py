"""An agent's ``/metrics``, read: the Prometheus text (format 0.0.4 or OpenMetrics 1.0) parsed into
each node's latest sample, as ``flowstat top`` shows it.

The families are the sample schema's own (flowstat.schema.prometheus: ``flowstat_node_busy_ratio``,
``flowstat_node_objects_received_total``...), turned back into the sample's fields and units
(``input_latency_p50_seconds`` -> ``input_latency_p50_ms``). A scrape that fails says why in a few
words (``connection refused``, ``HTTP 404``, ``no flowstat metrics``), never with a traceback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import requests

from flowstat.schema import prometheus

# The sample fields top reads, each from its family (counters by their _total sample).
FIELDS = (
    "node_state",
    "busy_ratio",
    "backpressured_ratio",
    "idle_ratio",
    "busy_seconds",
    "backpressured_seconds",
    "idle_seconds",
    "objects_received",
    "objects_sent",
    "input_latency_p50_ms",
)
_BY_NAME: dict[str, prometheus.Family] = {
    f.sample_name(): f for f in prometheus.NODE_FAMILIES if f.field in FIELDS
}  # sample name -> family
_STATE = next(f for f in prometheus.NODE_FAMILIES if f.field == "node_state")

ACCEPT = "text/plain; version=0.0.4"  # the simpler of the two formats both agents serve
MAX_BYTES = 64 << 20  # a /metrics of 10,000 nodes is about 25 MB (35 series a node)


class MetricsError(ValueError):
    """What is wrong with an answer (not Prometheus text, no flowstat families), in a few words."""


@dataclass
class NodeSample:
    """One node's latest sample, as an agent serves it: the labels, and the fields top reads
    (None: absent from the exposition, e.g. a node that does not account its time)."""

    node_id: str
    role: str = ""
    host: str = ""
    agent: str = ""
    values: dict[str, float] = field(default_factory=dict)
    state: str | None = None

    def get(self, name: str) -> float | None:
        return self.values.get(name)


@dataclass
class Scrape:
    """One agent's answer: its nodes' samples by node id, or what went wrong (``error``)."""

    url: str
    nodes: dict[str, NodeSample] = field(default_factory=dict)
    error: str | None = None


# -- the text format --------------------------------------------------------------------------------
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def parse(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition: (name, labels, value); comments and blank lines skipped.
    MetricsError names the first line that is not the text format (a page that is not /metrics)."""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            yield _sample(line)
        except (ValueError, IndexError):
            shown = line if len(line) <= 60 else line[:57] + "..."
            raise MetricsError(f"not the Prometheus text format: line {lineno}: {shown!r}") from None


def _sample(line: str) -> tuple[str, dict[str, str], float]:
    m = _NAME.match(line)
    if not m:
        raise ValueError("no metric name")
    name, i = m.group(), m.end()
    labels: dict[str, str] = {}
    if i < len(line) and line[i] == "{":
        i += 1
        while True:
            while line[i] in " ,":
                i += 1
            if line[i] == "}":
                i += 1
                break
            lm = _LABEL_NAME.match(line, i)
            if not lm or line[lm.end()] != "=" or line[lm.end() + 1] != '"':
                raise ValueError("bad label")
            i = lm.end() + 2
            chars = []
            while line[i] != '"':
                if line[i] == "\\":
                    chars.append(_ESCAPES.get(line[i + 1], line[i + 1]))
                    i += 2
                else:
                    chars.append(line[i])
                    i += 1
            labels[lm.group()] = "".join(chars)
            i += 1
    rest = line[i:].split()
    if not rest:  # the value, then a timestamp or (OpenMetrics) an exemplar, unread
        raise ValueError("no value")
    return name, labels, float(rest[0])


def node_samples(text: str) -> dict[str, NodeSample]:
    """Each node's sample (by node id) from an agent's exposition. MetricsError: not the text
    format, or no flowstat family at all (not a flowstat agent's /metrics, or an agent that has
    sampled nothing yet: it serves only its process_* metrics)."""
    nodes: dict[str, NodeSample] = {}
    flowstat = False
    for name, labels, value in parse(text):
        if not name.startswith("flowstat_"):
            continue
        flowstat = True
        node_id = labels.get("node_id")
        if not node_id or not name.startswith("flowstat_node_"):
            continue
        node = nodes.get(node_id)
        if node is None:
            node = nodes[node_id] = NodeSample(
                node_id, labels.get("role", ""), labels.get("host", ""), labels.get("agent", "")
            )
        if name == _STATE.name:
            if value == 1 and _STATE.name in labels:
                node.state = labels[_STATE.name]
            continue
        family = _BY_NAME.get(name)
        if family is not None and math.isfinite(value):
            node.values[family.field] = value / family.scale
    if not flowstat:
        raise MetricsError("no flowstat metrics: not a flowstat agent's /metrics, or one that has sampled nothing yet")
    return nodes


# -- over HTTP --------------------------------------------------------------------------------------
def scrape(url: str, timeout: float, session: requests.Session | None = None) -> Scrape:
    """One agent's /metrics, read; a failure is a Scrape with ``error`` set, in a few words."""
    get = (session or requests).get
    try:
        with get(url, timeout=timeout, headers={"Accept": ACCEPT}, stream=True) as answer:
            if answer.status_code != 200:
                return Scrape(url, error=f"HTTP {answer.status_code} {answer.reason or ''}".rstrip())
            body = answer.raw.read(MAX_BYTES + 1, decode_content=True)
    except requests.exceptions.ConnectionError as exc:
        return Scrape(url, error=_connection_error(exc))
    except requests.exceptions.Timeout:
        return Scrape(url, error=f"no answer within {timeout:g} s")
    except requests.exceptions.RequestException as exc:  # a URL requests cannot take (no scheme...)
        return Scrape(url, error=_first_line(str(exc)))
    if len(body) > MAX_BYTES:
        return Scrape(url, error=f"answer larger than {MAX_BYTES >> 20} MB")
    try:
        return Scrape(url, node_samples(body.decode("utf-8", errors="replace")))
    except MetricsError as exc:
        return Scrape(url, error=str(exc))


def _connection_error(exc: requests.exceptions.ConnectionError) -> str:
    text = str(exc)
    for needle, said in (
        ("Connection refused", "connection refused"),
        ("Name or service not known", "unknown host"),
        ("No route to host", "no route to host"),
        ("timed out", "no answer (timed out)"),
        ("Connection reset", "connection reset"),
        ("RemoteDisconnected", "connection closed without an answer"),
        ("BadStatusLine", "not an HTTP answer"),
    ):
        if needle in text:
            return said
    return _first_line(text)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "failed"
    return line if len(line) <= 120 else line[:117] + "..."
