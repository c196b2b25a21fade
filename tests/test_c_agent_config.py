"""The C agent's config files (--config FILE, --config-dir DIR: src/flowstat/schema/agent-config.schema.json):
the TOML it takes and the TOML it refuses, how files and flags merge, the settings --print-config
shows, --test, --version (its reader is fuzzed with the others: test_c_agent.py). The agent runs
in the test's folder, so that the files are named as given (relative) in what it says."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import flowstat
from support.agents import sleeper
from support.common import C_AGENT as AGENT
from support.common import C_ASAN as ASAN
from support.common import ROOT, needs

SCHEMA = json.loads((ROOT / "src" / "flowstat" / "schema" / "agent-config.schema.json").read_text())["properties"]


def c_agent(folder: Path, *args: str, binary: Path = ASAN, env: dict | None = None) -> subprocess.CompletedProcess:
    """The agent (its ASan build unless told: a memory error or a leak in the reader fails the test)
    run in folder."""
    out = subprocess.run(
        [str(binary), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
        env={**os.environ, **(env or {})},
    )
    assert "AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr, out.stderr[-3000:]
    return out


def write(folder: Path, files: dict[str, str | bytes]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            (folder / name).write_bytes(text)
        else:
            (folder / name).write_text(text, newline="")


def defaults() -> dict:
    """What --print-config shows with nothing set: the schema's defaults, [] for a list, null else."""
    return {key: [] if spec.get("x-list") else spec.get("default") for key, spec in SCHEMA.items()}


def settings(folder: Path, files: dict, args: list[str], env: dict | None = None) -> dict:
    write(folder, files)
    out = c_agent(folder, *args, "--print-config", env=env)
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert len(out.stdout.splitlines()) == 1, out.stdout  # one JSON object, on one line
    return json.loads(out.stdout)


CONFIG = ["--config", "agent.toml"]

EVERY_FORM = r"""# every form of value the reader takes
interval = 2_5e-1          # a float: 2.5
rescan = 10                # an integer where seconds are
spool_max_mb = 0.5
send_max_kb = +1_024
self_interval = 0
node_backoff = 1.5E+2
quiet = true
pid = [1, 0x10, 0o17, 0b101, 2.0,]   # an integral float is an integer
pattern = "merger-[0-9]+"  # one value for a list: a list of one
sink = [
    "stdout://",           # comments inside
    # and between
    'udp://127.0.0.1:9'
    ,
]
name = "tab\there \"q\" back\\slash \u00e9 \U0001F600 \b\f\r\n"
run_id = 'C:\raw\n "x"'
host_name = "h#not-a-comment"	# a tab before this comment
endpoints_dir = []
"""

# name: (files, arguments, environment, the settings beyond the defaults)
VALID: dict[str, tuple[dict, list[str], dict, dict]] = {
    "no --config: no file is read, the schema's defaults": ({"agent.toml": "interval = 9\n"}, [], {}, {}),
    "an empty file": ({"agent.toml": "\n# nothing set\n   \n"}, CONFIG, {}, {}),
    "every form of value": (
        {"agent.toml": EVERY_FORM},
        CONFIG,
        {},
        {
            "interval": 2.5,
            "rescan": 10,
            "spool_max_mb": 0.5,
            "send_max_kb": 1024,
            "self_interval": 0,
            "node_backoff": 150,
            "quiet": True,
            "pid": [1, 16, 15, 5, 2],
            "pattern": ["merger-[0-9]+"],
            "sink": ["stdout://", "udp://127.0.0.1:9"],
            "name": 'tab\there "q" back\\slash é \U0001f600 \b\f\r\n',
            "run_id": 'C:\\raw\\n "x"',
            "host_name": "h#not-a-comment",
        },
    ),
    "numbers print back as the same double": (
        {"agent.toml": "interval = 0.1\nrescan = 0.30000000000000004\nsink_timeout = 1e-3\ndrain_timeout = 1.5e20\n"},
        CONFIG,
        {},
        {"interval": 0.1, "rescan": 0.30000000000000004, "sink_timeout": 0.001, "drain_timeout": 1.5e20},
    ),
    "CRLF line ends": (
        {"agent.toml": "interval = 2\r\nsink = [\r\n  'stdout://', # a comment\r\n]\r\n"},
        CONFIG,
        {},
        {"interval": 2, "sink": ["stdout://"]},
    ),
    "drop-ins: a scalar replaced, lists added up, files in strcmp order": (
        {
            "agent.toml": 'interval = 2\nsink = ["udp://127.0.0.1:9"]\npattern = "merger"\npid = 1\n',
            "agent.d/20-b.toml": 'interval = 4\nsink = "tcp://127.0.0.1:9"\n',
            "agent.d/10-a.toml": "interval = 3\nsink = [\n  'file:///tmp/a',\n]\npid = [2, 3]\n",
            "agent.d/9-c.toml": "sink = ['file:///tmp/c']\n",
            "agent.d/a.toml": "interval = 6\n",  # after B.toml in C's order, before it in a dictionary's
            "agent.d/B.toml": "interval = 5\n",
            "agent.d/.hidden.toml": "sink = 'file:///tmp/hidden'\n",  # neither a dot file
            "agent.d/notes.txt": "sink = 'file:///tmp/txt'\n",  # nor another name
            "agent.d/sub/x.toml": "sink = 'file:///tmp/sub'\n",  # nor a sub-folder's file is read
        },
        CONFIG,
        {},
        {
            "interval": 6,
            "sink": ["udp://127.0.0.1:9", "file:///tmp/a", "tcp://127.0.0.1:9", "file:///tmp/c"],
            "pattern": ["merger"],
            "pid": [1, 2, 3],
        },
    ),
    "agent.d beside a FILE in another folder": (
        {"etc/agent.toml": "interval = 2\n", "etc/agent.d/x.toml": "rescan = 3\n", "agent.d/y.toml": "rescan = 9\n"},
        ["--config", "etc/agent.toml"],
        {},
        {"interval": 2, "rescan": 3},
    ),
    "--config-dir instead of agent.d": (
        {"agent.toml": "interval = 2\n", "agent.d/x.toml": "rescan = 9\n", "conf.d/y.toml": "rescan = 7\n"},
        [*CONFIG, "--config-dir", "conf.d"],
        {},
        {"interval": 2, "rescan": 7},
    ),
    "--config-dir alone": (
        {"conf.d/y.toml": "rescan = 7\n", "agent.toml": "interval = 9\n"},
        ["--config-dir", "conf.d/"],
        {},
        {"rescan": 7},
    ),
    "a later file's false unsets an earlier true": (
        {"agent.toml": "quiet = true\n", "agent.d/x.toml": "quiet = false\n"},
        CONFIG,
        {},
        {"quiet": False},
    ),
    "flags win; a list flag, even once, replaces the files' list": (
        {
            "agent.toml": 'interval = 2\nsink = ["udp://127.0.0.1:9"]\npid = [1, 2]\nname = "file"\nquiet = false\n',
            "agent.d/x.toml": 'sink = ["stdout://"]\npattern = "kept"\n',
        },
        [*CONFIG, "--interval", "3", "--sink", "stdout://", "--quiet", "--pid", "7", "--pid", "8", "--name", "flag"],
        {},
        {"interval": 3, "sink": ["stdout://"], "pid": [7, 8], "pattern": ["kept"], "name": "flag", "quiet": True},
    ),
    "the environment, in both kinds of string": (
        {
            "agent.toml": 'host_name = "${FS_CFG_HOST}-x"\nname = "$${literal} ${FS_CFG_EMPTY}$ $$ $x"\n'
            "run_id = '${FS_CFG_HOST}'\npidfile = ['/run/${FS_CFG_HOST}/${FS_CFG_HOST}.pid']\n"
        },
        CONFIG,
        {"FS_CFG_HOST": "node7", "FS_CFG_EMPTY": ""},
        {"host_name": "node7-x", "name": "${literal} $ $$ $x", "run_id": "node7", "pidfile": ["/run/node7/node7.pid"]},
    ),
}


@needs(ASAN)
@pytest.mark.parametrize("case", list(VALID))
def test_valid_files_resolve_to_the_settings_print_config_shows(tmp_path, case):
    """Every key of the schema, sorted; each setting as the file, the flag or the default gives it."""
    files, args, env, expected = VALID[case]
    got = settings(tmp_path, files, args, env)
    assert list(got) == sorted(SCHEMA)
    assert got == {**defaults(), **expected}


@needs(ASAN)
def test_print_config_needs_no_target_and_the_plain_build_agrees(tmp_path):
    """The optimised build resolves as the ASan one does; nothing but the JSON is written."""
    write(tmp_path, {"agent.toml": EVERY_FORM})
    plain = c_agent(tmp_path, *CONFIG, "--print-config", binary=AGENT)
    asan = c_agent(tmp_path, *CONFIG, "--print-config")
    assert plain.returncode == 0 and not plain.stderr and plain.stdout == asan.stdout
    assert plain.stdout.startswith(
        '{"allow_remote_control": false, "cgroup": [], "control_timeout": 0.25, "credentials": null, '
    ) and plain.stdout.endswith("}\n")


def bounds() -> list[tuple[str, object, object]]:
    """(key, a value at the schema's bound, one just past it) for each bound the schema sets."""
    out = []
    for key, spec in SCHEMA.items():
        item = spec.get("items", spec)
        if "minimum" in item:
            lo = item["minimum"]
            out.append((key, lo, lo - 1 if item["type"] == "integer" else lo - max(lo / 2, 0.001)))
        if "maximum" in item:
            out.append((key, item["maximum"], item["maximum"] + 1))
        if "maxLength" in item:
            out.append((key, "x" * item["maxLength"], "x" * (item["maxLength"] + 1)))
    return out


@needs(ASAN)
@pytest.mark.parametrize("key,at,past", bounds())
def test_the_agent_takes_a_value_at_each_schema_bound_and_refuses_one_past_it(tmp_path, key, at, past):
    """The option's own checks, which a file's values go through, hold the schema's bounds."""
    text = lambda v: json.dumps(v) if isinstance(v, str) else repr(v)
    got = settings(tmp_path, {"agent.toml": f"{key} = {text(at)}\n"}, CONFIG)
    assert got[key] == ([at] if SCHEMA[key].get("x-list") else at)
    write(tmp_path, {"agent.toml": f"\n{key} = {text(past)}\n"})
    out = c_agent(tmp_path, *CONFIG, "--print-config")
    assert out.returncode == 2 and out.stderr.startswith(f"flowstat-agent: agent.toml:2: {key}: "), out.stderr


# name: (files, extra arguments, the file and line the message names, its key (None: none), why)
INVALID: dict[str, tuple[dict, list[str], str, int, str | None, str]] = {
    "an unknown key": (
        {"agent.toml": "interval = 1\nintervall = 2\n"},
        [],
        "agent.toml",
        2,
        "intervall",
        "unknown key",
    ),
    "out of range, as the flag says it": (
        {"agent.toml": "\n\ninterval = 0\n"},
        [],
        "agent.toml",
        3,
        "interval",
        "--interval: expected seconds >= 0.01, got '0'",
    ),
    "out of range, though a flag replaces it": (
        {"agent.toml": "interval = 0\n"},
        ["--interval", "1"],
        "agent.toml",
        1,
        "interval",
        "expected seconds >= 0.01",
    ),
    "inf": ({"agent.toml": "rescan = -inf\n"}, [], "agent.toml", 1, "rescan", "got '-inf'"),
    "nan": ({"agent.toml": "send_max_kb = nan\n"}, [], "agent.toml", 1, "send_max_kb", "got 'nan'"),
    "too long": (
        {"agent.toml": f'run_id = "{"r" * 128}"\n'},
        [],
        "agent.toml",
        1,
        "run_id",
        "longer than the limit of 127",
    ),
    "a string for a number": (
        {"agent.toml": 'rescan = "5"\n'},
        [],
        "agent.toml",
        1,
        "rescan",
        "expected a number, got a string",
    ),
    "a boolean for a number": ({"agent.toml": "rescan = true\n"}, [], "agent.toml", 1, "rescan", "got a boolean"),
    "a number for a string": (
        {"agent.toml": "name = 5\n"},
        [],
        "agent.toml",
        1,
        "name",
        "expected a string, got an integer",
    ),
    "a number for a boolean": ({"agent.toml": "quiet = 1\n"}, [], "agent.toml", 1, "quiet", "expected a boolean"),
    "an array for a scalar": ({"agent.toml": "interval = [1]\n"}, [], "agent.toml", 1, "interval", "got an array"),
    "a string in a list of integers": ({"agent.toml": 'pid = [1, "2"]\n'}, [], "agent.toml", 1, "pid", "got a string"),
    "a fraction for an integer": (
        {"agent.toml": "pid = [1, 1.5]\n"},
        [],
        "agent.toml",
        1,
        "pid",
        "expected an integer, got 1.5",
    ),
    "a process id the flag refuses": (
        {"agent.toml": "pid = [1, 0]\n"},
        [],
        "agent.toml",
        1,
        "pid",
        "--pid: bad process id '0'",
    ),
    "an integer past 64 bits": (
        {"agent.toml": "pid = 99999999999999999999\n"},
        [],
        "agent.toml",
        1,
        "pid",
        "out of range",
    ),
    "a malformed number": ({"agent.toml": "interval = 01\n"}, [], "agent.toml", 1, "interval", "malformed number '01'"),
    "a bare word": ({"agent.toml": "name = merger\n"}, [], "agent.toml", 1, "name", "expected a value"),
    "a missing value": ({"agent.toml": "name =   # none\n"}, [], "agent.toml", 1, "name", "a value is missing"),
    "two values": (
        {"agent.toml": "interval = 1 2\n"},
        [],
        "agent.toml",
        1,
        "interval",
        "unexpected '2' after the value",
    ),
    "a table": (
        {"agent.toml": "interval = 1\n[agent]\nrescan = 2\n"},
        [],
        "agent.toml",
        2,
        None,
        "tables ([name]) are not supported by flowstat's agent config",
    ),
    "an array of tables": (
        {"agent.toml": "[[sinks]]\n"},
        [],
        "agent.toml",
        1,
        None,
        "arrays of tables ([[name]]) are not supported",
    ),
    "an inline table": (
        {"agent.toml": "sink = { url = 'x' }\n"},
        [],
        "agent.toml",
        1,
        "sink",
        "inline tables ({...}) are not supported",
    ),
    "an inline table in an array": (
        {"agent.toml": "sink = [\n{ url = 'x' }]\n"},
        [],
        "agent.toml",
        2,
        "sink",
        "inline tables",
    ),
    "an array of arrays": (
        {"agent.toml": "pid = [[1]]\n"},
        [],
        "agent.toml",
        1,
        "pid",
        "arrays of arrays are not supported",
    ),
    "a dotted key": (
        {"agent.toml": "spool.dir = 'x'\n"},
        [],
        "agent.toml",
        1,
        "spool",
        "dotted keys (spool.name) are not supported",
    ),
    "a quoted key": ({"agent.toml": '"interval" = 1\n'}, [], "agent.toml", 1, None, "quoted keys are not supported"),
    "a date": ({"agent.toml": "name = 1979-05-27\n"}, [], "agent.toml", 1, "name", "dates and times are not supported"),
    "a date and time": (
        {"agent.toml": "name = 1979-05-27 07:32:00Z\n"},
        [],
        "agent.toml",
        1,
        "name",
        "dates and times",
    ),
    "a time": ({"agent.toml": "name = 07:32:00\n"}, [], "agent.toml", 1, "name", "dates and times"),
    "a key given twice": (
        {"agent.toml": "interval = 1\nrescan = 2\ninterval = 3\n"},
        [],
        "agent.toml",
        3,
        "interval",
        "given twice (first on line 1)",
    ),
    "an unset variable": (
        {"agent.toml": 'name = "${FS_CFG_UNSET}"\n'},
        [],
        "agent.toml",
        1,
        "name",
        "FS_CFG_UNSET is not set",
    ),
    "a malformed variable": (
        {"agent.toml": "name = 'a ${1x}'\n"},
        [],
        "agent.toml",
        1,
        "name",
        "write $${ for a literal ${",
    ),
    "an unterminated string": (
        {"agent.toml": 'interval = 1\nname = "abc\n'},
        [],
        "agent.toml",
        2,
        "name",
        "unterminated string",
    ),
    "an unterminated array": (
        {"agent.toml": 'interval = 1\nsink = ["stdout://",\n\n'},
        [],
        "agent.toml",
        2,
        "sink",
        "unterminated array",
    ),
    "a multi-line string": (
        {"agent.toml": 'name = """a\nb"""\n'},
        [],
        "agent.toml",
        1,
        "name",
        'multi-line strings (""") are not supported by flowstat\'s agent config',
    ),
    "a multi-line literal string": (
        {"agent.toml": "name = '''a'''\n"},
        [],
        "agent.toml",
        1,
        "name",
        "multi-line strings (''')",
    ),
    "an unknown escape": ({"agent.toml": r'name = "a\qb"' + "\n"}, [], "agent.toml", 1, "name", r"unknown escape '\q'"),
    "a surrogate": ({"agent.toml": r'name = "\uD800"' + "\n"}, [], "agent.toml", 1, "name", "not a Unicode character"),
    "a NUL escape": ({"agent.toml": r'name = "\u0000"' + "\n"}, [], "agent.toml", 1, "name", "cannot hold a NUL"),
    "a control character": (
        {"agent.toml": 'name = "a\x01b"\n'},
        [],
        "agent.toml",
        1,
        "name",
        "a control character in a string",
    ),
    "not UTF-8": ({"agent.toml": b'interval = 1\nname = "\xff"\n'}, [], "agent.toml", 2, None, "not UTF-8 text"),
    "a lone carriage return": (
        {"agent.toml": "interval = 1\r# x\n"},
        [],
        "agent.toml",
        1,
        None,
        "a carriage return without a line feed",
    ),
    "a bad sink, in a drop-in": (
        {"agent.toml": "interval = 1\n", "agent.d/50-x.toml": "\nsink = 'gopher://x'\n"},
        [],
        "agent.d/50-x.toml",
        2,
        "sink",
        "gopher://x: unknown sink",
    ),
    "a sink given again by a drop-in": (
        {"agent.toml": "sink = 'stdout://'\n", "agent.d/50-x.toml": "sink = ['stdout://']\n"},
        [],
        "agent.d/50-x.toml",
        1,
        "sink",
        "--sink stdout://: given twice",
    ),
    "a bad pattern": ({"agent.toml": "pattern = ['ok', '(']\n"}, [], "agent.toml", 1, "pattern", "--pattern '('"),
}


@needs(ASAN)
@pytest.mark.parametrize("case", list(INVALID))
def test_a_bad_file_is_refused_naming_its_place_and_the_agent_does_not_start(tmp_path, case):
    """Exit 2, one line on stderr: flowstat-agent: FILE:LINE: KEY: WHY (a syntax error met before a
    key: FILE:LINE: WHY); nothing sampled."""
    files, extra, where, line, key, why = INVALID[case]
    write(tmp_path, files)
    out = c_agent(tmp_path, *CONFIG, "--pid", str(os.getpid()), "--count", "1", *extra)
    prefix = f"flowstat-agent: {where}:{line}: " + (f"{key}: " if key else "")
    assert out.returncode == 2 and not out.stdout, out
    assert out.stderr.splitlines() == [out.stderr.strip()] and out.stderr.startswith(prefix), (prefix, out.stderr)
    assert why in out.stderr, (why, out.stderr)


@needs(ASAN)
@pytest.mark.parametrize(
    "args,message",
    [
        (["--config", "missing.toml"], "flowstat-agent: missing.toml: cannot read: No such file or directory\n"),
        (["--config-dir", "nowhere"], "flowstat-agent: nowhere: cannot read: No such file or directory\n"),
        (["--config", "agent.d"], "flowstat-agent: agent.d: cannot read: Is a directory\n"),
    ],
)
def test_a_file_that_cannot_be_read_is_refused(tmp_path, args, message):
    (tmp_path / "agent.d").mkdir()
    out = c_agent(tmp_path, *args, "--print-config")
    assert out.returncode == 2 and out.stderr == message and not out.stdout, out


@needs(AGENT)
def test_version_is_the_packages():
    out = c_agent(ROOT, "--version", binary=AGENT)
    assert out.returncode == 0 and out.stdout == f"flowstat-agent {flowstat.__version__}\n" and not out.stderr


@needs(AGENT)
def test_help_names_the_config_options():
    out = c_agent(ROOT, "--help", binary=AGENT)
    assert out.returncode == 0
    for option in ("--config FILE", "--config-dir DIR", "--print-config ", "--test ", "--version "):
        assert f"\n  {option}" in out.stdout, option


@needs(AGENT)
def test_test_prints_the_settings_then_one_round_of_the_targets_and_uses_no_sink(tmp_path):
    """--test: the settings as --print-config shows them, then one round of samples of the targets
    (here this test's own process) in line protocol on stdout; the configured sink and spool are
    not touched."""
    pid = os.getpid()
    text = f'pid = {pid}\ninterval = 0.05\nsink = ["file://{tmp_path}/out.lp"]\nspool_dir = "{tmp_path}/spool"\n'
    write(tmp_path, {"agent.toml": text})
    out = c_agent(tmp_path, *CONFIG, "--test", binary=AGENT)
    assert out.returncode == 0, out.stderr
    first, *rest = out.stdout.splitlines()
    assert json.loads(first) == {
        **defaults(),
        "pid": [pid],
        "interval": 0.05,
        "sink": [f"file://{tmp_path}/out.lp"],
        "spool_dir": f"{tmp_path}/spool",
    }
    assert rest and all(line.startswith("flowstat_node,") and f" seq=0i,pid={pid}i," in line for line in rest), rest
    assert not (tmp_path / "out.lp").exists() and not (tmp_path / "spool").exists()


@needs(AGENT)
def test_test_samples_the_targets_the_files_and_flags_resolve_to(tmp_path):
    """What the options took, not only what they print: the files' targets add up across files, a
    list flag replaces them; quiet = true in a file silences the INFO lines, a later file's false
    brings them back."""
    with sleeper() as child:
        write(
            tmp_path,
            {
                "agent.toml": f"pid = {os.getpid()}\ninterval = 0.01\nquiet = true\n",
                "agent.d/x.toml": f"pid = [{child.pid}]\n",
            },
        )
        both = c_agent(tmp_path, *CONFIG, "--test", binary=AGENT)
        write(tmp_path, {"agent.d/y.toml": "quiet = false\n"})
        only = c_agent(tmp_path, *CONFIG, "--test", "--pid", str(child.pid), binary=AGENT)

    def sampled(out: subprocess.CompletedProcess) -> list[int]:
        return sorted(int(m) for m in re.findall(r" seq=0i,pid=(\d+)i,", out.stdout))

    assert both.returncode == 0 and sampled(both) == sorted([os.getpid(), child.pid]), both
    assert only.returncode == 0 and sampled(only) == [child.pid], only
    assert "INFO" not in both.stderr and "INFO watching " in only.stderr, (both.stderr, only.stderr)


@needs(AGENT)
def test_test_needs_a_target_as_a_run_does(tmp_path):
    write(tmp_path, {"agent.toml": "interval = 0.05\n"})
    out = c_agent(tmp_path, *CONFIG, "--test", binary=AGENT)
    assert out.returncode == 2 and "give at least one target" in out.stderr and not out.stdout
