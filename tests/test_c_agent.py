"""The C agent (collectors/c/build/flowstat-agent, built by make) against real processes, sockets
and receivers; its conformance with the Python agent; valgrind, ASan and the fuzzers."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time

import pytest

from flowstat.agent.agent import Agent, AgentConfig
from flowstat.agent.targets import TargetSpec
from flowstat.schema import agent as agent_schema
from flowstat.schema import flow as flow_schema
from flowstat.schema import sample as sample_schema
from support.agents import SOURCES_KEPT, HttpReceiver, StubNode, sleeper, spinner, wait_until
from support.common import C_AGENT as AGENT
from support.common import C_ASAN as ASAN
from support.common import C_BUILD as BUILD
from support.common import PYTHON_AGENT, ROOT, free_port, needs

FUZZ_SECONDS = int(os.environ.get("FLOWSTAT_FUZZ_SECONDS", "4"))  # a smoke test: make bench fuzzes 5 minutes each
FUZZ_TARGETS = ("stat", "reply", "endpoints", "sink_url", "credentials", "curve_key", "config")


def c_agent(*args, binary=AGENT, timeout=60, **kw):
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def random_sample(rng: random.Random) -> dict:
    s = {}
    texts = ["merger-0", "a b,c=d", 'q"uote', "back\\slash", "ünïcode", "tab\there", "x" * 100]
    for f in sample_schema.fields():
        if not f.required and rng.random() < 0.3:
            continue
        if f.influx == "time":
            s[f.name] = (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(rng.randrange(0, 2**31)))
                + f".{rng.randrange(1000):03d}Z"
            )
        elif f.enum:
            s[f.name] = rng.choice(f.enum)
        elif f.pattern:  # the role: the harness's, or any other the pattern allows
            s[f.name] = rng.choice(["producer", "merger", "worker", "a-b_9"])
        elif f.type == "string":
            s[f.name] = rng.choice(texts)
        elif f.type == "integer":
            s[f.name] = rng.choice([0, 1, 42, 2**31, 2**53, rng.randrange(10**12)])
        elif f.type == "number":
            s[f.name] = rng.choice(
                [
                    0.0,
                    0.1,
                    100.0,
                    1e-05,
                    1.5e20,
                    123456.789,
                    rng.random() * 10 ** rng.randrange(-8, 20),
                    round(rng.random() * 2e6, 1),
                ]
            )
        else:
            s[f.name] = rng.random() < 0.5
    return s


@needs(AGENT)
def test_both_agents_encode_every_sample_byte_for_byte_alike():
    rng = random.Random(7)
    samples = [random_sample(rng) for _ in range(2000)]
    assert all(sample_schema.validate(s) == [] for s in samples)
    stdin = "".join(json.dumps(s) + "\n" for s in samples)
    line = c_agent("--encode", "line", input=stdin)
    assert line.returncode == 0, line.stderr
    assert line.stdout.splitlines() == [sample_schema.to_line_protocol(s) for s in samples]
    js = c_agent("--encode", "json", input=stdin)
    assert js.stdout.splitlines() == [sample_schema.to_json(s) for s in samples]


def random_self_sample(rng: random.Random) -> dict:
    """A self-sample of the agent schema: every field, run_id now and then left out."""
    doc = {}
    for f in agent_schema.fields():
        if f.influx == "time":
            doc[f.name] = (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(rng.randrange(0, 2**31)))
                + f".{rng.randrange(1000):03d}Z"
            )
        elif f.type == "string":
            doc[f.name] = rng.choice(["flowstat-agent-c", "flowstat-agent-py/a b,c=d", 'q"uote', "ünïcode", "r1"])
        elif f.type == "integer":
            doc[f.name] = rng.choice([0, 1, 42, 2**31, 2**53, rng.randrange(10**12)])
        else:
            doc[f.name] = rng.choice(
                [0.01, 0.5, 1.0, 5, 3600.0, 1, rng.random() * 10]
            )  # a whole number too: written as a float
    if rng.random() < 0.3:
        del doc["run_id"]
    return doc


@needs(AGENT)
def test_both_agents_encode_every_self_sample_byte_for_byte_alike():
    """A run file's self-sample lines, as the C agent's --encode reads them: the same line protocol
    and JSON documents as the Python agent writes (flowstat.schema.agent)."""
    rng = random.Random(11)
    docs = [random_self_sample(rng) for _ in range(500)]
    assert all(agent_schema.validate(d) == [] for d in docs)
    stdin = "".join(json.dumps({agent_schema.RUN_FILE_KEY: d}) + "\n" for d in docs)
    line = c_agent("--encode", "line", input=stdin)
    assert line.returncode == 0, line.stderr
    assert line.stdout.splitlines() == [agent_schema.to_line_protocol(d) for d in docs]
    js = c_agent("--encode", "json", input=stdin)
    assert js.stdout.splitlines() == [agent_schema.to_json(d) for d in docs]
    bad = json.dumps({agent_schema.RUN_FILE_KEY: {**docs[0], "sinks_down": -1}})
    out = c_agent("--encode", "line", input=f"{bad}\n" + json.dumps({agent_schema.RUN_FILE_KEY: 3}) + "\n")
    assert out.returncode == 1 and not out.stdout
    assert (
        "stdin line 1: sinks_down: wrong type" in out.stderr
        and "stdin line 2: flowstat_agent: not a JSON object" in out.stderr
    )


@needs(AGENT)
def test_both_agents_encode_every_edge_counter_byte_for_byte_alike():
    """Edge counters (a node's received_from, flowstat.schema.flow.counter_points), as the C agent's
    --encode reads a run file's lines: the same line protocol and JSON as the Python agent writes,
    names with line protocol's and JSON's special characters included."""
    rng = random.Random(12)
    names = ["w-0", "a b", "x,y=z", 'q"uote', "back\\slash", "ünï", "tab\tx"]
    docs = [
        {
            "time": f"2026-11-29T10:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z",
            "run_id": rng.choice(["r1", "run two"]),
            "from": rng.choice(names),
            "to": rng.choice(names),
            "agent": rng.choice(["flowstat-agent-c", "flowstat-agent-py/p"]),
            "objects_received": rng.choice([0, 1, rng.randrange(2**53)]),
        }
        for _ in range(300)
    ]
    assert all(flow_schema.validate("edge", d) == [] for d in docs)
    stdin = "".join(json.dumps({flow_schema.EDGE_RUN_FILE_KEY: d}) + "\n" for d in docs)
    line = c_agent("--encode", "line", input=stdin)
    assert line.returncode == 0, line.stderr
    assert line.stdout.splitlines() == [flow_schema.to_line_protocol("edge", d) for d in docs]
    js = c_agent("--encode", "json", input=stdin)
    assert js.stdout.splitlines() == [flow_schema.to_json("edge", d) for d in docs]


def both_agents_on_a_stopped_process(tmp_path, *, count: int, interval_s: float, self_interval_s: float) -> None:
    """The C agent, then the Python one, sampling the same stopped process (it holds still) into
    tmp_path/c.json and tmp_path/py.json, as JSON lines."""
    proc = sleeper()
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        out = c_agent(
            *("--pid", proc.pid, "--count", count, "--interval", interval_s, "--run-id", "conf"),
            *("--self-interval", self_interval_s, "--sink", f"file://{tmp_path}/c.json?format=json"),
            "--quiet",
        )
        assert out.returncode == 0, out.stderr
        Agent(
            AgentConfig(
                TargetSpec(pids=[proc.pid], run_id="conf"),
                [f"file://{tmp_path}/py.json?format=json"],
                interval_s=interval_s,
                count=count,
                self_interval_s=self_interval_s,
            )
        ).run()
    finally:
        proc.kill()


@needs(AGENT)
def test_both_agents_emit_the_same_self_sample_fields(tmp_path):
    """The same stopped process, the same rounds: the same self-samples but for the agent's name,
    the times and what their own sinks did."""
    both_agents_on_a_stopped_process(tmp_path, count=6, interval_s=0.1, self_interval_s=0.2)
    names = [f.name for f in agent_schema.fields()]
    last = {}
    for name in ("c.json", "py.json"):
        selves = [d for d in map(json.loads, open(tmp_path / name)) if "node_id" not in d]
        assert len(selves) >= 3  # every 0.2 s over 0.6 s of rounds, and one at exit
        assert [d["seq"] for d in selves] == list(range(len(selves)))
        for d in selves:
            assert agent_schema.validate(d) == [] and list(d) == names  # every field, in schema order
        last[name] = selves[-1]
    c, py = last["c.json"], last["py.json"]
    assert (c["agent"], py["agent"]) == ("flowstat-agent-c", "flowstat-agent-py")
    same = (
        "run_id",
        "host",
        "interval_s",
        "rounds",
        "samples",
        "targets",
        "proc_errors",
        "refused",
        "lost",
        "spool_dropped",
        "spooled_batches",
        "spooled_samples",
        "sinks_down",
        "send_failures",
        "failovers",
    )
    assert {k: c[k] for k in same} == {k: py[k] for k in same}
    assert (c["run_id"], c["interval_s"], c["rounds"], c["samples"], c["targets"]) == ("conf", 0.1, 6, 6, 1)


@needs(AGENT)
def test_encode_reports_bad_lines_by_number_and_keeps_the_good_ones():
    good = json.dumps(random_sample(random.Random(1)))
    bad = json.dumps({**json.loads(good), "seq": -1})
    out = c_agent("--encode", "line", input=f"{good}\nnot json\n{bad}\n{good}\n")
    assert out.returncode == 1 and len(out.stdout.splitlines()) == 2
    assert "stdin line 2: sample: not a JSON object" in out.stderr and "stdin line 3: seq: wrong type" in out.stderr


@needs(AGENT)
def test_both_agents_take_identical_samples_of_the_same_node(tmp_path):
    """A stopped process holds still: both agents must then see exactly the same thing."""
    both_agents_on_a_stopped_process(tmp_path, count=3, interval_s=0.05, self_interval_s=0)
    c = [json.loads(x) for x in open(tmp_path / "c.json")]
    py = [json.loads(x) for x in open(tmp_path / "py.json")]
    assert len(c) == len(py) == 3
    for a, b in zip(c, py, strict=False):
        assert sample_schema.validate(a) == []
        assert a["agent"] == "flowstat-agent-c" and b["agent"] == "flowstat-agent-py"
        strip = lambda d: {k: v for k, v in d.items() if k not in ("time", "agent")}
        assert strip(a) == strip(b)


@needs(AGENT)
def test_both_agents_agree_on_live_harness_nodes(tmp_path):
    from flowstat.harness.orchestrator import Orchestrator
    from flowstat.harness.topology import from_dict
    from support.common import topology_dict

    orch = Orchestrator(from_dict(topology_dict(duration=30)), "live", tmp_path / "live")
    orch.start()
    try:
        orch.poll_metrics()  # as flowstat run does every second: the merger learns what is in flight to it
        endpoints = tmp_path / "live" / "endpoints.json"
        c = subprocess.Popen(
            [
                str(AGENT),
                "--endpoints",
                str(endpoints),
                "--count",
                "6",
                "--interval",
                "0.2",
                "--self-interval",
                "0",
                "--sink",
                f"file://{tmp_path}/c.json?format=json",
                "--quiet",
            ]
        )
        Agent(
            AgentConfig(
                TargetSpec(endpoints_files=[str(endpoints)]),
                [f"file://{tmp_path}/py.json?format=json"],
                interval_s=0.2,
                count=6,
                self_interval_s=0,
            )
        ).run()
        assert c.wait(30) == 0
    finally:
        orch.stop()
        orch.kill_all()
        orch.close()
    c = [json.loads(x) for x in open(tmp_path / "c.json")]
    py = [json.loads(x) for x in open(tmp_path / "py.json")]
    for node in ("merger-0", "viewer", "producers-0"):
        cs = [x for x in c if x["node_id"] == node]
        ps = [x for x in py if x["node_id"] == node]
        assert len(cs) == len(ps) == 6
        for a, b in zip(cs, ps, strict=False):
            assert sample_schema.validate(a) == [], a
            assert set(a) == set(b)  # the same fields, from the same control reply fields
            for key in (
                "run_id",
                "host",
                "node_id",
                "role",
                "pid",
                "seq",
                "node_state",
                "receive_buffer_size",
                "send_buffer_size",
                "threads",
            ):
                assert a.get(key) == b.get(key), (node, key)
            assert abs(a["vmrss_kb"] - b["vmrss_kb"]) <= 0.05 * b["vmrss_kb"]
        if node == "merger-0":  # issue 9's fields, from the merger's reply, in both agents' samples
            for sample in (cs[-1], ps[-1]):
                assert {
                    "objects_in_flight",
                    "objects_held",
                    "input_latency_objects",
                    "input_latency_p50_ms",
                    "input_latency_p99_ms",
                    "input_latency_max_ms",
                } <= set(sample), sample
                assert 0 < sample["input_latency_p50_ms"] <= sample["input_latency_max_ms"] < 30_000


@needs(AGENT)
def test_receiver_down_for_seconds_loses_and_duplicates_nothing(tmp_path):
    receiver = HttpReceiver()
    proc = sleeper()
    url = f"http://127.0.0.1:{receiver.port}/write"
    agent = subprocess.Popen(
        [
            str(AGENT),
            "--pid",
            str(proc.pid),
            "--interval",
            "0.05",
            "--duration",
            "6",
            "--self-interval",
            "0",
            "--sink",
            url,
            "--spool-dir",
            str(tmp_path / "spool"),
            "--stats",
            str(tmp_path / "stats.json"),
            "--quiet",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    spooled = lambda: len(list((tmp_path / "spool").rglob("*.batch")))
    try:
        wait_until(lambda: len(receiver.lines()) >= 10, "10 samples delivered before the outage", timeout=10)
        receiver.stop()
        # down until 30 rounds have gone to the spool: an outage of about a second and a half
        wait_until(lambda: spooled() >= 30, "30 batches spooled while the receiver is down", timeout=5)
        receiver.start()
        assert agent.wait(30) == 0, agent.stderr.read()
    finally:
        proc.kill()
        agent.kill()
    seqs = [int(line.split("seq=")[1].split("i")[0]) for line in receiver.lines()]
    assert sorted(seqs) == list(range(len(seqs))) and len(seqs) >= 80  # once each (live first: not in order)
    stats = json.loads((tmp_path / "stats.json").read_text())["sinks"][url]
    assert stats["delivered"] == len(seqs) and stats["spooled"] == 0 and stats["lost"] == 0


def run_scenario(binary, tmp_path, wrap=()):
    """A vanishing target, a hung and a garbage control socket, a good one: what must not crash it.
    Returns the run's result, its node samples and its self-samples."""
    hung, garbage, ok = StubNode("hang"), StubNode("garbage"), StubNode("ok")
    procs = [sleeper(), sleeper(), sleeper(), sleeper(1.0)]
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps(
            {
                "run_id": "r",
                "nodes": [
                    {"node_id": f"n{i}", "role": "merger", "pid": p.pid, "control": n.endpoint}
                    for i, (p, n) in enumerate(zip(procs, (hung, garbage, ok), strict=False))
                ]
                + [{"node_id": "short", "role": "producer", "pid": procs[3].pid}],
            }
        )
    )
    try:
        out = subprocess.run(
            [
                *wrap,
                str(binary),
                "--endpoints",
                str(endpoints),
                *("--count", "12", "--interval", "0.2", "--control-timeout", "0.1", "--self-interval", "0.5"),
                *("--sink", f"file://{tmp_path}/s.json?format=json"),
                "--stats",
                str(tmp_path / "stats.json"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        for p in procs:
            p.kill()
        for n in (hung, garbage, ok):
            n.close()
    # a request is one frame (and the ROUTER's identity): with CURVE each frame is encrypted on its own
    assert ok.frames_per_request == {2}
    docs = [json.loads(x) for x in open(tmp_path / "s.json")]
    return out, [d for d in docs if "node_id" in d], [d for d in docs if "node_id" not in d]


@needs(AGENT)
def test_vanished_target_hung_and_garbage_control(tmp_path):
    out, docs, _ = run_scenario(AGENT, tmp_path)
    assert out.returncode == 0, out.stderr
    short = [d["node_state"] for d in docs if d["node_id"] == "short"]
    assert short.count("DOWN") == 1 and short[-1] == "DOWN"
    good = [d for d in docs if d["node_id"] == "n2"]
    assert len(good) == 12 and good[-1]["average_merge_time_ms"] == 0.25 and "objects_held" not in good[-1]
    assert all("average_merge_time_ms" not in d for d in docs if d["node_id"] in ("n0", "n1"))
    assert json.loads((tmp_path / "stats.json").read_text())["control_errors"] >= 20
    assert "is gone" in out.stderr


@needs(AGENT)
@pytest.mark.skipif(subprocess.run(["which", "valgrind"], capture_output=True).returncode != 0, reason="no valgrind")
def test_clean_under_valgrind(tmp_path):
    out, docs, selves = run_scenario(
        AGENT,
        tmp_path,
        wrap=("valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite", "--error-exitcode=99", "--quiet"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(docs) >= 30 and [d["seq"] for d in selves] == list(range(len(selves))) and len(selves) >= 2


@needs(ASAN)
def test_clean_under_address_sanitizer(tmp_path):
    out, docs, selves = run_scenario(ASAN, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr
    assert len(docs) >= 30 and [d["seq"] for d in selves] == list(range(len(selves))) and len(selves) >= 2


@pytest.mark.parametrize("target", [pytest.param(t, marks=needs(BUILD / f"fuzz_{t}")) for t in FUZZ_TARGETS])
def test_fuzz_parsers_briefly(tmp_path, target):
    fuzzer = BUILD / f"fuzz_{target}"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for seed in (ROOT / "collectors" / "c" / "fuzz" / "corpus" / target).iterdir():
        (corpus / seed.name).write_bytes(seed.read_bytes())
    out = subprocess.run(
        [str(fuzzer), f"-max_total_time={FUZZ_SECONDS}", "-timeout=5", "-rss_limit_mb=1024", str(corpus)],
        capture_output=True,
        text=True,
        timeout=FUZZ_SECONDS + 120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Done" in out.stderr


@needs(AGENT)
@pytest.mark.parametrize(
    "args,message",
    [
        ([], "give at least one target"),
        (["--pid", "x"], "--pid: bad process id"),
        (["--pid", "1", "--interval", "0"], "--interval: expected seconds >= 0.01"),
        (["--pid", "1", "--sink", "gopher://x:1"], "unknown sink"),
        (["--pid", "1", "--pattern", "("], "--pattern"),
        (["--pid", "1", "--sink", "udp://127.0.0.1:9?format=json"], "UDP carries line protocol only"),
        (["--pid", "1", "--spool-max-mb", "0"], "--spool-max-mb: expected megabytes >= 0.001, got '0'"),
        (["--pid", "1", "--send-max-kb", "0.5"], "--send-max-kb: expected kibibytes between 1 and 1048576, got '0.5'"),
        (["--pid", "1", "--send-max-kb", "nan"], "--send-max-kb: expected kibibytes between 1 and 1048576, got 'nan'"),
        (["--pid", "1", "--count", ""], "--count: expected a number, got ''"),
        (["--pid", "1", "--bogus"], "unrecognized option '--bogus'"),
        (["--pid"], "option '--pid' requires an argument"),
        (["--pid", "1", "stray"], "unexpected argument 'stray'"),
    ],
)
def test_bad_arguments_are_refused_clearly(args, message):
    out = c_agent(*args)
    assert out.returncode == 2 and message in out.stderr


@needs(AGENT)
def test_help_names_every_option_the_agent_takes():
    out = c_agent("--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: flowstat-agent") and not out.stderr
    taken = re.findall(r'\{"([a-z-]+)", [01], ', (ROOT / "collectors" / "c" / "agent" / "options.c").read_text())
    assert len(taken) >= 20 and [name for name in taken if f"--{name} " not in out.stdout] == []


@needs(AGENT)
def test_both_agents_keep_roles_and_states_to_the_schemas_lists(tmp_path):
    """A node that says it is a 'Bad Role!' in state 'SLEEPING': both agents record role other and state
    UP (the schema's defaults), never a value the stores and dashboards do not know."""
    node, proc = StubNode("unknown"), sleeper()
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps(
            {
                "run_id": "r",
                "nodes": [
                    {"node_id": "odd", "role": sample_schema.DEFAULT_ROLE, "pid": proc.pid, "control": node.endpoint}
                ],
            }
        )
    )
    try:
        out = c_agent(
            *("--endpoints", endpoints, "--count", 2, "--interval", 0.05, "--self-interval", 0),
            *("--sink", f"file://{tmp_path}/c.json?format=json"),
            "--quiet",
        )
        assert out.returncode == 0, out.stderr
        Agent(
            AgentConfig(
                TargetSpec(endpoints_files=[str(endpoints)]),
                [f"file://{tmp_path}/py.json?format=json"],
                interval_s=0.05,
                count=2,
                self_interval_s=0,
            )
        ).run()
    finally:
        proc.kill()
        node.close()
    for name in ("c.json", "py.json"):
        docs = [json.loads(x) for x in open(tmp_path / name)]
        assert len(docs) == 2 and all(sample_schema.validate(d) == [] for d in docs)
        assert {(d["role"], d["node_state"], d["objects_received"]) for d in docs} == {("other", "UP", 10)}


@needs(AGENT)
def test_both_agents_write_a_node_s_good_sources_only_and_no_edge_counter_to_prometheus(tmp_path):
    """A reply's received_from: both agents write an edge counter for each good source, alike, and
    pass over the bad ones; a prometheus:// sink serves none, nor counts them as delivered."""
    node, proc = StubNode("sources"), sleeper()
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(
        json.dumps({"run_id": "r", "nodes": [{"node_id": "sink", "pid": proc.pid, "control": node.endpoint}]})
    )
    sinks = {
        name: [f"file://{tmp_path}/{name}.json?format=json", f"prometheus://127.0.0.1:{free_port()}"]
        for name in ("c", "py")
    }
    common = ["--count", 2, "--interval", 0.05, "--self-interval", 0, "--drain-timeout", 0]
    try:
        out = c_agent(
            "--endpoints",
            endpoints,
            *common,
            *(a for u in sinks["c"] for a in ("--sink", u)),
            "--stats",
            tmp_path / "c-stats.json",
            "--quiet",
        )
        assert out.returncode == 0, out.stderr
        py = subprocess.run(
            [
                *PYTHON_AGENT,
                "--endpoints",
                str(endpoints),
                *map(str, common),
                *(a for u in sinks["py"] for a in ("--sink", u)),
                "--stats",
                str(tmp_path / "py-stats.json"),
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert py.returncode == 0, py.stderr
    finally:
        proc.kill()
        node.close()
    for name in ("c", "py"):
        docs = [json.loads(x) for x in open(tmp_path / f"{name}.json")]
        edges = [d for d in docs if "node_id" not in d]
        assert {(d["from"], d["to"], d["objects_received"]) for d in edges} == {
            (source, "sink", n) for source, n in SOURCES_KEPT.items()
        }
        assert len(edges) == 2 * len(SOURCES_KEPT) and all(flow_schema.validate("edge", d) == [] for d in edges)
        delivered = {
            url.split(":")[0]: v["delivered"]
            for url, v in json.loads((tmp_path / f"{name}-stats.json").read_text())["sinks"].items()
        }
        assert delivered == {"file": 2 + len(edges), "prometheus": 2}, delivered


def test_a_role_that_changes_is_checked_as_it_changes(tmp_path):
    """The C agent checks a node's role once per role it says, not per sample: a node that says
    merger, then a role outside the schema, by turns, is recorded merger, other, merger, other."""
    node, proc = StubNode("roles"), sleeper()
    endpoints = tmp_path / "endpoints.json"
    nodes = [{"node_id": "turns", "role": sample_schema.DEFAULT_ROLE, "pid": proc.pid, "control": node.endpoint}]
    endpoints.write_text(json.dumps({"run_id": "r", "nodes": nodes}))
    try:
        out = c_agent(
            *("--endpoints", endpoints, "--count", 4, "--interval", 0.05, "--self-interval", 0),
            *("--sink", f"file://{tmp_path}/c.json?format=json"),
            "--quiet",
        )
        assert out.returncode == 0, out.stderr
    finally:
        proc.kill()
        node.close()
    docs = [json.loads(x) for x in open(tmp_path / "c.json")]
    assert [d["role"] for d in docs] == ["merger", "other", "merger", "other"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat fields 14 and 15, in clock ticks).
    Parsed here, not by flowstat.proc's parser: that one is under test."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_pid(path) -> dict[int, list[tuple[float, float]]]:
    """(time, cpu_clock_hz) of each process's samples, in order."""
    out: dict[int, list[tuple[float, float]]] = {}
    for doc in map(json.loads, open(path)):
        out.setdefault(doc["pid"], []).append((sample_schema.time_ns(doc["time"]) / 1e9, doc["cpu_clock_hz"]))
    return out


def test_cpu_clock_is_a_million_hz_for_a_busy_core_and_near_zero_for_an_idle_process(tmp_path, agent_command):
    """The schema's unit (10^6 Hz = one full core, thesis formula (1)): a process that never waits
    measures up to 10^6, one that sleeps about 0; and the rates, times the time between samples, add
    up to the CPU time the kernel counted for the busy process meanwhile."""
    busy, idle = spinner(), sleeper()
    try:
        cpu_before, wall_before = cpu_seconds(busy.pid), time.time()
        out = subprocess.run(
            [
                *agent_command,
                *map(
                    str,
                    (
                        *("--pid", busy.pid, "--pid", idle.pid, "--count", 6, "--interval", 0.25),
                        *("--self-interval", 0, "--sink", f"file://{tmp_path}/s.json?format=json"),
                        "--quiet",
                    ),
                ),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        cpu_used, wall = cpu_seconds(busy.pid) - cpu_before, time.time() - wall_before
    finally:
        busy.kill()
        idle.kill()
    assert out.returncode == 0, out.stderr
    samples = cpu_by_pid(tmp_path / "s.json")
    # the first sample of a process has no earlier reading to measure from
    busy_rates, idle_rates = [r for _, r in samples[busy.pid][1:]], [r for _, r in samples[idle.pid][1:]]
    assert len(busy_rates) == len(idle_rates) == 5
    # one thread is never more than one core; how much of one it gets depends on what else runs (the
    # scale itself is checked below, against the kernel's count)
    assert 0 < sum(busy_rates) / 5 <= 1.3e6 and min(busy_rates) > 0, busy_rates
    assert all(0 <= r < 0.05e6 for r in idle_rates), idle_rates
    stamps = [t for t, _ in samples[busy.pid]]
    measured = sum(r * (b - a) for r, a, b in zip(busy_rates, stamps, stamps[1:], strict=False)) / 1e6
    # what the kernel counted around the agent's run, less at most one core outside the sampled window
    outside = wall - (stamps[-1] - stamps[0])
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert cpu_used - outside - 2 * tick <= measured <= cpu_used + 2 * tick, (measured, cpu_used, outside)
