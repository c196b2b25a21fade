"""Pipeline files that cannot run here, checked against what does: Logstash's is parsed and its
index and document id must agree with the agents' Elasticsearch sink; Telegraf's is run by the
stack (tests/test_ingest.py) and checked with `telegraf --test` here."""

from __future__ import annotations

import re
import subprocess

from flowstat.schema import sample as sample_schema
from support.common import ROOT

LOGSTASH = ROOT / "pipelines" / "logstash" / "pipeline" / "flowstat.conf"


def settings(parsed) -> dict:
    return {k: v[0] for k, v in parsed}


def plugin(tree, section, name):
    for sec, plugins in tree:
        if sec == section:
            for plug, parsed in plugins:
                if plug == name:
                    return settings(parsed)
    raise AssertionError(f"no {section} {name}")


def branches(tree, section) -> dict[str, list]:
    """The plugins of each branch of the section's if / else if / else chains, by condition.
    The parser gives ['if', [[CONDITION, ...], [[[PLUGIN, SETTINGS], ...]]]], the same for 'else if',
    and ['else', [[PLUGIN, SETTINGS], ...]]."""
    found = {}
    for sec, plugins in tree:
        for plug, body in plugins if sec == section else ():
            if plug in ("if", "else if"):
                *condition, (block,) = body
                found[" ".join(c if isinstance(c, str) else c[0] for c in condition)] = block
            elif plug == "else":
                found["else"] = body
    return found


def render(template: str, doc: dict) -> str:
    for key, value in doc.items():
        template = template.replace(f"%{{{key}}}", str(value))
    return template


def test_logstash_pipeline_parses_and_matches_the_agents():
    from logstash_pipeline_parser import Pipeline

    from flowstat.schema import agent as agent_schema
    from flowstat.schema import flow as flow_schema
    from flowstat.schema import run as run_schema
    from flowstat.stores.elasticsearch import AGENTS_INDEX, EDGES_INDEX, RUNS_INDEX, SAMPLES_INDEX, daily_index

    tree = Pipeline(LOGSTASH.read_text()).parse()
    tcp = plugin(tree, "input", "tcp")
    assert tcp["codec"] == "json_lines" and tcp["port"] == 5044
    routes = branches(tree, "filter")
    # a node sample has a node_id (required), an edge counter none but a from and a to (required), a
    # self-sample neither but an agent (required), a run document none of them: what tells them apart
    assert set(routes) == {"[node_id]", "[from] and [to]", "[agent]", "else", "[node_id] or [agent] or [from]"}
    assert "node_id" in sample_schema.schema()["required"] and "node_id" not in agent_schema.schema()["properties"]
    assert {"from", "to"} <= set(flow_schema.schema("edge")["required"]) and "node_id" not in flow_schema.schema(
        "edge"
    )["properties"]
    assert not {"from", "to"} & (set(sample_schema.schema()["properties"]) | set(agent_schema.schema()["properties"]))
    assert "agent" in agent_schema.schema()["required"]
    assert not {"node_id", "agent", "from", "to"} & set(run_schema.schema()["properties"])
    node, agent, run = (dict(settings(routes[k][0][1])["add_field"]) for k in ("[node_id]", "[agent]", "else"))
    sample = {"run_id": "r", "agent": "a", "node_id": "n", "seq": 7}
    assert render(node["[@metadata][doc_id]"][0], sample) == sample_schema.document_id(sample)  # the agents' _bulk _id
    assert node["[@metadata][index]"] == [SAMPLES_INDEX]
    edge = dict(settings(routes["[from] and [to]"][0][1])["add_field"])
    counter = {"run_id": "r", "from": "w-1", "to": "m", "agent": "a", "time": "2026-11-22T10:51:14.123Z"}
    assert render(edge["[@metadata][doc_id]"][0], counter) == flow_schema.document_id("edge", counter)
    assert edge["[@metadata][index]"] == [EDGES_INDEX]
    self_sample = {"host": "h", "agent": "a", "time": "2026-11-22T10:51:14.123Z", "seq": 3}
    assert render(agent["[@metadata][doc_id]"][0], self_sample) == agent_schema.document_id(self_sample)
    assert agent["[@metadata][index]"] == [AGENTS_INDEX]
    assert render(run["[@metadata][doc_id]"][0], {"run_id": "r-1"}) == "r-1" and run["[@metadata][index]"] == [
        RUNS_INDEX
    ]
    # samples and self-samples: the daily index of their own day, as the agents' sinks choose it
    steps = [settings(parsed) for _, parsed in routes["[node_id] or [agent] or [from]"]]
    assert steps[0]["copy"] == [["time", ["[@metadata][day]"]]]
    pattern, replacement = re.search(
        r'gsub => \["\[@metadata\]\[day\]", "([^"]+)", "([^"]+)"\]', LOGSTASH.read_text()
    ).groups()
    assert steps[2]["replace"] == [["[@metadata][index]", ["%{[@metadata][index]}-%{[@metadata][day]}"]]]
    for stamp in ("2026-11-22T10:51:14.123Z", "2026-01-01T00:00:00.000Z", "2025-12-31T23:59:59.999Z"):
        day = re.sub(pattern, replacement, stamp)
        assert f"{SAMPLES_INDEX}-{day}" == daily_index(SAMPLES_INDEX, sample_schema.time_ns(stamp))
    removed = set(plugin(tree, "filter", "mutate")["remove_field"])
    assert {"@timestamp", "@version", "tags", "port"} <= removed
    assert not removed & {f.name for f in sample_schema.fields() + agent_schema.fields()}  # never a field of ours
    es = plugin(tree, "output", "elasticsearch")
    assert es["index"] == "%{[@metadata][index]}" and es["document_id"] == "%{[@metadata][doc_id]}"
    assert es["manage_template"] is False  # the index templates come from index-templates/


def test_the_built_telegraf_is_the_pinned_version_with_the_plugins_its_config_uses():
    import re

    from flowstat.stack.telegraf import PLUGINS, VERSION, build

    binary = str(build())
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"Telegraf {VERSION.lstrip('v')}"
    built = set()
    for kind in ("inputs", "outputs"):
        listed = subprocess.run([binary, "plugins", kind], capture_output=True, text=True, timeout=60)
        built |= set(listed.stdout.split())
    assert built == {p for p in PLUGINS if p.startswith(("inputs.", "outputs."))}  # those asked for, no more
    used = set(
        re.findall(r"^\[\[(\w+\.\w+)\]\]", (ROOT / "pipelines" / "telegraf" / "telegraf.conf").read_text(), re.M)
    )
    assert used == {"inputs.influxdb_listener", "inputs.socket_listener", "outputs.influxdb"} and used <= built


def test_telegraf_config_loads_with_the_compose_services_environment(tmp_path):
    """The real Telegraf takes the compose stack's file with exactly the environment
    docker-compose.yml gives its telegraf service (.env.example's values), addresses made local."""
    import re

    import yaml

    from flowstat.stack.telegraf import build

    binary = str(build())
    example = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["telegraf"]
    env = {
        k: re.sub(r"\$\{(\w+)[^}]*\}", lambda m: example[m.group(1)], str(v)) for k, v in service["environment"].items()
    }
    env.update(
        {
            "FLOWSTAT_TELEGRAF_HTTP": "127.0.0.1:0",
            "FLOWSTAT_TELEGRAF_UDP": "127.0.0.1:0",
            "FLOWSTAT_TELEGRAF_TCP": "127.0.0.1:0",
            "FLOWSTAT_INFLUX_URL": "http://127.0.0.1:1",
            "PATH": "/usr/bin:/bin",
        }
    )
    out = subprocess.run(
        [binary, "--config", str(ROOT / "pipelines" / "telegraf" / "telegraf.conf"), "--test"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    # and without the buffer's size, it refuses to start: every variable the file reads matters
    del env["FLOWSTAT_TELEGRAF_BUFFER"]
    out = subprocess.run(
        [binary, "--config", str(ROOT / "pipelines" / "telegraf" / "telegraf.conf"), "--test"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode != 0
