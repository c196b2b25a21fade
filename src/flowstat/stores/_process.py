"""A writer in a process of its own: batches go down a pipe, length-prefixed, and are written in
order with the retry policy. Reading and encoding hold the GIL nearly all the time, and a posting
thread beside them waits for it at every socket call: posting 1M points took half as long again
with the parsing in a thread as in another process (benchmarks/bench_ingest.py, posting_contention;
docs/benchmarks.md). Nothing but bytes crosses the pipe; nothing is unpickled.

The child (``python -m flowstat.stores._child STORE URL TARGET GIVE_UP_S``) answers on its stdout
with one JSON line: at once the error that stopped it (it then reads and drops the batches that
follow), or, at the end, what the store accepted and refused.
"""

from __future__ import annotations

import json
import select
import struct
import subprocess
import sys

from ._base import RetryPolicy
from ._registry import get

FRAME = struct.Struct("<QQ")  # a batch: its length and item count, then its bytes; length 0 ends
CHILD = f"{__package__}._child"  # a module the package does not import: -m runs it fresh


class WriterProcess:
    """Writes batches to one store from a child process (see the module)."""

    def __init__(self, store: str, url: str, target: str, give_up_s: float = RetryPolicy.give_up_s):
        self.title = get(store).title  # an unknown store fails here, before a process starts
        self.proc = subprocess.Popen(
            [sys.executable, "-m", CHILD, store, url, target, str(give_up_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.result: dict | None = None

    def _collect(self, wait: bool = True) -> dict | None:
        if self.result is None and (wait or select.select([self.proc.stdout], [], [], 0)[0]):
            line = self.proc.stdout.readline()
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
        early = self._collect(wait=False)
        if early is None:
            try:
                self.proc.stdin.write(FRAME.pack(len(body), count) + body)
                return
            except (BrokenPipeError, OSError):
                early = self._collect()
        raise RuntimeError(early.get("error") or f"the process writing to {self.title} ended")

    def close(self, abort: bool = False) -> dict:
        """Wait until every batch handed over is written (or, aborting, stop at once). Returns
        {"accepted", "refused", "reasons"} or {"error"}."""
        if abort:
            self.proc.kill()
            result = {"error": "aborted"}
        else:
            try:
                self.proc.stdin.write(FRAME.pack(0, 0))
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            result = self._collect()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except (BrokenPipeError, OSError):
                pass
        return result
