"""The stores flowstat writes samples and runs to, one module each, registered by name.

A store is one module here holding a ``Writer`` subclass: how to encode samples and runs for it, how
to send a batch (one retry policy for all: see ``_base``), and its set-up (templates, database,
rollups). Registered in STORES below, it is, with nothing else to change,
an agent sink (``NAME://HOST:PORT/TARGET``; a store that takes several nodes,
``NAME://HOST:PORT,HOST:PORT/TARGET``), a ``flowstat replay --OPTION URL`` destination, a set
of generated files under index-templates/NAME/, and what ``flowstat stack up`` installs into the
server of the same name.
"""

from __future__ import annotations

import argparse

from flowstat.registry import Registry

from ._auth import CREDENTIALS_VAR, CredentialsError, StoreAuth, read_credentials_file, refuse_secrets_in_url
from ._base import (
    DEFAULT_RETRY,
    NODE_BACKOFF_S,
    BatchEncoder,
    Outcome,
    RetryPolicy,
    StoreAuthError,
    StoreDown,
    StoreURLError,
    Writer,
    parse_nodes,
)
from ._process import WriterProcess

# Every store, by the name its URLs and options use; where its pieces live: docs/development.md.
STORES: Registry[type[Writer]] = Registry(
    "store",
    {
        "elasticsearch": "flowstat.stores.elasticsearch:ElasticsearchWriter",
        "influxdb": "flowstat.stores.influxdb:InfluxDBWriter",
    },
)

__all__ = [
    "CREDENTIALS_VAR",
    "DEFAULT_RETRY",
    "NODE_BACKOFF_S",
    "BatchEncoder",
    "CredentialsError",
    "Outcome",
    "RetryPolicy",
    "STORES",
    "StoreAuth",
    "StoreAuthError",
    "StoreDown",
    "StoreURLError",
    "Writer",
    "WriterProcess",
    "get",
    "names",
    "parse_nodes",
    "read_credentials_file",
    "refuse_secrets_in_url",
    "add_credentials_option",
    "use_credentials_file",
    "writers",
]


def add_credentials_option(parser: argparse.ArgumentParser) -> None:
    """The --credentials FILE option of every command that talks to a store."""
    parser.add_argument(
        "--credentials",
        metavar="FILE",
        help="the stores' credentials, NAME=VALUE lines readable by you alone (chmod 600): "
        "FLOWSTAT_ES_USER, FLOWSTAT_ES_PASSWORD, ... (docs/security.md); default "
        f"${CREDENTIALS_VAR}; the environment's variables win",
    )


def use_credentials_file(path: str | None) -> None:
    """A command's --credentials FILE: checked now (CredentialsError), and named in the environment
    so that this process and those it starts (writer processes, agents) read it."""
    import os

    if path:
        read_credentials_file(path)
        os.environ[CREDENTIALS_VAR] = os.path.abspath(path)


def writers() -> list[type[Writer]]:
    """Every store's writer, in STORES's order."""
    return STORES.values()


def names() -> list[str]:
    return STORES.names()


def get(name: str) -> type[Writer]:
    """The writer of a store, by name; an unknown name is an error (a ValueError) listing the known ones."""
    return STORES.get(name)
