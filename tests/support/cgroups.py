"""cgroups of a test's own (cgroup v2), and processes started in them, for the agents' --cgroup,
--unit and --top tests."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowstat.agent.selection import cgroup2_root
from support.agents import wait_until

# A process holding MB mebibytes, touched; each line on its stdin makes it hold that many more.
HOLDER = (
    "import sys; b = [bytearray(int(sys.argv[1]) << 20)]\n"
    "for line in sys.stdin: b.append(bytearray(int(line) << 20)); print('held', flush=True)\n"
)


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A cgroup of the test's own (its folders below made by the test as it likes), removed after:
    the processes in it and below are killed first."""
    root = cgroup2_root()
    if root is None or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup v2 hierarchy")
    top = root / f"flowstat-test-{uuid.uuid4().hex[:8]}"
    top.mkdir()
    yield top
    for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
        for pid in (folder / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)
        wait_until(lambda f=folder: not (f / "cgroup.procs").read_text().split(), "the cgroup empty", timeout=10)
        folder.rmdir()


def start_in(folder: Path | None, *command: str, **popen) -> subprocess.Popen:
    """A process that joins ``folder`` (a cgroup) before it runs ``command``."""
    if folder is None:
        return subprocess.Popen(list(command), **popen)
    join = f'echo $$ > "{folder}/cgroup.procs" && exec "$@"'
    return subprocess.Popen(["sh", "-c", join, "sh", *command], **popen)
