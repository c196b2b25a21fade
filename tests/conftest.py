"""Shared fixtures: a scratch runs directory, and small topologies built in code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGIES = ROOT / "benchmark-harness" / "topologies"
ELASTALERT_RULES = ROOT / "tests" / "elastalert-rules"  # the tests' own rule, run beside flowstat's
C_BUILD = ROOT / "collectors" / "c" / "build"  # make c-agent: the agent, its ASan build, the fuzzers
C_AGENT = C_BUILD / "flowstat-agent"
C_ASAN = C_BUILD / "flowstat-agent-asan"
PYTHON_AGENT = [sys.executable, "-m", "flowstat.agent"]


def needs(binary: Path):
    """Skipped only when the binary the test runs is missing (with CI set a skip fails: see below)."""
    return pytest.mark.skipif(not binary.exists(), reason=f"no {binary.name}: run `make c-agent` (make test does)")

# The flowstat wheel: what it is made of (copied from the checkout without WHEEL_IGNORE) and the options
# of the `pip wheel` that builds it. test_wheel.py builds it so, and so does the Dockerfile (test_dockerfile.py
# holds it to these).
WHEEL_SOURCES = ("src", "pyproject.toml", "README.md")
WHEEL_IGNORE = ("__pycache__", "*.egg-info")
WHEEL_OPTIONS = ("--no-deps",)


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


# The modules that start, stop or use the real servers (the session's stack, or a stack of their own).
SERVER_MODULES = {"test_campaign_stores.py", "test_compose.py", "test_compose_up.py", "test_dashboards.py", "test_demo.py", "test_elastalert.py", "test_ingest.py", "test_kibana.py", "test_provision.py",
                  "test_secured_stack.py", "test_secured_clients.py", "test_sinks_real_servers.py", "test_stack.py", "test_stores.py", "test_wheel.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """make test runs the tests on two workers (pytest-xdist): the server modules go to one of
    them, in order, sharing one stack (they mostly wait for a server to restart), while the other
    worker runs the rest, test by test."""
    from xdist.scheduler import LoadScopeScheduling

    class ServersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "servers" if nodeid.split("::")[0].rsplit("/", 1)[-1] in SERVER_MODULES else nodeid

    return ServersTogether(config, log)


def topology_dict(**overrides) -> dict:
    base = {
        "run_id": "test",
        "duration": 2,
        "buffer_size": 100,
        "object": {"type": "TH1F", "size": "1kB"},
        "producers": {"count": 4, "rate": 200},
        "mergers": 1,
    }
    base.update(overrides)
    return base


def reachable_dir():
    """A scratch folder the stack's service user can enter (pytest's tmp_path is private to root),
    removed afterwards: a generator for fixtures of any scope."""
    import shutil
    import uuid

    d = ROOT / ".cache" / "test-tmp" / uuid.uuid4().hex[:12]
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def reachable_tmp() -> Path:
    yield from reachable_dir()


def pid_alive(pid: int) -> bool:
    from flowstat.proc.procfs import is_alive

    return is_alive(pid)


def _free_port() -> int:
    """A free port P whose neighbours a server also takes (P+1, P+2, P+100: see flowstat.stack) are free too.

    Taken below the kernel's ephemeral range (net.ipv4.ip_local_port_range), where it hands out
    ports to every bind(0) and outgoing connection: a port picked there can be taken by a harness
    run or a client on the other worker before the server starts."""
    import random

    from flowstat.stack.base import port_free

    try:
        ephemeral_lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_lo = 32768
    top = max(ephemeral_lo - 101, 2000)
    for _ in range(1000):
        port = random.randrange(10000 if top > 12000 else 1024, top)
        if all(port_free(port + d) for d in (0, 1, 2, 100)):
            return port
    raise RuntimeError(f"no free port below {top}")


@pytest.fixture(scope="session")
def stack():
    """Real InfluxDB, Elasticsearch, Telegraf and ElastAlert (after Elasticsearch, which it watches)
    on loopback, started by the project's own stack code; ElastAlert runs the tests' rule too.

    Installs are cached in .cache/test-stack (make test prepares it first: `flowstat stack
    install`); data is wiped at the end so each session starts clean.
    """
    import shutil

    from flowstat.stack import Stack

    cache = ROOT / ".cache" / "test-stack"
    ports = {"influxdb": _free_port(), "elasticsearch": _free_port(), "telegraf": _free_port()}
    s = Stack(cache, ports, options={"elastalert": {"rules_dirs": [ELASTALERT_RULES]},
                                     "influxdb": {"retention_check": "1s"}})  # test_stores sees retention delete
    try:
        s.up(report=lambda msg: None)
    except BaseException:
        s.down(report=lambda msg: None)  # what did start must not outlive the session
        raise
    yield s
    s.down(report=lambda msg: None)
    for sub in ("influxdb/data", "influxdb/meta", "influxdb/wal", "elasticsearch/data", "elastalert/alerts.log",
                "stack.json"):
        target = cache / sub
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def secured_stack():
    """Elasticsearch with security and TLS on and InfluxDB with authentication on, provisioned by
    the real `flowstat provision` with secrets made at random for the session: a
    tests/secured_stack.py SecuredStack (es_url, influx_url, ca_file, env: every secret; es_user(),
    influx_user(), es_session(), es(), api_key(), influx_query(), provision()).

    Elasticsearch runs from the session stack's cached install in .cache/test-stack (its analysis
    module compiled there once); its keystore, certificates and data in .cache/test-stack/
    elasticsearch-secured, its data wiped at the start and end of each session."""
    import secured_stack as ss

    with ss.started(ROOT / ".cache" / "test-stack", _free_port) as s:
        yield s


@pytest.fixture(scope="session")
def fixture_runs(request) -> dict[str, Path]:
    """The harness-made runs of tests/fixture_runs.py (healthy, overload, behind): name -> run dir."""
    import uuid

    import fixture_runs as fx

    worker = getattr(request.config, "workerinput", None)
    session = worker["testrunuid"] if worker else uuid.uuid4().hex
    return fx.make(ROOT / ".cache" / "test-fixture-runs", session[:12])


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
