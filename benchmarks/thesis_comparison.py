#!/usr/bin/env python3
"""The thesis's chapter-5 tables beside flowstat's campaigns, row by row (docs/thesis-comparison-tables.md).

Reads the thesis's numbers (benchmarks/thesis/chapter5.yaml, transcribed from the thesis) and the
campaigns' results (benchmarks/results/campaigns.json, made by run_campaigns.py; and
campaigns-300s.json where a campaign was also run at the thesis's 300 s), and writes one table per
section: for each configuration the thesis's mean ± std and flowstat's, metric by metric, and SVG
plots of the merged rate and the CPU clock against the swept parameter, thesis and flowstat on the
same axes. Runs nothing: rerun it after run_campaigns.py.

Usage: benchmarks/thesis_comparison.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from flowstat.campaign import svg
from flowstat.campaign.markdown import TITLES, fmt, titled

ROOT = Path(__file__).resolve().parents[1]
THESIS = Path("benchmarks") / "thesis" / "chapter5.yaml"
RESULTS = {"20 s": Path("benchmarks") / "results" / "campaigns.json",
           "300 s": Path("benchmarks") / "results" / "campaigns-300s.json"}
OUT = Path("docs") / "thesis-comparison-tables.md"
IMG = Path("docs") / "img" / "thesis"
METRICS = tuple(TITLES)


def same(a, b) -> bool:
    return str(a).replace(" ", "").lower() == str(b).replace(" ", "").lower()


def pair(value: list | None) -> str:
    if not value:
        return "-"
    mean, std = value
    return f"{fmt(mean, 3)} ± {fmt(std, 3)}"


def ours(row: dict | None, metric: str) -> list | None:
    if not row or row["status"] == "failed":
        return None
    s = row["stats"][metric]
    return None if s["mean"] is None else [s["mean"], s["std"]]


def load_results() -> dict[str, dict[str, dict]]:
    """{duration: {campaign: {configuration value as text: its row}}}."""
    out = {}
    for label, path in RESULTS.items():
        if path.exists():
            data = json.loads(path.read_text())["campaigns"]
            out[label] = {name: {str(r["value"]): r for r in c["configurations"]} for name, c in data.items()}
    return out


def find(rows: dict[str, dict], value) -> dict | None:
    return next((r for v, r in rows.items() if same(v, value)), None)


def section_table(name: str, sec: dict, results: dict) -> list[str]:
    runs = [(label, res.get(name, {})) for label, res in results.items() if res.get(name)]
    head = [sec["parameter"]]
    for m in METRICS:
        head += [f"{titled(m)}: thesis"] + [f"flowstat {label}" for label, _ in runs]
    head += ["offered objects/s, flowstat " + label for label, _ in runs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in sec["rows"]:
        cells = [str(row["value"]) + (f" ({row['input']})" if row.get("input") else "")]
        for m in METRICS:
            cells.append(pair(row[m]))
            cells += [pair(ours(find(rs, row["value"]), m)) for _, rs in runs]
        cells += [fmt((find(rs, row["value"]) or {}).get("offered_per_s"), 3) for _, rs in runs]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def section_plots(name: str, sec: dict, results: dict) -> list[str]:
    IMG.mkdir(parents=True, exist_ok=True)
    values = [r["value"] for r in sec["rows"]]
    numeric = all(isinstance(v, (int, float)) for v in values)
    xs = [float(v) for v in values] if numeric else [float(i) for i in range(len(values))]
    log_x = numeric and min(values) > 0 and max(values) / min(values) >= 50
    links = []
    for m in ("merged_objects_per_second", "cpu_clock_hz", "vmrss_kb"):
        # a row may say what to plot for a figure printed wrong (table 20's 356,578 for 35,658)
        shown = [r.get("plotted", {}).get(m, r[m]) for r in sec["rows"]]
        lines = [svg.Line("thesis", xs, [v[0] for v in shown], [v[1] for v in shown])]
        for label, res in results.items():
            got = [(x, ours(find(res.get(name, {}), v), m)) for x, v in zip(xs, values)]
            got = [(x, g) for x, g in got if g]
            if got:
                lines.append(svg.Line(f"flowstat {label}", [x for x, _ in got], [g[0] for _, g in got],
                                      [g[1] for _, g in got]))
        file = IMG / f"{name}-{m}.svg"
        file.write_text(svg.plot(f"{sec['section']} {TITLES[m][0]}: thesis and flowstat", sec["parameter"],
                                 titled(m), lines,
                                 None if numeric else [str(v) for v in values], log_x=log_x))
        links.append(f"![{sec['section']}: {TITLES[m][0]}, thesis and flowstat]({file.relative_to(OUT.parent)})")
    return links


def main() -> int:
    os.chdir(ROOT)
    thesis = yaml.safe_load(THESIS.read_text())["sections"]
    results = load_results()
    if not results:
        print(f"no campaign results: run benchmarks/run_campaigns.py first ({RESULTS['20 s']})", file=sys.stderr)
        return 2
    text = ["# The thesis's tables and flowstat's, side by side", "",
            "Made by `benchmarks/thesis_comparison.py` from the thesis's numbers "
            f"([{THESIS}](../{THESIS}), transcribed from its chapter 5) and flowstat's campaigns "
            "(`benchmarks/run_campaigns.py`, which runs `flowstat campaign` on every file of "
            "benchmark-harness/campaigns/). Every cell is mean ± standard deviation over the seconds of "
            "the steady state; flowstat's are over all the mergers together (section 5.5: the thesis's "
            "figures for several mergers are sums, too). What the numbers mean and why they differ: "
            "[thesis-comparison.md](thesis-comparison.md). The tables give the thesis's numbers as printed; "
            "its plots show table 20's 356,578 merged/s at 425 producers as 35,658, the falling rate its "
            "text describes.", ""]
    for label, path in RESULTS.items():
        if path.exists():
            data = json.loads(path.read_text())
            machine = next(iter(data["campaigns"].values()))["machine"]
            text.append(f"- flowstat {label}: `{path}`, {machine['cpus']} CPUs ({machine['cpu_model']}), Linux "
                        f"{machine['kernel']}, campaigns: {', '.join(data['campaigns'])}")
    text.append("")
    for name, sec in thesis.items():
        text += [f"## {sec['section']} {sec['title']} (thesis tables {', '.join(map(str, sec['tables'].values()))})",
                 "", sec["setup"] + ".", ""]
        text += section_table(name, sec, results) + [""]
        text += section_plots(name, sec, results) + [""]
    OUT.write_text("\n".join(text))
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
