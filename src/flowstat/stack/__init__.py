"""``flowstat stack``: real servers on loopback, without Docker: download or build, cache, start,
check, stop. One module per server; the stores' set-up (flowstat.stores) is installed into the
servers that hold a store once they answer. ElastAlert2 watches Elasticsearch and alerts."""

from __future__ import annotations

import os
from pathlib import Path

from flowstat import stores
from flowstat.registry import Registry

from .base import Service, StackError, load_state, make_folder, save_state
from .elastalert import ElastAlertServer
from .elasticsearch import ElasticsearchServer
from .influxdb import InfluxDBServer
from .telegraf import TelegrafServer

__all__ = ["SERVICES", "Service", "Stack", "StackError", "default_cache"]

# Every server, by name, in start order (a server that needs another starts after it).
SERVICES: Registry[type[Service]] = Registry(
    "service",
    {
        "influxdb": InfluxDBServer,
        "elasticsearch": ElasticsearchServer,
        "telegraf": TelegrafServer,
        "elastalert": ElastAlertServer,
    },
)

SYSTEM_CACHE = Path("/var/lib/flowstat/stack")


def default_cache() -> Path:
    """$FLOWSTAT_CACHE/stack; else, for root, /var/lib/flowstat/stack (the servers run as an
    unprivileged user, which cannot enter root's home); else ~/.cache/flowstat/stack."""
    if os.environ.get("FLOWSTAT_CACHE"):
        return Path(os.environ["FLOWSTAT_CACHE"]) / "stack"
    if os.geteuid() == 0:
        return SYSTEM_CACHE
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flowstat" / "stack"


class Stack:
    def __init__(
        self,
        cache: Path | None = None,
        ports: dict[str, int] | None = None,
        services: tuple[str, ...] | None = None,
        options: dict[str, dict] | None = None,
    ):
        """OPTIONS: per service, what `up` is told beyond ports (e.g. {"elastalert": {"webhook": URL}})."""
        self.cache = (cache or default_cache()).resolve()
        make_folder(self.cache)
        known = load_state(self.cache)
        chosen = {
            **{name: cls.default_port for name, cls in SERVICES.items()},
            **{k: v["port"] for k, v in known.items() if k in SERVICES},
            **(ports or {}),
        }
        self.services: list[Service] = [
            cls(name, self.cache, chosen[name], options=dict((options or {}).get(name, {})))
            for name, cls in SERVICES.items()
            if services is None or name in services
        ]
        for s in self.services:
            s.link(self, chosen)

    def __getitem__(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def names(self) -> set[str]:
        return {s.name for s in self.services}

    def install(self, report=print) -> None:
        """Download, build and unpack what each server needs, without starting it (up does it too)."""
        for s in self.services:
            s.home.mkdir(parents=True, exist_ok=True)
            s.install()
            report(f"{s.name}: installed in {s.home}")

    def up(self, report=print) -> None:
        """Start each server, then install what its store needs (templates, database, rollups)."""
        save_state(self.cache, self.services)
        for s in self.services:
            report(f"{s.name}: {s.up()}; log: {s.log_path}")
            if s.store is None:
                continue
            writer = stores.get(s.store)(s.url)
            try:
                done = writer.install()
            except (RuntimeError, OSError, stores.StoreDown) as exc:
                raise StackError(f"{s.name}: set-up failed: {exc}") from exc
            finally:
                writer.close()
            report(f"{s.name}: {writer.title} {writer.target_kind} set-up ready ({len(done)} steps)")

    def down(self, report=print) -> None:
        for s in reversed(self.services):
            report(f"{s.name}: {s.down()}")

    def status(self) -> list[dict]:
        return [s.status() for s in self.services]
