"""docs/buffer-one.md's results, docs/soak.md and their plots are what the tracked summaries make."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from types import ModuleType

from support.common import ROOT


def benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py (a script, not a package's module)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_buffer_one_s_results_and_plot_are_its_tracked_summary_s():
    b = benchmark("buffer_one")
    results = json.loads(b.RESULTS.read_text())
    doc = b.DOC.read_text()
    assert doc[doc.index("## Results") :] == b.results_section(results)
    assert b.SVG.read_text() == b.svg_plot(results["runs"])


def test_the_soak_s_page_and_plot_are_its_tracked_summary_s():
    """As `bench_soak.py --render benchmarks/results/soak.json` makes them, the summary included."""
    s = benchmark("bench_soak")
    results = json.loads(s.SUMMARY.read_text())
    results["verdicts"] = s.verdicts(results)  # judged again, as --render judges
    summary = {**s.summary(results), "file": str(s.SUMMARY.relative_to(ROOT))}
    assert json.dumps(summary, separators=(",", ":")) + "\n" == s.SUMMARY.read_text()
    assert (ROOT / "docs" / "soak.md").read_text() == s.soak_section(summary)
    assert s.SVG.read_text() == s.svg_page(summary)


def test_a_results_file_names_no_folder_of_the_machine_it_ran_on():
    """A path on a benchmark's command line is kept relative to the checkout, or by its name alone
    when outside it; every tracked summary's command is so."""
    command_line = benchmark("run_benchmarks").command_line
    argv = [str(ROOT / "benchmarks" / "bench_x.py"), "--out=/tmp/a/x.json", "--out", "/srv/y.json", "-n", "3"]
    assert command_line(argv) == "benchmarks/bench_x.py --out=x.json --out y.json -n 3"
    commands = {p.name: json.loads(p.read_text()).get("command", "") for p in ROOT.glob("benchmarks/results/*.json")}
    assert {name: c for name, c in commands.items() if re.search(r"(^|[ =])/", c)} == {}
