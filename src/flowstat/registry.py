"""One way to name implementations: a ``Registry`` per kind of thing, written out in the module a
reader opens first for that kind.

    flowstat.stores.STORES            store writers, by URL scheme (influxdb, elasticsearch)
    flowstat.agent.sinks.SINKS        the agent's sinks, by URL scheme (stdout, file, ..., and every store)
    flowstat.cli.COMMANDS             the command line's commands (run, agent, stack, ...)
    flowstat.harness.devices.DEVICES  the harness's devices, by pipeline role (producer, merger, viewer)
    flowstat.stack.SERVICES           the servers ``flowstat stack`` installs, in start order

An entry is the implementation itself or where it lives, ``"package.module:attribute"``, imported the
first time it is asked for: a command line that names every command, or a device process that
names every role, imports only the one it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")

__all__ = ["Command", "Registry", "UnknownName"]


class UnknownName(ValueError):
    """A name no entry has; the message lists those known."""


class Registry(Generic[T]):
    """Names to implementations of one kind, in the order they were added (the order ``names()``
    and ``items()`` give: a start order, for services)."""

    def __init__(self, kind: str, entries: Mapping[str, T | str] | None = None):
        self.kind = kind  # how errors call an entry: "store", "sink", "command"...
        self._entries: dict[str, T | str] = {}
        self._where: dict[str, str] = {}  # the module of each entry, known without importing it
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    def add(self, name: str, entry: T | str) -> None:
        """Register ``entry`` (or ``"module:attribute"``, imported when first asked for) as ``name``."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        if isinstance(entry, str) and entry.count(":") != 1:
            raise ValueError(f"{self.kind} {name!r}: {entry!r} is not 'module:attribute'")
        self._entries[name] = entry
        self._where[name] = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")

    def register(self, name: str) -> Callable[[T], T]:
        """The decorator form of add(), for a registry filled where its entries are defined."""

        def add(entry: T) -> T:
            self.add(name, entry)
            return entry

        return add

    def get(self, name: str) -> T:
        """The entry named ``name``; an unknown name is an UnknownName listing the known ones."""
        try:
            entry = self._entries[name]
        except KeyError:
            raise UnknownName(f"unknown {self.kind} {name!r} (known: {', '.join(self._entries)})") from None
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = cast(T, getattr(importlib.import_module(module), attribute))
            self._entries[name] = entry
        return entry

    __getitem__ = get

    def where(self, name: str) -> str:
        """The module that holds an entry, without importing it."""
        return self._where[name]

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """Every entry, each imported if it was not yet."""
        return [(name, self.get(name)) for name in self._entries]

    def values(self) -> list[T]:
        return [self.get(name) for name in self._entries]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


@dataclass(frozen=True)
class Command:
    """A command of the command line, as flowstat.cli.COMMANDS holds it: its one-line help, the
    keywords of its parser (argparse.ArgumentParser's: description, epilog...), the function that
    adds its options, and the one that does its work (args -> exit status)."""

    help: str
    configure: Callable[[Any], None]
    main: Callable[[Any], int]
    parser: dict[str, Any] = field(default_factory=dict)
