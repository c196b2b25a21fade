#!/usr/bin/env python3
"""Every campaign of benchmark-harness/campaigns/, shortened (make bench: --duration 20).

Each campaign runs as `flowstat campaign FILE --duration D` does, resumably: its runs and state go
to .cache/campaigns/<D>s/<name>/, so an interrupted `make bench` goes on where it stopped and a
second one only rewrites the tables. The tables and plots go to docs/campaigns/ (20 s; other
durations to docs/campaigns/<D>s/), the HTML pages beside the runs, and every campaign's figures
to benchmarks/results/campaigns.json (campaigns-<D>s.json for other durations).

Usage: benchmarks/run_campaigns.py [--duration S] [--only NAME[,NAME]] [--retry-failed]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from flowstat.campaign import load, run_campaign
from flowstat.campaign import report as campaign_report
from flowstat.campaign.command import Bar
from flowstat.campaign.runner import CampaignInterrupted, recorded
from flowstat.harness.orchestrator import RunError

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGNS = Path("benchmark-harness") / "campaigns"  # relative: from the checkout's root (main goes there)
# The thesis's order, then what goes past it.
ORDER = (
    "thesis-5.1-buffer-size",
    "thesis-5.2-object-size",
    "thesis-5.2.1-50MB-producers",
    "thesis-5.3-object-type",
    "thesis-5.4-producers",
    "thesis-5.5-mergers",
    "merger-saturation",
    "merger-layers",
)


def files() -> list[Path]:
    found = {p.stem: p for p in CAMPAIGNS.glob("*.yaml")}
    return [found[n] for n in ORDER if n in found] + sorted(p for n, p in found.items() if n not in ORDER)


def places(duration: float) -> tuple[Path, Path, Path]:
    """Where the runs, the Markdown and the JSON go for this duration."""
    tag = f"{duration:g}s"
    docs = Path("docs") / "campaigns" if duration == 20 else Path("docs") / "campaigns" / tag
    name = "campaigns.json" if duration == 20 else f"campaigns-{tag}.json"
    return Path(".cache") / "campaigns" / tag, docs, Path("benchmarks") / "results" / name


# What each configuration's results keep in git: not where its run lay on this machine (the runs
# stay in .cache), nor an empty error, a label that is its value written out, or what the rest says
# (online: online_state is "online"; seconds: the window's end).
MACHINE_LOCAL = ("run_id", "run_dir")
DERIVED = ("online", "seconds")
# Of a campaign, what its name (the key) says: benchmark-harness/campaigns/NAME.yaml, run with duration_s.
NAMED = ("campaign", "source", "command")


def tracked(results: dict, machine: dict) -> dict:
    """A campaign's results.json as benchmarks/results keeps it (the thesis comparison's input); its
    machine only where it is not the file's ``machine``."""
    rows = [
        {
            k: v
            for k, v in row.items()
            if k not in MACHINE_LOCAL + DERIVED
            and not (k == "error" and v is None)
            and not (k == "label" and v == str(row.get("value")))
        }
        for row in results.get("configurations", [])
    ]
    same = ("machine",) if results.get("machine") == machine else ()
    return {**{k: v for k, v in results.items() if k not in NAMED + same}, "configurations": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0, metavar="S", help="seconds per configuration (default 20)")
    ap.add_argument(
        "--only",
        metavar="NAME",
        help="these campaigns only (comma-separated names); the others' " "results are kept in the JSON",
    )
    ap.add_argument("--retry-failed", action="store_true", help="run again the configurations that failed")
    args = ap.parse_args()
    os.chdir(ROOT)  # every path written down (the tables' commands, results.json) is the checkout's, not this machine's
    runs, docs, out = places(args.duration)
    wanted = set(args.only.split(",")) if args.only else None
    chosen = [p for p in files() if wanted is None or p.stem in wanted]
    if wanted and len(chosen) != len(wanted):
        ap.error(f"no campaign {sorted(wanted - {p.stem for p in chosen})} in {CAMPAIGNS}")
    combined = json.loads(out.read_text()) if out.exists() else {}
    combined.setdefault("campaigns", {})
    status = 0
    for path in chosen:
        campaign = load(path).with_duration(args.duration)
        print(
            f"== {campaign.name}: {len(campaign.configurations)} configurations x {args.duration:g} s", file=sys.stderr
        )
        try:
            outcomes = run_campaign(
                campaign,
                runs / campaign.name,
                retry_failed=args.retry_failed,
                events=Bar(len(campaign.configurations), campaign.duration),
            )
        except (CampaignInterrupted, KeyboardInterrupt, RunError) as exc:  # what finished is kept: write it down
            print(
                f"run_campaigns: {campaign.name}: {str(exc) or 'interrupted'}; run the same command to go on",
                file=sys.stderr,
            )
            status = 130 if not isinstance(exc, RunError) else 2
            break
        command = f"flowstat campaign {path} --duration {args.duration:g}"
        made = campaign_report.write(
            campaign, recorded(campaign, runs / campaign.name), runs / campaign.name, docs, command, html=False
        )
        # The HTML (Bokeh inline: a megabyte or more) stays beside the runs; the Markdown is committed.
        from flowstat.campaign import htmlpage

        results = json.loads((runs / campaign.name / campaign_report.RESULTS).read_text())
        htmlpage.write(campaign, made.rows, runs / campaign.name / f"{campaign.name}.html", command, results["machine"])
        combined.setdefault("machine", results["machine"])
        combined["campaigns"][campaign.name] = tracked(results, combined["machine"])
        status = max(status, int(any(o.status != "ok" for o in outcomes)))
        for p in made.files[1:]:
            print(f"wrote {p}", file=sys.stderr)
    combined["duration_s"] = args.duration
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(combined, separators=(",", ":")) + "\n")  # compact: tracked, read by tools
    print(f"wrote {out}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
