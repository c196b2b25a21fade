"""runfile.py on real run files in tmp_path: every bad line named by its number and exact reason,
the counts a progress bar and the report rely on, the parts spans() cuts read back to the whole
file, and the run document with what was left out of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowstat.schema import runfile
from flowstat.schema.sample import INT64_MAX

T0 = "2026-11-22T10:51:14.123Z"
T1 = "2026-11-22T10:51:15.000Z"


def node(seq: int = 1, **kw) -> dict:
    """A sample with its required fields only (kw adds or changes fields; None removes one)."""
    d = {
        "time": T0,
        "run_id": "r",
        "host": "h",
        "node_id": "n-1",
        "role": "merger",
        "agent": "flowstat-agent-py",
        "seq": seq,
        "pid": 42,
        "node_state": "RUNNING",
        **kw,
    }
    return {k: v for k, v in d.items() if v is not None}


def self_sample(**kw) -> dict:
    d = {
        "time": T0,
        "host": "h",
        "agent": "flowstat-agent-py",
        "interval_s": 1.0,
        "seq": 3,
        "rounds": 1,
        "skipped_rounds": 0,
        "samples": 2,
        "control_errors": 0,
        "proc_errors": 0,
        "delivered": 2,
        "refused": 0,
        "lost": 0,
        "send_failures": 0,
        "spool_dropped": 0,
        "targets": 1,
        "spooled_batches": 0,
        "spooled_samples": 0,
        "sinks_down": 0,
    }
    return {**d, **kw}


def run_file(tmp_path: Path, lines: list) -> Path:
    """A run file of these lines: a dict is written as JSON with its newline, a str as it is."""
    path = tmp_path / "samples.ndjson"
    path.write_text("".join(x if isinstance(x, str) else json.dumps(x) + "\n" for x in lines))
    return path


def read(path: Path, span=None, report=None) -> tuple[runfile.FileReport, list]:
    report = report or runfile.FileReport(str(path))
    return report, list(runfile.samples(path, report, span))


def test_field_types_are_the_schemas_python_types():
    types, required = runfile.field_types()
    assert (types["seq"], types["cpu_clock_hz"], types["node_id"], types["send_buffer_overloaded"]) == (
        (int,),
        (float, int),
        (str,),
        (bool,),
    )
    assert len(types) == 44 and types["busy_ratio"] == (float, int)  # issue 46: six phase fields
    assert required == ["time", "run_id", "host", "node_id", "role", "agent", "seq", "pid", "node_state"]


@pytest.mark.parametrize(
    "change,why",
    [
        ({"seq": 0, "vmrss_kb": INT64_MAX}, None),  # both ends of int64 are good
        ({"seq": -1}, "field 'seq': wrong type or value -1"),
        ({"vmrss_kb": INT64_MAX + 1}, f"field 'vmrss_kb': wrong type or value {INT64_MAX + 1}"),
        ({"pid": True}, "field 'pid': wrong type or value True"),  # a bool is no integer
        ({"cpu_clock_hz": float("nan")}, "field 'cpu_clock_hz': wrong type or value nan"),
        ({"role": "Boss"}, "field 'role': wrong type or value 'Boss'"),  # outside the role pattern
        ({"role": "boss"}, None),  # any role the pattern allows
        ({"extra": 1}, "field 'extra': not in the schema"),
        ({"host": None, "pid": None}, "field 'host': missing"),  # the first missing, in the schema's order
    ],
)
def test_bad_field_names_the_field_and_why(change, why):
    assert runfile.bad_field(node(**change), *runfile.field_types()) == why


def test_bad_field_cuts_a_long_value_at_120_characters():
    why = runfile.bad_field(node(seq="x" * 300), *runfile.field_types())
    assert why == "field 'seq': wrong type or value '" + "x" * 86


def test_every_bad_line_is_named_by_its_number_and_exact_reason(tmp_path):
    lines = [
        {"flowstat_run": 5},  # a header that is no object: an empty one
        node(1),
        "{bad\n",
        "\n",
        "[1, 2]\n",
        node(2, role="Boss"),
        node(3, node_state="SLEEPING"),
        node(4, pid=-1),
        node(5, vmrss_kb=INT64_MAX + 1),
        node(6, time="y" * 50),
        node(7, extra=1),
        node(8, host=None),
        {"flowstat_run": {"run_id": "r"}},
        node(0, vmrss_kb=INT64_MAX),
        json.dumps(node(10))[:30],
    ]
    report, got = read(run_file(tmp_path, lines))
    assert report.header == {}
    assert report.bad == [
        (3, "not JSON (unexpected character, expected a string key)"),
        (4, "not JSON (input data is empty)"),
        (5, "not a JSON object"),
        (6, "field 'role': wrong type or value 'Boss'"),
        (7, "field 'node_state': wrong type or value 'SLEEPING'"),
        (8, "field 'pid': wrong type or value -1"),
        (9, f"field 'vmrss_kb': wrong type or value {INT64_MAX + 1}"),
        (10, "field 'time': not ISO-8601 ('" + "y" * 40 + "')"),
        (11, "field 'extra': not in the schema"),
        (12, "field 'host': missing"),
        (13, "a run header that is not on the first line"),
        (15, "truncated line"),
    ]
    assert [d["seq"] for d, *_ in got] == [1, 0] and report.good == 2 and report.lines == 15


def test_a_line_of_known_keys_with_other_value_types_is_judged_afresh(tmp_path):
    """The layout of a key order is kept for its value types only: the same keys with a string in
    an integer field must not pass on the first line's layout, nor a float where an int was."""
    lines = [
        node(1, cpu_clock_hz=1.5),
        node("2", cpu_clock_hz=1.5),
        node(3, cpu_clock_hz=2),
        node(4, cpu_clock_hz=2.5),
        node(5.0, cpu_clock_hz=2.5),
    ]
    report, got = read(run_file(tmp_path, lines))
    assert [d["seq"] for d, *_ in got] == [1, 3, 4]
    assert report.bad == [(2, "field 'seq': wrong type or value '2'"), (5, "field 'seq': wrong type or value 5.0")]


def test_self_samples_are_kept_or_named(tmp_path):
    key = "flowstat_agent"
    lines = [
        node(1),
        {key: self_sample()},
        {key: self_sample(), "seq": 1},
        {key: [1]},
        {key: self_sample(seq="y" * 300)},
        {key: self_sample(time="yesterday", seq=4)},
        node(2),
    ]
    report, got = read(run_file(tmp_path, lines))
    assert report.self_samples == [self_sample()] and report.good == 2
    alone = f"{key}: not a self-sample (one object alone on its line)"
    long = f"{key}.seq: expected integer, got str '" + "y" * 200
    assert report.bad == [
        (3, alone),
        (4, alone),
        (5, long[:160]),
        (6, f"{key}.time: not an ISO-8601 UTC time ('yesterday')"),
    ]


def test_edge_counters_are_kept_or_named(tmp_path):
    key = "flowstat_edge"
    counter = {"time": "2026-11-29T10:00:00.000Z", "run_id": "r", "from": "w-0", "to": "m", "agent": "a"}
    counter["objects_received"] = 12
    lines = [
        node(1),
        {key: counter},
        {key: counter, "seq": 1},
        {key: {**counter, "objects_received": -1}},
        {key: {k: v for k, v in counter.items() if k != "agent"}},  # a rate or topology point: no counter
        node(2),
    ]
    report, _ = read(run_file(tmp_path, lines))
    assert report.edge_counts == [counter] and report.good == 2
    assert [n for n, _ in report.bad] == [3, 4, 5]
    assert report.bad[0][1] == f"{key}: not an edge counter (one object alone on its line)"
    assert report.bad[1][1].startswith(f"{key}.objects_received") and "agent and objects_received" in report.bad[2][1]


def test_a_self_sample_written_under_a_field_s_old_name_is_read_under_its_new_one(tmp_path):
    """Run files recorded before issue 24 count a sink's refusals as "rejected": still replayable."""
    old = {("rejected" if k == "refused" else k): v for k, v in self_sample(refused=4).items()}
    report, _ = read(run_file(tmp_path, [node(1), {"flowstat_agent": old}]))
    assert report.bad == [] and report.self_samples == [self_sample(refused=4)]
    assert list(report.self_samples[0]) == list(self_sample())  # in the schema's order, not at the end


def test_the_report_holds_the_first_and_last_sample_as_the_caller_left_them(tmp_path):
    path = run_file(
        tmp_path,
        [
            node(1, time=T0, node_id="a"),
            node(2, time=T1, node_id="b", host="h2", run_id="r2"),
            "{bad\n",
            node(3, time=T1, node_id="a"),
        ],
    )
    report = runfile.FileReport(str(path))
    seen = []
    for doc, _values, _keys, _lay, raw, ns in runfile.samples(path, report):
        # progress as of each sample: the bytes up to the end of its line
        seen.append((report.good, report.bytes_read, raw, ns))
        doc["time"] = f"moved {doc['seq']}"  # as replay --rebase-time does
    sizes = [len(x) for x in path.read_bytes().splitlines(keepends=True)]
    assert [(g, b) for g, b, *_ in seen] == [(1, sizes[0]), (2, sum(sizes[:2])), (3, sum(sizes))]
    assert seen[0][2] == path.read_bytes().splitlines(keepends=True)[0]
    assert [s[3] for s in seen] == [1795344674123000000, 1795344675000000000, 1795344675000000000]
    assert (report.first_time, report.last_time, report.run_id, report.host) == ("moved 1", "moved 3", "r", "h")
    assert report.nodes == {"a", "b"} and report.lines == 4 and report.bytes_read == sum(sizes)
    assert report.run_ids == {"r", "r2"}  # replay rolls each run of a file of several up whole


def test_an_empty_file_reads_nothing(tmp_path):
    report, got = read(run_file(tmp_path, []))
    assert got == [] and (report.lines, report.bytes_read, report.good, report.bad) == (0, 0, 0, [])
    assert (report.first_time, report.last_time, report.run_id, report.host) == (None, None, None, None)
    with pytest.raises(ValueError) as err:
        runfile.run_document(report)
    assert str(err.value) == f"{report.path}: no good sample was read: no run to describe"


def test_one_report_counts_on_over_several_reads(tmp_path):
    """samples() adds to what the report already counted (its lines, bytes and samples)."""
    path = run_file(tmp_path, [node(1), "{bad\n", node(2)])
    report, _ = read(path)
    read(path, report=report)
    assert (report.lines, report.bytes_read, report.good) == (6, 2 * path.stat().st_size, 4)


def test_spans_cut_at_line_starts(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"a" * 79 + b"\n" + b"bbbb\n" * 4)  # 100 bytes: one long line, four short
    # a cut inside the long line goes to its end; the next cut starts after the last one
    assert runfile.spans(path, 4) == [(0, 80), (80, 85), (85, 90), (90, 100)]
    assert runfile.spans(path, 1) == [(0, 100)]
    # a cut that would fall on the file's end is no cut: no empty last part
    path.write_bytes(b"a\n" + b"b" * 99 + b"\n")
    assert runfile.spans(path, 2) == [(0, 102)]
    path.write_bytes(b"")
    assert runfile.spans(path, 3) == [(0, 0)]
    # bytes, not text: the middle of the file falls inside a two-byte character
    path.write_bytes("é".encode() * 50 + b"\n" + b"b\n")
    assert runfile.spans(path, 2) == [(0, 101), (101, 103)]


@pytest.mark.parametrize("parts", [2, 3, 5, 9])
def test_every_span_read_gives_every_line_once_with_its_number(tmp_path, parts):
    lines = [{"flowstat_run": {"run_id": "r"}}] + [node(i) if i % 4 else f"{{bad {i}\n" for i in range(1, 40)]
    path = run_file(tmp_path, lines)
    spans = runfile.spans(path, parts)
    assert len(spans) == parts and spans[0][0] == 0 and spans[-1][1] == path.stat().st_size
    seqs, bad, counted, size = [], [], 0, 0
    for span in spans:  # line numbers as report.load's _merged counts them: after the parts before
        report, got = read(path, span)
        seqs += [d["seq"] for d, *_ in got]
        bad += [(n + counted, why[:8]) for n, why in report.bad]
        counted, size = counted + report.lines, size + report.bytes_read
        assert report.bytes_read == span[1] - span[0]
        assert (report.first_time, report.run_id, report.host) == ((T0, "r", "h") if got else (None,) * 3)
    assert seqs == [i for i in range(1, 40) if i % 4]
    assert bad == [(i + 1, "not JSON") for i in range(4, 40, 4)]
    assert (counted, size) == (40, path.stat().st_size)


def test_a_run_without_run_json_has_no_notes(tmp_path):
    report, _ = read(run_file(tmp_path, [{"flowstat_run": {"run_id": "r", "bogus": 1}}, node(1)]))
    assert runfile.run_document(report) == {
        "run_id": "r",
        "started": T0,
        "finished": T0,
        "host": "h",
        "nodes": ["n-1"],
        "samples": 1,
        "label": "r | recorded on h",
    }
    assert report.notes == []


def test_a_run_document_that_does_not_conform_is_refused(tmp_path):
    """Here a time moved to no time: checked after the samples filled the document in."""
    report, _ = read(run_file(tmp_path, [node(1)]))
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "started": T0, "finished": T1}))
    with pytest.raises(ValueError) as exc:
        runfile.run_document(report, retime=lambda t: "soon")
    assert (
        str(exc.value)
        == f"{report.path}: the run document does not conform: started: not an ISO-8601 UTC time ('soon')"
    )


@pytest.mark.parametrize(
    "content,what", [("[1, 2]", "not a run document"), ('{"run_id": "other"}', "run 'other'"), ("{}", "run None")]
)
def test_a_run_json_of_no_run_or_another_is_named_in_full(tmp_path, content, what):
    report, _ = read(run_file(tmp_path, [node(1)]))
    (tmp_path / "run.json").write_text(content)
    assert runfile.run_document(report)["started"] == T0
    assert report.notes == [
        f"{tmp_path / 'run.json'}: {what}, but the samples are of run 'r'; the run document " f"comes from the run file"
    ]


def test_a_run_json_that_cannot_be_read_is_named_with_why(tmp_path):
    report, _ = read(run_file(tmp_path, [node(1)]))
    (tmp_path / "run.json").mkdir()
    assert runfile.run_document(report)["run_id"] == "r"
    assert report.notes == [
        f"{tmp_path / 'run.json'}: cannot be read ([Errno 21] Is a directory: "
        f"'{tmp_path / 'run.json'}'); the run document comes from the run file"
    ]


def test_each_field_of_run_json_that_does_not_conform_is_named_and_left_out(tmp_path):
    """Also a key that is no field name ("a.b" once made this loop endless), and a field whose
    error is deep inside it (in a list): each goes whole, the rest is kept."""
    report, _ = read(run_file(tmp_path, [node(1)]))
    run_json = tmp_path / "run.json"
    run_json.write_text(
        json.dumps(
            {
                "run_id": "r",
                "started": T1,
                "a.b": 1,
                "x[0]": 2,
                "topology": 5,
                "affinity": [{"role": "boss"}],
                "description": "d",
                "finished": "later",
            }
        )
    )
    doc = runfile.run_document(report, retime=lambda t: f"{t[:-4]}999Z")
    assert doc == {
        "run_id": "r",
        "started": "2026-11-22T10:51:15.999Z",
        "description": "d",
        "finished": T0,
        "host": "h",
        "nodes": ["n-1"],
        "samples": 1,
        "label": "r | recorded on h",
    }
    left = [
        "a.b: not in the schema",
        "x[0]: not in the schema",
        "topology: expected string, got int '5'",
        "affinity[0].role: 'boss' is not one of producer, merger, viewer, agent",
        "finished: not an ISO-8601 UTC time ('later')",
    ]
    assert report.notes == [f"{run_json}: {x}; left out of the run document" for x in left]
