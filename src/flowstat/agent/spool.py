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

import itertools
import logging
import os
import threading
from collections import deque
from pathlib import Path

log = logging.getLogger("flowstat.agent")
URL_FILE = "sink-url"
# Batches waiting in a spool go to their sink together, up to this many bytes a request (one batch
# larger goes alone): a sink slower than one request a sampling tick would otherwise never catch up
# (--send-max-kb; the C agent's SPOOL_SEND_MAX_BYTES).
SEND_MAX_BYTES = 1 << 20
TAKE_MAX = 256  # batches handed out at once: they are read under the lock, and push waits meanwhile
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
        # The batches peek handed out are the oldest until pop, replace_oldest or release settles
        # them: the first _sending_left of the index. One the bound drops meanwhile is gone:
        # settled then as delivered (pop) or as dropped (release).
        self._sending: list[tuple[Path, int, int]] = []
        self._sending_left = 0
        self._gone: list[tuple[Path, int, int]] = []

    def __len__(self) -> int:
        return len(self._batches) + len(self._gone)

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
            if self._sending_left:  # the oldest are those being sent
                self._sending_left -= 1
                self._gone.append(oldest)  # settled when its send ends
            else:
                self._dropped(lost)

    def _dropped(self, lost: int) -> None:
        self._samples -= lost
        self.dropped_samples += lost
        log.error("spool %s is over %d bytes: dropped its oldest batch (%d samples)", self.folder, self.max_bytes, lost)

    def peek(self, max_bytes: int = 0) -> tuple[bytes, int] | None:
        """The oldest batch, and the batches after it while all fit in ``max_bytes`` (a sink that
        fell behind catches up a request at a time, not a batch at a time: the batches of a sink
        are lines, and run together), with their sample count; handed out until pop,
        replace_oldest or release."""
        with self._lock:
            while self._batches:
                path, size, count = self._batches[0]
                try:
                    parts = [path.read_bytes()]
                except FileNotFoundError:  # removed by hand: not there to send
                    self._skip_missing()
                    continue
                total = len(parts[0])
                for later in itertools.islice(self._batches, 1, TAKE_MAX):
                    if total + later[1] > max_bytes:
                        break
                    try:
                        parts.append(later[0].read_bytes())
                    except OSError:  # removed by hand, unreadable: met as the oldest, next time
                        break
                    total, count = total + later[1], count + later[2]
                self._sending = list(itertools.islice(self._batches, len(parts)))
                self._sending_left, self._gone = len(parts), []
                return b"".join(parts), count
            return None

    def _skip_missing(self) -> None:
        path, size, count = self._batches.popleft()
        log.error("spool %s: batch %s is gone (removed by hand?): skipped", self.folder, path.name)
        self._bytes -= size
        self._samples -= count

    def _handed_out(self) -> None:
        """pop or replace_oldest with no peek before: they settle the oldest batch."""
        if not self._sending and self._batches:
            self._sending, self._sending_left = [self._batches[0]], 1

    def _settle(self) -> int:
        """End a send: the samples of every batch handed out; the state is reset."""
        count = sum(c for _, _, c in self._sending)
        self._sending, self._sending_left, self._gone = [], 0, []
        return count

    def pop(self) -> None:
        """The batches handed out went to the sink: their files are removed (those the bound
        dropped meanwhile were delivered all the same)."""
        with self._lock:
            self._handed_out()
            for _ in range(self._sending_left):
                path, size, _ = self._batches.popleft()
                self._bytes -= size
                path.unlink()
            self._samples -= self._settle()

    def release(self) -> None:
        """The batches handed out did not go: they stay the oldest (those the bound dropped
        meanwhile are counted as dropped)."""
        with self._lock:
            for _, _, lost in self._gone:
                self._dropped(lost)
            self._settle()

    def replace_oldest(self, payload: bytes, count: int) -> None:
        """Keep only part of the batches handed out (a store took the rest), as one batch in
        their place in the order. Those the bound dropped meanwhile had lost their place: with
        none left, the rest is dropped with them."""
        with self._lock:
            self._handed_out()
            left = list(itertools.islice(self._batches, self._sending_left))
            self._samples -= self._settle() - count
            if not left:
                self._dropped(count)
                return
            old = left[0][0]
            new = old.with_name(f"{old.name.split('-')[0]}-{count}.batch")
            tmp = self._tmp()
            _write(tmp, payload)
            _fsync(tmp)  # it stays: the sink wants it later
            os.replace(tmp, new)
            for path, size, _ in left:
                self._batches.popleft()
                self._bytes -= size
                if path != new:
                    path.unlink()
            self._batches.appendleft((new, len(payload), count))
            self._bytes += len(payload)
            self._keep_to_bound()

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
