"""Runs the tests make and check alike: the no-loss assertions, small campaigns, run files written
by hand, and waiting for a file a real process writes."""

from __future__ import annotations

import json
import time
from pathlib import Path


def small(**changes) -> dict:
    """A campaign of two light configurations (4 producers, 1 kB, 1 merger)."""
    data = {
        "campaign": "small",
        "duration": 20,
        "topology": {"object": {"type": "TH1F", "size": "1kB"}, "producers": {"count": 4, "rate": 100}, "mergers": 1},
        "sweep": {"parameter": "buffer_size", "values": [10, 100]},
    }
    data.update(changes)
    return data


def assert_no_loss(summary):
    c = summary["conservation"]
    assert c["ok"], (c, summary["failures"])
    assert summary["ok"] and not summary["failures"], summary["failures"]
    assert c["objects_sent"] == c["objects_received"] == c["objects_merged_in"] > 0
    assert c["sequence_gaps"] == 0 and c["reordered_objects"] == 0
    assert c["entries_sent"] == c["entries_at_viewer"]


def wait_for_file(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)  # polling for a file that a real process writes


def make_run_file(path: Path, run_id: str, n: int, nodes: int = 10) -> None:
    from flowstat.timeutil import iso_utc_ms

    t0 = 1_795_000_000.0
    with open(path, "w") as f:
        f.write(json.dumps({"flowstat_run": {"run_id": run_id, "parameters": {"producers": 3, "mergers": 1}}}) + "\n")
        for i in range(n):
            node = i % nodes
            f.write(
                json.dumps(
                    {
                        "time": iso_utc_ms(t0 + (i // nodes) * 0.1),
                        "run_id": run_id,
                        "host": "h",
                        "node_id": f"node-{node}",
                        "role": "merger",
                        "agent": "flowstat-agent-py",
                        "seq": i // nodes,
                        "pid": 1000 + node,
                        "node_state": "RUNNING",
                        "vmrss_kb": 1000 + i,
                        "cpu_clock_hz": 0.5 * i,
                    }
                )
                + "\n"
            )
