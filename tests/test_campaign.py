"""flowstat campaign: the campaign files, real runs of each, resuming, failures and interruptions."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flowstat.campaign import CampaignError, load
from flowstat.campaign.spec import from_dict
from support.common import ROOT
from support.runs import small

CAMPAIGNS = sorted((ROOT / "benchmark-harness" / "campaigns").glob("*.yaml"))
TINY_S = 5  # start-up is the first 3 s: a tiny run still has a steady state of two seconds


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flowstat.cli", "campaign", *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write(tmp_path: Path, data: dict, name: str = "small.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


# -- the files ----------------------------------------------------------------------------------


def test_there_are_the_thesis_campaigns_and_past_it():
    names = {p.stem for p in CAMPAIGNS}
    assert {
        "thesis-5.1-buffer-size",
        "thesis-5.2-object-size",
        "thesis-5.2.1-50MB-producers",
        "thesis-5.3-object-type",
        "thesis-5.4-producers",
        "thesis-5.5-mergers",
        "merger-saturation",
    } <= names


def test_thesis_campaigns_have_the_thesis_parameters():
    """Chapter 5's parameters exactly (300 s a run, the merger on a core of its own)."""
    got = {p.stem: load(p) for p in CAMPAIGNS if p.stem.startswith("thesis-")}
    for c in got.values():
        assert c.duration == 300
        for config in c.configurations:
            assert config.topology.cpus["merger"] == frozenset({1}) and config.topology.cpus["producer"] == frozenset(
                {0}
            )
    assert [c.value for c in got["thesis-5.1-buffer-size"].configurations] == [1, 4, 20, 50, 100, 1000]
    assert [c.value for c in got["thesis-5.4-producers"].configurations] == [2, 5, 10, 50, 100, 250, 375, 425, 500]
    assert [len(c.topology.mergers) for c in got["thesis-5.5-mergers"].configurations] == [1, 2, 4]
    assert [c.topology.obj.kind.name for c in got["thesis-5.3-object-type"].configurations] == [
        "TH1F",
        "TH2F",
        "TH3F",
        "THnF",
        "TTree",
    ]
    t53 = got["thesis-5.3-object-type"].configurations[0].topology
    assert (t53.n_producers, t53.rate, t53.buffer_size, t53.obj.nbytes) == (20, 20, 100000, 500_000)
    sizes = [(c.topology.obj.nbytes, c.topology.rate) for c in got["thesis-5.2-object-size"].configurations]
    assert sizes == [(1000, 20), (500_000, 20), (5_000_000, 2.5), (50_000_000, 0.25)]


TRIED = {"merger-layers": "4-2-1"}  # a campaign's configuration the test runs, when not its first


@pytest.mark.parametrize("path", CAMPAIGNS, ids=lambda p: p.stem)
def test_each_campaign_file_runs_one_configuration(path, tmp_path):
    """One configuration (its first, or its most telling: TRIED), a few seconds long: the file parses
    and runs, and the table and plots are written with that configuration's figures."""
    campaign = load(path)
    first = TRIED.get(campaign.name, campaign.configurations[0].key)
    config = next(c for c in campaign.configurations if c.key == first)
    result = cli(
        str(path),
        "--duration",
        str(TINY_S),
        "--only",
        first,
        "--out",
        str(tmp_path / "out"),
        "--report",
        str(tmp_path / "report"),
    )
    assert result.returncode == 0, result.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    (row,) = results["configurations"]
    assert (row["key"], row["status"], row["conserved"]) == (first, "ok", True)
    # the steady seconds' figures are read (a merger of 50 MB objects every 4 s may idle through
    # a two-second window: its CPU can be 0 there, its memory cannot)
    assert row["stats"]["cpu_clock_hz"]["seconds"] >= 1 and row["stats"]["cpu_clock_hz"]["mean"] >= 0
    assert row["stats"]["vmrss_kb"]["seconds"] >= 1 and row["stats"]["vmrss_kb"]["mean"] > 0
    md = (tmp_path / "report" / f"{campaign.name}.md").read_text()
    assert f"| {config.label} |" in md and f"{path.name} --duration {TINY_S:g}\n" in md
    assert len(list((tmp_path / "report" / campaign.name).glob("*.svg"))) == 8
    assert (tmp_path / "report" / f"{campaign.name}.html").stat().st_size > 0


# -- the file format ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        ({"sweep": {"parameter": "buffer_size"}}, "sweep: give exactly one of values"),
        ({"sweep": {"parameter": "Buffer Size", "values": [1]}}, "sweep.parameter: expected a topology field"),
        (
            {"sweep": {"parameter": "buffer_size", "values": [1, 0]}},
            "(sweep.values[1]: buffer-size-0): buffer_size: must be >= 1",
        ),
        ({"sweep": {"parameter": "buffer_size", "values": [1, 1]}}, "two configurations are both 'buffer-size-1'"),
        (
            {"sweep": {"parameter": "buffer_size", "configurations": [{"value": 1, "set": {"producers.rate": -1}}]}},
            "producers.rate: must be >= 0",
        ),
        ({"sweep": {"parameter": "buffer_size", "configurations": [{"set": {}}]}}, "configurations[0].value: required"),
        ({"duration": 0}, "duration: expected seconds > 0"),
        ({"topology": {"run_id": "x"}}, "topology.run_id: set by the campaign"),
        ({"campaign": "no spaces"}, "campaign: expected a name"),
        ({"sweeps": {}}, "sweeps: unknown field"),
    ],
)
def test_a_bad_campaign_is_refused_naming_the_field(change, message):
    with pytest.raises(CampaignError) as err:
        from_dict(small(**change), "c.yaml")
    assert str(err.value).startswith("c.yaml") and message in str(err.value), str(err.value)


def test_a_bad_campaign_file_runs_nothing(tmp_path):
    path = write(tmp_path, small(sweep={"parameter": "buffer_size", "values": [10, -1]}))
    result = cli(str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "sweep.values[1]" in result.stderr
    assert not (tmp_path / "out").exists()


def test_only_names_configurations_by_value_or_id():
    c = from_dict(small(), "c.yaml")
    assert [x.key for x in c.select(["100"]).configurations] == ["buffer-size-100"]
    assert [x.key for x in c.select(["buffer-size-10"]).configurations] == ["buffer-size-10"]
    with pytest.raises(CampaignError, match="no configuration '7' .there are: buffer-size-10, buffer-size-100"):
        c.select(["7"])


# -- running, resuming, failing -----------------------------------------------------------------


def test_a_resumed_campaign_skips_what_it_finished(tmp_path):
    path, out = write(tmp_path, small()), tmp_path / "out"
    first = cli(str(path), "--duration", "3", "--only", "10", "--out", str(out))
    assert first.returncode == 0, first.stderr
    run10 = out / "runs" / "small-buffer-size-10" / "summary.json"
    before = run10.stat().st_mtime_ns
    second = cli(str(path), "--duration", "3", "--out", str(out))
    assert second.returncode == 0, second.stderr
    assert "buffer-size-10: finished before (ok), skipped" in second.stderr
    assert "buffer-size-100: ok" in second.stderr
    assert run10.stat().st_mtime_ns == before  # not rerun
    state = json.loads((out / "campaign.json").read_text())
    assert {k: v["status"] for k, v in state["configurations"].items()} == {
        "buffer-size-10": "ok",
        "buffer-size-100": "ok",
    }
    results = json.loads((out / "results.json").read_text())
    assert [r["key"] for r in results["configurations"]] == ["buffer-size-10", "buffer-size-100"]
    # An edited configuration is not the one that finished: it runs again, the old run kept aside.
    data = small()
    data["topology"]["producers"]["rate"] = 50
    third = cli(str(write(tmp_path, data)), "--duration", "3", "--only", "10", "--out", str(out))
    assert third.returncode == 0 and "buffer-size-10: ok" in third.stderr, third.stderr
    assert run10.stat().st_mtime_ns != before
    assert list((out / "runs" / ".aside").glob("small-buffer-size-10.superseded-*"))


def test_a_failed_configuration_is_recorded_and_the_campaign_goes_on(tmp_path):
    """192.0.2.1 (TEST-NET-1) is no address of this machine: that configuration's nodes cannot bind."""
    data = small(
        sweep={
            "parameter": "host",
            "configurations": [{"value": "192.0.2.1", "id": "unbindable"}, {"value": "127.0.0.1", "id": "loopback"}],
        }
    )
    path, out = write(tmp_path, data), tmp_path / "out"
    result = cli(str(path), "--duration", "3", "--out", str(out))
    assert result.returncode == 1
    assert "unbindable: failed" in result.stderr and "loopback: ok" in result.stderr
    rows = {r["key"]: r for r in json.loads((out / "results.json").read_text())["configurations"]}
    assert rows["unbindable"]["status"] == "failed" and "192.0.2.1" in rows["unbindable"]["error"]
    assert rows["loopback"]["status"] == "ok" and rows["loopback"]["conserved"]
    assert "| 192.0.2.1 | failed: " in (out / "small.md").read_text()
    again = cli(str(path), "--duration", "3", "--out", str(out))
    assert "unbindable: finished before (failed), skipped" in again.stderr
    retried = cli(str(path), "--duration", "3", "--out", str(out), "--retry-failed", "--only", "unbindable")
    assert "unbindable: failed" in retried.stderr and "skipped" not in retried.stderr


def test_an_interrupted_campaign_keeps_what_finished_and_resumes(tmp_path):
    path, out = write(tmp_path, small()), tmp_path / "out"
    first = cli(str(path), "--duration", "8", "--only", "10", "--out", str(out))
    assert first.returncode == 0, first.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowstat.cli", "campaign", str(path), "--duration", "8", "--out", str(out), "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
    )
    endpoints = out / "runs" / "small-buffer-size-100" / "endpoints.json"
    deadline = time.monotonic() + 60
    while not endpoints.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)  # polling for the file a real run writes
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "buffer-size-10: finished before (ok), skipped" in err and "run the same command again to go on" in err
    state = json.loads((out / "campaign.json").read_text())
    assert list(state["configurations"]) == ["buffer-size-10"]
    assert list((out / "runs" / ".aside").glob("small-buffer-size-100.interrupted-*"))
    assert not (out / "runs" / "small-buffer-size-100").exists()
    resumed = cli(str(path), "--duration", "8", "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert "buffer-size-10: finished before (ok), skipped" in resumed.stderr and "buffer-size-100: ok" in resumed.stderr
    rows = json.loads((out / "results.json").read_text())["configurations"]
    assert [(r["key"], r["status"]) for r in rows] == [("buffer-size-10", "ok"), ("buffer-size-100", "ok")]


def test_only_runs_one_but_the_tables_keep_every_finished_configuration(tmp_path):
    path, out = write(tmp_path, small()), tmp_path / "out"
    for only in ("10", "100"):
        assert cli(str(path), "--duration", "3", "--only", only, "--out", str(out)).returncode == 0
    md = (out / "small.md").read_text()
    assert "| 10 |" in md and "| 100 |" in md


def test_figures_are_of_all_mergers_together(tmp_path):
    """With two mergers each merges half: the campaign's merged rate is their sum (the thesis's
    section 5.5), the offered rate; pooling their samples would give half of it. With a merger
    above them, the rate is still the first layer's (the final merger merges merged objects), and
    CPU and memory count every merger."""
    data = small(
        sweep={
            "parameter": "mergers",
            "configurations": [{"value": 1}, {"value": 2}, {"value": 2, "id": "2-1", "set": {"merger_layers": [1]}}],
        }
    )
    result = cli(str(write(tmp_path, data)), "--duration", "10", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["configurations"]
    for r in rows:
        merged = r["stats"]["merged_objects_per_second"]["mean"]
        assert r["offered_per_s"] == pytest.approx(400, rel=0.1)
        assert merged == pytest.approx(r["offered_per_s"], rel=0.1), r
    one, two, layered = (r["stats"]["vmrss_kb"]["mean"] for r in rows)
    assert two > 1.5 * one and layered > 1.3 * two  # two and three processes' memory, not one's


def test_per_second_sums_each_merger_once_a_second_inside_the_window():
    """A merger sampled twice in one second counts once; a second some merger has no sample in is
    left out; samples outside [lo, hi] are left out before seconds are made."""
    import numpy as np

    from flowstat.campaign.results import per_second
    from flowstat.report.load import Run, Series

    # merger a: t = 1.1, 1.6 (twice in second 1), 2.2, 3.9 (after hi); merger b: 1.2, 2.1, 3.1
    t = np.array([1.1, 1.6, 2.2, 3.9, 1.2, 2.1, 3.1])
    y = np.array([10.0, 20.0, 30.0, 99.0, 1.0, 2.0, 3.0])
    run = Run(
        Path("x"),
        {},
        None,
        0,
        t,
        t,
        np.zeros(7),
        {"merged_objects_per_second": y, "average_merge_time_ms": y},
        [Series("a", "merger", 0, 4), Series("b", "merger", 4, 7)],
        None,
    )
    secs, sums = per_second(run, "merged_objects_per_second", ["a", "b"], 0.0, 3.5)
    assert secs.tolist() == [1.0, 2.0] and sums.tolist() == [21.0, 32.0]
    secs, means = per_second(run, "average_merge_time_ms", ["a", "b"])
    assert secs.tolist() == [1.0, 2.0, 3.0] and means.tolist() == [10.5, 16.0, 51.0]


def test_a_campaign_file_that_is_not_yaml_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("campaign: x\nsweep: {parameter: [\n")
    with pytest.raises(CampaignError, match=r"broken.yaml: line 3, column 1: not valid YAML"):
        load(path)
