"""What the test session's pytest-xdist workers share rather than each making its own: the session's
id, and things made once (runs, servers) by the first worker that asks, under a lock, and found by
the others. A server made so is stopped once, by the session's controller when every worker is done
(conftest.py's pytest_sessionfinish), not by the worker that happened to start it."""

from __future__ import annotations

import fcntl
import json
import uuid
from collections.abc import Callable
from pathlib import Path

BASE = Path(__file__).resolve().parents[2] / ".cache" / "test-shared"


def session_id(config) -> str:
    """This test session's id, the same in the controller and in every worker: pytest-xdist's
    testrunuid, which the controller sets before its workers start (conftest.py's pytest_configure)."""
    worker = getattr(config, "workerinput", None)
    if worker:
        return worker["testrunuid"]
    if not getattr(config.option, "testrunuid", None):
        config.option.testrunuid = uuid.uuid4().hex
    return config.option.testrunuid


def once(session: str, kind: str, make: Callable[[], dict], base: Path = BASE) -> dict:
    """``make()``'s answer (a JSON object) for this session: made by the first caller of any worker,
    under a lock, and read by the others. A make that raises leaves nothing: the next caller tries."""
    folder = base / session[:12]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{kind}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / f"{kind}.json"
        if not done.exists():
            done.write_text(json.dumps(make()))
    return json.loads(done.read_text())


def made(session: str, kind: str, base: Path = BASE) -> dict | None:
    """What ``once`` made of this kind in this session, or None."""
    done = base / session[:12] / f"{kind}.json"
    return json.loads(done.read_text()) if done.exists() else None
