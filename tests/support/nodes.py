"""For the tests of the node libraries (flowstat.node, libflowstat-node): agents watching an
endpoints directory (--endpoints-dir), started writing their samples as JSON lines to a file, read
back while they run, stopped with SIGTERM; and control requests timed, for the figures of an
interval between two of them."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from flowstat.node.protocol import ControlClient


def timed(client: ControlClient, command: str = "get-metrics", **fields: Any) -> tuple[float, dict, float]:
    """(monotonic before, reply, monotonic after): the node answered between the two."""
    before = time.monotonic()
    reply = client.request(command, **fields)
    return before, reply, time.monotonic()


def assert_rate_within(
    first: tuple[float, dict, float],
    second: tuple[float, dict, float],
    objects: int,
    field: str = "merged_objects_per_second",
) -> None:
    """A rate over a client's interval between two timed requests: `objects` over at most first's
    send to second's reply, at least first's reply to second's send. Bracketed by the round trips,
    not by the sleeps between them, it holds however late a loaded machine answers."""
    assert second[0] > first[2], "the second request sent before the first's reply: no interval"
    rate = second[1][field]
    low, high = objects / (second[2] - first[0]), objects / (second[0] - first[2])
    assert low * 0.999 <= rate <= high * 1.001, (field, rate, low, high)


def agent_samples(out: Path) -> list[dict]:
    """The node samples an agent has written so far (a line being written is skipped)."""
    docs = []
    for line in out.read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:  # the agent is writing this line
            continue
        if "node_id" in doc:
            docs.append(doc)
    return docs


def agent_edge_counts(out: Path) -> dict[tuple[str, str], int]:
    """The last edge counter an agent wrote for each edge (from, to) so far."""
    last: dict[tuple[str, str], int] = {}
    for line in out.read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:  # the agent is writing this line
            continue
        if "objects_received" in doc and "from" in doc and "node_id" not in doc:
            last[(doc["from"], doc["to"])] = doc["objects_received"]
    return last


def watching_agent(
    agent_command: list[str], folder: Path, out: Path, *extra: str, rescan: str = "0.2"
) -> subprocess.Popen:
    """An agent (either: the agent_command fixture) sampling the directory's nodes every 0.2 s,
    searching for targets every ``rescan`` s (and whenever the directory changes)."""
    return subprocess.Popen(
        [
            *agent_command,
            "--endpoints-dir",
            str(folder),
            "--interval",
            "0.2",
            "--rescan",
            rescan,
            "--self-interval",
            "0",
            "--sink",
            "stdout://?format=json",
            *extra,
        ],
        stdout=open(out, "w"),
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_agent(agent: subprocess.Popen) -> str:
    """SIGTERM, and the agent's log."""
    agent.send_signal(signal.SIGTERM)
    _, err = agent.communicate(timeout=30)
    return err
