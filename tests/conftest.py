"""Shared fixtures: a scratch runs directory, and small topologies built in code."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = ROOT / "benchmark-harness" / "topologies"


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    return d


def topology_dict(**overrides) -> dict:
    base = {
        "run_id": "test",
        "duration": 2,
        "buffer_size": 100,
        "object": {"type": "TH1F", "size": "1kB"},
        "producers": {"count": 4, "rate": 200},
        "mergers": 1,
    }
    base.update(overrides)
    return base


def pid_alive(pid: int) -> bool:
    from flowstat.procfs import is_alive

    return is_alive(pid)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def stack():
    """Real InfluxDB and Elasticsearch on loopback, started by the project's own stack code.

    Installs are cached in .cache/test-stack (a server's download happens once); data is wiped
    at the end so each session starts clean.
    """
    import shutil

    from flowstat.stack import Stack

    cache = ROOT / ".cache" / "test-stack"
    ports = {"influxdb": _free_port(), "elasticsearch": _free_port(), "telegraf": _free_port()}
    s = Stack(cache, ports)
    s.up(report=lambda msg: None)
    yield s
    s.down(report=lambda msg: None)
    for sub in ("influxdb/data", "influxdb/meta", "influxdb/wal", "elasticsearch/data", "stack.json"):
        target = cache / sub
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
