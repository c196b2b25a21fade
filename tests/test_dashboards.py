"""The generated Grafana dashboards and alert rules, run for real: every query expanded as Grafana
expands it (lab/src/flowstat_lab/grafana.py) and run on the real InfluxDB holding harness-made runs
(tests/support/fixture_runs.py), compared with what this test computes from the run files itself."""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from flowstat import replay
from flowstat.schema import flow as flow_schema
from flowstat.schema import sample as sample_schema
from flowstat.synthetic import synthesize
from flowstat.timeutil import iso_utc_ms
from flowstat.views import ALERTS, VIEWS, alerts, grafana, influxql, kibana, panels
from flowstat.views.panels import AGGREGATE_VIEW, RUN_VIEW
from flowstat_lab import grafana as gx
from flowstat_lab import kibana as lens_es
from support import fixture_runs as fx
from support import verdicts as vx
from support.common import ROOT, narrowed_rule

AGENT = "flowstat-agent-py"  # the agent whose samples the run file holds
MAX_POINTS = 1000
SAMPLE_ALERTS = [a for a in ALERTS if a.source != panels.VERDICT]  # the alerts on samples (the fixture runs')


@pytest.fixture(scope="module")
def loaded(stack, fixture_runs):
    """The fixture runs replayed into the stack's InfluxDB and Elasticsearch (idempotent)."""
    replay.replay(
        [d / "samples.ndjson" for d in fixture_runs.values()],
        {
            "influxdb": (stack["influxdb"].url, "flowstat"),
            "elasticsearch": (stack["elasticsearch"].url, "flowstat-samples"),
        },
    )
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=30)
    return {name: (d, *fx.samples(d)) for name, d in fixture_runs.items()}


@pytest.fixture(scope="module")
def memory(stack, fixture_runs, loaded):
    """Seven minutes of one merger's memory growing beside a flat one (fixture_runs.memory_growth),
    replayed into both stores."""
    run_dir = fx.memory_growth(fixture_runs["healthy"], fixture_runs["healthy"].parents[1])
    replay.replay(
        [run_dir / "samples.ndjson"],
        {
            "influxdb": (stack["influxdb"].url, "flowstat"),
            "elasticsearch": (stack["elasticsearch"].url, "flowstat-samples"),
        },
    )
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=30)
    return (run_dir, *fx.samples(run_dir))


def influx(stack, query: str) -> list[dict]:
    r = requests.post(
        f"{stack['influxdb'].url}/query", params={"db": "flowstat", "q": query, "epoch": "ms"}, timeout=30
    )
    body = r.json()
    assert r.status_code == 200 and "error" not in body["results"][0], (query, body)
    return body["results"][0].get("series", [])


def ms(iso: str) -> int:
    return sample_schema.time_ns(iso) // 1_000_000


def span_ms(samples: list[dict]) -> tuple[int, int]:
    times = [ms(s["time"]) for s in samples]
    return min(times) - 5000, max(times) + 5000


def panel(view, title):
    return next(p for p in view.panels() if p.title == title)


def run_view_query(p, run_id: str, from_ms: int, to_ms: int, node: list[str] | None = None) -> tuple[str, int]:
    """The panel's query for the run, every role picked one by one and the nodes given (or four);
    node [gx.ALL]: role and node on "All", as Grafana sends them (their custom all value, .*)."""
    variables = {
        "run": [run_id],
        "agent": [AGENT],
        "role": [gx.ALL] if node == [gx.ALL] else ["producer", "merger", "viewer", "other"],
        "node": node or ["merger-0", "producers-0", "producers-1", "viewer"],
    }
    return gx.panel_query(RUN_VIEW, p, variables, from_ms, to_ms, MAX_POINTS)


def test_all_is_sent_as_the_custom_all_value_and_only_where_a_variable_has_one():
    """Grafana inserts a variable's custom all value as it is (scenes' CustomAllValue: never
    escaped); the role and node variables have .*, so "All" is a short regex on any number of nodes."""
    query = grafana._target(RUN_VIEW, panel(RUN_VIEW, "CPU clock"))["query"]
    every = {"run": ["r.1"], "agent": ["a"], "role": [gx.ALL], "node": [gx.ALL]}
    got = gx.view_interpolate(RUN_VIEW, query, every)
    assert '"run_id" =~ /^r\\.1$/ AND "agent" =~ /^a$/ AND "role" =~ /^.*$/ AND "node_id" =~ /^.*$/' in got
    picked = gx.view_interpolate(RUN_VIEW, query, {**every, "node": ["m-0~1", "m-0~2"]})
    assert '"node_id" =~ /^(m-0~1|m-0~2)$/' in picked
    with pytest.raises(ValueError, match="custom all value"):
        gx.view_interpolate(RUN_VIEW, query, {**every, "agent": [gx.ALL]})


# -- generated files ----------------------------------------------------------------------------


def test_every_panel_and_rule_uses_the_provisioned_datasources_and_allowed_panel_types():
    files = grafana.files()
    uids = {d["uid"] for d in yaml.safe_load(files["provisioning/datasources/flowstat.yaml"])["datasources"]}
    for view in VIEWS:
        dash = json.loads(files[f"dashboards/{view.uid}.json"])
        for p in dash["panels"]:
            assert p["type"] in ("row", "timeseries", "stat", "table", "bargauge", "state-timeline"), p["type"]
            if p["type"] != "row":
                assert p["datasource"]["uid"] in uids
                assert all(t["datasource"]["uid"] in uids for t in p["targets"])
    rules = yaml.safe_load(files["provisioning/alerting/rules.yaml"])["groups"][0]["rules"]
    assert {r["uid"] for r in rules} == {a.uid for a in ALERTS}
    for r in rules:
        assert r["noDataState"] and r["execErrState"] and r["for"]
        refs = {d["refId"] for d in r["data"]}
        assert r["condition"] in refs
        for d in r["data"]:
            assert d["datasourceUid"] in uids | {"__expr__"}
            if d["datasourceUid"] == "__expr__" and "expression" in d["model"]:
                assert all(
                    ref.lstrip("$") in refs
                    for ref in d["model"]["expression"].replace("(", " ").replace(")", " ").split()
                    if ref.startswith("$")
                ), d
    assert "password" not in files["provisioning/datasources/flowstat.yaml"].replace("Password}", "").replace(
        "password: ${", ""
    )


# -- the run view -------------------------------------------------------------------------------


def test_the_run_variable_lists_runs_newest_first_labelled_with_their_parameters(stack, loaded):
    series = influx(stack, gx.expand(influxql.variable_query("run"), 0, 0, 1000))
    values = [row[1] for row in series[0]["values"]]
    options = gx.variable_options(values, influxql.RUN_LABEL_REGEX)
    ids = [v for _, v in options]
    started = {
        json.loads((d / "run.json").read_text())["run_id"]: json.loads((d / "run.json").read_text())["started"]
        for d, _, _, _ in loaded.values()
    }
    ours = [i for i in ids if i in started]
    assert ours == sorted(started, key=started.get, reverse=True)
    text = dict((v, t) for t, v in options)[loaded["healthy"][1]["flowstat_run"]["run_id"]]
    assert "4 x 100/s TH1F 1 kB, buffer 100, 1 merger" in text


def test_every_run_view_panel_returns_data_for_the_run(stack, loaded):
    run_dir, head, samples, _ = loaded["overload"]
    run_id = head["flowstat_run"]["run_id"]
    from_ms, to_ms = span_ms(samples)
    empty = []
    for p in RUN_VIEW.panels():
        if p.source in panels.FLOW_SOURCES:
            continue  # flowstat verdict's series: test_the_flow_panels_show_the_runs_verdicts_and_edges
        query, _ = run_view_query(p, run_id, from_ms, to_ms)
        if not influx(stack, query):
            empty.append((p.title, query))
    assert not empty, empty


@pytest.fixture(scope="module")
def many_nodes(stack, fixture_runs, loaded, tmp_path_factory):
    """The healthy run copied to NODES_PER_PANEL + 40 nodes (NODE~0 ... NODE~12 or more: "~10" sorts before
    "~2"), 6 samples each, replayed into both stores (again by another worker: the same points)."""
    healthy = fixture_runs["healthy"]
    nodes = panels.NODES_PER_PANEL + 40
    run_id = healthy.name.replace("fx-healthy-", f"fx-{nodes}-nodes-")
    run_dir = tmp_path_factory.mktemp("many") / run_id
    synthesize(healthy, run_dir, nodes, 6, run_id=run_id)
    replay.replay(
        [run_dir / "samples.ndjson"],
        {
            "influxdb": (stack["influxdb"].url, "flowstat"),
            "elasticsearch": (stack["elasticsearch"].url, "flowstat-samples"),
        },
    )
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=30)
    return (run_dir, *fx.samples(run_dir))


def test_a_per_node_panel_draws_the_first_selected_nodes_by_name_the_same_in_grafana_and_kibana(stack, many_nodes):
    _, head, samples, _ = many_nodes
    run_id = head["flowstat_run"]["run_id"]
    names = sorted({s["node_id"] for s in samples})
    first = names[: panels.NODES_PER_PANEL]
    assert len(names) > len(first) and "merger-0~10" in first and "merger-0~2" in first
    from_ms, to_ms = span_ms(samples)
    for p in [p for p in RUN_VIEW.panels() if panels.per_node(p)]:
        query, _ = run_view_query(p, run_id, from_ms, to_ms, node=names)
        series = influx(stack, query)
        assert series, (p.title, query)
        drawn = {s["tags"]["node_id"] for s in series}
        every, _ = run_view_query(p, run_id, from_ms, to_ms, node=[gx.ALL])  # "All": the same nodes
        assert {s["tags"]["node_id"] for s in influx(stack, every)} == drawn, p.title
        have = {
            s["node_id"]
            for s in samples
            if any(s.get(m.field) is not None for m in p.metrics) and all(s.get(k) == v for k, v in p.where)
        }
        # The first nodes by name take the places, a node without the metric too (it draws nothing)
        assert drawn == have & set(first), p.title
        lens = lens_es.by_id("lens")[kibana.lens_id(RUN_VIEW, p)]
        (layer,) = lens_es.layers(lens).values()
        (split,) = [c for c, col in layer["columns"].items() if col.get("sourceField") == "node_id"]
        rows = lens_es.run_lens(stack["elasticsearch"].url, lens, (from_ms, to_ms), run_id)
        drawn_by_lens = {
            r[split].split("|")[0]  # node state's split: "node|state"
            for r in rows
            if any(r[c] is not None for c in lens_es.shown(layer))
        }
        assert drawn_by_lens == drawn, p.title
    vmrss = influx(stack, run_view_query(panel(RUN_VIEW, "VmRSS"), run_id, from_ms, to_ms, node=names)[0])
    assert [s["tags"]["node_id"] for s in vmrss] == first  # every node has a VmRSS: all of the first


def test_the_merged_rate_panel_equals_the_run_files_mean_per_bucket(stack, loaded):
    _, head, samples, _ = loaded["behind"]
    run_id = head["flowstat_run"]["run_id"]
    from_ms, to_ms = span_ms(samples)
    query, interval = run_view_query(panel(RUN_VIEW, "Merged objects/s"), run_id, from_ms, to_ms, ["merger-0"])
    got = {row[0]: row[1] for s in influx(stack, query) for row in s["values"]}
    buckets = defaultdict(list)
    for s in samples:
        if s["node_id"] == "merger-0" and s.get("merged_objects_per_second") is not None:
            t = ms(s["time"])
            buckets[t - t % interval].append(s["merged_objects_per_second"])
    want = {t: float(np.mean(v)) for t, v in buckets.items()}
    assert len(want) >= 5 and set(got) == set(want)
    for t in want:
        assert got[t] == pytest.approx(want[t], rel=1e-9)


def test_the_run_stats_show_the_runs_parameters_and_verdicts(stack, loaded):
    run_dir, head, _, _ = loaded["healthy"]
    doc = json.loads((run_dir / "run.json").read_text())
    for title in ("Parameters", "Verdicts", "Lost and steady rate"):
        query, _ = run_view_query(panel(RUN_VIEW, title), doc["run_id"], 0, 0)
        (series,) = influx(stack, query)
        row = dict(zip(series["columns"], series["values"][0], strict=False))
        if title == "Parameters":
            assert row["producers"] == doc["parameters"]["producers"] == 4
            assert row["buffer_size"] == doc["parameters"]["buffer_size"]
        elif title == "Verdicts":
            assert row["no loss"] is doc["verdict"]["conserved"] is True
        else:
            assert row["lost objects"] == doc["summary"]["objects_sent"] - doc["summary"]["objects_received"] == 0


# -- the aggregate view -------------------------------------------------------------------------


def test_the_rollup_sums_over_nodes_per_ten_second_bucket(stack, loaded):
    _, head, samples, _ = loaded["overload"]
    run_id = head["flowstat_run"]["run_id"]
    from_ms, to_ms = span_ms(samples)
    from_ms -= from_ms % 10_000  # a rollup point is stamped with its bucket's start
    target = grafana._target(AGGREGATE_VIEW, panel(AGGREGATE_VIEW, "Total vmrss_kb"))
    q = gx.interpolate(target["query"], {"run": [run_id], "agent": [AGENT]}, multi=set())
    got = {
        (s["tags"]["role"], row[0]): row[1]
        for s in influx(stack, gx.expand(q, from_ms, to_ms, 10_000))
        for row in s["values"]
    }
    per_node = defaultdict(list)
    for s in samples:
        if s.get("vmrss_kb") is not None:
            t = ms(s["time"])
            per_node[(s["role"], s["node_id"], t - t % 10_000)].append(s["vmrss_kb"])
    want = defaultdict(float)
    for (role, _, bucket), values in per_node.items():
        want[(role, bucket)] += float(np.mean(values))
    assert got.keys() == want.keys() and len(want) >= 3
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9)


def test_the_cross_run_table_has_each_runs_mean_and_std(stack, loaded):
    ids = {name: h["flowstat_run"]["run_id"] for name, (_, h, _, _) in loaded.items()}
    target = grafana._target(AGGREGATE_VIEW, panel(AGGREGATE_VIEW, "Mean and standard deviation per run"))
    q = gx.expand(
        gx.interpolate(target["query"], {"runs": list(ids.values()), "agent": [AGENT]}, multi={"runs"}), 0, 0, 1000
    )
    rows = {s["tags"]["run_id"]: dict(zip(s["columns"], s["values"][0], strict=False)) for s in influx(stack, q)}
    assert set(rows) == set(ids.values())
    for name, (_, _head, samples, _) in loaded.items():
        values = [s["cpu_clock_hz"] for s in samples if s["role"] == "merger" and s["node_state"] == "RUNNING"]
        row = rows[ids[name]]
        assert row["cpu_clock_hz mean"] == pytest.approx(np.mean(values), rel=1e-9)
        assert row["cpu_clock_hz stddev"] == pytest.approx(np.std(values, ddof=1), rel=1e-9)


def test_the_parameter_chart_buckets_the_runs_steady_rate_by_parameter(stack, loaded):
    """Grafana's Elasticsearch request for the bar gauge: a bool filter of the time range and the
    Lucene query (multi-value variable as ("a" OR "b")), terms on the parameter, avg metric."""
    ids = [h["flowstat_run"]["run_id"] for _, h, _, _ in loaded.values()]
    target = grafana._target(AGGREGATE_VIEW, panel(AGGREGATE_VIEW, "Merged objects/s (steady) against the parameter"))
    index, body = gx.elasticsearch_request(target, {"runs": ids, "param": ["producers"]}, 0, 4102444800000)
    assert index == "flowstat-runs*"
    r = requests.post(f"{stack['elasticsearch'].url}/{index}/_search", json=body, timeout=30)
    buckets = r.json()["aggregations"]["2"]["buckets"]
    docs = [json.loads((d / "run.json").read_text()) for d, _, _, _ in loaded.values()]
    by_producers = defaultdict(list)
    for doc in docs:
        if "steady_merged_objects_per_second" in doc.get("summary", {}):
            by_producers[doc["parameters"]["producers"]].append(doc["summary"]["steady_merged_objects_per_second"])
    assert {b["key"]: b["1"]["value"] for b in buckets} == pytest.approx(
        {k: float(np.mean(v)) for k, v in by_producers.items()}
    )
    assert buckets


# -- alert rules --------------------------------------------------------------------------------

GRAFANA_RULES = ROOT / "dashboards" / "grafana" / "provisioning" / "alerting" / "rules.yaml"


def provisioned_rule(alert) -> dict:
    """The alert's Grafana rule as provisioned: the generated file, read at each call."""
    groups = yaml.safe_load(GRAFANA_RULES.read_text())["groups"]
    return next(r for g in groups for r in g["rules"] if r["uid"] == alert.uid)


def rule_results(stack, rule, end_ms: int) -> dict[str, dict[tuple, list]]:
    """Each InfluxDB query of the rule over its relative time range ending at end_ms, expanded as
    Grafana expands it: refId -> label set -> the series' values."""
    out: dict[str, dict[tuple, list]] = {}
    for d in rule["data"]:
        if d["datasourceUid"] == "__expr__":
            continue
        span, model = d["relativeTimeRange"], d["model"]
        query = gx.expand(model["query"], end_ms - span["from"] * 1000, end_ms - span["to"] * 1000, model["intervalMs"])
        out[d["refId"]] = {gx.labels(s["tags"]): [row[1] for row in s["values"]] for s in influx(stack, query)}
    return out


def evaluations(stack, alert, samples: list[dict]) -> tuple[list[int], dict[tuple, list[bool]], list]:
    """Evaluate the provisioned rule every 10 s across the run as Grafana would: its queries on the
    real InfluxDB, then its reduce, math and threshold expressions (flowstat_lab.grafana.rule_values).
    Returns the evaluation times, per group of this run whether its condition held at each (the
    stores hold every run: this run's groups are compared), and where the reduced values differ
    from the offline evaluation's (alerts.values_at)."""
    rule = provisioned_rule(alert)
    reduces = {d["refId"]: d["model"]["expression"] for d in rule["data"] if d["model"].get("type") == "reduce"}
    first, last = span_ms(samples)
    ends = list(range(first - first % 10_000, last + alert.window_s * 1000, 10_000))
    offline = alerts.values_at(alert, samples, [end / 1000 for end in ends])
    assert alert.group[0] == "run_id"
    runs = {s["run_id"] for s in samples}
    per = {q.ref: q.per or alert.group for q in alert.quantities}  # the labels each quantity is per

    def group(label_set: tuple, labels: tuple[str, ...] = alert.group) -> tuple:
        return tuple(dict(label_set).get(k, "") for k in labels)

    held: dict[tuple, list[bool]] = defaultdict(lambda: [False] * len(ends))
    mismatches = []
    for i, (end, by_group) in enumerate(zip(ends, offline, strict=False)):
        values = gx.rule_values(rule, rule_results(stack, rule, end))
        got: dict[tuple, dict[str, float]] = defaultdict(dict)
        for reduce_ref, query_ref in reduces.items():
            for label_set, v in values[reduce_ref].items():
                if group(label_set)[0] in runs:
                    got[(query_ref, group(label_set, per[query_ref]))][query_ref] = v
        want: dict[tuple, dict[str, float]] = defaultdict(dict)  # each quantity per its own labels
        for key, quantities in by_group.items():
            labels = dict(zip(alert.group, key, strict=True))
            for ref, v in quantities.items():
                want[(ref, tuple(labels[k] for k in per[ref]))][ref] = v
        for key in set(got) | set(want):
            g, w = got.get(key, {}), want.get(key, {})
            if g.keys() != w.keys() or any(not math.isclose(g[k], w[k], rel_tol=1e-6, abs_tol=1e-6) for k in g):
                mismatches.append((end, key, g, w))
        for label_set, now in gx.firing(rule, values).items():
            if now and group(label_set)[0] in runs:
                held[group(label_set)][i] = True
    return ends, dict(held), mismatches


def crossed(stack, alert, samples: list[dict]) -> tuple[set, list]:
    """The groups whose condition held at some evaluation across the run (whatever the rule's for),
    and the mismatches of evaluations()."""
    _, held, mismatches = evaluations(stack, alert, samples)
    return {key for key, h in held.items() if any(h)}, mismatches


BAD_RUN = {
    "flowstat-buffer-overload": "overload",
    "flowstat-merger-behind": "behind",
    "flowstat-vmrss-growing": "memory",
    "flowstat-node-down": "killed",
    "flowstat-agent-spooling": "spooling",
}


def rule_samples(alert, run) -> list[dict]:
    _, _, nodes, agents = run
    return agents if alert.source == panels.AGENT else nodes


@pytest.fixture(scope="module")
def runs(loaded, memory):
    """Every run an alert is checked on, by name."""
    return {**loaded, "memory": memory}


@pytest.mark.parametrize("alert", SAMPLE_ALERTS, ids=lambda a: a.uid)
def test_each_rule_crosses_its_threshold_on_the_bad_run_and_not_on_the_healthy_one(stack, runs, alert):
    bad, mismatches = crossed(stack, alert, rule_samples(alert, runs[BAD_RUN[alert.uid]]))
    assert not mismatches, mismatches[:3]
    assert bad, f"{alert.uid} never crossed on the {BAD_RUN[alert.uid]} run"
    if BAD_RUN[alert.uid] == "memory":
        assert {key[1] for key in bad} == {"merger-0"}, "the flat merger crossed too"
    good, mismatches = crossed(stack, alert, rule_samples(alert, runs["healthy"]))
    assert not mismatches, mismatches[:3]
    assert not good, f"{alert.uid} crossed on the healthy run"


# -- a user's own pipeline -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def user_loaded(stack, user_runs):
    """The example user pipeline's runs (flowstat.node, tests/support/user_runs.py) in both stores."""
    replay.replay(
        [d / "samples.ndjson" for d in user_runs.values()],
        {
            "influxdb": (stack["influxdb"].url, "flowstat"),
            "elasticsearch": (stack["elasticsearch"].url, "flowstat-samples"),
        },
    )
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=30)
    return {name: (d, *fx.samples(d)) for name, d in user_runs.items()}


def test_a_user_node_with_a_full_buffer_fires_the_overload_alert_and_one_without_stays_quiet(
    stack, user_loaded, tmp_path
):
    alert = next(a for a in ALERTS if a.uid == "flowstat-buffer-overload")
    overloaded = {s["node_id"] for s in user_loaded["user-overload"][2] if s.get("send_buffer_overloaded")}
    assert "merger" in overloaded, "the overloaded user pipeline's merger never reported a refused send"
    bad, mismatches = crossed(stack, alert, rule_samples(alert, user_loaded["user-overload"]))
    assert not mismatches, mismatches[:3]
    assert {key[1] for key in bad} == overloaded
    good, mismatches = crossed(stack, alert, rule_samples(alert, user_loaded["user-healthy"]))
    assert not mismatches and not good, (good, mismatches[:3])
    fired = elastalert_test_rule(stack, alert, user_loaded["user-overload"], tmp_path)
    assert fired.fired and not fired.errors, fired.output[-3000:]
    quiet = elastalert_test_rule(stack, alert, user_loaded["user-healthy"], tmp_path)
    assert not quiet.fired and not quiet.errors, quiet.output[-3000:]


# -- ElastAlert rules ---------------------------------------------------------------------------


def elastalert_rule_run(
    stack, alert, run_id: str, folder: Path, start_s: float, end_s: float, terms: tuple[tuple[str, str], ...] = ()
):
    """elastalert-test-rule with the generated rule (the file, read at each call) from start_s to
    end_s (epoch s), scoped to the run (and to terms) by a filter: the stores hold every run."""
    from flowstat.stack import elastalert as ea

    path = narrowed_rule(
        ROOT / "dashboards" / "elastalert" / "rules" / f"{alert.uid}.yaml",
        folder / f"{alert.uid}-{run_id}-{'-'.join(v for _, v in terms) or None}.yaml",
        {"term": {"run_id": run_id}},
        *({"term": {k: v}} for k, v in terms),
    )
    return ea.test_rule(stack, path, *(datetime.fromtimestamp(t, UTC) for t in (start_s, end_s)))


def elastalert_test_rule(stack, alert, run, folder: Path, node: str | None = None):
    """elastalert_rule_run over the run's samples (and a window's margin either side)."""
    samples = rule_samples(alert, run)
    first, last = span_ms(samples)
    return elastalert_rule_run(
        stack,
        alert,
        samples[0]["run_id"],
        folder,
        first / 1000 - alert.window_s,
        last / 1000 + alert.window_s,
        (("node_id", node),) if node else (),
    )


@pytest.mark.parametrize("alert", SAMPLE_ALERTS, ids=lambda a: a.uid)
def test_each_elastalert_rule_matches_on_the_bad_run_and_not_on_the_healthy_one(stack, runs, alert, tmp_path):
    bad = elastalert_test_rule(stack, alert, runs[BAD_RUN[alert.uid]], tmp_path)
    assert bad.fired and not bad.errors, bad.output[-3000:]
    good = elastalert_test_rule(stack, alert, runs["healthy"], tmp_path)
    assert not good.fired and not good.errors, good.output[-3000:]
    if BAD_RUN[alert.uid] == "memory":
        grew = elastalert_test_rule(stack, alert, runs["memory"], tmp_path, node="merger-0")
        flat = elastalert_test_rule(stack, alert, runs["memory"], tmp_path, node="merger-1")
        assert grew.fired and flat.hits and not flat.fired, flat.output[-3000:]


# -- alert rules at their edges -----------------------------------------------------------------
#
# The tests above give each rule whole runs, far past its thresholds: a threshold moved by one step
# would still pass them. These guard the edges. For each alert, a short run synthesized from its
# definition (flowstat.views.alerts: thresholds, window_s, for_s, the quantities) and from the
# smallest step its data allows (EDGE_STEP), one node (or agent host) per case: the smallest input
# that must fire (each threshold plus one step, held for exactly the alert's for) and the largest
# that must not (one step less: at a threshold, or held one evaluation short). Each case is checked
# first on the offline evaluation (the definition itself: the input is at the edge it claims), then
# on the generated Grafana rule (its queries on the real InfluxDB, its expressions and for as the
# provisioned file says) and on the generated ElastAlert2 rule (elastalert-test-rule on the real
# Elasticsearch). Moving a threshold of either generated rule by one step turns one of them red.
#
# What no input can show, and why:
# - A count's threshold (buffer overload, node down) moved below 0, or ElastAlert's num_events to 0:
#   without a matching sample both see no data (Grafana's noDataState is OK, ElastAlert gets no
#   event), whatever the threshold; the moved rule behaves as the generated one.
# - The spool alert's "last > 0" moved below 0: a spool is never negative, so one that rose holds
#   at least one sample; only "rise > 0" and the ElastAlert rule's minimum have an edge below.
# - ElastAlert's falling-behind and memory rules approximate the definition (views/elastalert.py):
#   the highest latency over a window above the threshold (no rise, no in-flight, no for), and a
#   rise of the highest VmRSS between two half windows. Their edges are their own (the latency
#   threshold; SPIKE_HEIGHT and SPIKE_MIN_DOCS), not the 10 MB/min slope. The spike rule's
#   threshold_cur (1 kB) keeps it from matching on the windows of zero placeholders ElastAlert
#   keeps for a node gone quiet (moved to 0, the quiet cases here fire); moved up, no VmRSS comes
#   near it.

EDGE_STEP = {
    "input_latency_p99_ms": Fraction(1, 1000),  # flowstat.node.latency rounds to the microsecond
    "objects_in_flight": 1,
    "vmrss_kb": 1,
    "spooled_samples": 1,
}  # whole objects, kB, samples
COUNT_STEP = 1  # a count of samples
EDGE_PERIOD_S = alerts.EVALUATE_EVERY_S  # a sample per evaluation interval, in its middle


def above(threshold: float, step) -> Fraction:
    """The smallest value the data can hold above a threshold: the next multiple of its step."""
    return (math.floor(Fraction(threshold) / Fraction(step)) + 1) * Fraction(step)


def at_most(threshold: float, step) -> Fraction:
    """The largest value the data can hold that is not above a threshold."""
    return math.floor(Fraction(threshold) / Fraction(step)) * Fraction(step)


def every(values: list) -> list[tuple[float, dict]]:
    """One sample per EDGE_PERIOD_S, in the middle of each: (seconds after the run's start, fields).
    A window ending at an evaluation (a whole multiple of the period, for Grafana as offline) holds
    window_s / EDGE_PERIOD_S of them, the same for any evaluation phase within half a period."""
    return [(EDGE_PERIOD_S * (k + 0.5), v) for k, v in enumerate(values)]


@dataclass(frozen=True)
class EdgeCase:
    name: str  # its node (the agent's host, for an alert on agents)
    samples: list[tuple[float, dict]]  # (seconds after the run's start, the fields set)
    grafana: bool | None  # must the Grafana rule fire (None: no edge of that rule)
    elastalert: bool | None  # must the ElastAlert2 rule fire
    why: str


def _edges_buffer_overload(alert) -> list[EdgeCase]:
    ((a,),) = alert.condition
    q = alert.quantity(a.ref)
    fire = int(above(a.threshold, COUNT_STEP))  # overloaded samples in one window
    n = alert.window_s // EDGE_PERIOD_S  # samples in one window
    calm = {k: not v for k, v in q.any_of}

    def series(k: int, flag: str) -> list[dict]:
        return every([calm] * (n - k) + [{**calm, flag: dict(q.any_of)[flag]}] * k)

    first_flag = q.any_of[0][0]
    return [
        *(
            EdgeCase(
                f"{flag.split('_')[0]}-{fire}",
                series(fire, flag),
                True,
                True,
                f"{fire} sample(s) with {flag}: just above {a.threshold:g}",
            )
            for flag, _ in q.any_of
        ),
        EdgeCase(
            f"overloaded-{fire - 1}",
            series(fire - 1, first_flag),
            False,
            False,
            f"{fire - 1} overloaded sample(s): at {a.threshold:g}",
        ),
    ]


def _edges_node_down(alert) -> list[EdgeCase]:
    ((a,),) = alert.condition
    down = dict(alert.quantity(a.ref).where)["node_state"]
    fire = int(above(a.threshold, COUNT_STEP))
    n = alert.window_s // EDGE_PERIOD_S
    up: dict = {}  # the template's: RUNNING
    return [
        EdgeCase(
            f"down-{fire}",
            every([up] * (n - fire) + [{"node_state": down}] * fire),
            True,
            True,
            f"{fire} {down} sample(s): just above {a.threshold:g}",
        ),
        EdgeCase(
            f"down-{fire - 1}",
            every(
                [up] * (n - fire) + [{"node_state": down}] * (fire - 1) + [{"node_state": sample_schema.STATE_STOPPED}]
            ),
            False,
            False,
            f"{fire - 1} {down} sample(s), then gone in order ({sample_schema.STATE_STOPPED}): at {a.threshold:g}",
        ),
    ]


def _staircase(level, rise, holds: int, w: int) -> list:
    """Values, one per EDGE_PERIOD_S, whose every window of w samples rises by exactly ``rise``,
    the window's last at ``level + rise`` at the first evaluation that sees it, for ``holds``
    evaluations; then one sample back at ``level`` (the last no longer above, the rise gone)."""
    return [level + rise * (1 + (k - (w - 1)) // (w - 1)) for k in range(w - 1 + holds)] + [level]


def _edges_merger_behind(alert) -> list[EdgeCase]:
    level_conj = next(c for c in alert.condition if any(alert.quantity(x.ref).kind == "last" for x in c))
    a = next(x for x in level_conj if alert.quantity(x.ref).kind == "last")  # latency p99, last
    b = next(x for x in level_conj if x is not a)  # its rise
    (c,) = next(conj for conj in alert.condition if conj is not level_conj)  # in flight, rise
    latency, flight = alert.quantity(a.ref).field, alert.quantity(c.ref).field
    assert alert.quantity(b.ref).field == latency and alert.window_s % EDGE_PERIOD_S == 0
    w = alert.window_s // EDGE_PERIOD_S  # samples in a window
    holds = alert.for_s // EDGE_PERIOD_S + 1  # evaluations that span the for
    step, one = EDGE_STEP[latency], EDGE_STEP[flight]
    rise = above(b.threshold, step)
    level = above(a.threshold, step) - rise  # the first held window's last: just above
    low = {latency: 1.0, flight: 0}  # far from both conditions

    def lat(values) -> list[tuple[float, dict]]:
        return every([{**low, latency: v} for v in values])

    def fl(values) -> list[tuple[float, dict]]:
        return every([{**low, flight: v} for v in values])

    at = at_most(a.threshold, step)
    return [
        EdgeCase(
            "latency-above",
            lat(_staircase(level, rise, holds, w)),
            True,
            None,
            f"last {float(level + rise)} > {a.threshold:g}, rising by {float(rise)}, for {alert.for_s} s",
        ),
        EdgeCase(
            "latency-at",
            lat(_staircase(level - step, rise, holds, w)),
            False,
            None,
            f"one step lower: last at {a.threshold:g} at the first evaluation",
        ),
        EdgeCase(
            "latency-flat",
            lat(_staircase(level + rise, at_most(b.threshold, step), holds, w)),
            False,
            None,
            f"last above {a.threshold:g}, rising by {float(at_most(b.threshold, step))}",
        ),
        EdgeCase(
            "latency-short",
            lat(_staircase(level, rise, holds - 1, w)),
            False,
            None,
            f"held one evaluation short of {alert.for_s} s",
        ),
        EdgeCase(
            "in-flight-above",
            fl(_staircase(0, above(c.threshold, one), holds, w)),
            True,
            None,
            f"in flight rising by {above(c.threshold, one)} per window, for {alert.for_s} s",
        ),
        EdgeCase(
            "in-flight-at",
            fl(_staircase(0, at_most(c.threshold, one), holds, w)),
            False,
            None,
            f"in flight rising by {at_most(c.threshold, one)} per window",
        ),
        # ElastAlert's rule: the highest latency of a window above the threshold.
        EdgeCase(
            "ea-latency-above",
            lat([at] * (w // 2) + [above(a.threshold, step)] + [at] * (w - w // 2 - 1)),
            None,
            True,
            f"one sample at {float(above(a.threshold, step))}, the others at {a.threshold:g}",
        ),
        EdgeCase("ea-latency-at", lat([at] * w), None, False, f"every sample at {a.threshold:g}"),
    ]


def _growth(start: int, slopes: int, rise: Fraction) -> list[dict]:
    """slopes + 1 whole kB values, one per slope bucket, from start up by ``rise`` in all."""
    return [{"vmrss_kb": start + round(rise * k / slopes)} for k in range(slopes + 1)]


def _edges_vmrss_growing(alert, vmrss: int) -> list[EdgeCase]:
    from flowstat.stack.elastalert import RUN_EVERY_S
    from flowstat.views.elastalert import SPIKE_HEIGHT, SPIKE_MIN_DOCS

    ((a, b),) = alert.condition
    assert (alert.quantity(a.ref).kind, alert.quantity(b.ref).kind) == ("slope_per_min", "slope_buckets")
    assert alerts.SLOPE_BUCKET_S == EDGE_PERIOD_S  # a sample per bucket
    step = EDGE_STEP["vmrss_kb"]
    n = int(above(b.threshold, COUNT_STEP))  # slopes over the window: buckets - 1
    # The mean of n per-minute slopes between consecutive bucket means is the whole rise over
    # n buckets' time, per minute.
    per_minute = Fraction(alerts.SLOPE_BUCKET_S, 60)
    cases = [
        EdgeCase(
            f"slope-above-{n}",
            every(_growth(vmrss, n, above(a.threshold * n * per_minute, step))),
            True,
            None,
            f"{n} slopes > {b.threshold:g}, their mean just above {a.threshold:g} kB/min",
        ),
        EdgeCase(
            f"slope-at-{n}",
            every(_growth(vmrss, n, at_most(a.threshold * n * per_minute, step))),
            False,
            None,
            f"{n} slopes, their mean at {a.threshold:g} kB/min",
        ),
        EdgeCase(
            f"slope-above-{n - 1}",
            every(_growth(vmrss, n - 1, above(a.threshold * (n - 1) * per_minute, step))),
            False,
            None,
            f"{n - 1} slopes (at {b.threshold:g}), their mean just above {a.threshold:g} kB/min",
        ),
    ]
    # ElastAlert's spike: queries of RUN_EVERY_S, each the node's highest VmRSS when it has at least
    # SPIKE_MIN_DOCS samples; two windows of half the alert's, compared once a key has two windows
    # of queries: the later window's highest at least SPIKE_HEIGHT times the earlier one's.
    half = alert.window_s // 2
    top = math.ceil(vmrss * SPIKE_HEIGHT)  # the least whole kB that ElastAlert's float comparison passes
    while top - 1 >= vmrss * SPIKE_HEIGHT:
        top -= 1
    while top < vmrss * SPIKE_HEIGHT:
        top += 1

    def spike(peak: int, docs: int) -> list[tuple[float, dict]]:
        def piece(j: int, value: int, k: int) -> list[tuple[float, dict]]:
            return [(RUN_EVERY_S * (j + (i + 1) / (k + 1)), {"vmrss_kb": value}) for i in range(k)]

        flat = 2 * half // RUN_EVERY_S
        return [s for j in range(flat) for s in piece(j, vmrss, SPIKE_MIN_DOCS)] + piece(flat, peak, docs)

    return cases + [
        EdgeCase(
            "spike-above",
            spike(top, SPIKE_MIN_DOCS),
            None,
            True,
            f"{top} kB after {2 * half} s at {vmrss}: {SPIKE_HEIGHT} times or more",
        ),
        EdgeCase(
            "spike-below",
            spike(top - 1, SPIKE_MIN_DOCS),
            None,
            False,
            f"{top - 1} kB after {2 * half} s at {vmrss}: under {SPIKE_HEIGHT} times",
        ),
        EdgeCase(
            "spike-sparse",
            spike(top, SPIKE_MIN_DOCS - 1),
            None,
            False,
            f"{top} kB in a query of {SPIKE_MIN_DOCS - 1} samples",
        ),
    ]


def _edges_agent_spooling(alert) -> list[EdgeCase]:
    ((a, b),) = alert.condition
    field = alert.quantity(a.ref).field
    kinds = (alert.quantity(a.ref).kind, alert.quantity(b.ref).kind, alert.quantity(b.ref).field)
    assert kinds == ("last", "rise", field)
    step = EDGE_STEP[field]
    n = alert.window_s // EDGE_PERIOD_S
    at = at_most(a.threshold, step)
    return [
        # Grafana: last and rise each just above; ElastAlert (the window's least above the
        # threshold): its least at the threshold.
        EdgeCase(
            "spool-rises",
            every([{field: at}] * (n - 1) + [{field: at + above(b.threshold, step)}]),
            True,
            False,
            f"{field} {at} then {at + above(b.threshold, step)}",
        ),
        # Grafana: last just above, rise at its threshold; ElastAlert: its least just above.
        EdgeCase(
            "spool-holds",
            every(
                [{field: above(a.threshold, step)}] * (n - 1)
                + [{field: above(a.threshold, step) + at_most(b.threshold, step)}]
            ),
            False,
            True,
            f"{field} {above(a.threshold, step)}, rising by {at_most(b.threshold, step)}",
        ),
    ]


def _number(v):
    if isinstance(v, Fraction):
        return int(v) if v.denominator == 1 else float(v)
    return v


@dataclass
class EdgeRun:
    alert: alerts.AlertRule
    run_id: str
    start_s: int  # the run's start (epoch s, a whole minute)
    cases: list[EdgeCase]
    samples: list[dict]  # what the alert reads (node samples, or the agent's self-samples), as read back

    def key(self, case: EdgeCase) -> tuple:
        return (self.run_id, case.name, AGENT)  # the alert's group: run, node (or host), agent


@pytest.fixture(scope="module")
def edges(stack, fixture_runs) -> dict[str, EdgeRun]:
    """Each alert's edge cases as a run of its own, an hour before now: a node per case (an agent's
    host, for the alert on agents), every field an agent writes (the healthy run's merger sample and
    self-sample, as fixture_runs.memory_growth does), replayed into both stores."""
    import time

    from flowstat.timeutil import iso_utc_ms

    head, nodes, agents = fx.samples(fixture_runs["healthy"])
    node_template = next(s for s in nodes if s["role"] == "merger" and s["node_state"] == "RUNNING")
    agent_template = agents[0]
    start = (int(time.time()) - 3600) // 600 * 600
    build = {
        "flowstat-buffer-overload": _edges_buffer_overload,
        "flowstat-node-down": _edges_node_down,
        "flowstat-merger-behind": _edges_merger_behind,
        "flowstat-agent-spooling": _edges_agent_spooling,
        "flowstat-vmrss-growing": lambda a: _edges_vmrss_growing(a, node_template["vmrss_kb"]),
    }
    out, paths = {}, []
    for alert in SAMPLE_ALERTS:
        name = alert.uid.removeprefix("flowstat-")
        run_id = head["flowstat_run"]["run_id"].replace("fx-healthy-", f"fx-edge-{name}-")
        cases = build[alert.uid](alert)
        lines = [{"flowstat_run": {**head["flowstat_run"], "run_id": run_id, "started": iso_utc_ms(start)}}]
        for case in cases:
            for seq, (t, fields) in enumerate(case.samples):
                stamp = iso_utc_ms(start + t)
                fields = {k: _number(v) for k, v in fields.items()}
                if alert.source == panels.AGENT:
                    lines.append(
                        {
                            "flowstat_agent": {
                                **agent_template,
                                "time": stamp,
                                "run_id": run_id,
                                "host": case.name,
                                "agent": AGENT,
                                "seq": seq,
                                **fields,
                            }
                        }
                    )
                elif fields.get("node_state") in (sample_schema.STATE_DOWN, sample_schema.STATE_STOPPED):
                    # gone: the agent reports its base fields only (flowstat.agent.agent._base)
                    lines.append(
                        {
                            "time": stamp,
                            "run_id": run_id,
                            "host": node_template["host"],
                            "node_id": case.name,
                            "role": node_template["role"],
                            "agent": AGENT,
                            "seq": seq,
                            "pid": node_template["pid"],
                            **fields,
                        }
                    )
                else:
                    lines.append(
                        {
                            **node_template,
                            "time": stamp,
                            "run_id": run_id,
                            "node_id": case.name,
                            "agent": AGENT,
                            "seq": seq,
                            "request_timestamp": stamp,
                            "response_timestamp": stamp,
                            **fields,
                        }
                    )
        path = fixture_runs["healthy"].parents[1] / "runs" / run_id / "samples.ndjson"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        paths.append(path)
        _, node_docs, agent_docs = fx.samples(path.parent)
        out[alert.uid] = EdgeRun(alert, run_id, start, cases, agent_docs if alert.source == panels.AGENT else node_docs)
    replay.replay(
        paths,
        {
            "influxdb": (stack["influxdb"].url, "flowstat"),
            "elasticsearch": (stack["elasticsearch"].url, "flowstat-samples"),
        },
    )
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=30)
    return out


def offline_fired(alert, run: EdgeRun) -> set[tuple]:
    """The groups the offline evaluation (the definition) fires for."""
    given = (run.samples, ()) if alert.source == panels.NODE else ((), run.samples)
    return {tuple(sp.labels[k] for k in alert.group) for sp in alerts.evaluate(*given) if sp.alert.uid == alert.uid}


@pytest.mark.parametrize("alert", SAMPLE_ALERTS, ids=lambda a: a.uid)
def test_each_grafana_rule_fires_at_its_edge_and_not_one_step_below(stack, edges, alert):
    run = edges[alert.uid]
    cases = [c for c in run.cases if c.grafana is not None]
    oracle = offline_fired(alert, run)
    off = [(c.name, c.why) for c in cases if (run.key(c) in oracle) != c.grafana]
    assert not off, f"not at the edge by the definition (the offline evaluation): {off}"
    ends, held, mismatches = evaluations(stack, alert, run.samples)
    assert not mismatches, mismatches[:3]
    rule = provisioned_rule(alert)
    fired = {key for key, h in held.items() if any(gx.alerting(rule, ends, h))}
    wrong = [
        (c.name, c.why, "fired" if c.grafana is False else "stayed quiet")
        for c in cases
        if (run.key(c) in fired) != c.grafana
    ]
    assert not wrong, wrong


def elastalert_alerted(result, rule_name: str) -> set[tuple]:
    """The query keys elastalert-test-rule alerted for (its debug alerter's "Alert for NAME, KEY at")."""
    found = re.findall(rf"Alert for {re.escape(rule_name)}, (.+) at \S+:$", result.output, re.MULTILINE)
    return {tuple(part.strip() for part in key.split(",")) for key in found}


@pytest.mark.parametrize("alert", SAMPLE_ALERTS, ids=lambda a: a.uid)
def test_each_elastalert_rule_fires_at_its_edge_and_not_one_step_below(stack, edges, alert, tmp_path):
    run = edges[alert.uid]
    name = yaml.safe_load((ROOT / "dashboards" / "elastalert" / "rules" / f"{alert.uid}.yaml").read_text())["name"]
    last = max(t for c in run.cases for t, _ in c.samples)
    # From a minute before the run to a window past its last sample, in whole minutes: ElastAlert
    # splits the range into its rule's queries (buffer_time, or run_every) and drops a partial last.
    end = run.start_s + math.ceil((last + alert.window_s) / 60) * 60
    result = elastalert_rule_run(stack, alert, run.run_id, tmp_path, run.start_s - 60, end)
    assert not result.errors, result.output[-3000:]
    alerted = elastalert_alerted(result, name)
    cases = [c for c in run.cases if c.elastalert is not None]
    wrong = [
        (c.name, c.why, "fired" if c.elastalert is False else "stayed quiet")
        for c in cases
        if (run.key(c) in alerted) != c.elastalert
    ]
    assert not wrong, (wrong, result.output[-3000:])


# -- flowstat verdict's series: the run view's flow panels and the held-back alert ------------------
#
# flowstat verdict writes a verdict per run every VERDICT_EVERY_S and the rates on the run's edges; these
# tests write such points themselves (support/verdicts.py), straight into both stores.

HELD_BACK = next(a for a in ALERTS if a.source == panels.VERDICT)
M0, M1, BOTH = "merger-0", "merger-1", "merger-0,merger-1"


def test_the_flow_panels_show_the_runs_verdicts_and_edges(stack):
    """The verdict over time (the last per bucket), each set of nodes named with its last verdict's
    evidence (and the last verdict naming none), each edge's last rate: as written."""
    run_id = f"fx-flow-panels-{uuid.uuid4().hex[:8]}"
    start = (int(time.time()) - 3600) // 600 * 600 * 1000
    flows = [""] * 4 + [M0] * 6 + [""] * 2  # none for 20 s, merger-0 for 30 s, none again
    docs = [vx.verdict(run_id, start + 5000 * k, nodes) for k, nodes in enumerate(flows)]
    vx.write(stack, "verdict", docs)
    rates = [
        ("producers-0", M0, 100.0, 90.0, False),
        ("producers-1", M0, 100.0, 80.0, True),
        (M0, "viewer", 170.0, 170.0, False),
    ]
    vx.write(
        stack,
        "edge",
        [
            vx.edge(run_id, start + t, a, b, r, est)
            for a, b, *rs, est in rates
            for t, r in zip((10_000, 50_000), rs, strict=True)
        ],
    )
    from_ms, to_ms = start - 60_000, start + 120_000

    def rows(title: str) -> list[dict]:
        query, _ = run_view_query(panel(RUN_VIEW, title), run_id, from_ms, to_ms)
        return [
            {**s.get("tags", {}), **dict(zip(s["columns"], row, strict=True))}
            for s in influx(stack, query)
            for row in s["values"]
        ]

    query, interval = run_view_query(panel(RUN_VIEW, "Flow verdict"), run_id, from_ms, to_ms)
    last: dict[int, str] = {}
    for d in docs:
        t = ms(d["time"])
        last[t - t % interval] = d["flow"]  # in time order: the bucket's last
    assert {r["time"]: r["flow"] for r in rows("Flow verdict")} == last and "held_back" in last.values()
    held = {r["held_back_by"]: (r["nodes"], r["evidence"]) for r in rows("Held back by")}
    assert held == {M0: (1, docs[9]["evidence"]), "": (0, docs[-1]["evidence"])}
    edges = {(r["from"], r["to"]): (r["objects_per_second"], r["estimated"]) for r in rows("Edges")}
    assert edges == {(a, b): (r, est) for a, b, _, r, est in rates}


@dataclass(frozen=True)
class HeldCase:
    name: str  # a run of its own: the alert's B counts a run's verdicts
    verdicts: list[tuple[int, str]]  # (ms from the evaluation E, the nodes named: "" for none)
    grafana: dict[str, bool]  # nodes named -> must the Grafana rule (and the definition) fire for them
    elastalert: dict[str, bool]  # ... and the ElastAlert rule
    why: str


def _held_cases() -> list[HeldCase]:
    """Each edge of the held-back alert, in verdicts VERDICT_EVERY_S apart, relative to one
    evaluation E; a millisecond is the smallest step (the stores' and $timeFilter's)."""
    every, window = alerts.VERDICT_EVERY_S * 1000, HELD_BACK.window_s * 1000
    full = HELD_BACK.window_s // alerts.VERDICT_EVERY_S  # the verdicts of a window: 12
    (least, none_else) = HELD_BACK.condition[0]
    assert (least.minus, none_else.minus, none_else.threshold) == (None, "B", -1)
    fewest = int(least.threshold) + 1  # at least 10 verdicts naming the nodes

    def beats(first: int, count: int, nodes: str = "") -> list[tuple[int, str]]:
        return [(first + every * k, nodes) for k in range(count)]

    early = -window - 1  # the last other verdict just out of the window
    return [
        HeldCase(
            "over-window",
            [(early, ""), *beats(early + every, full, M0), (every - 1, "")],
            {M0: True},
            {M0: True},
            "the run's last verdict naming anything else 60.001 s back: the window's 12 all name merger-0",
        ),
        HeldCase(
            "at-window",
            [(-window, ""), *beats(-window + every, full, M0), (every, "")],
            {M0: False},
            {M0: True},
            "the last other verdict exactly 60 s back: in the window ($timeFilter takes both ends)",
        ),
        HeldCase(
            "interrupted",
            [
                (early, ""),
                *beats(early + every, 5, M0),
                (early + 6 * every, ""),
                *beats(early + 7 * every, 7, M0),
                (early + 14 * every, ""),
            ],
            {M0: False},
            {M0: False},
            "12 verdicts naming merger-0 in 65 s, one naming none among them",
        ),
        HeldCase(
            "changed",
            [
                (early, ""),
                *beats(early + every, 5, M0),
                (early + 6 * every, M1),
                *beats(early + 7 * every, full, M0),
                (early + (7 + full) * every, ""),
            ],
            {M0: True, M1: False},
            {M0: True, M1: False},
            "one verdict naming merger-1: merger-0's 60 s start again after it (it fires at E + 30 s)",
        ),
        HeldCase(
            "fewest",
            [*beats(-(fewest - 1) * every - 1, fewest, BOTH), (every - 1, "")],
            {BOTH: True},
            {BOTH: False},
            f"the run's first verdicts: {fewest} naming both mergers",
        ),
        HeldCase(
            "one-fewer",
            [*beats(-(fewest - 2) * every - 1, fewest - 1, M0), (every - 1, "")],
            {M0: False},
            {M0: False},
            f"the run's first verdicts: {fewest - 1}",
        ),
        HeldCase(
            "elastalert-one-fewer",
            [*beats(-(full - 2) * every - 1, full - 1, M0), (every - 1, "")],
            {M0: True},
            {M0: False},
            f"{full - 1} in a row: ElastAlert's frequency needs {full} within the window",
        ),
        HeldCase("none", beats(early, full + 1), {"": False}, {"": False}, "every node keeps up"),
    ]


@dataclass
class HeldRuns:
    base: str  # each case's run is base-CASE
    e_ms: int  # the evaluation the cases are built around (a whole 10 s)
    cases: list[HeldCase]
    docs: list[dict]

    def key(self, case: HeldCase, nodes: str) -> tuple[str, str]:
        return (f"{self.base}-{case.name}", nodes)

    def expected(self, rule: str) -> dict[tuple[str, str], tuple[bool, str]]:
        """(run, nodes) -> (must the rule ("grafana", "elastalert") fire, why)."""
        return {self.key(c, n): (must, c.why) for c in self.cases for n, must in getattr(c, rule).items()}


@pytest.fixture(scope="module")
def held_back(stack) -> HeldRuns:
    """The cases' verdicts, an hour before now, in both stores."""
    base = f"fx-held-{uuid.uuid4().hex[:8]}"
    e_ms = ((int(time.time()) - 3600) // 600 * 600 + 120) * 1000
    cases = _held_cases()
    docs = [vx.verdict(f"{base}-{c.name}", e_ms + t, nodes) for c in cases for t, nodes in c.verdicts]
    vx.write(stack, "verdict", docs)
    return HeldRuns(base, e_ms, cases, docs)


def test_the_held_back_rule_fires_once_every_verdict_of_60_s_names_the_nodes(stack, held_back):
    """The definition (alerts.evaluate on the verdicts) and the provisioned Grafana rule, on the real
    InfluxDB, fire for exactly the cases that must; a change of the nodes named starts the 60 s again."""
    run = held_back
    spans = [sp for sp in alerts.evaluate((), verdicts=run.docs) if sp.alert.uid == HELD_BACK.uid]
    oracle = {(sp.labels["run_id"], sp.labels["held_back_by"]): sp.start for sp in spans}
    expected = run.expected("grafana")
    assert {k for k, (must, _) in expected.items() if must} == set(oracle), "not at the edge by the definition"
    ends, held, mismatches = evaluations(stack, HELD_BACK, run.docs)
    assert not mismatches, mismatches[:3]
    rule = provisioned_rule(HELD_BACK)
    first = {
        key: next((e for e, on in zip(ends, gx.alerting(rule, ends, h), strict=True) if on), None)
        for key, h in held.items()
    }
    wrong = [
        (key, why, "stayed quiet" if must else "fired")
        for key, (must, why) in expected.items()
        if (first.get(key) is not None) != must
    ]
    assert not wrong, wrong
    changed = run.key(next(c for c in run.cases if c.name == "changed"), M0)
    assert first[changed] == run.e_ms + 30_000 == oracle[changed] * 1000  # 60 s after the verdict naming merger-1
    assert all(
        first[run.key(c, M0)] == run.e_ms for c in run.cases if c.name in ("over-window", "elastalert-one-fewer")
    )


def test_the_held_back_elastalert_rule_fires_on_a_full_window_of_the_same_nodes(stack, held_back, tmp_path):
    from flowstat.stack import elastalert as ea

    run = held_back
    path = narrowed_rule(
        ROOT / "dashboards" / "elastalert" / "rules" / f"{HELD_BACK.uid}.yaml",
        tmp_path / f"{HELD_BACK.uid}.yaml",
        {"prefix": {"run_id": f"{run.base}-"}},
    )
    rule = yaml.safe_load(path.read_text())
    start, end = (datetime.fromtimestamp(run.e_ms / 1000 + s, UTC) for s in (-180, 120))
    result = ea.test_rule(stack, path, start, end)
    assert not result.errors, result.output[-3000:]
    alerted = {
        tuple(key.split(", ", 1))
        for key, _ in re.findall(rf"Alert for {re.escape(rule['name'])}, (.+) at (\S+):$", result.output, re.M)
    }
    wrong = [
        (key, why, "stayed quiet" if must else "fired")
        for key, (must, why) in run.expected("elastalert").items()
        if (key in alerted) != must
    ]
    assert not wrong, (wrong, result.output[-3000:])


def test_evaluate_judges_a_run_file_only_when_given_verdicts(tmp_path):
    """A run file holds samples: evaluate leaves the held-back alert out without verdicts, and
    verdicts_from_samples makes them from its samples and edges (flowstat.flow), which it fires on."""
    t0 = 1_800_000_000
    samples = []
    for t in range(t0, t0 + 90):
        for node, busy, bp, latency in (
            ("producers-0", 0.3, 0.65, None),
            (M0, 0.97, 0.0, 40.0),
            ("viewer", 0.2, 0.0, 2.0),
        ):
            samples.append(
                {
                    "time": iso_utc_ms(t),
                    "run_id": "r",
                    "node_id": node,
                    "busy_ratio": busy,
                    "backpressured_ratio": bp,
                    "idle_ratio": round(1 - busy - bp, 9),
                    "node_state": "RUNNING",
                    **({"input_latency_p50_ms": latency} if latency else {}),
                }
            )
    edges = [{"from": "producers-0", "to": M0}, {"from": M0, "to": "viewer"}]
    assert not [sp for sp in alerts.evaluate(samples) if sp.alert.source == panels.VERDICT]
    made = alerts.verdicts_from_samples(samples, edges)
    assert made and all(not flow_schema.validate("verdict", d) for d in made)
    assert made[0]["flow"] == "unknown" and {d.get("held_back_by") for d in made[1:]} == {M0}  # at first: 1 sample
    (span,) = [sp for sp in alerts.evaluate(samples, verdicts=made) if sp.alert.source == panels.VERDICT]
    assert span.labels == {"run_id": "r", "held_back_by": M0}
