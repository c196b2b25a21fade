"""``stdout://`` and ``file:///PATH``: samples as line protocol, or JSON with ``?format=json``."""

from __future__ import annotations

import sys

from .base import Sink, SinkDown


class StdoutSink(Sink):
    scheme = "stdout"

    def send(self, payload: bytes) -> None:
        sys.stdout.buffer.write(payload)
        sys.stdout.buffer.flush()


class FileSink(Sink):
    scheme = "file"

    def __init__(self, url: str, path: str):
        super().__init__(url)
        self.path = path
        self.file = None

    def send(self, payload: bytes) -> None:
        try:
            if self.file is None:
                self.file = open(self.path, "ab")
            self.file.write(payload)
            self.file.flush()
        except OSError as exc:
            self.file = None
            raise SinkDown(f"{self.path}: {exc.strerror}") from exc

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
