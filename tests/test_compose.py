"""docker-compose.yml, checked without a Docker engine: validated by Debian's docker-compose with
.env.example as .env, then checked for what the validator does not check (healthchecks, mounts,
secrets, ports, pins, credentials), and against the files and code it must agree with.

What the setup service does is run against the real local servers in test_provision.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from support.common import ROOT

COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
VARIABLE = re.compile(r"\$\{(\w+)(:?[?-])?([^}]*)\}")
# Not secrets, with a default where .env does not say: where the ports are published.
OPTIONAL = {
    "BIND_ADDRESS",
    "CLI_JAVA_OPTS",
    "ALERT_WEBHOOK_URL",
    "ALERT_EMAIL_TO",
    "SMTP_HOST",
    "SMTP_PORT",
    "SMTP_USER",
    "SMTP_PASSWORD",
    "SMTP_FROM",
    "SMTP_STARTTLS",
}  # the alert inbox forwards to those that are set
STORES = {"elasticsearch:9200": "Elasticsearch", "influxdb:8086": "InfluxDB"}

needs_compose = pytest.mark.skipif(
    not shutil.which("docker-compose") and not os.environ.get("CI"),
    reason="make test installs docker-compose (Debian's)",
)


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def env_example() -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line.strip() and not line.startswith("#")
    )


def secrets() -> set[str]:
    """The secrets every stack needs (an SMTP password is only needed by those who send e-mail)."""
    return {name for name in env_example() if name.endswith(("_PASSWORD", "_KEY")) and name not in OPTIONAL}


def environment(svc: dict) -> dict[str, str]:
    env = svc.get("environment") or {}
    return dict(x.split("=", 1) for x in env) if isinstance(env, list) else {k: str(v) for k, v in env.items()}


def stores_reached(svc: dict) -> list[str]:
    """The stores a service talks to, by their addresses in its environment and command."""
    env = environment(svc)
    talks = " ".join([*env.values(), *map(str, svc.get("command") or [])])
    return [
        store for address, store in STORES.items() if address in talks or env.get("ES_HOST") == address.split(":")[0]
    ]


def bind_mounts(svc: dict) -> dict[str, str]:
    """A service's mounts from the repository: source -> target in the container."""
    return dict(v.rsplit(":", 1)[0].split(":") for v in svc.get("volumes", []) if v.startswith("./"))


def long_running(svc: dict) -> bool:
    return svc.get("restart") == "unless-stopped"


def run_compose(*args: str, env_file: Path, files=(COMPOSE,)) -> subprocess.CompletedProcess:
    # --env-file instead of .env: the project directory (and so every relative mount) stays ROOT.
    cmd = ["docker-compose", "--env-file", str(env_file)]
    for f in files:
        cmd += ["-f", str(f)]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, cwd=ROOT, env={"PATH": os.environ["PATH"]}
    )  # nothing of this shell's environment leaks in


# -- the validator ------------------------------------------------------------------------------
@needs_compose
def test_the_compose_file_is_valid_with_env_example_as_env():
    out = run_compose("config", "-q", env_file=ENV_EXAMPLE)
    assert out.returncode == 0, out.stderr


@needs_compose
@pytest.mark.parametrize("secret", sorted(secrets()))
def test_a_missing_secret_stops_compose_and_is_named(secret, tmp_path):
    for value in ("", None):  # empty, then absent
        lines = [line for line in ENV_EXAMPLE.read_text().splitlines() if not line.startswith(f"{secret}=")]
        if value is not None:
            lines.append(f"{secret}=")
        (tmp_path / ".env").write_text("\n".join(lines) + "\n")
        out = run_compose("config", "-q", env_file=tmp_path / ".env")
        assert out.returncode != 0
        assert f"set {secret} in .env (see .env.example)" in out.stderr, out.stderr


# -- structure ----------------------------------------------------------------------------------
def test_every_variable_is_required_and_named_in_env_example():
    text = COMPOSE.read_text()
    example = env_example()
    found = VARIABLE.findall(text)
    assert found
    for name, op, message in found:
        assert name in example, f"${{{name}}} is used by docker-compose.yml but .env.example does not set it"
        if name in OPTIONAL:
            continue
        assert (
            op == ":?" and message == f"set {name} in .env (see .env.example)"
        ), f"${{{name}{op}{message}}}: every variable is required, with the message naming it"
    # and nothing of .env.example is left unused
    assert set(example) <= {name for name, _, _ in found}, set(example) - {name for name, _, _ in found}


def test_no_secret_ships_with_a_value():
    example = env_example()
    for name in secrets():
        assert example[name].startswith("change-me"), f".env.example gives {name} a value"
    for path in [
        COMPOSE,
        *ROOT.glob("pipelines/**/*.conf"),
        *ROOT.glob("pipelines/**/*.yml"),
        *ROOT.glob("dashboards/**/*.yaml"),
    ]:
        for line in path.read_text().splitlines():
            m = re.search(r"(password|passwd|secret|encryptionkey)\w*\s*[:=]>?\s*(.+)", line, re.I)
            if m and not line.lstrip().startswith("#"):
                assert "${" in m.group(2) or "$$" in m.group(2), f"{path.relative_to(ROOT)}: {line.strip()}"


def test_every_secret_the_setup_checks_is_in_env_example_and_checked_first():
    from flowstat import provision

    assert {s.env for s in provision.SECRETS} == secrets()
    check = services()["secrets"]
    assert check["command"] == ["provision", "--check"]
    assert secrets() <= set(environment(check))
    for name in ("elasticsearch", "influxdb"):  # both keep the admin password of their first start
        assert services()[name]["depends_on"]["secrets"] == {"condition": "service_completed_successfully"}


def test_healthy_dependencies_have_healthchecks_and_long_running_services_have_one():
    svcs = services()
    for name, svc in svcs.items():
        if long_running(svc):
            assert "healthcheck" in svc, f"{name} runs for long and has no healthcheck"
            assert svc.get("mem_limit"), f"{name} has no memory limit"
        else:
            assert svc.get("restart") == "no", f'{name}: a one-shot service says restart: "no"'
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in svcs, f"{name} depends on {dep}, which is not a service"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in svcs[dep], f"{name} waits for {dep} to be healthy; it has no healthcheck"
            if cond["condition"] == "service_completed_successfully":
                assert svcs[dep].get("restart") == "no", f"{name} waits for {dep} to complete; it is not one-shot"


def test_clients_of_the_stores_wait_for_the_setup():
    """Users, the database and the templates exist before anyone writes or reads."""
    waiting = 0
    for name, svc in services().items():
        if long_running(svc) and stores_reached(svc) and name != "kibana":  # Kibana retries until its user is set
            waiting += 1
            assert svc["depends_on"].get("setup") == {"condition": "service_completed_successfully"}, name
    assert waiting == 7  # telegraf, logstash, grafana, elastalert, rollup, verdict, verdict-influxdb
    # and nothing waits for the Kibana import: a slow Kibana never holds the samples back
    assert not [n for n, svc in services().items() if "setup-kibana" in (svc.get("depends_on") or {})]


def test_flowstats_services_of_the_stores_are_healthy_while_their_passes_reach_the_store():
    """The rollup and the two verdict services (one a store: each judges what its store holds, for
    the alert on that store) write --status FILE after each pass that reached their store; their
    healthcheck is that file's age. Their commands are ones flowstat's own parser takes."""
    import argparse

    from flowstat import rollup, verdicts

    svcs = services()
    parsers = {"rollup": rollup.configure, "verdict": verdicts.configure}
    judged = {}
    for name in ("rollup", "verdict", "verdict-influxdb"):
        svc = svcs[name]
        command, parser = svc["command"], argparse.ArgumentParser()
        parsers[command[0]](parser)
        args = parser.parse_args(command[1:])
        assert svc["healthcheck"]["test"] == ["CMD-SHELL", f"find {args.status} -mmin -1 | grep -q ."], name
        assert svc["image"] == svcs["setup"]["image"] and svc["depends_on"] == svcs["rollup"]["depends_on"], name
        if command[0] == "verdict":
            assert not args.run, f"{name} judges live, not one run"
            judged[name] = stores_reached(svc)
    assert judged == {"verdict": ["Elasticsearch"], "verdict-influxdb": ["InfluxDB"]}


def test_every_mounted_file_exists_and_is_read_only():
    mounts = 0
    for name, svc in services().items():
        for volume in svc.get("volumes", []):
            source, target, *mode = volume.split(":")
            if source.startswith("./"):
                mounts += 1
                assert (ROOT / source).exists(), f"{name}: {source} is missing"
                # read-only, and relabelled for this container on an SELinux host (else it cannot read it)
                assert mode == ["ro,Z"], f"{name}: {source} should be mounted read-only with its own label (ro,Z)"
            else:
                assert (
                    source in compose()["volumes"]
                ), f"{name}: {source} is neither in the repository nor a named volume"
    assert mounts >= 8


def test_ports_are_published_on_loopback_by_default():
    for name, svc in services().items():
        for port in svc.get("ports", []):
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), f"{name}: {port} is not bound to BIND_ADDRESS"
    assert env_example()["BIND_ADDRESS"] == "127.0.0.1"


def test_every_image_is_pinned_by_a_version_variable():
    example = env_example()
    for name, svc in services().items():
        # (a literal `v` before the version where upstream tags so: prom/prometheus:v2.53.5)
        m = re.fullmatch(r"[\w./-]+:v?\$\{(\w+_VERSION):\?[^}]*\}", svc["image"])
        assert m, f"{name}: image {svc['image']} is not pinned through a *_VERSION variable"
        assert re.fullmatch(r"\d+\.\d+\.\d+", example[m.group(1)]), f"{m.group(1)}: a full version, not a tag"


def test_pinned_versions_agree_with_flowstat():
    """The compose stack runs what flowstat stack runs and what the tests check against."""
    from flowstat import __version__
    from flowstat.stack.elastalert import VERSION as ELASTALERT_VERSION
    from flowstat.stack.elasticsearch import ES_VERSION
    from flowstat.stack.telegraf import VERSION as TELEGRAF_VERSION

    example = env_example()
    assert example["ELASTIC_VERSION"] == ES_VERSION
    assert example["TELEGRAF_VERSION"] == TELEGRAF_VERSION.lstrip("v")
    assert example["ELASTALERT_VERSION"] == ELASTALERT_VERSION
    assert example["FLOWSTAT_VERSION"] == __version__
    assert example["INFLUXDB_VERSION"].startswith("1.")  # the v1 API the stores and Grafana's InfluxQL use
    assert example["PROMETHEUS_VERSION"].startswith("2.")  # the 2.x rule files dashboards/prometheus holds


def test_every_client_of_elasticsearch_or_influxdb_has_credentials():
    clients = 0
    for name, svc in services().items():
        env = environment(svc)
        for store in stores_reached(svc):
            clients += 1
            secret_refs = [v for k, v in env.items() if k.endswith("PASSWORD") and v.startswith("${")]
            assert secret_refs, f"{name} talks to {store} without a password"
    # kibana, setup (twice), telegraf, logstash, grafana (twice), elastalert, rollup, verdict, verdict-influxdb
    assert clients == 11


def test_the_users_compose_names_are_the_ones_the_setup_makes():
    from flowstat import provision

    made = {u.name: set(u.roles) for u in provision.USERS}
    svcs = services()
    assert made[environment(svcs["logstash"])["ELASTICSEARCH_USER"]] == {"flowstat_writer"}
    assert made[environment(svcs["grafana"])["FLOWSTAT_ES_READER"]] == {"flowstat_reader"}
    assert made[environment(svcs["elastalert"])["ES_USERNAME"]] == {"flowstat_alerter"}
    assert environment(svcs["kibana"])["ELASTICSEARCH_USERNAME"] in provision.BUILTIN_PASSWORDS
    # the same password variable on both sides of each user
    by_user = {u.name: u.password_env for u in provision.USERS}
    assert by_user["flowstat_logstash"] in environment(svcs["logstash"])["ELASTICSEARCH_PASSWORD"]
    assert by_user["flowstat_grafana"] in environment(svcs["grafana"])["FLOWSTAT_ES_READER_PASSWORD"]
    assert by_user["flowstat_elastalert"] in environment(svcs["elastalert"])["ES_PASSWORD"]
    # flowstat's own services log in as the stores' clients do (FLOWSTAT_ES_*, FLOWSTAT_INFLUX_*)
    for name, user in (("rollup", "flowstat_rollup"), ("verdict", "flowstat_verdict")):
        env = environment(svcs[name])
        assert env["FLOWSTAT_ES_USER"] == user and made[user] == {user}, name
        assert env["FLOWSTAT_ES_PASSWORD"] == f"${{{by_user[user]}:?set {by_user[user]} in .env (see .env.example)}}"
    influx = environment(svcs["verdict-influxdb"])
    assert "VERDICT" in provision.INFLUX_USERS
    assert influx["FLOWSTAT_INFLUX_USER"].startswith("${INFLUXDB_VERDICT_USER:?")
    assert influx["FLOWSTAT_INFLUX_PASSWORD"].startswith("${INFLUXDB_VERDICT_PASSWORD:?")
    steps_run = set()
    flags = {"--es": "elasticsearch", "--kibana": "kibana", "--influx": "influxdb"}
    for name, svc in svcs.items():
        command = svc.get("command") or []
        if command[:1] == ["provision"] and "--check" not in command:
            for flag, step in flags.items():
                if flag in command:
                    steps_run.add(step)
                    missing = set(provision.NEEDS[step]) - set(environment(svc))
                    assert not missing, f"{name} runs the {step} step without {sorted(missing)}"
    assert steps_run == set(provision.STEPS)


def test_every_variable_a_mounted_config_reads_is_set_by_its_service():
    """Telegraf, Logstash and Grafana expand ${VAR} in the files they are given: an unset one is
    an empty address or password at run time (Grafana does not even complain)."""
    files = {
        "telegraf": ["pipelines/telegraf/telegraf.conf"],
        "logstash": ["pipelines/logstash/pipeline/flowstat.conf"],
        "grafana": [str(p.relative_to(ROOT)) for p in (ROOT / "dashboards/grafana/provisioning").rglob("*.yaml")],
    }
    for name, paths in files.items():
        env = environment(services()[name])
        for path in paths:
            code = "\n".join(line.split("#")[0] for line in (ROOT / path).read_text().splitlines())
            for var in re.findall(r"\$\{(\w+)", code):
                assert env.get(var), f"{path} reads ${{{var}}}, which the {name} service does not set"


def test_elastalert_mounts_the_generated_settings_and_rules():
    from flowstat.stack import elastalert

    svc = services()["elastalert"]
    mounts = bind_mounts(svc)
    assert mounts["./dashboards/elastalert/rules"] == elastalert.COMPOSE_RULES_DIR
    config = yaml.safe_load((ROOT / "dashboards/elastalert/config.yaml").read_text())
    assert mounts["./dashboards/elastalert/config.yaml"] == "/opt/elastalert/config.yaml"
    assert config["rules_folder"] == elastalert.COMPOSE_RULES_DIR
    assert (config["es_host"], config["es_port"]) == ("elasticsearch", 9200)
    # its status index, which the healthcheck counts, is within the role the setup gives it
    assert f"{config['writeback_index']}_status" in " ".join(svc["healthcheck"]["test"])
    # every rule alerts as the settings say (a rule's own keys would win): a POST to the alert inbox,
    # with the rule's name and flowstat id beside the matching document's fields
    assert (config["alert"], config["http_post2_url"], config["http_post2_all_values"]) == (
        ["post2"],
        elastalert.COMPOSE_INBOX,
        True,
    )
    rules = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "dashboards/elastalert/rules").glob("*.yaml")}
    # each rule names its alerter, as ElastAlert2 requires of a rule before it fills in the settings'
    # defaults (it refuses the rule otherwise: "'alert' is a required property"); the URL stays there
    assert rules and all(r["alert"] == ["post2"] and "http_post2_url" not in r for r in rules.values())
    assert all(r["http_post2_payload"] == {"rule": r["name"], "alert": uid} for uid, r in rules.items())
    inbox = services()["alerts"]
    host, port, path = re.fullmatch(r"http://(\w+):(\d+)(/\w+)", elastalert.COMPOSE_INBOX).groups()
    assert host == "alerts" and f"0.0.0.0:{port}" in inbox["command"] and path == "/elastalert"
    assert environment(services()["grafana"])["FLOWSTAT_ALERT_WEBHOOK"] == f"http://alerts:{port}/grafana"
    for client in ("grafana", "elastalert"):
        assert services()[client]["depends_on"]["alerts"] == {"condition": "service_healthy"}


def test_grafana_mounts_its_provisioning_where_the_provider_reads_the_dashboards():
    svc = services()["grafana"]
    mounts = bind_mounts(svc)
    provider = yaml.safe_load((ROOT / "dashboards/grafana/provisioning/dashboards/flowstat.yaml").read_text())
    assert mounts["./dashboards/grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    assert mounts["./dashboards/grafana/provisioning"] == "/etc/grafana/provisioning"


def test_setup_imports_the_committed_kibana_objects():
    from flowstat.views import kibana

    svc = services()["setup-kibana"]
    command = svc["command"]
    mounted = command[command.index("--kibana-objects") + 1]
    mounts = {target: source for source, target in bind_mounts(svc).items()}
    source = ROOT / mounts[str(Path(mounted).parent)] / Path(mounted).name
    ((name, text),) = kibana.files().items()
    assert source.name == name and source.read_text() == text


def test_new_env_writes_random_secrets_that_pass_the_check(tmp_path):
    from flowstat import provision

    out = subprocess.run([str(ROOT / "scripts" / "new-env"), str(tmp_path / ".env")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    made = dict(
        line.split("=", 1)
        for line in (tmp_path / ".env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert set(made) == set(env_example())
    assert provision.secret_problems(made) == []
    assert provision.secret_problems(env_example())  # the placeholders do not pass
    assert len({made[s] for s in secrets()}) == len(secrets())
    assert (tmp_path / ".env").stat().st_mode & 0o077 == 0
    again = subprocess.run([str(ROOT / "scripts" / "new-env"), str(tmp_path / ".env")], capture_output=True, text=True)
    assert again.returncode == 1 and "not overwritten" in again.stderr
    assert (
        dict(
            line.split("=", 1)
            for line in (tmp_path / ".env").read_text().splitlines()
            if line.strip() and not line.startswith("#")
        )
        == made
    )


def test_prometheus_is_an_optional_profile_on_loopback_with_its_config_and_rules_read_only():
    """The `prometheus` profile: not started by a plain `up`; the official image pinned by .env,
    run as nobody; its scrape jobs and every rule file of dashboards/prometheus mounted read-only
    where the configuration and its rule_files glob read them; its TSDB in a named volume."""
    svc = services()["prometheus"]
    assert svc["profiles"] == ["prometheus"]
    assert svc["image"] == "prom/prometheus:v${PROMETHEUS_VERSION:?set PROMETHEUS_VERSION in .env (see .env.example)}"
    assert re.fullmatch(r"2\.\d+\.\d+", env_example()["PROMETHEUS_VERSION"])
    assert svc["user"] == "65534:65534"  # nobody, as the official image runs; never root
    assert svc["ports"] == ["${BIND_ADDRESS:-127.0.0.1}:9090:9090"]
    flags = dict(c.removeprefix("--").split("=", 1) for c in svc["command"])
    assert flags["web.listen-address"] == "0.0.0.0:9090"  # inside its container; published on loopback
    mounts = bind_mounts(svc)
    assert mounts == {
        "./pipelines/prometheus/prometheus.yml": flags["config.file"],
        "./dashboards/prometheus": "/etc/prometheus/rules",
    }
    assert all(v.endswith(":ro,Z") for v in svc["volumes"] if v.startswith("./"))
    (data,) = [v for v in svc["volumes"] if not v.startswith("./")]
    assert data == f"prometheus-data:{flags['storage.tsdb.path']}" and "prometheus-data" in compose()["volumes"]
    assert "/-/ready" in " ".join(svc["healthcheck"]["test"]) and svc.get("mem_limit")
    config = yaml.safe_load((ROOT / "pipelines/prometheus/prometheus.yml").read_text())
    # every *.yml of dashboards/prometheus is a rule file (none other is there), and the glob loads them all
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    rule_files = sorted((ROOT / "dashboards/prometheus").glob("*.yml"))
    assert rule_files and all(yaml.safe_load(f.read_text())["groups"] for f in rule_files)
    assert "rules.yml" in [f.name for f in rule_files]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["127.0.0.1:9090"]}]
    # nothing waits for it, and it waits for nothing: the stack runs the same with or without it
    assert not svc.get("depends_on")
    assert not [n for n, other in services().items() if "prometheus" in (other.get("depends_on") or {})]
