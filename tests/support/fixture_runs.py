"""Runs made by the harness for the dashboard, alert and report tests: a healthy run, one whose
producers overload their buffers, one whose merger falls behind, one whose producer is killed and
one whose agent ships to a sink that refuses connections. Made once per test session (shared by
the pytest-xdist workers through a lock) under .cache/test-fixture-runs/."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from flowstat.timeutil import iso_utc_ms

from . import shared

ROOT = Path(__file__).resolve().parents[1]

HEALTHY = {
    "duration": 12,
    "buffer_size": 100,
    "object": {"type": "TH1F", "size": "1kB"},
    "producers": {"count": 4, "rate": 100},
    "mergers": 1,
}

# A buffer of one message (and 4 kB of kernel buffers, which ZeroMQ's does not count: megabytes by
# default) and 12,000 objects/s offered to a merger that takes at most 1,000/s on any machine (1 ms of
# CPU per object): sends are refused all along (thesis section 5.1), the merger sets the pace.
OVERLOAD = {
    "duration": 8,
    "buffer_size": 1,
    "kernel_buffer_size": "4kB",
    "object": {"type": "TH1F", "size": "1kB"},
    "producers": {"count": 4, "rate": 3000},
    "mergers": 1,
    "merge_cost": {"per_object": "1ms"},
}

# Half as much again as its merger can take, whatever the machine: on one twice as fast its merges
# still cost 2 ms each; on one twice as slow they cost more, and its producers still offer 760/s with
# ease. (With twice as much, the backlog's drain after the run took a core as long as the run.)
BEHIND = {
    "duration": 12,
    "buffer_size": 100000,
    "object": {"type": "TH1F", "size": "1kB"},
    "producers": {"count": 4, "rate": 190},
    "mergers": 1,
    "merge_cost": {"per_object": "2ms"},
}

TOPOLOGIES = {
    # Paced well under what one merger takes: nothing overloads, latency stays in milliseconds.
    "healthy": HEALTHY,
    "overload": OVERLOAD,
    # 760 objects/s offered to a merger that takes at most 500/s on any machine (2 ms of CPU per
    # object): its queue, latency and memory grow for the whole run, by a third of the offered rate.
    "behind": BEHIND,
    # The healthy run whose producer process is SIGKILLed once the agent sampled it three times: the
    # run breaks, and without the run-ending notice its nodes are reported DOWN.
    "killed": HEALTHY,
    # The healthy run with a second sink that refuses connections: the agent spools for it.
    "spooling": HEALTHY,
}
KILL_AFTER_SEQ = 3


def make(base: Path, session: str) -> dict[str, Path]:
    """The fixture runs of this session: made by the first caller, found by the others."""
    return made_once(base, session, "runs", lambda folder: two_at_a_time(_run, folder, TOPOLOGIES))


def two_at_a_time(run, folder: Path, specs: dict) -> dict[str, Path]:
    """``run(folder, name, spec)`` for each spec, two at once: each run's outcome is made by a cost or
    a limit it sets (paced producers, a merge cost, a buffer of one), not by the machine's speed, so
    two beside each other end as each would alone, in half the time."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run, folder, name, spec) for name, spec in specs.items()}
        return {name: f.result() for name, f in futures.items()}


def made_once(base: Path, session: str, kind: str, make_all) -> dict[str, Path]:
    """Runs of one kind for this test session (name -> run dir), made in ``base/session`` by
    ``make_all(folder)`` for the first of the pytest-xdist workers that asks, and found by the others."""
    folder = base / session
    folder.mkdir(parents=True, exist_ok=True)
    made = shared.once(session, kind, lambda: {name: str(path) for name, path in make_all(folder).items()})
    return {k: Path(v) for k, v in made.items()}


def _run(folder: Path, name: str, topo: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"run_id": f"fx-{name}", **topo}))
    run_id = f"fx-{name}-{folder.name}"
    run_dir = folder / "runs" / run_id
    command = [
        sys.executable,
        "-m",
        "flowstat",
        "run",
        str(path),
        "--run-id",
        run_id,
        "--runs-dir",
        str(folder / "runs"),
        "--quiet",
        "--json",
    ]
    with socket.socket() as refusing:  # bound, never listening: every connection is refused
        refusing.bind(("127.0.0.1", 0))
        if name == "spooling":
            command += ["--sink", f"http://127.0.0.1:{refusing.getsockname()[1]}/write"]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if name == "killed":
            _kill_producer(proc, run_dir / "samples.ndjson")
        _, err = proc.communicate(timeout=300)
    if not (run_dir / "samples.ndjson").exists():
        raise RuntimeError(f"fixture run {name} failed (exit {proc.returncode}): {err[-2000:]}")
    return run_dir


def _kill_producer(proc: subprocess.Popen, run_file: Path, deadline_s: float = 120) -> None:
    """SIGKILL the producer process once the run file holds its sample number KILL_AFTER_SEQ."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            lines = run_file.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines[1:]:
            try:
                doc = json.loads(line)
            except ValueError:  # the agent is writing this line
                continue
            if doc.get("role") == "producer" and doc.get("seq", 0) >= KILL_AFTER_SEQ:
                os.kill(doc["pid"], signal.SIGKILL)
                return
        time.sleep(0.2)  # polling a file another process writes, with a deadline
    proc.kill()
    raise RuntimeError(f"the producer of {run_file.parent.name} was never sampled {KILL_AFTER_SEQ} times")


def samples(run_dir: Path) -> tuple[dict, list[dict], list[dict]]:
    """The run file's header, node samples and agent self-samples."""
    lines = (run_dir / "samples.ndjson").read_text().splitlines()
    docs = [json.loads(line) for line in lines[1:]]
    return (
        json.loads(lines[0]),
        [d for d in docs if "node_id" in d],
        [d["flowstat_agent"] for d in docs if "flowstat_agent" in d],
    )


MEMORY_RUN_S = 420  # longer than the memory alert's 5-minute window, with a minute either side
MEMORY_GROWTH_KB_PER_S = 20 * 1024 / 60  # twice the alert's 10 MB/min


def memory_growth(healthy: Path, folder: Path) -> Path:
    """A run file no harness run of a test's length can give: two mergers sampled every second for
    MEMORY_RUN_S, an hour before now; merger-0's VmRSS grows steadily (the thesis's failure at 425
    producers), merger-1's stays flat but wobbles. Made from the healthy run's header and one of its
    merger samples, so every field is one an agent writes."""
    head, nodes, _ = samples(healthy)
    template = next(s for s in nodes if s["role"] == "merger" and s["node_state"] == "RUNNING")
    run_id = head["flowstat_run"]["run_id"].replace("fx-healthy-", "fx-memory-")
    start = int(time.time()) - 3600
    lines = [json.dumps({"flowstat_run": {**head["flowstat_run"], "run_id": run_id, "started": iso_utc_ms(start)}})]
    for seq in range(MEMORY_RUN_S):
        for node, grows in (("merger-0", True), ("merger-1", False)):
            vmrss = 40_000 + (MEMORY_GROWTH_KB_PER_S * seq if grows else 2_000 * (seq % 7 == 0))
            t = iso_utc_ms(start + seq)
            lines.append(
                json.dumps(
                    {
                        **template,
                        "time": t,
                        "run_id": run_id,
                        "node_id": node,
                        "seq": seq,
                        "vmrss_kb": int(vmrss),
                        "request_timestamp": t,
                        "response_timestamp": t,
                    }
                )
            )
    out = folder / "runs" / run_id / "samples.ndjson"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out.parent
