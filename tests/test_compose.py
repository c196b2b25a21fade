"""docker-compose.yml, checked without a Docker engine: validated by Debian's docker-compose,
checked structurally, and its init steps run against the real local servers."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid

import pytest
import requests
import yaml

from conftest import ROOT


COMPOSE = ROOT / "docker-compose.yml"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="make test installs docker-compose")
def test_compose_file_is_valid():
    out = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_every_mounted_file_exists_and_is_read_only():
    for name, svc in compose()["services"].items():
        for volume in svc.get("volumes", []):
            source, target, *mode = volume.split(":")
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} is missing"
                assert mode == ["ro"], f"{name}: {source} should be mounted read-only"


def test_ports_are_published_on_loopback_only():
    for name, svc in compose()["services"].items():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port} is published beyond this machine"


def test_healthy_dependencies_have_healthchecks():
    services = compose()["services"]
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            if cond.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"


def test_versions_come_from_env_and_no_passwords_are_shipped():
    env = dict(line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines()
               if line and not line.startswith("#"))
    for name, svc in compose()["services"].items():
        image = svc["image"]
        tag = re.search(r":\$\{(\w+)\}$", image)
        assert tag and tag.group(1) in env, f"{name}: image {image} is not pinned through .env"
    text = COMPOSE.read_text().lower() + (ROOT / ".env").read_text().lower()
    assert not re.search(r"password\s*[:=]\s*\S", text)


def test_pinned_versions_agree_with_the_local_stack():
    """The compose stack and flowstat stack run the same versions (.env, and the package's pins)."""
    from flowstat.stack.elasticsearch import ES_VERSION
    from flowstat.stack.telegraf import VERSION as TELEGRAF_VERSION

    env = dict(line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines()
               if line and not line.startswith("#"))
    assert env["TELEGRAF_VERSION"] == TELEGRAF_VERSION.lstrip("v")
    assert env["ELASTIC_VERSION"] == ES_VERSION


def test_elasticsearch_install_script_installs_the_templates(stack):
    es = stack["elasticsearch"]
    # the stack installed them already, through the writer: what the script installs must show
    requests.delete(f"{es.url}/_index_template/flowstat-agents", timeout=10).raise_for_status()
    requests.delete(f"{es.url}/_component_template/flowstat-agent-mappings", timeout=10).raise_for_status()
    # an index of self-samples as an older flowstat made it: without interval_s
    older = f"flowstat-agents-older-{uuid.uuid4().hex[:8]}"
    requests.put(f"{es.url}/{older}", json={"mappings": {"dynamic": "strict", "properties": {
        "time": {"type": "date"}, "agent": {"type": "keyword"}}}}, timeout=10).raise_for_status()
    try:
        for _ in range(2):  # idempotent
            out = subprocess.run(["sh", str(ROOT / "index-templates" / "elasticsearch" / "install.sh")],
                                 env={"ES_URL": es.url, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            assert "installed flowstat-agents*/_mapping" in out.stdout
        got = requests.get(f"{es.url}/{older}/_mapping", timeout=10).json()[older]["mappings"]["properties"]
        assert got["interval_s"] == {"type": "double"} and got["spooled_samples"] == {"type": "long"}
    finally:
        requests.delete(f"{es.url}/{older}", timeout=10)
    for name in ("flowstat-samples", "flowstat-agents", "flowstat-runs"):
        assert requests.get(f"{es.url}/_index_template/{name}", timeout=10).status_code == 200
    mapping = requests.get(f"{es.url}/_component_template/flowstat-sample-mappings", timeout=10).json()
    props = mapping["component_templates"][0]["component_template"]["template"]["mappings"]["properties"]
    assert props["vmrss_kb"]["type"] == "long" and props["send_buffer_overloaded"]["type"] == "boolean"
    mapping = requests.get(f"{es.url}/_component_template/flowstat-agent-mappings", timeout=10).json()
    props = mapping["component_templates"][0]["component_template"]["template"]["mappings"]["properties"]
    assert props["spooled_samples"]["type"] == "long" and props["interval_s"]["type"] == "double"


def test_influxdb_init_file_runs_as_the_container_runs_it(stack):  # the stack installs the influx CLI
    influx = stack["influxdb"]
    db = f"compose_{uuid.uuid4().hex[:8]}"
    text = (ROOT / "index-templates" / "influxdb" / "setup.iql").read_text().replace('"flowstat"', f'"{db}"')
    text = text.rstrip("\n")  # the image's init runs: influx ... -execute "$(cat FILE)", which drops trailing newlines
    out = subprocess.run(["influx", "-host", "127.0.0.1", "-port", str(influx.port), "-execute", text],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    rps = influx.query(f'SHOW RETENTION POLICIES ON "{db}"')["results"][0]["series"][0]["values"]
    assert {r[0]: r[-1] for r in rps} == {"autogen": False, "raw": True, "rollup": False}
    cqs = [row[0] for s in influx.query("SHOW CONTINUOUS QUERIES")["results"][0]["series"] if s["name"] == db
           for row in s.get("values", [])]
    assert len(cqs) == 4
