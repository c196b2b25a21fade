"""Which devices a stopping run hurries: those some input will never send its end of stream.
Devices here are real processes that already ended with the code a scenario needs."""

import subprocess
import sys
import threading

import pytest

from flowstat.harness.orchestrator import DeviceProcess, Orchestrator
from flowstat.harness.topology import from_dict
from support.common import topology_dict


def ended(name: str, role: str, code: int, final: bool, gave_up: bool = False, tmp=None) -> DeviceProcess:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return DeviceProcess(name, role, {}, tmp / f"{name}.log", proc=proc, final={} if final else None, gave_up=gave_up)


def running(name: str, role: str, tmp) -> DeviceProcess:
    return DeviceProcess(name, role, {}, tmp / f"{name}.log")


@pytest.fixture
def orch(tmp_path):
    # producers [0-3] in producers-0 feed merger-0 alone, [4-7] in producers-1 merger-1 alone
    topo = from_dict(topology_dict(producers={"count": 8, "processes": 2}, mergers=2))
    return Orchestrator(topo, "stop", tmp_path)


def test_a_dead_producer_hurries_only_the_merger_it_fed(orch, tmp_path):
    orch.devices = [
        ended("producers-0", "producer", 0, final=True, tmp=tmp_path),  # stopped with SIGTERM: sent its markers
        ended("producers-1", "producer", -9, final=False, tmp=tmp_path),  # its host lost
        running("merger-0", "merger", tmp_path),
        running("merger-1", "merger", tmp_path),
    ]
    mergers = orch.devices[2:]
    # merger-0's end-of-stream markers are on their way: hurried, it would drop what is still in flight
    assert [d.name for d in orch.cut_off(mergers)] == ["merger-1"]


def test_producers_that_gave_up_or_ended_without_their_report_hurry_their_mergers(orch, tmp_path):
    orch.devices = [
        ended("producers-0", "producer", 0, final=True, gave_up=True, tmp=tmp_path),  # SIGUSR1: no markers
        ended("producers-1", "producer", 0, final=False, tmp=tmp_path),
        running("merger-0", "merger", tmp_path),
        running("merger-1", "merger", tmp_path),
    ]
    assert [d.name for d in orch.cut_off(orch.devices[2:])] == ["merger-0", "merger-1"]


def test_the_viewer_waits_for_mergers_that_ended_well_and_is_hurried_after_a_dead_one(orch, tmp_path):
    viewer = running("viewer", "viewer", tmp_path)
    orch.devices = [
        ended("merger-0", "merger", 0, final=True, tmp=tmp_path),
        ended("merger-1", "merger", 0, final=True, tmp=tmp_path),  # hurried with SIGTERM: it still sent its marker
        viewer,
    ]
    assert orch.cut_off([viewer]) == []
    orch.devices[1] = ended("merger-1", "merger", 1, final=False, tmp=tmp_path)
    assert orch.cut_off([viewer]) == [viewer]


def test_a_stage_has_ended_once_its_final_reports_are_read_not_when_its_processes_exit(orch, tmp_path):
    """The reader, held back here, takes the final report after the process exited (CI saw it)."""
    merger = running("merger-0", "merger", tmp_path)
    merger.proc = subprocess.Popen(
        [sys.executable, "-c", 'print(\'{"event": "final", "objects_merged": 7}\')'], stdout=subprocess.PIPE, text=True
    )
    merger.proc.wait()
    merger.reader = threading.Timer(0.5, orch._read_events, (merger,))
    merger.reader.start()
    assert orch.wait_exit([merger], timeout=5)
    assert merger.final == {"event": "final", "objects_merged": 7}
