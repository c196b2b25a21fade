"""The endpoints directory is a trust boundary: the host's users' nodes announce themselves in it, so
an agent believes a file only when its owner owns the process it names, and only of a control
endpoint on this host (ipc://, TCP on loopback); anything else is refused with a line naming the
file. Both agents, one round each (--test), against real processes of two users."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

NOBODY = 65534


@pytest.fixture
def sleepers():
    """Processes to announce: three of this test's user, one of nobody's."""
    if os.geteuid() != 0:
        pytest.skip("needs root: processes and files of another user")
    procs = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
    procs.append(
        subprocess.Popen(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "sleep", "300"])
    )
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def announce(folder: Path, node_id: str, pid: int, owner: int, **fields) -> Path:
    path = folder / f"{node_id}.{pid}.json"
    path.write_text(json.dumps({"run_id": "trust", "nodes": [{"node_id": node_id, "pid": pid, **fields}]}))
    os.chown(path, owner, owner)
    return path


def test_a_file_speaks_only_for_its_owners_processes_and_only_of_this_host(agent_command, tmp_path, sleepers):
    mine, theirs, remote, nobodys = sleepers
    folder = tmp_path / "endpoints"
    folder.mkdir()
    announce(folder, "mine", mine, os.geteuid())
    announce(folder, "loopback", theirs, os.geteuid(), control="tcp://127.0.0.1:9")
    forged = announce(folder, "forged", theirs, NOBODY)  # nobody's file naming root's process
    far = announce(folder, "far", remote, os.geteuid(), control="tcp://192.0.2.7:5555")
    announce(folder, "nobodys", nobodys, NOBODY)  # nobody's file, nobody's process: believed
    out = subprocess.run(
        [*agent_command, "--endpoints-dir", str(folder), "--test", "--control-timeout", "0.05"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    sampled = {line.split("node_id=")[1].split(",")[0] for line in out.stdout.splitlines()[1:] if "node_id=" in line}
    assert sampled == {"mine", "loopback", "nobodys"}, out.stdout + out.stderr
    refused = [line for line in out.stderr.splitlines() if "refused" in line]
    assert len(refused) == 2, out.stderr
    assert any(str(forged) in line and f"uid {NOBODY}" in line for line in refused), refused
    assert any(str(far) in line and "192.0.2.7" in line for line in refused), refused
