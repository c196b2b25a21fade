import os
import subprocess
import sys
import time

import pytest

from flowstat.proc.procfs import (
    ProcessGone,
    pid_file_process,
    start_ticks,
    start_time,
    status_fields,
    vmrss_kb,
    write_pid_file,
)
from flowstat.units import parse_size


def test_vmrss_of_self_grows_with_allocation():
    before = vmrss_kb()
    block = bytearray(64 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    after = vmrss_kb(os.getpid())
    assert after - before > 50_000
    del block


def test_status_is_parsed_by_key():
    fields = status_fields()
    assert fields["Pid"] == str(os.getpid()) and "VmRSS" in fields


def test_start_time_is_when_the_process_started():
    before = time.time()
    child = subprocess.Popen(["sleep", "5"])
    try:
        started = start_time(child.pid)
    finally:
        child.kill()
        child.wait()
    assert before - 0.02 <= started <= time.time()  # clock ticks of 10 ms
    assert start_time(os.getpid()) < before
    with pytest.raises(ProcessGone):
        start_time(child.pid)


def test_dead_process_is_reported():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(ProcessGone, match=str(proc.pid)):
        vmrss_kb(proc.pid)


@pytest.mark.parametrize(
    "text,value",
    [("1kB", 1000), ("500 kB", 500_000), ("5MB", 5_000_000), ("64KiB", 65536), (1234, 1234), ("2.5MB", 2_500_000)],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "1 parsec", "-5kB", 0, True, None])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_the_machine_is_described_once_with_its_cpu_model_or_empty(tmp_path):
    from flowstat.proc import machine

    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: X\nmodel name\t: Some CPU @ 2.0GHz\n\nprocessor\t: 1\n"
        "model name\t: Some CPU @ 2.0GHz\n"
    )
    assert machine.cpu_model(info) == "Some CPU @ 2.0GHz"
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # an ARM kernel names no model
    assert machine.cpu_model(info) == "" and machine.cpu_model(tmp_path / "missing") == ""
    here = machine.describe()
    assert set(here) == set(machine.Machine.__annotations__)
    assert 1 <= here["usable_cpus"] <= here["cpus"] and here["kernel"] and here["flowstat_version"]


# -- pid files: a stale one must never have a stranger signalled -------------------------------------


@pytest.fixture
def sleeper():
    child = subprocess.Popen(["sleep", "60"])
    yield child
    child.kill()
    child.wait()


def test_a_pid_file_names_its_process_while_it_runs_and_nothing_once_it_ended(tmp_path, sleeper):
    f = tmp_path / "server.pid"
    write_pid_file(f, sleeper.pid)
    assert f.read_text() == f"{sleeper.pid} {start_ticks(sleeper.pid)}\n"
    assert pid_file_process(f) == sleeper.pid
    sleeper.kill()
    sleeper.wait()
    assert pid_file_process(f) is None
    assert pid_file_process(tmp_path / "none.pid") is None


def test_a_pid_file_whose_pid_a_later_process_took_names_nothing(tmp_path, sleeper):
    """As after pids wrapped: the file's pid runs, but it started at another tick than the file says."""
    f = tmp_path / "server.pid"
    f.write_text(f"{sleeper.pid} {start_ticks(sleeper.pid) - 1}\n")
    assert pid_file_process(f) is None
    f.write_text(f"{sleeper.pid}\n")  # a file of the pid alone (flowstat before this) is taken at its word
    assert pid_file_process(f) == sleeper.pid


def test_the_scripts_pid_file_of_a_process_started_after_it_was_written_names_nothing(tmp_path, sleeper):
    """flowstat_lab.netns: daemons write their own pid files (pid alone), so the file's time is the witness."""
    from flowstat_lab.netns import pid_file_alive

    f = tmp_path / "slurmd.pid"
    f.write_text(str(sleeper.pid))
    assert pid_file_alive(f) == sleeper.pid
    written = start_time(sleeper.pid) - 2.5  # the file is older than its process: another's pid, reused
    os.utime(f, (written, written))
    assert pid_file_alive(f) is None
    os.utime(f, (written + 1, written + 1))  # within the 2 s allowed for the clock's slewing
    assert pid_file_alive(f) == sleeper.pid
