import json

import pytest

from flowstat_agent import schema


def sample(**kw):
    s = {"time": "2026-11-22T10:51:14.123Z", "run_id": "r1", "host": "h", "node_id": "merger-0",
         "role": "merger", "agent": "flowstat-agent-py", "seq": 7, "pid": 42, "node_state": "RUNNING",
         "vmrss_kb": 1000, "cpu_clock_hz": 12.5, "send_buffer_overloaded": False}
    s.update(kw)
    return s


def test_schema_file_is_the_definition():
    names = [f.name for f in schema.fields()]
    assert names[:3] == ["time", "run_id", "host"]
    assert {f.name for f in schema.fields() if f.influx == "tag"} == {"run_id", "host", "node_id", "role", "agent"}
    assert all(f.unit for f in schema.fields() if f.name.endswith(("_kb", "_hz", "_ms")))


def test_valid_sample_has_no_errors():
    assert schema.validate(sample()) == []


@pytest.mark.parametrize("change,error", [
    ({"seq": -1}, "seq: must be between 0 and"), ({"seq": 2**64 - 1}, "seq: must be between 0 and"),
    ({"seq": 1.5}, "seq: expected integer"),
    ({"role": "boss"}, "role:"), ({"extra": 1}, "extra: not in the schema"),
    ({"send_buffer_overloaded": "false"}, "expected boolean"), ({"cpu_clock_hz": float("nan")}, "expected number"),
])
def test_invalid_samples_name_the_field(change, error):
    assert any(error in e for e in schema.validate(sample(**change)))


def test_missing_required_field():
    s = sample()
    del s["pid"]
    assert schema.validate(s) == ["pid: required field is missing"]


def test_line_protocol():
    line = schema.to_line_protocol(sample(node_id="a b,c=d", node_state='say "hi"'))
    stamp = line.rsplit(" ", 1)[1]
    assert line.startswith("flowstat_node,agent=flowstat-agent-py,host=h,node_id=a\\ b\\,c\\=d,role=merger,run_id=r1 ")
    assert 'seq=7i,pid=42i,node_state="say \\"hi\\"",vmrss_kb=1000i,cpu_clock_hz=12.5,send_buffer_overloaded=false' in line
    assert stamp == "1795344674123000000"


def test_json_document_keeps_schema_order_and_types():
    doc = json.loads(schema.to_json(sample()))
    assert list(doc)[:4] == ["time", "run_id", "host", "node_id"] and doc["seq"] == 7
    assert schema.document_id(sample()) == "r1/flowstat-agent-py/merger-0/7"


def test_control_reply_mapping_drops_wrong_types():
    got = schema.from_control_reply({"average_merge_time": 1, "backlog": "x", "send_buffer_overloaded": True,
                                     "merged_objects_per_second": None, "objects_sent": -3, "node_state": "RUNNING"})
    assert got == {"average_merge_time_ms": 1.0, "send_buffer_overloaded": True, "node_state": "RUNNING"}


def test_schema_readme_is_generated_from_the_schema():
    from conftest import ROOT

    readme = (ROOT / "collectors" / "schema" / "README.md").read_text()
    assert readme.endswith(schema.markdown_table())


def test_c_field_table_is_generated_from_the_schema(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    out = tmp_path / "fields.h"
    subprocess.run([sys.executable, str(ROOT / "collectors" / "c" / "gen_schema_header.py"), str(schema.SCHEMA_PATH),
                    str(out)], check=True)
    text = out.read_text()
    for f in schema.fields():
        assert f'{{"{f.name}", FS_T_{f.type.upper()}, FS_I_{f.influx.upper()}' in text


def test_index_templates_are_generated_from_the_schema():
    from flowstat.templates import render_files

    for path, text in render_files().items():
        assert path.read_text() == text, f"{path} is stale: run python -m flowstat.templates --write"
    from conftest import ROOT

    mapping = json.loads((ROOT / "index-templates" / "elasticsearch" / "component-flowstat-sample-mappings.json").read_text())
    assert set(mapping["template"]["mappings"]["properties"]) == {f.name for f in schema.fields()}
