#!/usr/bin/env python3
"""Soak (issue 28): 10,000 watched processes at 1 Hz into both stores for an hour, faults injected.

What runs. Real processes (benchmarks/soak/idler.c: a parent forks N children that sleep, wake every
2 s, and are killed and reaped with their parent) are watched at 1 Hz by the C agent, which ships
to Telegraf -> InfluxDB (through a relay of this script, so that the sink can be made to stop
reading) and straight to Elasticsearch (daily indices, as the compose stack's Logstash writes them).
The Python agent watches a share of the same processes alongside, to the same stores. A third
agent (C) watches a small group of its own with its spool on a tiny tmpfs, for the spool-full fault.
The stores are flowstat's own local stack (`flowstat stack`, in .cache/bench-stack, as the other benchmarks).

The scale ladder (first). 100, 1,000, 3,000, 10,000 processes (--ladder), each rung for
--rung-seconds after a warm-up: each component's CPU time per sample (agent, Telegraf, InfluxDB,
Elasticsearch: their process trees, schedstat), its share of a core, and the sample->queryable delay.

The hour (--minutes, default 60). Faults, each at a time recorded in the results:
  influxdb-kill  InfluxDB killed with SIGKILL, restarted 30 s later;
  es-kill        Elasticsearch killed with SIGKILL, restarted 30 s later;
  sink-stall     the relay in front of Telegraf accepts connections and stops reading for 60 s;
  agent-kill     20 s into the stall, the C agent killed with SIGKILL and started again on the same
                 spool (its batches resent); the new one is another instance (--name k2), so that
                 its sequence numbers, which start from 0, are counted apart;
  spool-full     the tmpfs agent's Telegraf path refuses connections for 120 s: its 1 MiB spool
                 fills, and the batches that no longer fit are lost, each counted (its lost).

What is reported: every series in benchmarks/results/raw/soak-TIME.json (not tracked: megabytes); its
summary (what the docs read: the per-sample series left out, VmRSS a point a minute) in
benchmarks/results/soak.json with `--doc`, which also writes docs/soak.md and docs/img/soak.svg from
that summary (beside the raw file, as soak-TIME.summary.json, without --doc):
- lost and duplicated samples in each store per agent instance, counted by (agent, node, seq) against
  what each agent says it sampled (its --stats at exit; for the killed one, its last self-sample,
  so a sample it took after that and lost is not seen), with the samples it says it dropped apart:
  for the tmpfs agent, per store, what the store lacks of its node samples and of its self-samples
  (by seq) against the lost and spool_dropped of its sink there, which count both;
- sample->queryable delay: PROBES nodes polled every POLL_S in each store; a sample's delay is when
  it was first seen minus its time stamp (so it holds up to POLL_S of polling); p50/p99 per minute,
  and after each fault how long until it is back under 2 s;
- VmRSS of each flowstat process, Telegraf and each store every 10 s, and its slope (least squares,
  MB per hour) from 5 minutes after its last (re)start;
- the run, aggregate and stack views' queries (benchmarks/bench_views.py's) sent every QUERY_EVERY_S
  against the live data: p95 per view and store;
- each component's CPU per sample on each rung.

Usage: benchmarks/bench_soak.py [--processes 10000] [--minutes 60] [--ladder 100,1000,3000,10000]
                                [--rung-seconds 120] [--quick] [--out FILE] [--doc]
`make soak` runs it with the defaults (about 90 minutes). --quick: 1,000 processes, a ladder of
100 and 1,000 for 30 s each, 6 minutes of soak with every fault shortened in proportion.
Runs as root (the tmpfs mount; the servers run as their own user).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from flowstat.campaign.svg import path as svg_path
from flowstat_lab.figures import DELAY_TARGET_S, pct, query_verdicts, recovery
from flowstat_lab.netns import Forward

ROOT = Path(__file__).resolve().parents[1]

C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
PYTHON = sys.executable
IDLER_SOURCE = ROOT / "benchmarks" / "soak" / "idler.c"
CACHE = ROOT / ".cache" / "bench-stack"  # shared with the other benchmarks: installed once
RESULTS = ROOT / "benchmarks" / "results"
RAW = RESULTS / "raw"  # the series, not tracked (.gitignore)
SUMMARY = RESULTS / "soak.json"  # what docs/soak.md and its plot are made from (tracked)
SVG = ROOT / "docs" / "img" / "soak.svg"

INTERVAL_S = 1.0
PROBES = 20  # nodes whose every sample is looked for in both stores
POLL_S = 0.25
ROLLUP_LAST_PASS_S = 15.0  # the live rollup rolls a window up 2 s after its end, passes every 10 s
RSS_EVERY_S = 10.0
QUERY_EVERY_S = 60.0
SETTLE_S = 300.0  # memory slope: from this long after a (re)start
PY_SHARE = 0.05  # of the processes, watched by the Python agent too
TMPFS_PROCESSES = 200
TMPFS_SIZE = "1m"
ES_HEAP = "-Xms2g -Xmx2g"
GROUP = 1000  # processes per idler parent


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the watched processes -----------------------------------------------------------------------------


def build_idler(tmp: Path) -> dict[str, Path]:
    """The idler under three names: what the C agent, the Python agent and the tmpfs agent watch are
    told apart by their command lines."""
    exe = tmp / "idler"
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(IDLER_SOURCE)], check=True)
    names = {}
    for kind in ("c", "py", "t"):
        names[kind] = tmp / f"soak-idler-{kind}"
        shutil.copy(exe, names[kind])
    return names


class Idlers:
    """Groups of idler processes of one name; grown a group of at most GROUP at a time."""

    def __init__(self, exe: Path):
        self.exe = exe
        self.parents: list[subprocess.Popen] = []
        self.count = 0

    def grow_to(self, n: int) -> None:
        while self.count < n:
            k = min(GROUP, n - self.count)
            p = subprocess.Popen([str(self.exe), str(k)], stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline().split()
            if line != ["ready", str(k)]:
                raise RuntimeError(f"{self.exe.name} {k}: said {line!r}, exit code {p.poll()}")
            self.parents.append(p)
            self.count += k

    def shrink_to(self, n: int) -> None:
        """At most n: whole groups stopped, the newest first (grow_to tops it up again)."""
        while self.parents and self.count > n:
            p = self.parents.pop()
            p.terminate()
            p.wait(60)
            self.count -= int(p.args[1])

    def pids(self, k: int) -> list[int]:
        """k children of the first group."""
        first = self.parents[0].pid
        kids = Path(f"/proc/{first}/task/{first}/children").read_text().split()
        return [int(x) for x in kids[:k]]

    def stop(self) -> None:
        for p in self.parents:
            p.terminate()
        for p in self.parents:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.parents, self.count = [], 0


# -- a relay that can stop reading, or refuse: flowstat_lab.netns.Forward ---------------------------------


def relay_to(port: int) -> Forward:
    return Forward(free_port(), port)


# -- agents --------------------------------------------------------------------------------------------


@dataclass
class Agent:
    """One agent process: its tag in the samples, command, stats file."""

    tag: str
    argv: list[str]
    stats: Path
    proc: subprocess.Popen | None = None
    started: list[float] = field(default_factory=list)
    log: Path | None = None

    def start(self) -> None:
        self.log = self.stats.with_suffix(".log")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        self.started.append(time.time())

    def stop(self) -> dict:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return json.loads(self.stats.read_text()) if self.stats.exists() else {}


def c_agent(
    name: str, pattern: str, sinks: list[str], work: Path, run_id: str, spool: Path, spool_mb: int = 512
) -> Agent:
    stats = work / f"{name}.stats.json"
    argv = [str(C_AGENT), "--pattern", pattern, "--interval", str(INTERVAL_S), "--rescan", "5"]
    argv += ["--run-id", run_id, "--name", name, "--spool-dir", str(spool), "--spool-max-mb", str(spool_mb)]
    argv += ["--stats", str(stats), "--quiet", "--drain-timeout", "60"]
    for s in sinks:
        argv += ["--sink", s]
    return Agent(f"flowstat-agent-c/{name}", argv, stats)


def py_agent(name: str, pattern: str, sinks: list[str], work: Path, run_id: str, spool: Path) -> Agent:
    stats = work / f"{name}.stats.json"
    argv = [PYTHON, "-m", "flowstat", "agent", "--pattern", pattern, "--interval", str(INTERVAL_S)]
    argv += ["--rescan", "5", "--run-id", run_id, "--name", name, "--spool-dir", str(spool)]
    argv += ["--stats", str(stats), "--quiet", "--drain-timeout", "60"]
    for s in sinks:
        argv += ["--sink", s]
    return Agent(f"flowstat-agent-py/{name}", argv, stats)


# -- measuring -----------------------------------------------------------------------------------------


def rss_kb_tree(pid: int) -> int:
    from flowstat.proc.procfs import descendants, vmrss_kb

    total = 0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(Exception):
            total += vmrss_kb(p)
    return total


def cpu_tree(pid: int) -> float:
    from flowstat.proc.procfs import tree_cpu_seconds

    return tree_cpu_seconds(pid)


class Components:
    """The pids to measure, looked up each time (servers and the agent are restarted by faults)."""

    def __init__(self, stack, agents: dict[str, Agent], others: dict[str, Agent] | None = None):
        """``others``: flowstat's processes beside the agents (the rollup), by name."""
        self.stack, self.agents, self.others = stack, agents, others or {}

    def pids(self) -> dict[str, int]:
        out = {}
        for name in ("telegraf", "influxdb", "elasticsearch"):
            pid = self.stack[name].pid()
            if pid is not None:
                out[name] = pid
        for key, a in self.agents.items():
            if a.proc is not None and a.proc.poll() is None:
                out[f"agent-{key}"] = a.proc.pid
        for name, a in self.others.items():
            if a.proc is not None and a.proc.poll() is None:
                out[name] = a.proc.pid
        return out


class DelayProbe:
    """Polls both stores for the samples of a few nodes; first-seen minus time stamp, per sample."""

    def __init__(self, stack, run_id: str, agent_prefix: str, nodes: list[str]):
        """``agent_prefix``: the agents probed (every instance of the C agent, before and after its restart)."""
        self.stack, self.run_id, self.agent, self.nodes = stack, run_id, agent_prefix, nodes
        self.seen: dict[str, dict[tuple[str, str, int], tuple[float, float]]] = {"influxdb": {}, "elasticsearch": {}}
        self.errors: dict[str, int] = {"influxdb": 0, "elasticsearch": 0}
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._loop, args=(s,), daemon=True) for s in ("influxdb", "elasticsearch")
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def _loop(self, store: str) -> None:
        last_ns = int((time.time() - 60) * 1e9)
        session = requests.Session()
        regex = "|".join(re.escape(n) for n in self.nodes)
        while not self.stop.is_set():
            try:
                rows = self._influx(session, regex, last_ns) if store == "influxdb" else self._es(session, last_ns)
            except (requests.RequestException, ValueError, KeyError):
                self.errors[store] += 1
                rows = []
            now = time.time()
            mine = self.seen[store]
            for key, t_ns in rows:
                if key not in mine:
                    mine[key] = (t_ns / 1e9, now)
                    last_ns = max(last_ns, t_ns - int(30e9))  # late arrivals of other nodes still found
            self.stop.wait(POLL_S)

    def _influx(self, session, regex: str, since_ns: int) -> list[tuple[tuple[str, str, int], int]]:
        agents = re.escape(self.agent).replace("/", "\\/")  # InfluxQL's regex literal ends at a bare /
        q = (
            f'SELECT "seq" FROM "flowstat_node" WHERE "run_id" = \'{self.run_id}\''
            f' AND "agent" =~ /^{agents}/ AND "node_id" =~ /^({regex})$/ AND time > {since_ns}'
            ' GROUP BY "agent", "node_id"'
        )
        r = session.post(
            f"{self.stack['influxdb'].url}/query", data={"db": "flowstat", "q": q, "epoch": "ns"}, timeout=5
        )
        r.raise_for_status()
        out = []
        for s in r.json()["results"][0].get("series", []):
            out += [((s["tags"]["agent"], s["tags"]["node_id"], int(seq)), int(t)) for t, seq in s["values"]]
        return out

    def _es(self, session, since_ns: int) -> list[tuple[tuple[str, str, int], int]]:
        from flowstat.schema.sample import time_ns

        body = {
            "size": 10000,
            "_source": ["agent", "node_id", "seq", "time"],
            "query": {
                "bool": {
                    "filter": [
                        {"term": {"run_id": self.run_id}},
                        {"prefix": {"agent": self.agent}},
                        {"terms": {"node_id": self.nodes}},
                        {"range": {"time": {"gt": since_ns // 1_000_000, "format": "epoch_millis"}}},
                    ]
                }
            },
        }
        r = session.post(f"{self.stack['elasticsearch'].url}/flowstat-samples*/_search", json=body, timeout=5)
        r.raise_for_status()
        return [
            ((h["_source"]["agent"], h["_source"]["node_id"], int(h["_source"]["seq"])), time_ns(h["_source"]["time"]))
            for h in r.json()["hits"]["hits"]
        ]

    def delays_by_stamp(self, store: str) -> list[tuple[float, float]]:
        """(stamp, delay) of every sample seen, by stamp."""
        return sorted((stamp, seen - stamp) for stamp, seen in self.seen[store].values())

    def delays(self, store: str, t0: float, t1: float) -> list[float]:
        """Delays of the samples stamped in [t0, t1)."""
        return sorted(seen - stamp for stamp, seen in self.seen[store].values() if t0 <= stamp < t1)


class Sampler:
    """RSS every RSS_EVERY_S and CPU time of each component, on a thread."""

    def __init__(self, components: Components):
        self.components = components
        self.rss: dict[str, list[tuple[float, int, int]]] = {}  # name -> (t, pid, kB)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            now = time.time()
            for name, pid in self.components.pids().items():
                self.rss.setdefault(name, []).append((now, pid, rss_kb_tree(pid)))
            self.stop.wait(RSS_EVERY_S)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()


def slope_mb_per_h(points: list[tuple[float, int, int]]) -> dict:
    """Least-squares slope of the last pid's series, from SETTLE_S after it started being seen."""
    if not points:
        return {"points": 0}
    pid = points[-1][1]
    mine = [(t, kb) for t, p, kb in points if p == pid]
    t_first = mine[0][0]
    settled = [(t, kb) for t, kb in mine if t >= t_first + SETTLE_S]
    out = {"pid_restarts": len({p for _, p, _ in points}) - 1, "first_mb": round(mine[0][1] / 1024, 1)}
    out["last_mb"] = round(mine[-1][1] / 1024, 1)
    out["max_mb"] = round(max(kb for _, kb in mine) / 1024, 1)
    if len(settled) < 3:
        return {**out, "slope_mb_per_h": None, "settled_points": len(settled)}
    slope = statistics.linear_regression([t for t, _ in settled], [kb / 1024 for _, kb in settled]).slope
    return {**out, "slope_mb_per_h": round(slope * 3600, 2), "settled_points": len(settled)}


# -- counting what reached the stores ------------------------------------------------------------------


COUNT_CHUNK_S = 300  # InfluxDB counts 10,000 nodes' samples a chunk of time at a time (a query each)


def influx_counts(stack, run_id: str, t0: float, t1: float) -> dict[tuple[str, str], dict]:
    """(agent, node) -> count, distinct seqs, min and max seq, in InfluxDB, for samples stamped in
    [t0, t1), asked COUNT_CHUNK_S at a time (one query over an hour of 10,000 nodes outlasts any
    time-out) and added up: a resent sample keeps its time stamp, so it falls in the same chunk as
    the first."""
    out: dict[tuple[str, str], dict] = {}
    url = f"{stack['influxdb'].url}/query"
    start = t0
    while start < t1:
        end = min(start + COUNT_CHUNK_S, t1)
        q = (
            'SELECT count("seq"), count(distinct("seq")), min("seq"), max("seq") FROM "flowstat_node" '
            f"WHERE \"run_id\" = '{run_id}' AND time >= {int(start * 1e9)} AND time < {int(end * 1e9)} "
            'GROUP BY "agent", "node_id"'
        )
        r = requests.post(url, data={"db": "flowstat", "q": q}, timeout=1800)
        r.raise_for_status()
        for s in r.json()["results"][0].get("series", []):
            _, count, distinct, lo, hi = s["values"][0]
            row = out.setdefault((s["tags"]["agent"], s["tags"]["node_id"]), {"count": 0, "distinct": 0})
            row["count"] += count
            row["distinct"] += distinct
            row["min"] = min(lo, row.get("min", lo))
            row["max"] = max(hi, row.get("max", hi))
        start = end
    return out


def es_counts(stack, run_id: str, t0: float = 0, t1: float = 0) -> dict[tuple[str, str], dict]:
    """The same from Elasticsearch: a composite aggregation, page by page (cardinality is exact far
    beyond a node's 3,600 sequence numbers at this precision threshold)."""
    url = f"{stack['elasticsearch'].url}/flowstat-samples*/_search"
    out: dict[tuple[str, str], dict] = {}
    after = None
    while True:
        comp: dict = {
            "size": 1000,
            "sources": [{"agent": {"terms": {"field": "agent"}}}, {"node": {"terms": {"field": "node_id"}}}],
        }
        if after:
            comp["after"] = after
        body = {
            "size": 0,
            "query": {"term": {"run_id": run_id}},
            "aggs": {
                "n": {
                    "composite": comp,
                    "aggs": {
                        "distinct": {"cardinality": {"field": "seq", "precision_threshold": 40000}},
                        "lo": {"min": {"field": "seq"}},
                        "hi": {"max": {"field": "seq"}},
                    },
                }
            },
        }
        r = requests.post(url, json=body, timeout=600)
        r.raise_for_status()
        agg = r.json()["aggregations"]["n"]
        for b in agg["buckets"]:
            out[(b["key"]["agent"], b["key"]["node"])] = {
                "count": b["doc_count"],
                "distinct": b["distinct"]["value"],
                "min": int(b["lo"]["value"]),
                "max": int(b["hi"]["value"]),
            }
        after = agg.get("after_key")
        if not agg["buckets"] or not after:
            return out


def es_buckets(stack, run_id: str, t0: float, t1: float, agg: dict) -> list[dict]:
    """The buckets of one aggregation over the run's samples stamped in [t0, t1)."""
    window = {"gte": int(t0 * 1000), "lt": int(t1 * 1000), "format": "epoch_millis"}
    body = {
        "size": 0,
        "query": {"bool": {"filter": [{"term": {"run_id": run_id}}, {"range": {"time": window}}]}},
        "aggs": {"a": agg},
    }
    r = requests.post(f"{stack['elasticsearch'].url}/flowstat-samples*/_search", json=body, timeout=300)
    r.raise_for_status()
    return r.json()["aggregations"]["a"]["buckets"]


def stored_in_window(stack, run_id: str, t0: float, t1: float) -> dict[str, dict[str, int]]:
    """Samples stamped in [t0, t1), per store and agent."""
    q = (
        f'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_id}\' '
        f'AND time >= {int(t0 * 1e9)} AND time < {int(t1 * 1e9)} GROUP BY "agent"'
    )
    influx = {
        s["tags"]["agent"]: s["values"][0][1]
        for s in stack["influxdb"].query(q, "flowstat")["results"][0].get("series", [])
    }
    buckets = es_buckets(stack, run_id, t0, t1, {"terms": {"field": "agent", "size": 50}})
    es = {b["key"]: b["doc_count"] for b in buckets}
    return {"influxdb": influx, "elasticsearch": es}


def per_minute(stack, run_id: str, t0: float, t1: float) -> dict[str, list[tuple[float, int]]]:
    """Samples stamped in each minute, per store (for the plot)."""
    q = (
        f'SELECT count("seq") FROM "flowstat_node" WHERE "run_id" = \'{run_id}\' '
        f"AND time >= {int(t0 * 1e9)} AND time < {int(t1 * 1e9)} GROUP BY time(1m) fill(0)"
    )
    series = stack["influxdb"].query(q, "flowstat")["results"][0].get("series", [])
    influx = [(t / 1e9, int(n)) for t, n in series[0]["values"]] if series else []
    buckets = es_buckets(stack, run_id, t0, t1, {"date_histogram": {"field": "time", "fixed_interval": "1m"}})
    es = [(b["key"] / 1000, b["doc_count"]) for b in buckets]
    return {"influxdb": influx, "elasticsearch": es}


def rollup_completeness(stack, run_id: str) -> dict[str, dict[str, int]]:
    """Per agent: the run's samples in Elasticsearch, and how many of them its per-node rollup averages
    (the sum of its documents' ``samples``): equal when the rollup missed nothing, late samples included."""
    from flowstat.stores.elasticsearch_rollup import ROLLUP_INDEX

    es = stack["elasticsearch"].url
    out: dict[str, dict[str, int]] = {}
    for index, field_name, key in (
        ("flowstat-samples-*", None, "samples"),
        (f"{ROLLUP_INDEX}-*", "samples", "rolled_up"),
    ):
        agg = {"terms": {"field": "agent", "size": 100}}
        if field_name:
            agg["aggs"] = {"n": {"sum": {"field": field_name}}}
        body = {"size": 0, "query": {"term": {"run_id": run_id}}, "aggs": {"a": agg}}
        r = requests.post(f"{es}/{index}/_search", json=body, timeout=120)
        r.raise_for_status()
        for b in r.json()["aggregations"]["a"]["buckets"]:
            out.setdefault(b["key"], {})[key] = int(b["n"]["value"]) if field_name else b["doc_count"]
    return out


def self_samples_stored(stack, run_id: str, agent_tag: str) -> dict[str, int]:
    """Per store, the distinct self-samples (by seq) of one agent instance. An agent's lost and
    spool_dropped count its self-samples as well as its node samples (the agent schema): what a store
    lacks of both is what they are to be compared with."""
    q = (
        f'SELECT count(distinct("seq")) FROM "flowstat_agent" '
        f"WHERE \"run_id\" = '{run_id}' AND \"agent\" = '{agent_tag}'"
    )
    series = stack["influxdb"].query(q, "flowstat")["results"][0].get("series", [])
    body = {
        "size": 0,
        "query": {"bool": {"filter": [{"term": {"run_id": run_id}}, {"term": {"agent": agent_tag}}]}},
        "aggs": {"distinct": {"cardinality": {"field": "seq", "precision_threshold": 40000}}},
    }
    r = requests.post(f"{stack['elasticsearch'].url}/flowstat-agents*/_search", json=body, timeout=120)
    r.raise_for_status()
    return {
        "influxdb": int(series[0]["values"][0][1]) if series else 0,
        "elasticsearch": int(r.json()["aggregations"]["distinct"]["value"]),
    }


def last_self_sample(stack, agent_tag: str) -> dict:
    """The agent's last self-sample in Elasticsearch (what a killed agent said last)."""
    body = {"size": 1, "query": {"term": {"agent": agent_tag}}, "sort": [{"time": "desc"}]}
    r = requests.post(f"{stack['elasticsearch'].url}/flowstat-agents*/_search", json=body, timeout=60)
    r.raise_for_status()
    hits = r.json()["hits"]["hits"]
    return hits[0]["_source"] if hits else {}


def missing_seq_times(stack, store: str, run_id: str, agent: str, node: str, interval_s: float) -> list[float]:
    """When the samples missing from a node's sequence were taken: between the stored neighbours."""
    from flowstat.schema.sample import time_ns

    if store == "influxdb":
        q = (
            f'SELECT "seq" FROM "flowstat_node" WHERE "run_id" = \'{run_id}\' AND "agent" = \'{agent}\' '
            f"AND \"node_id\" = '{node}'"
        )
        rows = stack["influxdb"].query(q, "flowstat")["results"][0]["series"][0]["values"]
        pairs = sorted((int(seq), t / 1e9) for t, seq in rows)
    else:
        body = {
            "size": 10000,
            "_source": ["seq", "time"],
            "query": {
                "bool": {
                    "filter": [{"term": {"run_id": run_id}}, {"term": {"agent": agent}}, {"term": {"node_id": node}}]
                }
            },
        }
        r = requests.post(f"{stack['elasticsearch'].url}/flowstat-samples*/_search", json=body, timeout=60)
        pairs = sorted(
            (int(h["_source"]["seq"]), time_ns(h["_source"]["time"]) / 1e9) for h in r.json()["hits"]["hits"]
        )
    out = []
    for (s0, t0), (s1, _) in zip(pairs, pairs[1:], strict=False):
        out += [t0 + (k - s0) * interval_s for k in range(s0 + 1, s1)]
    return out


def account(
    counts: dict[tuple[str, str], dict], sampled: dict[str, int | None], windows: list[tuple[float, float]], locate
) -> dict:
    """Per agent instance: sampled, stored (distinct), duplicated, lost; lost inside the sequence
    (gaps) located in or out of the fault windows when there are few enough to fetch."""
    out = {}
    for tag, n_sampled in sampled.items():
        mine = {node: c for (agent, node), c in counts.items() if agent == tag}
        distinct = sum(c["distinct"] for c in mine.values())
        stored = sum(c["count"] for c in mine.values())
        gaps = {node: c["max"] - c["min"] + 1 - c["distinct"] + c["min"] for node, c in mine.items()}
        gappy = {node: g for node, g in gaps.items() if g}
        row = {
            "nodes": len(mine),
            "sampled": n_sampled,
            "stored": stored,
            "distinct": distinct,
            "duplicated": stored - distinct,
            "lost": None if n_sampled is None else n_sampled - distinct,
            "lost_in_gaps": sum(gappy.values()),
            "nodes_with_gaps": len(gappy),
        }
        if gappy and len(gappy) <= 200:
            times = [t for node in gappy for t in locate(tag, node)]
            inside = sum(1 for t in times if any(a <= t < b for a, b in windows))
            row["gaps_in_fault_windows"], row["gaps_outside_fault_windows"] = inside, len(times) - inside
        out[tag] = row
    return out


# -- the scale ladder ----------------------------------------------------------------------------------


def cpu_snapshot(components: Components) -> dict[str, tuple[int, float]]:
    out = {}
    for name, pid in components.pids().items():
        with contextlib.suppress(Exception):
            out[name] = (pid, cpu_tree(pid))
    return out


def settle(ctx: Soak, within_s: float = 2.0, timeout_s: float = 900.0) -> float:
    """Wait, before the soak, until what a higher rung left behind has drained: both stores' probe
    delay p99 over the last 30 s within ``within_s`` (the soak's own target), at most ``timeout_s``.
    Returns how long it took (said, and kept in the results)."""
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        time.sleep(10)
        now = time.time()
        p99 = {s: pct(ctx.probe.delays(s, now - 40, now - 10), 0.99) for s in ("influxdb", "elasticsearch")}
        if all(v is not None and v <= within_s for v in p99.values()):
            break
        say(f"settling after the ladder: delay p99 of the last 30 s {p99}")
    took = round(time.time() - t0, 1)
    say(f"settled in {took:.0f} s")
    return took


def rung(n: int, seconds: float, ctx: Soak) -> dict:
    """N processes watched for ``seconds`` after a warm-up: CPU per sample of each component, delay."""
    ctx.grow(n)
    say(f"ladder: {n:,} processes ({ctx.py_idlers.count:,} also watched by the Python agent) ...")
    time.sleep(15)  # warm-up: a rescan (5 s) has found them and a few rounds went by
    t0, cpu0 = time.time(), cpu_snapshot(ctx.components)
    time.sleep(seconds)
    t1, cpu1 = time.time(), cpu_snapshot(ctx.components)
    time.sleep(10)  # what was stamped in the window reaches the stores
    stored = stored_in_window(ctx.stack, ctx.run_id, t0, t1)
    all_samples = {store: sum(v.values()) for store, v in stored.items()}
    per_sample = {}
    for name, (pid, c1) in cpu1.items():
        if name not in cpu0 or cpu0[name][0] != pid:
            continue
        used = c1 - cpu0[name][1]
        if name.startswith("agent-"):
            tag = ctx.agents[name.removeprefix("agent-")].tag
            samples = stored["elasticsearch"].get(tag, 0)
        else:
            samples = all_samples["influxdb" if name in ("telegraf", "influxdb") else "elasticsearch"]
        per_sample[name] = {
            "cpu_s": round(used, 3),
            "core_share": round(used / (t1 - t0), 4),
            "samples": samples,
            "cpu_us_per_sample": round(used / samples * 1e6, 2) if samples else None,
        }
    expected = ctx.watched_by_c() * (t1 - t0) / INTERVAL_S
    delays = {s: ctx.probe.delays(s, t0, t1) for s in ("influxdb", "elasticsearch")}
    return {
        "processes": n,
        "window_s": round(t1 - t0, 1),
        "expected_c_samples": round(expected),
        "stored": stored,
        "components": per_sample,
        "delay_s": {s: {"p50": pct(d, 0.5), "p99": pct(d, 0.99), "samples": len(d)} for s, d in delays.items()},
        "load_average": os.getloadavg(),
    }


def first_behind(rungs: list[dict]) -> dict | None:
    """The first rung where a store path falls behind (delay p99 over target, or fewer samples stored
    than sampled): which path, and the busiest component on it."""
    for r in rungs:
        for store, d in r["delay_s"].items():
            tag_counts = r["stored"][store]
            c_stored = sum(v for k, v in tag_counts.items() if k.startswith("flowstat-agent-c/k"))
            short = c_stored < 0.99 * r["expected_c_samples"]
            if (d["p99"] is not None and d["p99"] > DELAY_TARGET_S) or short:
                path = ["telegraf", "influxdb"] if store == "influxdb" else ["elasticsearch"]
                busiest = max(path, key=lambda c: r["components"].get(c, {}).get("core_share", 0))
                return {
                    "processes": r["processes"],
                    "store": store,
                    "delay_p99_s": d["p99"],
                    "stored_share": round(c_stored / r["expected_c_samples"], 4) if r["expected_c_samples"] else None,
                    "busiest_component_on_the_path": busiest,
                    "its_core_share": r["components"].get(busiest, {}).get("core_share"),
                }
    return None


# -- the hour and its faults ---------------------------------------------------------------------------


@dataclass
class Soak:
    stack: object
    run_id: str
    work: Path
    exes: dict[str, Path]
    agents: dict[str, Agent]
    relay: Forward
    relay_t: Forward
    tmpfs: Path
    c_idlers: Idlers = None
    py_idlers: Idlers = None
    t_idlers: Idlers = None
    components: Components = None
    probe: DelayProbe = None
    faults: list[dict] = field(default_factory=list)
    agent_tags: list[str] = field(default_factory=list)
    others: dict[str, Agent] = field(default_factory=dict)  # flowstat's processes beside the agents

    def __post_init__(self) -> None:
        self.c_idlers, self.py_idlers, self.t_idlers = (Idlers(self.exes[k]) for k in ("c", "py", "t"))
        self.components = Components(self.stack, self.agents, self.others)

    def grow(self, n: int) -> None:
        """n processes watched, a share of them by the Python agent too (fewer than now: groups
        stopped, then topped up)."""
        py = round(n * PY_SHARE)
        self.py_idlers.shrink_to(py)
        self.c_idlers.shrink_to(n - py)
        self.py_idlers.grow_to(py)
        self.c_idlers.grow_to(n - py)

    def watched_by_c(self) -> int:
        """The C agent's targets: every idler of the c and py names, parents included."""
        return self.c_idlers.count + len(self.c_idlers.parents) + self.py_idlers.count + len(self.py_idlers.parents)

    def kill_server(self, name: str, down_s: float) -> None:
        svc = self.stack[name]
        pid = svc.pid()
        start = time.time()
        os.killpg(pid, signal.SIGKILL)
        say(f"fault: {name} (pid {pid}) killed with SIGKILL; back in {down_s:.0f} s")
        time.sleep(down_s)
        svc.up()
        self.faults.append({"fault": f"{name}-kill", "start": start, "end": time.time(), "down_s": down_s})
        say(f"fault: {name} up again")

    def stall_sink(self, stall_s: float, kill_agent_after_s: float) -> None:
        start = time.time()
        self.relay.stall()
        say(f"fault: the relay to Telegraf stops reading for {stall_s:.0f} s")
        time.sleep(kill_agent_after_s)
        old = self.agents["c"]
        old.proc.kill()
        old.proc.wait()
        killed = time.time()
        argv = [a if a != old.argv[old.argv.index("--name") + 1] else "k2" for a in old.argv]
        argv[argv.index("--stats") + 1] = str(self.work / "k2.stats.json")
        new = Agent("flowstat-agent-c/k2", argv, self.work / "k2.stats.json")
        new.start()
        self.agents["c"] = new
        self.agent_tags.append(new.tag)
        say(f"fault: the C agent (pid {old.proc.pid}) killed with SIGKILL, restarted on its spool (pid {new.proc.pid})")
        self.faults.append({"fault": "agent-kill", "start": killed, "end": time.time(), "killed": old.tag})
        time.sleep(max(0.0, stall_s - kill_agent_after_s))
        self.relay.resume()
        self.faults.append({"fault": "sink-stall", "start": start, "end": time.time(), "stall_s": stall_s})
        say("fault: the relay reads again")

    def spool_full(self, refuse_s: float) -> None:
        start = time.time()
        self.relay_t.refuse()
        say(f"fault: the tmpfs agent's Telegraf path refuses connections for {refuse_s:.0f} s")
        time.sleep(refuse_s)
        self.relay_t.resume()
        self.faults.append({"fault": "spool-full", "start": start, "end": time.time(), "refused_s": refuse_s})
        say("fault: the tmpfs agent's path is back")


def fault_plan(minutes: float) -> list[tuple[float, str, tuple]]:
    """(seconds after the start, method, arguments), at the same fractions of any length of soak."""
    d = minutes * 60
    return [
        (0.10 * d, "kill_server", ("influxdb", 30.0)),
        (0.25 * d, "kill_server", ("elasticsearch", 30.0)),
        (0.40 * d, "stall_sink", (60.0, 20.0)),
        (0.70 * d, "spool_full", (120.0,)),
    ]


def timed_queries(ctx: Soak, cross: dict | None, t_start: float, rounds: dict, max_points: int = 1500) -> None:
    """Each view query sent once against the live data; its time kept by (view, store, title, selection)."""
    import bench_views as bv

    now_ms = int(time.time() * 1000)
    nodes = sorted(f"soak-idler-c-{pid}" for pid in ctx.c_idlers.pids(50))
    time_range = (int(t_start * 1000) - 5000, now_ms)
    queries = bv.view_queries(
        ctx.stack,
        ctx.run_id,
        ctx.agent_tags[-1],
        nodes,
        {"all nodes": [bv.gx.ALL], f"{bv.SELECTED} nodes": bv.spread(nodes, bv.SELECTED)},  # All: as Grafana sends it
        time_range,
        max_points,
    ) + bv.stack_view_queries(ctx.stack, time_range, max_points)
    if cross:
        queries += bv.cross_run_queries(ctx.stack, cross["cross"], cross["dirs"][1:], max_points)
    session = requests.Session()
    for q in queries:
        key = f"{q.group} | {q.store} | {q.title} | {q.selection}"
        mine = rounds.setdefault(key, {"ms": [], "at": [], "failed_at": [], "last_error": ""})
        sent = time.time()
        t0 = time.perf_counter()
        try:
            q.send(session)
        except (requests.RequestException, RuntimeError) as exc:
            mine["failed_at"].append(round(sent, 1))
            mine["last_error"] = str(exc)[:200]
            continue
        mine["ms"].append((time.perf_counter() - t0) * 1000)
        mine["at"].append(round(sent, 1))


def failed_rounds(v: dict) -> str:
    """Failed query rounds inside / outside fault windows (results before they were told apart: all)."""
    if "failed_in_faults" in v:
        return f"{v['failed_in_faults']} / {v['failed_outside_faults']}"
    return f"{v.get('failed', '-')} in all (not told apart)"


def delays_per_minute(probe: DelayProbe, t0: float, t1: float) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for store in ("influxdb", "elasticsearch"):
        rows = []
        m = t0
        while m < t1:
            d = probe.delays(store, m, min(m + 60, t1))
            rows.append({"minute_start": round(m, 1), "p50_s": pct(d, 0.5), "p99_s": pct(d, 0.99), "samples": len(d)})
            m += 60
        out[store] = rows
    return out


# -- the page a person looks at ------------------------------------------------------------------------

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


def svg_page(results: dict) -> str:
    """Three panels over the soak's minutes, fault windows shaded: samples stored per second, the
    sample->queryable delay (p99 per minute), and each process's VmRSS (log scale). From a summary."""
    soak = results["soak"]
    t0, t1, base = soak["started"], soak["ended"], time_base(soak)
    minutes = max(1e-9, (t1 - t0) / 60)
    w, left, right, ph, gap, top = 960, 70, 170, 200, 60, 40
    height = top + 3 * (ph + gap)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" viewBox="0 0 {w} {height}" '
        'font-family="sans-serif" font-size="12">',
        f"<!-- Written by benchmarks/bench_soak.py (make soak) from {results['file']}: do not edit. -->",
        f'<rect width="{w}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15">flowstat soak: {soak["processes"]:,} processes at 1 Hz for '
        f"{minutes:.0f} min (faults shaded)</text>",
    ]

    def x(t: float) -> float:
        return left + (t - t0) / 60 / minutes * (w - left - right)

    panels = [
        (
            "samples stored per second",
            False,
            {s: [(base + t + 30, n / 60) for t, n in v] for s, v in soak["minute_stored"].items()},
        ),
        (
            "sample->queryable delay, p99 per minute (s)",
            False,
            {s: [(base + m + 30, p99) for m, p99 in v if p99 is not None] for s, v in soak["minute_delay_p99"].items()},
        ),
        (
            "VmRSS (MB, log scale)",
            True,
            {name: rss_points(soak, pts) for name, pts in soak["rss_series"].items()},
        ),
    ]
    for i, (title, log, series) in enumerate(panels):
        y0 = top + i * (ph + gap) + 20
        values = [v for pts in series.values() for _, v in pts if v is not None and (v > 0 or not log)]
        lo = min(values) if log and values else 0.0
        hi = max(values) if values else 1.0
        if log:
            import math

            lo, hi = math.log10(max(lo, 0.1)) - 0.1, math.log10(max(hi, 0.2)) + 0.1
        hi = hi if hi > lo else lo + 1

        def y(v: float, y0=y0, lo=lo, hi=hi, log=log) -> float:
            import math

            v = math.log10(max(v, 10**lo)) if log else v
            return y0 + ph - (v - lo) / (hi - lo) * ph

        parts.append(f'<text x="{left}" y="{y0 - 6}" font-size="13">{title}</text>')
        for f in soak["faults"]:
            a, b = x(f["start"]), x(f["end"])
            parts.append(f'<rect x="{a:.1f}" y="{y0}" width="{max(1.0, b - a):.1f}" height="{ph}" fill="#f4cccc"/>')
            if i == 0:
                parts.append(f'<text x="{a:.1f}" y="{y0 + 12}" font-size="10" fill="#a00">{f["fault"]}</text>')
        parts.append(f'<rect x="{left}" y="{y0}" width="{w - left - right}" height="{ph}" fill="none" stroke="#888"/>')
        for frac in (0, 0.5, 1):
            v = lo + frac * (hi - lo)
            label = f"{10**v:.3g}" if log else f"{v:.3g}"
            parts.append(f'<text x="{left - 6}" y="{y0 + ph - frac * ph + 4:.1f}" text-anchor="end">{label}</text>')
        for k, (name, pts) in enumerate(sorted(series.items())):
            colour = COLOURS[k % len(COLOURS)]
            # whole pixels, each point relative to the one before (flowstat.campaign.svg.path): the file is tracked
            line = svg_path((round(x(t)), round(y(v))) for t, v in pts if v is not None)
            if line:
                parts.append(f'<path d="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
            parts.append(f'<text x="{w - right + 8}" y="{y0 + 14 + 16 * k}" fill="{colour}">{name}</text>')
        if i == len(panels) - 1:
            for m in range(0, int(minutes) + 1, max(1, int(minutes) // 6)):
                parts.append(f'<text x="{x(t0 + m * 60):.1f}" y="{y0 + ph + 16}" text-anchor="middle">{m} min</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# -- the whole thing -----------------------------------------------------------------------------------


def wait_until_settled(stack, run_id: str, timeout_s: float = 300) -> dict:
    """After the agents stopped: until both stores' counts of the run stay the same for 20 s."""
    requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=300)
    last, same_since, deadline = None, time.time(), time.time() + timeout_s
    while time.time() < deadline:
        requests.post(f"{stack['elasticsearch'].url}/flowstat-*/_refresh", timeout=300)
        now = stored_in_window(stack, run_id, 0, time.time() + 3600)
        if now != last:
            last, same_since = now, time.time()
        elif time.time() - same_since >= 20:
            return {"settled": True, "counts": now}
        time.sleep(5)  # polling the stores' counts
    return {"settled": False, "counts": last}


def machine() -> dict:
    from run_benchmarks import machine as describe

    return describe()


def soak_section(results: dict) -> str:
    """docs/soak.md: what the last soak measured."""
    s, lad = results["soak"], results["ladder"]
    lines = [
        "# Soak: flowstat at farm scale for an hour",
        "",
        f"Generated by `benchmarks/bench_soak.py` (`make soak`) from `{results['file']}`: do not edit by hand.",
        "",
        f"Command: `{results['command']}`; machine: {results['machine'].get('cpus')} cores, "
        f"{results['machine'].get('cpu_model', '?')}. What each figure is: the script's docstring.",
        "",
        "![the soak: samples stored, delay, memory, faults](img/soak.svg)",
        "",
        "## The scale ladder: CPU per sample (µs) and share of a core",
        "",
        "| processes | " + " | ".join(c for c in lad["components"]) + " | delay p99 InfluxDB / ES (s) |",
        "|---:|" + "---:|" * len(lad["components"]) + "---|",
    ]
    for r in lad["rungs"]:
        cells = []
        for c in lad["components"]:
            v = r["components"].get(c)
            cells.append(f"{v['cpu_us_per_sample']} ({v['core_share']:.1%})" if v and v["cpu_us_per_sample"] else "-")
        d = r["delay_s"]
        lines.append(
            f"| {r['processes']:,} | "
            + " | ".join(cells)
            + f" | {d['influxdb']['p99']} / {d['elasticsearch']['p99']} |"
        )
    fb = lad.get("first_behind")
    lines += ["", f"First rung that falls behind: {json.dumps(fb) if fb else 'none'}.", "", "## The soak", ""]
    if results.get("settle_s") is not None:
        lines += [
            f"Fewer processes than the ladder's top rung: the soak began once what that rung left in the "
            f"stores' queues had drained (delay p99 of the last 30 s within 2 s), {results['settle_s']:.0f} s "
            "after it shrank.",
            "",
        ]
    lines += [f"{s['processes']:,} processes, {s['minutes']} min. Faults:", ""]
    for f in s["faults"]:
        lines.append(f"- {f['fault']}: at {f['start'] - s['started']:.0f} s, for {f['end'] - f['start']:.0f} s")
    lines += [
        "",
        "| store | agent | sampled | distinct stored | duplicated | lost | gaps in / out of fault windows |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for store, per in s["accounting"].items():
        if "error" in per:
            lines.append(f"| {store} | not counted: {per['error'][:200]} | | | | | |")
            continue
        for tag, row in per.items():
            lines.append(
                f"| {store} | {tag} | {row['sampled']} | {row['distinct']} | {row['duplicated']} | {row['lost']} | "
                f"{row.get('gaps_in_fault_windows', '-')} / {row.get('gaps_outside_fault_windows', '-')} |"
            )
    lines += ["", "Delay (probe samples), outside fault windows: "]
    for store, v in s["delay_outside_faults"].items():
        lines.append(f"- {store}: p50 {v['p50']} s, p99 {v['p99']} s ({v['samples']} samples)")
    lines += ["", "Back under 2 s after each fault:", ""]
    for r in s["recovery"]:
        lines.append(
            f"- {r['fault']}: InfluxDB {r['influxdb_back_under_2s_after_s']} s, "
            f"Elasticsearch {r['elasticsearch_back_under_2s_after_s']} s"
        )
    if "rollup" in s:
        lines += [
            "",
            "Elasticsearch's per-node rollup (flowstat rollup, live all along): samples it averages of the run's:",
            "",
        ]
        for agent, c in sorted(s["rollup"].items()):
            lines.append(f"- {agent}: {c.get('rolled_up', 0):,} of {c.get('samples', 0):,}")
    lines += ["", "| process | first MB | last MB | slope MB/h (after 5 min) | restarts |", "|---|---:|---:|---:|---:|"]
    for name, m in s["memory"].items():
        lines.append(
            f"| {name} | {m.get('first_mb')} | {m.get('last_mb')} | {m.get('slope_mb_per_h')} | "
            f"{m.get('pid_restarts')} |"
        )
    lines += [
        "",
        "Query p95 outside fault windows and their recovery minute; failed rounds inside / outside them.",
        "",
        "| view | store | worst query p95 (ms) | with faults | failed in / outside faults | target | met |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for group, stores in judged_queries(s).items():
        for store, v in stores.items():
            lines.append(
                f"| {group} | {store} | {v['worst_p95_ms']} ({v.get('worst', '')}) | "
                f"{v.get('worst_p95_ms_with_faults', '-')} | {failed_rounds(v)} | {v['target_ms']} | {v['met']} |"
            )
    lines += ["", "## Verdicts", ""]
    for k, v in results["verdicts"].items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"


# The per-sample series a summary leaves out (megabytes for an hour), and the figures that neither
# docs/soak.md, its plot nor the verdicts read: the raw file keeps them.
SERIES = ("probe_delays", "query_rounds")
UNREAD = ("agents_stats", "settled", "probe_errors")
SUMMARY_RSS_EVERY_S = 60.0  # a summary's VmRSS series: the first point of each minute, [whole s from the start, kB]


def summary(results: dict) -> dict:
    """The results without the per-sample series (their verdicts, recovery and per-minute figures
    computed from them are kept: of the delays, each minute's p99), each process's VmRSS a point a
    minute: what docs/soak.md and docs/img/soak.svg are made from, a few tens of kB."""
    out = {k: v for k, v in results.items() if k != "soak"}
    if "soak" in results:
        soak = {k: v for k, v in results["soak"].items() if k not in SERIES + UNREAD}
        if "query_rounds" in results["soak"]:
            soak["queries"] = judged_queries(results["soak"])
        base = time_base(soak)
        if "rss_series" in soak:  # a raw point is [time, pid, kB]; a summary's [whole s from time_base, kB]
            soak["rss_series"] = {
                name: [[round(p[0]) - base, p[-1]] for p in thinned(pts)] if pts and len(pts[0]) == 3 else pts
                for name, pts in soak["rss_series"].items()
            }
        # Of each minute, what the plot reads, its start in seconds from time_base (a raw one is a Unix time):
        # the samples stored, [s, count] (minutes are whole), and the delay's p99, [s to 0.1, p99 s].
        if "stored_per_minute" in soak:
            soak["minute_stored"] = {
                store: [[round(t) - base, n] for t, n in rows] for store, rows in soak.pop("stored_per_minute").items()
            }
        if "delay_per_minute" in soak:
            soak["minute_delay_p99"] = {
                store: [[round(m - base, 1), p99] for m, p99 in map(minute_p99, rows)]
                for store, rows in soak.pop("delay_per_minute").items()
            }
        out["soak"] = soak
    return out


def minute_p99(row: dict | list) -> tuple[float, float | None]:
    """A minute's start and p99 delay: a raw row is a dict, a summary's [start, p99 s]."""
    return (row["minute_start"], row["p99_s"]) if isinstance(row, dict) else (row[0], row[1])


def time_base(soak: dict) -> int:
    """The whole second a summary's times count from (the soak's start): whole seconds stay integers,
    so the plot's times are the raw file's to the bit."""
    return int(soak["started"])


def rss_points(soak: dict, points: list) -> list[tuple[float, float]]:
    """A summary's VmRSS series ([s, kB]) as (time, MB)."""
    base = time_base(soak)
    return [(base + s, kb / 1024) for s, kb in points]


def thinned(points: list, every_s: float = SUMMARY_RSS_EVERY_S) -> list:
    """The first point of each EVERY_S-long slot of the clock (points are [time, ...], in time order)."""
    out, last = [], None
    for p in points:
        slot = int(p[0] // every_s)
        if slot != last:
            out.append(p)
            last = slot
    return out


def write_summary_and_doc(results: dict, path: Path, doc: bool) -> dict:
    """The summary at PATH; with DOC, docs/soak.md and docs/img/soak.svg made from it (as they will
    be made again from the tracked file alone)."""
    s = summary(results)
    s["file"] = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(s, separators=(",", ":")) + "\n")  # compact, as tracked
    if doc:
        SVG.write_text(svg_page(s))
        (ROOT / "docs" / "soak.md").write_text(soak_section(s))
    return s


def verdicts(results: dict) -> dict:
    s = results["soak"]
    out = {}
    for store, per in s["accounting"].items():
        if "error" in per:
            out[f"{store}: not counted"] = per["error"]
            continue
        lost = {tag: row["lost"] for tag, row in per.items()}
        dup = sum(row["duplicated"] for row in per.values())
        out[f"{store}: lost per agent (target 0, the tmpfs agent's counted drops apart)"] = lost
        out[f"{store}: duplicated (target 0)"] = dup
    for store, t in s["tmpfs_agent"].items():
        lacks = t["lost_samples"] + t["lost_self_samples"]
        out[f"tmpfs agent: samples and self-samples lost in {store} == drops it counted"] = (
            lacks,
            t["counted_drops"],
            lacks == t["counted_drops"],
        )
    out["delay p99 outside faults <= 2 s"] = {k: v["p99"] for k, v in s["delay_outside_faults"].items()}
    out["back under 2 s within 60 s of each fault"] = all(
        v <= 60 for r in s["recovery"] for k, v in r.items() if k.endswith("_after_s") and v is not None
    )
    if "rollup" in s:
        out["rollup averages every sample stored"] = all(
            c.get("rolled_up") == c.get("samples") for c in s["rollup"].values()
        )
    out["VmRSS slope <= 1 MB/h"] = {n: m.get("slope_mb_per_h") for n, m in s["memory"].items()}
    out["queries p95 within target"] = {
        f"{g} {st}": v["met"] for g, stores in judged_queries(s).items() for st, v in stores.items()
    }
    return out


def judged_queries(s: dict) -> dict:
    """The views' verdicts, judged again from the rounds the results keep (a page redrawn from older
    results gets today's judgement, the run view per selection); else as they were written."""
    return query_verdicts(s["query_rounds"], s["faults"]) if s.get("query_rounds") else s["queries"]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--processes", type=int, default=10_000, help="processes watched during the soak (default 10,000)")
    ap.add_argument("--minutes", type=float, default=60, help="length of the soak (default 60)")
    ap.add_argument(
        "--ladder", default="100,1000,3000,10000", help="rungs of the scale ladder (default 100,1000,3000,10000)"
    )
    ap.add_argument("--rung-seconds", type=float, default=120, help="measured seconds per rung (default 120)")
    ap.add_argument(
        "--quick", action="store_true", help="1,000 processes, ladder 100,1000 x 30 s, 10 minutes: trying it out"
    )
    ap.add_argument(
        "--no-views", action="store_true", help="skip the aggregate view's data (a recorded run, synthesised)"
    )
    ap.add_argument("--out", type=Path, help="JSON of every series (default benchmarks/results/raw/soak-TIME.json)")
    ap.add_argument(
        "--doc",
        action="store_true",
        help="also write benchmarks/results/soak.json (the summary) and docs/soak.md, docs/img/soak.svg from it",
    )
    ap.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS",
        help="only write the summary, docs/soak.md and docs/img/soak.svg again from a results file (raw or summary)",
    )
    args = ap.parse_args()
    if args.render:
        results = json.loads(args.render.read_text())
        soak = results.get("soak", {})
        if "probe_delays" in soak:  # counted again, as this version counts
            delays = {store: [tuple(row) for row in rows] for store, rows in soak["probe_delays"].items()}
            soak["recovery"] = recovery(delays, soak["faults"], soak["ended"])
        results["verdicts"] = verdicts(results)
        write_summary_and_doc(results, SUMMARY, doc=True)
        return 0
    if args.quick:
        args.processes, args.minutes, args.ladder, args.rung_seconds = 1000, 10, "100,1000", 30
    if os.geteuid() != 0:
        ap.error("run as root: the spool-full fault mounts a tmpfs (the servers run as their own user)")
    if not C_AGENT.exists():
        ap.error(f"{C_AGENT} is missing: run `make c-agent`")
    ladder = [int(x) for x in args.ladder.split(",") if x]
    from run_benchmarks import command_line, save_results

    from flowstat.stack import Stack
    from flowstat.timeutil import compact_utc, iso_utc_ms

    stamp = compact_utc()
    out_path = args.out or RAW / f"soak-{stamp}.json"
    summary_path = SUMMARY if args.doc else out_path.with_suffix(".summary.json")
    results: dict = {
        "started": iso_utc_ms(),
        "machine": machine(),
        "command": command_line(),
    }
    work = Path(tempfile.mkdtemp(prefix="flowstat-soak-"))
    tmpfs = work / "tmpfs-spool"
    tmpfs.mkdir()
    ports = {"influxdb": free_port(), "elasticsearch": free_port(), "telegraf": free_port()}
    stack = Stack(
        CACHE,
        ports,
        services=("influxdb", "elasticsearch", "telegraf"),
        options={"elasticsearch": {"java_opts": ES_HEAP}},
    )
    ctx = None
    mounted = False
    try:
        exes = build_idler(work)
        import bench_views as bv

        bv.wipe(CACHE)
        stack.up(report=say)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(tmpfs)], check=True)
        mounted = True
        cross = None
        if not args.no_views:
            from argparse import Namespace

            from bench_report import record_run

            say("the aggregate view's data: a 10 s demo run, synthesised into 20 runs ...")
            source = record_run(work / "recorded", 10.0)
            cross = bv.make_runs(
                source, work / "runs", Namespace(nodes=20, seconds=60, runs=20, run_nodes=20, run_seconds=60), stamp
            )
            bv.load(stack, cross)
        relay, relay_t = relay_to(stack["telegraf"].port), relay_to(stack["telegraf"].port)
        es_sink = f"elasticsearch://127.0.0.1:{stack['elasticsearch'].port}/flowstat-samples"
        run_id = f"soak-{stamp}"
        agents = {
            "c": c_agent(
                "k1",
                "soak-idler-(c|py) ",
                [f"http://127.0.0.1:{relay.port}/write", es_sink],
                work,
                run_id,
                work / "spool-c",
            ),
            "py": py_agent(
                "p",
                "soak-idler-py ",
                [f"http://127.0.0.1:{relay.port}/write", es_sink],
                work,
                run_id,
                work / "spool-py",
            ),
            "t": c_agent(
                "t",
                "soak-idler-t ",
                [f"http://127.0.0.1:{relay_t.port}/write", es_sink],
                work,
                run_id,
                tmpfs,
                spool_mb=64,
            ),
        }
        # Elasticsearch's per-node rollup, live, as the compose stack runs it: the run view per 10 s reads it
        rollup = Agent(
            "rollup",
            [PYTHON, "-m", "flowstat", "rollup", "--es", f"http://127.0.0.1:{stack['elasticsearch'].port}"],
            work / "rollup.stats.json",
        )
        ctx = Soak(stack, run_id, work, exes, agents, relay, relay_t, tmpfs, others={"rollup": rollup})
        rollup.start()
        ctx.agent_tags.append(agents["c"].tag)
        ctx.grow(ladder[0])
        ctx.t_idlers.grow_to(TMPFS_PROCESSES)
        ladder_start = time.time() - 60  # before any sample: the counts' time range starts here
        for a in agents.values():
            a.start()
        probes = [f"soak-idler-c-{pid}" for pid in ctx.c_idlers.pids(PROBES)]
        ctx.probe = DelayProbe(stack, run_id, "flowstat-agent-c/k", probes)
        ctx.probe.start()
        sampler = Sampler(ctx.components)
        sampler.start()

        rungs = [rung(n, args.rung_seconds, ctx) for n in ladder]
        names = sorted({c for r in rungs for c in r["components"]})
        results["ladder"] = {"rungs": rungs, "components": names, "first_behind": first_behind(rungs)}
        save_results(results, out_path)  # kept as it goes: a soak cut short keeps its ladder
        say(f"ladder done; first rung behind: {results['ladder']['first_behind']}")

        ctx.grow(args.processes)
        if args.processes < max(ladder):  # a rung the stores could not keep up with leaves a backlog
            results["settle_s"] = settle(ctx)
        t_start = time.time()
        t_end = t_start + args.minutes * 60
        say(f"soak: {ctx.watched_by_c():,} processes for {args.minutes:g} min ...")
        plan = fault_plan(args.minutes)

        def run_faults() -> None:
            for at, method, fargs in plan:
                time.sleep(max(0.0, t_start + at - time.time()))
                getattr(ctx, method)(*fargs)

        faults = threading.Thread(target=run_faults, daemon=True)
        faults.start()
        rounds: dict = {}
        next_query = t_start + 30
        while time.time() < t_end or faults.is_alive():
            if time.time() >= next_query and time.time() < t_end:
                timed_queries(ctx, cross, t_start, rounds)
                next_query += QUERY_EVERY_S
                done = (time.time() - t_start) / 60
                recent = ctx.probe.delays("influxdb", time.time() - 70, time.time() - 10)
                say(
                    f"soak: {done:.1f}/{args.minutes:g} min; "
                    f"InfluxDB delay p99 of the last minute {pct(recent, 0.99)} s"
                )
            time.sleep(1)  # the loop's tick: queries are due every QUERY_EVERY_S
        t_stop = time.time()
        say("soak over: stopping the agents (they deliver what they hold) ...")
        stats = {key: a.stop() for key, a in agents.items()}
        settled = wait_until_settled(stack, run_id)
        ctx.probe.finish()
        sampler.finish()
        time.sleep(ROLLUP_LAST_PASS_S)  # the rollup's pass over the last window
        rollup.stop()

        windows = [(f["start"], f["end"] + 60) for f in ctx.faults]
        sampled = {
            "flowstat-agent-c/k1": last_self_sample(stack, "flowstat-agent-c/k1").get("samples"),
            "flowstat-agent-c/k2": stats["c"].get("samples"),
            "flowstat-agent-py/p": stats["py"].get("samples"),
            "flowstat-agent-c/t": stats["t"].get("samples"),
        }
        accounting = {}
        for store, counter in (("influxdb", influx_counts), ("elasticsearch", es_counts)):
            say(f"counting every sample in {store} by (agent, node, seq) ...")

            def locate(tag: str, node: str, store=store) -> list[float]:
                return missing_seq_times(stack, store, run_id, tag, node, INTERVAL_S)

            try:
                accounting[store] = account(counter(stack, run_id, ladder_start, time.time()), sampled, windows, locate)
            except (requests.RequestException, RuntimeError, KeyError) as exc:  # said, and the rest kept
                say(f"counting in {store} failed: {exc}")
                accounting[store] = {"error": str(exc)[:500]}
        # The killed instance's count is its last self-sample's (up to 5 s old): a lower bound, so its
        # losses are its gaps and what one store holds that the other does not (a tail it held in memory).
        counted = [s for s in accounting if "error" not in accounting[s]]
        for tag in ("flowstat-agent-c/k1",):
            both = [accounting[s][tag]["distinct"] for s in counted if tag in accounting[s]]
            for store in counted:
                if tag not in accounting[store]:
                    continue
                row = accounting[store][tag]
                row["sampled_at_least"], row["sampled"] = row["sampled"], None
                row["lost"] = row["lost_in_gaps"] + max(both) - row["distinct"]
                row["lost_note"] = (
                    "gaps + samples the other store holds and this one not (the sampled total is unknown)"
                )
        # The tmpfs agent's drops, per store: its sink's lost and spool_dropped count node samples and
        # self-samples alike, so what the store lacks of both is what they must equal.
        t_sinks = stats["t"].get("sinks", {})
        t_sink = {
            "influxdb": next((v for k, v in t_sinks.items() if k.startswith("http://")), {}),
            "elasticsearch": next((v for k, v in t_sinks.items() if k.startswith("elasticsearch")), {}),
        }
        try:
            t_selves = self_samples_stored(stack, run_id, "flowstat-agent-c/t")
        except (requests.RequestException, KeyError) as exc:  # said, and the rest kept
            say(f"counting the tmpfs agent's self-samples failed: {exc}")
            t_selves = {}
        tmpfs_agent = {
            store: {
                "lost_samples": accounting[store].get("flowstat-agent-c/t", {}).get("lost"),
                "lost_self_samples": stats["t"].get("self_samples", 0) - t_selves[store],
                "counted_drops": t_sink[store].get("spool_dropped", 0) + t_sink[store].get("lost", 0),
                "sink_stats": t_sink[store],
            }
            for store in counted
            if store in t_selves
        }
        probed = {store: ctx.probe.delays_by_stamp(store) for store in ("influxdb", "elasticsearch")}
        outside = {}
        for store in ("influxdb", "elasticsearch"):
            d = sorted(
                seen - st
                for st, seen in ctx.probe.seen[store].values()
                if t_start <= st < t_stop and not any(a <= st < b for a, b in windows)
            )
            outside[store] = {"p50": pct(d, 0.5), "p99": pct(d, 0.99), "samples": len(d)}
        results["soak"] = {
            "processes": ctx.watched_by_c(),
            "minutes": args.minutes,
            "started": t_start,
            "ended": t_stop,
            "faults": ctx.faults,
            "agents_stats": stats,
            "settled": settled,
            "accounting": accounting,
            "tmpfs_agent": tmpfs_agent,
            "delay_per_minute": delays_per_minute(ctx.probe, t_start, t_stop),
            "delay_outside_faults": outside,
            "probe_errors": ctx.probe.errors,
            "recovery": recovery(probed, ctx.faults, t_stop),
            # kept so that --render can count again from the samples themselves
            "probe_delays": {store: [[round(t, 3), round(d, 3)] for t, d in rows] for store, rows in probed.items()},
            "memory": {name: slope_mb_per_h(pts) for name, pts in sampler.rss.items()},
            "rss_series": {
                name: [(t, pid, kb) for t, pid, kb in pts if t >= t_start] for name, pts in sampler.rss.items()
            },
            "queries": query_verdicts(rounds, ctx.faults),
            "query_rounds": {k: {**v, "ms": [round(x, 1) for x in v["ms"]]} for k, v in rounds.items()},
            "stored_per_minute": per_minute(stack, run_id, t_start, t_stop),
            "rollup": rollup_completeness(stack, run_id),
        }
        results["verdicts"] = verdicts(results)
    except BaseException as exc:  # what was measured before is kept, with what stopped it
        results["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        raise
    finally:
        save_results(results, out_path)
        if ctx is not None:
            for a in ctx.agents.values():
                if a.proc is not None and a.proc.poll() is None:
                    a.proc.kill()
            for a in ctx.others.values():
                if a.proc is not None and a.proc.poll() is None:
                    a.proc.kill()
            for group in (ctx.c_idlers, ctx.py_idlers, ctx.t_idlers):
                group.stop()
        stack.down(report=say)
        import bench_views as bv

        bv.wipe(CACHE)
        if mounted:
            subprocess.run(["umount", str(tmpfs)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    write_summary_and_doc(results, summary_path, doc=args.doc)
    print(f"raw: {out_path}; summary: {summary_path}", file=sys.stderr)
    print(json.dumps(results["verdicts"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
