"""make mutate: mutation testing of the code where a bug loses or misreports data.

mutmut (configured in pyproject.toml's [tool.mutmut]) makes small changes to the functions named
in SCOPE, one at a time, and runs the unit tests that call each function; a change no test
notices "survives". This script runs it afresh (mutmut keeps results of earlier runs, which would
hide what new tests kill) and writes, per part of the code, how many changes were caught, with
every survivor's diff, to benchmarks/results/mutation.json. A survivor that cannot change any
result (an equivalent mutant) is listed with the reason in tests/mutants-equivalent.toml and left
out of the score (mutation.json lists it with its diff; the reason is the .toml's, by name). Exit
status 1 when a part is below TARGET.

    .venv/bin/python -m flowstat_lab.mutate [--only PART] [--out FILE]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from importlib.metadata import version
from pathlib import Path

from flowstat_lab import ROOT

TARGET = 0.90  # of non-equivalent mutants killed, in each part
EQUIVALENTS = ROOT / "tests" / "mutants-equivalent.toml"

# The parts judged: mutmut's names of the mutants of each (fnmatch patterns; "xǁClassǁmethod" for a
# method, "x_function" for a function).
SCOPE: dict[str, list[str]] = {
    "conservation summary": ["flowstat.harness.conservation.*"],
    "merger sequence checks": [
        f"flowstat.harness.merging.sequences.xǁSequencesǁ{m}__mutmut_*"
        for m in ("check_sequences", "check_sequence", "on_eos")
    ],
    "schema encoding": ["flowstat.schema.lineprotocol.*"]
    + [
        f"flowstat.schema.sample.{f}__mutmut_*"
        for f in (
            "x_from_control_reply",
            "x_time_ns",
            "x__line_plan",
            "x__series",
            "x_to_line_protocol",
            "x__getter",
            "xǁLayoutǁline",
            "x_layout",
            "x_to_json",
            "x_document_id",
        )
    ],
    "replay validation": [
        f"flowstat.schema.runfile.{f}__mutmut_*"
        for f in (
            "x_field_types",
            "x_bad_field",
            "x_spans",
            "x_samples",
            "x__keep_self_sample",
            "x__conforming",
            "x__run_json",
            "x_run_document",
        )
    ],
    "Python spool": ["flowstat.agent.spool.*"],
}


def mutmut(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", *args], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    if out.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args[:1])} failed (exit {out.returncode}):\n{out.stdout[-3000:]}")
    return out.stdout


def statuses() -> dict[str, str]:
    """Every mutant's name and status (killed, survived, timeout, no tests, not checked...)."""
    found = {}
    for line in mutmut("results", "--all", "true").splitlines():
        m = re.match(r"\s+(\S+): (.+)$", line)
        if m:
            found[m.group(1)] = m.group(2).strip()
    return found


def diff(name: str) -> str:
    """The mutant's changed lines, their common indentation taken out (after the + or -)."""
    lines = [
        line for line in mutmut("show", name).splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    indent = min((len(x) - 1 - len(x[1:].lstrip()) for x in lines if x[1:].strip()), default=0)
    return "\n".join(x[:1] + x[1 + indent :] for x in lines)


def equivalents() -> dict[str, str]:
    """The mutants known to change nothing, by name, with why (tests/mutants-equivalent.toml)."""
    if not EQUIVALENTS.exists():
        return {}
    data = tomllib.loads(EQUIVALENTS.read_text())
    return {name: entry["why"] for name, entry in data.get("mutant", {}).items()}


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", choices=sorted(SCOPE), action="append", help="judge only this part (repeatable)")
    p.add_argument(
        "--out",
        type=Path,
        help="default benchmarks/results/mutation.json; with --only, benchmarks/results/raw/mutation-only.json "
        "(a part judged alone does not replace the whole's figures)",
    )
    p.add_argument("--max-children", type=int, default=os.cpu_count() or 2, help="mutants run at once")
    args = p.parse_args()
    results = ROOT / "benchmarks" / "results"
    args.out = args.out or (results / "raw" / "mutation-only.json" if args.only else results / "mutation.json")
    parts = {k: v for k, v in SCOPE.items() if not args.only or k in args.only}
    patterns = [pat for pats in parts.values() for pat in pats]

    shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # a fresh run: cached verdicts predate the tests
    started = time.monotonic()
    print(f"mutmut over {', '.join(parts)} (a few minutes)...", flush=True)
    mutmut("run", "--max-children", str(args.max_children), *patterns)
    found = statuses()
    known = equivalents()

    report: dict = {
        "tool": f"mutmut {version('mutmut')}",
        "target": TARGET,
        "parts": {},
        "survivors": [],
        "equivalent": {},  # by part: {mutant: diff}
        "seconds": round(time.monotonic() - started, 1),
    }
    failed = []
    judged_all = caught_all = 0
    for part, pats in parts.items():
        names = sorted(n for n in found if any(fnmatch.fnmatch(n, pat) for pat in pats))
        if not names:
            raise SystemExit(f"{part}: no mutants match {pats} (a function renamed? update SCOPE)")
        counts: dict[str, int] = {}
        for n in names:
            status = "equivalent" if n in known and found[n] == "survived" else found[n]
            counts[status] = counts.get(status, 0) + 1
            if status == "survived":
                report["survivors"].append({"part": part, "mutant": n, "diff": diff(n)})
            elif status == "equivalent":
                # why: tests/mutants-equivalent.toml, under the same name (not copied: the file is committed too)
                report["equivalent"].setdefault(part, {})[n] = diff(n)
        judged = len(names) - counts.get("equivalent", 0)
        caught = counts.get("killed", 0) + counts.get("timeout", 0)
        score = caught / judged if judged else 1.0
        judged_all, caught_all = judged_all + judged, caught_all + caught
        report["parts"][part] = {"mutants": len(names), **dict(sorted(counts.items())), "score": round(score, 4)}
        print(
            f"  {part:24} {caught:4} of {judged:4} caught  {score:6.1%}"
            + (f"  ({counts['equivalent']} equivalent)" if counts.get("equivalent") else "")
        )
        if score < TARGET:
            failed.append(part)
    in_scope = {n for n in known if any(fnmatch.fnmatch(n, pat) for pat in patterns)}
    stale = sorted(in_scope - {n for found_in in report["equivalent"].values() for n in found_in})
    if stale:  # listed as equivalent, but now killed or gone: the list must be kept true
        report["stale_equivalents"] = stale
        print(f"  {len(stale)} mutants listed in {EQUIVALENTS.name} are no longer survivors: {', '.join(stale[:5])}")
    report["score"] = round(caught_all / judged_all, 4) if judged_all else 1.0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, separators=(",", ":"), ensure_ascii=False) + "\n")  # compact: tracked
    for s in report["survivors"]:
        print(f"survived: {s['mutant']}\n{s['diff']}")
    print(f"score {report['score']:.1%} ({caught_all} of {judged_all}); {args.out}")
    if failed:
        print(f"below the target of {TARGET:.0%}: {', '.join(failed)}")
    return 1 if failed or stale else 0


if __name__ == "__main__":
    sys.exit(main())
