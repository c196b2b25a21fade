"""Recorded runs as Prometheus TSDB blocks (``flowstat replay RUN --prometheus DIR``): past runs
browsable beside live ones.

The samples and self-samples of each run file are written as OpenMetrics with timestamps (the
families of flowstat.schema.prometheus, each family's samples together, one temporary file per
family while the run files are read once), then ``promtool tsdb create-blocks-from openmetrics``
turns that into blocks in DIR: a Prometheus server's ``--storage.tsdb.path``, or a folder whose
blocks are moved into it (Prometheus picks them up at its next compaction, or restart).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from flowstat.schema import prometheus, runfile
from flowstat.schema import sample as sample_schema
from flowstat.schema.runfile import FileReport


class BlocksError(RuntimeError):
    """promtool is missing, or refused what it was given: the message says which."""


def _stamp(ns: int) -> str:
    return f" {ns // 1_000_000_000}.{ns // 1_000_000 % 1000:03d}"  # seconds, to the millisecond


class _FamilyFiles:
    """One temporary file per family, in which its samples gather as the runs are read."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.files: dict[str, IO[str]] = {}

    def add(self, family: prometheus.Family, lines: list[str]) -> None:
        if not lines:
            return
        f = self.files.get(family.name)
        if f is None:
            f = self.files[family.name] = open(self.folder / family.name, "w")
        f.write("\n".join(lines) + "\n")

    def join(self, out: IO[str], families: tuple[prometheus.Family, ...]) -> None:
        for family in families:
            f = self.files.pop(family.name, None)
            if f is None:
                continue
            f.close()
            out.write("\n".join(prometheus.family_head(family, True)) + "\n")
            with open(self.folder / family.name) as lines:
                shutil.copyfileobj(lines, out)


def write_openmetrics(
    paths: list[Path], out: IO[str], work: Path, progress: Callable[[int], Any] | None = None
) -> list[FileReport]:
    """The runs' samples and self-samples as one OpenMetrics text with timestamps, ending # EOF."""
    families = _FamilyFiles(work)
    reports = []
    for path in paths:
        report = FileReport(str(path))
        done = 0
        for doc, _values, _keys, _layout, _raw, ns in runfile.samples(path, report):
            stamp = _stamp(ns)
            for family in prometheus.NODE_FAMILIES:
                families.add(family, prometheus.sample_lines(family, doc, prometheus.NODE_LABELS, stamp))
            if progress is not None:
                progress(report.bytes_read - done)
                done = report.bytes_read
        for doc in report.self_samples:
            stamp = _stamp(sample_schema.time_ns(doc["time"]))
            for family in prometheus.AGENT_FAMILIES:
                families.add(family, prometheus.sample_lines(family, doc, prometheus.AGENT_LABELS, stamp))
        reports.append(report)
    families.join(out, prometheus.NODE_FAMILIES + prometheus.AGENT_FAMILIES)
    out.write("# EOF\n")
    return reports


def create_blocks(paths: list[Path], folder: Path, progress: Callable[[int], Any] | None = None) -> list[FileReport]:
    """Write the runs as TSDB blocks into ``folder`` (made if missing)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise BlocksError("promtool is not on the PATH (Debian: apt-get install prometheus)")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="flowstat-blocks-") as tmp:
        text = Path(tmp) / "runs.om"
        work = Path(tmp) / "families"
        work.mkdir()
        with open(text, "w") as out:
            reports = write_openmetrics(paths, out, work, progress)
        done = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BlocksError(f"promtool refused the runs' OpenMetrics: {(done.stderr or done.stdout).strip()[-500:]}")
    return reports
