"""flowstat as a user gets it: the wheel, installed into a fresh venv outside the checkout and run
from another directory, as root with root's own home (the stack's default cache included)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from support.agents import sleeper
from support.common import ROOT, TOPOLOGIES, WHEEL_IGNORE, WHEEL_OPTIONS, WHEEL_SOURCES, free_port

pytestmark = pytest.mark.integration
C_AGENT_DIR = ROOT / "collectors" / "c" / "build"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # root's, on Debian


@pytest.fixture(scope="module")
def wheel_file(tmp_path_factory) -> Path:
    # built from a copy of what the wheel is made of: a build/ left in the checkout must not leak in
    source, dist = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns(*WHEEL_IGNORE))
        else:
            shutil.copy(ROOT / name, source / name)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", *WHEEL_OPTIONS, "-w", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = dist.glob("flowstat-*.whl")
    return wheel


def install(tmp_path_factory, requirement: str) -> Path:
    """A fresh venv with REQUIREMENT installed (pinned by requirements.lock), by this pip: a venv's own
    pip, put there by ensurepip, costs 4-5 s of CPU and installs the same."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    out = subprocess.run(
        [*pip(venv), "install", "-q", "-c", str(ROOT / "requirements.lock"), requirement],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return venv


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory, wheel_file) -> Path:
    """The full install: flowstat[all], as the image and `make` have it."""
    return install(tmp_path_factory, f"{wheel_file}[all]")


@pytest.fixture(scope="module")
def slim_venv(tmp_path_factory, wheel_file) -> Path:
    """An agent-only host's install: the wheel without extras."""
    return install(tmp_path_factory, str(wheel_file))


def pip(venv: Path) -> list[str]:
    """pip, working on the venv's interpreter (pip's --python)."""
    return [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]


def installed(venv: Path) -> set[str]:
    out = subprocess.run(
        [*pip(venv), "list", "--format", "json"], capture_output=True, text=True, check=True, timeout=120
    )
    return {p["name"].lower() for p in json.loads(out.stdout)}


def flowstat(venv: Path, cwd: Path, *args, timeout=600, env=None) -> subprocess.CompletedProcess:
    # Only the venv and the system: nothing of the checkout on the paths.
    env = {"PATH": f"{venv / 'bin'}:{SYSTEM_PATH}", "HOME": os.environ.get("HOME", "/root"), **(env or {})}
    return subprocess.run(
        [str(venv / "bin" / "flowstat"), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_installed_package_is_not_the_checkout(wheel_venv, tmp_path):
    out = subprocess.run(
        [
            str(wheel_venv / "bin" / "python"),
            "-c",
            "import flowstat; from flowstat.schema import sample as s; print(flowstat.__file__, flowstat.__version__); "
            "print(len(s.fields()))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    where, version = out.stdout.split("\n")[0].split()
    assert str(ROOT) not in where and "site-packages" in where
    from flowstat import __version__
    from flowstat.schema import sample as sample_schema

    assert version == __version__ and int(out.stdout.split("\n")[1]) == len(sample_schema.fields())
    # ElastAlert's pins and scripts travel in the wheel, as the stack installs and runs them from there
    out = subprocess.run(
        [
            str(wheel_venv / "bin" / "python"),
            "-c",
            "from importlib.resources import files; "
            "d = files('flowstat.stack') / 'elastalert-files'; "
            "print(*sorted(p.name for p in d.iterdir() if p.is_file()))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    shipped = ROOT / "src" / "flowstat" / "stack" / "elastalert-files"
    assert out.stdout.split() == sorted(p.name for p in shipped.iterdir() if p.is_file()), out.stderr
    assert flowstat(wheel_venv, tmp_path, "--version").stdout.strip() == f"flowstat {__version__}"


def test_the_wheel_holds_flowstat_alone_and_every_command_a_user_has_answers(wheel_file, wheel_venv, tmp_path):
    """No module of the laboratory (lab/src/flowstat_lab) and nothing that imports it; then every command of
    `flowstat --help`, run from the installed wheel (what each one does: the tests of each command, and
    the whole job below)."""
    import zipfile

    from flowstat import __version__
    from flowstat.cli import COMMANDS

    names = zipfile.ZipFile(wheel_file).namelist()
    assert {n.split("/")[0] for n in names} == {"flowstat", f"flowstat-{__version__}.dist-info"}
    # what the laboratory took out of the package: the tools' emulated query expansion, the screenshots
    assert not [n for n in names if Path(n).stem in ("emulate_grafana", "emulate_kibana", "screenshots")]
    lab_import = re.compile(rb"^\s*(from|import)\s+flowstat_lab\b", re.M)
    with zipfile.ZipFile(wheel_file) as whl:
        assert not [n for n in names if n.endswith(".py") and lab_import.search(whl.read(n))]
    listed = flowstat(wheel_venv, tmp_path, "--help")
    commands = COMMANDS.names()
    assert listed.returncode == 0 and re.findall(r"(?m)^    (\S+)", listed.stdout) == commands, listed.stdout
    for command in commands:
        out = flowstat(wheel_venv, tmp_path, command, "--help", timeout=120)
        assert out.returncode == 0 and out.stdout.startswith(f"usage: flowstat {command}"), (command, out.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="the acceptance runs as root (CI does)")
def test_the_wheel_runs_the_whole_job_outside_the_checkout(wheel_venv, tmp_path):
    from flowstat.stack import SYSTEM_CACHE

    if (SYSTEM_CACHE / "stack.json").exists() and os.environ.get("CI") != "true":
        pytest.skip(f"{SYSTEM_CACHE} holds a stack of yours: this test would stop it")
    work = tmp_path / "elsewhere"
    work.mkdir()
    topo = work / "smoke.yaml"
    shutil.copy(TOPOLOGIES / "smoke.yaml", topo)

    out = flowstat(wheel_venv, work, "validate", topo)
    assert out.returncode == 0 and "smoke.yaml: OK - 4 producers" in out.stdout, out.stderr

    # a short run, watched by both agents (the C agent from the PATH, as an installed one would be)
    c_agent = (C_AGENT_DIR / "flowstat-agent").exists()
    env = {"PATH": f"{wheel_venv / 'bin'}:{C_AGENT_DIR}:{SYSTEM_PATH}"} if c_agent else None
    out = flowstat(
        wheel_venv, work, "run", topo, "--duration", 2, "--run-id", "wheel", "--json", "--agent-interval", 0.5, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["ok"] and summary["conservation"]["objects_sent"] > 0
    assert summary["agent"]["agent-py"]["samples"] > 0
    assert ("agent-c" in summary["agent"]) == c_agent and (not c_agent or summary["agent"]["agent-c"]["samples"] > 0)
    run_doc = json.loads((work / "runs" / "wheel" / "run.json").read_text())
    assert run_doc["verdict"]["ok"] and run_doc["parameters"]["producers"] == 4
    out = flowstat(wheel_venv, work, "report", "runs/wheel")
    assert out.returncode == 0 and (work / "runs" / "wheel" / "report.html").stat().st_size > 10_000, out.stderr

    proc = sleeper()
    try:
        out = flowstat(wheel_venv, work, "agent", "--pid", proc.pid, "--count", 1, "--interval", 0.05, "--quiet")
    finally:
        proc.kill()
    assert out.returncode == 0 and out.stdout.startswith("flowstat_node,agent=flowstat-agent-py"), out.stderr

    # the local stack with root's default cache, then the run replayed into it
    ports = {"--influx-port": free_port(), "--es-port": free_port(), "--telegraf-port": free_port()}
    args = [a for k, v in ports.items() for a in (k, v)]
    existed = SYSTEM_CACHE.exists()
    try:
        out = flowstat(wheel_venv, work, "stack", "up", *args, timeout=900)
        assert out.returncode == 0, out.stdout + out.stderr
        assert flowstat(wheel_venv, work, "stack", "status").returncode == 0
        influx, es = f"http://127.0.0.1:{ports['--influx-port']}", f"http://127.0.0.1:{ports['--es-port']}"
        out = flowstat(wheel_venv, work, "replay", "runs/wheel", "--influx", influx, "--es", es, "--quiet")
        assert out.returncode == 0, out.stderr
        loaded = summary["agent"]["agent-py"]["samples"]
        assert f"{loaded:,} samples loaded (run wheel)" in out.stdout
        requests.post(f"{es}/flowstat-runs/_refresh", timeout=30)
        doc = requests.get(f"{es}/flowstat-runs/_doc/wheel", timeout=30).json()["_source"]
        assert doc["verdict"]["ok"] and doc["samples"] == loaded and doc["parameters"]["producers"] == 4
        body = requests.post(
            f"{influx}/query", params={"db": "flowstat", "q": "SELECT count(seq) FROM flowstat_node"}, timeout=30
        ).json()
        assert body["results"][0]["series"][0]["values"][0][1] == loaded
    finally:
        down = flowstat(wheel_venv, work, "stack", "down", timeout=300)
        if not existed:
            shutil.rmtree(SYSTEM_CACHE, ignore_errors=True)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr


# -- the slim install: an agent-only host -------------------------------------------------------------

HEAVY = {"numpy", "pyyaml", "bokeh", "boost-histogram", "uproot"}


def test_an_agent_only_install_has_none_of_the_harness_report_or_stack_packages(slim_venv, wheel_venv):
    assert installed(slim_venv) & HEAVY == set()
    assert installed(wheel_venv) >= HEAVY  # the full install, for contrast: [all] brings them


def test_the_slim_install_samples_and_ships_with_the_agent_and_replays(slim_venv, tmp_path, stack):
    with sleeper() as proc:
        out = flowstat(
            slim_venv,
            tmp_path,
            "agent",
            *("--pid", proc.pid, "--count", 2, "--interval", 0.05, "--quiet", "--run-id", "slim"),
            *("--sink", f"{stack['influxdb'].url.replace('http', 'influxdb', 1)}/flowstat"),
            *("--run-file", "run.ndjson"),
        )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in (tmp_path / "run.ndjson").read_text().splitlines()]
    assert [d["seq"] for d in lines if d.get("pid") == proc.pid] == [0, 1]
    body = requests.post(
        f"{stack['influxdb'].url}/query",
        timeout=30,
        params={"db": "flowstat", "q": "SELECT count(seq) FROM flowstat_node WHERE run_id = 'slim'"},
    ).json()
    assert body["results"][0]["series"][0]["values"][0][1] == 2
    out = flowstat(slim_venv, tmp_path, "replay", "run.ndjson", "--es", stack["elasticsearch"].url, "--quiet")
    assert out.returncode == 0 and "2 samples loaded (run slim)" in out.stdout, out.stdout + out.stderr


def test_the_command_line_knows_the_extras_as_pyproject_lists_them():
    import tomllib

    from flowstat.cli import EXTRAS, OPTIONAL_MODULES

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    packages = {extra: {re.split(r"[<>=\[]", r)[0] for r in reqs} for extra, reqs in listed.items()}
    packages["all"] = set().union(*(packages[e] for e in re.search(r"\[(.*)\]", listed["all"][0])[1].split(",")))
    for extra, modules in EXTRAS.items():
        assert {OPTIONAL_MODULES[m] for m in modules} == packages[extra], extra


@pytest.mark.parametrize(
    "command,extra,package",
    [
        (["run", "any.yaml"], "harness", "numpy|PyYAML"),
        (["validate", "any.yaml"], "harness", "numpy|PyYAML"),
        (["report", "runs/x"], "report", "numpy|bokeh"),
        (["report", "--help"], "report", "numpy|bokeh"),
        (["stack", "up"], "stack", "PyYAML"),
        (["campaign", "run", "x.yaml"], "all", "numpy|PyYAML|bokeh"),
    ],
)
def test_a_command_the_slim_install_cannot_run_names_the_extra_to_install(slim_venv, tmp_path, command, extra, package):
    out = flowstat(slim_venv, tmp_path, *command)
    assert out.returncode == 2 and out.stdout == ""
    assert re.fullmatch(
        rf"flowstat {command[0]}: needs ({package}), which this install does not have: "
        rf"pip install 'flowstat\[{extra}\]'\n",
        out.stderr,
    ), out.stderr
    listed = flowstat(slim_venv, tmp_path, "--help")
    assert f"(not installed: pip install 'flowstat[{extra}]')" in listed.stdout
