"""Runs of a user's own pipeline (examples/python-pipeline, instrumented with flowstat.node), recorded
by the Python agent watching its endpoints directory: one whose merger's buffer fills, one with room
to spare. For the alert tests: a user's node must make the buffer-overload alert fire as a harness
node does. Made once per test session under .cache/test-fixture-runs/ (as fixture_runs)."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

from .fixture_runs import made_once, two_at_a_time

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python-pipeline" / "pipeline.py"

# The merger sends 64 kB merged objects to a sink that takes 50 ms for each (20/s), through queues
# of 5 messages and kernel buffers of 64 kB: its sends are refused for most of the run, on any machine.
OVERLOAD = ["--objects", "1000", "--rate", "500", "--size", "65536", "--merge-every", "5", "--sink-delay-ms", "50",
            "--hwm", "5", "--tcp-buffer-kb", "64"]  # fmt: skip
# 60 objects in all, fewer than the 64 a merger reads at once (a full read is its input's overload)
# and than the queues' 1,000: no buffer can fill, however long a stage stalls on a loaded machine
# (at 200/s, a 0.3 s stall of the merger, or of a worker starting, was a full read). At 10/s: 6 s.
HEALTHY = ["--objects", "60", "--rate", "10", "--merge-every", "10"]
PIPELINES = {"user-overload": OVERLOAD, "user-healthy": HEALTHY}


def make(base: Path, session: str) -> dict[str, Path]:
    return made_once(base, session, "user-runs", lambda folder: two_at_a_time(_run, folder, PIPELINES))


def _run(folder: Path, name: str, args: list[str]) -> Path:
    run_id = f"fx-{name}-{folder.name}"
    run_dir = folder / "runs" / run_id
    endpoints = run_dir / "endpoints"
    endpoints.mkdir(parents=True)
    agent = subprocess.Popen(
        [sys.executable, "-m", "flowstat.agent", "--endpoints-dir", str(endpoints), "--run-id", run_id,
         "--interval", "0.5", "--rescan", "0.25", "--self-interval", "1", "--run-file", str(run_dir / "samples.ndjson"),
         "--sink", "stdout://?format=json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pipeline = subprocess.run(
            [sys.executable, str(EXAMPLE), "all", "--endpoints-dir", str(endpoints), "--run-id", run_id,
             "--base-port", str(free_port_block()), *args],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if pipeline.returncode != 0 or "sink:" not in pipeline.stdout:
            raise RuntimeError(f"user pipeline {name} failed: {pipeline.stderr[-2000:]}")
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    if agent.returncode != 0:
        raise RuntimeError(f"the agent of {name} failed: {err[-2000:]}")
    return run_dir


def free_port_block(size: int = 20) -> int:
    """A base port whose next ``size`` ports are free now, below the ephemeral range (where other
    tests' sockets land)."""
    for _ in range(200):
        base = random.randrange(20000, 30000 - size)
        socks = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")
