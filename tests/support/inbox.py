"""A real `flowstat inbox` process for the tests that send it alerts (test_inbox, test_elastalert)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import requests

from support.agents import wait_until
from support.common import free_port


class Inbox:
    """A `flowstat inbox` process on a free loopback port."""

    def __init__(self, log: Path, env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowstat.cli",
                "inbox",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--log",
                str(log),
                "--grafana-url",
                "http://grafana.example:3000",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        wait_until(self.healthy, "the inbox to answer", timeout=30)

    def healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/health", timeout=2).status_code == 200
        except requests.RequestException:
            assert self.proc.poll() is None, self.proc.stderr.read()
            return False

    def listed(self, run: str | None = None) -> list[dict]:
        return requests.get(f"{self.url}/alerts.json", params={"run": run} if run else None, timeout=5).json()

    def stop(self) -> tuple[str, str]:
        self.proc.terminate()
        return self.proc.communicate(timeout=30)
