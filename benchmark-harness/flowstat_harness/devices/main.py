"""Entry point of a device process: ``flowstat device ROLE --config JSON``."""

from __future__ import annotations

import json
import logging
import sys

from .node import configure_logging

ROLES = ("producer", "merger", "viewer")


def run_device(role: str, config_json: str) -> int:
    config = json.loads(config_json)
    configure_logging(config.get("node_id", role))
    if role == "producer":
        from .producer import Producer as cls
    elif role == "merger":
        from .merger import Merger as cls
    elif role == "viewer":
        from .viewer import Viewer as cls
    else:
        print(f"flowstat device: unknown role {role!r} (one of {', '.join(ROLES)})", file=sys.stderr)
        return 2
    node = cls(config)
    node.install_signals()
    try:
        return node.run()
    except Exception:
        logging.getLogger("flowstat.device").exception("%s crashed", config.get("node_id", role))
        return 70
