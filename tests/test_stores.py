"""The store writers (flowstat.stores) against the real servers: the retry policy's cases, each
as the server really answers it. The agent's direct sinks and replay both write through them
(test_sinks_real_servers.py, test_ingest.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from flowstat import stores
from flowstat.schema import sample as sample_schema
from flowstat.stack.base import port_free
from flowstat.stores import RetryPolicy
from flowstat.stores.elasticsearch import ElasticsearchWriter, bulk_outcome, daily_index
from flowstat.stores.influxdb import InfluxDBWriter
from flowstat.timeutil import iso_utc_ms
from support.agents import wait_until

pytestmark = pytest.mark.integration


def samples(n: int, run_id: str, nodes: int = 10, later_s: float = 0.0) -> list[dict]:
    from flowstat.timeutil import iso_utc_ms

    t0 = time.time() - 3600 + later_s  # inside the raw retention policy
    return [
        {
            "time": iso_utc_ms(t0 + (i // nodes) * 0.01),
            "run_id": run_id,
            "host": "h",
            "node_id": f"n{i % nodes}",
            "role": "merger",
            "agent": "flowstat-agent-py",
            "seq": i // nodes,
            "pid": 100 + i % nodes,
            "node_state": "RUNNING",
            "vmrss_kb": 1000 + i,
            "cpu_clock_hz": 1.5 * i,
        }
        for i in range(n)
    ]


def influx_count(stack, db: str, run_id: str) -> int:
    body = stack["influxdb"].query(f'SELECT count("seq") FROM "flowstat_node" WHERE run_id = \'{run_id}\'', db)
    series = body["results"][0].get("series")
    return series[0]["values"][0][1] if series else 0


def es_count(stack, target: str) -> int:
    """Documents a writer to ``target`` stored: in the daily indices TARGET-YYYY.MM.DD."""
    index = f"{target}-*"
    es = stack["elasticsearch"].url
    requests.post(f"{es}/{index}/_refresh", timeout=30).raise_for_status()
    return requests.get(f"{es}/{index}/_count", timeout=30).json()["count"]


def test_every_store_is_registered_by_name():
    assert stores.names() == ["elasticsearch", "influxdb"]
    assert stores.get("influxdb") is InfluxDBWriter and stores.get("elasticsearch") is ElasticsearchWriter
    with pytest.raises(ValueError, match="unknown store 'mongodb' \\(known: elasticsearch, influxdb\\)"):
        stores.get("mongodb")


def test_influxdb_partial_write_keeps_the_good_points_and_names_the_rest(stack):
    influx = stack["influxdb"]
    db = f"w_{uuid.uuid4().hex[:8]}"
    influx.query(f'CREATE DATABASE "{db}"')
    writer = InfluxDBWriter(influx.url, db)
    batch = samples(50, "partial")
    assert writer.write(writer.encode(batch), 50).accepted == 50
    # the same series, later: vmrss_kb as a float conflicts with the integer field written above
    later = samples(50, "partial", later_s=60)
    conflict = writer.encode(later[:10]).replace(b"vmrss_kb=1000i", b"vmrss_kb=1.5") + writer.encode(later[10:])
    assert conflict.count(b"vmrss_kb=1.5") == 1
    out = writer.write(conflict, 50)
    assert (out.accepted, out.refused, out.retry) == (49, 1, None)
    assert "partial write" in out.reasons[0] and "field type conflict" in out.reasons[0]
    assert writer.retries == 0  # refused data is never resent
    assert influx_count(stack, db, "partial") == 99
    # a line that does not parse among good ones: the good ones are stored, that one is refused
    garbage = writer.encode(samples(5, "parse")) + b"this is not line protocol\n"
    out = writer.write(garbage, 6)
    assert (out.accepted, out.refused) == (5, 1) and "unable to parse" in out.reasons[0]
    assert influx_count(stack, db, "parse") == 5
    # a database that does not exist: everything refused, nothing retried
    out = InfluxDBWriter(influx.url, f"missing_{uuid.uuid4().hex[:6]}").write(writer.encode(batch[:3]), 3)
    assert (out.accepted, out.refused) == (0, 3) and "HTTP 404" in out.reasons[0]


def test_elasticsearch_bulk_with_per_document_errors(stack):
    es = stack["elasticsearch"]
    index = f"flowstat-samples-w-{uuid.uuid4().hex[:8]}"  # gets the strict sample template
    writer = ElasticsearchWriter(es.url, index)
    batch = samples(20, "bulk")
    body = writer.encode(batch).splitlines(keepends=True)
    body[3] = body[3].replace(b'"vmrss_kb":1001', b'"vmrss_kb":"a lot"')  # document 1: wrong type
    body[9] = body[9].replace(b'{"time"', b'{"colour":"red","time"')  # document 4: outside the schema
    out = writer.write(b"".join(body), 20)
    assert (out.accepted, out.refused, out.retry) == (18, 2, None) and writer.retries == 0
    ids = [sample_schema.document_id(batch[i]) for i in (1, 4)]
    assert [r.split(":")[0] for r in out.reasons] == [f"document {i}" for i in ids]
    assert "failed to parse field [vmrss_kb]" in out.reasons[0]
    assert "strict_dynamic_mapping_exception" in out.reasons[1] and "[colour]" in out.reasons[1]
    assert es_count(stack, index) == 18


def test_install_gives_an_older_index_the_new_fields_and_names_one_it_cannot(own_stack):
    """An index made by an older flowstat (its mapping lacks a field this version writes) takes the
    field at install; an index whose field has another type is named, and install says what to do."""
    es = own_stack["elasticsearch"].url
    tag = uuid.uuid4().hex[:8]
    older, clashing = f"flowstat-samples-older-{tag}", f"flowstat-samples-clash-{tag}"
    writer = ElasticsearchWriter(es, older)
    current = requests.get(f"{es}/_component_template/flowstat-sample-mappings", timeout=30).json()
    props = dict(current["component_templates"][0]["component_template"]["template"]["mappings"]["properties"])
    assert props.pop("input_latency_p50_ms")
    try:
        requests.delete(f"{es}/_index_template/flowstat-samples", timeout=30).raise_for_status()
        doc = {**samples(1, "older")[0], "input_latency_p50_ms": 1.5}
        made = daily_index(older, sample_schema.time_ns(doc["time"]))  # the day its sample goes to
        requests.put(
            f"{es}/{made}", json={"mappings": {"dynamic": "strict", "properties": props}}, timeout=30
        ).raise_for_status()  # as an older version made it
        assert writer.write(writer.encode([doc]), 1).refused == 1  # strict: the field is unknown
        assert "flowstat-samples*/_mapping" in writer.install()
        got = requests.get(f"{es}/{made}/_mapping", timeout=30).json()[made]["mappings"]["properties"]
        assert got["input_latency_p50_ms"] == {"type": "double"}
        assert writer.write(writer.encode([doc]), 1).accepted == 1
        # a field of another type, as an index created with its own mapping could have it
        requests.put(
            f"{es}/{clashing}", json={"mappings": {"properties": {"vmrss_kb": {"type": "keyword"}}}}, timeout=30
        ).raise_for_status()
        with pytest.raises(
            RuntimeError,
            match=r"elasticsearch flowstat-samples\*: an existing index's mapping "
            r"cannot take this version's fields .*vmrss_kb.*reindex or delete",
        ):
            writer.install()
    finally:
        for index in (f"{older}-*", clashing):
            requests.delete(f"{es}/{index}", timeout=30)
        writer.install()
        writer.close()


def test_bulk_documents_refused_for_now_are_the_only_ones_resent():
    """The part of the policy a real server only shows under overload (429 per document), on the
    answer's documented shape."""
    writer = ElasticsearchWriter("http://unused", "idx")
    answer = {
        "errors": True,
        "items": [
            {"index": {"_id": "a", "status": 201}},
            {
                "index": {
                    "_id": "b",
                    "status": 429,
                    "error": {"type": "es_rejected_execution_exception", "reason": "busy"},
                }
            },
            {"index": {"_id": "c", "status": 400, "error": {"type": "mapper_parsing_exception", "reason": "bad"}}},
            {"index": {"_id": "d", "status": 503, "error": {"type": "unavailable_shards_exception", "reason": "x"}}},
            {"index": {"_id": "e", "status": 408, "error": {"type": "timeout", "reason": "y"}}},
            {"index": {"_id": "f"}},
        ],
    }  # no status: not known to be stored
    body = writer.encode(samples(6, "r"))
    out = bulk_outcome(body, answer)
    lines = body.splitlines(keepends=True)
    assert (out.accepted, out.refused, out.retry_count) == (1, 2, 3)
    assert out.retry == lines[2] + lines[3] + lines[6] + lines[7] + lines[10] + lines[11]
    assert out.reasons == ["document c: HTTP 400: mapper_parsing_exception: bad", "document e: HTTP 408: timeout: y"]


@pytest.mark.parametrize("store", ["influxdb", "elasticsearch"])
def test_a_server_killed_mid_batch_loses_and_duplicates_nothing(own_stack, store):
    """The server dies (SIGKILL) while a large batch is on its way; the writer retries until the
    restarted server takes it: every sample once."""
    stack = own_stack
    service = stack[store]
    run_id = f"killed-{store}"
    batch = samples(100_000 if store == "influxdb" else 30_000, run_id, nodes=50)
    if store == "influxdb":
        writer, count = InfluxDBWriter(service.url, "flowstat"), lambda: influx_count(stack, "flowstat", run_id)
    else:
        index = f"flowstat-samples-k-{uuid.uuid4().hex[:8]}"
        writer, count = ElasticsearchWriter(service.url, index), lambda: es_count(stack, index)
    body = writer.encode(batch)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(out=writer.write(body, len(batch), RetryPolicy(give_up_s=180)))
    )
    thread.start()
    group = service.pid()
    killed = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout.split()
    try:
        while writer.requests == 0:
            time.sleep(0.001)  # the first request has started: kill the server under it
        os.killpg(group, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while service.pid() is not None or not all(port_free(p) for p in service.ports()):
            assert time.monotonic() < deadline, f"{store} still holds its ports 30 s after SIGKILL"
            time.sleep(0.05)  # the JVM's last threads take a moment to go
    finally:
        for pid in killed:  # the socket Elasticsearch opens to attach to itself: only a clean exit removes it
            Path(f"/tmp/.java_pid{pid}").unlink(missing_ok=True)
        service.up()
    thread.join(240)
    out = result["out"]
    assert writer.retries >= 1  # the first attempt failed with the server
    assert (out.accepted, out.refused) == (len(batch), 0)
    assert count() == len(batch)


def test_an_older_flowstat_s_single_index_is_moved_into_daily_indices_and_resends_stay_single(own_stack):
    """flowstat before daily indices wrote every sample into flowstat-samples: install moves them
    into the daily index of each one's own day under the same id, deletes the old index, and a
    sample resent afterwards overwrites its moved copy. (On a stack of its own: an install elsewhere,
    a `flowstat stack up` of the session's, would move them first.)"""
    es = own_stack["elasticsearch"].url
    run_id = f"legacy-{uuid.uuid4().hex[:8]}"
    docs = samples(40, run_id)
    for i, d in enumerate(docs):  # two days: the older half a day and more earlier
        if i % 2:
            d["time"] = iso_utc_ms(sample_schema.time_ns(d["time"]) / 1e9 - 36 * 3600)
    writer = ElasticsearchWriter(es)
    old_way = b"".join(
        b'{"index":{"_index":"flowstat-samples","_id":'
        + json.dumps(sample_schema.document_id(d)).encode()
        + b"}}\n"
        + sample_schema.to_json(d).encode()
        + b"\n"
        for d in docs
    )
    try:
        assert writer.write(old_way, len(docs)).accepted == len(docs)
        requests.post(f"{es}/flowstat-samples/_refresh", timeout=30).raise_for_status()
        done = writer.install()
        assert f"flowstat-samples: {len(docs)} documents moved to daily indices flowstat-samples-YYYY.MM.DD" in done
        assert requests.get(f"{es}/flowstat-samples", timeout=30).status_code == 404  # the old index is gone
        days = {daily_index("flowstat-samples", sample_schema.time_ns(d["time"])) for d in docs}
        counts = {
            day: requests.get(f"{es}/{day}/_count", params={"q": f"run_id:{run_id}"}, timeout=30).json()["count"]
            for day in days
        }
        assert len(days) == 2 and sum(counts.values()) == len(docs) and all(counts.values())
        assert writer.write(writer.encode(docs[:10]), 10).accepted == 10  # resent: each overwrites its copy
        requests.post(f"{es}/flowstat-samples*/_refresh", timeout=30).raise_for_status()
        assert requests.get(f"{es}/flowstat-samples*/_count", params={"q": f"run_id:{run_id}"}, timeout=30).json()[
            "count"
        ] == len(docs)
        assert not [line for line in writer.install() if "moved" in line]  # nothing left to move
    finally:
        requests.delete(f"{es}/flowstat-samples", timeout=30)
        writer.close()


def test_influxdb_refuses_samples_older_than_its_retention_policy_and_says_so(stack):
    """Retention on the server where it runs: a sample older than the raw policy's 30 days is
    refused, by name, and the recent one beside it stored."""
    run_id = f"retention-{uuid.uuid4().hex[:8]}"
    old, recent = samples(2, run_id, nodes=2)
    old["time"] = iso_utc_ms(time.time() - 31 * 86400)
    writer = InfluxDBWriter(stack["influxdb"].url, "flowstat")
    try:
        out = writer.write(writer.encode([old, recent]), 2)
    finally:
        writer.close()
    assert (out.accepted, out.refused) == (1, 1) and "points beyond retention policy dropped=1" in out.reasons[0]
    assert influx_count(stack, "flowstat", run_id) == 1


def test_influxdb_deletes_what_a_retention_policy_no_longer_keeps(stack):
    """The mechanism flowstat's raw (30 days) and rollup (2 years) policies rely on, on the real
    server: points older than a policy's duration are deleted (whole shard groups), the recent
    ones kept. A policy of hours, shortened after the writes, stands in for a month passing."""
    influx = stack["influxdb"]
    db = f"retention_{uuid.uuid4().hex[:8]}"
    influx.query(f'CREATE DATABASE "{db}" WITH DURATION 6h SHARD DURATION 1h NAME "short"')
    try:
        old, recent = samples(2, "retention", nodes=2)
        old["time"] = iso_utc_ms(time.time() - 4 * 3600)  # its shard group ends 3 h ago at the latest
        recent["time"] = iso_utc_ms(time.time() - 60)
        writer = InfluxDBWriter(influx.url, db)
        try:
            assert writer.write(writer.encode([old, recent]), 2).accepted == 2
        finally:
            writer.close()
        count = lambda: len(
            influx.query('SELECT "seq" FROM "flowstat_node"', db)["results"][0].get("series", [{}])[0].get("values", [])
        )
        assert count() == 2
        influx.query(f'ALTER RETENTION POLICY "short" ON "{db}" DURATION 2h SHARD DURATION 1h')
        wait_until(lambda: count() == 1, "InfluxDB's retention check to delete the old point", timeout=60)
    finally:
        influx.query(f'DROP DATABASE "{db}"')
