"""flowstat campaign --replay: every run of the campaign in both real stores, with its run document."""

from __future__ import annotations

import socket
import subprocess
import sys

import requests
import yaml

from support.runs import small


def test_replay_loads_every_run_of_the_campaign(stack, tmp_path):
    path, out = tmp_path / "c.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(small(campaign="replayed")))
    es, influx = stack["elasticsearch"].url, stack["influxdb"].url
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "campaign",
            str(path),
            "--duration",
            "3",
            "--out",
            str(out),
            "--quiet",
            "--replay",
            "--influx",
            influx,
            "--es",
            es,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "campaign: 2 runs loaded into elasticsearch, influxdb" in result.stdout
    requests.post(f"{es}/flowstat-samples*/_refresh", timeout=30)
    for size in (10, 100):
        run_id = f"replayed-buffer-size-{size}"
        recorded = sum(
            1 for line in (out / "runs" / run_id / "samples.ndjson").read_text().splitlines()[1:] if '"node_id"' in line
        )
        n_es = requests.post(
            f"{es}/flowstat-samples*/_count", json={"query": {"term": {"run_id": run_id}}}, timeout=30
        ).json()["count"]
        body = stack["influxdb"].query(
            f'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_id}\'', "flowstat"
        )
        n_influx = body["results"][0]["series"][0]["values"][0][1]
        assert recorded > 0 and n_es == n_influx == recorded, (run_id, recorded, n_es, n_influx)
        doc = requests.get(f"{es}/flowstat-runs/_doc/{run_id}", timeout=10).json()["_source"]
        assert doc["parameters"]["buffer_size"] == size and doc["verdict"]["ok"] is True


def test_replay_to_a_store_that_is_down_runs_nothing(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    path, out = tmp_path / "c.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(small()))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "campaign",
            str(path),
            "--out",
            str(out),
            "--replay",
            "--influx",
            f"http://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and f"127.0.0.1:{port}" in result.stderr and "nothing was run" in result.stderr
    assert not (out / "runs").exists()
