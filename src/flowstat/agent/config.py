"""The agent's configuration files: ``--config FILE`` (the service's: /etc/flowstat/agent.toml),
then ``agent.d/*.toml`` beside it (or ``--config-dir DIR``), in name order.

The keys, their types and ranges are the schema's (flowstat/schema/agent-config.schema.json), which
the C agent compiles too: both agents resolve the same files to the same settings
(tests/test_agent_config.py holds them equal). TOML is read by ``tomllib``; as it gives no
positions, a key's line is found in the file's text (keys are bare, one a line, in the subset both
agents take: no tables, dates or multi-line strings). A later file's scalar replaces an earlier
one's, lists add up across files, and a flag on the command line wins over every file.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

from flowstat.schema import agent_config

SERVICE_FILE = Path("/etc/flowstat/agent.toml")
DROP_INS = "agent.d"  # beside the config file: *.toml, in name order
_VARIABLE = re.compile(r"\$\$\{|\$\{([^}]*)\}?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_LINE = r"^\s*{}\s*="
_UNITS = {"s": "seconds", "MB": "megabytes", "KiB": "kibibytes"}


class ConfigError(ValueError):
    """What is wrong, and where: ``FILE:LINE: KEY: why`` (as the C agent says it)."""


def schema() -> dict[str, dict[str, Any]]:
    """Each key's schema, by key."""
    return agent_config.keys()


def dest(key: str) -> str:
    """The argparse destination of a key's flag (--endpoints-dir: endpoints_dir)."""
    return str(schema()[key]["x-flag"]).removeprefix("--").replace("-", "_")


@dataclass
class Settings:
    """What the files say: each key's value, and where it was last set (a list: where its first
    item came from)."""

    values: dict[str, Any] = field(default_factory=dict)
    places: dict[str, str] = field(default_factory=dict)


def read(config: str | None, config_dir: str | None, env: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``config`` then of every ``*.toml`` in ``config_dir`` (default: agent.d beside
    ``config``, when it exists); ConfigError at the first thing wrong."""
    env = os.environ if env is None else env
    files: list[Path] = [Path(config)] if config else []
    folder = Path(config_dir) if config_dir else (Path(config).parent / DROP_INS if config else None)
    if folder is not None and (config_dir or folder.is_dir()):
        if not folder.is_dir():
            raise ConfigError(f"{folder}: not a directory")
        files += sorted((p for p in folder.glob("*.toml") if not p.name.startswith(".")), key=lambda p: p.name)
    settings = Settings()
    for path in files:
        _merge(settings, _read_file(path, env))
    return settings


def _merge(settings: Settings, found: dict[str, tuple[Any, str]]) -> None:
    for key, (value, place) in found.items():
        if schema()[key].get("x-list") and key in settings.values:
            settings.values[key] = settings.values[key] + value  # a drop-in adds to a list
        else:
            settings.values[key] = value
            settings.places[key] = place


def _read_file(path: Path, env: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    lines = text.splitlines()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(_syntax_error(path, str(exc), lines)) from None
    found = {}
    for key, raw in doc.items():
        line = _line_of(lines, key)
        place = f"{path}:{line}"
        _check_form(lines, line, key, raw, place)
        if key not in schema():
            raise ConfigError(f"{place}: {key}: unknown key (known: {', '.join(sorted(schema()))})")
        found[key] = (_value(key, _expand(raw, env, place, key), place), place)
    return found


def _syntax_error(path: Path, message: str, lines: list[str]) -> str:
    """tomllib's "Invalid value (at line 3, column 10)" as "FILE:3: invalid value" (with the key
    the line sets, when it sets one: "FILE:3: interval: cannot overwrite a value")."""
    m = re.search(r"\(at line (\d+), column \d+\)$", message)
    why = message[: m.start()].strip() if m else message
    why = why[:1].lower() + why[1:]
    if m is None:
        return f"{path}: {why}"
    n = int(m.group(1))
    key = re.match(r"^\s*([A-Za-z0-9_-]+)\s*=", lines[n - 1]) if 0 < n <= len(lines) else None
    if key and why == "cannot overwrite a value":
        why = "set twice in one file"
    return f"{path}:{n}: {key.group(1) + ': ' if key else ''}{why}"


def _line_of(lines: list[str], key: str) -> int:
    """The line setting ``key`` (1-based), or of its table's header for a table."""
    for pattern in (_KEY_LINE.format(re.escape(key)), rf"^\s*\[+\s*{re.escape(key)}\b", rf"^\s*{re.escape(key)}\s*\."):
        for n, line in enumerate(lines, 1):
            if re.match(pattern, line):
                return n
    return next((n for n, line in enumerate(lines, 1) if key in line), 0)  # a quoted key


def _check_form(lines: list[str], line: int, key: str, raw: Any, place: str) -> None:
    """What TOML allows and flowstat's agent config (both agents) does not."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    unsupported = "not supported by flowstat's agent config"
    if isinstance(raw, dict):
        form = (
            "a table"
            if text.lstrip().startswith("[")
            else "a dotted key"
            if "." in text.split("=")[0]
            else "an inline table"
        )
        raise ConfigError(f"{place}: {key}: {form} is {unsupported}")
    if not re.match(_KEY_LINE.format(re.escape(key)), text):
        raise ConfigError(f"{place}: {key}: a quoted key is {unsupported}")
    if '"""' in text or "'''" in text:
        raise ConfigError(f"{place}: {key}: a multi-line string is {unsupported}")
    items = raw if isinstance(raw, list) else [raw]
    if any(isinstance(v, datetime | date | time) for v in items):
        raise ConfigError(f"{place}: {key}: a date or time is {unsupported}")
    if any(isinstance(v, list | dict) for v in items) and isinstance(raw, list):
        raise ConfigError(f"{place}: {key}: an array may hold only strings, numbers and booleans")


def _expand(raw: Any, env: Mapping[str, str], place: str, key: str) -> Any:
    """${NAME} in strings: the environment's NAME ($${ is a literal ${)."""
    if isinstance(raw, list):
        return [_expand(v, env, place, key) for v in raw]
    if not isinstance(raw, str):
        return raw

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name = m.group(1)
        if not m.group(0).endswith("}") or name is None or not _NAME.fullmatch(name):
            raise ConfigError(f"{place}: {key}: {m.group(0)!r} is not a ${{NAME}} reference")
        if name not in env:
            raise ConfigError(f"{place}: {key}: ${{{name}}} is not set in the environment")
        return env[name]

    return _VARIABLE.sub(one, raw)


def _value(key: str, raw: Any, place: str) -> Any:
    """The value of ``key`` checked against the schema: a list key takes an array or one scalar."""
    spec = schema()[key]
    if spec.get("x-list"):
        items = raw if isinstance(raw, list) else [raw]
        return [_scalar(key, spec["items"], v, place) for v in items]
    if isinstance(raw, list):
        raise ConfigError(f"{place}: {key}: expected {_kind(spec)}, got an array")
    return _scalar(key, spec, raw, place)


def _kind(spec: dict[str, Any]) -> str:
    return {"number": "a number", "integer": "an integer", "string": "a string", "boolean": "true or false"}[
        spec["type"]
    ]


def _scalar(key: str, spec: dict[str, Any], v: Any, place: str) -> Any:
    kind = spec["type"]
    ok = (
        (kind == "boolean" and isinstance(v, bool))
        or (kind == "string" and isinstance(v, str))
        or (kind == "number" and isinstance(v, int | float) and not isinstance(v, bool))
        or (kind == "integer" and isinstance(v, int) and not isinstance(v, bool))
        or (kind == "integer" and isinstance(v, float) and v.is_integer())
    )
    if not ok:
        raise ConfigError(f"{place}: {key}: expected {_kind(spec)}, got {v!r}")
    if kind == "integer":
        v = int(v)
    if kind in ("number", "integer"):
        lo, hi = spec.get("minimum", -math.inf), spec.get("maximum", math.inf)
        if not (math.isfinite(v) and lo <= v <= hi):
            bounds = f"between {lo:g} and {hi:g}" if math.isfinite(hi) else f">= {lo:g}"
            unit = _UNITS.get(spec.get("x-unit", ""), "a value")
            raise ConfigError(f"{place}: {key}: expected {unit} {bounds}, got {v:g}")
    if "enum" in spec and v not in spec["enum"]:
        raise ConfigError(f"{place}: {key}: expected one of {', '.join(spec['enum'])}, got {v!r}")
    if kind == "string" and len(v) > spec.get("maxLength", math.inf):
        raise ConfigError(f"{place}: {key}: longer than the limit of {spec['maxLength']} characters")
    return v


def resolve(flags: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """Every key's setting: the flag's when given (not None), else the files', else the schema's
    default (lists: [], strings: None)."""
    out: dict[str, Any] = {}
    for key, spec in schema().items():
        flag = flags.get(dest(key))
        if flag is not None and flag != []:
            out[key] = list(flag) if spec.get("x-list") else flag
        elif key in settings.values:
            out[key] = settings.values[key]
        else:
            out[key] = [] if spec.get("x-list") else spec.get("default")
    return dict(sorted(out.items()))
