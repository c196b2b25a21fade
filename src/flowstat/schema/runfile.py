"""Reading a run file (RUN_DIR/samples.ndjson: a header line, then one sample a line) and the run
document beside it: the one reader of replay and of the report.

Millions of lines: a line's checks come from its schema.Layout, worked out once per key order and
value types, so a good sample costs a few C-level calls. A malformed or truncated line is recorded
in the FileReport with its line number and why, and skipped; every good line is still read. A
large file can be read in parts, in parallel: ``spans`` cuts it at line starts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from . import agent as agent_schema
from . import flow as flow_schema
from . import run as run_schema
from ._check import INT64_MAX
from .sample import PY_TYPES, Layout, Values, fields, layout, time_ns

RUN_DOCUMENT = "run.json"  # beside the run file: the harness's run document

# One good sample: its document, its values (in the line's key order), its keys, its Layout,
# the line as read and its time in ns.
Sample = tuple[dict[str, Any], Values, tuple[str, ...], Layout, bytes, int]


@dataclass
class FileReport:
    path: str
    run_id: str | None = None
    header: dict[str, Any] | None = None
    good: int = 0
    lines: int = 0  # lines read, good, bad and the header
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    notes: list[str] = field(default_factory=list)  # what a person should know (an unusable run.json)
    first_time: str | None = None
    last_time: str | None = None
    nodes: set[str] = field(default_factory=set)
    run_ids: set[str] = field(default_factory=set)  # of the samples: one, unless files were put together
    host: str | None = None
    bytes_read: int = 0  # for a progress bar: the file is read once, its size comes from stat()
    shift_ns: int = 0  # replay --rebase-time: how far the samples were moved
    self_samples: list[dict[str, Any]] = field(default_factory=list)  # the agent's self-samples (a few a minute)
    edge_counts: list[dict[str, Any]] = field(default_factory=list)  # the agent's edge counters (flow_schema)


def field_types() -> tuple[dict[str, tuple[type, ...]], list[str]]:
    """Each field's accepted Python types, and the required fields."""
    return {f.name: PY_TYPES[f.type] for f in fields()}, [f.name for f in fields() if f.required]


_INTEGERS = frozenset(f.name for f in fields() if f.type == "integer")
_ENUMS = {f.name: frozenset(f.enum) for f in fields() if f.enum}
_PATTERNED = {f.name: f for f in fields() if f.pattern}


def bad_field(doc: dict[str, Any], types: dict[str, tuple[type, ...]], required: list[str]) -> str | None:
    """What is wrong with a sample, naming the field (schema.validate() explains more, for humans).
    The same checks as schema.Layout's, one field at a time: for the samples the layout cannot vouch for."""
    for key, value in doc.items():
        allowed = types.get(key)
        if allowed is None:
            return f"field {key!r}: not in the schema"
        if (
            type(value) not in allowed
            or (key in _INTEGERS and not 0 <= value <= INT64_MAX)
            or value != value
            or (key in _ENUMS and value not in _ENUMS[key])
            or (key in _PATTERNED and not _PATTERNED[key].matches(value))
        ):
            return f"field {key!r}: wrong type or value {value!r}"[:120]
    for key in required:
        if key not in doc:
            return f"field {key!r}: missing"
    return None


def spans(path: Path, parts: int) -> list[tuple[int, int]]:
    """The file cut into about ``parts`` byte ranges [start, end) of whole lines."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, parts):
            f.seek(max(cuts[-1], size * k // parts))
            f.readline()  # to the start of the next line
            if f.tell() < size:
                cuts.append(f.tell())
    return list(zip(cuts, cuts[1:] + [size], strict=False))


def samples(path: Path, report: FileReport, span: tuple[int, int] | None = None) -> Iterator[Sample]:
    """The run file's good samples, in file order (of the ``span`` of whole lines only, if given:
    its line numbers then count from its first line). The header goes to ``report.header``, each bad
    line to ``report.bad`` with its number; ``report`` counts what was read as it goes, and, at the
    end, holds the run id, host and first and last time of the samples (as they are then: a caller
    may change a sample's time before asking for the next)."""
    start, end = span or (0, None)
    length = end - start if end is not None else float("inf")
    types, required = field_types()
    # Lines come in a few layouts (one per node kind): the layout of a line's key order is kept with
    # the value types it was worked out for; a line whose types differ gets the layout of its own.
    layouts: dict[tuple[str, ...], tuple[tuple[type, ...], Layout]] = {}
    stamps: dict[str, int] = {}  # time string -> ns: every node sampled in one tick shares it
    first = last = None
    nodes, runs, loads, bad = report.nodes, report.run_ids, orjson.loads, report.bad.append
    base, read, lineno = report.bytes_read, 0, 0
    with open(path, "rb") as f:
        f.seek(start)
        for lineno, raw in enumerate(f, 1):
            if read >= length:
                lineno -= 1  # not read: the next span's
                break
            read += len(raw)
            try:
                doc = loads(raw)  # 3x faster than json on these lines, and strict (no NaN, no inf)
            except (ValueError, UnicodeDecodeError) as exc:
                why = "truncated line" if not raw.endswith(b"\n") else f"not JSON ({getattr(exc, 'msg', exc)})"
                bad((lineno, why))
                continue
            if type(doc) is not dict:
                bad((lineno, "not a JSON object"))
                continue
            values, keys = tuple(doc.values()), tuple(doc)
            value_types = tuple(map(type, values))
            known = layouts.get(keys)
            if known is not None and known[0] == value_types:
                lay = known[1]
            else:
                lay = layout(keys, value_types)
                layouts[keys] = (value_types, lay)
            ints = lay.integers(values)
            if not (
                lay.conforms
                and min(ints) >= 0
                and max(ints) <= INT64_MAX
                and (lay.enums is None or lay.enums(values) in lay.allowed)
                and (lay.patterned is None or lay.patterned(values))
            ):
                if "flowstat_run" in doc:
                    if lineno != 1 or start:
                        bad((lineno, "a run header that is not on the first line"))
                    else:
                        report.header = doc["flowstat_run"] if isinstance(doc["flowstat_run"], dict) else {}
                    continue
                if agent_schema.RUN_FILE_KEY in doc:
                    _keep_self_sample(doc, lineno, report)
                    continue
                if flow_schema.EDGE_RUN_FILE_KEY in doc:
                    _keep_edge_count(doc, lineno, report)
                    continue
                wrong = bad_field(doc, types, required)
                if wrong:
                    bad((lineno, wrong))
                    continue
            stamp = doc["time"]
            ns = stamps.get(stamp)
            if ns is None:
                try:
                    ns = time_ns(stamp)
                except ValueError:
                    bad((lineno, f"field 'time': not ISO-8601 ({stamp[:40]!r})"))
                    continue
                if len(stamps) > 65536:
                    stamps.clear()
                stamps[stamp] = ns
            if first is None:
                first = doc
            nodes.add(doc["node_id"])
            runs.add(doc["run_id"])
            report.good += 1
            report.bytes_read = base + read  # as of this sample: a caller may show progress
            yield doc, values, keys, lay, raw, ns
            last = doc
        report.lines += lineno
        report.bytes_read = base + read
    if first is not None:
        report.first_time, report.run_id, report.host = first["time"], first["run_id"], first["host"]
        assert last is not None  # set after the first sample's yield, as after every one
        report.last_time = last["time"]


def _keep_self_sample(line: dict[str, Any], lineno: int, report: FileReport) -> None:
    """A run file's self-sample line ({"flowstat_agent": {...}}): kept when it conforms, else
    reported by its line number and the field."""
    doc = line[agent_schema.RUN_FILE_KEY]
    if len(line) != 1 or not isinstance(doc, dict):
        report.bad.append((lineno, f"{agent_schema.RUN_FILE_KEY}: not a self-sample (one object alone on its line)"))
        return
    doc = agent_schema.upgraded(doc)
    errors = agent_schema.validate(doc)
    if errors:
        report.bad.append((lineno, f"{agent_schema.RUN_FILE_KEY}.{errors[0]}"[:160]))
    else:
        report.self_samples.append(doc)


def _keep_edge_count(line: dict[str, Any], lineno: int, report: FileReport) -> None:
    """A run file's edge counter line ({"flowstat_edge": {...}}): kept when it is an edge counter,
    else reported by its line number and the field."""
    key = flow_schema.EDGE_RUN_FILE_KEY
    doc = line[key]
    if len(line) != 1 or not isinstance(doc, dict):
        report.bad.append((lineno, f"{key}: not an edge counter (one object alone on its line)"))
        return
    errors = flow_schema.validate("edge", doc)
    if not errors and ("agent" not in doc or "objects_received" not in doc):
        errors = ["an edge counter has agent and objects_received"]
    if errors:
        report.bad.append((lineno, f"{key}.{errors[0]}"[:160]))
    else:
        report.edge_counts.append(doc)


def _conforming(doc: dict[str, Any], report: FileReport, source: str) -> dict[str, Any]:
    """``doc`` without the top-level fields that do not conform to the run schema (each named in
    the report's notes): what is good is kept. Missing required fields are the caller's to fill."""
    doc = dict(doc)
    # A key the schema does not know is left out first, by its name: an error's text is cut back to
    # its field below, which a key such as "a.b" would not survive (it was never left out: no end).
    for key in [k for k in doc if k not in run_schema.schema()["properties"]]:
        report.notes.append(f"{source}: {key}: not in the schema; left out of the run document")
        del doc[key]
    while errors := [e for e in run_schema.validate(doc) if not e.endswith("required field is missing")]:
        key = errors[0].split(":")[0].split(".")[0].split("[")[0]
        report.notes.append(f"{source}: {errors[0]}; left out of the run document")
        del doc[key]
    return doc


def _run_json(path: Path, report: FileReport) -> dict[str, Any]:
    """The harness's run document beside the run file, if there is one of this run."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        report.notes.append(f"{path}: cannot be read ({exc}); the run document comes from the run file")
        return {}
    if not isinstance(doc, dict) or doc.get("run_id") != report.run_id:
        what = f"run {doc.get('run_id')!r}" if isinstance(doc, dict) else "not a run document"
        report.notes.append(
            f"{path}: {what}, but the samples are of run {report.run_id!r}; the run document "
            f"comes from the run file"
        )
        return {}
    return doc


def run_document(report: FileReport, *, retime: Callable[[str], str] | None = None) -> dict[str, Any]:
    """The run's document, once the run file is read: the harness's run.json beside the run file,
    or, without one, what the run file's header says (run id, start, host, parameters); completed
    from the samples (start and end when missing, nodes, how many samples were read). ``retime``
    moves run.json's start and end as the samples were moved (replay --rebase-time). ValueError if
    the result does not conform, or if no sample was read (there is no run to describe)."""
    if report.run_id is None:
        raise ValueError(f"{report.path}: no good sample was read: no run to describe")
    run_fields = run_schema.schema()["properties"]
    path = Path(report.path).with_name(RUN_DOCUMENT)
    doc, source = _run_json(path, report) if path.exists() else {}, str(path)
    if not doc:
        doc, source = {k: v for k, v in (report.header or {}).items() if k in run_fields}, f"{report.path}:1"
    doc = _conforming({**doc, "run_id": report.run_id}, report, source)
    if retime:
        for key in ("started", "finished"):
            if key in doc:
                doc[key] = retime(doc[key])
    for key, value in (
        ("started", report.first_time),
        ("finished", report.last_time),
        ("host", report.host),
        ("nodes", sorted(report.nodes)),
    ):
        doc.setdefault(key, value)
    doc["samples"] = report.good
    doc.setdefault("label", run_schema.label(doc))
    errors = run_schema.validate(doc)
    if errors:  # what the samples filled in is ours: a bug, not the user's data
        raise ValueError(f"{report.path}: the run document does not conform: {errors[0]}")
    return doc
