"""The schema files, read as package data: they travel in the wheel, and the C agent's build reads
the same files from the source tree."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any


@cache
def load(name: str) -> dict[str, Any]:
    """A schema file of this package, parsed (once)."""
    doc: dict[str, Any] = json.loads(files(__package__).joinpath(name).read_text(encoding="utf-8"))
    return doc
