"""A harness run scraped by Debian's Prometheus (issue 45): `flowstat run --sink prometheus://...` serves
both agents' /metrics (the Python agent on the port given, the C agent on the next), and every counter
Prometheus stored is what the run's own files hold at the same time: not `rate()`, which extrapolates,
but each stored value against the file's latest sample at the scrape's timestamp: exactly that
value, or the one before it when the scrape came while the agent was taking the next round (over a
run of seconds that one interval's lag is more than 2% of a counter's increase: no looser bound holds),
and the last value stored is the last the agent took."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import pytest

from flowstat.harness.agents import find_c_agent
from flowstat.schema import prometheus
from flowstat_lab.prometheus import PrometheusServer
from support.common import ROOT, free_port

SMOKE = ROOT / "benchmark-harness" / "topologies" / "smoke.yaml"
INTERVAL_S = 0.5  # the agents' and Prometheus' both
COUNTERS = {f.field: f.name + "_total" for f in prometheus.NODE_FAMILIES if f.type == "counter"}
LP_FIELD = re.compile(r'([^,=]+)=("(?:[^"\\]|\\.)*"|[^,]+)')


def _series_from_run_file(path: Path) -> dict[str, list[tuple[float, dict]]]:
    """The Python agent's samples (the run file), by node: (time in s, sample), in time order."""
    out: dict[str, list[tuple[float, dict]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if d.get("measurement", "flowstat_node") == "flowstat_node" and "node_id" in d and "seq" in d:
            out[d["node_id"]].append((datetime.fromisoformat(d["time"].replace("Z", "+00:00")).timestamp(), d))
    return out


def _series_from_line_protocol(path: Path) -> dict[str, list[tuple[float, dict]]]:
    """The C agent's samples (its line-protocol file in the run), by node."""
    out: dict[str, list[tuple[float, dict]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        if not line.startswith("flowstat_node,"):
            continue
        head, _, rest = line.partition(" ")
        fields, _, stamp = rest.rpartition(" ")
        tags = dict(t.split("=", 1) for t in head.split(",")[1:])
        values = {k: v for k, v in LP_FIELD.findall(fields)}
        sample = {k: float(v.rstrip("iu")) for k, v in values.items() if v[0] not in '"tfTF'}  # numbers
        out[tags["node_id"]].append((int(stamp) / 1e9, sample))
    return out


def _at(series: list[tuple[float, dict]], field: str, t: float) -> list[float]:
    """The field's value in the latest sample taken at or before T, and in the one before it (a scrape
    that came while a sample was being taken still served the previous one)."""
    taken = [s[field] for at, s in series if at <= t and field in s]
    return taken[-2:]


@pytest.mark.skipif(find_c_agent() is None, reason="the C agent is not built (make -C collectors/c)")
def test_a_run_scraped_by_prometheus_stores_each_agents_counters_as_the_run_files_hold_them(tmp_path):
    port = free_port()  # and port + 1, free too (support.common.free_port), for the C agent
    run_id = "prom-harness"
    with PrometheusServer(
        tmp_path / "prom", free_port(), {"flowstat": [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]}, INTERVAL_S
    ) as prom:
        out = subprocess.run(
            [sys.executable, "-m", "flowstat.cli", "run", str(SMOKE), "--duration", "6", "--run-id", run_id]
            + ["--runs-dir", str(tmp_path / "runs"), "--agent-interval", str(INTERVAL_S), "--json"]
            + ["--sink", f"prometheus://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads(out.stdout)
        assert set(summary["agent"]["agent-c"]["sinks"]) == {
            f"prometheus://127.0.0.1:{port + 1}",
            f"file://{(tmp_path / 'runs' / run_id / 'samples-agent-c.lp').resolve()}",
        }
        stored = {
            name: prom.query(f'{name}{{run_id="{run_id}"}}[10m]', at=datetime.now().timestamp())
            for name in COUNTERS.values()
        }
    run = tmp_path / "runs" / run_id
    files = {
        "flowstat-agent-py": _series_from_run_file(run / "samples.ndjson"),
        "flowstat-agent-c": _series_from_line_protocol(run / "samples-agent-c.lp"),
    }
    checked: dict[str, int] = defaultdict(int)
    for field, name in COUNTERS.items():
        for row in stored[name]:
            agent, node = row["metric"]["agent"], row["metric"]["node_id"]
            series = files[agent][node]
            points = [(float(t), float(v)) for t, v in row["values"]]
            values = [v for _, v in points]
            assert values == sorted(values), (agent, node, name)  # a counter never goes back
            for t, v in points:  # each value the file's at the scrape's time (or the sample before)
                assert v in _at(series, field, t), (agent, node, name, t, v, _at(series, field, t))
            # exact at the end: the last value stored is the last the agent took of that counter
            assert values[-1] == [x[field] for _, x in series if field in x][-1], (agent, node, name)
            checked[agent] += len(points)
    # both agents scraped through the run, every device of the topology
    nodes = {r["metric"]["node_id"] for r in stored[COUNTERS["cpu_user_seconds"]]}
    assert {n for n in nodes if n.startswith("producer")} and {n for n in nodes if n.startswith("merger")}, nodes
    assert min(checked.values()) >= 4 * len(nodes) and set(checked) == set(files), checked
    sent = {r["metric"]["node_id"]: r for r in stored[COUNTERS["objects_sent"]]}
    assert any(float(r["values"][-1][1]) > 0 for r in sent.values()), sent  # the objects counted, not only CPU


def test_each_agent_of_a_run_gets_its_own_metrics_port_and_the_run_keeps_its_files():
    from flowstat.harness.agents import agent_sinks

    lp = Path("/runs/r/samples-agent-c.lp")
    assert agent_sinks(["prometheus://127.0.0.1:9000"], 0, lp) == ["prometheus://127.0.0.1:9000", f"file://{lp}"]
    assert agent_sinks(["prometheus://[::1]?web_config=/w.yml"], 1, lp) == [
        "prometheus://[::1]:9465?web_config=/w.yml",  # the default port's neighbour, options kept
        f"file://{lp}",
    ]
    pushed = ["prometheus://127.0.0.1:9000", "influxdb://127.0.0.1:8086/flowstat"]
    assert agent_sinks(pushed, 1, lp) == ["prometheus://127.0.0.1:9001", pushed[1]]  # a store keeps them
    assert agent_sinks([], 1, lp) == [f"file://{lp}"]
