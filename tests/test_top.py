"""``flowstat top`` (issue 46): a live terminal view of a running pipeline, read from its agents'
/metrics or from the samples an agent writes. For real: the example pipeline with its merger made
slow, a Python agent serving /metrics, and top in tmux at 80x24 naming the merger as the stage that
holds the flow back, then quitting on q with the terminal given back; a harness run followed
through its run directory's samples.ndjson (--samples). Its user errors, said without a traceback.
And from fixed inputs: the parsing of /metrics, a samples file followed (bad lines, a line written
in two parts, two agents of one node, a file replaced), the history and rates, and the frame (500
siblings folded into one line, 80 columns, rows cut with "… N more")."""

from __future__ import annotations

import http.server
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from rich.cells import cell_len

from flowstat.flow import Verdict
from flowstat.schema import prometheus
from flowstat.timeutil import iso_utc_ms
from flowstat.top.command import _Keys
from flowstat.top.frame import COLLAPSE_OVER, Frame, render, rows
from flowstat.top.scrape import MetricsError, NodeSample, Scrape, node_samples
from flowstat.top.tail import STALE_S, Tail
from flowstat.top.watch import NodeView, Watch
from support.agents import wait_until
from support.common import PYTHON_AGENT, ROOT, free_port, topology_dict
from support.user_runs import free_port_block

EXAMPLE = ROOT / "examples" / "python-pipeline" / "pipeline.py"
TOP = [sys.executable, "-m", "flowstat", "top"]
STAGES = ("source-0", "worker-0", "worker-1", "merger", "sink")
TMUX = shutil.which("tmux")


# -- for real -----------------------------------------------------------------------------------------
def _tmux(sock: Path, *args: str) -> str:
    return subprocess.run(["tmux", "-S", str(sock), *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.integration
@pytest.mark.skipif(TMUX is None, reason="needs tmux")
def test_top_in_a_terminal_names_the_slow_merger_and_quits_on_q(tmp_path):
    """The merger burns 1 ms of CPU an object and the workers' sends block on its full queue: top,
    in an 80x24 terminal, says HELD BACK by merger on its first line, shows every stage, never draws
    past 80 columns, and q ends it (status 0) leaving the shell's screen as it was."""
    endpoints, port = tmp_path / "endpoints", free_port()
    endpoints.mkdir()
    pipeline = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "all", "--endpoints-dir", str(endpoints), "--run-id", "top-test",
         "--base-port", str(free_port_block()), "--objects", str(10**9), "--slow", "merger", "--slow-us", "1000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    agent = subprocess.Popen(
        [*PYTHON_AGENT, "--endpoints-dir", str(endpoints), "--interval", "0.5", "--rescan", "0.25",
         "--sink", f"prometheus://127.0.0.1:{port}", "--drain-timeout", "0", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    sock = tmp_path / "tmux.sock"
    top = [*TOP, "--metrics", f"127.0.0.1:{port}", "--endpoints", str(endpoints), "--interval", "0.5"]
    shell = f"{shlex.join(top)}; echo top-exited-$?; sleep 60"
    try:
        _tmux(sock, "new-session", "-d", "-x", "80", "-y", "24", "-s", "top", shell)
        screen: list[str] = []

        def named() -> bool:
            screen[:] = _tmux(sock, "capture-pane", "-p", "-J", "-t", "top").splitlines()
            heads = [k for k, line in enumerate(screen) if line.startswith(" NODE")]
            tree = screen[heads[0] + 1 :] if heads else []  # the rows, below the header
            return (
                bool(screen)
                and screen[0].startswith("HELD BACK by merger")
                and all(any(f" {s} " in line for line in tree) for s in STAGES)
            )

        wait_until(named, "top naming the merger as holding the flow back", timeout=45, poll=0.2)
        assert "HELD BACK by merger — merger: busy" in screen[0], screen
        assert all(cell_len(line) <= 80 for line in screen), [line for line in screen if cell_len(line) > 80]
        held = [line for line in screen if line.startswith("▶")]
        assert len(held) == 1 and " merger " in held[0], screen  # the row the verdict names, marked
        _tmux(sock, "send-keys", "-t", "top", "q")

        def ended() -> bool:
            screen[:] = _tmux(sock, "capture-pane", "-p", "-J", "-t", "top").splitlines()
            return any("top-exited-" in line for line in screen)

        wait_until(ended, "top ending on q", timeout=10, poll=0.1)
        assert "top-exited-0" in "\n".join(screen), screen
        assert not any("HELD BACK" in line or "NODE" in line for line in screen), screen  # the screen given back
    finally:
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True)
        for proc in (pipeline, agent):
            proc.send_signal(signal.SIGTERM)
        for proc in (pipeline, agent):
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


class _Exposition(http.server.BaseHTTPRequestHandler):
    body = b"# TYPE process_open_fds gauge\nprocess_open_fds 9\n"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def _top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TOP, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_top_follows_a_running_harness_runs_samples_through_its_run_directory(tmp_path):
    """A harness run going (producers -> merger -> viewer), its Python agent writing the run's
    samples.ndjson: top --samples RUN_DIR --once --after 3 (edges from the run's endpoints.json)
    lists every node of the run, the merger and the viewer with the objects they receive a second,
    under a verdict drawn from the samples (not WAITING, not UNKNOWN for want of edges or samples)."""
    topology = tmp_path / "chain.yaml"
    topology.write_text(yaml.safe_dump(topology_dict(run_id="top", producers={"count": 2, "rate": 200})))
    run_dir = tmp_path / "runs" / "top-samples"
    run = subprocess.Popen(
        [sys.executable, "-m", "flowstat", "run", str(topology), "--run-id", run_dir.name, "--runs-dir",
         str(run_dir.parent), "--duration", "60", "--quiet", "--no-c-agent", "--agent-interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        nodes: list[str] = []

        def sampled() -> bool:
            assert run.poll() is None, run.communicate()
            if not nodes and (run_dir / "endpoints.json").exists():
                nodes[:] = [n["node_id"] for n in json.loads((run_dir / "endpoints.json").read_text())["nodes"]]
            samples = run_dir / "samples.ndjson"
            text = samples.read_text() if nodes and samples.exists() else ""
            return bool(nodes) and all(f'"node_id":"{n}"' in text for n in nodes)

        wait_until(sampled, "the run's agent writing a sample of every node", timeout=30, poll=0.1)
        out = subprocess.run(
            [*TOP, "--samples", str(run_dir), "--once", "--after", "3", "--interval", "0.5"],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, COLUMNS="250"),  # the path, whole
        )  # fmt: skip
        text = out.stdout.splitlines()
        assert out.returncode == 0 and not out.stderr, out
        assert text[0].startswith(("FLOWING — ", "HELD BACK by ")), text  # the verdict, from 3 s of samples
        assert f"samples of {run_dir / 'samples.ndjson'}" in text[1], text
        header = next(k for k, line in enumerate(text) if line.startswith(" NODE"))
        rows_ = {cells[0]: cells for cells in (line.lstrip("▶└ ").split() for line in text[header + 1 :])}
        assert set(rows_) == set(nodes) and len(nodes) >= 3, text
        for node in ("merger-0", "viewer"):
            _, _, state, rate, *_ = rows_[node]  # NODE ROLE STATE IN/s ...
            assert state == "RUNNING" and float(rate.rstrip("k")) > 0, text
    finally:
        run.send_signal(signal.SIGTERM)
        try:
            run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            run.communicate()


def test_once_against_an_agent_that_is_not_there_says_so_naming_it():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    out = _top("--metrics", url, "--once")
    assert out.returncode == 1, out
    assert f"flowstat top: agent {url}: connection refused" in out.stderr
    assert f"agent {url}: connection refused" in out.stdout  # and in the frame, as the live view shows it
    assert "Traceback" not in out.stderr + out.stdout
    assert "\x1b[" not in out.stdout  # not a terminal: plain text


def test_user_errors_are_one_line_without_a_traceback(tmp_path):
    run_dir = tmp_path / "run"  # a run directory whose agent has not written its samples yet
    run_dir.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        not_flowstat = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        cases = [
            (("--metrics", not_flowstat, "--once"), 1, f"agent {not_flowstat}: no flowstat metrics"),
            (("--metrics", "127.0.0.1:9", "--endpoints", str(tmp_path / "gone"), "--once"), 2, "no such file"),
            (("--metrics", "127.0.0.1:9", "--endpoints", __file__, "--once"), 2, "test_top.py: not JSON"),
            (("--metrics", "ftp://127.0.0.1/x", "--once"), 2, "not an http:// or https:// URL"),
            (("--metrics", "127.0.0.1:9",), 2, "the live view needs a terminal"),
            (("--metrics", "127.0.0.1:9", "--interval", "0"), 2, "--interval 0: at least 0.1 s"),
            (("--metrics", "127.0.0.1:9", "--samples", str(tmp_path), "--once"), 2, "--metrics or --samples: one"),
            (("--once",), 2, "--metrics URL (an agent's /metrics) or --samples PATH"),
            (("--samples", str(tmp_path / "gone.ndjson"), "--once"), 2, "gone.ndjson: no such file or directory"),
            (("--samples", str(run_dir), "--once"), 1, f"top: waiting for {run_dir / 'samples.ndjson'}\n"),
        ]  # fmt: skip
        for args, status, said in cases:
            out = _top(*args)
            assert out.returncode == status and said in out.stderr, (args, out)
            assert "Traceback" not in out.stderr, (args, out.stderr)
            assert status != 2 or len(out.stderr.splitlines()) == 1, (args, out.stderr)
    finally:
        server.shutdown()
        server.server_close()
    help_text = _top("--help").stdout
    assert help_text.startswith("usage: flowstat top") and "--once" in help_text and "docs/top.md" in help_text


def test_keys_pressed_together_are_each_taken_and_q_quits():
    read, write = os.pipe()
    try:
        keys = _Keys(io.StringIO())  # not a terminal: no keys, until given the pipe's end
        assert keys.read(0) == []
        keys.fd = read
        os.write(write, b"jj\x1b[Bk\x1b[6~x")
        assert keys.read(1) == ["down", "down", "down", "up", "pgdn"]  # x: no key of top's
        os.write(write, b"jq")
        assert keys.read(1) == ["quit"]
    finally:
        os.close(read), os.close(write)


# -- /metrics, read ---------------------------------------------------------------------------------------
def _sample(node_id: str, role: str, **fields) -> dict:
    return {"run_id": "r", "host": "h", "node_id": node_id, "role": role, "agent": "flowstat-agent-py", **fields}


def test_an_agents_exposition_is_read_back_into_the_samples_fields_in_both_formats():
    docs = [
        _sample("merger", "merger", node_state="RUNNING", busy_ratio=0.97, backpressured_ratio=0.01, idle_ratio=0.02,
                busy_seconds=12.5, objects_received=4772, objects_sent=477, input_latency_p50_ms=0.181),
        _sample('odd "id"\\x', "worker", node_state="DOWN", objects_received=3),
    ]  # fmt: skip
    for openmetrics in (True, False):
        text = prometheus.exposition(docs, openmetrics=openmetrics, process={"open_fds": 9})
        nodes = node_samples(text)
        assert set(nodes) == {"merger", 'odd "id"\\x'}
        m = nodes["merger"]
        assert (m.role, m.host, m.agent, m.state) == ("merger", "h", "flowstat-agent-py", "RUNNING")
        assert m.values["busy_ratio"] == 0.97 and m.values["objects_received"] == 4772
        assert m.values["input_latency_p50_ms"] == pytest.approx(0.181)  # served in seconds, read in ms
        odd = nodes['odd "id"\\x']
        assert odd.state == "DOWN" and odd.get("busy_ratio") is None  # no time accounting: None, not 0


def test_what_is_not_an_agents_metrics_is_said_in_a_few_words():
    with pytest.raises(MetricsError, match="no flowstat metrics"):
        node_samples("# TYPE process_open_fds gauge\nprocess_open_fds 9\n")
    with pytest.raises(MetricsError, match="not the Prometheus text format: line 1"):
        node_samples("<html><body>Not found</body></html>\n")
    with pytest.raises(MetricsError, match="line 2"):
        node_samples('flowstat_node_threads{node_id="a"} 3\nflowstat_node_threads{node_id="b} 3\n')
    # an agent with no node yet, its self-sample only: no node, not an error
    assert node_samples('flowstat_agent_rounds_total{agent="a"} 3 1700000000.5\n') == {}


# -- the history, the rates, the verdict ------------------------------------------------------------------
def _scrape(url: str, **nodes: dict) -> Scrape:
    return Scrape(
        url, {n: NodeSample(n, v["role"], values={k: x for k, x in v.items() if k != "role"}) for n, v in nodes.items()}
    )


def test_watch_rates_the_counters_skips_a_sample_seen_twice_and_judges_the_window():
    watch = Watch(["a", "b"])
    watch.edges.take([{"node_id": "w", "role": "worker", "upstream": []}, {"node_id": "m", "upstream": ["w"]}])
    for k in range(6):
        seen = min(k, 4)  # from the fifth round on, the agent has not sampled again: the same sample
        # the seconds counters move at every new sample: a sample seen again is all the same
        w = {"role": "worker", "busy_ratio": 0.2, "backpressured_ratio": 0.8, "idle_ratio": 0.0, "busy_seconds": seen}
        m = {"role": "merger", "busy_ratio": 0.98, "backpressured_ratio": 0.0, "idle_ratio": 0.02, "busy_seconds": seen}
        m |= {"objects_received": 100.0 * seen, "input_latency_p50_ms": 5.0 + seen}
        # agent b reports the merger too, differently: a's comes first
        watch.update([_scrape("a", w=w, m=m), _scrape("b", m=dict(m, busy_ratio=0.0))], 1000.0 + k)
    views = {v.node_id: v for v in watch.views()}
    assert views["m"].in_rate == pytest.approx(100.0) and views["m"].busy == 0.98
    assert len(watch.series()["m"]) == 5  # the repeated sample added no point
    verdict = watch.verdict()
    assert verdict is not None and verdict.kind == "held_back" and verdict.nodes == ("m",), verdict
    assert watch.reporting == {"a": 2, "b": 0}
    watch.update([_scrape("a", w=w), Scrape("b", error="connection refused")], 1006.0)
    assert watch.errors == {"b": "connection refused"}
    assert {v.node_id: v.reported for v in watch.views()} == {"m": False, "w": True}
    # a sample of /proc's figures alone (the node answered the agent late): the row keeps the node's
    # own figures of two seconds before, not of four
    watch.update([_scrape("a", w=w, m={"role": "merger"})], 1007.0)
    assert next(v for v in watch.views() if v.node_id == "m").busy == 0.98
    watch.update([_scrape("a", w=w, m={"role": "merger", "threads": 3})], 1009.0)
    assert next(v for v in watch.views() if v.node_id == "m").busy is None


# -- a samples file, followed --------------------------------------------------------------------------
NOW = 1_795_000_000.0


def _line(node_id: str, role: str, at: float = NOW, agent: str = "flowstat-agent-py", **fields) -> str:
    """A sample as an agent writes it (sample.schema.json's shape), one line."""
    doc = {"time": iso_utc_ms(at), **_sample(node_id, role, **fields), "seq": 0, "pid": 1, "node_state": "RUNNING"}
    return json.dumps(dict(doc, agent=agent), separators=(",", ":")) + "\n"


def _write(path: Path, *lines: str) -> None:
    with open(path, "a") as f:
        f.write("".join(lines))


def test_a_samples_file_gives_the_latest_sample_a_node_one_agent_each_and_counts_its_bad_lines(tmp_path):
    """A run file's header and self-sample are no samples; a line not JSON and one with a field of the
    wrong type are skipped, counted and the latest named with its line number; a line written in
    two parts is read once whole; the C agent's samples of the merger, after the Python agent's,
    are not taken. Then the Watch, over rounds of both agents writing: the merger's rate, one point
    a round (not two), and the verdict HELD BACK by it."""
    path = tmp_path / "samples.ndjson"
    src = {"busy_ratio": 0.2, "backpressured_ratio": 0.8, "idle_ratio": 0.0, "objects_sent": 0}
    m = {"busy_ratio": 0.98, "backpressured_ratio": 0.0, "idle_ratio": 0.02, "input_latency_p50_ms": 5.0}
    whole = _line("m", "merger", **m, objects_received=50)
    _write(
        path,
        json.dumps({"flowstat_run": {"run_id": "r"}}) + "\n",  # 1: the header
        _line("source", "producer", **src),  # 2
        _line("m", "merger", **m, objects_received=0),  # 3
        _line("m", "merger", agent="flowstat-agent-c", **dict(m, busy_ratio=0.0), objects_received=0),  # 4
        "flowstat_node,node_id=m busy_ratio=0.5 1\n",  # 5: line protocol
        json.dumps({"flowstat_agent": {"agent": "flowstat-agent-py"}}) + "\n",  # 6: a self-sample
        _line("m", "merger", **dict(m, busy_ratio="high")),  # 7: a wrong type
        whole[:40],  # 8, its first part
    )
    tail = Tail(path)
    [scrape] = tail.round(NOW)
    assert scrape.url == str(path) and set(scrape.nodes) == {"source", "m"}
    merger = scrape.nodes["m"]
    assert (merger.role, merger.host, merger.agent, merger.state) == ("merger", "h", "flowstat-agent-py", "RUNNING")
    assert merger.values == {**m, "objects_received": 0.0}  # the sample's own fields and units
    assert scrape.nodes["source"].get("objects_received") is None  # not in the sample: None, not 0
    assert scrape.error == f"{path}: line 7: busy_ratio: not a number (2 bad lines skipped)"
    _write(path, whole[40:])  # the rest of line 8
    [scrape] = tail.round(NOW + 1)
    assert scrape.nodes["m"].get("objects_received") == 50 and tail.bad == 2 and tail.lineno == 8

    watch = Watch([tail.url])
    watch.edges.take([{"node_id": "source", "upstream": []}, {"node_id": "m", "upstream": ["source"]}])
    watch.update([scrape], NOW + 1)
    for k in range(2, 7):
        _write(  # the seconds counters move at every sample: each is a new one
            path,
            _line("source", "producer", **src, busy_seconds=k),
            _line("m", "merger", **m, busy_seconds=k, objects_received=50 + 100 * (k - 1)),
            _line("m", "merger", agent="flowstat-agent-c", **dict(m, busy_ratio=0.1), busy_seconds=k + 0.5),
        )
        watch.update(tail.round(NOW + k), NOW + k)
    views = {v.node_id: v for v in watch.views()}
    assert views["m"].in_rate == pytest.approx(100.0) and views["m"].busy == 0.98
    assert len(watch.series()["m"]) == 6  # a point a round: the C agent's samples of m add none
    verdict = watch.verdict()
    assert verdict is not None and verdict.kind == "held_back" and verdict.nodes == ("m",), verdict
    # the frame names the file and the bad line, not an "agent"
    text = [line.plain for line in render(_frame_of(watch), 300)[0]]
    assert f"{path}: line 7: busy_ratio: not a number (2 bad lines skipped)" in text, text
    assert text[1].startswith(f"2 nodes · samples of {path} · every 1 s"), text


def _frame_of(watch: Watch) -> Frame:
    agents = [(u, watch.errors.get(u)) for u in watch.urls]
    return Frame(watch.verdict(), watch.views(), dict(watch.edges.upstream), agents, at=watch.at, samples=True)


def test_a_samples_file_read_first_skips_samples_older_than_the_window_and_starts_over_when_replaced(tmp_path):
    """A finished run is not shown as going: the first read skips what was sampled more than the
    window before; lines written later are taken whatever their time, until none comes for
    STALE_S. A file replaced, or truncated, is read again from its start; one gone is waited for."""
    path = tmp_path / "samples.ndjson"
    _write(path, _line("old", "merger", at=NOW - 60), _line("new", "merger", at=NOW - 5))
    tail = Tail(path)
    [scrape] = tail.round(NOW)
    assert set(scrape.nodes) == {"new"} and scrape.error is None
    _write(path, _line("old", "merger", at=NOW - 60))  # followed: taken
    assert set(tail.round(NOW + 1)[0].nodes) == {"new", "old"}
    [scrape] = tail.round(NOW + 1 + STALE_S + 0.5)  # nothing written since
    assert scrape.nodes == {} and scrape.error == f"{path}: no sample in the last {STALE_S:g} s: has the run ended?"

    replacement = tmp_path / "next.ndjson"
    _write(replacement, _line("other", "viewer", at=NOW + 20), "{not json\n")
    os.replace(replacement, path)
    [scrape] = tail.round(NOW + 20)
    assert set(scrape.nodes) == {"other"} and scrape.error == f"{path}: line 2: not JSON"  # counted from 1 again
    path.write_text(_line("again", "viewer", at=NOW + 21))  # truncated, then written
    assert set(tail.round(NOW + 21)[0].nodes) == {"again"}
    path.unlink()
    assert tail.round(NOW + 22)[0].error == f"waiting for {path}"
    path.write_text("")
    assert tail.round(NOW + 23)[0].error == f"{path}: no sample yet"
    tail.close()


# -- the frame ---------------------------------------------------------------------------------------------
def _view(node_id: str, role: str, busy=0.5, backpressured=0.2, rate=100.0) -> NodeView:
    return NodeView(node_id, role, "RUNNING", rate, busy, backpressured, 1 - busy - backpressured, 12.0, True)


def _wide_pipeline(producers: int = 500) -> tuple[list[NodeView], dict[str, list[str]]]:
    views = [_view(f"producer-{i}", "producer", 0.1, 0.8) for i in range(producers)]
    views += [_view("merger-0", "merger", 0.99, 0.0, 5000.0), _view("viewer", "viewer", 0.05, 0.0, 50.0)]
    upstream = {f"producer-{i}": [] for i in range(producers)}
    upstream |= {"merger-0": [f"producer-{i}" for i in range(producers)], "viewer": ["merger-0"]}
    return views, upstream


EVIDENCE = (
    "merger-0: busy 99%, input latency 3->40 ms, upstream producer-17 backpressured 80%, producer-3 backpressured "
    "80%, producer-9 backpressured 80%"
)
HELD = Verdict("held_back", ("merger-0",), EVIDENCE, 1.0)


def test_500_siblings_are_one_line_with_their_sum_and_means_and_the_frame_fits_80_columns():
    views, upstream = _wide_pipeline()
    frame = Frame(HELD, views, upstream, [("http://127.0.0.1:9464/metrics", None)], at=1e9)
    lines, _ = render(frame, 80, 24)
    text = [line.plain for line in lines]
    assert all(cell_len(line) <= 80 for line in text), text
    assert len(text) <= 24
    assert text[0].startswith("HELD BACK by merger-0 — merger-0: busy 99%")
    assert text[1].startswith("  producer-17 backpressured 80%")  # the evidence, wrapped
    folded = next(t for t in text if "producer ×500" in t)
    assert " 50.0k " in folded  # 500 x 100 objects/s, summed
    assert " 10% " in folded and " 80% " in folded  # busy and backpressured, their means
    merger = next(t for t in text if "merger-0" in t and t.startswith("▶"))  # the node named, marked
    viewer = next(t for t in text if "viewer" in t)
    assert text.index(folded) < text.index(merger) < text.index(viewer)  # sources first, then down
    assert merger.startswith("▶└ merger-0") and viewer.startswith("   └ viewer")  # indented by depth


def test_rows_fold_only_past_eight_and_never_fold_a_node_the_verdict_names():
    views = [_view(f"w-{i}", "worker") for i in range(COLLAPSE_OVER)] + [_view("sink", "sink")]
    upstream = {"sink": [f"w-{i}" for i in range(COLLAPSE_OVER)]}
    assert [r.label for r in rows(views, upstream)][:3] == ["w-0", "w-1", "w-2"]  # eight: one by one
    views.append(_view("w-8", "worker"))
    upstream["sink"].append("w-8")
    assert [r.label for r in rows(views, upstream)] == ["worker ×9", "sink"]
    views += [_view(f"w-{i}", "worker") for i in range(9, 12)]
    upstream["sink"] += [f"w-{i}" for i in range(9, 12)]
    assert [r.label for r in rows(views, upstream, held=["w-10"])] == ["w-10", "worker ×11", "sink"]


def test_a_long_list_is_cut_with_how_many_more_and_scrolls_without_edges_grouped_by_role():
    views = [_view(f"node-{i}", f"role{i % 40}") for i in range(120)]  # 40 roles of 3: nothing folds
    frame = Frame(None, views, {}, [("http://127.0.0.1:9464/metrics", "connection refused")], hint="h")
    lines, offset = render(frame, 80, 24)
    text = [line.plain for line in lines]
    assert len(text) == 24 and all(cell_len(t) <= 80 for t in text)
    assert text[0].startswith("WAITING")
    assert "agent http://127.0.0.1:9464/metrics: connection refused" in text
    first = text.index(next(t for t in text if t.startswith(" NODE"))) + 1
    shown = 24 - first - 1
    assert text[-1].startswith(f"… {120 - shown} more") and offset == 0
    lines, offset = render(frame, 80, 24, offset=10**6)  # scrolled past the end: clamped
    assert offset == 120 - shown and lines[-1].plain.startswith(f"… end ({offset} above)")
    everything, _ = render(frame, 80, None)  # --once, not a terminal: every row
    assert len([t for t in everything if "node-" in t.plain]) == 120
