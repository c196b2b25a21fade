"""``stdout://`` and ``file:///PATH``: samples as line protocol, or JSON with ``?format=json``."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from flowstat.schema import agent as agent_schema
from flowstat.schema import flow as flow_schema

from .base import Sink, SinkDown, SinkURLError


class StdoutSink(Sink):
    scheme = "stdout"
    spooled = False

    @classmethod
    def from_url(cls, url, parts, query):
        sink = cls(url)
        sink.format = query.get("format", "line")
        return sink

    def send(self, payload: bytes, count: int) -> None:
        sys.stdout.buffer.write(payload)
        sys.stdout.buffer.flush()


class FileSink(Sink):
    scheme = "file"

    def __init__(self, url: str, path: str):
        super().__init__(url)
        self.path = path
        self.file: io.BufferedWriter | None = None

    @classmethod
    def from_url(cls, url, parts, query):
        if not parts.path:
            raise SinkURLError(f"{url}: needs a path, e.g. file:///tmp/samples.lp")
        sink = cls(url, parts.path)
        sink.format = query.get("format", "line")
        return sink

    def send(self, payload: bytes, count: int) -> None:
        try:
            if self.file is None:
                self.file = open(self.path, "ab")
            self.file.write(payload)
            self.file.flush()
        except OSError as exc:
            self.file = None
            raise SinkDown(f"{self.path}: {exc.strerror}") from exc

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class RunFileSink(FileSink):
    """The run file (``flowstat agent --run-file``): NDJSON, a header line describing the run, then
    one sample a line, and the agent's self-samples and edge counters, each wrapped
    ({"flowstat_agent": {...}}, {"flowstat_edge": {...}}) so that it is never taken for a sample.
    flowstat replay loads it."""

    scheme = "runfile"
    format = "json"

    def encode_self_samples(self, docs: Iterable[dict]) -> bytes:
        return "".join(f'{{"{agent_schema.RUN_FILE_KEY}":{agent_schema.to_json(d)}}}\n' for d in docs).encode()

    def encode_edges(self, docs: Iterable[dict]) -> bytes:
        return "".join(
            f'{{"{flow_schema.EDGE_RUN_FILE_KEY}":{flow_schema.to_json("edge", d)}}}\n' for d in docs
        ).encode()

    def __init__(self, path: str, header: dict):
        super().__init__(f"file://{path}", path)
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists() or p.stat().st_size == 0:
            self.send((json.dumps(header) + "\n").encode(), 1)
