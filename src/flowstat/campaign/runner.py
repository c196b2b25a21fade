"""Running a campaign: each configuration as one monitored, recorded harness run, resumably.

The campaign's directory holds ``campaign.json`` (what is finished, and how it went) and ``runs/``
(one run directory per configuration, as ``flowstat run`` makes them). ``campaign.json`` is written
after every configuration, so an interrupted campaign resumes where it stopped: a configuration is
finished when the file records it with the same topology (a file edited since then reruns what it
changed). A configuration that fails is recorded as failed and the campaign goes on; a run cut short
by the user is not recorded, its directory is moved aside, and the campaign stops.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flowstat.harness.agents import AgentOptions
from flowstat.harness.orchestrator import ProgressCallback, RunError, run_topology
from flowstat.timeutil import iso_utc_ms

from .spec import Campaign, Configuration

STATE_FILE = "campaign.json"
RUNS = "runs"
ASIDE = ".aside"  # under runs/: directories of runs cut short or superseded, kept for a look
INTERRUPTED = "interrupted by the user"

# How a configuration ended: "ok" (clean, nothing lost), "not-ok" (it ran to the end, but lost data
# or a node failed: measured all the same), "failed" (no measurement: it could not start or broke).
FINISHED = ("ok", "not-ok", "failed")


class CampaignInterrupted(Exception):
    """The user stopped the campaign; what finished is recorded."""


@dataclass(frozen=True)
class ConfigurationOutcome:
    config: Configuration
    status: str
    run_dir: Path | None
    error: str | None
    skipped: bool  # finished in an earlier invocation


class Events(Protocol):
    """What a campaign reports as it goes (the command draws a progress bar from it)."""

    def starting(self, index: int, total: int, config: Configuration, duration: float) -> None: ...
    def progress(self) -> ProgressCallback | None: ...
    def finished(self, index: int, total: int, outcome: ConfigurationOutcome) -> None: ...


def default_dir(campaign: Campaign, root: Path = Path("runs") / "campaigns") -> Path:
    """runs/campaigns/<name>-<duration>s: runs of another length never mix with these."""
    return root / f"{campaign.name}-{campaign.duration:g}s"


def read_state(out: Path) -> dict[str, Any]:
    path = out / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return {"configurations": {}}
    except (OSError, ValueError) as exc:
        raise RunError(f"{path}: cannot read the campaign's state ({exc}); move it away to start afresh") from None
    if not isinstance(state, dict) or not isinstance(state.get("configurations"), dict):
        raise RunError(f"{path}: not a campaign state file (no configurations); move it away to start afresh")
    return state


def _write_state(out: Path, state: dict[str, Any]) -> None:
    tmp = out / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, out / STATE_FILE)  # whole or not at all: a kill never leaves half a state


def _recorded(state: dict, out: Path, config: Configuration) -> dict | None:
    """The record of a configuration finished with the same topology, its run still there (a
    failed one may have none), else None."""
    rec = state["configurations"].get(config.key)
    if not rec or rec.get("status") not in FINISHED or rec.get("topology") != config.topology.raw:
        return None
    if rec.get("run_dir") and not (out / rec["run_dir"] / "summary.json").exists():
        return None  # moved or deleted since: it runs again
    return rec


def _outcome(rec: dict, config: Configuration, out: Path) -> ConfigurationOutcome:
    return ConfigurationOutcome(
        config, rec["status"], out / rec["run_dir"] if rec.get("run_dir") else None, rec.get("error"), skipped=True
    )


def recorded(campaign: Campaign, out: Path) -> list[ConfigurationOutcome]:
    """The configurations of ``campaign`` finished in ``out``, as they ran (the tables show every
    finished configuration, whatever this invocation ran)."""
    state = read_state(out)
    return [_outcome(rec, c, out) for c in campaign.configurations if (rec := _recorded(state, out, c))]


def _move_aside(out: Path, run_dir: Path, why: str) -> None:
    if not run_dir.exists():
        return
    aside = out / RUNS / ASIDE
    aside.mkdir(parents=True, exist_ok=True)
    n = 1
    while (aside / f"{run_dir.name}.{why}-{n}").exists():
        n += 1
    shutil.move(str(run_dir), aside / f"{run_dir.name}.{why}-{n}")


def _status(summary: dict[str, Any]) -> tuple[str, str | None]:
    if summary["ok"]:
        return "ok", None
    if not summary.get("conservation", {}).get("checks"):  # nobody reported totals: nothing was measured
        return "failed", "; ".join(summary["failures"]) or "no node reported its totals"
    return "not-ok", "; ".join(summary["failures"])


def run_one(
    campaign: Campaign, config: Configuration, out: Path, agent: AgentOptions, progress: ProgressCallback | None
) -> tuple[str, str | None]:
    """Run a configuration; its status and what went wrong. Raises CampaignInterrupted."""
    run_id = campaign.run_id(config)
    run_dir = out / RUNS / run_id
    _move_aside(out, run_dir, "unfinished")  # left by a campaign killed during this run
    try:
        summary = run_topology(config.topology, run_id=run_id, runs_dir=out / RUNS, on_progress=progress, agent=agent)
    except (RunError, OSError) as exc:  # it could not start (a process, a file): that one failed, not the campaign
        return "failed", str(exc)
    if INTERRUPTED in summary["failures"]:
        _move_aside(out, run_dir, "interrupted")
        raise CampaignInterrupted(f"interrupted during {run_id}")
    return _status(summary)


def run_campaign(
    campaign: Campaign,
    out: Path,
    *,
    agent: AgentOptions | None = None,
    retry_failed: bool = False,
    events: Events | None = None,
) -> list[ConfigurationOutcome]:
    """Run every configuration not finished yet; the outcomes of all, in the file's order."""
    out.mkdir(parents=True, exist_ok=True)
    state = read_state(out)
    if state.get("duration") not in (None, campaign.duration):
        raise RunError(
            f"{out}: holds runs of {state['duration']:g} s, not {campaign.duration:g} s: give another " f"directory"
        )
    state.update(campaign=campaign.name, source=campaign.source, duration=campaign.duration)
    outcomes = []
    total = len(campaign.configurations)
    for i, config in enumerate(campaign.configurations):
        rec = _recorded(state, out, config)
        if rec and not (retry_failed and rec["status"] != "ok"):
            outcome = _outcome(rec, config, out)
        else:
            if state["configurations"].pop(config.key, None) is not None:  # finished before with another
                _write_state(out, state)  # topology, or retried: forgotten before its run is moved away
                _move_aside(out, out / RUNS / campaign.run_id(config), "superseded")
            if events:
                events.starting(i, total, config, campaign.duration)
            status, error = run_one(
                campaign, config, out, agent or AgentOptions(), events.progress() if events else None
            )
            run_dir = out / RUNS / campaign.run_id(config)
            measured = (run_dir / "summary.json").exists()
            state["configurations"][config.key] = {
                "status": status,
                "error": error,
                "run_id": campaign.run_id(config),
                "run_dir": str(run_dir.relative_to(out)) if measured else None,
                "value": config.value,
                "topology": config.topology.raw,
                "finished": iso_utc_ms(),
            }
            _write_state(out, state)
            outcome = ConfigurationOutcome(config, status, run_dir if measured else None, error, skipped=False)
        outcomes.append(outcome)
        if events:
            events.finished(i, total, outcome)
    _write_state(out, state)
    return outcomes
