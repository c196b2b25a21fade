"""A bounded on-disk FIFO of a sink's encoded batches: each goes through it (written before it is
sent), and it holds them while the sink is down.

Each batch is a file named by a counter (order) and its sample count; ``sink-url`` names the sink
the batches are encoded for, so that another program can send them later (``flowstat agent
--flush-spool``; the C agent's spools have the same layout). A batch leaves the spool only after
the sink accepted it, so nothing is lost or sent twice while the agent runs; a restarted agent with
the same spool folder resends what is left — an agent killed with SIGKILL included, since every
batch is on disk before it is sent. (Killed between a send and the removal of its batch, the next
agent sends that batch again: the stores overwrite it, docs/ingest.md.) When the spool is over its
bound, the oldest batches are dropped and counted — a bound is the price of never filling the disk.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
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


def _write(path: Path, payload: bytes) -> None:
    """The whole payload in a new file, or no file (a full disk). Not flushed to disk: ``sync``
    does, once the batch is known to stay."""
    try:
        with open(path, "wb") as f:
            f.write(payload)
    except OSError:
        path.unlink(missing_ok=True)
        raise


def _fsync(path: Path) -> None:
    """A file, or a folder (what it names of its files), flushed to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # taken by the sink, or dropped, since: nothing to keep
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """Every batch of a sink with a spool is written here before it is sent (write-ahead), by the
    sampling thread, and leaves once the sink took it (``peek``, then ``pop``; ``release`` when it
    did not), by the sink's thread: what an agent sampled is on disk from the moment it is encoded,
    and an agent killed at any point leaves it for the next one. The two threads share the spool:
    its index and counters are under a lock; a batch is written outside it."""

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
        self._lock = threading.Lock()
        for tmp in self.folder.glob("*.tmp"):  # a write cut short by a crash: never acknowledged
            tmp.unlink()
        # oldest first: (file, bytes, samples)
        self._batches = deque((f, f.stat().st_size, _count(f)) for f in sorted(self.folder.glob("*.batch")))
        self._bytes = sum(size for _, size, _ in self._batches)
        self._samples = sum(count for _, _, count in self._batches)  # kept up to date: self-samples read it
        self._next = int(self._batches[-1][0].name.split("-")[0]) + 1 if self._batches else 0
        self._synced = self._next  # batches numbered below it were flushed to disk
        # The batch peek handed out is the oldest until pop or release settles it; if the bound
        # drops it meanwhile, it is gone: settled then as delivered (pop) or as dropped (release).
        self._sending: tuple[Path, int, int] | None = None
        self._gone: tuple[Path, int, int] | None = None

    def __len__(self) -> int:
        return len(self._batches) + (self._gone is not None)

    @property
    def samples(self) -> int:
        return self._samples

    def _tmp(self) -> Path:
        """Where this thread writes a batch before it is a batch (one write at a time a thread)."""
        return self.folder / f"write-{threading.get_ident()}.tmp"

    def push(self, payload: bytes, count: int) -> None:
        """Append a batch (any thread); past the bound the oldest batches go, never the one just
        written. OSError (a full disk): nothing is left of it."""
        tmp = self._tmp()
        _write(tmp, payload)  # outside the lock; numbered as it is renamed, under it
        with self._lock:
            path = self.folder / f"{self._next:012d}-{count}.batch"
            try:
                os.replace(tmp, path)
            except OSError:
                tmp.unlink(missing_ok=True)
                raise
            self._next += 1
            self._batches.append((path, len(payload), count))
            self._bytes += len(payload)
            self._samples += count
            self._keep_to_bound()

    def _keep_to_bound(self) -> None:
        while self._bytes > self.max_bytes and len(self._batches) > 1:
            oldest = self._batches.popleft()
            path, size, lost = oldest
            self._bytes -= size
            path.unlink(missing_ok=True)
            if oldest is self._sending:
                self._gone = oldest  # settled when its send ends
            else:
                self._dropped(lost)

    def _dropped(self, lost: int) -> None:
        self._samples -= lost
        self.dropped_samples += lost
        log.error("spool %s is over %d bytes: dropped its oldest batch (%d samples)", self.folder, self.max_bytes, lost)

    def peek(self) -> tuple[bytes, int] | None:
        """The oldest batch and its sample count, handed out until pop, replace_oldest or release."""
        with self._lock:
            while self._batches:
                path, _, count = self._batches[0]
                try:
                    payload = path.read_bytes()
                except FileNotFoundError:  # removed by hand: not there to send
                    log.error("spool %s: batch %s is gone (removed by hand?): skipped", self.folder, path.name)
                    self._bytes -= self._batches.popleft()[1]
                    self._samples -= count
                    continue
                self._sending, self._gone = self._batches[0], None
                return payload, count
            return None

    def pop(self) -> None:
        """The oldest batch went to the sink: its file is removed."""
        with self._lock:
            if self._gone is not None:  # dropped by the bound while it was sent: it was delivered
                self._samples -= self._gone[2]
                self._gone = None
                return
            path, size, count = self._batches.popleft()
            self._bytes -= size
            self._samples -= count
            path.unlink()

    def release(self) -> None:
        """The batch peek handed out did not go: it stays the oldest (or, dropped meanwhile, is counted)."""
        with self._lock:
            if self._gone is not None:
                self._dropped(self._gone[2])
                self._gone = None
            self._sending = None

    def replace_oldest(self, payload: bytes, count: int) -> None:
        """Keep only part of the oldest batch (a store took the rest), in its place in the order."""
        with self._lock:
            if self._gone is not None:  # dropped by the bound while it was sent: the rest with it
                self._samples -= self._gone[2] - count
                self._dropped(count)
                self._gone = None
                return
            old, old_size, old_count = self._batches[0]
            new = old.with_name(f"{old.name.split('-')[0]}-{count}.batch")
            tmp = self._tmp()
            _write(tmp, payload)
            _fsync(tmp)  # it stays: the sink wants it later
            os.replace(tmp, new)
            if new != old:
                old.unlink()
            self._bytes += len(payload) - old_size
            self._samples += count - old_count
            self._batches[0] = (new, len(payload), count)

    def sync(self) -> None:
        """Flush to disk the batches written since the last call, and the folder (they are written
        without it: an agent killed loses nothing in the kernel's cache; a machine that stops may)."""
        with self._lock:
            todo = []
            for path, _, _ in reversed(self._batches):  # the newest first: those since the last call
                if int(path.name.split("-")[0]) < self._synced:
                    break
                todo.append(path)
            upto = self._next
        if not todo:
            return
        for path in todo:  # outside the lock: the sampling thread writes on meanwhile
            _fsync(path)
        _fsync(self.folder)
        with self._lock:
            self._synced = max(self._synced, upto)
