"""Runs made by the harness for the dashboard, alert and report tests: a healthy run, one whose
producers overload their buffers, and one whose merger falls behind. Made once per test session
(shared by the pytest-xdist workers through a lock) under .cache/test-fixture-runs/."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

TOPOLOGIES = {
    # Paced well under what one merger takes: nothing overloads, latency stays in milliseconds.
    "healthy": {"duration": 12, "buffer_size": 100, "object": {"type": "TH1F", "size": "1kB"},
                "producers": {"count": 4, "rate": 100}, "mergers": 1},
    # A buffer of one message and 12,000 objects/s offered: sends are refused (thesis section 5.1).
    "overload": {"duration": 8, "buffer_size": 1, "object": {"type": "TH1F", "size": "1kB"},
                 "producers": {"count": 4, "rate": 3000}, "mergers": 1},
    # 1.6 GB/s of 1 MB objects offered to one merger that takes about 1 GB/s: its queue, latency and
    # memory grow for the whole run (tests/test_online.py measured it).
    "behind": {"duration": 12, "buffer_size": 100000, "object": {"type": "TH1F", "size": "1MB"},
               "producers": {"count": 4, "rate": 400, "processes": 2}, "mergers": 1},
}


def make(base: Path, session: str) -> dict[str, Path]:
    """The fixture runs of this session: made by the first caller, found by the others."""
    folder = base / session
    folder.mkdir(parents=True, exist_ok=True)
    with open(base / f"{session}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "runs.json"
        if not done.exists():
            runs = {name: str(_run(folder, name, topo)) for name, topo in TOPOLOGIES.items()}
            done.write_text(json.dumps(runs))
    return {k: Path(v) for k, v in json.loads(done.read_text()).items()}


def _run(folder: Path, name: str, topo: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"run_id": f"fx-{name}", **topo}))
    run_id = f"fx-{name}-{folder.name}"
    r = subprocess.run([sys.executable, "-m", "flowstat", "run", str(path), "--run-id", run_id, "--runs-dir",
                        str(folder / "runs"), "--quiet", "--json"], capture_output=True, text=True, timeout=300)
    run_dir = folder / "runs" / run_id
    if not (run_dir / "samples.ndjson").exists():
        raise RuntimeError(f"fixture run {name} failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return run_dir


def samples(run_dir: Path) -> tuple[dict, list[dict]]:
    """The run file's header and node samples."""
    lines = (run_dir / "samples.ndjson").read_text().splitlines()
    head = json.loads(lines[0])
    return head, [d for d in map(json.loads, lines[1:]) if "node_id" in d]
