"""A writer in a process of its own: batches go down a pipe, length-prefixed, and are written in
order with the retry policy. Reading and encoding hold the GIL nearly all the time, and a posting
thread beside them waits for it at every socket call: posting 1M points took half as long again
with the parsing in a thread as in another process (benchmarks/bench_ingest.py, posting_contention;
docs/benchmarks.md). Nothing but bytes crosses the pipe; nothing is unpickled.

The child (``python -m flowstat.stores._child STORE URL TARGET GIVE_UP_S TIMEOUT_S NODE_BACKOFF_S``)
answers on its stdout with one JSON line: at once the error that stopped it (it then reads and drops
the batches that follow), or, at the end, what the store accepted and refused. A failover between a
store's nodes is logged on its stderr, which is this process's.
"""

from __future__ import annotations

import json
import select
import struct
import subprocess
import sys
from typing import TypedDict

from ._base import NODE_BACKOFF_S, RetryPolicy, Writer

FRAME = struct.Struct("<QQ")  # a batch: its length and item count, then its bytes; length 0 ends
CHILD = f"{__package__}._child"  # a module the package does not import: -m runs it fresh


class WriterResult(TypedDict, total=False):
    """The child's answer: what the store accepted and refused (and why), or the error that stopped it."""

    accepted: int
    refused: int
    reasons: list[str]
    error: str


class WriterProcess:
    """Writes batches to one store from a child process (see the module)."""

    def __init__(
        self,
        store: type[Writer],
        url: str,
        target: str,
        give_up_s: float = RetryPolicy.give_up_s,
        *,
        timeout_s: float = 60.0,
        node_backoff_s: float = NODE_BACKOFF_S,
    ):
        """``store``: the writer's class (flowstat.stores.get(name)); ``timeout_s``,
        ``node_backoff_s``: the writer's. A failover is logged on this process's stderr."""
        self.title = store.title
        self.proc = subprocess.Popen(
            [sys.executable, "-m", CHILD, store.name, url, target, str(give_up_s), str(timeout_s), str(node_backoff_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        self.result: WriterResult | None = None

    def _poll(self) -> WriterResult | None:
        """The child's answer if it has come (it has stopped), without waiting."""
        if self.result is None and select.select([self._stdout], [], [], 0)[0]:
            return self._collect()
        return self.result

    def _collect(self) -> WriterResult:
        """The child's answer, waiting for it (its exit code when it ended without one)."""
        if self.result is None:
            line = self._stdout.readline()
            try:
                self.result = json.loads(line)
            except ValueError:
                self.proc.wait()
                self.result = {
                    "error": f"the process writing to {self.title} ended with exit code " f"{self.proc.returncode}"
                }
        return self.result

    def put(self, body: bytes, count: int) -> None:
        """Hand a batch over (blocks while the child still writes the ones before). Raises
        RuntimeError with the child's error once it has stopped."""
        early = self._poll()
        if early is None:
            try:
                self._stdin.write(FRAME.pack(len(body), count) + body)
                return
            except (BrokenPipeError, OSError):
                early = self._collect()
        raise RuntimeError(early.get("error") or f"the process writing to {self.title} ended")

    def close(self, abort: bool = False) -> WriterResult:
        """Wait until every batch handed over is written (or, aborting, stop at once). Returns
        {"accepted", "refused", "reasons"} or {"error"}."""
        if abort:
            self.proc.kill()
            result: WriterResult = {"error": "aborted"}
        else:
            try:
                self._stdin.write(FRAME.pack(0, 0))
                self._stdin.close()
            except (BrokenPipeError, OSError):
                pass
            result = self._collect()
        self.proc.wait()
        for pipe in (self._stdin, self._stdout):
            try:
                pipe.close()
            except (BrokenPipeError, OSError):
                pass
        return result
