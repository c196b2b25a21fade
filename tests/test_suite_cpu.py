"""flowstat_lab.suite_cpu: the suite's CPU from the kernel's process accounting, charged to tests."""

from __future__ import annotations

import json
import struct

from flowstat_lab import suite_cpu

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
