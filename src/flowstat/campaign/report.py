"""Everything a campaign writes once its runs are done: results.json, the Markdown and the HTML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flowstat.proc import machine

from . import markdown, results
from .runner import ConfigurationOutcome
from .spec import Campaign

RESULTS = "results.json"


@dataclass(frozen=True)
class CampaignFiles:
    files: list[Path]
    rows: list[results.ResultRow]


def write(
    campaign: Campaign,
    outcomes: list[ConfigurationOutcome],
    out: Path,
    report_dir: Path,
    command: str,
    html: bool = True,
) -> CampaignFiles:
    """The campaign's figures into ``out``/results.json, its tables and plots into ``report_dir``."""
    rows = results.rows(campaign, outcomes, out)
    facts = machine.describe()
    files = [out / RESULTS]
    results.write_json(campaign, rows, files[0], command, facts)
    files.append(markdown.write(campaign, rows, report_dir, command, facts))
    if html:
        from . import htmlpage  # Bokeh: only when a page is written

        files.append(htmlpage.write(campaign, rows, report_dir / f"{campaign.name}.html", command, facts))
    return CampaignFiles(files, rows)
