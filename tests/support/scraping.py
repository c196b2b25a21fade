"""What the Prometheus tests of both agents share: Debian's Prometheus scraping an agent that samples
a busy process, and the check that each CPU counter value it stored is one the agent sampled."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from flowstat_lab.prometheus import PrometheusServer
from support.agents import wait_until
from support.common import free_port


def scrape_until_down(tmp_path: Path, port: int, busy: subprocess.Popen) -> tuple[list[float], list[dict]]:
    """Scrapes of the agent on PORT every second until BUSY has ended and a scrape said DOWN: every
    cpu_user_seconds_total value Prometheus stored for it, and the answer at that scrape's time."""
    with PrometheusServer(tmp_path / "prom", free_port(), {"agent": [f"127.0.0.1:{port}"]}, 1.0) as prom:
        prom.wait_for_scrapes("agent", 4)
        busy.wait(30)  # its spinning is over: the agent reports it DOWN
        node = f'node_id=~".*-{busy.pid}"'
        series = f"flowstat_node_cpu_user_seconds_total{{{node}}}"
        state = f'flowstat_node_state{{{node},flowstat_node_state="DOWN"}}'

        def down_scraped() -> bool:
            rows = prom.query(state)
            return bool(rows) and rows[0]["value"][1] == "1"

        wait_until(down_scraped, "a scrape of the node reported DOWN", timeout=30, poll=0.2)
        scraped_at = float(prom.query(f"timestamp({state})")[0]["value"][1])
        final = prom.query(series, at=scraped_at)  # in the scrape that said DOWN: its final count
        stored = [float(v) for _, v in prom.query(f"{series}[5m]")[0]["values"]]
    return stored, final


def assert_scraped_exactly(stored: list[float], final: list[dict], samples: Path, pid: int) -> None:
    sampled = [
        d["cpu_user_seconds"] for d in map(json.loads, open(samples)) if d.get("pid") == pid and "cpu_user_seconds" in d
    ]
    assert len(set(stored)) >= 3, stored  # it spun: the counter moved between scrapes
    assert set(stored) <= set(sampled), (stored, sampled)  # no value Prometheus made up or rounded
    assert stored == sorted(stored)  # a counter never goes back
    assert stored[-1] == sampled[-1]  # the final count, after the node was gone
    assert final and float(final[0]["value"][1]) == sampled[-1]


def last_sampled(samples: Path, pid: int, field: str = "cpu_user_seconds") -> float:
    """The last value of a field the agent's file sink (JSON) holds for PID."""
    values = [d[field] for d in map(json.loads, open(samples)) if d.get("pid") == pid and field in d]
    assert values, f"no {field} sampled for pid {pid}"
    return values[-1]


def stored_values(prom: PrometheusServer, series: str) -> list[float]:
    """Every value Prometheus stored for a series in the last 5 minutes (none: [])."""
    rows = prom.query(f"{series}[5m]")
    return [float(v) for _, v in rows[0]["values"]] if rows else []
