"""The C agent's prometheus:// sink (collectors/c/agent/exposition.c): /metrics as the Python agent
serves it (flowstat.agent.sinks.exposition, the reference), byte for byte for the same samples, in
both formats; promtool and a real Prometheus take it; loopback only; a client that sends garbage
or nothing never stops the sampling."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from urllib.parse import parse_qs

import pytest
import requests

from flowstat.agent.sinks.exposition import _Latest
from flowstat.schema import prometheus
from support.agents import sleeper, spinner, wait_until
from support.common import C_AGENT, free_port, needs
from support.scraping import assert_scraped_exactly, scrape_until_down

pytestmark = needs(C_AGENT)

PROCESS_LINE = re.compile(r"(process_[a-z_]+) \S+\Z")


def c_agent(
    tmp_path, port: int, pids, seconds: float, interval: float = 0.5, host: str = "127.0.0.1", options: str = ""
):
    """``options``: the prometheus:// URL's query (``?families=...``), "" none. No drain at exit."""
    args = [str(C_AGENT)]
    for pid in pids:
        args += ["--pid", str(pid)]
    args += ["--interval", str(interval), "--self-interval", str(interval), "--duration", str(seconds)]
    args += ["--drain-timeout", "0"]  # stopped at once: the drain is tested in test_prometheus.py
    args += ["--sink", f"prometheus://{host}:{port}{options}", "--sink", f"file://{tmp_path}/samples.json?format=json"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def metrics(port: int, openmetrics: bool, path: str = "/metrics") -> requests.Response:
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    return requests.get(f"http://127.0.0.1:{port}{path}", headers=accept, timeout=10)


def served(port: int, openmetrics: bool) -> str:
    """/metrics's text, "" while the agent is not listening yet."""
    try:
        return metrics(port, openmetrics).text
    except requests.ConnectionError:
        return ""


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


def written(tmp_path) -> list[dict]:
    """The samples and self-samples the file sink holds, whole lines only."""
    text = (tmp_path / "samples.json").read_text() if (tmp_path / "samples.json").exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def python_exposition(docs: list[dict], openmetrics: bool, options: str = "") -> str:
    """What the Python agent's sink serves for these documents, in this order (its own store), with
    the sink URL's options (a query: ?families=...&drop_labels=...)."""
    query = {k: v[-1] for k, v in parse_qs(options.lstrip("?"), keep_blank_values=True).items()}
    select = prometheus.selection(query.get("families"), query.get("drop_labels"))
    latest = _Latest(select)
    for doc in docs:
        latest.put("agent" if "rounds" in doc else "node", doc)
    nodes, agents = latest.scrape()
    process = {f.field: 0 for f in prometheus.PROCESS_FAMILIES}
    return prometheus.exposition(nodes, agents, openmetrics=openmetrics, process=process, select=select)


def masked(text: str) -> str:
    """The exposition with the process_* values left out: they are each agent's own."""
    return "\n".join(PROCESS_LINE.sub(r"\1 X", line) for line in text.split("\n"))


def test_the_c_agent_serves_0_0_4_that_promtool_accepts_and_404_elsewhere(tmp_path):
    port, node = free_port(), sleeper(60)  # a node to watch: the format is looked at, not its figures
    agent = c_agent(tmp_path, port, [node.pid], 60)
    try:
        wait_until(lambda: (tmp_path / "samples.json").exists(), "the agent's first sample")
        wait_until(lambda: "flowstat_agent_rounds" in served(port, False), "a self-sample on /metrics")
        text = metrics(port, False)
        assert text.status_code == 200 and text.headers["Content-Type"] == prometheus.TEXT_0_0_4
        lint = subprocess.run(["promtool", "check", "metrics"], input=text.text, capture_output=True, text=True)
        assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
        assert f'node_id="python3-{node.pid}"' in text.text or f'-{node.pid}"' in text.text
        assert "# TYPE flowstat_node_cpu_user_seconds_total counter" in text.text
        assert "# TYPE flowstat_node_state gauge" in text.text and "# EOF" not in text.text
        for name in ("cpu_seconds_total", "resident_memory_bytes", "virtual_memory_bytes", "start_time_seconds"):
            assert re.search(rf"^process_{name} [0-9.e+]+$", text.text, re.M), name
        assert re.search(r"^process_open_fds [1-9][0-9]*$", text.text, re.M)
        assert re.search(r"^process_max_fds -?[0-9]+$", text.text, re.M)
        assert metrics(port, False, "/other").status_code == 404
        assert metrics(port, False, "/metricsx").status_code == 404
    finally:
        stop(agent, node)


def test_the_c_agent_answers_openmetrics_when_asked(tmp_path):
    port, idle = free_port(), sleeper(60)
    agent = c_agent(tmp_path, port, [idle.pid], 60)
    try:
        wait_until(lambda: "flowstat_agent_rounds" in served(port, True), "a self-sample on /metrics")
        om = metrics(port, True)
        assert om.headers["Content-Type"] == prometheus.OPENMETRICS and om.text.endswith("\n# EOF\n")
        assert "# TYPE flowstat_node_state stateset" in om.text
        assert "# UNIT flowstat_node_cpu_user_seconds seconds" in om.text
        assert "process_cpu_seconds_total " in om.text and "# TYPE process_cpu_seconds counter" in om.text
    finally:
        stop(agent, idle)


SELECTED = "?families=cpu_user_seconds,flowstat_node_resident_memory_bytes,node_state&drop_labels=role,host"


@pytest.mark.parametrize("options", ["", SELECTED], ids=["all", "selected"])
@pytest.mark.parametrize("openmetrics", [False, True])
def test_the_same_samples_give_the_python_agents_exposition_byte_for_byte(tmp_path, openmetrics, options):
    """Two nodes (one busy: figures that change) and the agent's self-samples, as the file sink wrote
    them: the Python sink fed the same documents serves the same bytes, process_* values aside, with
    every family or those the URL selects (families=, drop_labels=). A round may fall between the
    scrape and the file's reading: asked again until both are of one."""
    port, busy, idle = free_port(), spinner(60, share=0.2), sleeper(60)
    agent = c_agent(tmp_path, port, [busy.pid, idle.pid], 60, interval=1.0, options=options)
    try:
        wait_until(lambda: "flowstat_agent_rounds" in served(port, openmetrics), "a self-sample on /metrics")
        attempts = []
        for _ in range(20):
            before = written(tmp_path)
            got = metrics(port, openmetrics).text
            if written(tmp_path) == before:  # no round in between
                expected = python_exposition(before, openmetrics, options)
                if masked(got) == masked(expected):
                    break
                attempts.append((got, expected))
            time.sleep(0.1)
        else:
            got, expected = attempts[-1] if attempts else ("", "no quiet moment")
            assert masked(got) == masked(expected)
        assert "flowstat_node_cpu_user_seconds_total{" in got and f"-{idle.pid}" in got
        if options:
            assert "flowstat_node_threads" not in got and 'role="' not in got and "flowstat_agent_rounds" in got
    finally:
        stop(agent, busy, idle)


def test_a_prometheus_scraping_the_c_agent_stores_the_samples_counters_exactly(tmp_path):
    """Debian's Prometheus scrapes the C agent every second while it samples a busy process every
    0.5 s: every CPU counter value Prometheus stored is one the agent sampled, exactly; after the
    process dies, the scrape that says DOWN holds its last one."""
    port, busy = free_port(), spinner(8, share=0.2)
    agent = c_agent(tmp_path, port, [busy.pid], 40)
    try:
        stored, final = scrape_until_down(tmp_path, port, busy)
    finally:
        stop(agent)
        busy.kill()
        busy.wait()
    assert_scraped_exactly(stored, final, tmp_path / "samples.json", busy.pid)


def test_a_gone_node_is_shown_two_more_scrapes_with_its_final_figures(tmp_path):
    port, busy = free_port(), spinner(3, share=0.2)
    agent = c_agent(tmp_path, port, [busy.pid], 60, interval=0.3)
    try:
        busy.wait(30)
        wait_until(lambda: any(d.get("node_state") == "DOWN" for d in written(tmp_path)), "the node reported DOWN")
        sampled = [d["cpu_user_seconds"] for d in written(tmp_path) if "cpu_user_seconds" in d]
        scrapes = [metrics(port, False).text for _ in range(3)]
    finally:
        stop(agent)
    for text in scrapes[:2]:
        assert re.search(rf'flowstat_node_state{{[^}}]*-{busy.pid}",.*flowstat_node_state="DOWN"}} 1\n', text)
        line = re.search(rf"^flowstat_node_cpu_user_seconds_total{{[^}}]*-{busy.pid}\"[^}}]*}} (\S+)$", text, re.M)
        assert line and float(line.group(1)) == sampled[-1]
    assert f"-{busy.pid}" not in scrapes[2] and "flowstat_agent_rounds_total" in scrapes[2]


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "example.com", "[::]"])
def test_metrics_are_served_on_loopback_only(tmp_path, host):
    url = f"prometheus://{host}:9464"
    out = subprocess.run(
        [str(C_AGENT), "--pid", "1", "--count", "1", "--sink", url], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and f"{url}: /metrics is served on loopback only" in out.stderr, out.stderr


def test_a_port_taken_is_an_error_naming_the_url(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        url = f"prometheus://127.0.0.1:{taken.getsockname()[1]}"
        out = subprocess.run(
            [str(C_AGENT), "--pid", "1", "--count", "1", "--sink", url], capture_output=True, text=True, timeout=60
        )
    assert out.returncode != 0 and f"{url}: cannot listen on" in out.stderr, out.stderr


def test_garbage_or_silence_on_the_socket_never_stops_sampling(tmp_path):
    port, idle = free_port(), sleeper(60)
    agent = c_agent(tmp_path, port, [idle.pid], 60, interval=0.2)
    try:
        wait_until(lambda: "flowstat_agent_rounds" in served(port, False), "a self-sample on /metrics")
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]  # more than it serves at once
        garbage = socket.create_connection(("127.0.0.1", port))
        garbage.sendall(b"\x00\xff\x16\x03 not http at all\r\n\r\n")
        garbage.settimeout(10)
        assert garbage.recv(100).startswith(b"HTTP/1.1 400")
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET /metr")  # and never the rest
        count = len(written(tmp_path))
        wait_until(lambda: len(written(tmp_path)) >= count + 10, "samples while clients hang", timeout=10)
        for s in silent[:10]:
            s.close()
        wait_until(lambda: metrics(port, False).status_code == 200, "a scrape while the others hang", timeout=15)
        for s in [*silent[10:], garbage, half]:
            s.close()
    finally:
        stop(agent, idle)
    assert agent.returncode == 0, agent.stderr.read()


def rounds(port: int) -> float:
    """The agent's rounds so far, as its latest self-sample on /metrics says."""
    line = next(x for x in served(port, False).splitlines() if x.startswith("flowstat_agent_rounds"))
    return float(line.rsplit(" ", 1)[1])


def test_each_of_many_nodes_is_one_series_however_often_they_are_put(tmp_path):
    """300 nodes put every 0.1 s: each found again by its key (the store's index grows past 64, 128
    and 256 entries as they come), none shown twice, none lost; a node gone leaves after its two
    scrapes and the others are still found (the index made again after they moved)."""
    port = free_port()
    idle = [sleeper(60) for _ in range(300)]
    agent = c_agent(tmp_path, port, [p.pid for p in idle], 60, interval=0.1)
    series = "flowstat_node_resident_memory_bytes{"
    try:

        def pids() -> list[int]:
            return [
                int(m)
                for m in re.findall(r"^" + re.escape(series) + r'[^}]*node_id="[^"]*-(\d+)"', served(port, False), re.M)
            ]

        wait_until(lambda: len(set(pids())) == 300, "every node on /metrics", timeout=30)
        first = rounds(port)
        wait_until(lambda: rounds(port) >= first + 5, "five more rounds: every node put again", timeout=30)
        shown = pids()
        assert sorted(shown) == sorted(p.pid for p in idle), "a node shown twice or lost"
        gone = idle.pop()
        gone.kill()
        gone.wait()
        wait_until(lambda: gone.pid not in pids(), "the gone node left after its scrapes", timeout=30)
        assert sorted(pids()) == sorted(p.pid for p in idle)
    finally:
        stop(agent, *idle)
