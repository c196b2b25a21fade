"""InfluxDB 1.x from Debian's packages (the v1 API: /write, /query, /ping)."""

from __future__ import annotations

import shutil

import requests

from flowstat.stores import StoreDown
from flowstat.stores import influxdb as store

from .base import Service, StackError, apt_install


class InfluxDBServer(Service):
    """``extra={"auth": True}``: authentication on, as the compose stack runs it (the tests of
    flowstat provision); flowstat stack runs it without. ``options={"retention_check": "1s"}``: how
    often it deletes what its retention policies no longer keep (default InfluxDB's 30 minutes)."""

    health_timeout_s = 60.0
    default_port = 8086
    port_option = "influx-port"
    port_help = "InfluxDB's HTTP port (its RPC port is P+2)"
    store = "influxdb"

    @property
    def rpc_port(self) -> int:
        return self.extra.get("rpc_port", self.port + 2)

    def ports(self) -> list[int]:
        return [self.port, self.rpc_port]

    def install(self) -> None:
        if not shutil.which("influxd") or not shutil.which("influx"):  # the server, and its CLI for people
            apt_install("influxdb", "influxdb-client")
        for program, package in (("influxd", "influxdb"), ("influx", "influxdb-client")):
            if not shutil.which(program):
                raise StackError(
                    f"influxdb: `{program}` is not on the PATH after installing Debian's {package} package"
                )
        (self.home / "influxdb.conf").write_text(f"""
reporting-disabled = true
bind-address = "127.0.0.1:{self.rpc_port}"
[meta]
  dir = "{self.home}/meta"
[data]
  dir = "{self.home}/data"
  wal-dir = "{self.home}/wal"
  query-log-enabled = false
[http]
  enabled = true
  bind-address = "127.0.0.1:{self.port}"
  log-enabled = false
  auth-enabled = {"true" if self.extra.get("auth") else "false"}
[continuous_queries]
  enabled = true
  run-interval = "1s"
[retention]
  enabled = true
  check-interval = "{self.options.get("retention_check", "30m")}"
""")

    def command(self):
        return ["influxd", "run", "-config", str(self.home / "influxdb.conf")], {}

    def healthy(self) -> bool:
        try:
            return self.get("/ping").status_code == 204
        except requests.RequestException:
            return False

    def query(self, q: str, db: str | None = None) -> dict:
        """Run an InfluxQL statement (times in ns); an error answer raises StackError naming it."""
        writer = store.InfluxDBWriter(self.url, db)
        try:
            return writer.query(q, db=db)
        except (RuntimeError, StoreDown) as exc:
            raise StackError(str(exc)) from exc
        finally:
            writer.close()
