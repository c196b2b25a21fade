"""The product apart from its laboratory: what `make demo` installs and builds, what git tracks, and
that nothing reaches into the checkout by its paths (the wheel's side: tests/test_wheel.py; flowstat
never importing flowstat_lab: the import-linter contract of pyproject.toml, checked red below)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from support.common import ROOT

MAX_TRACKED_BYTES = 5_000_000
MAX_RESULT_BYTES = 200_000


def make_vars(*names: str) -> dict[str, list[str]]:
    out = subprocess.run(
        ["make", "--no-print-directory", "-pn", "-f", "Makefile", "help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = {}
    for name in names:
        m = re.search(rf"^{name} :?= (.*)$", out, re.M)
        assert m, f"no {name} in the Makefile"
        found[name] = m.group(1).split()
    return found


def test_make_demo_names_no_package_or_build_of_the_tests_alone():
    """`make -n -B demo` (every step, as on a new machine) against TEST_DEPS and the test builds."""
    deps = make_vars("DEMO_DEPS", "TEST_DEPS")
    assert deps["DEMO_DEPS"] and len(deps["TEST_DEPS"]) > 5
    assert not set(deps["DEMO_DEPS"]) & set(deps["TEST_DEPS"])
    steps = subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", "demo"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "scripts/demo" in steps and "collectors/c all" in steps, steps
    words = set(re.findall(r"[\w.+-]+", steps))
    assert not words & set(deps["TEST_DEPS"]), sorted(words & set(deps["TEST_DEPS"]))
    for test_only in ("asan", "fuzz", "node-probe", "node-bench", "tests", "[all,test]", "-e lab", "flowstat_lab"):
        assert not re.search(rf"(?<![\w-]){re.escape(test_only)}(?![\w-])", steps), (test_only, steps)
    assert "install -y -qq " + " ".join(deps["DEMO_DEPS"]) in steps


def tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / n for n in names.decode().split("\0") if n and (ROOT / n).is_file()]


def test_git_tracks_at_most_5_mb_and_benchmark_results_are_summaries():
    files = tracked()
    total = sum(f.stat().st_size for f in files)
    assert total <= MAX_TRACKED_BYTES, f"{total:,} bytes tracked"
    results = [f for f in files if f.is_relative_to(ROOT / "benchmarks" / "results")]
    assert len(results) > 5
    big = {str(f.relative_to(ROOT)): f.stat().st_size for f in results if f.stat().st_size > MAX_RESULT_BYTES}
    assert not big, big
    assert not [f for f in results if f.is_relative_to(ROOT / "benchmarks" / "results" / "raw")]


PATH_HACK = re.compile(
    r"sys\.path\.(insert|append|extend)\(|sys\.path\s*[+]?=|\"PYTHONPATH\":\s*str\(|PYTHONPATH=str\("
)


def test_nothing_puts_the_checkout_on_pythons_path():
    """Tests and benchmarks import flowstat and flowstat_lab as installed (make test installs both)."""
    py = [f for f in tracked() if f.suffix == ".py" or f.read_bytes()[:40].startswith(b"#!/usr/bin/env python")]
    assert len(py) > 100
    hacks = [
        f"{f.relative_to(ROOT)}:{i}"
        for f in py
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if PATH_HACK.search(line) and f != Path(__file__)
    ]
    assert not hacks, hacks


def test_the_contract_goes_red_when_flowstat_imports_its_laboratory(tmp_path):
    """lint-imports over a copy of the package in which one module imports flowstat_lab."""
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    lint = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "src")}  # the copy before the installed one
    clean = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    units = tmp_path / "src" / "flowstat" / "units.py"
    units.write_text(units.read_text() + "\nimport flowstat_lab.netns  # noqa\n")
    broken = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "flowstat does not import its laboratory (flowstat_lab) BROKEN" in broken.stdout
    assert "flowstat.units -> flowstat_lab.netns" in broken.stdout
