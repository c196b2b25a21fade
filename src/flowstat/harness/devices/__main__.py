"""``python -m flowstat.harness.devices ROLE --config JSON``: one device process (the orchestrator
starts them; see docs/harness.md)."""

import argparse
import sys

from . import PIPELINE_ROLES, run_device

parser = argparse.ArgumentParser(
    prog="python -m flowstat.harness.devices",
    description="Run one device of a harness topology until it is told to stop.",
)
parser.add_argument("role", choices=PIPELINE_ROLES)
parser.add_argument("--config", required=True, help="the device's configuration as JSON (written by the orchestrator)")
args = parser.parse_args()
sys.exit(run_device(args.role, args.config))
