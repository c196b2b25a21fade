"""The alert rules in Prometheus's form (flowstat.views.promrules, generated into
dashboards/prometheus/rules.yml), checked by promtool and unit-tested by `promtool test rules` at
each rule's edge: one step below its threshold (or its window, or its age) it stays silent, at the
edge it fires, with the labels and texts it is given."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from flowstat.schema import prometheus
from flowstat.views import alerts, promrules
from support.common import ROOT

RULES = ROOT / "dashboards" / "prometheus" / "rules.yml"
NODE = {"run_id": "r1", "host": "h1", "node_id": "m0", "role": "merger", "agent": "flowstat-agent-c"}
AGENT = {"run_id": "r1", "host": "h1", "agent": "flowstat-agent-c"}
HELD = {"run_id": "r1", "held_back_by": "merger-1"}  # what flowstat verdict --listen labels a verdict with
MiB = 1024 * 1024


def series(name: str, labels: dict[str, str], values: str) -> dict:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def fired(alert: alerts.AlertRule, labels: dict[str, str]) -> dict:
    """The alert as Prometheus gives it: the rule's group labels and its own, its texts filled in."""
    group = {k: labels[k] for k in alert.group}
    summary = alert.summary
    for k, v in labels.items():
        summary = summary.replace(f"{{{{ $labels.{k} }}}}", v)
    return {
        "exp_labels": {**group, "flowstat_alert": alert.uid},
        "exp_annotations": {"summary": summary, "description": alert.why},
    }


def case(uid: str, inputs: list[dict], at: str, fires: bool, labels: dict[str, str] = NODE) -> dict:
    alert = next(a for a in alerts.ALERTS if a.uid == uid)
    exp = [fired(alert, labels)] if fires else []
    return {
        "interval": "10s",
        "input_series": inputs,
        "alert_rule_test": [{"eval_time": at, "alertname": promrules.alert_name(alert), "exp_alerts": exp}],
    }


def overload(values: str) -> list[dict]:
    return [
        series("flowstat_node_send_buffer_overloaded", NODE, values),
        series("flowstat_node_receive_buffer_overloaded", NODE, "0x12"),
    ]


def latency(values: str, in_flight: str = "0x40") -> list[dict]:
    return [
        series("flowstat_node_input_latency_p99_seconds", NODE, values),
        series("flowstat_node_objects_in_flight", NODE, in_flight),
    ]


def held(values: str, by: str = "merger-1") -> list[dict]:
    """The run's latest verdict each 10 s: held back by ``by`` while the values say 1, and a verdict
    "none" throughout (its held_nodes 0, no held_back_by), as the service serves them."""
    return [
        series("flowstat_verdict_held_nodes", {**HELD, "held_back_by": by}, values),
        series("flowstat_verdict_held_nodes", {"run_id": "r1"}, "0x12"),
    ]


def vmrss(per_min: float, steps: int) -> list[dict]:
    per_step = per_min / 6  # a scrape every 10 s
    return [series("flowstat_node_resident_memory_bytes", NODE, f"{100 * MiB}+{per_step}x{steps}")]


# (what it shows, the case): each pair one step either side of an edge
CASES = {
    "overload: no flag in the window": case("flowstat-buffer-overload", overload("0x12"), "2m", False),
    "overload: one flagged scrape": case("flowstat-buffer-overload", overload("0x5 1 0x6"), "2m", True),
    "overload: flagged 70 s before, out of the 60 s window": case(
        "flowstat-buffer-overload", overload("1 0x12"), "70s", False
    ),
    "behind: p99 rising but under 1 s": case("flowstat-merger-behind", latency("0.99+0.0001x40"), "5m", False),
    "behind: p99 over 1 s and rising, for 30 s": case(
        "flowstat-merger-behind", latency("1.0001+0.0001x40"), "5m", True
    ),
    "behind: over 1 s, rising, but not yet for 30 s": case(
        "flowstat-merger-behind", latency("0.5x10 1.0001+0.0001x30"), "120s", False
    ),
    "behind: in flight up 999 in 30 s": case("flowstat-merger-behind", latency("0.1x40", "0+333x40"), "5m", False),
    "behind: in flight up 1,002 in 30 s, for 30 s": case(
        "flowstat-merger-behind", latency("0.1x40", "0+334x40"), "5m", True
    ),
    "memory: 1% under 10 MB/min": case("flowstat-vmrss-growing", vmrss(10 * MiB * 0.99, 40), "5m", False),
    "memory: 1% over 10 MB/min": case("flowstat-vmrss-growing", vmrss(10 * MiB * 1.01, 40), "5m", True),
    "memory: over, but the series is 140 s old": case("flowstat-vmrss-growing", vmrss(20 * MiB, 14), "140s", False),
    "memory: over, the series 150 s old": case("flowstat-vmrss-growing", vmrss(20 * MiB, 15), "150s", True),
    "gone: never DOWN": case(
        "flowstat-node-down",
        [series("flowstat_node_state", {**NODE, "flowstat_node_state": "DOWN"}, "0x12")],
        "2m",
        False,
    ),
    "gone: one scrape DOWN": case(
        "flowstat-node-down",
        [series("flowstat_node_state", {**NODE, "flowstat_node_state": "DOWN"}, "0x11 1")],
        "2m",
        True,
    ),
    "spooling: spool holds samples, not growing": case(
        "flowstat-agent-spooling", [series("flowstat_agent_spooled_samples", AGENT, "5x12")], "2m", False, AGENT
    ),
    "spooling: spool grew by one in a minute": case(
        "flowstat-agent-spooling", [series("flowstat_agent_spooled_samples", AGENT, "5x6 6x6")], "2m", True, AGENT
    ),
    "held: named for 50 s": case("flowstat-held-back", held("1x5"), "50s", False, HELD),
    "held: named for 60 s": case("flowstat-held-back", held("1x6"), "60s", True, HELD),
    # a verdict that does not name it (the series ends: stale) restarts the 60 s
    "held: named 60 s with a gap at 30 s": case("flowstat-held-back", held("1x2 stale 1x3"), "60s", False, HELD),
    "held: named 60 s since the gap": case("flowstat-held-back", held("1x2 stale 1x9"), "100s", True, HELD),
}


def test_the_committed_rules_are_the_generated_ones_and_promtool_checks_them():
    assert RULES.read_text() == promrules.rules_text()
    recorded = promrules.recording_rules()
    out = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    total = len(promrules.RULED) + len(recorded)
    assert out.returncode == 0 and f"SUCCESS: {total} rules found" in out.stdout, out.stdout + out.stderr
    groups = {g["name"]: g["rules"] for g in yaml.safe_load(RULES.read_text())["groups"]}
    assert [r["labels"]["flowstat_alert"] for r in groups[promrules.GROUP]] == [a.uid for a in promrules.RULED]
    # recorded: level:metric:operations, one per name, the alerts' quantities among them
    names = [r["record"] for r in groups[promrules.RECORDING_GROUP]]
    assert len(set(names)) == len(names) and all(n.count(":") == 2 for n in names)
    assert "run_node_agent:flowstat_node_resident_memory_bytes:deriv300s_per_min" in names
    assert "run_role:flowstat_node_objects_sent:rate1m" in names


def run_cases(tmp_path: Path, rules: Path, cases: dict[str, dict]) -> subprocess.CompletedProcess:
    tests = tmp_path / "tests.yml"
    tests.write_text(
        yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "10s", "tests": list(cases.values())})
    )
    return subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True)


def test_each_rule_fires_at_its_edge_and_not_one_step_below(tmp_path):
    out = run_cases(tmp_path, RULES, CASES)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_recorded_series_are_the_alerts_quantities_and_the_panels_sums(tmp_path):
    """promtool's promql_expr_test on a few recorded series: a rate per role summed over two nodes,
    a rise over the alert's window, a sum of flagged scrapes, a slope per minute."""
    sender = {**NODE, "node_id": "p0", "role": "producer"}
    inputs = [
        series("flowstat_node_objects_sent_total", sender, "0+100x20"),  # 10/s each
        series("flowstat_node_objects_sent_total", {**sender, "node_id": "p1"}, "0+200x20"),  # 20/s
        series("flowstat_node_objects_in_flight", NODE, "0+100x20"),
        *overload("0x5 1 1 0x5"),
        *vmrss(12 * MiB, 40),
    ]
    run_role = {"run_id": NODE["run_id"], "role": "producer"}
    node = {k: NODE[k] for k in ("run_id", "node_id", "agent")}

    def expect(expr: str, labels: dict[str, str], value: float) -> dict:
        return {
            "expr": expr,
            "eval_time": "3m",
            "exp_samples": [{"labels": series(expr, labels, "")["series"], "value": value}],
        }

    test = {
        "interval": "10s",
        "input_series": inputs,
        "promql_expr_test": [
            expect("run_role:flowstat_node_objects_sent:rate1m", run_role, 30),
            expect("run_node_agent:flowstat_node_objects_in_flight:rise30s", node, 300),
            expect("run_node_agent:flowstat_node_send_buffer_overloaded:sum_over_time60s", node, 0),
            expect("run_node_agent:flowstat_node_resident_memory_bytes:deriv300s_per_min", node, 12 * MiB),
        ],
    }
    tests = tmp_path / "recorded.yml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "10s", "tests": [test]}))
    out = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_held_back_rule_reads_what_flowstat_verdict_serves():
    """The rule's family and labels are those of the verdict service's /metrics (the verdict schema's
    held field and tags), so a served verdict is one the rule sees; the other engines' count over the
    window is Prometheus's ``for``."""
    (rule,) = [
        r for r in promrules.rules()["groups"][0]["rules"] if r["labels"]["flowstat_alert"] == "flowstat-held-back"
    ]
    served = next(f for f in prometheus.VERDICT_FAMILIES if f.field == "held")
    assert rule["expr"] == f"max by ({', '.join(prometheus.VERDICT_LABELS)}) ({served.name}) >= 1"
    alert = next(a for a in alerts.ALERTS if a.uid == "flowstat-held-back")
    assert rule["for"] == f"{alert.window_s}s" and alert.group == prometheus.VERDICT_LABELS
    assert not any("verdict" in r["expr"] for r in promrules.recording_rules())


@pytest.mark.parametrize("uid", [a.uid for a in promrules.RULED])
def test_a_threshold_moved_turns_a_case_red(tmp_path, uid):
    """Each rule's threshold moved (doubled, or a count's 0 to 1): one of its cases fails."""
    rules = yaml.safe_load(RULES.read_text())
    for r in next(g for g in rules["groups"] if g["name"] == promrules.GROUP)["rules"]:
        if r["labels"]["flowstat_alert"] == uid:
            r["expr"] = r["expr"].replace("> 0\n", "> 1\n").replace(") > 0", ") > 1").replace("> 1 ", "> 2 ")
            r["expr"] = r["expr"].replace("> 1000", "> 1010").replace("> 10485760", "> 10800000")
            r["expr"] = r["expr"].replace("offset 150s", "offset 160s").replace(") >= 1", ") >= 2")
    moved = tmp_path / "moved.yml"
    moved.write_text(yaml.safe_dump(rules))
    mine = {
        k: c for k, c in CASES.items() if promrules.alert_name(next(a for a in alerts.ALERTS if a.uid == uid)) in str(c)
    }
    assert mine
    out = run_cases(tmp_path, moved, mine)
    assert out.returncode != 0, f"{uid}: moving its threshold changed no case"
