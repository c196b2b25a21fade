"""The harness's devices, one module per pipeline role (producer, merger, viewer: the roles of the
sample schema, in pipeline order), registered in DEVICES below, each a process of its own started
by the orchestrator as ``python -m flowstat.harness.devices ROLE --config JSON`` (which imports
its own module only)."""

from __future__ import annotations

import json
import logging

from flowstat.registry import Registry
from flowstat.schema.sample import PIPELINE_ROLES

from .device import Device, configure_logging

__all__ = ["DEVICES", "PIPELINE_ROLES", "device_class", "run_device"]

# Every device, by the pipeline role it plays (the sample schema's roles: a test holds them alike).
DEVICES: Registry[type[Device]] = Registry(
    "device role",
    {
        "producer": "flowstat.harness.devices.producer:Producer",
        "merger": "flowstat.harness.devices.merger:Merger",
        "viewer": "flowstat.harness.devices.viewer:Viewer",
    },
)


def device_class(role: str) -> type[Device]:
    """The class of a role's device; an unknown role is a ValueError naming the known ones."""
    return DEVICES.get(role)


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
