"""Finding the stores: every public module of this package holds one, registered by name."""

from __future__ import annotations

import importlib
import pkgutil

from ._base import _REGISTRY, Writer

_PACKAGE = __name__.rpartition(".")[0]


def _load_all() -> None:
    package = importlib.import_module(_PACKAGE)
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{_PACKAGE}.{module.name}")


def writers() -> list[type[Writer]]:
    """Every store, by name."""
    _load_all()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def names() -> list[str]:
    return [w.name for w in writers()]


def get(name: str) -> type[Writer]:
    """The writer of a store, by name; an unknown name is an error that lists the known ones."""
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown store {name!r} (known: {', '.join(sorted(_REGISTRY))})") from None
