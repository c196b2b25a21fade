"""Real peers for agent tests: an HTTP receiver and a TCP line receiver on loopback, a
stand-in node whose control socket can be made to hang or answer garbage, and real harness
devices started as the orchestrator starts them; for docs/security.md, a throwaway CA and server
certificate, HTTPS for the scripted server, and a search for secrets where an agent leaves text."""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime as _datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import zmq

from .common import C_AGENT


class HttpReceiver:
    """Accepts POSTs (204) and keeps their bodies; can be stopped and restarted on the same port."""

    def __init__(self, port: int = 0):
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        self.port = port
        self.server = None
        self.start()

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with owner.lock:
                    owner.bodies.append(body)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def lines(self) -> list[str]:
        with self.lock:
            return [line for body in self.bodies for line in body.decode().splitlines() if line]


class ScriptedHttp:
    """An HTTP server whose answer to each POST is chosen by `answer(path, body, n)` (n counts the
    requests from 0) and returns (status, body). With hold set, every request is read and recorded
    at once but answered only once `release` is set. A GET (a store's health check) is answered
    200 with an empty JSON object, and not recorded. The headers of request n are `headers[n]`
    (recorded before `answer` is asked, which may read them). With tls=(certfile, keyfile) it
    speaks HTTPS (a client that does not trust the certificate gets no answer at all). With
    listening=False its port is bound but refuses connections (the kernel answers, however loaded
    the machine is) until listen() is called."""

    def __init__(self, answer=None, hold: bool = False, tls: tuple | None = None, listening: bool = True):
        self.answer = answer or (lambda path, body, n: (204, b""))
        self.requests: list[tuple[str, bytes, float]] = []  # path, body, when it arrived
        self.headers: list[dict[str, str]] = []  # request n's headers, names in lower case
        self.lock = threading.Lock()
        self.release = threading.Event()
        if not hold:
            self.release.set()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with owner.lock:
                    n = len(owner.requests)
                    owner.requests.append((self.path, body, time.monotonic()))
                    owner.headers.append({k.lower(): v for k, v in self.headers.items()})
                owner.release.wait(60)
                status, text = owner.answer(self.path, body, n)
                self.send_response(status)
                self.send_header("Content-Length", str(len(text)))
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(text)

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self.server.daemon_threads = True
        self.server.server_bind()
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.listening_since: float | None = None
        if listening:
            self.listen()

    def listen(self) -> None:
        self.server.server_activate()
        self.listening_since = time.monotonic()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [body for _, body, _ in self.requests]

    def lines(self) -> list[str]:
        return [line for body in self.bodies() for line in body.decode().splitlines() if line]

    def close(self) -> None:
        self.release.set()
        if self.listening_since is not None:
            self.server.shutdown()
        self.server.server_close()


# A get-metrics reply holding every field the sample schema copies from a node's reply (x-control),
# each with a value an encoding could get wrong: many significant digits, past 2**32, both
# booleans, milliseconds in the timestamps.
FULL_REPLY = {
    "node_state": "RUNNING",
    "role": "merger",
    "average_merge_time": 0.123456789012345,
    "merged_objects_per_second": 98765.4321,
    "objects_sent": 2**40 + 3,
    "objects_received": 4_000_000_001,
    "objects_merged": 12345,
    "bytes_sent": 2**52 + 7,
    "bytes_received": 9_876_543_210,
    "objects_held": 17,
    "objects_in_flight": 5,
    "input_latency_p50_ms": 1.5,
    "input_latency_p99_ms": 31.25,
    "input_latency_max_ms": 1234.5678901,
    "input_latency_objects": 999,
    "receive_buffer_size": 100,
    "send_buffer_size": 200,
    "receive_buffer_overloaded": False,
    "send_buffer_overloaded": True,
    "send_overload_events": 3,
    "receive_overload_events": 4,
    "sequence_gaps": 6,
    "busy_seconds": 123.456789,
    "backpressured_seconds": 0.000001,
    "idle_seconds": 98765.4321,
    "busy_ratio": 0.3333,
    "backpressured_ratio": 0.0,
    "idle_ratio": 0.6667,
    "request_timestamp": "2026-11-23T10:00:00.123Z",
    "response_timestamp": "2026-11-23T10:00:00.456Z",
}


# A received_from with what both agents keep (w-0, and w-3's whole count written as a float) and what
# they pass over: an empty id, one over 127 bytes, a fraction, a negative count, a string, a bool.
SOURCES_REPLY = {"w-0": 5, "": 3, "x" * 128: 1, "w-1": 2.5, "w-2": -1, "w-3": 7.0, "w-4": "9", "w-5": True}
SOURCES_KEPT = {"w-0": 5, "w-3": 7}


class StubNode:
    """A control socket that answers like a node ("ok"), hangs ("hang"), answers garbage
    ("garbage"), answers with a role and state outside the schema ("unknown"), with a role in it
    and one outside it by turns ("roles": merger first), or answers every control field of the
    schema ("full": FULL_REPLY)."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.requests = 0
        self.frames_per_request: set[int] = set()  # the ROUTER's identity frame included
        self.running = True
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while self.running:
            if not self.sock.poll(100):
                continue
            frames = self.sock.recv_multipart()
            self.requests += 1
            self.frames_per_request.add(len(frames))
            request = json.loads(frames[-1])
            if self.mode == "hang":
                continue
            if self.mode == "garbage":
                reply = b"\xff\x00 not json"
            elif self.mode == "full":
                reply = json.dumps(
                    {"command": "get-metrics", "id": request.get("id"), "node_id": "stub", **FULL_REPLY}
                ).encode()
            elif self.mode == "sources":  # a node counting by source: good, and bad, sources and counts
                reply = json.dumps(
                    {
                        "command": "get-metrics",
                        "id": request.get("id"),
                        "node_id": "stub",
                        "node_state": "RUNNING",
                        "objects_received": 12,
                        "received_from": SOURCES_REPLY,
                    }
                ).encode()
            elif self.mode == "unknown":  # a role and a state outside the schema's lists
                reply = json.dumps(
                    {
                        "command": "get-metrics",
                        "id": request.get("id"),
                        "node_id": "stub",
                        "node_state": "SLEEPING",
                        "role": "Bad Role!",  # outside the schema's pattern
                        "objects_received": 10,
                    }
                ).encode()
            else:
                reply = json.dumps(
                    {
                        "command": "get-metrics",
                        "id": request.get("id"),
                        "node_id": "stub",
                        "node_state": "RUNNING",
                        "role": "Bad Role!" if self.mode == "roles" and self.requests % 2 == 0 else "merger",
                        "average_merge_time": 0.25,
                        "objects_received": 10,
                        "send_buffer_overloaded": True,
                        "objects_held": "not a number",
                    }
                ).encode()
            self.sock.send_multipart(frames[:-1] + [reply])

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close(0)
        self.ctx.term()


class Device:
    """One real harness device process (``python -m flowstat.harness.devices ROLE``), started as
    the orchestrator starts it, with its stdout events (``ready``, ``final``) read as they come."""

    def __init__(self, role: str, config: dict):
        self.log = tempfile.TemporaryFile()  # a file, not a pipe: a device that logs much never blocks on it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flowstat.harness.devices", role, "--config", json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,
        )
        self.ready = self.event("ready")

    def event(self, name: str, timeout: float = 30) -> dict:
        """The next stdout line, which must be the event ``name``; fails loudly if none comes in time."""
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            assert (
                left > 0 and select.select([self.proc.stdout], [], [], left)[0]
            ), f"no {name!r} event within {timeout} s; stderr: {self.stderr()}"
            chunk = self.proc.stdout.readline()
            assert chunk, f"the device exited ({self.proc.poll()}) before its {name!r} event: {self.stderr()}"
            line += chunk
        doc = json.loads(line)
        assert doc["event"] == name, doc
        return doc

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


class Child(subprocess.Popen):
    """A child that a `with` block ends: killed at the block's end (Popen's own waits for it to exit,
    which for a sleeper of 120 s is 120 s of a test doing nothing)."""

    def __exit__(self, *exc):
        if self.poll() is None:
            self.kill()
        return super().__exit__(*exc)


def _python_child(code: str) -> subprocess.Popen:
    """A Python process running `code` after it says it has started, returned once it has."""
    proc = Child(
        [sys.executable, "-c", f"import time\nprint('ready', flush=True)\n{code}"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def sleeper(seconds: float = 120) -> subprocess.Popen:
    """A process that idles; returned once it has started, so its memory is settled."""
    return _python_child(f"time.sleep({seconds})")


def spinner(seconds: float = 120, share: float = 1.0) -> subprocess.Popen:
    """A process that keeps one core busy (a loop that never waits) for `seconds`; with a `share` below
    1, busy for that share of each 10 ms: CPU counts that move, for less of the suite's CPU."""
    if share >= 1:
        return _python_child(f"end = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass")
    return _python_child(
        f"end = time.monotonic() + {seconds}\nwhile (now := time.monotonic()) < end:\n"
        f"    while time.monotonic() < now + {share * 0.01}:\n        pass\n    time.sleep({(1 - share) * 0.01})"
    )


def wait_until(predicate, what: str, timeout: float = 20, poll: float = 0.02) -> None:
    """Poll until predicate() holds; past `timeout` fail, saying what never came."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(poll)  # polling what a real process does: there is no event to wait on


class SocketReceiver:
    """A UDP or TCP listener on loopback that keeps every line it receives."""

    def __init__(self, kind: str):
        self.kind = kind
        self.data = bytearray()
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        if kind == "tcp":
            self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.running = True
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def _keep(self, chunk: bytes) -> None:
        with self.lock:
            self.data += chunk

    def serve(self) -> None:
        while self.running:
            try:
                if self.kind == "udp":
                    self._keep(self.sock.recv(65536))
                    continue
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(0.2)
            with conn:
                while self.running:
                    try:
                        chunk = conn.recv(65536)
                    except TimeoutError:
                        continue
                    if not chunk:
                        break
                    self._keep(chunk)

    def lines(self) -> list[str]:
        with self.lock:
            return [x for x in self.data.decode().splitlines() if x]

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


# -- credentials and TLS (docs/security.md) --------------------------------------------------------


@dataclass
class Certificates:
    ca: Path  # the CA's certificate: what FLOWSTAT_*_CA_FILE names
    cert: Path  # the server's certificate (SAN IP:127.0.0.1), signed by the CA
    key: Path  # its key


def make_certificates(folder: Path) -> Certificates:
    """A throwaway CA and a server certificate for 127.0.0.1 that it signed, made with openssl
    (EC keys: quick), with the extensions strict verifiers ask for."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key, cert, key, csr, ext = (
        folder / n for n in ("ca.pem", "ca.key", "server.pem", "server.key", "server.csr", "server.ext")
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        ca_key,
        "-out",
        ca,
        "-days",
        2,
        "-subj",
        "/CN=flowstat test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    ext.write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-out",
        cert,
        "-days",
        2,
        "-extfile",
        ext,
    )
    return Certificates(ca, cert, key)


def basic_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def secret_forms(*secrets: str, basic: tuple[str, str] | None = None) -> list[str]:
    """What must never show: each secret, and base64(user:password) (an Authorization header's)."""
    forms = [s for s in secrets if s]
    if basic:
        forms.append(basic_header(*basic).split()[1])
    return forms


def write_credentials(path: Path, values: dict[str, str], mode: int = 0o600) -> Path:
    """A credentials file (NAME=VALUE lines, a comment first) of the given mode."""
    path.write_text("# flowstat credentials\n" + "".join(f"{k}={v}\n" for k, v in values.items()))
    path.chmod(mode)
    return path


def where_secrets_show(secrets, texts: dict[str, str | bytes] | None = None, paths=(), pids=()) -> list[str]:
    """Where any of `secrets` shows: in `texts` (name -> text: a log), in the files under `paths`
    (a stats file, a spool folder, recursively), in /proc/PID/cmdline of `pids` (what every user of
    the machine reads). Empty when nowhere."""
    places: dict[str, bytes] = {name: t.encode() if isinstance(t, str) else t for name, t in (texts or {}).items()}
    for root in map(Path, paths):
        for f in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            places[str(f)] = f.read_bytes()
    for pid in pids:
        try:
            places[f"/proc/{pid}/cmdline"] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    return [f"{s!r} in {name}" for name, data in places.items() for s in secrets if s.encode() in data]


def credential_free_env(**extra: str) -> dict[str, str]:
    """This process's environment without any flowstat credential or CA variable, plus `extra`."""
    names = (
        "FLOWSTAT_INFLUX_USER",
        "FLOWSTAT_INFLUX_PASSWORD",
        "FLOWSTAT_INFLUX_TOKEN",
        "FLOWSTAT_ES_USER",
        "FLOWSTAT_ES_PASSWORD",
        "FLOWSTAT_ES_API_KEY",
        "FLOWSTAT_INFLUX_CA_FILE",
        "FLOWSTAT_ES_CA_FILE",
        "FLOWSTAT_CA_FILE",
        "FLOWSTAT_CREDENTIALS",
    )
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(extra)
    return env


# -- running an agent (the C agent unless told otherwise) ------------------------------------------
def agent_args(pid, **options) -> list[str]:
    """One place to build an agent's test command line, so that a test names only the values it
    sets. Each keyword is an option, named as on the command line with _ for - (spool_dir for
    --spool-dir), in the order given: True makes a flag (quiet=True: --quiet), a list repeats the
    option for each item (pid too), any other value follows its option as a string. Either agent
    refuses an option it does not know, so a misspelt keyword fails the test that gives it."""
    args = []
    for name, value in {"pid": pid, **options}.items():
        option = "--" + name.replace("_", "-")
        if value is True:
            args.append(option)
        else:
            args += [a for v in (value if isinstance(value, list | tuple) else [value]) for a in (option, str(v))]
    return args


def agent_cmd(*args, binary=C_AGENT, command=None) -> list[str]:
    """No self-samples: the delivery of node samples is what these tests count, item by item."""
    return [*(command or [str(binary)]), "--self-interval", "0", *map(str, args)]


def run_agent(*args, binary=C_AGENT, command=None, wrap=(), timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*wrap, *agent_cmd(*args, binary=binary, command=command)], capture_output=True, text=True, timeout=timeout
    )


def endpoints_file(tmp_path, pid: int, nodes=("a", "b", "c")):
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"run_id": "r", "nodes": [{"node_id": n, "role": "merger", "pid": pid} for n in nodes]}))
    return path


def sink_stats(stats_path, url: str) -> dict:
    return json.loads(stats_path.read_text())["sinks"][url]


def stamps_by_node(path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for line in open(path):
        doc = json.loads(line)
        t = _datetime.fromisoformat(doc["time"].replace("Z", "+00:00")).timestamp()
        out.setdefault(doc["node_id"], []).append(t)
    return out


# How long a loaded machine (two cores, the other workers' runs) may hold a sampling round back,
# whatever the agent does: 0.3 s was seen in CI, 0.5 s in a suite beside two busy loops. A sampler
# held by its sink or its scrapes stops for seconds.
LOADED_STALL_S = 0.5


def assert_on_schedule(path, interval: float, most_s: float | None = None) -> int:
    """Consecutive samples of each node at most ``most_s`` apart (about two intervals unless told);
    returns their number."""
    nodes = stamps_by_node(path)
    assert nodes
    most_s = 2 * interval + 0.02 if most_s is None else most_s
    for node, stamps in nodes.items():
        gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
        assert max(gaps) <= most_s, (node, max(gaps))
    return sum(len(s) for s in nodes.values())
