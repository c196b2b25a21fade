"""A progress line for long work: a bar on a terminal, a line every few seconds otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, unit: str = "", stream=sys.stderr, enabled: bool = True):
        self.total, self.label, self.unit, self.stream = max(total, 1), label, unit, stream
        self.enabled = enabled
        self.tty = stream.isatty()
        self.done = 0
        self.start = self.last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if not self.enabled or (now - self.last < (0.2 if self.tty else 5.0) and self.done < self.total):
            return
        self.last = now
        frac = min(1.0, self.done / self.total)
        rate = self.done / max(now - self.start, 1e-9)
        text = f"{self.label} {self.done:,}/{self.total:,} {self.unit} ({rate:,.0f}/s)"
        if self.tty:
            self.stream.write(f"\r[{'#' * int(frac * 30):<30}] {text}   ")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
