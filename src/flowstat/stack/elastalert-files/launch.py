"""Runs one of ElastAlert2's programs (elastalert, elastalert-create-index, elastalert-test-rule)
inside its own virtualenv: ``python launch.py PROGRAM ARGS...``. flowstat.stack.elastalert copies
this file beside that virtualenv; it is not part of flowstat's own package at run time.

Why a launcher: ElastAlert asks Elasticsearch for its version with ``GET /``, and the stack's
Elasticsearch (the Maven integ-test zip) lacks the module that answers it (rest-root): it says 405.
When it does, the version is taken from ``GET /_nodes/_local`` instead, which every Elasticsearch
answers; a server with ``GET /`` is asked as usual.
"""

import signal
import sys
from importlib.metadata import entry_points

import elasticsearch
from elasticsearch.exceptions import TransportError

_info = elasticsearch.Elasticsearch.info


def _info_or_local_node(self, *args, **kwargs):
    try:
        return _info(self, *args, **kwargs)
    except TransportError as exc:
        if exc.status_code != 405:
            raise
    nodes = self.transport.perform_request(
        "GET", "/_nodes/_local", params={"filter_path": "cluster_name,nodes.*.version"}
    )
    version = next(iter(nodes["nodes"].values()))["version"]
    return {"cluster_name": nodes["cluster_name"], "version": {"number": version}}


def main() -> int:
    elasticsearch.Elasticsearch.info = _info_or_local_node
    program = sys.argv[1]
    found = [
        e
        for e in entry_points(group="console_scripts")
        if e.name == program and e.dist is not None and e.dist.name == "elastalert2"
    ]
    if not found:
        sys.exit(f"launch.py: {program!r} is not a program of elastalert2")
    sys.argv = [program, *sys.argv[2:]]
    # ElastAlert ends on SIGINT only; SIGTERM (docker stop, flowstat stack down) does the same. As a
    # container's PID 1 a signal without a handler would be ignored until the stop's time-out.
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    return found[0].load()()


if __name__ == "__main__":
    sys.exit(main())
