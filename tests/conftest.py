"""Shared fixtures: a scratch runs directory, and small topologies built in code."""

from __future__ import annotations

import os
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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
