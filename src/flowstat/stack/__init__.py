"""``flowstat stack``: real servers on loopback, without Docker: download or build, cache, start,
check, stop. One module per service (influxdb.py, elasticsearch.py)."""

from __future__ import annotations

import os
from pathlib import Path

from .base import Service, StackError, load_state, save_state
from .elasticsearch import Elasticsearch
from .influxdb import InfluxDB

__all__ = ["Stack", "StackError", "default_cache"]

DEFAULT_PORTS = {"influxdb": 8086, "elasticsearch": 9200}


def default_cache() -> Path:
    if os.environ.get("FLOWSTAT_CACHE"):
        return Path(os.environ["FLOWSTAT_CACHE"]) / "stack"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flowstat" / "stack"


class Stack:
    def __init__(self, cache: Path | None = None, ports: dict[str, int] | None = None,
                 services: tuple[str, ...] = ("influxdb", "elasticsearch")):
        self.cache = (cache or default_cache()).resolve()
        self.cache.mkdir(parents=True, exist_ok=True)
        known = load_state(self.cache)
        chosen = {**DEFAULT_PORTS, **{k: v["port"] for k, v in known.items()}, **(ports or {})}
        classes = {"influxdb": InfluxDB, "elasticsearch": Elasticsearch}
        self.services: list[Service] = [classes[name](name, self.cache, chosen[name]) for name in services]

    def __getitem__(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def up(self, report=print) -> None:
        save_state(self.cache, self.services)
        for s in self.services:
            report(f"{s.name}: {s.up()}; log: {s.log_path}")

    def down(self, report=print) -> None:
        for s in reversed(self.services):
            report(f"{s.name}: {s.down()}")

    def status(self) -> list[dict]:
        return [s.status() for s in self.services]
