"""Timestamps as flowstat writes them everywhere: ISO-8601, UTC, milliseconds, 'Z'."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def iso_utc_ms(epoch_s: float | None = None) -> str:
    """Format a Unix time (default: now) as e.g. ``2026-11-22T10:51:14.123Z``."""
    if epoch_s is None:
        epoch_s = time.time()
    dt = datetime.fromtimestamp(epoch_s, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def iso_utc_from_ms(epoch_ms: int) -> str:
    """Format a Unix time in whole milliseconds exactly (a float of seconds may round a ms away)."""
    secs, ms = divmod(epoch_ms, 1000)
    return datetime.fromtimestamp(secs, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms:03d}Z"


def compact_utc(epoch_s: float | None = None) -> str:
    """A file-name friendly UTC stamp, e.g. ``20261122T105114Z``."""
    if epoch_s is None:
        epoch_s = time.time()
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
