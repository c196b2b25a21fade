"""``flowstat top --samples PATH``: the samples an agent writes, followed as ``tail -f`` follows a
file, and given to the Watch as an agent's /metrics would serve them.

PATH holds one JSON sample a line (flowstat.schema's sample): ``flowstat agent --sink
file:///PATH?format=json``, or a run file (``--run-file``; a run directory's samples.ndjson, whose
header line and the agent's self-samples are no node's samples). Each round reads the lines
written since the last one (the whole file the first time), keeps each node's latest sample, and
returns them as one Scrape, named by the file. An incomplete last line waits for its newline; a
file truncated or replaced is read again from its start.

One agent a node: two agents may write the same file (a run's Python and C agents), and two
agents' samples of one node taken turn about would each look new to the Watch and double its
points. A node is taken from the first agent seen for it that still writes (one that wrote
nothing for STALE_S gives way to the next). A bad line (not JSON, not an object, a field of the
wrong type) is skipped and counted; the latest is said, with its line number, in a few words.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from flowstat.flow import WINDOW_S
from flowstat.schema.agent import RUN_FILE_KEY
from flowstat.schema.flow import EDGE_RUN_FILE_KEY
from flowstat.schema.sample import time_ns

from .scrape import FIELDS, NodeSample, Scrape

RUN_FILE = "samples.ndjson"  # a run directory's samples, written by its Python agent
CHUNK = 1 << 20  # bytes read at a time
MAX_LINE = 1 << 20  # a sample is about 1 kB: a "line" longer than this is none (a binary file)
# A node whose latest sample was read this long ago is no longer reported (its agent stopped
# writing, or the run ended): the Watch dims its row, then forgets it, as for an agent that stopped
# serving it. Top's own clock, not the sample's: the file may come from another host's agent.
STALE_S = WINDOW_S
_NOT_SAMPLES = frozenset({"flowstat_run", RUN_FILE_KEY, EDGE_RUN_FILE_KEY})  # a header, self-samples, edge counters
_NUMBERS = tuple(f for f in FIELDS if f != "node_state")
_LABELS = ("role", "host", "agent")
_MISSING = "no such file"  # what _read says of a file not there (yet)


class BadLine(ValueError):
    """What is wrong with a line, in a few words."""


def node_sample(doc: Any) -> NodeSample | None:
    """A sample's document as top reads it: the labels, the FIELDS in the sample's own units, the
    node's state. None: a line that is no node's sample (a run file's header or self-sample).
    BadLine: not a sample (not an object, no node_id, a field top reads of the wrong type)."""
    if not isinstance(doc, dict):
        raise BadLine("not a JSON object")
    if len(doc) == 1 and next(iter(doc)) in _NOT_SAMPLES:
        return None
    node_id = doc.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise BadLine("no node_id" if node_id is None else "node_id: not a string")
    labels = [doc.get(name, "") for name in _LABELS]
    for name, value in zip(_LABELS, labels, strict=True):
        if not isinstance(value, str):
            raise BadLine(f"{name}: not a string")
    state = doc.get("node_state")
    if state is not None and not isinstance(state, str):
        raise BadLine("node_state: not a string")
    values: dict[str, float] = {}
    for name in _NUMBERS:
        value = doc.get(name)
        if value is None:  # absent (the schema never writes null)
            continue
        if type(value) not in (int, float) or not math.isfinite(value):
            raise BadLine(f"{name}: not a number")
        values[name] = float(value)
    return NodeSample(node_id, labels[0], labels[1], labels[2], values, state)


def sample_time(doc: dict[str, Any]) -> float | None:
    """The sample's ``time`` (Unix s); None without one. BadLine: not an ISO-8601 UTC time."""
    stamp = doc.get("time")
    if stamp is None:
        return None
    if not isinstance(stamp, str):
        raise BadLine("time: not a string")
    try:
        return time_ns(stamp) / 1e9
    except ValueError:
        raise BadLine(f"time: not ISO-8601 ({stamp[:40]!r})") from None


@dataclass
class _Seen:
    sample: NodeSample
    read_at: float  # the round that read it (top's clock)


class Tail:
    """A samples file, followed. ``round`` reads what was written since the last round and returns
    each node's latest sample as one Scrape (``url``: the file), as Scraper.round does an agent's."""

    def __init__(self, path: Path):
        self.path = path
        self.url = str(path)
        self.file: BinaryIO | None = None
        self._start_over()

    def _start_over(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file = None
        self.pos = 0  # bytes read
        self.partial = b""  # the last line, until its newline comes
        self.overlong = False  # the line being read is longer than MAX_LINE: skipped to its newline
        self.lineno = 0
        self.bad = 0
        self.last_bad: tuple[int, str] | None = None
        self.read_any = False  # a node's sample was read (even one too old to show)
        # node id -> agent -> its latest sample, the agents in the order first seen
        self.nodes: dict[str, dict[str, _Seen]] = {}

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def round(self, now: float | None = None) -> list[Scrape]:
        now = time.time() if now is None else now
        problem = self._read(now)
        nodes: dict[str, NodeSample] = {}
        for node_id, agents in list(self.nodes.items()):
            for agent in [a for a, seen in agents.items() if now - seen.read_at > STALE_S]:
                del agents[agent]  # stopped writing: the next agent of the node, if any, is taken
            if agents:
                nodes[node_id] = next(iter(agents.values())).sample
            else:
                del self.nodes[node_id]
        if problem is _MISSING:
            return [Scrape(self.url, error=f"waiting for {self.path}")]
        errors = [problem] if problem else []
        if self.last_bad is not None:
            lineno, why = self.last_bad
            errors.append(f"line {lineno}: {why}" + (f" ({self.bad} bad lines skipped)" if self.bad > 1 else ""))
        if not nodes and not errors:
            errors.append(
                f"no sample in the last {STALE_S:g} s: has the run ended?" if self.read_any else "no sample yet"
            )
        # the error names the file (the frame shows it alone, where it says "agent URL: " of an agent's)
        return [Scrape(self.url, nodes, f"{self.path}: {'; '.join(errors)}" if errors else None)]

    def _read(self, now: float) -> str | None:
        """Read the lines written since the last round; what stops it, in a few words (None: read)."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._start_over()  # removed: its samples are gone with it
            return _MISSING
        except OSError as exc:
            return exc.strerror or str(exc)
        if self.file is not None:
            opened = os.fstat(self.file.fileno())
            if (opened.st_dev, opened.st_ino) != (stat.st_dev, stat.st_ino) or stat.st_size < self.pos:
                self._start_over()  # replaced, or truncated: a new file
        first = self.file is None
        if first:
            try:
                self.file = open(self.path, "rb")  # noqa: SIM115 (kept open: followed)
            except OSError as exc:
                return exc.strerror or str(exc)
        # The first read skips the samples taken more than WINDOW_S before now (by their own time):
        # the Watch times every sample by the round that read it, so the end of a run that ended an
        # hour ago would be shown as the current state of a pipeline that runs no more. A run still
        # going shows its latest samples at once, and a finished one says it has no recent sample.
        # (An agent whose clock is behind top's by more than the window shows from its next sample
        # on: lines written after the first read are all taken.)
        cutoff = now - WINDOW_S if first else None
        assert self.file is not None
        while chunk := self.file.read(CHUNK):
            self.pos += len(chunk)
            lines = (self.partial + chunk).split(b"\n")
            self.partial = lines.pop()
            for raw in lines:
                if self.overlong:
                    self.overlong = False
                    self.lineno += 1
                    self._bad(f"longer than {MAX_LINE >> 20} MB")
                else:
                    self._line(raw, now, cutoff)
            if len(self.partial) > MAX_LINE:
                self.partial, self.overlong = b"", True
        return None

    def _line(self, raw: bytes, now: float, cutoff: float | None) -> None:
        self.lineno += 1
        if not raw.strip():
            return
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            lp = raw.startswith(b"flowstat_")  # line protocol: the file sink's default
            return self._bad("line protocol, not JSON (file://...?format=json)" if lp else "not JSON")
        try:
            sample = node_sample(doc)
            if sample is None:
                return
            taken = sample_time(doc)
        except BadLine as exc:
            return self._bad(str(exc))
        self.read_any = True
        if cutoff is not None and taken is not None and taken < cutoff:
            return
        agents = self.nodes.setdefault(sample.node_id, {})
        agents[sample.agent] = _Seen(sample, now)  # an agent seen before keeps its place

    def _bad(self, why: str) -> None:
        self.bad += 1
        self.last_bad = (self.lineno, why)
