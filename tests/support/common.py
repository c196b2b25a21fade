"""What the tests share that is not a fixture: the checkout's places, small topologies, the one way
to pick a free port, scratch folders a service user can enter. Imported by test modules and by
conftest.py (fixtures stay there); no test module imports another."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "benchmark-harness" / "topologies"
ELASTALERT_RULES = ROOT / "tests" / "elastalert-rules"  # the tests' own rule, run beside flowstat's
C_BUILD = ROOT / "collectors" / "c" / "build"  # make c-agent: the agent, its ASan build, the fuzzers
C_AGENT = C_BUILD / "flowstat-agent"
C_ASAN = C_BUILD / "flowstat-agent-asan"
PYTHON_AGENT = [sys.executable, "-m", "flowstat.agent"]

# Every Elasticsearch the suite starts (the stack's, the secured one, those from the wheel, under Docker)
# runs on 512 MiB and C1 alone: a node here lives seconds to minutes, where C2's compiler threads cost
# more CPU than the code they make saves. Measured on one node (start, then 100,000 documents and 300
# searches): CPU to start 15 -> 9 s, for the work 14 -> 7 s. The suite's machine is CPU-bound on
# Elasticsearch otherwise. The JIT changes nothing the tests look at.
TEST_ES_JAVA_OPTS = "-Xms512m -Xmx512m -XX:TieredStopAtLevel=1"
TEST_CLI_JAVA_OPTS = "-XX:TieredStopAtLevel=1"  # Elasticsearch's launcher, a JVM of its own


def with_test_jvm(env_text: str) -> str:
    """A compose .env's text with ES_JAVA_OPTS and CLI_JAVA_OPTS set to the tests' (C1 alone)."""
    test = {"ES_JAVA_OPTS": TEST_ES_JAVA_OPTS, "CLI_JAVA_OPTS": TEST_CLI_JAVA_OPTS}
    return "".join(
        f"{name}={test[name]}\n" if (name := line.partition("=")[0]) in test else line + "\n"
        for line in env_text.splitlines()
    )


def needs(binary: Path):
    """Skipped only when the binary the test runs is missing (with CI set a skip fails: see below)."""
    return pytest.mark.skipif(not binary.exists(), reason=f"no {binary.name}: run `make c-agent` (make test does)")


# The flowstat wheel: what it is made of (copied from the checkout without WHEEL_IGNORE) and the options
# of the `pip wheel` that builds it. test_wheel.py builds it so, and so does the Dockerfile (test_dockerfile.py
# holds it to these).
WHEEL_SOURCES = ("src", "pyproject.toml", "README.md")
WHEEL_IGNORE = ("__pycache__", "*.egg-info")
WHEEL_OPTIONS = ("--no-deps",)


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


def pid_alive(pid: int) -> bool:
    from flowstat.proc.procfs import is_alive

    return is_alive(pid)


def free_port() -> int:
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


def narrowed_rule(rule: Path, path: Path, *filters: dict) -> Path:
    """The ElastAlert rule file RULE written to PATH with FILTERS added to its own: the session's
    stores hold every module's runs, and a test looks at its own."""
    import yaml

    doc = yaml.safe_load(rule.read_text())
    doc["filter"] = [*doc.get("filter", []), *filters]
    path.write_text(yaml.safe_dump(doc))
    return path
