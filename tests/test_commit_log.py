"""The log is read: commit subjects of at most 72 characters (the why and the figures go in the
body), from the first commit that kept to it on."""

from __future__ import annotations

import subprocess

import pytest

from support.common import ROOT

SINCE = "3598045"  # the first commit of the short subjects; those before it are history
LIMIT = 72


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_every_commit_subject_since_the_rule_fits_in_72_characters():
    if _git("cat-file", "-e", f"{SINCE}^{{commit}}").returncode != 0:
        pytest.skip(f"a clone without {SINCE} (shallow): nothing to read")
    subjects = _git("log", "--format=%s", f"{SINCE}~1..HEAD").stdout.splitlines()
    assert subjects and all(len(s) <= LIMIT for s in subjects), [s for s in subjects if len(s) > LIMIT]
