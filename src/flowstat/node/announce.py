"""A node's endpoint file: how agents watching a directory (--endpoints-dir) find it.

One file per node, ``<node_id>.<pid>.json``, an endpoints document (schema/endpoints.schema.json)
naming that one node. Written atomically (a dot-file renamed into place: an agent never reads half a
file) once the control socket is bound; removed when the node stops cleanly and never otherwise, so
that an agent that finds the process gone tells a clean stop (file gone: STOPPED) from a death (file
left: DOWN).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from flowstat.schema import endpoints as endpoints_schema

DIR_VAR = "FLOWSTAT_ENDPOINTS_DIR"  # where nodes announce themselves when not told in code


def file_name(node_id: str, pid: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', node_id)}.{pid}.json"


def directory(given: str | os.PathLike[str] | None) -> Path | None:
    """The directory given, or else the environment's, or none (no announcement)."""
    if given is not None:
        return Path(given)
    from_env = os.environ.get(DIR_VAR)
    return Path(from_env) if from_env else None


def announce(folder: Path, node: dict[str, object], run_id: str = "") -> Path:
    """Write ``node``'s endpoint file in ``folder`` (made if missing); its path."""
    document: dict[str, object] = {"nodes": [node]}
    if run_id:
        document["run_id"] = run_id
    problems = endpoints_schema.validate(document)
    if problems:
        raise ValueError(f"endpoint file for {node.get('node_id')!r}: {'; '.join(problems)}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(str(node["node_id"]), int(str(node["pid"])))
    partial = folder / f".{path.name}.tmp"
    partial.write_text(json.dumps(document) + "\n")
    os.chmod(partial, 0o644)
    os.replace(partial, path)
    return path


def withdraw(path: Path | None) -> None:
    """Remove an endpoint file this node wrote; one already gone is not an error."""
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
