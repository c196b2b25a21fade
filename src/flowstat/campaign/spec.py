"""Campaign files: one topology, one parameter swept over its configurations.

A campaign is what the thesis's chapter 5 did by hand: the same topology run once per value of one
parameter, every run as long, monitored and recorded alike. The file is checked whole before
anything runs: every configuration's topology is built and validated, so a typo in the last one
does not surface an hour into the campaign. Errors name the file and the field.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from flowstat.harness import topology as harness_topology
from flowstat.harness.topology import RUN_ID_RE, Topology, TopologyError

DEFAULT_DURATION_S = 300.0  # the thesis's: 300 s a run, metrics every second
_FIELDS = {"campaign", "title", "description", "thesis", "duration", "topology", "sweep"}
_SWEEP_FIELDS = {"parameter", "label", "values", "configurations"}
_CONFIG_FIELDS = {"id", "value", "label", "set"}


class CampaignError(ValueError):
    """A campaign file that cannot run; the message names the file and the field."""


@dataclass(frozen=True)
class Configuration:
    """One run of the campaign: the swept parameter's value, and the topology it gives."""

    key: str  # unique in the campaign; the run's id is "<campaign>-<key>"
    value: Any  # the swept parameter's value, as the file gives it
    label: str  # how tables and plots name it
    overrides: dict[str, Any]  # dotted topology path -> value (the parameter's included)
    topology: Topology


@dataclass(frozen=True)
class Campaign:
    name: str
    title: str
    description: str
    source: str
    duration: float
    parameter: str  # a dotted path into the topology, e.g. producers.count
    parameter_label: str
    configurations: tuple[Configuration, ...]
    thesis: dict[str, Any] = field(default_factory=dict)  # free-form: which section and tables it repeats
    base: dict[str, Any] = field(default_factory=dict, repr=False)

    def run_id(self, config: Configuration) -> str:
        return f"{self.name}-{config.key}"

    def select(self, keys: list[str]) -> Campaign:
        """The campaign reduced to the configurations ``keys`` names (their values or keys)."""
        chosen: list[Configuration] = []
        unknown: list[str] = []
        for k in keys:
            found = [c for c in self.configurations if k in (c.key, str(c.value), c.label)]
            (chosen.extend(f for f in found if f not in chosen) if found else unknown.append(k))
        if unknown:
            raise CampaignError(
                f"{self.source}: no configuration {unknown[0]!r} (there are: "
                f"{', '.join(c.key for c in self.configurations)})"
            )
        return Campaign(
            self.name,
            self.title,
            self.description,
            self.source,
            self.duration,
            self.parameter,
            self.parameter_label,
            tuple(c for c in self.configurations if c in chosen),
            self.thesis,
            self.base,
        )

    def with_duration(self, seconds: float) -> Campaign:
        """The campaign with every run ``seconds`` long (``--duration``)."""
        configs = tuple(
            Configuration(
                c.key,
                c.value,
                c.label,
                c.overrides,
                _topology(self.base, c.overrides, self.run_id(c), seconds, f"{self.source} ({c.key})"),
            )
            for c in self.configurations
        )
        return Campaign(
            self.name,
            self.title,
            self.description,
            self.source,
            seconds,
            self.parameter,
            self.parameter_label,
            configs,
            self.thesis,
            self.base,
        )


def _set_path(data: dict, dotted: str, value: Any, where: str) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise CampaignError(f"{where}: {dotted}: {k} is not a mapping in the topology")
        node = child
    node[keys[-1]] = value


def _topology(base: dict, overrides: dict[str, Any], run_id: str, duration: float, source: str) -> Topology:
    data = copy.deepcopy(base)
    for path, value in overrides.items():
        _set_path(data, path, value, source)
    data["run_id"], data["duration"] = run_id, duration
    try:
        return harness_topology.from_dict(data, source)
    except TopologyError as exc:
        raise CampaignError(str(exc)) from None


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(value)).strip("-") or "x"


def _fail(source: str, where: str, message: str) -> NoReturn:
    raise CampaignError(f"{source}: {where}: {message}")


def _mapping(source: str, where: str, data: Any, allowed: set[str]) -> dict:
    if not isinstance(data, dict):
        _fail(source, where, f"expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(map(str, data)) - allowed)
    if unknown:
        _fail(
            source,
            f"{where}.{unknown[0]}" if where != "campaign" else unknown[0],
            f"unknown field (allowed: {', '.join(sorted(allowed))})",
        )
    return data


def _configurations(source: str, sweep: dict) -> list[dict]:
    """The sweep as a list of {id, value, label, set}: ``values`` is short for configurations
    that set only the parameter."""
    if ("values" in sweep) == ("configurations" in sweep):
        _fail(source, "sweep", "give exactly one of values (a list) or configurations (a list of {value, set})")
    if "values" in sweep:
        values = sweep["values"]
        if not isinstance(values, list) or not values:
            _fail(source, "sweep.values", f"expected a non-empty list, got {values!r}")
        return [{"value": v} for v in values]
    configs = sweep["configurations"]
    if not isinstance(configs, list) or not configs:
        _fail(source, "sweep.configurations", f"expected a non-empty list, got {configs!r}")
    for i, c in enumerate(configs):
        _mapping(source, f"sweep.configurations[{i}]", c, _CONFIG_FIELDS)
        if "value" not in c:
            _fail(source, f"sweep.configurations[{i}].value", "required field is missing")
    return configs


def from_dict(data: Any, source: str = "<dict>") -> Campaign:
    top = _mapping(source, "campaign", data, _FIELDS)
    name = top.get("campaign")
    if not isinstance(name, str) or not RUN_ID_RE.match(name) or len(name) > 60:
        _fail(source, "campaign", f"expected a name of letters, digits, '.', '_', '-' (max 60), got {name!r}")
    duration = top.get("duration", DEFAULT_DURATION_S)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration <= 0:
        _fail(source, "duration", f"expected seconds > 0, got {duration!r}")
    base = top.get("topology")
    if not isinstance(base, dict):
        _fail(source, "topology", "required: the topology every configuration starts from (docs/harness.md)")
    for owned in ("run_id", "duration"):
        if owned in base:
            _fail(source, f"topology.{owned}", "set by the campaign (its name and configuration; duration:)")
    sweep = _mapping(source, "sweep", top.get("sweep"), _SWEEP_FIELDS)
    parameter = sweep.get("parameter")
    if not isinstance(parameter, str) or not re.fullmatch(r"[a-z_]+(\.[a-z_]+)*", parameter):
        _fail(
            source,
            "sweep.parameter",
            f"expected a topology field such as buffer_size or producers.count, " f"got {parameter!r}",
        )
    thesis = top.get("thesis", {})
    if not isinstance(thesis, dict):
        _fail(source, "thesis", f"expected a mapping, got {thesis!r}")
    configs = []
    for i, c in enumerate(_configurations(source, sweep)):
        where = f"sweep.configurations[{i}]" if "configurations" in sweep else f"sweep.values[{i}]"
        sets = c.get("set", {})
        if not isinstance(sets, dict) or not all(isinstance(k, str) for k in sets):
            _fail(source, f"{where}.set", f"expected a mapping of topology fields to values, got {sets!r}")
        key = str(c.get("id", f"{parameter.replace('.', '-').replace('_', '-')}-{_slug(c['value'])}"))
        if not RUN_ID_RE.match(key):
            _fail(source, f"{where}.id", f"expected letters, digits, '.', '_', '-', got {key!r}")
        overrides = {parameter: c["value"], **sets}
        topo = _topology(base, overrides, f"{name}-{key}", float(duration), f"{source} ({where}: {key})")
        configs.append(Configuration(key, c["value"], str(c.get("label", c["value"])), overrides, topo))
    keys = [c.key for c in configs]
    if len(set(keys)) != len(keys):
        twice = next(k for k in keys if keys.count(k) > 1)
        _fail(source, "sweep", f"two configurations are both {twice!r}: give them ids")
    title = top.get("title", name)
    description = top.get("description", "")
    if not isinstance(title, str) or not isinstance(description, str):
        _fail(source, "title" if not isinstance(title, str) else "description", "expected text")
    return Campaign(
        name,
        title,
        description.strip(),
        source,
        float(duration),
        parameter,
        str(sweep.get("label", parameter)),
        tuple(configs),
        thesis,
        base,
    )


def load(path: str | Path) -> Campaign:
    return from_dict(harness_topology.read_yaml(Path(path), CampaignError), str(path))
