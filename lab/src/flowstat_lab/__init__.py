"""flowstat's laboratory: what the test suite and the benchmarks run around the product, never
shipped with it (the wheel holds ``flowstat`` alone; an import-linter contract keeps ``flowstat``
from importing this package).

- ``netns``: network namespaces, pid files and port forwards the suite's own daemons share;
- ``compose``: the suite's Docker engine, the images built here and Compose v2 (make compose-images);
- ``slurm``: a Slurm cluster of several nodes in a namespace of its own;
- ``grafana``, ``kibana``: the query expansion of the tools that cannot run here, so that every panel's
  query runs against the real stores;
- ``screenshots``: the report's pictures in docs/img (make screenshots);
- ``mutate``: mutation testing of the code where a bug loses data (make mutate);
- ``suite_cpu``: where the suite's CPU goes, by test, from the kernel's process accounting (make test-cpu).

Installed in development mode by ``make test`` and ``make bench`` (``pip install -e lab``): it
works on the checkout it sits in (``ROOT``).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # lab/src/flowstat_lab/ -> the checkout
STAND_INS = ROOT / "lab" / "stand-ins"  # the compose stack's stand-in images and their overrides
