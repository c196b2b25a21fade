"""The harness's devices, one module per pipeline role (producer, merger, viewer: the roles of the
sample schema, in pipeline order), each a process of its own started by the orchestrator as
``python -m flowstat.harness.devices ROLE --config JSON``."""

from __future__ import annotations

import importlib
import json
import logging

from flowstat.schema.sample import PIPELINE_ROLES

from .node import Node, configure_logging

__all__ = ["PIPELINE_ROLES", "device_class", "run_device"]


def device_class(role: str) -> type[Node]:
    """The class of a role's device: module ROLE, class Role (producer.Producer, ...)."""
    if role not in PIPELINE_ROLES:
        raise ValueError(f"unknown device role {role!r} (one of {', '.join(PIPELINE_ROLES)})")
    return getattr(importlib.import_module(f"{__name__}.{role}"), role.capitalize())


def run_device(role: str, config_json: str) -> int:
    """Run one device until it stops; its exit status (70 when it crashed, with the traceback logged)."""
    config = json.loads(config_json)
    configure_logging(config.get("node_id", role))
    node = device_class(role)(config)
    node.install_signals()
    try:
        return node.run()
    except Exception:
        logging.getLogger("flowstat.device").exception("%s crashed", config.get("node_id", role))
        return 70
