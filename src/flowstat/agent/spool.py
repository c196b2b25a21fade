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


def _number(batch: Path) -> int:
    """A batch file's place in the order, from its name."""
    return int(batch.name.split("-")[0])


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
        self._next = _number(self._batches[-1][0]) + 1 if self._batches else 0
        self._synced = self._next  # batches numbered below it were flushed to disk
        # The batches peek handed out (the oldest, or the fresh ones: peek), side by side in the
        # index until pop, replace_oldest or release settles them. One the bound drops meanwhile
        # is gone: settled then as delivered (pop) or as dropped (release).
        self._sending: list[tuple[Path, int, int]] = []
        self._gone: list[tuple[Path, int, int]] = []

    def __len__(self) -> int:
        return len(self._batches) + len(self._gone)

    @property
    def samples(self) -> int:
        return self._samples

    @property
    def next_number(self) -> int:
        """The number the next batch pushed will have."""
        with self._lock:
            return self._next

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
            if oldest in self._sending:
                self._gone.append(oldest)  # settled when its send ends
            else:
                self._dropped(lost)

    def _dropped(self, lost: int) -> None:
        self._samples -= lost
        self.dropped_samples += lost
        log.error("spool %s is over %d bytes: dropped its oldest batch (%d samples)", self.folder, self.max_bytes, lost)

    def peek(self, max_bytes: int = 0, fresh_from: int = 0) -> tuple[bytes, int] | None:
        """The oldest batch numbered ``fresh_from`` or above when there is one and older ones wait
        too (live batches go before a backlog: what was sampled after a sink came back is stored at
        once, not after the outage's backlog), else the oldest (``fresh_from`` 0: the oldest,
        always); and the batches after it while all fit in ``max_bytes`` (a sink that fell behind
        catches up a request at a time, not a batch at a time: the batches of a sink are lines, and
        run together), with their sample count; handed out until pop, replace_oldest or release."""
        with self._lock:
            while self._batches:
                start = self._start(fresh_from)
                path, size, count = self._batches[start]
                try:
                    parts = [path.read_bytes()]
                except FileNotFoundError:  # removed by hand: not there to send
                    self._skip_missing(start)
                    continue
                total = len(parts[0])
                for later in itertools.islice(self._batches, start + 1, start + TAKE_MAX):
                    if total + later[1] > max_bytes:
                        break
                    try:
                        parts.append(later[0].read_bytes())
                    except OSError:  # removed by hand, unreadable: met as the first, next time
                        break
                    total, count = total + later[1], count + later[2]
                self._sending = list(itertools.islice(self._batches, start, start + len(parts)))
                self._gone = []
                return b"".join(parts), count
            return None

    def handed_out_from(self) -> int:
        """The number of the first batch peek handed out last (-1: none)."""
        with self._lock:
            return _number(self._sending[0][0]) if self._sending else -1

    def _start(self, fresh_from: int) -> int:
        """Where peek starts: at the first batch numbered fresh_from or above when there is one and
        older ones wait, else at the oldest. Under lock."""
        if not fresh_from or not self._batches or _number(self._batches[0][0]) >= fresh_from:
            return 0  # none older waits: in order
        i = len(self._batches)  # the fresh batches are few, at the back: walked from there
        while i > 0 and _number(self._batches[i - 1][0]) >= fresh_from:
            i -= 1
        return i if i < len(self._batches) else 0

    def _skip_missing(self, i: int) -> None:
        path, size, count = self._batches[i]
        del self._batches[i]
        log.error("spool %s: batch %s is gone (removed by hand?): skipped", self.folder, path.name)
        self._bytes -= size
        self._samples -= count

    def _handed_out(self) -> list[tuple[Path, int, int]]:
        """The batches handed out still in the index (pop or replace_oldest with no peek before
        settle the oldest batch)."""
        if not self._sending and self._batches:
            self._sending = [self._batches[0]]
        return [b for b in self._sending if b not in self._gone]

    def _unlist(self, handed: list[tuple[Path, int, int]]) -> int:
        """Take the handed-out batches still in the index out of it (side by side: one cut);
        where they were."""
        at = self._batches.index(handed[0])
        for _ in handed:  # at the front, or (fresh ones) near the back: cheap either way for a deque
            del self._batches[at]
        for _, size, _ in handed:
            self._bytes -= size
        return at

    def _settle(self) -> int:
        """End a send: the samples of every batch handed out; the state is reset."""
        count = sum(c for _, _, c in self._sending)
        self._sending, self._gone = [], []
        return count

    def pop(self) -> None:
        """The batches handed out went to the sink: their files are removed (those the bound
        dropped meanwhile were delivered all the same)."""
        with self._lock:
            handed = self._handed_out()
            if handed:
                self._unlist(handed)
            for path, _, _ in handed:
                path.unlink()
            self._samples -= self._settle()

    def release(self) -> None:
        """The batches handed out did not go: they keep their place in the order (those the bound
        dropped meanwhile are counted as dropped)."""
        with self._lock:
            for _, _, lost in self._gone:
                self._dropped(lost)
            self._settle()

    def replace_oldest(self, payload: bytes, count: int) -> None:
        """Keep only part of the batches handed out (a store took the rest), as one batch in
        their place in the order. Those the bound dropped meanwhile had lost their place: with
        none left, the rest is dropped with them."""
        with self._lock:
            left = self._handed_out()
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
            at = self._unlist(left)
            for path, _, _ in left:
                if path != new:
                    path.unlink()
            self._batches.insert(at, (new, len(payload), count))
            self._bytes += len(payload)
            self._keep_to_bound()

    def sync(self) -> None:
        """Flush to disk the batches written since the last call, and the folder (they are written
        without it: an agent killed loses nothing in the kernel's cache; a machine that stops may)."""
        with self._lock:
            todo = []
            for path, _, _ in reversed(self._batches):  # the newest first: those since the last call
                if _number(path) < self._synced:
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
