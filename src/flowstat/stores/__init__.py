"""The stores flowstat writes samples and runs to, one module each, registered by name.

A store is one module here holding a ``Writer`` subclass decorated with ``@register``: how to
encode samples and runs for it, how to send a batch (one retry policy for all: see ``_base``), and
its set-up (templates, database, rollups). Registering it makes it, with nothing else to change,
an agent sink (``NAME://HOST:PORT/TARGET``), a ``flowstat replay --OPTION URL`` destination, a set
of generated files under index-templates/NAME/, and what ``flowstat stack up`` installs into the
server of the same name.
"""

from __future__ import annotations

from ._base import BatchEncoder, Outcome, RetryPolicy, StoreDown, Writer, register
from ._process import WriterProcess
from ._registry import get, names, writers

__all__ = ["BatchEncoder", "Outcome", "RetryPolicy", "StoreDown", "Writer", "WriterProcess", "get", "names",
           "register", "writers"]
