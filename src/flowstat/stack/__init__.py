"""``flowstat stack``: real servers on loopback, without Docker: download or build, cache, start,
check, stop. One module per service (influxdb.py, elasticsearch.py)."""

from __future__ import annotations

import os
from pathlib import Path

from .base import Service, StackError, load_state, save_state
from .elasticsearch import Elasticsearch
from .influxdb import InfluxDB
from .telegraf import Telegraf

__all__ = ["Stack", "StackError", "default_cache", "SERVICES"]

SERVICES = ("influxdb", "elasticsearch", "telegraf")
DEFAULT_PORTS = {"influxdb": 8086, "elasticsearch": 9200, "telegraf": 8186}


def default_cache() -> Path:
    if os.environ.get("FLOWSTAT_CACHE"):
        return Path(os.environ["FLOWSTAT_CACHE"]) / "stack"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flowstat" / "stack"


class Stack:
    def __init__(self, cache: Path | None = None, ports: dict[str, int] | None = None,
                 services: tuple[str, ...] = SERVICES):
        self.cache = (cache or default_cache()).resolve()
        self.cache.mkdir(parents=True, exist_ok=True)
        known = load_state(self.cache)
        chosen = {**DEFAULT_PORTS, **{k: v["port"] for k, v in known.items()}, **(ports or {})}
        classes = {"influxdb": InfluxDB, "elasticsearch": Elasticsearch, "telegraf": Telegraf}
        self.services: list[Service] = [classes[name](name, self.cache, chosen[name]) for name in SERVICES
                                        if name in services]
        if "telegraf" in services:
            self["telegraf"].extra["influx_url"] = f"http://127.0.0.1:{chosen['influxdb']}"

    def __getitem__(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def names(self) -> set[str]:
        return {s.name for s in self.services}

    def up(self, report=print) -> None:
        """Start each server, then install what the stores need (templates, database, rollups)."""
        from flowstat.templates import install_elasticsearch, install_influxdb

        save_state(self.cache, self.services)
        for s in self.services:
            report(f"{s.name}: {s.up()}; log: {s.log_path}")
            try:
                if s.name == "influxdb":
                    install_influxdb(s.url)
                    report("influxdb: database flowstat, retention policies raw and rollup, continuous queries ready")
                elif s.name == "elasticsearch":
                    install_elasticsearch(s.url)
                    report("elasticsearch: component and index templates flowstat-samples, flowstat-runs ready")
            except (RuntimeError, OSError) as exc:
                raise StackError(f"{s.name}: set-up failed: {exc}") from exc

    def down(self, report=print) -> None:
        for s in reversed(self.services):
            report(f"{s.name}: {s.down()}")

    def status(self) -> list[dict]:
        return [s.status() for s in self.services]
