"""One configuration file for both agents (the schema agent-config.schema.json): the same files
resolve to the same settings in the C agent and the Python agent (--print-config), a flag wins
over every file, lists add up across drop-ins, and an error names the file, the line and the key."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flowstat import stores
from flowstat.agent import config
from flowstat.agent.command import SEND_MAX_KB
from support.common import C_AGENT, PYTHON_AGENT

AGENTS = {"c": [str(C_AGENT)], "py": PYTHON_AGENT}


def run(agent: list[str], *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*agent, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder / "agent.toml"


def settings(agent: list[str], folder: Path, files: dict[str, str], *flags: str, env=None) -> dict:
    out = run(agent, "--config", str(write(folder, files)), *flags, "--print-config", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# name: (files, flags, environment, what the settings hold beyond the defaults)
VALID = {
    "defaults": ({"agent.toml": "# nothing set\n"}, [], {}, {}),
    "scalars and lists": (
        {
            "agent.toml": 'interval = 2.5\nrescan = 10  # an integer where seconds are\nsink = ["udp://127.0.0.1:9"]\n'
            "pid = [1, 2]\nquiet = true\nspool_dir = '/var/lib/x'\nname = \"a\\tb\\u00e9\"\n"
        },
        [],
        {},
        {
            "interval": 2.5,
            "rescan": 10,
            "sink": ["udp://127.0.0.1:9"],
            "pid": [1, 2],
            "quiet": True,
            "spool_dir": "/var/lib/x",
            "name": "a\tbé",
        },
    ),
    "drop-ins: scalars replaced, lists added, in name order": (
        {
            "agent.toml": 'interval = 2\nsink = ["udp://127.0.0.1:9"]\npattern = "merger"\n',
            "agent.d/20-b.toml": 'interval = 4\nsink = "tcp://127.0.0.1:9"\n',
            "agent.d/10-a.toml": "interval = 3\nsink = [\n  'file:///tmp/a',  # a comment\n]\n",
            "agent.d/.hidden.toml": "interval = 99\n",
            "agent.d/notes.txt": "interval = 98\n",
        },
        [],
        {},
        {
            "interval": 4,
            "sink": ["udp://127.0.0.1:9", "file:///tmp/a", "tcp://127.0.0.1:9"],
            "pattern": ["merger"],
        },
    ),
    "flags win, a list flag replaces the list": (
        {"agent.toml": 'interval = 2\nsink = ["udp://127.0.0.1:9"]\nself_interval = 0\n'},
        ["--interval", "3", "--sink", "stdout://", "--quiet"],
        {},
        {"interval": 3, "sink": ["stdout://"], "self_interval": 0, "quiet": True},
    ),
    "the environment": (
        {"agent.toml": 'host_name = "${FS_TEST_HOST}-x"\nname = "$${literal}"\n'},
        [],
        {"FS_TEST_HOST": "node7"},
        {"host_name": "node7-x", "name": "${literal}"},
    ),
}


def defaults() -> dict:
    return {key: [] if spec.get("x-list") else spec.get("default") for key, spec in sorted(config.schema().items())}


@pytest.mark.parametrize("case", list(VALID))
def test_both_agents_resolve_the_same_files_to_the_same_settings(agent_command, tmp_path, case):
    files, flags, env, expected = VALID[case]
    assert settings(agent_command, tmp_path, files, *flags, env=env) == {**defaults(), **expected}


def test_the_agents_agree_on_every_case(tmp_path):
    """The C agent's and the Python agent's settings, compared whole (not only to what a case names)."""
    if not C_AGENT.exists():
        pytest.skip("run `make c-agent` (make test does)")
    for n, (files, flags, env, _) in enumerate(VALID.values()):
        got = [settings(a, tmp_path / f"{n}-{name}", files, *flags, env=env) for name, a in AGENTS.items()]
        assert got[0] == got[1], list(VALID)[n]


# name: (files, the file and line the error names, the key it names or None)
INVALID = {
    "unknown key": ({"agent.toml": "interval = 1\nintervall = 2\n"}, "agent.toml", 2, "intervall"),
    "out of range, as the flag says": ({"agent.toml": "\n\ninterval = 0\n"}, "agent.toml", 3, "interval"),
    "a string for a number": ({"agent.toml": 'rescan = "5"\n'}, "agent.toml", 1, "rescan"),
    "a list for a scalar": ({"agent.toml": "interval = [1]\n"}, "agent.toml", 1, "interval"),
    "a number that is not an integer": ({"agent.toml": "pid = [1.5]\n"}, "agent.toml", 1, "pid"),
    "a table": ({"agent.toml": "interval = 1\n[agent]\nrescan = 2\n"}, "agent.toml", 2, None),
    "an inline table": ({"agent.toml": "sink = { url = 'x' }\n"}, "agent.toml", 1, "sink"),
    "a date": ({"agent.toml": "name = 1979-05-27\n"}, "agent.toml", 1, "name"),
    "a multi-line string": ({"agent.toml": 'name = """a\nb"""\n'}, "agent.toml", 1, "name"),
    "a key set twice": ({"agent.toml": "interval = 1\nrescan = 2\ninterval = 3\n"}, "agent.toml", 3, "interval"),
    "an unset variable": ({"agent.toml": 'name = "${FS_TEST_UNSET_VAR}"\n'}, "agent.toml", 1, "name"),
    "an unterminated string": ({"agent.toml": 'interval = 1\nname = "abc\n'}, "agent.toml", 2, None),
    "in a drop-in": (
        {"agent.toml": "interval = 1\n", "agent.d/50-x.toml": "\nrescan = -1\n"},
        "agent.d/50-x.toml",
        2,
        "rescan",
    ),
    "too long": ({"agent.toml": f'run_id = "{"r" * 128}"\n'}, "agent.toml", 1, "run_id"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_a_bad_file_names_its_place_and_the_agent_does_not_start(agent_command, tmp_path, case):
    files, where, line, key = INVALID[case]
    out = run(agent_command, "--config", str(write(tmp_path, files)), "--pid", str(os.getpid()), "--count", "1")
    place = f"{tmp_path / where}:{line}:" + (f" {key}:" if key else "")
    assert out.returncode == 2 and place in out.stderr and not out.stdout, (place, out.stderr)


def test_the_schema_holds_the_defaults_the_agents_had():
    assert config.schema()["node_backoff"]["default"] == stores.NODE_BACKOFF_S
    assert config.schema()["send_max_kb"]["default"] == SEND_MAX_KB


def test_version(agent_command):
    out = run(agent_command, "--version")
    assert out.returncode == 0 and out.stdout.split()[-1] == __import__("flowstat").__version__, out


def test_test_prints_the_settings_then_one_round_of_samples(agent_command, tmp_path):
    """--test: the resolved settings, then one round of the configured targets on stdout; the
    configured sinks and spool are not touched."""
    spool = tmp_path / "spool"
    files = {"agent.toml": f'pid = [{os.getpid()}]\nsink = ["file://{tmp_path}/out"]\nspool_dir = "{spool}"\n'}
    out = run(agent_command, "--config", str(write(tmp_path, files)), "--test")
    assert out.returncode == 0, out.stderr
    first, *rest = out.stdout.splitlines()
    assert json.loads(first)["pid"] == [os.getpid()]
    assert [line for line in rest if line.startswith("flowstat_node,")] and all(
        f"pid={os.getpid()}i" in line for line in rest
    ), rest
    assert not (tmp_path / "out").exists() and not spool.exists()
