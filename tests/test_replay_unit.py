"""Replay's reading of run files, without servers: the fast path (sample_schema.Layout) and the
field-by-field path must agree on every sample, valid or not, and encode it byte for byte alike."""

from __future__ import annotations

import json
import random
from pathlib import Path

import orjson
import pytest

from flowstat import replay as R
from flowstat import stores
from flowstat.schema import runfile
from flowstat.schema import sample as sample_schema
from flowstat.stores import WriterProcess
from flowstat.stores.elasticsearch import ElasticsearchWriter, daily_index
from flowstat.stores.influxdb import InfluxDBWriter


def influx_only():
    return [InfluxDBWriter("http://unused").encoder()]


def both(index: str = "idx"):
    return [InfluxDBWriter("http://unused").encoder(), ElasticsearchWriter("http://unused", index).encoder()]


STRINGS = ["a", "b c", "x,y=z", "", "é", "RUNNING", 'say "hi"', "back\\slash", "tab\there"]
INTS = [0, 1, 7, 2**63 - 1, 2**63, 2**64 - 1, -1]
NUMBERS = [0.0, -0.0, 1e-7, 1e22, 123.456, 5e-324, 1.7976931348623157e308, 3.0, 12, -4]


def random_sample(rnd: random.Random, valid: bool) -> dict:
    """A sample in a random key order; when not ``valid``, some of it may be wrong. Half of them
    are plain (no quote or backslash in a string, floats in number fields): the fast path's own."""
    plain = rnd.random() < 0.5
    s = {}
    for f in sample_schema.fields():
        if not f.required and rnd.random() < 0.3:
            continue
        if f.enum:
            s[f.name] = rnd.choice(f.enum)
        elif f.pattern:  # the role: the harness's, or any other the pattern allows
            s[f.name] = rnd.choice(["producer", "merger", "worker", "a-b_9"])
        elif f.type == "string":
            s[f.name] = rnd.choice(STRINGS[:6] if plain else STRINGS)
        elif f.type == "integer":
            s[f.name] = rnd.choice(INTS[:4] if valid else INTS)
        elif f.type == "number":
            s[f.name] = rnd.choice(NUMBERS[:8] if plain else NUMBERS)
        else:
            s[f.name] = rnd.random() < 0.5
    s["time"] = rnd.choice(["2026-11-22T10:51:14.123Z", "2026-11-22T10:51:15.000Z"])
    if not valid:
        mistake = rnd.randrange(5)
        if mistake == 0:
            s[rnd.choice(list(s))] = rnd.choice(["1", 1.5, True, None, [1]])
        elif mistake == 1:
            s.pop(rnd.choice([f.name for f in sample_schema.fields() if f.required]))
        elif mistake == 2:
            s["unknown_field"] = 1
        elif mistake == 3:
            s[rnd.choice(["role", "node_state"])] = rnd.choice(["boss", "SLEEPING", "", "Bad Role!", "worker\n"])
    keys = list(s)
    rnd.shuffle(keys)
    return {k: s[k] for k in keys}


def test_fast_and_careful_checks_agree_and_encode_alike(tmp_path):
    """read_batches on random samples, valid or not: it must skip exactly what the field-by-field
    check refuses, and write exactly to_line_protocol's lines for the rest, whichever path it took.
    What is refused is judged by the schema's own validator, not by replay's checks."""
    rnd = random.Random(4)
    docs = [orjson.loads(orjson.dumps(random_sample(rnd, valid=i % 2 == 0))) for i in range(6000)]
    path = tmp_path / "samples.ndjson"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    report = R.FileReport(str(path))
    lp = b"".join(b for (b,), _ in R.read_batches(path, report, influx_only())).decode()
    refused = {i + 1 for i, d in enumerate(docs) if sample_schema.validate(d)}
    assert {lineno for lineno, _ in report.bad} == refused
    assert lp.splitlines() == [sample_schema.to_line_protocol(d) for i, d in enumerate(docs) if i + 1 not in refused]
    # every path was exercised: the fast one, the careful one with good samples, and refusals
    careful_good = sum(
        1
        for i, d in enumerate(docs)
        if i + 1 not in refused
        and (
            any(isinstance(v, str) and ('"' in v or "\\" in v) for v in d.values())
            or any(type(d.get(f.name)) is int for f in sample_schema.fields() if f.type == "number")
        )
    )
    assert min(len(refused), careful_good, len(docs) - len(refused) - careful_good) > 300


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(lines))


def good(seq: int, **kw) -> dict:
    d = {
        "time": f"2026-11-22T10:51:{seq % 60:02d}.{seq % 1000:03d}Z",
        "run_id": "r",
        "host": "h",
        "node_id": "n-1",
        "role": "merger",
        "agent": "flowstat-agent-py",
        "seq": seq,
        "pid": 42,
        "node_state": "RUNNING",
        "vmrss_kb": 1000 + seq,
        "cpu_clock_hz": 2.5 * seq,
        "send_buffer_overloaded": seq % 2 == 0,
    }
    d.update(kw)
    return d


def test_read_batches_encodes_every_good_line_and_names_every_bad_one(tmp_path):
    header = json.dumps({"flowstat_run": {"run_id": "r", "parameters": {"producers": 2}}}) + "\n"
    docs = {i: good(i) for i in range(1, 30)}
    docs[5] = good(5, host='say "hi"')  # valid, escaped: careful path
    docs[6] = good(6, cpu_clock_hz=12)  # valid, integer in a number field: careful path
    docs[7] = good(7, node_id="a b,c")  # tag to escape: fast path, escaped series
    lines = [header] + [json.dumps(docs[i]) + "\n" for i in sorted(docs)]
    bad = {
        10: ("{not json\n", "not JSON"),
        11: ("[1, 2]\n", "not a JSON object"),
        12: (json.dumps(good(99, vmrss_kb=2**64 - 1)) + "\n", "field 'vmrss_kb'"),
        13: (json.dumps(good(98, time="yesterday")) + "\n", "field 'time': not ISO-8601"),
        14: (header, "a run header that is not on the first line"),
        15: (json.dumps(good(97, extra=1)) + "\n", "field 'extra': not in the schema"),
    }
    for lineno in sorted(bad):
        lines.insert(lineno - 1, bad[lineno][0])
    lines.append(json.dumps(good(96))[:40])  # truncated last line
    path = tmp_path / "samples.ndjson"
    write_lines(path, lines)

    report = R.FileReport(str(path))
    batches = list(R.read_batches(path, report, both("idx"), batch=7))
    assert [c for _, c in batches] == [7, 7, 7, 7, 1]  # 29 good samples, batches of 7
    assert report.good == 29 and report.header == {"run_id": "r", "parameters": {"producers": 2}}
    got_bad = dict(report.bad)
    assert set(got_bad) == set(bad) | {len(lines)}
    for lineno, (_, why) in bad.items():
        assert got_bad[lineno].startswith(why), (lineno, got_bad[lineno])
    assert got_bad[len(lines)] == "truncated line"
    lp = b"".join(b for (b, _), _ in batches).decode().splitlines()
    assert lp == [sample_schema.to_line_protocol(docs[i]) for i in sorted(docs)]
    bulk = b"".join(b for (_, b), _ in batches).decode().splitlines()
    assert [json.loads(x) for x in bulk[0::2]] == [
        {
            "index": {
                "_index": daily_index("idx", sample_schema.time_ns(docs[i]["time"])),
                "_id": sample_schema.document_id(docs[i]),
            }
        }
        for i in sorted(docs)
    ]
    assert [json.loads(x) for x in bulk[1::2]] == [docs[i] for i in sorted(docs)]
    assert (report.first_time, report.last_time) == (docs[1]["time"], docs[29]["time"])
    assert report.nodes == {"n-1", "a b,c"} and report.bytes_read == path.stat().st_size


@pytest.mark.parametrize("where", ["line 2", "line 1 of a later part"])
def test_a_run_header_anywhere_but_the_files_first_line_is_refused(tmp_path, where):
    header = json.dumps({"flowstat_run": {"run_id": "r"}}) + "\n"
    path = tmp_path / "samples.ndjson"
    if where == "line 2":
        write_lines(path, [json.dumps(good(1)) + "\n", header, json.dumps(good(2)) + "\n"])
        span, lineno = None, 2
    else:  # a file read in parts (runfile.spans): the header of a part is not the file's
        first = json.dumps(good(1)) + "\n"
        write_lines(path, [first, header, json.dumps(good(2)) + "\n"])
        span, lineno = (len(first), path.stat().st_size), 1
    report = R.FileReport(str(path))
    got = list(runfile.samples(path, report, span))
    assert report.header is None and report.bad == [(lineno, "a run header that is not on the first line")]
    assert [doc["seq"] for doc, *_ in got] == ([1, 2] if span is None else [2])


def test_read_batches_rebases_time_for_both_stores(tmp_path):
    path = tmp_path / "samples.ndjson"
    write_lines(path, [json.dumps(good(i)) + "\n" for i in (1, 2, 3)])
    report = R.FileReport(str(path))
    start_ms = 1_900_000_000_000
    (((lp, bulk), n),) = R.read_batches(path, report, both("idx"), rebase_ms=start_ms)
    stamps = [int(x.rsplit(" ", 1)[1]) for x in lp.decode().splitlines()]
    first = sample_schema.time_ns(good(1)["time"])
    assert stamps == [start_ms * 10**6 + sample_schema.time_ns(good(i)["time"]) - first for i in (1, 2, 3)]
    docs = [json.loads(x) for x in bulk.decode().splitlines()[1::2]]
    assert [sample_schema.time_ns(d["time"]) for d in docs] == stamps
    assert (report.first_time, report.last_time) == (docs[0]["time"], docs[-1]["time"])


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_writer_process_names_a_store_that_cannot_be_reached(store):
    proc = WriterProcess(stores.get(store), "http://127.0.0.1:9", "flowstat", give_up_s=1.0)
    proc.put(b"flowstat_node,run_id=r seq=1i 1\n", 1)
    result = proc.close()
    name = "InfluxDB" if store == "influxdb" else "Elasticsearch"
    assert result["error"].startswith(f"{name} at http://127.0.0.1:9 cannot be reached (ConnectionError)")
    assert "gave up after 1 s" in result["error"]


def test_writer_process_that_died_is_a_clear_error():
    proc = WriterProcess(stores.get("influxdb"), "http://127.0.0.1:9", "flowstat")
    proc.proc.kill()
    proc.proc.wait()
    with pytest.raises(RuntimeError, match="the process writing to InfluxDB ended"):
        for _ in range(100):  # the pipe's buffer takes the first batches
            proc.put(b"x" * 100_000, 1)
    assert proc.close(abort=True) == {"error": "aborted"} and proc.proc.poll() is not None


def test_progress_counts_every_byte_of_the_file(tmp_path):
    """Also when the file ends on a batch boundary, or with bad lines after the last batch."""
    path = tmp_path / "samples.ndjson"
    write_lines(path, [json.dumps(good(i)) + "\n" for i in range(1, 11)] + ["{bad\n", "{bad\n"])
    counted = []
    # no store: the writing processes are not needed to read and count
    reports = R.replay([path], {}, batch=5, progress=counted.append)
    assert sum(counted) == path.stat().st_size and reports[0].good == 10 and len(reports[0].bad) == 2


def test_the_run_document_comes_from_run_json_and_keeps_what_is_good(tmp_path):
    path = tmp_path / "samples.ndjson"
    header = {
        "flowstat_run": {
            "run_id": "r",
            "host": "h",
            "parameters": {"producers": 2},
            "agent": "flowstat-agent-py",
            "interval_s": 1.0,
        }
    }
    write_lines(path, [json.dumps(header) + "\n"] + [json.dumps(good(i)) + "\n" for i in (1, 2, 3)])
    report = R.FileReport(str(path))
    list(R.read_batches(path, report, []))
    # no run.json: the header's run fields, completed from the samples
    doc = R.run_document(report)
    assert doc == {
        "run_id": "r",
        "host": "h",
        "parameters": {"producers": 2},
        "started": good(1)["time"],
        "finished": good(3)["time"],
        "nodes": ["n-1"],
        "samples": 3,
        "label": "r | recorded on h",
    }
    # a run.json with a field that does not conform: that field is named and left out
    (tmp_path / "run.json").write_text(
        json.dumps(
            {
                "run_id": "r",
                "started": "2026-11-22T10:00:00.000Z",
                "topology": "t.yaml",
                "parameters": {"producers": "two"},
                "verdict": {"ok": True, "conserved": True},
            }
        )
    )
    report.notes.clear()
    doc = R.run_document(report)
    assert doc["topology"] == "t.yaml" and doc["verdict"]["ok"] and "parameters" not in doc
    assert doc["started"] == "2026-11-22T10:00:00.000Z" and doc["samples"] == 3
    assert report.notes == [
        f"{tmp_path / 'run.json'}: parameters.producers: expected integer, got str 'two'; "
        f"left out of the run document"
    ]
    # a run.json of another run: not used
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "other", "started": "2026-11-22T10:00:00.000Z"}))
    report.notes.clear()
    assert R.run_document(report)["parameters"] == {"producers": 2}
    assert "run 'other', but the samples are of run 'r'" in report.notes[0]


def test_a_rebased_run_moves_its_run_document_with_its_samples(tmp_path):
    path = tmp_path / "samples.ndjson"
    write_lines(path, [json.dumps(good(i)) + "\n" for i in (1, 2, 3)])
    (tmp_path / "run.json").write_text(
        json.dumps({"run_id": "r", "started": good(1)["time"], "finished": good(3)["time"]})
    )
    report = R.FileReport(str(path))
    start_ms = 1_900_000_000_000
    list(R.read_batches(path, report, [], rebase_ms=start_ms))
    doc = R.run_document(report)
    assert sample_schema.time_ns(doc["started"]) == start_ms * 10**6 == sample_schema.time_ns(report.first_time)
    assert doc["finished"] == report.last_time


@pytest.mark.parametrize("content,note", [("[1, 2]", "not a run document"), ("{", "cannot be read")])
def test_a_run_json_that_is_no_run_document_is_named_and_the_run_file_used(tmp_path, content, note):
    path = tmp_path / "samples.ndjson"
    write_lines(path, [json.dumps(good(i)) + "\n" for i in (1, 2)])
    (tmp_path / "run.json").write_text(content)
    report = R.FileReport(str(path))
    list(R.read_batches(path, report, []))
    doc = R.run_document(report)
    assert doc["run_id"] == "r" and doc["started"] == good(1)["time"] and note in report.notes[0]


def test_samples_go_to_the_daily_index_of_their_own_utc_day_live_and_replayed(tmp_path):
    """The agents' sink (encode) and replay (its batch encoder) choose the same index for a sample:
    the UTC day of its own time, either side of midnight; run documents stay in one index."""
    stamps = ["2026-11-26T23:59:59.999Z", "2026-11-27T00:00:00.000Z", "2026-11-27T01:00:00.000+02:00"]
    docs = [
        {
            "time": t,
            "run_id": "r",
            "host": "h",
            "node_id": "n",
            "role": "merger",
            "agent": "a",
            "seq": i,
            "pid": 1,
            "node_state": "RUNNING",
        }
        for i, t in enumerate(stamps)
    ]
    want = ["idx-2026.11.26", "idx-2026.11.27", "idx-2026.11.26"]  # 01:00+02:00 is 23:00 UTC the day before
    live = ElasticsearchWriter("http://unused", "idx").encode(docs).decode().splitlines()[0::2]
    assert [json.loads(x)["index"]["_index"] for x in live] == want
    batch = (
        ElasticsearchWriter("http://unused", "idx")
        .encoder()
        .encode([b"{}"] * 3, ["a", "b", "c"], [sample_schema.time_ns(t) for t in stamps])
    )
    assert [json.loads(x)["index"]["_index"] for x in batch.decode().splitlines()[0::2]] == want
    run = ElasticsearchWriter("http://unused", "idx").encode_run({"run_id": "r", "started": stamps[0]})
    assert json.loads(run.splitlines()[0])["index"] == {"_index": "flowstat-runs", "_id": "r"}


def test_each_store_rolls_up_a_file_s_one_run_alone_and_a_file_of_several_whole():
    calls = []

    class Store:
        title = "store"

        def loaded(self, start_ns: int, end_ns: int, run_id: str | None = None) -> None:
            calls.append((start_ns, end_ns, run_id))

    t = "2026-11-29T00:00:00.000Z"
    one = runfile.FileReport("one", run_id="r", good=1, first_time=t, last_time=t, run_ids={"r"})
    two = runfile.FileReport("two", run_id="r", good=2, first_time=t, last_time=t, run_ids={"r", "s"})
    R._loaded([one, two], {"store": Store()})
    ns = sample_schema.time_ns(t)
    assert calls == [(ns, ns, "r"), (ns, ns, None)]


def test_a_long_refusal_keeps_what_was_refused_and_why():
    from flowstat.stores._base import shortened

    said = "error authorizing query: w on SELECT mean(*) INTO x FROM y WHERE " + "z" * 400 + ", requires READ on db"
    got = shortened(said)
    assert len(got) == 300 and got.startswith("error authorizing query: w on SELECT") and got.endswith("READ on db")
    assert shortened("short") == "short"
