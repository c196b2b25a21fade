"""Benchmark campaigns: one topology run once per value of a swept parameter, every run monitored
and recorded, and the thesis-style tables and plots made from the runs (``flowstat campaign``).

- ``spec``: the campaign files (benchmark-harness/campaigns/), checked whole before anything runs;
- ``runner``: the runs, one per configuration, resumable (campaign.json);
- ``results``: the figures of each configuration, read back from its recorded run;
- ``markdown``, ``svg``, ``htmlpage``: the tables and plots; ``report``: all of them at once.
"""

from .runner import ConfigurationOutcome, run_campaign
from .spec import Campaign, CampaignError, Configuration, load

__all__ = ["Campaign", "CampaignError", "Configuration", "ConfigurationOutcome", "load", "run_campaign"]
