"""The generated Grafana dashboards and alert rules, run for real: every query expanded as Grafana
expands it (tests/grafana_expand.py) and run on the real InfluxDB holding harness-made runs
(tests/fixture_runs.py), compared with what this test computes from the run files itself."""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

import fixture_runs as fx
import grafana_expand as gx
import lens_es
from flowstat import replay, schema
from flowstat.views import ALERTS, VIEWS, alerts, grafana, influxql, kibana, panels
from flowstat.views.panels import AGGREGATE_VIEW, RUN_VIEW

ROOT = Path(__file__).resolve().parents[1]
AGENT = "flowstat-agent-py"  # the agent whose samples the run file holds
MAX_POINTS = 1000


@pytest.fixture(scope="module")
def loaded(stack, fixture_runs):
    """The fixture runs replayed into the stack's InfluxDB and Elasticsearch (idempotent)."""
    replay.replay([d / "samples.ndjson" for d in fixture_runs.values()],
                  {"influxdb": (stack["influxdb"].url, "flowstat"),
                   "elasticsearch": (stack["elasticsearch"].url, "flowstat-samples")})
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=30)
    return {name: (d, *fx.samples(d)) for name, d in fixture_runs.items()}


@pytest.fixture(scope="module")
def memory(stack, fixture_runs, loaded):
    """Seven minutes of one merger's memory growing beside a flat one (fixture_runs.memory_growth),
    replayed into both stores."""
    run_dir = fx.memory_growth(fixture_runs["healthy"], fixture_runs["healthy"].parents[1])
    replay.replay([run_dir / "samples.ndjson"], {"influxdb": (stack["influxdb"].url, "flowstat"),
                                                "elasticsearch": (stack["elasticsearch"].url, "flowstat-samples")})
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=30)
    return (run_dir, *fx.samples(run_dir))


def influx(stack, query: str) -> list[dict]:
    r = requests.post(f"{stack['influxdb'].url}/query", params={"db": "flowstat", "q": query, "epoch": "ms"},
                      timeout=30)
    body = r.json()
    assert r.status_code == 200 and "error" not in body["results"][0], (query, body)
    return body["results"][0].get("series", [])


def ms(iso: str) -> int:
    return schema.time_ns(iso) // 1_000_000


def span_ms(samples: list[dict]) -> tuple[int, int]:
    times = [ms(s["time"]) for s in samples]
    return min(times) - 5000, max(times) + 5000


def panel(view, title):
    return next(p for p in view.panels() if p.title == title)


def run_view_query(p, run_id: str, from_ms: int, to_ms: int, node: list[str] | None = None) -> tuple[str, int]:
    variables = {"run": [run_id], "agent": [AGENT], "role": ["producer", "merger", "viewer", "other"],
                 "node": node or ["merger-0", "producers-0", "producers-1", "viewer"]}
    return gx.panel_query(RUN_VIEW, p, variables, from_ms, to_ms, MAX_POINTS)


# -- generated files ----------------------------------------------------------------------------

def test_every_panel_and_rule_uses_the_provisioned_datasources_and_allowed_panel_types():
    files = grafana.files()
    uids = {d["uid"] for d in yaml.safe_load(files["provisioning/datasources/flowstat.yaml"])
            ["datasources"]}
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
                assert all(ref.lstrip("$") in refs for ref in d["model"]["expression"].replace("(", " ")
                           .replace(")", " ").split() if ref.startswith("$")), d
    assert "password" not in files["provisioning/datasources/flowstat.yaml"].replace("Password}", "").replace(
        "password: ${", "")


# -- the run view -------------------------------------------------------------------------------

def test_the_run_variable_lists_runs_newest_first_labelled_with_their_parameters(stack, loaded):
    series = influx(stack, gx.expand(influxql.variable_query("run"), 0, 0, 1000))
    values = [row[1] for row in series[0]["values"]]
    options = gx.variable_options(values, influxql.RUN_LABEL_REGEX)
    ids = [v for _, v in options]
    started = {json.loads((d / "run.json").read_text())["run_id"]: json.loads((d / "run.json").read_text())["started"]
               for d, _, _, _ in loaded.values()}
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
    fx.synthesize(healthy, run_dir, nodes, 6, run_id=run_id)
    replay.replay([run_dir / "samples.ndjson"], {"influxdb": (stack["influxdb"].url, "flowstat"),
                                                "elasticsearch": (stack["elasticsearch"].url, "flowstat-samples")})
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=30)
    return (run_dir, *fx.samples(run_dir))


def test_a_per_node_panel_draws_the_first_selected_nodes_by_name_the_same_in_grafana_and_kibana(stack, many_nodes):
    _, head, samples, _ = many_nodes
    run_id = head["flowstat_run"]["run_id"]
    names = sorted({s["node_id"] for s in samples})
    first = names[:panels.NODES_PER_PANEL]
    assert len(names) > len(first) and "merger-0~10" in first and "merger-0~2" in first
    from_ms, to_ms = span_ms(samples)
    for p in [p for p in RUN_VIEW.panels() if panels.per_node(p)]:
        query, _ = run_view_query(p, run_id, from_ms, to_ms, node=names)
        series = influx(stack, query)
        assert series, (p.title, query)
        drawn = {s["tags"]["node_id"] for s in series}
        have = {s["node_id"] for s in samples if any(s.get(m.field) is not None for m in p.metrics)
                and all(s.get(k) == v for k, v in p.where)}
        # The first nodes by name take the places, a node without the metric too (it draws nothing)
        assert drawn == have & set(first), p.title
        lens = lens_es.by_id("lens")[kibana.lens_id(RUN_VIEW, p)]
        (layer,) = lens_es.layers(lens).values()
        (split,) = [c for c, col in layer["columns"].items() if col.get("sourceField") == "node_id"]
        rows = lens_es.run_lens(stack["elasticsearch"].url, lens, (from_ms, to_ms), run_id)
        drawn_by_lens = {r[split].split("|")[0]  # node state's split: "node|state"
                         for r in rows if any(r[c] is not None for c in lens_es.shown(layer))}
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
        row = dict(zip(series["columns"], series["values"][0]))
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
    got = {(s["tags"]["role"], row[0]): row[1] for s in influx(stack, gx.expand(q, from_ms, to_ms, 10_000))
           for row in s["values"]}
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
    q = gx.expand(gx.interpolate(target["query"], {"runs": list(ids.values()), "agent": [AGENT]},
                                 multi={"runs"}), 0, 0, 1000)
    rows = {s["tags"]["run_id"]: dict(zip(s["columns"], s["values"][0])) for s in influx(stack, q)}
    assert set(rows) == set(ids.values())
    for name, (_, head, samples, _) in loaded.items():
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
        {k: float(np.mean(v)) for k, v in by_producers.items()})
    assert buckets


# -- alert rules --------------------------------------------------------------------------------

def grafana_values(stack, alert, end_ms: int) -> dict[tuple, dict[str, float]]:
    """Each rule query over its relative time range ending at end_ms, reduced with last (dropNN)."""
    out: dict[tuple, dict[str, float]] = defaultdict(dict)
    for q in alert.quantities:
        query = gx.expand(influxql.quantity_query(alert, q), end_ms - alert.window_s * 1000, end_ms, 1000)
        for s in influx(stack, query):
            numbers = [row[1] for row in s["values"] if isinstance(row[1], (int, float))]
            if numbers:
                out[tuple(s["tags"][k] for k in alert.group)][q.ref] = float(numbers[-1])
    return out


def crossed(stack, alert, samples: list[dict]) -> tuple[set, list]:
    """Evaluate the rule every 10 s across the run as Grafana would (threshold on the math of the
    reduced values): the groups it crossed for. Also check the values equal the offline evaluation's."""
    first, last = span_ms(samples)
    ends = range(first - first % 10_000, last + alert.window_s * 1000, 10_000)
    offline = alerts.values_at(alert, samples, [end / 1000 for end in ends])
    fired, mismatches = set(), []
    for end, want in zip(ends, offline):
        # The stores hold every fixture run; a rule sees them all, this run's groups are compared.
        got = {k: v for k, v in grafana_values(stack, alert, end).items() if k[0] == samples[0]["run_id"]}
        assert alert.group[0] == "run_id"
        for key in set(got) | set(want):
            g, w = got.get(key, {}), want.get(key, {})
            if g.keys() != w.keys() or any(not math.isclose(g[k], w[k], rel_tol=1e-6, abs_tol=1e-6) for k in g):
                mismatches.append((end, key, g, w))
        fired |= {k for k, v in got.items() if alert.holds(v)}
    return fired, mismatches


BAD_RUN = {"flowstat-buffer-overload": "overload", "flowstat-merger-behind": "behind",
           "flowstat-vmrss-growing": "memory", "flowstat-node-down": "killed", "flowstat-agent-spooling": "spooling"}


def rule_samples(alert, run) -> list[dict]:
    _, _, nodes, agents = run
    return agents if alert.source == panels.AGENT else nodes


@pytest.fixture(scope="module")
def runs(loaded, memory):
    """Every run an alert is checked on, by name."""
    return {**loaded, "memory": memory}


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.uid)
def test_each_rule_crosses_its_threshold_on_the_bad_run_and_not_on_the_healthy_one(stack, runs, alert):
    bad, mismatches = crossed(stack, alert, rule_samples(alert, runs[BAD_RUN[alert.uid]]))
    assert not mismatches, mismatches[:3]
    assert bad, f"{alert.uid} never crossed on the {BAD_RUN[alert.uid]} run"
    if BAD_RUN[alert.uid] == "memory":
        assert {key[1] for key in bad} == {"merger-0"}, "the flat merger crossed too"
    good, mismatches = crossed(stack, alert, rule_samples(alert, runs["healthy"]))
    assert not mismatches, mismatches[:3]
    assert not good, f"{alert.uid} crossed on the healthy run"


# -- ElastAlert rules ---------------------------------------------------------------------------

def elastalert_test_rule(stack, alert, run, folder: Path, node: str | None = None):
    """elastalert-test-rule with the generated rule over the run's samples (and a window's margin
    either side), scoped to the run by a filter: the stores hold every fixture run."""
    from flowstat.stack import elastalert as ea

    rule = yaml.safe_load((ROOT / "dashboards" / "elastalert" / "rules" / f"{alert.uid}.yaml").read_text())
    samples = rule_samples(alert, run)
    rule["filter"] = [*rule.get("filter", []), {"term": {"run_id": samples[0]["run_id"]}},
                      *([{"term": {"node_id": node}}] if node else [])]
    path = folder / f"{alert.uid}-{samples[0]['run_id']}-{node}.yaml"
    path.write_text(yaml.safe_dump(rule))
    first, last = span_ms(samples)
    start, end = (datetime.fromtimestamp(t / 1000 + d, timezone.utc) for t, d in
                  ((first, -alert.window_s), (last, alert.window_s)))
    return ea.test_rule(stack, path, start, end)


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.uid)
def test_each_elastalert_rule_matches_on_the_bad_run_and_not_on_the_healthy_one(stack, runs, alert, tmp_path):
    bad = elastalert_test_rule(stack, alert, runs[BAD_RUN[alert.uid]], tmp_path)
    assert bad.fired and not bad.errors, bad.output[-3000:]
    good = elastalert_test_rule(stack, alert, runs["healthy"], tmp_path)
    assert not good.fired and not good.errors, good.output[-3000:]
    if BAD_RUN[alert.uid] == "memory":
        grew = elastalert_test_rule(stack, alert, runs["memory"], tmp_path, node="merger-0")
        flat = elastalert_test_rule(stack, alert, runs["memory"], tmp_path, node="merger-1")
        assert grew.fired and flat.hits and not flat.fired, flat.output[-3000:]
