"""ZeroMQ CURVE for control (and data) sockets: a run's keys, a node's guard, a client's keys.

A run has two key pairs, made when it starts and kept in RUN_DIR/keys (0700):

- ``node.key`` / ``node.key_secret``: the nodes' identity. Every node of the run is a CURVE server
  with this secret key; its public key goes into endpoints.json (``curve_server_key``), so a client
  knows whom it talks to.
- ``client.key`` / ``client.key_secret``: the monitors' identity (agents, ``flowstat ctl``, the
  orchestrator; producers on a secured data channel). A node lets in only this public key.

The files are ZeroMQ's certificate format (ZPL, as czmq's zcert and pyzmq's ``zmq.auth`` write:
``public-key = "Z85"`` / ``secret-key = "Z85"`` under ``curve``); the C library and agent read the
same files (collectors/c/libflowstat-node/node_curve.c). Secret files are created 0600 and their contents are
never logged.

A node's ``Guard`` answers ZeroMQ's authentication requests (ZAP) for its context: the run's client
key passes, any other is refused. It also watches the secured sockets' handshakes, so that a client
without CURVE, or with the wrong server key (which never reaches ZAP), is refused visibly too: the
first refusal is logged with its reason, later ones counted (logged again at close).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
from pathlib import Path
from urllib.parse import urlsplit

import zmq
from zmq.utils import z85

log = logging.getLogger("flowstat.curve")

KEYS_DIR = "keys"  # RUN_DIR/keys
NODE, CLIENT = "node", "client"
ENV_KEYS = "FLOWSTAT_CURVE_KEYS"  # a node's keys folder, when its code does not say
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by ZeroMQ's RFC 27
ZAP_DOMAIN = "flowstat"
KEY_LENGTH = 40  # a Z85 key: 32 bytes as 40 characters
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_BANNER = "#   ZeroMQ CURVE {kind} certificate, written by flowstat for one run.\n"


class CurveError(ValueError):
    """A key file that is missing, unreadable or not a CURVE certificate (names the file)."""


# -- key files -------------------------------------------------------------------------------------
def create_run_keys(run_dir: Path) -> Path:
    """RUN_DIR/keys with the run's two key pairs (secret files 0600); returns the folder."""
    folder = Path(run_dir) / KEYS_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    for name in (NODE, CLIENT):
        public, secret = zmq.curve_keypair()
        _write(folder / f"{name}.key", "public", public, None, 0o644)
        _write(folder / f"{name}.key_secret", "**secret**", public, secret, 0o600)
    return folder


def _write(path: Path, kind: str, public: bytes, secret: bytes | None, mode: int) -> None:
    text = _BANNER.format(kind=kind) + "\nmetadata\ncurve\n" + f'    public-key = "{public.decode()}"\n'
    if secret is not None:
        text += f'    secret-key = "{secret.decode()}"\n'
    # created with its mode: a secret is never readable by others, not even for a moment
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def read_key_file(path: Path, need_secret: bool = False) -> tuple[bytes, bytes | None]:
    """(public, secret) Z85 keys of a certificate file; ``secret`` None when it holds none. A file
    that is missing, unreadable, or without a well-formed key raises CurveError naming it."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CurveError(f"{path}: cannot read the CURVE key file ({exc})") from None
    keys: dict[str, bytes] = {}
    for number, line in enumerate(lines, 1):
        name, eq, value = line.strip().partition("=")
        name = name.strip()
        if line.lstrip().startswith("#") or not eq or name not in ("public-key", "secret-key"):
            continue
        key = value.strip().strip("\"'").encode()
        if not valid_key(key):
            raise CurveError(f"{path}:{number}: {name} is not a Z85 CURVE key of {KEY_LENGTH} characters")
        keys[name] = key
    if "public-key" not in keys:
        raise CurveError(f"{path}: no public-key (a ZeroMQ CURVE certificate file)")
    if need_secret and "secret-key" not in keys:
        raise CurveError(f"{path}: no secret-key (give the .key_secret file)")
    return keys["public-key"], keys.get("secret-key")


def valid_key(key: bytes | str) -> bool:
    """Whether a key is Z85 text of 32 bytes."""
    raw = key.encode() if isinstance(key, str) else key
    if len(raw) != KEY_LENGTH:
        return False
    try:
        return len(z85.decode(raw)) == 32
    except (ValueError, KeyError, TypeError):
        return False


def node_keys(folder: Path) -> tuple[bytes, bytes, bytes]:
    """A node's view of a run's keys: (its public, its secret, the one client public key let in)."""
    folder = Path(folder)
    public, secret = read_key_file(folder / f"{NODE}.key_secret", need_secret=True)
    client, _ = read_key_file(folder / f"{CLIENT}.key")
    assert secret is not None
    return public, secret, client


def client_keys(path: Path) -> tuple[bytes, bytes]:
    """A monitor's key pair from its secret file (RUN_DIR/keys/client.key_secret)."""
    public, secret = read_key_file(path, need_secret=True)
    assert secret is not None
    return public, secret


def default_client_key(endpoints: Path) -> Path:
    """Where a monitor finds the client key of a run by default: RUN_DIR/keys/client.key_secret,
    beside RUN_DIR/endpoints.json (or inside an endpoints folder)."""
    endpoints = Path(endpoints)
    folder = endpoints if endpoints.is_dir() else endpoints.parent
    return folder / KEYS_DIR / f"{CLIENT}.key_secret"


def keys_from_env(given: str | os.PathLike[str] | None) -> Path | None:
    """The keys folder a node was given, else $FLOWSTAT_CURVE_KEYS, else none."""
    if given is not None:
        return Path(given)
    env = os.environ.get(ENV_KEYS)
    return Path(env) if env else None


def is_loopback(endpoint: str) -> bool:
    """Whether a ZeroMQ endpoint or host stays on this machine (127.0.0.0/8, ::1, ipc, inproc);
    a host name or a wildcard does not count: it may be reached from elsewhere."""
    if "://" in endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme in ("ipc", "inproc"):
            return True
        host = parts.hostname or ""
    else:
        host = endpoint.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- sockets ---------------------------------------------------------------------------------------
def secure_client(sock: zmq.Socket[bytes], server_public: bytes | str, keys: tuple[bytes, bytes]) -> None:
    """Make ``sock`` a CURVE client of a server with that public key (before connecting)."""
    sock.curve_serverkey = server_public.encode() if isinstance(server_public, str) else server_public
    sock.curve_publickey, sock.curve_secretkey = keys


def secure_server(sock: zmq.Socket[bytes], public: bytes, secret: bytes) -> None:
    """Make ``sock`` a CURVE server (before binding); its clients are checked by the context's Guard."""
    sock.curve_server = True
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.zap_domain = ZAP_DOMAIN.encode()


def wake_pair(ctx: zmq.Context[zmq.Socket[bytes]], owner: object) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """An inproc pair (the end a thread polls, the end others send on) that wakes a thread asleep
    in poll() without a time-out: it then sleeps until something comes, costing nothing idle."""
    address = f"inproc://flowstat-wake-{id(owner)}"
    woken = ctx.socket(zmq.PAIR)
    woken.bind(address)
    wake = ctx.socket(zmq.PAIR)
    wake.connect(address)
    return woken, wake


class Guard:
    """The ZAP handler of one context (one node), on a thread of its own: lets in the run's client
    key only, and tells refusals (a ZAP denial, or a handshake that failed before ZAP) once."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], allowed: bytes | list[bytes], who: str):
        self.allowed = {allowed} if isinstance(allowed, bytes) else set(allowed)
        self.who = who
        self.refused = 0
        self._ctx = ctx
        self._zap = ctx.socket(zmq.REP)
        self._zap.linger = 0
        self._zap.bind(ZAP_ENDPOINT)
        self._monitors: list[zmq.Socket[bytes]] = []
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._woken, self._wake = wake_pair(ctx, self)  # watch() and close() wake the thread
        self._thread = threading.Thread(target=self._serve, name=f"flowstat-curve {who}", daemon=True)
        self._thread.start()

    def watch(self, sock: zmq.Socket[bytes]) -> None:
        """Also tell handshakes that failed on ``sock`` (a client without CURVE or with another
        server key never reaches ZAP)."""
        monitor = sock.get_monitor_socket(_HANDSHAKE_FAILED)
        with self._lock:
            self._monitors.append(monitor)
            self._wake_thread()

    def _wake_thread(self) -> None:
        try:
            self._wake.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:  # the thread has ended (its context going away) or has a wake-up waiting
            pass

    def _serve(self) -> None:
        try:
            while not self._closing.is_set():
                with self._lock:
                    monitors = list(self._monitors)
                poller = zmq.Poller()
                poller.register(self._zap, zmq.POLLIN)
                poller.register(self._woken, zmq.POLLIN)
                for m in monitors:
                    poller.register(m, zmq.POLLIN)
                ready = dict(poller.poll())
                if self._woken in ready:
                    self._woken.recv()
                if self._zap in ready:
                    self._answer(self._zap.recv_multipart())
                for m in monitors:
                    if m in ready:
                        self._handshake_failed(m.recv_multipart())
        except zmq.ZMQError as exc:  # the context is going away
            log.debug("%s: CURVE guard stops (%s)", self.who, exc)
        finally:
            self._zap.close(0)
            self._woken.close(0)
            for m in self._monitors:
                m.close(0)

    def _answer(self, frames: list[bytes]) -> None:
        # RFC 27: version, request id, domain, address, identity, mechanism, credentials...
        if len(frames) < 6:
            self._zap.send_multipart([b"1.0", b"", b"400", b"malformed ZAP request", b"", b""])
            return
        version, request_id, _domain, address, _identity, mechanism = frames[:6]
        key = frames[6] if len(frames) > 6 else b""
        ok = mechanism == b"CURVE" and z85.encode(key) in self.allowed if len(key) == 32 else False
        if ok:
            self._zap.send_multipart([version, request_id, b"200", b"OK", b"monitor", b""])
            return
        self._zap.send_multipart([version, request_id, b"400", b"not the run's client key", b"", b""])
        self.refuse(f"a client from {address.decode(errors='replace') or '?'} without the run's client key")

    def _handshake_failed(self, frames: list[bytes]) -> None:
        if len(frames) < 2 or len(frames[0]) < 6:
            return
        event = int.from_bytes(frames[0][:2], "little")
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return  # the ZAP denial above, already told
        self.refuse(
            f"a client on {frames[1].decode(errors='replace')} whose handshake failed (no CURVE, or another run's key)"
        )

    def refuse(self, why: str) -> None:
        self.refused += 1
        if self.refused == 1:
            log.warning("%s: refused %s; further refusals are counted, not logged", self.who, why)

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            self._wake_thread()
        self._thread.join(1.0)
        self._wake.close(0)
        if self.refused > 1:
            log.warning("%s: %d control clients refused in all (no key of the run)", self.who, self.refused)
