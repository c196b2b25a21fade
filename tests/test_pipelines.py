"""Pipeline files that cannot run here, checked against what does: Logstash's is parsed and its
index and document id must agree with the agents' Elasticsearch sink; Telegraf's is run by the
stack (tests/test_ingest.py) and checked with `telegraf --test` here."""

from __future__ import annotations

import subprocess

from conftest import ROOT
from flowstat import schema

LOGSTASH = ROOT / "pipelines" / "logstash" / "pipeline" / "flowstat.conf"


def plugin(tree, section, name):
    for sec, plugins in tree:
        if sec == section:
            for plug, settings in plugins:
                if plug == name:
                    return {k: v[0] for k, v in settings}
    raise AssertionError(f"no {section} {name}")


def test_logstash_pipeline_parses_and_matches_the_agents():
    from logstash_pipeline_parser import Pipeline

    tree = Pipeline(LOGSTASH.read_text()).parse()
    tcp = plugin(tree, "input", "tcp")
    assert tcp["codec"] == "json_lines" and tcp["port"] == 5044
    mutate = plugin(tree, "filter", "mutate")
    doc_id_template = mutate["add_field"][0][1][0]
    sample = {"run_id": "r", "agent": "a", "node_id": "n", "seq": 7}
    rendered = doc_id_template
    for key, value in sample.items():
        rendered = rendered.replace(f"%{{{key}}}", str(value))
    assert rendered == schema.document_id(sample)  # the same _id as the agents' _bulk sink
    removed = set(mutate["remove_field"])
    assert {"@timestamp", "@version", "tags", "port"} <= removed
    assert not removed & {f.name for f in schema.fields()}  # never a sample field
    es = plugin(tree, "output", "elasticsearch")
    assert es["index"] == "flowstat-samples" and es["document_id"] == "%{[@metadata][doc_id]}"
    assert es["manage_template"] is False  # the index templates come from index-templates/


def test_telegraf_config_loads(tmp_path):
    from flowstat.stack.telegraf import build

    binary = str(build())
    env = {"FLOWSTAT_TELEGRAF_HTTP": "127.0.0.1:0", "FLOWSTAT_TELEGRAF_UDP": "127.0.0.1:0",
           "FLOWSTAT_TELEGRAF_TCP": "127.0.0.1:0", "FLOWSTAT_INFLUX_URL": "http://127.0.0.1:1",
           "FLOWSTAT_INFLUX_DB": "flowstat", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([binary, "--config", str(ROOT / "pipelines" / "telegraf" / "telegraf.conf"), "--test"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
