"""Telegraf, built pinned from the Go module proxy with only the plugins flowstat uses, running
telegraf.conf (beside this file) between the agents and InfluxDB."""

from __future__ import annotations

import filecmp
import hashlib
import os
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import requests

from flowstat.stores.influxdb import DATABASE

from .base import Service, StackError

VERSION = "v1.37.2"  # .env.example's TELEGRAF_VERSION, for the compose stack, says the same (a test checks)
# What telegraf.conf uses, procstat for procstat-fallback.conf and the agents' benchmark, and the
# file output that benchmark writes to: the fewer plugins, the fewer modules to fetch and compile.
PLUGINS = (
    "inputs.influxdb_listener",
    "inputs.socket_listener",
    "inputs.procstat",
    "outputs.influxdb",
    "outputs.file",
    "parsers.influx",
    "serializers.influx",
)
CONFIG = "telegraf.conf"
BUFFER_SAMPLES = 2_000_000  # kept while InfluxDB is down (metric_buffer_limit): about 2 GB at worst


def downloads() -> Path:
    """Where built and downloaded programs are cached: $FLOWSTAT_CACHE, else ~/.cache/flowstat."""
    if os.environ.get("FLOWSTAT_CACHE"):
        return Path(os.environ["FLOWSTAT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flowstat"


def config_text() -> str:
    return files(__package__).joinpath(CONFIG).read_text(encoding="utf-8")


def _go() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if not found:
        raise StackError("telegraf: Go is needed to build it (go >= 1.24 on the PATH or in /usr/local/go)")
    return found


def go_build_env(top: Path, bin_dir: Path) -> dict[str, str]:
    """The environment of a `go install` whose module and build caches live under ``top`` (kept
    between builds, removable: -modcacherw) and whose binary lands in ``bin_dir``; static (no cgo)."""
    return dict(
        os.environ,
        GOBIN=str(bin_dir),
        GOMODCACHE=str(top / "mod"),
        GOCACHE=str(top / "build"),
        GOPATH=str(top),
        GOFLAGS="-modcacherw",
        CGO_ENABLED="0",
    )


def build(cache: Path | None = None) -> Path:
    """The pinned Telegraf, built once (1-2 minutes cold) into CACHE/go/telegraf-VERSION-PLUGINS/telegraf."""
    top = (cache or downloads()) / "go"
    plugins = hashlib.sha256(",".join(PLUGINS).encode()).hexdigest()[:8]
    binary = top / f"telegraf-{VERSION}-{plugins}" / "telegraf"
    if binary.exists():
        return binary
    env = go_build_env(top, binary.parent)
    ldflags = f"-s -w -X github.com/influxdata/telegraf/internal.Version={VERSION.lstrip('v')}"
    tags = ",".join(("custom", *PLUGINS))
    r = subprocess.run(
        [
            _go(),
            "install",
            "-tags",
            tags,
            "-ldflags",
            ldflags,
            f"github.com/influxdata/telegraf/cmd/telegraf@{VERSION}",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0 or not binary.exists():
        raise StackError(f"telegraf: building {VERSION} failed: {r.stderr.strip()[-600:]}")
    return binary


class TelegrafServer(Service):
    health_timeout_s = 30.0
    default_port = 8186
    port_option = "telegraf-port"
    port_help = "Telegraf's HTTP listener port (its UDP and TCP listeners are on P+1)"

    @property
    def socket_port(self) -> int:
        return self.extra.get("socket_port", self.port + 1)

    def ports(self) -> list[int]:
        return [self.port, self.socket_port]

    @property
    def write_url(self) -> str:
        """Where agents send line protocol over HTTP."""
        return f"{self.url}/write"

    def link(self, stack, ports) -> None:
        self.extra["influx_url"] = f"http://127.0.0.1:{ports['influxdb']}"

    def install(self) -> None:
        # The server runs as the service user, which may not reach the cache or the package: it
        # gets its own copies.
        binary = self.home / "telegraf"
        built = build()
        if not binary.exists() or not filecmp.cmp(built, binary):
            shutil.copy2(built, binary)
        (self.home / CONFIG).write_text(config_text())

    def command(self):
        env = {
            "FLOWSTAT_TELEGRAF_HTTP": f"127.0.0.1:{self.port}",
            "FLOWSTAT_TELEGRAF_UDP": f"127.0.0.1:{self.socket_port}",
            "FLOWSTAT_TELEGRAF_TCP": f"127.0.0.1:{self.socket_port}",
            "FLOWSTAT_INFLUX_URL": self.extra["influx_url"],
            "FLOWSTAT_INFLUX_DB": DATABASE,
            "FLOWSTAT_TELEGRAF_BUFFER": str(BUFFER_SAMPLES),
            # flowstat stack's InfluxDB has no users: empty is no authentication
            "FLOWSTAT_INFLUX_USER": self.extra.get("influx_user", ""),
            "FLOWSTAT_INFLUX_PASSWORD": self.extra.get("influx_password", ""),
        }
        return [str(self.home / "telegraf"), "--config", str(self.home / CONFIG)], env

    def healthy(self) -> bool:
        try:
            return self.get("/ping").status_code == 204
        except requests.RequestException:
            return False


def generated_config_text() -> str:
    """pipelines/telegraf/telegraf.conf, which docker-compose.yml mounts: this module's configuration,
    said to be a copy."""
    return (
        "# Generated by `make generate` (python -m flowstat.generate) from src/flowstat/stack/telegraf.conf:\n"
        "# do not edit; edit that file. docker-compose.yml mounts this copy.\n" + config_text()
    )
