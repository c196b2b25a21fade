"""The Grafana dashboards for a Prometheus data source (flowstat.views.promql, generated into
dashboards/grafana/dashboards/*-prometheus.json), run for real: two fixture runs replayed as TSDB
blocks by `flowstat replay --prometheus`, Debian's Prometheus started on them, and every panel's
PromQL expanded as Grafana expands it (lab/src/flowstat_lab/grafana.py) and asked over the run's
span: it parses, it draws, and a few panels show what this test computes from the run file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict

import pytest
import requests

from flowstat.schema import sample as sample_schema
from flowstat.views import grafana, panels, promql
from flowstat.views.panels import RUN_VIEW, STACK_VIEW
from flowstat_lab import grafana as gx
from flowstat_lab.prometheus import PrometheusServer
from support import fixture_runs as fx
from support.common import ROOT, free_port

AGENT = "flowstat-agent-py"
SCRAPE_MS = 5000  # the data source's scrape interval for these runs: the agent's self-samples, 5 s apart
MAX_POINTS = 1000  # over a run's span, $__interval is the scrape interval


@pytest.fixture(scope="module")
def prom(fixture_runs, tmp_path_factory):
    """The overload and spooling runs as blocks (one `flowstat replay`), one Prometheus on them."""
    runs = {name: fixture_runs[name] for name in ("overload", "spooling")}
    blocks = tmp_path_factory.mktemp("tsdb") / "blocks"
    out = subprocess.run(
        [sys.executable, "-m", "flowstat", "replay", *map(str, runs.values()), "--prometheus", str(blocks), "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    with PrometheusServer(tmp_path_factory.mktemp("prom"), free_port(), {}, 1.0, storage=blocks) as server:
        yield server, {name: fx.samples(d) for name, d in runs.items()}


def dashboard(view) -> dict:
    """The committed dashboard (the generated one: test_generated keeps them equal)."""
    return json.loads((ROOT / "dashboards/grafana/dashboards" / f"{promql.uid(view)}.json").read_text())


def span_ms(samples: list[dict]) -> tuple[int, int]:
    times = [sample_schema.time_ns(s["time"]) // 1_000_000 for s in samples]
    return min(times) - 5000, max(times) + 5000


def query_range(server, params: dict) -> list[dict]:
    answer = requests.post(f"{server.url}/api/v1/query_range", data=params, timeout=30).json()
    assert answer.get("status") == "success", (params["query"], answer.get("error"))
    return answer["data"]["result"]


def variables_for(run_id: str, node: list[str]) -> dict[str, list[str]]:
    return {"run": [run_id], "agent": [AGENT], "role": [gx.ALL], "node": node}


def drawn(view, server, variables, from_ms, to_ms) -> dict[str, dict[str, list[dict]]]:
    """Every panel's series (title -> refId -> the query_range result)."""
    out: dict[str, dict[str, list[dict]]] = {}
    for p in dashboard(view)["panels"]:
        if p["type"] == "row":
            continue
        queries = gx.prometheus_panel_queries(view, p, variables, from_ms, to_ms, MAX_POINTS, SCRAPE_MS)
        out[p["title"]] = {ref: query_range(server, params) for ref, params in queries}
    return out


def test_the_panels_left_out_are_the_run_documents_and_the_dashboards_have_every_other():
    """No silent gap: the run view's three panels of the run document and three of flowstat
    verdict's series (neither exposed to Prometheus) are the only ones missing, and the dashboards
    say so."""
    gone = promql.left_out(RUN_VIEW)
    documents = {"Parameters", "Verdicts", "Lost and steady rate"}
    assert set(gone) == documents | {"Flow verdict", "Held back by", "Edges"}
    assert all("run document" in why for title, why in gone.items() if title in documents)
    assert all("only each live run's latest" in why for title, why in gone.items() if title not in documents)
    assert promql.left_out(STACK_VIEW) == {}
    for view in promql.VIEWS:
        titles = [p["title"] for p in dashboard(view)["panels"] if p["type"] != "row"]
        assert titles == [p.title for p in view.panels() if p.title not in promql.left_out(view)]
        assert all(t not in titles for t in promql.left_out(view))
        assert all(name in dashboard(view)["description"] for name in promql.left_out(view))
        for p in dashboard(view)["panels"]:
            if p["type"] != "row":
                assert p["datasource"] == grafana.PROMETHEUS and all(
                    t["datasource"] == grafana.PROMETHEUS for t in p["targets"]
                )


def test_the_variables_list_the_runs_agents_and_nodes_from_prometheus(prom):
    server, runs = prom
    head, samples, _ = runs["overload"]
    run_id = head["flowstat_run"]["run_id"]
    from_ms, to_ms = span_ms(samples)
    variables = {"run": [run_id], "agent": [AGENT], "role": [gx.ALL]}
    got = {}
    for v in dashboard(RUN_VIEW)["templating"]["list"]:
        if v["type"] != "query":
            continue
        selector, label = gx.label_values(gx.prometheus_interpolate(RUN_VIEW, v["query"]["query"], variables))
        params = {"start": f"{from_ms / 1000:.3f}", "end": f"{to_ms / 1000:.3f}"}
        if selector:
            params["match[]"] = selector
        answer = requests.get(f"{server.url}/api/v1/label/{label}/values", params=params, timeout=30).json()
        assert answer["status"] == "success", answer
        got[v["name"]] = answer["data"]
    assert run_id in got["run"]
    assert got["agent"] == [AGENT]
    assert got["node"] == sorted({s["node_id"] for s in samples})


@pytest.mark.parametrize("view", promql.VIEWS, ids=lambda v: v.uid)
def test_every_panel_query_parses_and_draws_the_run(prom, view):
    """Each target of each panel, for the overload run, the nodes on All: Prometheus answers it
    (status success: it parses) with at least one series holding a value."""
    server, runs = prom
    head, samples, selfs = runs["overload"]
    from_ms, to_ms = span_ms(samples)
    got = drawn(view, server, variables_for(head["flowstat_run"]["run_id"], [gx.ALL]), from_ms, to_ms)
    empty = [
        (title, ref)
        for title, refs in got.items()
        for ref, series in refs.items()
        if not any(s["values"] for s in series)
    ]
    assert not empty, empty
    if view is RUN_VIEW:  # one series per node, as the InfluxQL panel draws them
        nodes = {s["node_id"] for s in samples}
        assert {s["metric"]["node_id"] for s in got["VmRSS"]["A"]} == nodes
        mergers = {s["node_id"] for s in samples if s["role"] == "merger"}
        assert {s["metric"]["node_id"] for s in got["Merged objects/s"]["A"]} == mergers


def test_the_node_variable_picks_each_node_and_several(prom):
    server, runs = prom
    head, samples, _ = runs["overload"]
    run_id = head["flowstat_run"]["run_id"]
    from_ms, to_ms = span_ms(samples)
    (vmrss,) = [p for p in dashboard(RUN_VIEW)["panels"] if p["title"] == "VmRSS"]
    nodes = sorted({s["node_id"] for s in samples})
    for picked in [[n] for n in nodes] + [nodes[:2]]:
        ((_, params),) = gx.prometheus_panel_queries(
            RUN_VIEW, vmrss, variables_for(run_id, picked), from_ms, to_ms, MAX_POINTS, SCRAPE_MS
        )
        assert {s["metric"]["node_id"] for s in query_range(server, params)} == set(picked), params["query"]


def window(samples: list[dict], t: float, seconds: float) -> list[dict]:
    """The samples of Prometheus's range [t - seconds, t] (2.x: both ends in)."""
    return [s for s in samples if t - seconds <= sample_schema.time_ns(s["time"]) / 1e9 <= t]


def by(samples: list[dict], key: str) -> dict[str, list[dict]]:
    out = defaultdict(list)
    for s in samples:
        out[s[key]].append(s)
    return out


def test_panels_show_what_the_run_file_says(prom):
    """VmRSS (mean per window, kB), objects in flight (max), the node state (its last, named by the
    value mappings) and the agents' spool depth (max): each point what the run file gives for its
    window of $__interval."""
    server, runs = prom
    head, samples, _ = runs["overload"]
    from_ms, to_ms = span_ms(samples)
    got = drawn(RUN_VIEW, server, variables_for(head["flowstat_run"]["run_id"], [gx.ALL]), from_ms, to_ms)
    seconds = SCRAPE_MS / 1000
    (state_panel,) = [p for p in dashboard(RUN_VIEW)["panels"] if p["title"] == panels.label("node_state")]
    names = {int(k): v["text"] for k, v in state_panel["fieldConfig"]["defaults"]["mappings"][0]["options"].items()}
    per_node = by(samples, "node_id")
    checked: dict[str, int] = defaultdict(int)
    for title, field, reduce in (
        ("VmRSS", "vmrss_kb", lambda xs: sum(xs) / len(xs)),
        ("Objects in flight", "objects_in_flight", max),
        (panels.label("node_state"), "node_state", lambda xs: xs[-1]),
    ):
        for series in got[title]["A"]:
            mine = per_node[series["metric"]["node_id"]]
            for t, value in series["values"]:
                expected = reduce([s[field] for s in window(mine, t, seconds) if field in s])
                shown = names[int(float(value))] if field == "node_state" else float(value)
                assert shown == expected or math.isclose(shown, expected, rel_tol=1e-9), (title, t, shown, expected)
                checked[title] += 1
    # the stack view over the spooling run: every agent's spool, none filtered
    head, samples, selfs = runs["spooling"]
    from_ms, to_ms = span_ms(samples)
    stack = drawn(STACK_VIEW, server, {}, from_ms, to_ms)
    everyone = [s for _, _, sel in runs.values() for s in sel]
    for series in stack["Spool depth"]["A"]:
        mine = [s for s in everyone if (s["host"], s["agent"]) == (series["metric"]["host"], series["metric"]["agent"])]
        for t, value in series["values"]:
            assert float(value) == max(s["spooled_samples"] for s in window(mine, t, seconds)), t
            checked["Spool depth"] += 1
    assert any(float(v) > 0 for s in stack["Spool depth"]["A"] for _, v in s["values"]), "the spooling run spooled"
    assert len(checked) == 4 and min(checked.values()) >= 2, checked  # every panel compared, at several points


def test_a_family_misnamed_draws_nothing(prom):
    """The check above is not vacuous: a panel whose family is misspelled parses and draws no series."""
    server, runs = prom
    head, samples, _ = runs["overload"]
    from_ms, to_ms = span_ms(samples)
    (vmrss,) = [p for p in dashboard(RUN_VIEW)["panels"] if p["title"] == "VmRSS"]
    broken = {
        **vmrss,
        "targets": [{**vmrss["targets"][0], "expr": vmrss["targets"][0]["expr"].replace("resident", "resi")}],
    }
    ((_, params),) = gx.prometheus_panel_queries(
        RUN_VIEW, broken, variables_for(head["flowstat_run"]["run_id"], [gx.ALL]), from_ms, to_ms, MAX_POINTS, SCRAPE_MS
    )
    assert query_range(server, params) == []
