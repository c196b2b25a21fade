"""`make demo` (scripts/demo) end to end, on the session's stack: both runs ship live, the
buffer-overload run raises ElastAlert's "Buffer overloaded" alert, which the demo prints, and the
report of both runs is written where the demo says."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from flowstat.views.alerts import ALERTS
from support.common import ELASTALERT_RULES, ROOT

pytestmark = pytest.mark.integration
BUFFER_RULE = next(a.title for a in ALERTS if a.uid == "flowstat-buffer-overload")


def test_the_demo_shows_the_overload_alert_and_writes_the_report(stack, reachable_tmp):
    env = {
        **os.environ,
        "FLOWSTAT": str(ROOT / ".venv" / "bin" / "flowstat"),
        "FLOWSTAT_STACK_CACHE": str(stack.cache),
        "FLOWSTAT_INFLUX_PORT": str(stack["influxdb"].port),
        "FLOWSTAT_ES_PORT": str(stack["elasticsearch"].port),
        "FLOWSTAT_TELEGRAF_PORT": str(stack["telegraf"].port),
        "FLOWSTAT_ALERT_RULES": str(ELASTALERT_RULES),  # the session's ElastAlert runs them: `up` changes nothing
        "FLOWSTAT_RUNS_DIR": str(reachable_tmp / "runs"),
        "FLOWSTAT_DEMO_SECONDS": "5",
        "FLOWSTAT_ALERT_WAIT": "60",
    }
    env.pop("FLOWSTAT_ALERT_WEBHOOK", None)
    out = subprocess.run(
        [str(ROOT / "scripts" / "demo")], env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = re.search(r"^Run files +(\S+)/ and (\S+)/ ", out.stdout, re.M)
    assert runs and Path(runs.group(2)).parent == reachable_tmp / "runs", out.stdout[-2000:]
    run_id = Path(runs.group(2)).name
    assert run_id.startswith("demo-overload-")
    alerted = [line for line in out.stdout.splitlines() if f"{BUFFER_RULE}: run_id={run_id} node_id=" in line]
    assert alerted, out.stdout[-3000:]
    report = Path(re.search(r"^Report +(\S+)", out.stdout, re.M).group(1))
    html = report.read_text()
    assert report.parent.name.startswith("demo-") and run_id in html and report.parent.name in html
    assert "flowstat-buffer-overload" in html  # the report's alert section, for the overload run
