"""SIGHUP reloads an agent's configuration in place: targets and sinks change without a restart,
nothing sampled is lost or sent twice (each (agent_command, node, seq) counted across the sinks), a sink
the reload removes keeps what it held, and a bad configuration changes nothing. Both agents."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
from pathlib import Path

from support.agents import wait_until

RELOADS = 10


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip().startswith("{")]


def test_ten_reloads_change_targets_and_sinks_and_lose_or_repeat_nothing(agent_command, tmp_path):
    # Durations no other test's sleepers have (tests run side by side): the patterns match these only.
    a, b = (f"{n}.{random.randrange(10**6):06d}" for n in (301, 302))
    sleepers = {n: subprocess.Popen(["sleep", n]) for n in (a, b)}
    one, two = (f"^sleep {re.escape(n)}$" for n in (a, b))
    sinks = {n: tmp_path / f"{n}.json" for n in ("s1", "s2")}
    url = {n: f"file://{p}?format=json" for n, p in sinks.items()}
    # Each reload changes the targets, the sinks or both; every configuration has a sink, so each
    # sample taken reaches at least one.
    variants = [
        ([one], ["s1"]),
        ([one, two], ["s1", "s2"]),
        ([two], ["s2"]),
        ([one], ["s2", "s1"]),
    ]
    conf = tmp_path / "agent.toml"

    def write(patterns: list[str], names: list[str]) -> None:
        conf.write_text(
            f"pattern = {json.dumps(patterns)}\nsink = {json.dumps([url[n] for n in names])}\n"
            "interval = 0.05\nrescan = 0.2\nself_interval = 0\n"
        )

    write(*variants[0])
    log = tmp_path / "agent.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([*agent_command, "--config", str(conf)], stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: lines(sinks["s1"]), "the first samples", timeout=30)
        for n in range(1, RELOADS + 1):
            patterns, names = variants[n % len(variants)]
            write(patterns, names)
            proc.send_signal(signal.SIGHUP)
            wait_until(lambda n=n: log.read_text().count("reload: ") >= n, f"reload {n} said", timeout=30)
            # the configuration is in force: its first sink gets samples of a node it names
            wanted, before = sinks[names[0]], len(lines(sinks[names[0]]))
            wait_until(lambda w=wanted, b=before: len(lines(w)) > b + 2, f"samples after reload {n}", timeout=30)
        conf.write_text("interval = [\n")  # a bad configuration: said, and nothing changes
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "reload refused" in log.read_text(), "the bad configuration refused", timeout=30)
        wanted, before = sinks[names[0]], len(lines(sinks[names[0]]))
        wait_until(lambda: len(lines(wanted)) > before + 2, "samples after the refused reload", timeout=30)
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in sleepers.values():
            p.kill()
            p.wait()
    per_sink = {n: [(d["agent"], d["node_id"], d["seq"]) for d in lines(p)] for n, p in sinks.items()}
    for n, keys in per_sink.items():
        assert len(keys) == len(set(keys)), f"{n}: a sample twice"
    everything = set(per_sink["s1"]) | set(per_sink["s2"])
    nodes = {(a, node) for a, node, _ in everything}
    assert len(nodes) == 2, nodes  # both sleepers, each watched in some configurations
    for a, node in nodes:
        seqs = sorted(s for a2, n2, s in everything if (a2, n2) == (a, node))
        assert seqs == list(range(len(seqs))), f"{node}: seqs missing"
    text = log.read_text()
    assert text.count("reload refused") == 1 and "no longer watched" in text and "removed" in text, text
