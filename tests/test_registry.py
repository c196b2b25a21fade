"""One way to register a name to an implementation (flowstat.registry.Registry), one registry per
kind, each in the module a reader opens first for that kind; and one name per class in the package."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from flowstat.registry import Registry, UnknownName
from support.common import ROOT

PACKAGE = ROOT / "src" / "flowstat"


def _sources():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_a_registry_names_its_entries_in_order_and_refuses_what_it_cannot_hold():
    kinds = Registry[object]("colour", {"red": 1, "green": "colorsys:rgb_to_hsv"})
    kinds.add("blue", 3)
    assert kinds.names() == ["red", "green", "blue"] and list(kinds) == kinds.names() and len(kinds) == 3
    assert kinds.where("green") == "colorsys" and "green" in kinds and "grey" not in kinds
    import colorsys

    assert kinds.get("green") is colorsys.rgb_to_hsv and kinds["red"] == 1
    assert kinds.items() == [("red", 1), ("green", colorsys.rgb_to_hsv), ("blue", 3)]
    with pytest.raises(UnknownName, match=r"unknown colour 'grey' \(known: red, green, blue\)"):
        kinds.get("grey")
    with pytest.raises(ValueError, match="colour 'red' is registered twice"):
        kinds.add("red", 4)
    with pytest.raises(ValueError, match="is not 'module:attribute'"):
        kinds.add("cyan", "colorsys.rgb_to_hsv")
    decorated = Registry[type]("shape")

    @decorated.register("square")
    class Square:
        pass

    assert decorated.get("square") is Square


def test_each_kind_has_one_registry_whose_entries_are_what_their_names_say():
    from flowstat import stack, stores
    from flowstat.agent import sinks
    from flowstat.cli import COMMANDS
    from flowstat.harness.devices import DEVICES, Device
    from flowstat.registry import Command
    from flowstat.schema.sample import PIPELINE_ROLES

    assert stores.STORES.names() == ["elasticsearch", "influxdb"]
    assert all(w.name == name and issubclass(w, stores.Writer) for name, w in stores.STORES.items())
    assert set(stores.names()) <= set(sinks.SINKS) and all(issubclass(s, sinks.Sink) for s in sinks.SINKS.values())
    assert tuple(DEVICES) == tuple(PIPELINE_ROLES) and all(issubclass(d, Device) for d in DEVICES.values())
    assert stack.SERVICES.names() == ["influxdb", "elasticsearch", "telegraf", "elastalert"]
    assert all(issubclass(s, stack.Service) for s in stack.SERVICES.values())
    assert all(isinstance(c, Command) and c.help for c in COMMANDS.values())


def test_the_command_line_imports_only_the_command_it_runs():
    """COMMANDS names where each command lives: `flowstat ctl ...` imports ctl's module alone."""
    probe = (
        "import sys; from flowstat import cli\n"
        "cli.build_parser(only='ctl')\n"
        "print(sorted({cli.COMMANDS.where(n) for n in cli.COMMANDS} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['flowstat.harness.command']", out


# What registration looked like before the one Registry: a scan of a package, a class found from a
# name by a rule (module ROLE, class Role), a decorator filling a module's dict.
OTHER_WAYS = {
    "a package scanned": re.compile(r"\bpkgutil\b"),
    "a module imported by a computed name": re.compile(r"import_module\("),
    "a class found by a naming rule": re.compile(r"getattr\((module|importlib)\b|\.capitalize\(\)\)"),
    "a registering decorator": re.compile(r"^@register\b", re.M),
    "a module's table of implementations": re.compile(r"^_(REGISTRY|SCHEMES)\b", re.M),
}


def test_nothing_registers_a_name_but_the_registry():
    found = [
        f"{path.relative_to(ROOT)}: {what}"
        for path in _sources()
        if path.name != "registry.py"
        for what, pattern in OTHER_WAYS.items()
        if pattern.search(path.read_text())
    ]
    assert found == []


def test_the_rules_find_the_ways_that_are_gone():
    """The patterns above are not vacuous: each finds the code it was written for."""
    before = {
        "a package scanned": "import pkgutil\n",
        "a module imported by a computed name": 'importlib.import_module(f"{_PACKAGE}.{name}")\n',
        "a class found by a naming rule": "return getattr(importlib.import_module(name), role.capitalize())\n",
        "a registering decorator": "@register\nclass InfluxDB(Writer):\n",
        "a module's table of implementations": "_SCHEMES: dict[str, type[Sink]] = {}\n",
    }
    assert {what for what, text in before.items() if OTHER_WAYS[what].search(text)} == set(OTHER_WAYS)


def test_no_two_classes_of_the_package_share_a_name():
    where = defaultdict(list)
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
    assert [n for n in where if n.endswith("Registry")] == ["Registry"]
