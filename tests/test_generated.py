"""The repository's generated files (flowstat.generate): current, marked, and listed apart from the
hand-written ones; and every path a doc names exists."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys

from flowstat import generate
from support.common import ROOT

COMMENTABLE = (".yaml", ".yml", ".conf", ".iql", ".md", ".svg")  # formats that take a comment


def tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()


def test_every_derived_file_and_gitattributes_are_current():
    out = subprocess.run(
        [sys.executable, "-m", "flowstat.generate", "--check", str(ROOT)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_generated_file_says_so_where_its_format_allows():
    files = tracked()
    derived = [str(p) for p in generate.derived(ROOT)]
    measured = [f for f in files if any(fnmatch.fnmatch(f, g) for g in generate.MEASURED)]
    assert len(derived) > 30 and len(measured) > 20  # measured: the results files (docs/campaigns/ not tracked)
    for path in derived + measured:
        if path.endswith(COMMENTABLE) and path != str(generate.SCHEMA_DOC):
            head = "\n".join((ROOT / path).read_text().splitlines()[:3])
            assert "do not edit" in head.lower(), path
    # docs/schema.md is half people's: its generated part says where it begins
    assert generate.SCHEMA_DOC_TAIL in (ROOT / generate.SCHEMA_DOC).read_text()


def test_hand_written_files_beside_generated_ones_are_not_in_the_lists():
    for path in (
        "index-templates/elasticsearch/install.sh",
        "pipelines/telegraf/procstat-fallback.conf",
        "index-templates/README.md",
        "dashboards/grafana/provisioning/dashboards/README.md",
    ):
        if (ROOT / path).exists():
            assert not generate.is_generated(path, ROOT), path
            assert "make generate" not in (ROOT / path).read_text().splitlines()[0], path
    # and what the lists name exists
    assert all((ROOT / p).exists() for p in generate.derived(ROOT))
    attributes = (ROOT / ".gitattributes").read_text()
    assert "index-templates/elasticsearch/install.sh" not in attributes


# -- paths the docs name ----------------------------------------------------------------------------
DOC_PATH = re.compile(
    r"(?<![\w./-])((?:src|docs|tests|benchmarks|benchmark-harness|collectors|pipelines|dashboards|"
    r"index-templates|scripts|lab)/[\w./*-]*[\w/*])"
)
NOT_REPO = {"benchmarks/results/raw", "docs/campaigns"}  # prefixes of what a command writes, not tracked


def test_every_repository_path_a_doc_or_readme_names_exists():
    """Each path under a top-level folder of the repository that a README or a doc names (in text,
    code or links): a file or folder of the checkout, or a glob that matches one."""
    docs = [f for f in tracked() if f.endswith(".md") and not f.startswith("docs/campaigns/")]
    missing = []
    for doc in docs:
        for found in DOC_PATH.findall((ROOT / doc).read_text()):
            path = found.rstrip(".")
            if any(path.startswith(p) for p in NOT_REPO) or "RUN" in path or "ID" in path:
                continue
            if not (list(ROOT.glob(path)) if any(c in path for c in "*?[") else (ROOT / path).exists()):
                missing.append(f"{doc}: {path}")
    assert not missing, missing
