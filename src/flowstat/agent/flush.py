"""Sending what an agent left in its spool (``flowstat agent --flush-spool DIR``): after an agent
stopped while a sink was down for longer than its --drain-timeout, its batches wait on disk, in
order, already encoded for their sink (both agents write the same layout: see spool.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .sinks import SinkRunner, open_sink
from .spool import SEND_MAX_BYTES, URL_FILE, Spool


class FlushError(ValueError):
    """A spool that cannot be sent: no sink named for it, or a sink URL that names no sink."""


@dataclass
class Flushed:
    folder: Path
    url: str
    delivered: int
    refused: int
    left_batches: int
    left_samples: int


def spool_folders(top: Path) -> list[Path]:
    """The spools under ``top`` (itself included): folders holding batches or a sink-url file."""
    found = [
        d
        for d in [top, *sorted(p for p in top.rglob("*") if p.is_dir())]
        if (d / URL_FILE).exists() or any(d.glob("*.batch"))
    ]
    return found


def flush(
    folder: Path,
    url: str | None = None,
    wait_s: float = 5.0,
    timeout_s: float | None = None,
    node_backoff_s: float | None = None,
    send_max_bytes: int = SEND_MAX_BYTES,
) -> Flushed:
    """Send one spool's batches in order to its sink (``url``, else the one its sink-url file
    names), waiting up to ``wait_s`` for a sink that is down. What the sink does not take stays."""
    if url is None:
        try:
            url = (folder / URL_FILE).read_text().strip()
        except OSError:
            raise FlushError(f"{folder}: no {URL_FILE} file says where these batches go; give --sink URL") from None
    try:
        sink = open_sink(url, timeout_s, node_backoff_s)
    except ValueError as exc:
        raise FlushError(f"{folder}: {exc}") from None
    spool = Spool(folder, max_bytes=1 << 62)
    runner = SinkRunner(sink, spool, drain_s=wait_s, send_max_bytes=send_max_bytes, fresh_first=False)
    runner.start()
    runner.stop()
    runner.join()
    return Flushed(folder, url, runner.delivered, runner.refused, len(spool), spool.samples)
