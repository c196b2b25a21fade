"""The sample encodings in Python alone, against fixed expected bytes written out by hand: a sample
holding every field of the schema, as line protocol (both the general encoder and the run file's
fast path) and as the JSON document. test_c_agent.py holds the C agent to the same bytes."""

from __future__ import annotations

import json

import pytest

from flowstat.schema import lineprotocol
from flowstat.schema import sample as sample_module
from flowstat.schema import sample as sample_schema
from flowstat.schema.runfile import FileReport, samples

EVERY_FIELD = {
    "time": "2026-11-22T10:51:14.123Z",
    "run_id": "r1",
    "host": "vm-1",
    "node_id": "merger-0",
    "role": "merger",
    "agent": "flowstat-agent-py",
    "seq": 7,
    "pid": 4242,
    "node_state": "RUNNING",
    "vmrss_kb": 35752,
    "cpu_clock_hz": 412000.0,
    "cpu_user_hz": 400000.5,
    "cpu_system_hz": 11999.5,
    "cpu_user_seconds": 81.37,
    "cpu_system_seconds": 2.5,
    "threads": 3,
    "average_merge_time_ms": 0.25,
    "merged_objects_per_second": 1234.5,
    "objects_sent": 100,
    "objects_received": 400,
    "objects_merged": 401,
    "bytes_sent": 409600,
    "bytes_received": 1638400,
    "objects_held": 2,
    "objects_in_flight": 5,
    "input_latency_p50_ms": 1.5,
    "input_latency_p99_ms": 9.75,
    "input_latency_max_ms": 12.0,
    "input_latency_objects": 398,
    "receive_buffer_size": 100,
    "send_buffer_size": 101,
    "receive_buffer_overloaded": False,
    "send_buffer_overloaded": True,
    "send_overload_events": 3,
    "receive_overload_events": 0,
    "sequence_gaps": 1,
    "busy_seconds": 12.5,
    "backpressured_seconds": 0.25,
    "idle_seconds": 30.0,
    "busy_ratio": 0.3,
    "backpressured_ratio": 0.0,
    "idle_ratio": 0.7,
    "request_timestamp": "2026-11-22T10:51:14.100Z",
    "response_timestamp": "2026-11-22T10:51:14.101Z",
}

EVERY_FIELD_LINE = (
    "flowstat_node,agent=flowstat-agent-py,host=vm-1,node_id=merger-0,role=merger,run_id=r1 "
    'seq=7i,pid=4242i,node_state="RUNNING",vmrss_kb=35752i,cpu_clock_hz=412000.0,cpu_user_hz=400000.5,'
    "cpu_system_hz=11999.5,cpu_user_seconds=81.37,cpu_system_seconds=2.5,threads=3i,average_merge_time_ms=0.25,merged_objects_per_second=1234.5,"
    "objects_sent=100i,objects_received=400i,objects_merged=401i,bytes_sent=409600i,bytes_received=1638400i,"
    "objects_held=2i,objects_in_flight=5i,input_latency_p50_ms=1.5,input_latency_p99_ms=9.75,"
    "input_latency_max_ms=12.0,input_latency_objects=398i,receive_buffer_size=100i,send_buffer_size=101i,"
    "receive_buffer_overloaded=false,send_buffer_overloaded=true,send_overload_events=3i,"
    "receive_overload_events=0i,sequence_gaps=1i,busy_seconds=12.5,backpressured_seconds=0.25,idle_seconds=30.0,"
    'busy_ratio=0.3,backpressured_ratio=0.0,idle_ratio=0.7,request_timestamp="2026-11-22T10:51:14.100Z",'
    'response_timestamp="2026-11-22T10:51:14.101Z" 1795344674123000000'
)


def test_the_sample_holds_every_field_of_the_schema():
    """A field added to the schema must be added here, and to the expected line."""
    assert list(EVERY_FIELD) == [f.name for f in sample_schema.fields()] and sample_schema.validate(EVERY_FIELD) == []


def test_every_field_is_encoded_as_line_protocol_byte_for_byte():
    assert sample_schema.to_line_protocol(EVERY_FIELD) == EVERY_FIELD_LINE


def test_the_run_files_fast_path_writes_the_same_line(tmp_path):
    path = tmp_path / "samples.ndjson"
    path.write_text(json.dumps(EVERY_FIELD) + "\n")
    ((doc, values, keys, lay, raw, ns),) = samples(path, FileReport(str(path)))
    assert lay.fast and ns == 1795344674123000000
    assert lay.line(values, ns) == EVERY_FIELD_LINE + "\n"


def test_the_fast_path_writes_both_booleans_both_ways(tmp_path):
    path = tmp_path / "samples.ndjson"
    flipped = {**EVERY_FIELD, "receive_buffer_overloaded": True, "send_buffer_overloaded": False}
    path.write_text(json.dumps(flipped) + "\n")
    ((doc, values, keys, lay, raw, ns),) = samples(path, FileReport(str(path)))
    want = EVERY_FIELD_LINE.replace(
        "receive_buffer_overloaded=false,send_buffer_overloaded=true",
        "receive_buffer_overloaded=true,send_buffer_overloaded=false",
    )
    assert lay.line(values, ns) == want + "\n" == sample_schema.to_line_protocol(flipped) + "\n"


def test_an_integer_in_a_number_field_is_written_as_a_float():
    line = sample_schema.to_line_protocol({**EVERY_FIELD, "cpu_clock_hz": 412000})
    assert ",cpu_clock_hz=412000.0," in line and line == EVERY_FIELD_LINE


def test_fields_left_out_are_not_written_and_required_ones_stay():
    minimal = {
        k: EVERY_FIELD[k] for k in ("time", "run_id", "host", "node_id", "role", "agent", "seq", "pid", "node_state")
    }
    assert sample_schema.to_line_protocol(minimal) == (
        "flowstat_node,agent=flowstat-agent-py,host=vm-1,node_id=merger-0,role=merger,run_id=r1 "
        'seq=7i,pid=4242i,node_state="RUNNING" 1795344674123000000'
    )


def test_tags_and_strings_are_escaped():
    line = sample_schema.to_line_protocol(
        {**EVERY_FIELD, "node_id": "a b,c=d\\e", "host": "", "request_timestamp": 'x"y\\z'}
    )
    assert line.startswith("flowstat_node,agent=flowstat-agent-py,node_id=a\\ b\\,c\\=d\\\\e,role=merger,run_id=r1 ")
    assert ',request_timestamp="x\\"y\\\\z",' in line


def test_every_field_is_encoded_as_the_json_document():
    text = sample_schema.to_json(EVERY_FIELD)
    assert json.loads(text) == EVERY_FIELD and list(json.loads(text)) == list(EVERY_FIELD)
    assert '"cpu_clock_hz":412000.0' in text.replace(" ", "") and '"send_buffer_overloaded":true' in text.replace(
        " ", ""
    )
    assert sample_schema.document_id(EVERY_FIELD) == "r1/flowstat-agent-py/merger-0/7"


@pytest.mark.parametrize(
    "text,key,string",
    [
        ("plain", "plain", '"plain"'),
        ("a b", "a\\ b", '"a b"'),
        ("a,b=c", "a\\,b\\=c", '"a,b=c"'),
        ('q"uote', 'q"uote', '"q\\"uote"'),
        ("back\\slash", "back\\\\slash", '"back\\\\slash"'),
    ],
)
def test_escaping_of_keys_and_string_values(text, key, string):
    assert lineprotocol.escape_key(text) == key and lineprotocol.escape_string(text) == string


@pytest.mark.parametrize(
    "value,written",
    [(True, "true"), (False, "false"), (0, "0i"), (-3, "-3i"), (1.5, "1.5"), (2.0, "2.0"), ("s", '"s"')],
)
def test_field_values_are_written_by_type(value, written):
    assert lineprotocol.field_value(value) == written


def test_a_point_sorts_its_tags_leaves_empty_ones_out_and_keeps_field_order():
    assert lineprotocol.point("m x", {"b": "2", "a": "1 1", "c": ""}, {"z": 1, "y": 0.5, "x": True}, 17) == (
        "m\\ x,a=1\\ 1,b=2 z=1i,y=0.5,x=true 17"
    )
    with pytest.raises(ValueError, match="m: a point needs at least one field"):
        lineprotocol.point("m", {"a": "1"}, {}, 1)


# -- the caches: a tick's samples share their time and series, so both are worked out once. What is
# written must not depend on whether they were ----------------------------------------------------


def clear_caches():
    sample_module._SERIES_CACHE.clear()
    sample_module._TIME_CACHE.clear()


def test_lines_are_the_same_from_cold_caches_and_warm_ones(tmp_path):
    clear_caches()
    assert sample_schema.to_line_protocol(EVERY_FIELD) == EVERY_FIELD_LINE  # cold
    assert sample_schema.to_line_protocol(EVERY_FIELD) == EVERY_FIELD_LINE  # warm
    path = tmp_path / "samples.ndjson"
    path.write_text(json.dumps(EVERY_FIELD) + "\n")
    ((doc, values, keys, lay, raw, ns),) = samples(path, FileReport(str(path)))
    clear_caches()
    assert lay.line(values, ns) == EVERY_FIELD_LINE + "\n"  # the fast path, cold
    assert lay.line(values, ns) == EVERY_FIELD_LINE + "\n"


def test_a_series_left_without_some_tags_is_written_without_them():
    clear_caches()
    line = sample_schema.to_line_protocol({**EVERY_FIELD, "host": "", "run_id": "run 2"})
    assert line.startswith("flowstat_node,agent=flowstat-agent-py,node_id=merger-0,role=merger,run_id=run\\ 2 seq=7i,")


@pytest.mark.parametrize(
    "iso,ns",
    [
        ("1970-01-01T00:00:00.000Z", 0),
        ("2026-11-22T10:51:14.123Z", 1795344674123000000),
        ("2026-11-22T10:51:14.999Z", 1795344674999000000),
        ("2026-11-22T10:51:14.123999Z", 1795344674123000000),  # microseconds: whole milliseconds kept
        ("2026-11-22T11:51:14.123+01:00", 1795344674123000000),
        ("2026-11-22T10:51:14Z", 1795344674000000000),
    ],
)
def test_times_are_nanoseconds_since_the_epoch_in_whole_milliseconds(iso, ns):
    clear_caches()
    assert sample_schema.time_ns(iso) == ns and type(sample_schema.time_ns(iso)) is int
    assert sample_schema.time_ns(iso) == ns  # warm


def test_a_time_without_a_zone_is_refused_by_name():
    clear_caches()
    with pytest.raises(ValueError) as err:
        sample_schema.time_ns("2026-11-22T10:51:14.123")
    assert str(err.value) == "'2026-11-22T10:51:14.123': no time zone (flowstat writes UTC, with a Z)"


def test_control_replies_become_sample_fields_of_the_schemas_types():
    got = sample_schema.from_control_reply(
        {
            "average_merge_time": 1,
            "merged_objects_per_second": 2.5,
            "objects_sent": 0,
            "objects_received": 2**63 - 1,
            "objects_merged": 2**63,
            "objects_held": -1,
            "send_buffer_overloaded": False,
            "node_state": "DRAINING",
        }
    )
    assert got == {
        "average_merge_time_ms": 1.0,
        "merged_objects_per_second": 2.5,
        "objects_sent": 0,
        "objects_received": 2**63 - 1,
        "send_buffer_overloaded": False,
        "node_state": "DRAINING",
    }
    assert type(got["average_merge_time_ms"]) is float  # an integer in a number field is a float
    assert (
        sample_schema.from_control_reply({"average_merge_time": "1", "node_state": "NAPPING", "objects_sent": 1.0})
        == {}
    )
