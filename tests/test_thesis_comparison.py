"""docs/thesis-comparison-tables.md and its plots are made from committed data (the thesis's numbers,
the campaigns' results): made again, they are the same."""

from __future__ import annotations

import importlib.util
import os

from support.common import ROOT


def test_the_committed_comparison_is_what_the_script_makes(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("thesis_comparison", ROOT / "benchmarks" / "thesis_comparison.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path / "docs" / "thesis-comparison-tables.md")
    monkeypatch.setattr(module, "IMG", tmp_path / "docs" / "img" / "thesis")
    cwd = os.getcwd()
    try:
        assert module.main() == 0
    finally:
        os.chdir(cwd)
    made = (tmp_path / "docs" / "thesis-comparison-tables.md").read_text()
    assert made == (ROOT / "docs" / "thesis-comparison-tables.md").read_text(), \
        "stale: run benchmarks/thesis_comparison.py"
    for svg in (tmp_path / "docs" / "img" / "thesis").glob("*.svg"):
        assert svg.read_text() == (ROOT / "docs" / "img" / "thesis" / svg.name).read_text(), svg.name
    assert len(list((tmp_path / "docs" / "img" / "thesis").glob("*.svg"))) == 18
