"""flowstat_lab.suite_cpu: the suite's CPU from the kernel's process accounting, charged to tests."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading

from flowstat_lab import suite_cpu
from support.agents import wait_until

WORKER = 100


def record(pid: int, ppid: int, started: int, cpu_ticks: int, command: str) -> bytes:
    """An acct_v3 record; CPU under 8,192 ticks needs no exponent in a comp_t."""
    return struct.pack(
        "<BBHIIIIIIf8H16s", 0, 3, 0, 0, 0, 0, pid, ppid, started, 0.0, cpu_ticks, 0, 0, 0, 0, 0, 0, 0, command.encode()
    )


def test_a_process_is_charged_to_the_test_its_worker_ran_when_it_started(tmp_path):
    pacct = tmp_path / "pacct"
    pacct.write_bytes(
        record(201, WORKER, 1_000, 150, "python")  # a device of test a
        + record(202, 201, 1_001, 50, "flowstat-agent")  # its child: test a's too
        + record(203, WORKER, 1_010, 300, "java")  # started during test b
        + record(204, 1, 1_002, 700, "java")  # detached: nobody's
        + record(WORKER, 99, 990, 40, "[pytest-xdist")  # the worker itself
    )
    (tmp_path / f"tests.{WORKER}.jsonl").write_text(
        "\n".join(
            json.dumps(d)
            for d in (
                {"pid": WORKER, "id": "tests/test_x.py::a", "start": 999.5},
                {"pid": WORKER, "id": "tests/test_x.py::a", "end": 1_005.0},
                {"pid": WORKER, "id": "tests/test_y.py::b", "start": 1_005.5},
                {"pid": WORKER, "id": "tests/test_y.py::b", "end": 1_020.0},
            )
        )
    )
    report = suite_cpu.attribute(list(suite_cpu.records(pacct)), suite_cpu._test_intervals(tmp_path))
    assert report["by_test"] == {"tests/test_y.py::b": 3.0, "tests/test_x.py::a": 2.0}
    assert report["by_module"]["tests/test_x.py"] == {"cpu_s": 2.0, "python": 1.5, "flowstat-agent": 0.5}
    assert report["no_test"] == {"java": 7.0, "[pytest-xdist": 0.4}
    assert report["total_cpu_s"] == 12.4 and report["processes"] == 5


def test_comp_t_has_a_base_8_exponent():
    assert suite_cpu._comp_t(0x1FFF) == 8191 and suite_cpu._comp_t((1 << 13) | 5) == 40


def test_the_busy_share_is_summed_by_bucket_and_sampled_between_0_and_1(tmp_path):
    busy = tmp_path / "busy.tsv"
    busy.write_text("1.0\t1.000\n2.0\t0.500\n31.0\t0.200\n")
    assert suite_cpu.busy_summary(busy) == {"share": 0.567, "seconds": 3, "by_30s": {"0": 0.75, "30": 0.2}}
    stop, busy = threading.Event(), tmp_path / "sampled.tsv"
    thread = threading.Thread(target=suite_cpu._sample_busy, args=(busy, stop))
    thread.start()
    wait_until(lambda: busy.exists() and busy.read_text(), "the sampler's first line (a second after it starts)", 10)
    stop.set()
    thread.join()
    t, share = (float(x) for x in busy.read_text().splitlines()[0].split("\t"))
    assert t >= 1.0 and 0.0 <= share <= 1.0


def test_interpreters_are_named_by_what_they_ran_and_summed(tmp_path):
    name = suite_cpu.python_command
    assert (
        name(["py", "-m", "flowstat.harness.devices", "merger", "--config", "{}"])
        == "-m flowstat.harness.devices merger"
    )
    assert name(["py", "-X", "importtime", "-m", "flowstat.agent", "--pid", "1"]) == "-m flowstat.agent"
    assert name(["py", "/v/bin/flowstat", "verdict", "--run"]) == "flowstat verdict" and name(["py", "a.py"]) == "a.py"
    for pid, argv, cpu in ((1, ["p", "-m", "m", "a"], 0.5), (2, ["p", "-m", "m", "a"], 0.25), (3, ["p", "s.py"], 1.0)):
        (tmp_path / f"{pid}.json").write_text(json.dumps({"argv": argv, "cpu_s": cpu}))
    (tmp_path / "4.json").write_text('{"argv": ["p", "-m"')  # cut short by a kill
    assert suite_cpu.python_by_command(tmp_path) == [
        {"command": "s.py", "processes": 1, "cpu_s": 1.0, "each_s": 1.0},
        {"command": "-m m a", "processes": 2, "cpu_s": 0.8, "each_s": 0.38},
    ]
    env = {**os.environ, **suite_cpu._python_hook(tmp_path)}  # the hook, in a real interpreter
    subprocess.run([sys.executable, "-c", "sum(range(10))"], env=env, check=True)
    (logged,) = [json.loads(f.read_text()) for f in (tmp_path / "python").glob("*.json")]
    assert logged["argv"][1:] == ["-c", "sum(range(10))"] and logged["cpu_s"] > 0


def test_only_the_workers_log_their_tests_not_the_controller(tmp_path):
    """Under pytest-xdist each test is logged once, by the worker that ran it: the controller, which
    hears of them all, logs none (its spans overlap every worker's, and a worker's processes would be
    charged to them)."""
    (tmp_path / "test_few.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(6))\ndef test_x(i):\n    pass\n"
    )
    env = {**os.environ, "FLOWSTAT_SUITE_CPU_DIR": str(tmp_path)}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "flowstat_lab.suite_cpu",
        "-p",
        "no:cacheprovider",
        "-n",
        "2",
    ]
    out = subprocess.run([*command, "test_few.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    logs = sorted(tmp_path.glob("tests.*.jsonl"))
    ids = [json.loads(line)["id"] for f in logs for line in f.read_text().splitlines() if '"start"' in line]
    assert len(logs) == 2 and sorted(ids) == [f"test_few.py::test_x[{i}]" for i in range(6)], ids
