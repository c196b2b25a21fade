"""The fixtures tests share (the helpers are in tests/support/): the session's stack and secured stack,
the fixture runs, a scratch runs directory, each agent in turn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support import shared
from support.cgroups import cgroup  # noqa: F401 (a fixture: a cgroup of the test's own)
from support.common import (
    C_AGENT,
    ELASTALERT_RULES,
    PYTHON_AGENT,
    ROOT,
    TEST_CLI_JAVA_OPTS,
    TEST_ES_JAVA_OPTS,
    free_port,
    reachable_dir,
)

# Every Elasticsearch the suite starts itself or through a program it runs (the stack code, the wheel's
# flowstat): see TEST_ES_JAVA_OPTS. (The compose tests write it into their .env: compose gets no shell
# variables there.)
os.environ.setdefault("ES_JAVA_OPTS", TEST_ES_JAVA_OPTS)
os.environ.setdefault("CLI_JAVA_OPTS", TEST_CLI_JAVA_OPTS)


@pytest.fixture(params=["c", "py"])
def agent_command(request) -> list[str]:
    """The command of an agent, for behaviour both implement alike."""
    if request.param == "c" and not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    return [str(C_AGENT)] if request.param == "c" else PYTHON_AGENT


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    return d


# What the scheduler keeps on one worker, in order (pytest-xdist; make test runs four workers): each
# group is a scope whose tests share something the others must not see changed under them, or that
# one worker should make once. Every other module goes whole to a worker: its module fixtures are made
# once, and the four workers run four modules, one waiting on time-outs beside one that computes. (Spread
# test by test, the workers ran the same module at once: four modules of waits left the cores 20% busy
# for 30 s, four of harness runs fought for them.)
GROUPS = {
    # the machine's one compose engine, which a lock gives to one module at a time
    "compose-engine": {"test_compose_up.py", "test_es_cluster_up.py"},
    # the secured stack (Elasticsearch with security and TLS, InfluxDB with authentication): started
    # once, by the worker that runs these
    "secured": {"test_es_failover.py", "test_provision.py", "test_secured_clients.py", "test_secured_stack.py"},
    # the session stack's ElastAlert, restarted by test_elastalert, waited for by the demo; `flowstat
    # stack up` of the session stack (the demo's, test_stack's) would restart it without the tests' webhook
    "alerting": {"test_elastalert.py", "test_demo.py", "test_stack.py"},
}
# Tests that stop, kill or pause a server, take away what every writer relies on (the index
# templates) or need what `stack up` changes (a pre-daily index): a stack of their own (own_stack).
OWN_STACK = (
    "test_ingest.py::test_a_store_down_for_ten_seconds_loses_and_duplicates_nothing",
    "test_stores.py::test_a_server_killed_mid_batch_loses_and_duplicates_nothing",
    "test_stack.py::test_up_waits_for_a_server_that_runs_but_answers_late",
    "test_stack.py::test_up_on_other_ports_restarts_a_running_server_without_waiting_for_it",
    "test_stores.py::test_install_gives_an_older_index_the_new_fields_and_names_one_it_cannot",
    "test_stores.py::test_an_older_flowstat_s_single_index_is_moved_into_daily_indices_and_resends_stay_single",
    "test_es_failover.py::test_replay_and_its_rollup_outlast_an_elasticsearch_that_stops_answering_for_seconds",
    "test_provision.py::test_provision_installs_the_templates_into_the_real_elasticsearch",
    "test_provision.py::test_elasticsearch_install_script_installs_the_templates",
)
# The longest scopes first, so that none starts last and ends the session alone and the last are
# short (seconds of a worker's time each took on two cores, 2026-11-29: from 316 for the compose engine
# down to 40); then the rest in the order collected.
FIRST = (
    "compose-engine",
    "secured",
    "test_campaign.py",
    "test_c_agent_delivery.py",
    "test_slurm_cluster.py",
    "test_dashboards.py",
    "test_agent_credentials.py",
    "test_harness_runs.py",
    "own-stack",
    "test_wheel.py",
    "alerting",
    "test_verdict_stores.py",
    "test_prometheus.py",
    "test_c_agent.py",
    "test_grafana_prometheus.py",
    "test_report.py",
    "test_prometheus_auth.py",
    "test_node.py",
    "test_node_c.py",
    "test_kibana.py",
)


def scope_of(nodeid: str) -> str:
    """The scheduling scope of a test (see GROUPS)."""
    path, _, name = nodeid.partition("::")  # a parameter's id may hold "/" and "::"
    module = path.rsplit("/", 1)[-1]
    if f"{module}::{name.split('[')[0]}" in OWN_STACK:
        return "own-stack"
    group = next((g for g, modules in GROUPS.items() if module in modules), None)
    return group or module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """make test runs the tests on several workers (pytest-xdist; much of the suite waits on servers
    and processes): each scope of scope_of goes whole to one worker, in order."""
    from xdist.scheduler import LoadScopeScheduling

    class Scoped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # the order is pytest_collection_modifyitems's
    return Scoped(config, log)


def pytest_collection_modifyitems(items):
    """FIRST's scopes first (see FIRST), each in its order; the rest as collected."""

    def rank(item) -> int:
        scope = scope_of(item.nodeid)
        return FIRST.index(scope) if scope in FIRST else len(FIRST)

    items[:] = [item for _, _, item in sorted((rank(item), i, item) for i, item in enumerate(items))]


def pytest_configure(config):
    shared.session_id(config)  # the controller's, before its workers start: they get it


def pytest_sessionfinish(session):
    """The controller (or a run without workers), once every worker is done: the shared servers stop."""
    if hasattr(session.config, "workerinput"):
        return
    if shared.made(shared.session_id(session.config), "stack") is not None:
        _stop_session_stack()


SESSION_STACK = ROOT / ".cache" / "test-stack"  # where make test installs the servers
STACK_OPTIONS = {
    "elastalert": {"rules_dirs": [ELASTALERT_RULES]},
    "influxdb": {"retention_check": "1s"},  # test_stores sees retention delete
}
STACK_DATA = (
    "influxdb/data",
    "influxdb/meta",
    "influxdb/wal",
    "elasticsearch/data",
    "elastalert/alerts.log",
    "stack.json",
)


def _wipe(cache: Path) -> None:
    import shutil

    for sub in STACK_DATA:
        target = cache / sub
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


def _stop_session_stack() -> None:
    from flowstat.stack import Stack

    Stack(SESSION_STACK, options=STACK_OPTIONS).down(report=lambda msg: None)
    _wipe(SESSION_STACK)


def own_cache(name: str) -> Path:
    """A folder for a stack of a worker's own (its servers' data, logs, ports and pids) beside the
    session stack's, taking the installs from there (the Elasticsearch distribution, ElastAlert's venv)."""
    from flowstat.stack.base import give_to_service_user
    from flowstat.stack.elastalert import ElastAlertServer
    from flowstat.stack.elasticsearch import ElasticsearchServer

    own = ROOT / ".cache" / f"test-stack-{name}"
    dist = ElasticsearchServer("elasticsearch", SESSION_STACK, 0).dist
    venv = ElastAlertServer("elastalert", SESSION_STACK, 0).venv
    if dist.exists():
        # The server runs it as the service user; `up` hands over its own home, in which the link is
        # only a link (make test installed the distribution as root).
        give_to_service_user(dist)
    for installed in (dist, venv):
        link = own / installed.relative_to(SESSION_STACK)
        if installed.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(installed, target_is_directory=True)
    return own


@pytest.fixture
def reachable_tmp() -> Path:
    yield from reachable_dir()


@pytest.fixture(scope="session")
def stack(request):
    """Real InfluxDB, Elasticsearch, Telegraf and ElastAlert (after Elasticsearch, which it watches)
    on loopback, started by the project's own stack code; ElastAlert runs the tests' rule too. One for
    the whole session, shared by every worker (tests/support/shared.py): a test that stops, kills or
    pauses a server takes own_stack instead.

    Installs are cached in .cache/test-stack (make test prepares it first: `flowstat stack install`);
    data is wiped at the end so each session starts clean."""
    from flowstat.stack import Stack

    def start() -> dict:
        _stop_session_stack()  # what an interrupted session left running
        ports = {"influxdb": free_port(), "elasticsearch": free_port(), "telegraf": free_port()}
        s = Stack(SESSION_STACK, ports, options=STACK_OPTIONS)
        try:
            s.up(report=lambda msg: None)
        except BaseException:
            s.down(report=lambda msg: None)  # what did start must not outlive the session
            raise
        return {"ports": ports}

    shared.once(shared.session_id(request.config), "stack", start)
    return Stack(SESSION_STACK, options=STACK_OPTIONS)


@pytest.fixture(scope="session")
def own_stack():
    """InfluxDB, Elasticsearch and Telegraf of this worker's own, for the tests that stop, kill or pause
    a server or remove a template (OWN_STACK, all on one worker): the session stack goes on for the others."""
    from flowstat.stack import Stack

    cache = own_cache(f"own-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")
    ports = {"influxdb": free_port(), "elasticsearch": free_port(), "telegraf": free_port()}
    s = Stack(cache, ports, services=("influxdb", "elasticsearch", "telegraf"), options=STACK_OPTIONS)
    try:
        s.up(report=lambda msg: None)
        yield s
    finally:
        s.down(report=lambda msg: None)
        _wipe(cache)


@pytest.fixture(scope="session")
def secured_stack():
    """Elasticsearch with security and TLS on and InfluxDB with authentication on, provisioned by
    the real `flowstat provision` with secrets made at random for the session: a
    tests/support/secured_stack.py SecuredStack (es_url, influx_url, ca_file, env: every secret; es_user(),
    influx_user(), es_session(), es(), api_key(), influx_query(), provision()).

    Elasticsearch runs from the session stack's cached install in .cache/test-stack (its analysis
    module compiled there once); its keystore, certificates and data in .cache/test-stack/
    elasticsearch-secured, its data wiped at the start and end of each session."""
    from support import secured_stack as ss

    with ss.started(SESSION_STACK, free_port) as s:
        yield s


@pytest.fixture(scope="session")
def fixture_runs(request) -> dict[str, Path]:
    """The harness-made runs of tests/support/fixture_runs.py (healthy, overload, behind): name -> run dir."""
    from support import fixture_runs as fx

    return fx.make(ROOT / ".cache" / "test-fixture-runs", shared.session_id(request.config)[:12])


@pytest.fixture(scope="session")
def user_runs(request) -> dict[str, Path]:
    """Runs of the example user pipeline (tests/support/user_runs.py: overloaded, healthy): name -> run dir."""
    from support import user_runs as ur

    return ur.make(ROOT / ".cache" / "test-fixture-runs", shared.session_id(request.config)[:12])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With CI set, a skipped test fails: CI installs everything the tests need (the C agent, its
    sanitiser builds, docker-compose, the servers), so a skip there is a broken set-up, not a
    missing optional tool."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where nothing may be: {reason}"
