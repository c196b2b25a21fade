"""Credentials, TLS and what an agent says when a store will not let it in (docs/security.md),
against the real agent and scripted stores (tests/support/agents.py) on 127.0.0.1: secrets come
from the environment or a credentials file only its owner may read, never show in the log, the
stats, the spool or the command line; a 401, a 403 or an untrusted certificate keeps the samples
(spooled, each delivered once when the store lets the agent in) and is logged once as it begins
and once as it ends. Also the Elasticsearch sink's daily indices.

The tests run on the agents listed in AGENTS (the `agent_command` fixture of conftest.py): the C
agent for now; add "py" once the Python agent follows docs/security.md too."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest

from support.agents import (
    ScriptedHttp,
    agent_args,
    basic_header,
    credential_free_env,
    make_certificates,
    secret_forms,
    sleeper,
    wait_until,
    where_secrets_show,
    write_credentials,
)
from support.common import C_ASAN, needs

AGENTS = ["c", "py"]
each_agent = pytest.mark.parametrize("agent_command", AGENTS, indirect=True)

ES_VARS = "FLOWSTAT_ES_USER and FLOWSTAT_ES_PASSWORD, or FLOWSTAT_ES_API_KEY"
INFLUX_VARS = "FLOWSTAT_INFLUX_USER and FLOWSTAT_INFLUX_PASSWORD, or FLOWSTAT_INFLUX_TOKEN"
PASSWORD = "pw-Zq8#x!tR2 end"  # a '#' and a blank inside: a value is the whole rest of its line
TOKEN = "tok-9fJ2kLmNq7"
API_KEY = "VnVhQ2ZHY0JDZGJrUW0tZTVhT3g6dWkybHAyYXhUTm1zeWFrdzl0dk5udw=="


@pytest.fixture
def target():
    proc = sleeper()
    yield proc.pid
    proc.kill()


class Agent:
    """The agent under test, running, its stderr in a file that can be read while it runs."""

    def __init__(self, command, args, env: dict, log: Path):
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen([*command, *map(str, args)], stderr=f, env=env)

    def text(self) -> str:
        return self.log.read_text()

    def stop(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_agent(command, *args, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


def day(stamp: str) -> str:
    """The UTC day of an ISO time, as a daily index names it: 2026.11.26."""
    t = datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC)
    return t.strftime("%Y.%m.%d")


def bulk_pairs(body: bytes) -> list[tuple[dict, dict]]:
    lines = body.decode().splitlines()
    return [(json.loads(a), json.loads(d)) for a, d in zip(lines[::2], lines[1::2], strict=False)]


def bulk_ok(body: bytes, status=lambda action, doc: 201) -> bytes:
    """A _bulk answer: each document's status as `status` says; errors: true if any is not 2xx."""
    items = []
    for action, doc in bulk_pairs(body):
        st = status(action, doc)
        item = {"_index": action["index"]["_index"], "_id": action["index"]["_id"], "status": st}
        if st >= 300:
            user = "flowstat_agent"
            item["error"] = {
                "type": "security_exception",
                "reason": (
                    f"action [indices:data/write/bulk[s]] is unauthorized for user [{user}] with effective roles "
                    f"[flowstat_writer] on indices [{item['_index']}], this action is granted by the index privileges "
                    f"[create_doc,create,delete,index,write,all]"
                ),
            }
        items.append({"index": item})
    return json.dumps({"took": 1, "errors": any(i["index"]["status"] >= 300 for i in items), "items": items}).encode()


RUN_TAG, SEQ_FIELD = re.compile(r",run_id=([^, ]+)"), re.compile(r"[ ,]seq=(\d+)i")


def sample_keys(kind: str, body: bytes) -> list[tuple[str, int]]:
    """(run_id, seq) of each sample of a batch, whatever the sink's encoding."""
    if kind == "elasticsearch":
        return [(doc["run_id"], doc["seq"]) for _, doc in bulk_pairs(body) if "node_id" in doc]
    lines = [x for x in body.decode().splitlines() if x.startswith("flowstat_node")]
    return [(RUN_TAG.search(x).group(1), int(SEQ_FIELD.search(x).group(1))) for x in lines]


# -- 401 and 403: kept, said once, delivered once; no secret anywhere ---------------------------------


def es_refusal(status: int, auth: str, key: bool) -> bytes:
    """What Elasticsearch answers a 401 (the Authorization header echoed: a store that does so must
    not get a secret into the agent's log) or a 403 (naming the user's roles)."""
    if status == 403:
        reason = (
            "action [indices:data/write/bulk] is unauthorized for user [flowstat_agent] with effective roles "
            "[flowstat_grafana], this action is granted by the index privileges [create_doc,create,delete,"
            "index,write,all]"
        )
        error = {
            "root_cause": [{"type": "security_exception", "reason": reason}],
            "type": "security_exception",
            "reason": reason,
        }
    elif key:
        error = {
            "type": "security_exception",
            "reason": "unable to authenticate with provided credentials and "
            f"anonymous access is not allowed for this request (Authorization: {auth})",
            "additional_unsuccessful_credentials": "API key: api key is expired",
        }
    else:
        error = {
            "type": "security_exception",
            "reason": f"unable to authenticate user [flowstat_agent] for REST request [/_bulk] ({auth})",
        }
    return json.dumps({"error": error, "status": status}).encode()


CASES = {
    # name: sink (scheme, path), where the credentials are (env, file), the answer, the header expected,
    # what the agent says (URL and DAY filled in)
    "es-user-401": dict(
        scheme="elasticsearch",
        path="flowstat-samples",
        env={"FLOWSTAT_ES_USER": "flowstat_agent"},
        file={"FLOWSTAT_ES_PASSWORD": PASSWORD},
        status=401,
        header=basic_header("flowstat_agent", PASSWORD),
        says=f"authentication failed as flowstat_agent at URL (set {ES_VARS}): unable to authenticate "
        "user [flowstat_agent] for REST request [/_bulk] (Basic ***)",
        ends="takes batches again: the credentials work now",
    ),
    "es-user-403": dict(
        scheme="elasticsearch",
        path="flowstat-samples",
        env={},
        file={"FLOWSTAT_ES_USER": "flowstat_agent", "FLOWSTAT_ES_PASSWORD": PASSWORD},
        status=403,
        header=basic_header("flowstat_agent", PASSWORD),
        says="flowstat_agent may not write flowstat-samples-DAY at URL: action "
        "[indices:data/write/bulk] is unauthorized for user [flowstat_agent] with effective roles "
        "[flowstat_grafana]",
        ends="takes batches again: it may be written now",
    ),
    "es-api-key-401": dict(
        scheme="elasticsearch",
        path="flowstat-samples",
        env={"FLOWSTAT_ES_API_KEY": API_KEY},
        file={},
        status=401,
        header=f"ApiKey {API_KEY}",
        says=f"authentication failed with the API key (FLOWSTAT_ES_API_KEY) at URL (set {ES_VARS}): "
        "unable to authenticate with provided credentials and anonymous access is not allowed "
        "for this request (Authorization: ApiKey ***); API key: api key is expired",
        ends="takes batches again: the credentials work now",
    ),
    "influxdb-token-401": dict(
        scheme="influxdb",
        path="flowstat",
        env={},
        file={"FLOWSTAT_INFLUX_TOKEN": TOKEN},
        status=401,
        header=f"Token {TOKEN}",
        says=f"authentication failed with the token (FLOWSTAT_INFLUX_TOKEN) at URL (set "
        f"{INFLUX_VARS}): authorization failed (Token ***)",
        ends="takes batches again: the credentials work now",
    ),
    "line-protocol-user-401": dict(
        scheme="http",
        path="write",
        env={"FLOWSTAT_INFLUX_PASSWORD": PASSWORD},
        file={"FLOWSTAT_INFLUX_USER": "telegraf"},
        status=401,
        header=basic_header("telegraf", PASSWORD),
        says=f"authentication failed as telegraf at URL (set {INFLUX_VARS}): authorization " "failed (Basic ***)",
        ends="takes batches again: the credentials work now",
    ),
}


class RefusingStore:
    """A scripted store that answers `status` while `refusing` is set, then takes everything; it
    keeps the requests it took."""

    def __init__(self, scheme: str, status: int, key: bool, tls=None):
        self.scheme, self.status, self.key = scheme, status, key
        self.refusing = threading.Event()
        self.refusing.set()
        self.taken: list[bytes] = []
        self.refused = 0
        self.server = ScriptedHttp(self.answer, tls=tls)
        self.port = self.server.port

    def answer(self, path, body, n):
        auth = self.server.headers[n].get("authorization", "")
        if self.refusing.is_set():
            self.refused += 1
            if self.scheme.startswith("elasticsearch"):
                return self.status, es_refusal(self.status, auth, self.key)
            return self.status, json.dumps({"error": f"authorization failed ({auth})"}).encode()
        self.taken.append(body)
        return (200, bulk_ok(body)) if self.scheme.startswith("elasticsearch") else (204, b"")

    def close(self):
        self.server.close()


@each_agent
@pytest.mark.parametrize("case", list(CASES))
def test_a_store_that_refuses_the_login_gets_every_sample_once_it_lets_the_agent_in_and_no_secret_shows(
    tmp_path, target, agent_command, case
):
    check_refused_login(tmp_path, target, agent_command, CASES[case])


@needs(C_ASAN)
@pytest.mark.parametrize("case", ["es-api-key-401", "es-user-403"])
def test_the_c_agent_under_asan_keeps_what_a_refused_login_holds_back(tmp_path, target, case):
    """The same under AddressSanitizer and UBSan: the messages built from the store's answer, the
    redaction, the credentials' life and wiping; a leak at exit fails the exit status."""
    log = check_refused_login(tmp_path, target, [str(C_ASAN)], CASES[case])
    assert "runtime error" not in log and "AddressSanitizer" not in log


def check_refused_login(tmp_path, target, agent_command, c: dict) -> str:
    """Refused 401/403 for three sends, then let in: returns the agent's log once every check holds."""
    store = RefusingStore(c["scheme"], c["status"], key="API_KEY" in str(c["env"]))
    url = f"{c['scheme']}://127.0.0.1:{store.port}/{c['path']}"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    creds = write_credentials(tmp_path / "credentials", c["file"])
    secrets = secret_forms(PASSWORD, TOKEN, API_KEY, basic=("flowstat_agent", PASSWORD)) + secret_forms(
        basic=("telegraf", PASSWORD)
    )
    agent = Agent(
        agent_command,
        agent_args(
            target, interval=0.1, self_interval=0, run_id="r", sink=url, spool_dir=spool, stats=stats, credentials=creds
        ),
        credential_free_env(**c["env"]),
        tmp_path / "agent.log",
    )
    try:
        wait_until(lambda: store.refused >= 3, "three sends refused (two resends)", timeout=15)
        wait_until(lambda: list(spool.rglob("*.batch")), "batches spooled while refused", timeout=5)
        while_refused = where_secrets_show(secrets, paths=[spool], pids=[agent.proc.pid])
        store.refusing.clear()
        wait_until(
            lambda: c["ends"] in agent.text() and not list(spool.rglob("*.batch")),
            "the spool resent once the store lets the agent in",
            timeout=15,
        )
        assert agent.stop() == 0, agent.text()
    finally:
        agent.kill()
        store.close()
    log = agent.text()
    first_day = day(bulk_pairs(store.server.bodies()[0])[0][1]["time"]) if c["scheme"] == "elasticsearch" else ""
    says = c["says"].replace("URL", url).replace("DAY", first_day)
    assert log.count(says) == 1, log  # once as it begins, not at each of the resends
    assert log.count(c["ends"]) == 1, log  # once as it ends
    assert "is down" not in log
    assert where_secrets_show(secrets, texts={"stderr": log}, paths=[stats, spool]) + while_refused == []
    assert {h.get("authorization") for h in store.server.headers} == {c["header"]}
    everything = json.loads(stats.read_text())
    keys = sorted(k for body in store.taken for k in sample_keys(c["scheme"], body))
    assert keys == [("r", seq) for seq in range(everything["samples"])]  # every sample once, those refused too
    sink = everything["sinks"][url]
    assert (sink["delivered"], sink["refused"], sink["lost"], sink["spooled"]) == (everything["samples"], 0, 0, 0)
    return log


@each_agent
def test_documents_answered_403_are_kept_and_sent_again_the_rest_stored(tmp_path, target, agent_command):
    """A user that may write the samples' index but not the agents': the self-samples' documents are
    answered 403 one by one in a 200; they are kept and sent again, said once, and stored once the
    user may write there; the samples go on being stored meanwhile."""
    forbid = threading.Event()
    forbid.set()
    stored: dict[str, int] = {}

    def answer(path, body, n):
        # One look at the switch per request: cleared between the count and the answer, it told the
        # agent 201 for documents never counted as stored.
        forbidden = forbid.is_set()
        status = (
            lambda action, doc: 403 if forbidden and action["index"]["_index"].startswith("flowstat-agents-") else 201
        )
        for action, doc in bulk_pairs(body):
            if status(action, doc) == 201:
                stored[action["index"]["_id"]] = stored.get(action["index"]["_id"], 0) + 1
        return 200, bulk_ok(body, status)

    server = ScriptedHttp(answer)
    url = f"elasticsearch://127.0.0.1:{server.port}/flowstat-samples"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    env = credential_free_env(FLOWSTAT_ES_USER="flowstat_agent", FLOWSTAT_ES_PASSWORD=PASSWORD)
    agent = Agent(
        agent_command,
        agent_args(
            target,
            interval=0.1,
            self_interval=0.3,
            run_id="r",
            sink=url,
            spool_dir=spool,
            stats=stats,
            # The kept documents wait in the spool behind fresh batches: stop waits until all went,
            # however slowly a loaded machine sends them (it ends as soon as nothing waits).
            drain_timeout=50,
        ),
        env,
        tmp_path / "agent.log",
    )
    try:
        wait_until(lambda: "may not write flowstat-agents-" in agent.text(), "the 403 said", timeout=15)
        wait_until(lambda: len(server.requests) >= 12, "resends while refused", timeout=15)
        forbid.clear()
        wait_until(lambda: "it may be written now" in agent.text(), "the end of the 403s said", timeout=15)
        assert agent.stop() == 0, agent.text()
    finally:
        agent.kill()
        server.close()
    log = agent.text()
    first = next(
        a["index"]["_index"]
        for b in server.bodies()
        for a, _ in bulk_pairs(b)
        if a["index"]["_index"].startswith("flowstat-agents-")
    )
    says = (
        f"flowstat_agent may not write {first} at {url}: action [indices:data/write/bulk[s]] is unauthorized for "
        f"user [flowstat_agent] with effective roles [flowstat_writer] on indices [{first}]"
    )
    assert log.count(says) == 1 and log.count("takes batches again: it may be written now") == 1, log
    assert "not taken for now" not in log  # the 403s are one trouble, said once
    everything = json.loads(stats.read_text())
    assert len(stored) == everything["samples"] + everything["self_samples"] and set(stored.values()) == {1}
    sink = everything["sinks"][url]
    assert (sink["refused"], sink["lost"], sink["spooled"]) == (0, 0, 0)
    assert sink["delivered"] == everything["samples"] + everything["self_samples"]


@each_agent
def test_the_next_agent_with_good_credentials_delivers_what_was_spooled_meanwhile(tmp_path, target, agent_command):
    """Wrong password: everything is spooled (nothing refused for good); the agent started again
    with the right one in a credentials file sends the spool and its own samples, each once."""
    good = basic_header("flowstat_agent", PASSWORD)
    taken: list[bytes] = []

    def answer(path, body, n):
        if server.headers[n].get("authorization") != good:
            return 401, es_refusal(401, "", key=False)
        taken.append(body)
        return 200, bulk_ok(body)

    server = ScriptedHttp(answer)
    url = f"elasticsearch://127.0.0.1:{server.port}/flowstat-samples"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    args = partial(agent_args, target, interval=0.05, self_interval=0, sink=url, spool_dir=spool, stats=stats)
    try:
        wrong = run_agent(
            agent_command,
            *args(count=5, drain_timeout=0, run_id="first"),
            env=credential_free_env(FLOWSTAT_ES_USER="flowstat_agent", FLOWSTAT_ES_PASSWORD="wrong"),
        )
        assert wrong.returncode == 0, wrong.stderr
        assert wrong.stderr.count("authentication failed as flowstat_agent") == 1, wrong.stderr
        sink = json.loads(stats.read_text())["sinks"][url]
        assert (sink["spooled_samples"], sink["delivered"], sink["refused"]) == (5, 0, 0)
        creds = write_credentials(
            tmp_path / "credentials",
            {"FLOWSTAT_ES_USER": "flowstat_agent", "FLOWSTAT_ES_PASSWORD": PASSWORD},
            mode=0o400,
        )
        right = run_agent(agent_command, *args(count=2, run_id="second", credentials=creds), env=credential_free_env())
    finally:
        server.close()
    assert right.returncode == 0, right.stderr
    assert "authentication failed" not in right.stderr
    keys = [k for body in taken for k in sample_keys("elasticsearch", body)]
    # Each once, the spool oldest first. Not the spool before the new samples: what an earlier agent
    # left is a backlog, behind what this one samples (both agents' delivery), so a first sample
    # taken before the spool is read goes first (the C agent's did, on a loaded machine).
    assert sorted(keys) == [("first", s) for s in range(5)] + [("second", s) for s in range(2)]
    assert [k for k in keys if k[0] == "first"] == [("first", s) for s in range(5)]
    sink = json.loads(stats.read_text())["sinks"][url]
    assert (sink["delivered"], sink["spooled"], sink["refused"]) == (7, 0, 0)
    assert (
        where_secrets_show(
            [PASSWORD, "wrong"], texts={"first": wrong.stderr, "second": right.stderr}, paths=[spool, stats]
        )
        == []
    )


@each_agent
def test_without_credentials_the_agent_says_which_variables_to_set(tmp_path, target, agent_command):
    server = ScriptedHttp(lambda path, body, n: (401, es_refusal(401, "", key=False)))
    url = f"elasticsearch://127.0.0.1:{server.port}/flowstat-samples"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    args = agent_args(
        target, interval=0.05, count=3, self_interval=0, sink=url, spool_dir=spool, drain_timeout=1.5, stats=stats
    )
    try:
        out = run_agent(agent_command, *args, env=credential_free_env())
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    says = f"{url} needs credentials: set {ES_VARS} (HTTP 401: unable to authenticate user [flowstat_agent]"
    assert out.stderr.count(says) == 1, out.stderr
    assert all("authorization" not in h for h in server.headers)
    assert len(server.requests) >= 2  # sent again at exit, and said no more
    sink = json.loads(stats.read_text())["sinks"][url]
    assert (sink["spooled_samples"], sink["refused"], sink["lost"]) == (3, 0, 0)


@each_agent
def test_the_environment_wins_over_the_credentials_file_named_by_flowstat_credentials(tmp_path, target, agent_command):
    server = ScriptedHttp(lambda path, body, n: (204, b""))
    creds = tmp_path / "credentials"
    creds.write_text(
        f"# the writer\n\n  FLOWSTAT_INFLUX_USER=writer\nFLOWSTAT_INFLUX_PASSWORD=from-the-file\n"
        f"FLOWSTAT_ES_API_KEY={API_KEY}\n"
    )
    creds.chmod(0o600)
    url = f"influxdb://127.0.0.1:{server.port}/flowstat"
    try:
        out = run_agent(
            agent_command,
            *agent_args(target, interval=0.05, count=2, sink=url),
            env=credential_free_env(FLOWSTAT_CREDENTIALS=str(creds), FLOWSTAT_INFLUX_PASSWORD=PASSWORD),
        )
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    assert {h.get("authorization") for h in server.headers} == {basic_header("writer", PASSWORD)}
    assert all(path.startswith("/write?db=flowstat") and "writer" not in path for path, _, _ in server.requests)


# -- refused at start ----------------------------------------------------------------------------


@each_agent
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o700])
def test_a_credentials_file_others_may_read_is_refused_with_the_chmod_to_run(tmp_path, target, agent_command, mode):
    creds = write_credentials(tmp_path / "credentials", {"FLOWSTAT_ES_PASSWORD": PASSWORD}, mode=mode)
    out = run_agent(agent_command, "--pid", target, "--count", 1, "--credentials", creds, env=credential_free_env())
    if mode == 0o700:  # the owner's bits are the owner's business
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode == 2, out.stderr
    assert f"credentials file {creds} has mode {mode:04o}" in out.stderr, out.stderr
    assert f"chmod 600 {creds}" in out.stderr
    assert PASSWORD not in out.stderr


@each_agent
@pytest.mark.parametrize(
    "content,says",
    [
        ("export FLOWSTAT_ES_PASSWORD=SECRET\n", "line 1: NAME=VALUE, without export"),
        ("# a comment\nSECRET\n", "line 2: expected NAME=VALUE"),
        ("FLOWSTAT_ES_PASSWORD='SECRET'\n", "line 1: the value of FLOWSTAT_ES_PASSWORD is quoted"),
        ("FLOWSTAT_ES_PASWORD=SECRET\n", "line 1: unknown name 'FLOWSTAT_ES_PASWORD'"),
        ("FLOWSTAT_ES_PASSWORD=SECRET\nFLOWSTAT_ES_PASSWORD=SECRET\n", "line 2: FLOWSTAT_ES_PASSWORD given twice"),
    ],
)
def test_a_credentials_file_line_that_is_not_name_equals_value_is_refused_without_its_value(
    tmp_path, target, agent_command, content, says
):
    creds = tmp_path / "credentials"
    creds.write_text(content.replace("SECRET", PASSWORD))
    creds.chmod(0o600)
    out = run_agent(agent_command, "--pid", target, "--count", 1, "--credentials", creds, env=credential_free_env())
    assert out.returncode == 2 and f"credentials file {creds} {says}" in out.stderr, out.stderr
    assert PASSWORD not in out.stderr


@each_agent
@pytest.mark.parametrize("what", ["directory", "missing"])
def test_a_credentials_file_that_is_no_file_is_refused(tmp_path, target, agent_command, what):
    path = tmp_path / what
    if what == "directory":
        path.mkdir(mode=0o700)
    out = run_agent(agent_command, "--pid", target, "--count", 1, "--credentials", path, env=credential_free_env())
    assert out.returncode == 2 and f"credentials file {path}" in out.stderr, out.stderr
    assert ("is not a regular file" if what == "directory" else "No such file") in out.stderr


@each_agent
@pytest.mark.parametrize(
    "url,vars_",
    [
        ("http://flowstat:SECRET@127.0.0.1:1/write", "FLOWSTAT_INFLUX_USER and FLOWSTAT_INFLUX_PASSWORD"),
        (
            "influxdb+https://flowstat:SECRET@127.0.0.1:8086/flowstat",
            "FLOWSTAT_INFLUX_USER and FLOWSTAT_INFLUX_PASSWORD",
        ),
        ("elasticsearch://SECRET@127.0.0.1:9200/flowstat-samples", "FLOWSTAT_ES_USER and FLOWSTAT_ES_PASSWORD"),
        (
            "elasticsearch+https://elastic:SECRET@127.0.0.1:9200/flowstat-samples?format=json",
            "FLOWSTAT_ES_USER and FLOWSTAT_ES_PASSWORD",
        ),
    ],
)
@pytest.mark.parametrize("twice", [False, True])
def test_a_url_holding_a_password_is_refused_without_repeating_it(target, agent_command, url, vars_, twice):
    url = url.replace("SECRET", PASSWORD.replace(" ", "_").replace("#", "_"))
    out = run_agent(
        agent_command, *agent_args(target, count=1, sink=[url, url] if twice else url), env=credential_free_env()
    )
    assert out.returncode == 2, out.stderr
    assert "a user or password in a URL shows in process lists and logs" in out.stderr, out.stderr
    assert vars_ in out.stderr and "--credentials" in out.stderr
    assert "pw-Zq8" not in out.stderr and "@127.0.0.1" in out.stderr  # the host is named, not who logs in


@each_agent
@pytest.mark.parametrize(
    "env,says",
    [
        (
            {"FLOWSTAT_ES_USER": "flowstat_agent", "FLOWSTAT_ES_API_KEY": API_KEY},
            f"FLOWSTAT_ES_API_KEY and a user are both set: give one way to log in ({ES_VARS})",
        ),
        ({"FLOWSTAT_ES_USER": "flowstat_agent"}, "FLOWSTAT_ES_USER is set without FLOWSTAT_ES_PASSWORD"),
        ({"FLOWSTAT_ES_PASSWORD": PASSWORD}, "FLOWSTAT_ES_PASSWORD is set without FLOWSTAT_ES_USER"),
        (
            {"FLOWSTAT_ES_CA_FILE": "/no/such/ca.pem"},
            "FLOWSTAT_ES_CA_FILE=/no/such/ca.pem: cannot read that CA file: No such file or directory",
        ),
    ],
)
def test_credentials_that_do_not_fit_together_are_refused_at_start(target, agent_command, env, says):
    out = run_agent(
        agent_command,
        *agent_args(target, count=1, sink="elasticsearch+https://127.0.0.1:1/flowstat-samples"),
        env=credential_free_env(**env),
    )
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert where_secrets_show([PASSWORD, API_KEY], texts={"stderr": out.stderr}) == []


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("tls"))


@each_agent
@pytest.mark.parametrize(
    "scheme,path,ca_var,named",
    [
        ("elasticsearch+https", "flowstat-samples", "FLOWSTAT_ES_CA_FILE", "FLOWSTAT_ES_CA_FILE"),
        ("influxdb+https", "flowstat", "FLOWSTAT_INFLUX_CA_FILE", "FLOWSTAT_INFLUX_CA_FILE"),
        ("https", "write", "FLOWSTAT_CA_FILE", "FLOWSTAT_INFLUX_CA_FILE"),  # the default for both stores
    ],
)
def test_an_untrusted_certificate_keeps_the_samples_until_the_ca_file_is_given(
    tmp_path, target, agent_command, certificates, scheme, path, ca_var, named
):
    kind = "elasticsearch" if scheme.startswith("elasticsearch") else "influxdb"
    store = RefusingStore(scheme, 0, key=False, tls=(certificates.cert, certificates.key))
    store.refusing.clear()  # it takes whatever reaches it: what stops the samples is the certificate
    url = f"{scheme}://127.0.0.1:{store.port}/{path}"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    login = (
        {"FLOWSTAT_ES_USER": "flowstat_agent", "FLOWSTAT_ES_PASSWORD": PASSWORD}
        if kind == "elasticsearch"
        else {"FLOWSTAT_INFLUX_TOKEN": TOKEN}
    )
    args = partial(agent_args, target, interval=0.05, self_interval=0, sink=url, spool_dir=spool, stats=stats)
    try:
        untrusted = run_agent(
            agent_command,
            *args(count=3, drain_timeout=1.5, run_id="first"),
            env=credential_free_env(**login),
        )
        assert untrusted.returncode == 0, untrusted.stderr
        says = (
            f"TLS: the certificate of 127.0.0.1:{store.port} is not trusted (set {named} to the CA that " f"signed it)"
        )
        assert untrusted.stderr.count(says) == 1, untrusted.stderr
        assert not store.server.requests  # nothing went out: not even the credentials
        assert json.loads(stats.read_text())["sinks"][url]["spooled_samples"] == 3
        trusted = run_agent(
            agent_command,
            *args(count=2, run_id="second"),
            env=credential_free_env(**login, **{ca_var: str(certificates.ca)}),
        )
    finally:
        store.close()
    assert trusted.returncode == 0, trusted.stderr
    assert "TLS" not in trusted.stderr
    keys = [k for body in store.taken for k in sample_keys("elasticsearch" if kind == "elasticsearch" else "lp", body)]
    assert keys == [("first", s) for s in range(3)] + [("second", s) for s in range(2)]
    expected = basic_header("flowstat_agent", PASSWORD) if kind == "elasticsearch" else f"Token {TOKEN}"
    assert {h.get("authorization") for h in store.server.headers} == {expected}
    assert (
        where_secrets_show(
            secret_forms(PASSWORD, TOKEN, basic=("flowstat_agent", PASSWORD)),
            texts={"first": untrusted.stderr, "second": trusted.stderr},
            paths=[spool, stats],
        )
        == []
    )


# -- retention: daily indices --------------------------------------------------------------------


@each_agent
def test_elasticsearch_documents_go_to_the_daily_index_of_their_own_time(tmp_path, target, agent_command):
    server = ScriptedHttp(lambda path, body, n: (200, bulk_ok(body)))
    url = f"elasticsearch://127.0.0.1:{server.port}/flowstat-samples"
    try:
        out = run_agent(
            agent_command,
            *agent_args(target, interval=0.05, count=4, self_interval=0.1, run_id="r", sink=url),
            env=credential_free_env(),
        )
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    pairs = [p for body in server.bodies() for p in bulk_pairs(body)]
    samples = [(a, d) for a, d in pairs if "node_id" in d]
    selves = [(a, d) for a, d in pairs if "node_id" not in d]
    assert len(samples) == 4 and selves
    for action, doc in samples:
        assert action == {
            "index": {
                "_index": f"flowstat-samples-{day(doc['time'])}",
                "_id": f"r/{doc['agent']}/{doc['node_id']}/{doc['seq']}",
            }
        }
    for action, doc in selves:
        assert action == {
            "index": {
                "_index": f"flowstat-agents-{day(doc['time'])}",
                "_id": f"{doc['host']}/{doc['agent']}/{doc['time']}/{doc['seq']}",
            }
        }
    first = server.bodies()[0].decode().splitlines()[0]  # the action line's bytes: as before, but for the name
    assert re.fullmatch(r'\{"index":\{"_index":"flowstat-samples-\d{4}\.\d{2}\.\d{2}","_id":"[^"]+"\}\}', first)


@each_agent
def test_a_short_password_spoils_neither_the_answers_nor_the_log(tmp_path, target, agent_command):
    """A one-letter password is redacted from what the agent logs of an answer, never from the
    answer it judges: the _bulk answer's JSON stays whole, each document is settled once."""

    def answer(path, body, n):
        return 200, bulk_ok(body, lambda action, doc: 400 if doc["seq"] == 1 else 201)

    server = ScriptedHttp(answer)
    url = f"elasticsearch://127.0.0.1:{server.port}/flowstat-samples"
    spool, stats = tmp_path / "spool", tmp_path / "stats.json"
    try:
        out = run_agent(
            agent_command,
            *agent_args(target, interval=0.05, count=3, self_interval=0, sink=url, spool_dir=spool, stats=stats),
            env=credential_free_env(FLOWSTAT_ES_USER="flowstat_agent", FLOWSTAT_ES_PASSWORD="s"),
        )
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    # nothing sent again: each round's document once (rounds that waited may go in one request)
    docs = [json.loads(x) for x in server.lines() if not x.startswith('{"index"')]
    assert sorted(d["seq"] for d in docs) == [0, 1, 2], docs
    sink = json.loads(stats.read_text())["sinks"][url]
    assert (sink["delivered"], sink["refused"], sink["lost"], sink["spooled"]) == (2, 1, 0, 0)
    # each agent's words for it: the C agent logs the store's error object, the Python agent its reason
    mark = "status 400: " if agent_command[0].endswith("flowstat-agent") else "HTTP 400: "
    refused = [line for line in out.stderr.splitlines() if "refused" in line and mark in line]
    said = refused[0].split(mark, 1)[1] if len(refused) == 1 else ""
    assert "*ecurity_exception" in said and "s" not in said, refused  # each "s" in the store's words hidden
