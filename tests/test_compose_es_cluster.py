"""docker-compose.es-cluster.yml, Elasticsearch as three nodes over docker-compose.yml, checked
without a Docker engine: the two files merged by Debian's docker-compose (what `docker compose -f
docker-compose.yml -f docker-compose.es-cluster.yml` runs), checked structurally, and the
certificate service's script run with the local Elasticsearch's certutil."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath

import pytest
import yaml

from support.common import ROOT

BASE = ROOT / "docker-compose.yml"
CLUSTER = ROOT / "docker-compose.es-cluster.yml"
NODES = ("elasticsearch", "elasticsearch-2", "elasticsearch-3")
ES_HOME = PurePosixPath("/usr/share/elasticsearch")  # the image's working directory
ES_CONFIG = ES_HOME / "config"  # relative paths in Elasticsearch's settings start here
ES_DATA = ES_HOME / "data"

needs_compose = pytest.mark.skipif(not shutil.which("docker-compose"), reason="make test installs docker-compose")


def project(tmp: Path) -> Path:
    """A project folder holding .env as a user makes it from .env.example: every value kept, and
    the empty ones (secrets to fill in) given one."""
    lines = []
    for line in (ROOT / ".env.example").read_text().splitlines():
        key, eq, value = line.partition("=")
        if eq and not line.lstrip().startswith("#") and not value.strip():
            line = f"{key}=test-{key.lower().replace('_', '-')}-0123456789abcdef0123456789abcdef"
        lines.append(line)
    (tmp / ".env").write_text("\n".join(lines) + "\n")
    return tmp


def compose_config(tmp: Path, *files: Path, quiet: bool = False) -> subprocess.CompletedProcess:
    args = ["docker-compose", "--project-directory", str(tmp)]
    for f in files:
        args += ["-f", str(f)]
    # no variable from this shell: compose must take everything from the project's .env
    return subprocess.run(
        [*args, "config", *(["-q"] if quiet else [])], capture_output=True, text=True, env={"PATH": os.environ["PATH"]}
    )


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, dict]:
    if not shutil.which("docker-compose"):
        pytest.skip("make test installs docker-compose")
    tmp = project(tmp_path_factory.mktemp("compose-es-cluster"))
    out = {}
    for name, files in (("base", (BASE,)), ("merged", (BASE, CLUSTER))):
        done = compose_config(tmp, *files)
        assert done.returncode == 0, done.stderr
        out[name] = yaml.safe_load(done.stdout)
    return out


@pytest.fixture(scope="module")
def merged(configs) -> dict:
    return configs["merged"]


def es_nodes(config: dict) -> dict[str, dict]:
    """The services that run an Elasticsearch node: the Elasticsearch image with a node name."""
    return {
        name: svc
        for name, svc in config["services"].items()
        if "/elasticsearch/elasticsearch:" in svc.get("image", "") and "node.name" in svc.get("environment", {})
    }


def env_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def mounts(svc: dict) -> dict[PurePosixPath, tuple[str, str]]:
    """target -> (source, mode), from compose's short syntax as `config` writes it."""
    out = {}
    for volume in svc.get("volumes", []):
        source, target, *mode = volume.split(":")
        out[PurePosixPath(target)] = (source, mode[0] if mode else "rw")
    return out


def certs_script(merged: dict) -> str:
    """The es-certs service's shell script as the container runs it (compose writes $ as $$)."""
    command = merged["services"]["es-certs"]["command"]
    assert len(command) == 1, "es-certs: the script is bash -c's one argument"
    return command[0].replace("$$", "$")


def certs_volume(merged: dict) -> tuple[str, PurePosixPath]:
    """The named volume es-certs writes its certificates into, and where it mounts it."""
    svc = merged["services"]["es-certs"]
    written = PurePosixPath(svc["working_dir"]) / re.search(r"^certs=(\S+)$", certs_script(merged), re.M).group(1)
    source, mode = mounts(svc).get(written, (None, None))
    assert (
        mode == "rw" and source in merged["volumes"]
    ), f"es-certs writes {written}: no named volume is mounted there, writable"
    return source, written


def size_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)\s*([kmgt]?)b?", str(text).strip().lower()).groups()
    return int(number) * 1024 ** " kmgt".index(unit or " ")


@needs_compose
def test_the_two_files_are_valid_together(tmp_path):
    done = compose_config(project(tmp_path), BASE, CLUSTER, quiet=True)
    assert done.returncode == 0, done.stderr


def test_three_master_eligible_data_nodes_bootstrap_one_cluster(merged):
    nodes = es_nodes(merged)
    assert sorted(nodes) == sorted(NODES)
    for name, svc in nodes.items():
        env = svc["environment"]
        assert env["node.name"] == name, f"{name}: node.name must be the service's name (its host name)"
        # docker-compose.yml's single-node cannot be deleted by an override, only replaced
        assert env["discovery.type"] == "multi-node", f"{name}: discovery.type is {env['discovery.type']}"
        roles = env_list(env.get("node.roles", "master,data"))  # unset: every role
        assert "master" in roles and "data" in roles, f"{name}: node.roles {roles}"
        assert env["cluster.name"] == merged["services"]["elasticsearch"]["environment"]["cluster.name"]
        assert sorted(env_list(env["cluster.initial_master_nodes"])) == sorted(NODES), name


def test_each_node_seeds_discovery_with_the_other_two(merged):
    for name, svc in es_nodes(merged).items():
        seeds = env_list(svc["environment"]["discovery.seed_hosts"])
        assert sorted(seeds) == sorted(set(NODES) - {name}), f"{name}: discovery.seed_hosts {seeds}"


def test_every_node_has_the_same_security_and_transport_tls_on(merged):
    password = {svc["environment"]["ELASTIC_PASSWORD"] for svc in es_nodes(merged).values()}
    assert len(password) == 1, "every node needs the same bootstrap password for `elastic`"
    for name, svc in es_nodes(merged).items():
        env = svc["environment"]
        assert env["xpack.security.enabled"] == "true", name
        assert env["xpack.security.http.ssl.enabled"] == "false", f"{name}: HTTP stays plain, as in docker-compose.yml"
        assert env["xpack.security.transport.ssl.enabled"] == "true", f"{name}: a secured multi-node cluster needs it"
        assert env["xpack.security.transport.ssl.verification_mode"] in ("certificate", "full"), name
        for key in ("key", "certificate", "certificate_authorities"):
            assert env.get(f"xpack.security.transport.ssl.{key}"), f"{name}: xpack.security.transport.ssl.{key} unset"


def test_the_certificates_each_node_reads_are_in_the_volume_es_certs_fills(merged):
    volume, written = certs_volume(merged)
    script = certs_script(merged)
    made = re.search(r'^nodes="([^"]*)"$', script, re.M).group(1).split()
    assert sorted(made) == sorted(NODES), f"es-certs makes certificates for {made}"
    assert re.search(r'printf .*name: %s.*"\$n"', script), "instances.yml names the nodes by the same list"
    for name, svc in es_nodes(merged).items():
        env = svc["environment"]
        source, mode = mounts(svc).get(written, (None, None))
        assert source == volume and mode == "ro", f"{name}: {volume} mounted read-only at {written}"
        expected = {
            "key": f"{name}/{name}.key",
            "certificate": f"{name}/{name}.crt",
            "certificate_authorities": "ca/ca.crt",
        }
        for key, inside in expected.items():
            path = ES_CONFIG / env[f"xpack.security.transport.ssl.{key}"]
            assert path == written / inside, f"{name}: {key} is {path}; certutil writes {written / inside}"


def test_every_node_waits_for_the_certificates(merged):
    assert merged["services"]["es-certs"]["restart"] == "no"
    for name, svc in es_nodes(merged).items():
        cond = (svc.get("depends_on") or {}).get("es-certs", {}).get("condition")
        assert cond == "service_completed_successfully", f"{name}: depends on es-certs with {cond}"


def test_no_port_is_published_beyond_the_base_files(configs):
    base, merged = configs["base"]["services"], configs["merged"]["services"]
    for name, svc in merged.items():
        assert sorted(svc.get("ports", [])) == sorted(
            base.get(name, {}).get("ports", [])
        ), f"{name}: {svc.get('ports')}"
    assert merged["elasticsearch"]["ports"], "clients reach the cluster through elasticsearch's published port"


def test_each_node_has_a_data_volume_of_its_own(configs):
    single = mounts(configs["base"]["services"]["elasticsearch"])[ES_DATA][0]
    data = {name: mounts(svc).get(ES_DATA, (None,))[0] for name, svc in es_nodes(configs["merged"]).items()}
    assert all(v in configs["merged"]["volumes"] for v in data.values()), f"data volumes: {data}"
    assert len(set(data.values())) == len(NODES), f"nodes share a data volume: {data}"
    # the single node's data belongs to a one-node cluster, which these nodes must not start from
    assert single not in data.values(), f"a cluster node uses the single node's {single}"


def test_every_node_has_the_heap_and_memory_limit_of_the_single_node(configs):
    single = configs["base"]["services"]["elasticsearch"]
    for name, svc in es_nodes(configs["merged"]).items():
        heap = svc["environment"]["ES_JAVA_OPTS"]
        assert heap == single["environment"]["ES_JAVA_OPTS"], name
        xms, xmx = (re.search(rf"-{flag}(\d+[kmgt]?)\b", heap, re.I) for flag in ("Xms", "Xmx"))
        assert xms and xmx and xms.group(1) == xmx.group(1), f"{name}: ES_JAVA_OPTS {heap!r}: -Xms and -Xmx, equal"
        assert svc.get("mem_limit") == single["mem_limit"], f"{name}: mem_limit {svc.get('mem_limit')}"
        assert 2 * size_bytes(xmx.group(1)) <= size_bytes(
            svc["mem_limit"]
        ), f"{name}: heap {xmx.group(1)} over half of mem_limit {svc['mem_limit']} (Lucene needs the rest)"


def test_dependencies_on_healthy_services_still_have_healthchecks(merged):
    services = merged["services"]
    for name in NODES:
        assert "healthcheck" in services[name], name
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            if cond.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"


def _local_es() -> tuple[Path, str] | None:
    """The Elasticsearch distribution make test installs (its certutil is the image's), and a Java."""
    from flowstat.stack.elasticsearch import ES_VERSION, JAVA_HOMES

    dist = ROOT / ".cache" / "test-stack" / "elasticsearch" / f"elasticsearch-{ES_VERSION}"
    java = next(
        (h for h in (os.environ.get("ES_JAVA_HOME"), *JAVA_HOMES) if h and Path(h, "bin", "java").exists()), None
    )
    return (dist, java) if (dist / "bin" / "elasticsearch-certutil").exists() and java else None


@pytest.mark.skipif(os.geteuid() != 0, reason="the script gives the files to uid 1000, as root in the container")
def test_the_certificate_script_makes_what_the_nodes_read_once(merged, tmp_path):
    local = _local_es()
    if local is None:
        pytest.skip("no local Elasticsearch (make test installs it into .cache/test-stack)")
    dist, java = local
    _, written = certs_volume(merged)
    home = tmp_path / "es"  # stands for the image's /usr/share/elasticsearch
    (home / written.relative_to(ES_HOME)).mkdir(parents=True)
    for part in ("bin", "lib", "modules"):
        (home / part).symlink_to(dist / part)
    certs = home / written.relative_to(ES_HOME)

    def run() -> str:
        done = subprocess.run(
            ["bash", "-c", certs_script(merged)],
            cwd=home,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "ES_JAVA_HOME": java},
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    first = run()
    assert "making a certificate authority" in first
    for name, svc in es_nodes(merged).items():
        files = [
            certs
            / PurePosixPath(ES_CONFIG / svc["environment"][f"xpack.security.transport.ssl.{key}"]).relative_to(written)
            for key in ("key", "certificate", "certificate_authorities")
        ]
        for f in files:
            assert f.is_file() and f.stat().st_size > 0, f"{name}: es-certs did not make {f.relative_to(certs)}"
            assert (f.stat().st_uid, f.stat().st_mode & 0o777) == (1000, 0o640), f"{f}: the node (uid 1000) reads it"
        if shutil.which("openssl"):
            _, crt, ca = files
            check = subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(crt)], capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
            san = subprocess.run(
                ["openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"], capture_output=True, text=True
            ).stdout
            assert f"DNS:{name}," in san or san.rstrip().endswith(f"DNS:{name}"), f"{name}: {san}"
    ca_key = certs / "ca" / "ca.key"
    assert (ca_key.stat().st_uid, ca_key.stat().st_mode & 0o777) == (0, 0o600), "the CA's key stays root's"

    made = {p: p.read_bytes() for p in certs.rglob("*") if p.is_file()}
    assert "already" in run(), "a second run makes nothing"
    assert {p: p.read_bytes() for p in certs.rglob("*") if p.is_file()} == made

    # a node's certificate gone: made again, signed by the same CA
    shutil.rmtree(certs / NODES[1])
    again = run()
    assert "certificate authority" not in again and "making the certificates" in again
    assert (certs / "ca" / "ca.crt").read_bytes() == made[certs / "ca" / "ca.crt"]
    assert (certs / NODES[1] / f"{NODES[1]}.crt").is_file()


def test_the_stacks_long_running_clients_are_given_every_node(merged):
    """Kibana, Logstash, ElastAlert2, the rollup and the verdict service go on when a node is lost:
    each is given all three, in the form it reads (Kibana a JSON list, Logstash whitespace-separated
    URLs that its pipeline's `hosts` expands, ElastAlert2 HOST:PORT,HOST:PORT, flowstat's own
    clients one --es URL of every node); Grafana's data source takes one URL."""
    from urllib.parse import urlsplit

    from flowstat.stores._base import parse_nodes

    services = merged["services"]
    urls = [f"http://{n}:9200" for n in NODES]
    assert json.loads(services["kibana"]["environment"]["ELASTICSEARCH_HOSTS"]) == urls
    assert services["logstash"]["environment"]["ELASTICSEARCH_URL"].split() == urls
    assert 'hosts => ["${ELASTICSEARCH_URL}"]' in (ROOT / "pipelines/logstash/pipeline/flowstat.conf").read_text()
    assert env_list(services["elastalert"]["environment"]["ES_HOSTS"]) == [f"{n}:9200" for n in NODES]
    for name in ("rollup", "verdict"):
        command = services[name]["command"]
        es = command[command.index("--es") + 1]
        assert parse_nodes(es, urlsplit(es).netloc, 9200) == [f"{n}:9200" for n in NODES], name
        # and the rest of the command is the single node's: only the list of nodes differs
        assert command[: command.index("--es")] == [name] and "--status" in command, name
