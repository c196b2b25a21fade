"""Run files made from others: a run copied to many nodes and samples, as an agent would have
written it (benchmarks of the report and the views, tests of many nodes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import orjson

from flowstat.schema import run as run_schema
from flowstat.schema import runfile
from flowstat.schema.sample import time_ns
from flowstat.timeutil import iso_utc_ms

SELF_SAMPLE_TICKS = 5  # synthesize: a self-sample line every 5 ticks (the agents' default, at 1 sample/s)


def synthesize(
    source: Path,
    out: Path,
    nodes: int,
    samples: int,
    *,
    run_id: str | None = None,
    parameters: dict | None = None,
    shift_s: float = 0.0,
) -> int:
    """A run directory ``out`` with ``nodes`` x ``samples`` samples replicated from the run in
    ``source`` (written tick by tick, as an agent writes them, with its self-sample lines between
    them); returns how many samples it holds.
    ``run_id`` and ``parameters`` (merged into the source's) relabel the copy, ``shift_s`` moves its
    times (several runs made from one)."""
    report = runfile.FileReport(str(source / "samples.ndjson"))
    by_node: dict[str, list[tuple[int, dict]]] = {}
    for doc, _, _, _, _, ns in runfile.samples(source / "samples.ndjson", report):
        if "vmrss_kb" in doc:  # a node's last sample, once it is gone, holds no metric: not repeated
            by_node.setdefault(doc["node_id"], []).append((ns, doc))
    real = sorted(by_node)
    copies = [(f"{node}~{k}", by_node[node]) for k in range(math.ceil(nodes / len(real))) for node in real][:nodes]
    shift_ns = round(shift_s * 1e9)
    first = min(s[0][0] for s in by_node.values())
    period_ns = max(s[-1][0] for s in by_node.values()) - first + 10**9  # a repeat starts a second after the last
    relabel = {"run_id": run_id} if run_id else {}
    out.mkdir(parents=True)
    stamps: dict[int, str] = {}
    with open(out / "samples.ndjson", "wb") as f:
        if report.header:
            header = {
                **report.header,
                **relabel,
                "parameters": {**report.header.get("parameters", {}), **(parameters or {})},
            }
            if "started" in header:
                header["started"] = _moved(header["started"], shift_ns)
            f.write(orjson.dumps({"flowstat_run": header}) + b"\n")
        for i in range(samples):
            for name, series in copies:
                ns, doc = series[i % len(series)]
                ns += i // len(series) * period_ns + shift_ns
                stamp = stamps.get(ns) or stamps.setdefault(ns, iso_utc_ms(ns / 1e9))
                f.write(orjson.dumps({**doc, **relabel, "time": stamp, "node_id": name, "seq": i}) + b"\n")
            if report.self_samples and i % SELF_SAMPLE_TICKS == SELF_SAMPLE_TICKS - 1:  # as the agent's own
                k = i // SELF_SAMPLE_TICKS
                own = report.self_samples[k % len(report.self_samples)]
                f.write(orjson.dumps({"flowstat_agent": {**own, **relabel, "time": stamp, "seq": k}}) + b"\n")
    last = max(
        series[(samples - 1) % len(series)][0] + (samples - 1) // len(series) * period_ns for _, series in copies
    )
    doc = json.loads((source / "run.json").read_text())
    scale = (last - first) / 1e9 / doc["summary"]["seconds"]
    doc.update(relabel)
    doc["parameters"].update(parameters or {})
    doc["parameters"]["duration_s"] = round(doc["parameters"]["duration_s"] * scale, 3)
    doc["summary"]["seconds"] = round(doc["summary"]["seconds"] * scale, 3)
    doc["started"] = _moved(doc["started"], shift_ns)
    doc["finished"] = iso_utc_ms((last + shift_ns) / 1e9)
    doc["nodes"] = [name for name, _ in copies]
    doc["label"] = run_schema.label(doc)
    (out / "run.json").write_text(json.dumps(doc, indent=1))
    return samples * len(copies)


def _moved(stamp: str, shift_ns: int) -> str:
    return iso_utc_ms((time_ns(stamp) + shift_ns) / 1e9) if shift_ns else stamp
