"""docker-compose.es-cluster.yml, up for real: Elasticsearch as three nodes over docker-compose.yml,
on the suite's own Docker engine (lab/src/flowstat_lab/compose.py, as tests/test_compose_up.py runs the
whole stack) with the stand-ins override and its part for the cluster
(lab/stand-ins/docker-compose.es-cluster.stand-ins.yml: each node on a loopback address
of its own, 127.0.0.1-3, the ports of a bridge).

Only Elasticsearch's services start (es-certs, the three nodes, the secrets gate they wait for),
then the setup's Elasticsearch step. In order: one green cluster of three, security on (no
credentials, no answer), TLS on the transport with es-certs' certificates (each node's own,
signed by the volume's CA, and a client without one refused); then the harness's agents ingest
into it while the elected master, which is also the node they write to, is killed with SIGKILL:
queries asked every 0.5 s of a surviving node all answer, the cluster elects another master and
the writers go on through another node, the killed node is started again and the cluster is green
with three nodes, and in the end every sample the agents sent is there exactly once, counted by
document id. No address outside 127.0.0.0/8 is made, listened on or used; `down -v` leaves no
container or volume, and the engine's end leaves no namespace.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from support.common import ROOT, with_test_jvm
from support.compose import (
    COMPOSE_FILE,
    Project,
    ce,
    compose_config,
    engine_up,
    in_namespace,
    listening_addresses,
    loopback_only,
    needs_engine,
    on_loopback,
    override_differences,
    socket_addresses,
)
from support.compose import compose_v2 as compose_v2_binary

CLUSTER_FILE = ROOT / "docker-compose.es-cluster.yml"
FILES = [COMPOSE_FILE, CLUSTER_FILE, ce.OVERRIDE, ce.ES_CLUSTER_OVERRIDE]
PROJECT = "flowstat-es-cluster-test"
NODES = {"elasticsearch": "127.0.0.1", "elasticsearch-2": "127.0.0.2", "elasticsearch-3": "127.0.0.3"}
STARTED = {"secrets", "es-certs", *NODES}  # what `up` of the three nodes starts, and nothing else
PY_AGENT, C_AGENT = "flowstat-agent-py", "flowstat-agent-c"
SMOKE = "/usr/local/share/flowstat/topologies/smoke.yaml"  # 6 nodes: ~60 samples a second an agent at 0.1 s
QUERY_EVERY_S = 0.5

pytestmark = needs_engine


def es_url(node: str, path: str) -> str:
    return f"http://{NODES[node]}:9200{path}"


# -- the override for the cluster changes nothing but images and host networking -------------------
@pytest.fixture(scope="module")
def compose_v2() -> Path:
    return compose_v2_binary()


def test_the_cluster_override_only_swaps_images_and_gives_each_node_its_own_loopback_address(compose_v2):
    env = ROOT / ".env.example"
    base = compose_config(COMPOSE_FILE, CLUSTER_FILE, env_file=env)
    merged = compose_config(*FILES, env_file=env)
    others = {n: a for n, a in NODES.items() if a != "127.0.0.1"}
    bind = {n: {"network.host": a} for n, a in NODES.items()}
    assert override_differences(base, merged, others, bind) == []
    assert all(svc["network_mode"] == "host" for svc in merged["services"].values())
    assert "0.0.0.0" not in json.dumps(merged)
    for name, address in NODES.items():
        svc = merged["services"][name]
        # each node binds its own address, and every service that may talk to it finds it by its name
        assert svc["environment"]["network.host"] == address, name
        for other, osvc in merged["services"].items():
            assert f"{name}={address}" in osvc["extra_hosts"] or f"{name}:{address}" in osvc["extra_hosts"], other
        # its healthcheck asks the node itself: on the host network, localhost is elasticsearch's
        assert f"//{'localhost' if address == '127.0.0.1' else address}:9200/" in " ".join(svc["healthcheck"]["test"])
    # and the guard sees what it must: a healthcheck asking another node, a node on the wrong address
    broken = json.loads(json.dumps(merged))
    hc = broken["services"]["elasticsearch-2"]["healthcheck"]
    hc["test"] = [t.replace("127.0.0.2", "127.0.0.3") for t in hc["test"]]
    broken["services"]["elasticsearch-3"]["environment"]["network.host"] = "127.0.0.2"
    assert override_differences(base, broken, others, bind) == [
        "elasticsearch-2.healthcheck: "
        + json.dumps(base["services"]["elasticsearch-2"]["healthcheck"])[:120]
        + " -> "
        + json.dumps(hc)[:120],
        "elasticsearch-3.environment.network.host: None -> '127.0.0.2'",
    ]


# -- the cluster -----------------------------------------------------------------------------------
class Cluster(Project):
    """The project: the four files, .env from scripts/new-env; the nodes asked from inside the
    engine's namespace (``ns``: threads there)."""

    def __init__(self, engine: ce.Engine, env_file: Path, ns):
        super().__init__(engine, env_file, PROJECT, FILES)
        self.ns = ns

    def es(self, method: str, node: str, path: str, user: str | None = "elastic", timeout: float = 30, **kw):
        """A request to a node, as ``user`` (elastic with ELASTIC_PASSWORD, or a flowstat user with
        its .env password; None: without credentials), made in the namespace."""
        auth = None
        if user == "elastic":
            auth = ("elastic", self.values["ELASTIC_PASSWORD"])
        elif user == "flowstat_grafana":
            auth = (user, self.values["GRAFANA_ES_PASSWORD"])
        elif user is not None:
            raise ValueError(user)
        return self.ns.submit(requests.request, method, es_url(node, path), auth=auth, timeout=timeout, **kw).result()

    def health(self, node: str) -> dict:
        return self.es("GET", node, "/_cluster/health").json()

    def master(self, node: str) -> str:
        return self.es("GET", node, "/_cat/master?h=node").text.strip()

    def bulk_requests(self, node: str) -> dict[str, int]:
        """_bulk requests each running node has taken since it started (its REST counters)."""
        nodes = self.es("GET", node, "/_nodes/usage").json()["nodes"]
        names = {i: n["name"] for i, n in self.es("GET", node, "/_nodes/_all/name").json()["nodes"].items()}
        return {names[i]: u.get("rest_actions", {}).get("bulk_action", 0) for i, u in nodes.items() if i in names}

    def run_count(self, node: str, run_id: str) -> int:
        resp = self.es("POST", node, "/flowstat-samples-*/_count", json={"query": {"term": {"run_id": run_id}}})
        return resp.json()["count"] if resp.status_code == 200 else -1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    env_file = tmp_path_factory.mktemp("es-cluster") / ".env"
    made = subprocess.run([str(ROOT / "scripts" / "new-env"), str(env_file)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    # three heaps of 512 MiB (the suite's JVM options), not .env.example's 1 GiB, beside whatever else
    # the machine runs: the heap changes nothing the tests look at
    env_file.write_text(re.sub(r"(?m)^ES_MEM_LIMIT=.*$", "ES_MEM_LIMIT=1g", with_test_jvm(env_file.read_text())))
    with engine_up() as engine, in_namespace(workers=4) as ns:
        c = Cluster(engine, env_file, ns)
        c("--profile", "harness", "down", "-v", "--remove-orphans", check=False)  # what an interrupted run left
        try:
            yield c
        finally:
            mine = f"label=com.docker.compose.project={PROJECT}"
            for cid in engine.docker("ps", "-aq", "--filter", mine).stdout.split():
                engine.docker("rm", "-f", cid, what="docker rm -f (a one-off container of the test)")
            c("--profile", "harness", "down", "-v", "--remove-orphans", "--timeout", "5", check=False)
            left = c.volumes()
        assert not left, f"volumes left behind: {left}"


def _tls_probe(address: str, ca: Path, cert: tuple[Path, Path] | None) -> dict:
    """A TLS client to a node's transport port (in the namespace): the certificate it shows, checked
    against ``ca``, and whether it takes a client that shows ``cert`` (None: no certificate)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False  # the cluster runs with verification_mode certificate: names are not checked
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    with socket.create_connection((address, 9300), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        peer, version = tls.getpeercert(), tls.version()
        tls.settimeout(2)
        try:
            tls.recv(1)
            refused = None  # the node said nothing and kept the connection: taken
        except ssl.SSLError as exc:
            refused = exc.reason
        except TimeoutError:
            refused = None
    return {
        "subject": dict(x for rdn in peer["subject"] for x in rdn),
        "dns": sorted(v for k, v in peer.get("subjectAltName", ()) if k == "DNS"),
        "refused": refused,
        "version": version,
    }


@pytest.mark.timeout(600)  # three JVMs starting on two cores, beside the rest of the suite
def test_three_nodes_become_one_green_cluster_with_security_and_transport_tls(cluster):
    t0 = time.monotonic()
    cluster("up", "-d", "--wait", *NODES, timeout=400)
    print(f"up, three nodes healthy: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    ps = cluster.ps()
    assert set(ps) == STARTED, f"started beyond Elasticsearch's services: {sorted(set(ps) - STARTED)}"
    for name in ("secrets", "es-certs"):
        assert (ps[name]["State"], ps[name]["ExitCode"]) == ("exited", 0), ps[name]
    for name in NODES:
        assert (ps[name]["State"], ps[name]["Health"]) == ("running", "healthy"), ps[name]
    # the setup's Elasticsearch step, as the setup service runs it (users, roles, templates)
    done = cluster("run", "--rm", "--no-deps", "setup", "provision", "--es", "http://elasticsearch:9200")
    assert "flowstat provision: done" in done.stdout + done.stderr

    # one cluster: every node sees the three, each at its own address, and one master
    for name in NODES:
        health = cluster.health(name)
        assert (health["status"], health["number_of_nodes"], health["number_of_data_nodes"]) == ("green", 3, 3), health
    published = cluster.es("GET", "elasticsearch-2", "/_nodes/http,transport").json()["nodes"].values()
    assert {n["name"]: n["transport"]["publish_address"] for n in published} == {
        n: f"{a}:9300" for n, a in NODES.items()
    }
    assert {n["name"]: n["http"]["publish_address"] for n in published} == {n: f"{a}:9200" for n, a in NODES.items()}
    assert len({cluster.master(n) for n in NODES}) == 1

    # security on: without credentials, or with a wrong password, no node answers
    for name in NODES:
        assert cluster.es("GET", name, "/_cluster/health", user=None).status_code == 401, name
        wrong = cluster.ns.submit(
            requests.get, es_url(name, "/_cluster/health"), auth=("elastic", secrets.token_hex(16)), timeout=10
        ).result()
        assert wrong.status_code == 401, name

    # TLS on the transport: each node shows its own certificate from es-certs, signed by the
    # volume's CA (the handshake checks it), and refuses a client without one of the CA's
    certs = cluster.volume_dir("es-certs")
    for name, address in NODES.items():
        bare = cluster.ns.submit(_tls_probe, address, certs / "ca" / "ca.crt", None).result()
        assert bare["subject"]["commonName"] == name and name in bare["dns"], (name, bare)
        assert bare["refused"] == "TLSV13_ALERT_CERTIFICATE_REQUIRED", (name, bare)
        other = "elasticsearch-3" if name != "elasticsearch-3" else "elasticsearch"
        peer = (certs / other / f"{other}.crt", certs / other / f"{other}.key")
        assert cluster.ns.submit(_tls_probe, address, certs / "ca" / "ca.crt", peer).result()["refused"] is None, name

    # nothing of the cluster listens, nor is any address, outside 127.0.0.0/8
    assert loopback_only(ce.netns_addresses()), ce.netns_addresses()
    assert all(on_loopback(a) for a in listening_addresses()), listening_addresses()


# -- a node killed mid-ingest ---------------------------------------------------------------------
class Queries:
    """A query every QUERY_EVERY_S, as Grafana asks (flowstat_grafana, the run's samples by
    agent), of one node, from a namespace thread, until stopped: each one's time, status, duration
    and whether it was whole (no shard failed, not timed out)."""

    def __init__(self, cluster: Cluster, node: str, run_id: str):
        self.cluster, self.node, self.run_id = cluster, node, run_id
        self.done = threading.Event()
        self.results: list[dict] = []
        self.future = cluster.ns.submit(self._loop)

    def _loop(self) -> None:
        session = requests.Session()
        session.auth = ("flowstat_grafana", self.cluster.values["GRAFANA_ES_PASSWORD"])
        body = {"size": 0, "query": {"term": {"run_id": self.run_id}}, "aggs": {"a": {"terms": {"field": "agent"}}}}
        while not self.done.is_set():
            t = time.monotonic()
            row = {"t": t}
            try:
                resp = session.post(es_url(self.node, "/flowstat-samples-*/_search"), json=body, timeout=30)
                answer = resp.json()
                row.update(
                    status=resp.status_code,
                    whole=not answer.get("timed_out") and answer.get("_shards", {}).get("failed", 1) == 0,
                    hits=answer.get("hits", {}).get("total", {}).get("value"),
                )
            except (requests.RequestException, ValueError) as exc:
                row.update(status=None, whole=False, error=str(exc)[:200])
            row["s"] = time.monotonic() - t
            self.results.append(row)
            # the pace of a dashboard's refresh, not a wait for anything
            self.done.wait(max(0.0, QUERY_EVERY_S - row["s"]))

    def since(self, t: float) -> list[dict]:
        return [r for r in self.results if r["t"] >= t]

    def stop(self) -> list[dict]:
        self.done.set()
        self.future.result(timeout=60)
        return self.results


def wait_for(what: str, check, timeout_s: float, poll_s: float = 0.5):
    """Poll ``check`` until it returns something true; past the deadline fail, naming what never came
    and what was seen last."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            last = check()
        except (requests.RequestException, ValueError, KeyError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s:.0f} s (last: {last!r})"
        time.sleep(poll_s)


FAILOVER_SAID = re.compile(r": ((?:[\w.-]+:\d+, )*[\w.-]+:\d+) failed \(.*?\); batches go to ([\w.-]+:\d+) now")


BACK_SAID = re.compile(r": ([\w.-]+:\d+) answers again; batches go to it now")


def failovers_said(log: str) -> list[tuple[list[str], str]]:
    """The failovers an agent's log tells of (both agents say them alike): the nodes that failed, where batches went."""
    return [(m.group(1).split(", "), m.group(2)) for m in FAILOVER_SAID.finditer(log)]


def serving_said(log: str, first: str) -> str:
    """The node an agent's batches go to by its log: the first listed, or the last failover or node back said."""
    said = [(m.start(), m.group(2)) for m in FAILOVER_SAID.finditer(log)]
    return max([*said, *((m.start(), m.group(1)) for m in BACK_SAID.finditer(log))], default=(0, first))[1]


def stored_samples(cluster: Cluster, node: str, run_id: str) -> list[dict]:
    """Every sample document of the run, with its index and id, page by page (search_after)."""
    out: list[dict] = []
    after = None
    while True:
        body = {
            "size": 5000,
            "query": {"term": {"run_id": run_id}},
            "sort": [{"agent": "asc"}, {"node_id": "asc"}, {"seq": "asc"}, {"time": "asc"}],
            "_source": ["agent", "node_id", "seq"],
            "version": True,
        }
        if after:
            body["search_after"] = after
        answer = cluster.es("POST", node, "/flowstat-samples-*/_search", json=body).json()
        hits = answer["hits"]["hits"]
        assert answer["_shards"]["failed"] == 0, answer["_shards"]
        if not hits:
            return out
        out += [{"_id": h["_id"], "_index": h["_index"], "_version": h["_version"], **h["_source"]} for h in hits]
        after = hits[-1]["sort"]


def sample_ids(run_file: Path) -> Counter:
    """The document id of every node sample of a run file (the Python agent's), counted."""
    docs = [json.loads(line) for line in run_file.read_text().splitlines()]
    return Counter(
        f"{d['run_id']}/{d['agent']}/{d['node_id']}/{d['seq']}"
        for d in docs
        if "node_id" in d and "flowstat_agent" not in d
    )


def once_each(stored: list[dict], sent: Counter, c_taken: int) -> list[str]:
    """What is wrong with a run's stored samples (each with its _id, _index, agent, node_id, seq):
    a document whose id is not its sample's; a sample stored twice (in two indices: within one, an
    _id is unique); the Python agent's not exactly its run file's (``sent``, by id); the C agent's,
    which keep no run file, not numbered 0, 1, 2... for each node with none missing, or not as many
    as it took (``c_taken``). Empty when every sample is there exactly once."""
    problems = []
    run_id = next(iter(sent)).split("/")[0]
    ids = Counter(f"{run_id}/{d['agent']}/{d['node_id']}/{d['seq']}" for d in stored)
    if Counter(d["_id"] for d in stored) != ids:
        problems.append("documents whose _id is not their sample's run_id/agent/node_id/seq")
    twice = sorted(i for i, n in ids.items() if n > 1)
    if twice:
        problems.append(f"{len(twice)} samples stored more than once (in two indices): {twice[:5]}")
    py = {i for i in ids if i.split("/")[1] == PY_AGENT}
    if py != set(sent):
        problems.append(
            f"{PY_AGENT}: sent {len(sent)}, stored {len(py)}; missing {sorted(set(sent) - py)[:5]}, "
            f"never sent {sorted(py - set(sent))[:5]}"
        )
    c_seqs: dict[str, set[int]] = {}
    for d in stored:
        if d["agent"] == C_AGENT:
            c_seqs.setdefault(d["node_id"], set()).add(d["seq"])
    gaps = {n: sorted(set(range(max(s) + 1)) - s)[:5] for n, s in c_seqs.items() if s != set(range(len(s)))}
    if gaps:
        problems.append(f"{C_AGENT}: samples missing, by node: {gaps}")
    if sum(map(len, c_seqs.values())) != c_taken:
        problems.append(
            f"{C_AGENT}: took {c_taken} samples, stored {sum(map(len, c_seqs.values()))}: "
            f"{ {n: len(s) for n, s in c_seqs.items()} }"
        )
    return problems


def es_sink(stats: dict) -> dict:
    """The Elasticsearch sink's figures in an agent's statistics."""
    (figures,) = [v for url, v in stats["sinks"].items() if url.startswith("elasticsearch://")]
    return figures


@pytest.mark.timeout(600)
def test_a_node_killed_mid_ingest_queries_answer_green_again_and_every_sample_once(cluster):
    """Both agents of a harness run ship to every node (the sink lists the three), the node they
    write to is killed with SIGKILL, and it is the elected master too: the whole of a node's loss
    at once (a master elected anew, the primaries it held promoted, the writers' node gone).
    Meanwhile `flowstat replay` loads another run through the same list, its first node down.
    Queries go to a surviving node, as a client that lists every node would after failing over."""
    t_start = time.monotonic()
    victim = cluster.master("elasticsearch-2")
    assert victim in NODES, victim
    survivors = [n for n in NODES if n != victim]
    query_node = survivors[0]
    listed = [victim, *survivors]  # the node the writers take first is the master
    sink = f"elasticsearch://{','.join(f'{n}:9200' for n in listed)}/flowstat-samples"
    run_id, replayed_id = (f"es-cluster-{secrets.token_hex(4)}" for _ in range(2))
    name = f"{PROJECT}-ingest"

    def harness(*command: str, detach: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        """The harness service with flowstat_agent's credentials, as docs/compose.md's replay recipe."""
        how = ["-d", "--name", detach] if detach else ["--rm"]
        return cluster(
            *("--profile", "harness", "run", *how, "--no-deps", "-e", "FLOWSTAT_ES_USER=flowstat_agent"),
            *("-e", "FLOWSTAT_ES_PASSWORD", "harness", *command),
            env={"FLOWSTAT_ES_PASSWORD": cluster.values["AGENT_ES_PASSWORD"]},
            timeout=timeout,
        )

    # a short run that no store has seen, for replay to load while the node is down
    harness(
        *(
            "run",
            SMOKE,
            "--duration",
            "3",
            "--run-id",
            replayed_id,
            "--agent-interval",
            "0.1",
            "--quiet",
            "--no-c-agent",
        ),
        timeout=120,
    )
    harness(
        *("run", SMOKE, "--duration", "600", "--run-id", run_id, "--agent-interval", "0.1", "--quiet"),
        *("--sink", sink),
        detach=name,
    )
    wait_for("the run's first samples in the cluster", lambda: cluster.run_count(query_node, run_id) >= 100, 90)
    # replicas 1: each index of the run has a copy on two nodes, as the template says (one source:
    # flowstat.stores.elasticsearch.templates(), auto_expand_replicas 0-1)
    from flowstat.stores.elasticsearch import templates

    wanted = templates()["component-flowstat-settings.json"]["template"]["settings"]["auto_expand_replicas"]

    def every_shard_started() -> list[dict] | None:
        """The run's shards once each is started: an index the agents create meanwhile (their daily
        self-sample index, the runs index) starts unassigned, after a green health of the others."""
        shards = cluster.es("GET", query_node, "/_cat/shards/flowstat-*?format=json&h=index,prirep,state,node").json()
        return shards if shards and all(s["state"] == "STARTED" for s in shards) else None

    shards = wait_for(
        "every shard of the run's indices started (each new index's replica too)", every_shard_started, 60
    )
    settings = cluster.es("GET", query_node, "/flowstat-*/_settings?flat_settings=true").json()
    assert settings and all(s["settings"]["index.number_of_replicas"] == "1" for s in settings.values()), settings
    assert all(s["settings"]["index.auto_expand_replicas"] == wanted for s in settings.values()), settings
    by_index: dict[str, set] = {}
    for s in shards:
        by_index.setdefault(s["index"], set()).add(s["node"])
    assert by_index and all(len(nodes) == 2 for nodes in by_index.values()), shards
    # both agents write to the first node listed, the master, and to no other; or, loaded, a batch
    # outlasted the sink's time-out: that agent says its failover and is back after the node's rest
    run_dir = cluster.volume_dir("harness-runs") / run_id
    agent_logs = {agent: run_dir / "logs" / f"{agent}.log" for agent in ("agent-py", "agent-c")}
    first = f"{victim}:9200"

    def on_victim() -> dict[str, str] | None:
        said = {a: log.read_text() for a, log in agent_logs.items()}
        return said if all(serving_said(log, first) == first for log in said.values()) else None

    def counted_on_victim() -> tuple[dict[str, str], dict[str, int]] | None:
        """The agents' logs and the _bulk counts, with no failover said between the two reads."""
        said = on_victim()
        bulk, again = (cluster.bulk_requests(query_node), on_victim()) if said else (None, None)
        still = again and all(failovers_said(again[a]) == failovers_said(said[a]) for a in said)
        return (said, bulk) if still else None

    queries = Queries(cluster, query_node, run_id)
    try:
        container = cluster.container(victim)
        said_before, bulk_before = wait_for(f"both agents' batches going to {victim}", counted_on_victim, 90)
        assert bulk_before[victim] > 0, bulk_before
        if not any(failovers_said(log) for log in said_before.values()):
            assert not any(bulk_before[n] for n in survivors), bulk_before
        t_kill = time.monotonic()
        cluster.engine.docker("kill", "-s", "KILL", container["Id"], what=f"docker kill -s KILL {victim}")
        count_at_kill = cluster.run_count(query_node, run_id)
        with ThreadPoolExecutor(1) as background:
            replay = background.submit(
                harness, "replay", f"runs/{replayed_id}", "--es", "http://" + ",".join(f"{n}:9200" for n in listed)
            )

            def lost() -> dict | None:
                health = cluster.health(query_node)
                master = cluster.master(query_node)
                count = cluster.run_count(query_node, run_id)
                seen = {
                    "health": health["status"],
                    "nodes": health["number_of_nodes"],
                    "master": master,
                    "count": count,
                }
                lost.seen.append(seen)
                if (
                    health["number_of_nodes"] == 2
                    and master in survivors
                    and count >= count_at_kill + 120  # the agents go on through the cluster's other nodes
                    and len(queries.since(t_kill)) >= 10
                    and replay.done()
                ):
                    return seen
                return None

            lost.seen = []
            during = wait_for(f"the cluster without {victim}: a new master, writes going on, replay done", lost, 120)
            replay_out = replay.result()
        assert any(
            s["health"] == "yellow" for s in lost.seen
        ), f"the loss never showed (replicas unassigned): {lost.seen}"
        bulk_during = cluster.bulk_requests(query_node)
        took = any(bulk_during[n] > bulk_before[n] for n in survivors)  # the nodes left took them
        assert victim not in bulk_during and took, (bulk_before, bulk_during)
        t_restart = time.monotonic()
        cluster.engine.docker("start", container["Id"], what=f"docker start {victim}")

        def green() -> dict | None:
            health = cluster.health(query_node)
            return health if (health["status"], health["number_of_nodes"]) == ("green", 3) else None

        wait_for(f"green with {victim} back", green, 180)
        t_green = time.monotonic()
        assert cluster.es("GET", victim, "/_cluster/health").json()["status"] == "green"
        count_at_green = cluster.run_count(query_node, run_id)
        wait_for(
            "samples after the node's return", lambda: cluster.run_count(query_node, run_id) >= count_at_green + 60, 60
        )
        # every socket of the namespace, the agents' and the nodes' connections too, on loopback
        assert all(on_loopback(a) for a in socket_addresses()), socket_addresses()
    finally:
        results = queries.stop()

    # stop the run in order: the agents deliver what they hold, the run document is sent
    cluster.engine.docker("stop", "--time", "90", name, timeout=150)
    logs = cluster.engine.docker("logs", "--tail", "40", name).stdout
    assert json.loads((run_dir / "run.json").read_text()).get("finished"), logs
    assert "no loss: OK" in logs, logs

    # the queries: every one answered, whole, while the node was down too
    failed = [r for r in results if r["status"] != 200 or not r["whole"]]
    assert not failed, f"{len(failed)} of {len(results)} queries not answered whole: {failed[:5]}"
    in_loss = [r for r in results if t_kill <= r["t"] < t_green]
    assert len(in_loss) >= 10, len(in_loss)
    slowest = max(results, key=lambda r: r["s"])

    # each agent failed over from the node killed to a node left, and said so: to the next listed,
    # or past it to the third when the next one too failed to answer in time (a new master being
    # elected: CI saw it), naming both
    for agent in ("agent-py", "agent-c"):
        log = agent_logs[agent].read_text()
        assert log.startswith(said_before[agent]), agent  # one log, written on
        moves = failovers_said(log[len(said_before[agent]) :])  # since the kill
        assert any(first in failed and to in (f"{n}:9200" for n in survivors) for failed, to in moves), (
            agent,
            moves,
            log[-2000:],
        )

    # every sample the agents sent, exactly once, by document id
    cluster.es("POST", query_node, "/flowstat-*/_refresh")
    stored = stored_samples(cluster, query_node, run_id)
    sent = sample_ids(run_dir / "samples.ndjson")
    c_stats = json.loads((run_dir / "agent-c-stats.json").read_text())
    assert sent and max(sent.values()) == 1 and c_stats["samples"] > 0
    problems = once_each(stored, sent, c_stats["samples"])
    assert not problems, "\n".join(problems)
    for agent, stats in (("agent-py", json.loads((run_dir / "agent-py-stats.json").read_text())), ("agent-c", c_stats)):
        figures = es_sink(stats)
        log_tail = (run_dir / "logs" / f"{agent}.log").read_text()[-3000:]
        assert (figures["lost"], figures["spooled"], figures["refused"]) == (0, 0, 0), (agent, figures, log_tail)
    run_doc = cluster.es("GET", query_node, f"/flowstat-runs/_doc/{run_id}").json()
    assert run_doc.get("found") and run_doc["_source"].get("finished"), run_doc

    # and replay, through the same list with its first node down: every sample of its run file once
    replayed = Counter(d["_id"] for d in stored_samples(cluster, query_node, replayed_id))
    want = sample_ids(cluster.volume_dir("harness-runs") / replayed_id / "samples.ndjson")
    assert replayed == want, (len(replayed), len(want), replay_out.stdout[-1000:], replay_out.stderr[-1000:])
    assert cluster.es("GET", query_node, f"/flowstat-runs/_doc/{replayed_id}").json().get("found")

    resent = sum(1 for d in stored if d["_version"] > 1)
    print(
        f"es-cluster: killed {victim} (master; the sink's first node) {t_kill - t_start:.0f} s in; "
        f"{during}; down {t_restart - t_kill:.0f} s, green {t_green - t_restart:.0f} s after its start; "
        f"{len(results)} queries of {query_node}, {len(in_loss)} while it was away, slowest {slowest['s']:.2f} s; "
        f"{len(stored)} samples stored once each ({resent} written again by a resend), {len(replayed)} replayed; "
        f"_bulk requests by node before the kill {bulk_before}, during {bulk_during}",
        file=sys.stderr,
    )
