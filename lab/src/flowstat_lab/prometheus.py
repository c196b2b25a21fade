"""Debian's Prometheus server on a loopback port, scraping what a test names, and asked over its HTTP API.

with PrometheusServer(tmp_path, PORT, {"agent": ["127.0.0.1:9464"]}, scrape_interval_s=1) as prom:
    prom.wait_for_scrapes("agent", 3)
    prom.query('flowstat_node_cpu_user_seconds_total[1m]')

A job is its targets, or a mapping of its targets and more of Prometheus' scrape_config keys, e.g.
over TLS with a password: {"agent": {"targets": ["127.0.0.1:9464"], "scheme": "https",
"tls_config": {"ca_file": "ca.crt"}, "basic_auth": {"username": "u", "password": "p"}}}.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests


class PrometheusServer:
    def __init__(
        self,
        home: Path,
        port: int,
        jobs: Mapping[str, list[str] | dict[str, Any]],
        scrape_interval_s: float = 1.0,
        storage: Path | None = None,
        rule_files: Sequence[Path] = (),
    ):
        """``storage``: the TSDB folder (default HOME/data), e.g. blocks flowstat replay wrote;
        ``rule_files``: rules it evaluates (each group at its own interval)."""
        if not shutil.which("prometheus"):
            raise RuntimeError("prometheus is not installed (Debian's prometheus package: make test installs it)")
        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        interval = f"{int(scrape_interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [_scrape_config(job, t) for job, t in jobs.items()],
            **({"rule_files": [str(f) for f in rule_files]} if rule_files else {}),
        }
        (home / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self.proc: subprocess.Popen[bytes] | None = None
        self.storage = storage or home / "data"

    def __enter__(self) -> PrometheusServer:
        self.log = open(self.home / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={self.home / 'prometheus.yml'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--storage.tsdb.path={self.storage}",
                "--web.enable-lifecycle",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"prometheus did not start: {(self.home / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)  # polling its readiness endpoint

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """The result of an instant query (at a time, or now); an error answer raises, naming it."""
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        answer = requests.get(f"{self.url}/api/v1/query", params=params, timeout=30).json()
        if answer.get("status") != "success":
            raise RuntimeError(f"prometheus: {promql}: {answer.get('error')}")
        return answer["data"]["result"]

    def query_range(self, promql: str, start: float, end: float, step_s: float = 1.0) -> list[dict[str, Any]]:
        """The series of a range query over [start, end] (epoch s), one point each ``step_s``."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        answer = requests.get(f"{self.url}/api/v1/query_range", params=params, timeout=30).json()
        if answer.get("status") != "success":
            raise RuntimeError(f"prometheus: {promql}: {answer.get('error')}")
        return answer["data"]["result"]

    def targets(self) -> list[dict[str, Any]]:
        answer = requests.get(f"{self.url}/api/v1/targets", timeout=30).json()
        return answer["data"]["activeTargets"]

    def wait_for_scrapes(self, job: str, scrapes: int, timeout_s: float = 60) -> None:
        """Until the job's targets were each scraped successfully `scrapes` times (up counted)."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.query(f'count_over_time(up{{job="{job}"}}[10m])')
            healthy = self.query(f'min(min_over_time(up{{job="{job}"}}[10m]))')
            if rows and min(float(r["value"][1]) for r in rows) >= scrapes and healthy:
                if float(healthy[0]["value"][1]) < 1:
                    errors = [t.get("lastError") for t in self.targets()]
                    raise RuntimeError(f"prometheus: a scrape of {job} failed: {errors}")
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"prometheus: {job} not scraped {scrapes} times in {timeout_s:g} s: {self.targets()}"
                )
            time.sleep(0.2)  # polling the server's own record of its scrapes


def _scrape_config(job: str, spec: list[str] | dict[str, Any]) -> dict[str, Any]:
    """A job's scrape_config: its targets, and the other keys given with them."""
    if isinstance(spec, list):
        return {"job_name": job, "static_configs": [{"targets": spec}]}
    rest = {k: v for k, v in spec.items() if k != "targets"}
    return {"job_name": job, "static_configs": [{"targets": spec["targets"]}], **rest}
