"""Parsing human sizes such as ``1kB``, ``500 kB``, ``5MB``, ``64KiB``."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object) -> int:
    """Bytes for a size: an int, or a string with an SI (kB = 1000) or IEC (KiB = 1024) unit."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 1kB or 500kB, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"size must be positive, got {value}")
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
            if size > 0:
                return size
    raise ValueError(f"expected a size such as 1kB, 500kB, 5MB or a byte count, got {value!r}")


def format_size(nbytes: float) -> str:
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= factor:
            return f"{nbytes / factor:.3g} {unit}"
    return f"{int(nbytes)} B"


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")


def parse_duration(value: object) -> float:
    """Seconds for a duration: a number of seconds, or a string with a unit (ns, us, ms, s), >= 0."""
    if not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0:
        return float(value)
    if isinstance(value, str):
        m = _DURATION_RE.match(value)
        if m:
            return float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    raise ValueError(f"expected a duration such as 1ms, 250us or a number of seconds (>= 0), got {value!r}")
