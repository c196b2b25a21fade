import json

import pytest

from flowstat.schema import sample as sample_schema


def sample(**kw):
    s = {
        "time": "2026-11-22T10:51:14.123Z",
        "run_id": "r1",
        "host": "h",
        "node_id": "merger-0",
        "role": "merger",
        "agent": "flowstat-agent-py",
        "seq": 7,
        "pid": 42,
        "node_state": "RUNNING",
        "vmrss_kb": 1000,
        "cpu_clock_hz": 12.5,
        "send_buffer_overloaded": False,
    }
    s.update(kw)
    return s


def test_schema_file_is_the_definition():
    names = [f.name for f in sample_schema.fields()]
    assert names[:3] == ["time", "run_id", "host"]
    assert {f.name for f in sample_schema.fields() if f.influx == "tag"} == {
        "run_id",
        "host",
        "node_id",
        "role",
        "agent",
    }
    assert all(f.unit for f in sample_schema.fields() if f.name.endswith(("_kb", "_hz", "_ms")))


def test_valid_sample_has_no_errors():
    assert sample_schema.validate(sample()) == []


@pytest.mark.parametrize(
    "change,error",
    [
        ({"seq": -1}, "seq: must be between 0 and"),
        ({"seq": 2**64 - 1}, "seq: must be between 0 and"),
        ({"seq": 1.5}, "seq: expected integer"),
        ({"role": "Bad Role!"}, "role: 'Bad Role!' does not match ^[a-z][a-z0-9_-]{0,31}$"),
        ({"extra": 1}, "extra: not in the schema"),
        ({"send_buffer_overloaded": "false"}, "expected boolean"),
        ({"cpu_clock_hz": float("nan")}, "expected number"),
    ],
)
def test_invalid_samples_name_the_field(change, error):
    assert any(error in e for e in sample_schema.validate(sample(**change)))


# Roles a sample may carry (the schema's pattern, matched whole) and roles it may not.
GOOD_ROLES = ["producer", "merger", "viewer", "other", "worker", "w", "a-b_c9", "x" * 32]
BAD_ROLES = ["", "Bad Role!", "Worker", "9lives", "-x", "_x", "x" * 33, "worker\n", "wörker", "a b", "a.b", "a,b"]


@pytest.mark.parametrize("role", GOOD_ROLES)
def test_any_lower_case_role_is_a_role(role):
    assert sample_schema.validate(sample(role=role)) == [] and sample_schema.role_or_default(role) == role


@pytest.mark.parametrize("role", [*BAD_ROLES, None, 3])
def test_a_role_outside_the_pattern_is_refused_and_recorded_as_the_default(role):
    if isinstance(role, str):
        assert [e.split(":")[0] for e in sample_schema.validate(sample(role=role))] == ["role"]
    assert sample_schema.role_or_default(role) == sample_schema.DEFAULT_ROLE


def test_missing_required_field():
    s = sample()
    del s["pid"]
    assert sample_schema.validate(s) == ["pid: required field is missing"]


def test_line_protocol():
    line = sample_schema.to_line_protocol(sample(node_id="a b,c=d", node_state='say "hi"'))
    stamp = line.rsplit(" ", 1)[1]
    assert line.startswith("flowstat_node,agent=flowstat-agent-py,host=h,node_id=a\\ b\\,c\\=d,role=merger,run_id=r1 ")
    assert (
        'seq=7i,pid=42i,node_state="say \\"hi\\"",vmrss_kb=1000i,cpu_clock_hz=12.5,send_buffer_overloaded=false' in line
    )
    assert stamp == "1795344674123000000"


def test_json_document_keeps_schema_order_and_types():
    doc = json.loads(sample_schema.to_json(sample()))
    assert list(doc)[:4] == ["time", "run_id", "host", "node_id"] and doc["seq"] == 7
    assert sample_schema.document_id(sample()) == "r1/flowstat-agent-py/merger-0/7"


def test_control_reply_mapping_drops_wrong_types():
    got = sample_schema.from_control_reply(
        {
            "average_merge_time": 1,
            "objects_held": "x",
            "send_buffer_overloaded": True,
            "merged_objects_per_second": None,
            "objects_sent": -3,
            "node_state": "RUNNING",
        }
    )
    assert got == {"average_merge_time_ms": 1.0, "send_buffer_overloaded": True, "node_state": "RUNNING"}


def test_schema_docs_are_generated_from_the_schemas():
    import subprocess
    import sys

    from support.common import ROOT

    docs = (ROOT / "docs" / "schema.md").read_text()
    tables = subprocess.run([sys.executable, "-m", "flowstat.schema"], capture_output=True, text=True, check=True)
    assert docs.endswith(tables.stdout) and sample_schema.markdown_table() in tables.stdout


def test_c_field_table_and_enumerations_are_generated_from_the_package_schema(tmp_path):
    import subprocess
    import sys
    from importlib.resources import files

    from flowstat.schema import agent as agent_schema
    from flowstat.schema import flow as flow_schema
    from support.common import ROOT

    out = tmp_path / "fields.h"
    names = (sample_schema.SCHEMA_FILE, agent_schema.SCHEMA_FILE, flow_schema.EDGE_FILE)
    packaged = [files("flowstat.schema") / name for name in names]
    makefile = (ROOT / "collectors" / "c" / "Makefile").read_text()
    # the C build reads the same files
    assert "SCHEMA := ../../src/flowstat/schema/sample.schema.json" in makefile
    assert "AGENT_SCHEMA := ../../src/flowstat/schema/agent.schema.json" in makefile
    assert "EDGE_SCHEMA := ../../src/flowstat/schema/edge.schema.json" in makefile
    for source in packaged:
        assert (ROOT / "src" / "flowstat" / "schema" / source.name).read_bytes() == source.read_bytes()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "collectors" / "c" / "agent" / "gen_schema_header.py"),
            *map(str, packaged),
            str(out),
        ],
        check=True,
    )
    text = out.read_text()
    for f in sample_schema.fields():
        assert f'{{"{f.name}", FS_T_{f.type.upper()}, FS_I_{f.influx.upper()}' in text
    agent_table = text.split("FS_AGENT_FIELDS[FS_NAGENT_FIELDS] = {")[1].split("};")[0]
    assert [line.split('"')[1] for line in agent_table.strip().splitlines()] == [f.name for f in agent_schema.fields()]
    assert f'#define FS_AGENT_MEASUREMENT "{agent_schema.measurement()}"' in text
    assert "FS_AGENT_FIELDS_TAGS[3] = {FS_A_AGENT, FS_A_HOST, FS_A_RUN_ID}" in text  # line protocol's order
    edge_table = text.split("FS_EDGE_FIELDS[FS_NEDGE_FIELDS] = {")[1].split("};")[0]
    assert [line.split('"')[1] for line in edge_table.strip().splitlines()] == [
        f.name for f in flow_schema.fields("edge")
    ]
    assert "FS_EDGE_FIELDS_TAGS[4] = {FS_E_AGENT, FS_E_FROM, FS_E_RUN_ID, FS_E_TO}" in text
    assert "FS_ENUM_ROLE" not in text  # a pattern, no list
    assert (
        f"FS_ENUM_NODE_STATE[{len(sample_schema.NODE_STATES)}] = {{"
        + ", ".join(f'"{s}"' for s in sample_schema.NODE_STATES)
        + "}"
    ) in text
    assert f'#define FS_DEFAULT_ROLE "{sample_schema.DEFAULT_ROLE}"' in text
    assert f'#define FS_DEFAULT_NODE_STATE "{sample_schema.STATE_UP}"' in text
    keys = '"\\"role\\":", 7, "role=", 5'  # each encoding's key, written once here
    assert f'{{"role", FS_T_STRING, FS_I_TAG, NULL, 1, NULL, 0, "{sample_schema.ROLE_PATTERN}", {keys}}}' in text
    states = len(sample_schema.NODE_STATES)
    keys = '"\\"node_state\\":", 13, "node_state=", 11'
    row = f'{{"node_state", FS_T_STRING, FS_I_FIELD, "node_state", 1, FS_ENUM_NODE_STATE, {states}, NULL, {keys}}}'
    assert row in text


def test_enumerations_come_from_the_schema():
    assert sample_schema.DEFAULT_ROLE == "other" and sample_schema.PIPELINE_ROLES == ("producer", "merger", "viewer")
    assert {"RUNNING", "UP", "DOWN"} <= set(sample_schema.NODE_STATES) and sample_schema.STATE_UP == "UP"
    assert sample_schema.validate(sample(node_state="SLEEPING")) == [
        "node_state: 'SLEEPING' is not one of " + ", ".join(sample_schema.NODE_STATES)
    ]
    # a node that reports a state outside the list: left out, the agent says UP
    assert "node_state" not in sample_schema.from_control_reply({"node_state": "SLEEPING", "average_merge_time": 1.0})


def test_index_templates_and_generated_configs_are_current():
    from flowstat.generate import derived
    from flowstat.schema import run as run_schema
    from support.common import ROOT

    files = derived(ROOT)
    assert {p.parts[0] for p in files} == {"dashboards", "index-templates", "pipelines", "docs"}
    for path, text in files.items():
        assert (ROOT / path).read_text() == text, f"{path} is stale: run make generate"
    mapping = json.loads(
        (ROOT / "index-templates" / "elasticsearch" / "component-flowstat-sample-mappings.json").read_text()
    )
    assert set(mapping["template"]["mappings"]["properties"]) == {f.name for f in sample_schema.fields()}
    runs = json.loads((ROOT / "index-templates" / "elasticsearch" / "component-flowstat-run-mappings.json").read_text())
    props = runs["template"]["mappings"]["properties"]
    assert set(props) == set(run_schema.schema()["properties"])
    assert props["parameters"]["properties"]["producers"] == {"type": "long"}
    assert props["started"]["type"] == "date" and props["nodes"]["type"] == "keyword"
    assert props["affinity"] == {
        "properties": {
            "node_id": {"type": "keyword", "ignore_above": 256},
            "role": {"type": "keyword", "ignore_above": 256},
            "cpus": {"type": "long"},
        }
    }
    iql = (ROOT / "index-templates" / "influxdb" / "setup.iql").read_text()
    assert all(f'sum("mean_{f.name}")' in iql for f in sample_schema.fields() if f.rollup == "sum")


def run_doc(**kw):
    doc = {
        "run_id": "r1",
        "topology": "t.yaml",
        "started": "2026-11-22T10:00:00.000Z",
        "finished": "2026-11-22T10:00:20.500Z",
        "host": "h",
        "machine": {"cpus": 2, "python": "3.11.7", "flowstat_version": "0.1.0"},
        "parameters": {
            "object_type": "TH1F",
            "object_bytes": 1000,
            "object_shape": [252],
            "producers": 8,
            "rate_per_producer": 100.0,
            "buffer_size": 100,
            "mergers": 2,
            "producer_processes": 1,
            "duration_s": 20.0,
        },
        "nodes": ["producers-0", "merger-0"],
        "affinity": [
            {"node_id": "producers-0", "role": "producer", "cpus": [0]},
            {"node_id": "merger-0", "role": "merger", "cpus": [1, 2]},
        ],
        "verdict": {"ok": True, "conserved": True, "failed_checks": [], "failures": []},
        "summary": {"seconds": 20.0, "objects_sent": 16000, "merged_objects_per_second": 800.0},
    }
    doc.update(kw)
    return doc


def test_run_document_validates_by_field_path():
    from flowstat.schema import run as run_schema

    assert run_schema.validate(run_doc()) == []
    assert run_schema.validate({"run_id": "r", "started": "2026-11-22T10:00:00.000Z"}) == []  # outside the harness
    bad = run_doc(parameters={"producers": -1, "object_type": "TH9F", "colour": "red"}, started="yesterday")
    errors = run_schema.validate(bad)
    assert "parameters.producers: must be between 0 and 9223372036854775807, got -1" in errors
    assert any(e.startswith("parameters.object_type: 'TH9F' is not one of") for e in errors)
    assert "parameters.colour: not in the schema" in errors
    assert run_schema.validate(run_doc(started="yesterday")) == ["started: not an ISO-8601 UTC time ('yesterday')"]
    assert run_schema.validate(run_doc(finished="2026-11-22T10:00:20.500")) == [
        "finished: not an ISO-8601 UTC time ('2026-11-22T10:00:20.500')"
    ]  # local time: which one?
    assert run_schema.validate(run_doc(nodes=["a", 3])) == ["nodes[1]: expected string, got int '3'"]
    assert run_schema.validate(run_doc(affinity=[{"node_id": "x", "role": "boss", "cpus": [-1], "pid": 3}])) == [
        "affinity[0].role: 'boss' is not one of producer, merger, viewer, agent",
        "affinity[0].cpus[0]: must be between 0 and 9223372036854775807, got -1",
        "affinity[0].pid: not in the schema",
    ]
    assert run_schema.validate(run_doc(affinity=[{"node_id": "x", "role": "agent"}])) == [
        "affinity[0].cpus: required field is missing"
    ]
    doc = run_doc()
    del doc["run_id"]
    assert run_schema.validate(doc) == ["run_id: required field is missing"]


def test_run_point_flattens_the_influx_leaves():
    from flowstat.schema import run as run_schema

    leaves = [leaf for leaf in run_schema.leaves() if leaf.influx]
    assert len({leaf.name for leaf in leaves}) == len(leaves)  # flattened names are unique
    line = run_schema.to_line_protocol(run_doc())
    head, fields, stamp = line.split(" ")
    assert head == "flowstat_run,host=h,object_type=TH1F,run_id=r1"
    assert stamp == "1795341600000000000"
    assert "producers=8i" in fields and "rate_per_producer=100.0" in fields and "ok=true" in fields
    assert 'topology="t.yaml"' in fields and "merged_objects_per_second=800.0" in fields
    assert "object_shape" not in fields and "python" not in fields and "affinity" not in fields


def test_run_schema_object_types_are_the_harness_kinds():
    from flowstat.harness.qcobjects import Kind
    from flowstat.schema import run as run_schema

    enum = run_schema.schema()["properties"]["parameters"]["properties"]["object_type"]["enum"]
    assert enum == [k.name for k in Kind]
