"""The fixtures tests share (the helpers are in tests/support/): the session's stack and secured stack,
the fixture runs, a scratch runs directory, each agent in turn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


# The modules that start, stop or use the real servers (the session's stack, or a stack of their own),
# in two groups of about equal time. Each group goes whole to one worker, in order (its tests mostly
# wait for a server to restart), and each worker has a stack of its own (worker_stack_cache). The
# modules of the secured stack are in one group, so that one worker starts it.
SERVER_GROUPS = {
    "servers-a": {
        "test_campaign_stores.py",
        "test_dashboards.py",
        "test_demo.py",
        "test_elastalert.py",
        "test_ingest.py",
        "test_kibana.py",
        "test_sinks_real_servers.py",
        "test_stack.py",
        "test_stores.py",
    },
    "servers-b": {
        "test_es_failover.py",
        "test_provision.py",
        "test_secured_clients.py",
        "test_secured_stack.py",
        "test_slurm_cluster.py",
        "test_wheel.py",
    },
}
# Modules whose tests share a cluster of their own and run in order: each goes whole to one worker,
# beside the others; modules of the same group go to the same worker, one after the other. (The two
# compose modules both need the machine's one compose engine, which a lock gives to one at a time:
# on two workers, one would only wait for the other. test_slurm_cluster.py is a server module: its
# runs across hosts ship to the session stack.)
ONE_WORKER_MODULES = {
    "test_compose_up.py": "compose-engine",
    "test_es_cluster_up.py": "compose-engine",
    **{module: group for group, modules in SERVER_GROUPS.items() for module in modules},
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """make test runs the tests on three workers (pytest-xdist; most of the suite waits on servers and
    processes, not on the two cores): each group of server modules goes to one of them, in order;
    each module with a cluster of its own (the compose engine, Slurm) goes whole to one worker; the
    rest is spread test by test. (The groups have the most tests: they are handed out first.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ServersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return ONE_WORKER_MODULES.get(nodeid.split("::")[0].rsplit("/", 1)[-1], nodeid)

    return ServersTogether(config, log)


def worker_stack_cache() -> Path:
    """The session stack's folder: .cache/test-stack, where make test installs the servers; for a
    pytest-xdist worker, a folder of its own beside it (its servers' data, logs, ports and pids), that
    takes the installs from .cache/test-stack (the Elasticsearch distribution, ElastAlert's venv) when
    they are there, so that two workers' stacks run at once."""
    from flowstat.stack.base import give_to_service_user
    from flowstat.stack.elastalert import ElastAlert
    from flowstat.stack.elasticsearch import Elasticsearch

    shared = ROOT / ".cache" / "test-stack"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return shared
    own = ROOT / ".cache" / f"test-stack-{worker}"
    dist, venv = Elasticsearch("elasticsearch", shared, 0).dist, ElastAlert("elastalert", shared, 0).venv
    if dist.exists():
        # The server runs it as the service user; `up` hands over its own home, in which the link is
        # only a link (make test installed the distribution as root).
        give_to_service_user(dist)
    for installed in (dist, venv):
        link = own / installed.relative_to(shared)
        if installed.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(installed, target_is_directory=True)
    return own


@pytest.fixture
def reachable_tmp() -> Path:
    yield from reachable_dir()


@pytest.fixture(scope="session")
def stack():
    """Real InfluxDB, Elasticsearch, Telegraf and ElastAlert (after Elasticsearch, which it watches)
    on loopback, started by the project's own stack code; ElastAlert runs the tests' rule too.

    Installs are cached in .cache/test-stack (make test prepares it first: `flowstat stack
    install`); each pytest-xdist worker's servers run from a folder of their own (worker_stack_cache);
    data is wiped at the end so each session starts clean.
    """
    import shutil

    from flowstat.stack import Stack

    cache = worker_stack_cache()
    ports = {"influxdb": free_port(), "elasticsearch": free_port(), "telegraf": free_port()}
    s = Stack(
        cache, ports, options={"elastalert": {"rules_dirs": [ELASTALERT_RULES]}, "influxdb": {"retention_check": "1s"}}
    )  # test_stores sees retention delete
    try:
        s.up(report=lambda msg: None)
    except BaseException:
        s.down(report=lambda msg: None)  # what did start must not outlive the session
        raise
    yield s
    s.down(report=lambda msg: None)
    for sub in (
        "influxdb/data",
        "influxdb/meta",
        "influxdb/wal",
        "elasticsearch/data",
        "elastalert/alerts.log",
        "stack.json",
    ):
        target = cache / sub
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


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

    with ss.started(ROOT / ".cache" / "test-stack", free_port) as s:
        yield s


@pytest.fixture(scope="session")
def fixture_runs(request) -> dict[str, Path]:
    """The harness-made runs of tests/support/fixture_runs.py (healthy, overload, behind): name -> run dir."""
    import uuid

    from support import fixture_runs as fx

    worker = getattr(request.config, "workerinput", None)
    session = worker["testrunuid"] if worker else uuid.uuid4().hex
    return fx.make(ROOT / ".cache" / "test-fixture-runs", session[:12])


@pytest.fixture(scope="session")
def user_runs(request) -> dict[str, Path]:
    """Runs of the example user pipeline (tests/support/user_runs.py: overloaded, healthy): name -> run dir."""
    import uuid

    from support import user_runs as ur

    worker = getattr(request.config, "workerinput", None)
    session = worker["testrunuid"] if worker else uuid.uuid4().hex
    return ur.make(ROOT / ".cache" / "test-fixture-runs", session[:12])


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
