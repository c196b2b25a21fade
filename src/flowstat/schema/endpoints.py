"""Where nodes answer (endpoints.schema.json beside this file): what flowstat run writes as
RUN_DIR/endpoints.json and both agents read to find their targets. The C agent reads the same
fields (collectors/c/agent/targets.c; tests/test_endpoints.py holds both agents to this schema)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import _files
from ._check import problems

SCHEMA_FILE = "endpoints.schema.json"


def schema() -> dict[str, Any]:
    return _files.load(SCHEMA_FILE)


def validate(doc: object) -> list[str]:
    """Everything wrong with an endpoints document, naming the field by its path; [] when it conforms."""
    return problems(doc, schema())


def document(run_id: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """An endpoints document (ValueError when a node does not conform: a bug of the writer's)."""
    doc = {"run_id": run_id, "nodes": [{k: v for k, v in n.items() if v is not None} for n in nodes]}
    errors = validate(doc)
    if errors:
        raise ValueError(f"endpoints of {run_id}: {'; '.join(errors[:3])}")
    return doc


def read(path: str | Path) -> tuple[str, list[dict[str, Any]], list[str]]:
    """The run id and the conforming nodes of an endpoints file, and what is wrong with the rest (a
    node that does not conform is left out, the others kept); OSError and ValueError (not JSON, not
    an endpoints document at all) for a file that cannot be read."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise ValueError("not an endpoints document: a JSON object with a list `nodes` (endpoints.schema.json)")
    node_schema = schema()["properties"]["nodes"]["items"]
    good: list[dict[str, Any]] = []
    bad: list[str] = []
    for i, node in enumerate(doc["nodes"]):
        wrong = problems(node, node_schema, f"nodes[{i}]")
        if wrong:
            bad.append("; ".join(wrong))
        else:
            good.append(node)
    run_id = doc.get("run_id")
    return (run_id if isinstance(run_id, str) else ""), good, bad
