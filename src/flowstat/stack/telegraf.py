"""Telegraf, built pinned from the Go module proxy (scripts/build-telegraf), running
pipelines/telegraf/telegraf.conf between the agents and InfluxDB."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import requests

from .base import Service, StackError

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "pipelines" / "telegraf" / "telegraf.conf"


class Telegraf(Service):
    health_timeout_s = 30.0

    @property
    def socket_port(self) -> int:
        return self.extra.get("socket_port", self.port + 1)

    def ports(self) -> list[int]:
        return [self.port, self.socket_port]

    @property
    def write_url(self) -> str:
        """Where agents send line protocol over HTTP."""
        return f"{self.url}/write"

    def binary(self) -> str:
        script = ROOT / "scripts" / "build-telegraf"
        if script.exists():
            r = subprocess.run([str(script)], capture_output=True, text=True)
            if r.returncode != 0:
                raise StackError(f"telegraf: build failed (scripts/build-telegraf): {r.stderr.strip()[-600:]}")
            return r.stdout.strip().splitlines()[-1]
        found = shutil.which("telegraf")
        if not found:
            raise StackError("telegraf: not found; run scripts/build-telegraf from a flowstat checkout")
        return found

    def install(self) -> None:
        if not CONFIG.exists():
            raise StackError(f"telegraf: {CONFIG} is missing")
        self.extra["binary"] = self.binary()

    def command(self):
        env = {"FLOWSTAT_TELEGRAF_HTTP": f"127.0.0.1:{self.port}",
               "FLOWSTAT_TELEGRAF_UDP": f"127.0.0.1:{self.socket_port}",
               "FLOWSTAT_TELEGRAF_TCP": f"127.0.0.1:{self.socket_port}",
               "FLOWSTAT_INFLUX_URL": self.extra["influx_url"], "FLOWSTAT_INFLUX_DB": self.extra.get("db", "flowstat")}
        return [self.extra["binary"], "--config", str(CONFIG)], env

    def healthy(self) -> bool:
        try:
            return self.get("/ping").status_code == 204
        except requests.RequestException:
            return False
