"""A bounded on-disk FIFO of encoded batches, for when a sink is down.

Each batch is a file named by a counter (order) and its sample count. A batch leaves the spool only
after the sink accepted it, so nothing is lost or sent twice while the agent runs; a restarted
agent with the same spool folder resends what is left. When the spool is over its bound, the oldest
batches are dropped and counted — a bound is the price of never filling the disk.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("flowstat.agent")


class Spool:
    def __init__(self, folder: str | Path, max_bytes: int = 64 * 1024 * 1024):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.dropped_samples = 0
        self._files = sorted(self.folder.glob("*.batch"))
        self._bytes = sum(f.stat().st_size for f in self._files)
        self._next = int(self._files[-1].name.split("-")[0]) + 1 if self._files else 0
        for tmp in self.folder.glob("*.tmp"):  # a write cut short by a crash: never acknowledged
            tmp.unlink()

    def __len__(self) -> int:
        return len(self._files)

    @property
    def samples(self) -> int:
        return sum(int(f.stem.split("-")[1]) for f in self._files)

    def push(self, payload: bytes, count: int) -> None:
        path = self.folder / f"{self._next:012d}-{count}.batch"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._next += 1
        self._files.append(path)
        self._bytes += len(payload)
        while self._bytes > self.max_bytes and len(self._files) > 1:
            oldest = self._files.pop(0)
            self._bytes -= oldest.stat().st_size
            lost = int(oldest.stem.split("-")[1])
            self.dropped_samples += lost
            oldest.unlink()
            log.error("spool %s is over %d bytes: dropped its oldest batch (%d samples)", self.folder,
                      self.max_bytes, lost)

    def peek(self) -> tuple[bytes, int] | None:
        if not self._files:
            return None
        f = self._files[0]
        return f.read_bytes(), int(f.stem.split("-")[1])

    def pop(self) -> None:
        f = self._files.pop(0)
        self._bytes -= f.stat().st_size
        f.unlink()
