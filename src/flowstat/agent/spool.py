"""A bounded on-disk FIFO of encoded batches, for when a sink is down.

Each batch is a file named by a counter (order) and its sample count; ``sink-url`` names the sink
the batches are encoded for, so that another program can send them later (``flowstat agent
--flush-spool``; the C agent's spools have the same layout). A batch leaves the spool only after
the sink accepted it, so nothing is lost or sent twice while the agent runs; a restarted agent with
the same spool folder resends what is left. When the spool is over its bound, the oldest batches
are dropped and counted — a bound is the price of never filling the disk.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("flowstat.agent")
URL_FILE = "sink-url"
NAME_CHARS = 64  # bytes of the URL in its spool folder's name


def folder_name(url: str) -> str:
    """A sink's spool folder: the URL's first 64 bytes (ASCII letters and digits kept, the rest
    '_'), then a hash of the whole URL (FNV-1a, 32 bits), so that two sinks never share one. The C
    agent names them the same way."""
    raw = url.encode()
    h = 2166136261
    for b in raw:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return "".join(chr(b) if chr(b).isascii() and chr(b).isalnum() else "_" for b in raw[:NAME_CHARS]) + f"-{h:08x}"


def _count(batch: Path) -> int:
    """The samples in a batch file, from its name (NNNNNNNNNNNN-COUNT.batch)."""
    return int(batch.stem.split("-")[1])


def _write_atomically(path: Path, payload: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Spool:
    def __init__(self, folder: str | Path, max_bytes: int = 64 * 1024 * 1024, url: str | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        if url is not None:
            named = self.folder / URL_FILE
            if not named.exists():
                named.write_text(url + "\n")
            elif named.read_text().strip() != url:  # two sinks' batches must never mix
                raise ValueError(
                    f"spool {self.folder} holds the batches of another sink "
                    f"({named.read_text().strip()}), not of {url}"
                )
        self.max_bytes = max_bytes
        self.dropped_samples = 0
        self._files = sorted(self.folder.glob("*.batch"))
        self._bytes = sum(f.stat().st_size for f in self._files)
        self._samples = sum(_count(f) for f in self._files)  # kept up to date: self-samples read it each time
        self._next = int(self._files[-1].name.split("-")[0]) + 1 if self._files else 0
        for tmp in self.folder.glob("*.tmp"):  # a write cut short by a crash: never acknowledged
            tmp.unlink()

    def __len__(self) -> int:
        return len(self._files)

    @property
    def samples(self) -> int:
        return self._samples

    def push(self, payload: bytes, count: int) -> None:
        path = self.folder / f"{self._next:012d}-{count}.batch"
        _write_atomically(path, payload)
        self._next += 1
        self._files.append(path)
        self._bytes += len(payload)
        self._samples += count
        while self._bytes > self.max_bytes and len(self._files) > 1:
            oldest = self._files.pop(0)
            self._bytes -= oldest.stat().st_size
            lost = _count(oldest)
            self._samples -= lost
            self.dropped_samples += lost
            oldest.unlink()
            log.error(
                "spool %s is over %d bytes: dropped its oldest batch (%d samples)", self.folder, self.max_bytes, lost
            )

    def peek(self) -> tuple[bytes, int] | None:
        if not self._files:
            return None
        f = self._files[0]
        return f.read_bytes(), _count(f)

    def pop(self) -> None:
        f = self._files.pop(0)
        self._bytes -= f.stat().st_size
        self._samples -= _count(f)
        f.unlink()

    def replace_oldest(self, payload: bytes, count: int) -> None:
        """Keep only part of the oldest batch (a store took the rest), in its place in the order."""
        old = self._files[0]
        old_size = old.stat().st_size
        new = old.with_name(f"{old.name.split('-')[0]}-{count}.batch")
        _write_atomically(new, payload)
        if new != old:
            old.unlink()
        self._bytes += len(payload) - old_size
        self._samples += count - _count(old)
        self._files[0] = new
