"""``prometheus://HOST:PORT?web_config=PATH``: TLS and basic authentication on /metrics, read from a
web-config.yml in the format of Prometheus' exporter-toolkit (its docs/web-configuration.md), the
file Prometheus itself and its exporters take with --web.config.file:

    tls_server_config:
      cert_file: server.crt                 # relative paths: from the web-config file's folder
      key_file: server.key
      client_ca_file: clients-ca.crt        # with a client_auth_type that verifies client certificates
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven; default NoClientCert
      min_version: TLS12                    # TLS12 (default) or TLS13; max_version alike (default TLS13)
    basic_auth_users:                       # user: bcrypt hash ($2y$, $2b$, $2a$: htpasswd -nBC 10 "")
      prometheus: $2y$10$...

The C agent reads the same files alike, with the same messages (collectors/c/agent/webconfig.c). Any
key it does not know is an error naming the file and the key, and so are exporter-toolkit's keys
flowstat does not do (inline cert, key and client_ca, cipher_suites, curve_preferences,
prefer_server_cipher_suites, client_allowed_sans, http_server_config, rate_limit). At the start, a
file that cannot be used stops the agent.

After the start (Watched), the file is read again at a connection when it, or a certificate, key or
client CA file it names, changed since it was last read (a stat of each: device, inode, size, mtime
and ctime in ns; nothing read, nothing parsed when none did): new users, passwords and certificates
apply to the next connection, as exporter-toolkit's (it reads the file at every request: web/
handler.go webHandler.ServeHTTP, and at every handshake: web/tls_config.go Serve's
GetConfigForClient). A changed file that cannot be used is refused as exporter-toolkit refuses it:
every connection, until it changes again (its TLS handshake refused; plain HTTP answered 500), and
said in one log line (not one a scrape). TLS or not is decided at the start (exporter-toolkit's
Serve alike): a file that gains or loses tls_server_config is one that cannot be used until a
restart; beyond loopback, so is a file left without users.

A password is checked with bcrypt through libxcrypt (ctypes: no Python package), one check at a
time; the one that last matched a user is kept as an HMAC under a key of the config's own (a file
read again forgets them all), so that a scraper's every scrape does not pay bcrypt's 50-100 ms again.
An unknown user is checked against a fixed hash, as exporter-toolkit does: a wrong user takes as
long as a wrong password.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import ctypes.util
import hashlib
import hmac
import logging
import os
import re
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("flowstat.agent")

REALM = "flowstat"
TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version")
TOP_KEYS = ("tls_server_config", "basic_auth_users")
# exporter-toolkit's keys that flowstat's agents do not do: refused, by name.
NOT_DONE = {
    "tls_server_config": ("cert", "key", "client_ca", "cipher_suites", "curve_preferences",
                          "prefer_server_cipher_suites", "client_allowed_sans"),
    "": ("http_server_config", "rate_limit"),
}  # fmt: skip
CLIENT_AUTH = {  # client_auth_type: whether a client certificate is asked for, and required
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}\Z")
# exporter-toolkit's hash of "fakepassword": what an unknown user's password is checked against.
FAKE_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
CRYPT_DATA_SIZE = 32768  # sizeof(struct crypt_data), libxcrypt's <crypt.h>


class WebConfigError(ValueError):
    """A web-config file that cannot be used: the message names the file and the key. stamps: the
    files read up to the error, as they were before (_stamp)."""

    stamps: tuple[tuple[Any, ...], ...] = ()


def _stamp(name: str) -> tuple[Any, ...]:
    """What tells a file changed: its device, inode, size, mtime and ctime (a chmod), in ns; or the
    error of its stat."""
    try:
        st = os.stat(name)
    except OSError as exc:
        return (name, exc.errno)
    return (name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class WebConfig:
    path: str
    context: ssl.SSLContext | None = None  # tls_server_config: the server's TLS
    users: dict[str, str] = field(default_factory=dict)  # basic_auth_users
    auth: BasicAuth | None = None  # with users: their passwords' check
    # the file and those it names (cert, key, client CA), as they were before they were read
    stamps: tuple[tuple[Any, ...], ...] = ()


def load(path: str) -> WebConfig:
    """The web-config file at path, checked whole: its certificate and key loaded, its hashes
    bcrypt's; a WebConfigError naming the file and the key when it cannot be used."""
    stamps = [_stamp(path)]
    try:
        config = _load(path, stamps)
    except WebConfigError as exc:
        exc.stamps = tuple(stamps)
        raise
    config.stamps = tuple(stamps)
    return config


def _load(path: str, stamps: list[tuple[Any, ...]]) -> WebConfig:
    try:
        import yaml
    except ImportError:
        raise WebConfigError(f"{path}: reading it needs PyYAML (pip install PyYAML; Debian: python3-yaml)") from None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise WebConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise WebConfigError(f"{path}: not UTF-8 text") from None
    try:
        doc = yaml.load(text, Loader=yaml.BaseLoader)  # every scalar a string, as libyaml gives the C agent
    except yaml.MarkedYAMLError as exc:  # as libyaml says it to the C agent
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise WebConfigError(f"{path}: not YAML: {exc.problem}{where}") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not YAML: {' '.join(str(exc).split())}") from None
    config = WebConfig(path)
    if doc is None or doc == "":
        return config  # an empty file: plain HTTP, no password (exporter-toolkit alike)
    top = _mapping(path, "", doc, TOP_KEYS)
    if "tls_server_config" in top:
        config.context = _tls(path, _mapping(path, "tls_server_config", top["tls_server_config"], TLS_KEYS), stamps)
    if "basic_auth_users" in top:
        config.users = _users(path, top["basic_auth_users"])
    if config.users:
        try:
            config.auth = BasicAuth(config.users)
        except WebConfigError as exc:
            raise WebConfigError(f"{path}: {exc}") from None
    return config


def _mapping(path: str, where: str, value: Any, known: tuple[str, ...]) -> dict[str, Any]:
    if value == "":  # "key:" and nothing: an empty mapping
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{path}: {where or 'the file'}: must be a mapping ({', '.join(known)})")
    for key in value:
        named = f"{where}.{key}" if where else str(key)
        if key in NOT_DONE[where]:
            raise WebConfigError(f"{path}: {named}: exporter-toolkit's, but not supported by flowstat")
        if key not in known:
            raise WebConfigError(f"{path}: {named}: unknown key ({', '.join(known)})")
    return value


def _string(path: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise WebConfigError(f"{path}: {key}: must be a string")
    return value


def _file(path: str, key: str, value: Any, stamps: list[tuple[Any, ...]]) -> str:
    """A file the config names, from the config's folder when relative, readable; stamped before."""
    name = os.path.join(os.path.dirname(path), _string(path, key, value))
    stamps.append(_stamp(name))
    try:
        with open(name, "rb"):
            pass
    except OSError as exc:
        raise WebConfigError(f"{path}: {key}: cannot read {name}: {exc.strerror}") from None
    return name


def _tls(path: str, tls: dict[str, Any], stamps: list[tuple[Any, ...]]) -> ssl.SSLContext:
    where = "tls_server_config"
    for key in ("cert_file", "key_file"):
        if not tls.get(key):
            raise WebConfigError(f"{path}: {where}.{key}: missing")
    cert, key = (_file(path, f"{where}.{k}", tls[k], stamps) for k in ("cert_file", "key_file"))
    auth = _string(path, f"{where}.client_auth_type", tls.get("client_auth_type") or "NoClientCert")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"{path}: {where}.client_auth_type: {', '.join(CLIENT_AUTH)}, not {auth!r}")
    versions = []
    for k, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        v = _string(path, f"{where}.{k}", tls.get(k) or default)
        if v not in VERSIONS:
            raise WebConfigError(f"{path}: {where}.{k}: TLS12 or TLS13, not {v!r}")
        versions.append(VERSIONS[v])
    if versions[0] > versions[1]:
        raise WebConfigError(f"{path}: {where}.min_version: above max_version")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version, context.maximum_version = versions
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise WebConfigError(f"{path}: {where}.key_file: cannot use {key} with {cert}: {_reason(exc)}") from None
    ca = tls.get("client_ca_file")
    if ca and auth == "NoClientCert":
        raise WebConfigError(f"{path}: {where}.client_ca_file: given, but client_auth_type is NoClientCert")
    if not ca and auth != "NoClientCert":
        raise WebConfigError(f"{path}: {where}.client_ca_file: missing (client_auth_type {auth} verifies against it)")
    if ca:
        name = _file(path, f"{where}.client_ca_file", ca, stamps)
        try:
            context.load_verify_locations(cafile=name)
        except ssl.SSLError as exc:
            raise WebConfigError(f"{path}: {where}.client_ca_file: no certificate in {name}: {_reason(exc)}") from None
        context.verify_mode = CLIENT_AUTH[auth]
    return context


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason, as the C agent words it ("key values mismatch")."""
    return exc.reason.lower().replace("_", " ") if exc.reason else str(exc)


def _users(path: str, value: Any) -> dict[str, str]:
    if value == "":
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{path}: basic_auth_users: must map each user to a bcrypt hash")
    users = {}
    for user, hashed in value.items():
        if not isinstance(hashed, str) or not BCRYPT.match(hashed):
            raise WebConfigError(
                f'{path}: basic_auth_users.{user}: not a bcrypt hash ($2y$, $2b$ or $2a$: htpasswd -nBC 10 "")'
            )
        users[user] = hashed
    return users


class _Bcrypt:
    """libxcrypt's crypt_r, one call at a time (bcrypt takes a core for its 50-100 ms: a burst of
    wrong passwords takes one, not all); ctypes lets go of the interpreter during the call."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("crypt")
        if name is None:
            raise WebConfigError("basic_auth_users: needs libcrypt (libxcrypt; Debian: libcrypt1)")
        self._crypt_r = ctypes.CDLL(name).crypt_r
        self._crypt_r.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p)
        self._crypt_r.restype = ctypes.c_char_p
        self._data = ctypes.create_string_buffer(CRYPT_DATA_SIZE)
        self._lock = threading.Lock()

    def __call__(self, password: bytes, setting: bytes) -> bytes | None:
        with self._lock:
            try:
                out = self._crypt_r(password, setting, self._data)
                return out if out and not out.startswith(b"*") else None
            finally:
                ctypes.memset(self._data, 0, CRYPT_DATA_SIZE)  # nothing of the password left there


_BCRYPT: _Bcrypt | None = None
_BCRYPT_MADE = threading.Lock()


def _shared_bcrypt() -> _Bcrypt:
    """This process's one _Bcrypt: one check at a time, the configs read again after the start's
    included (and libcrypt looked for once)."""
    global _BCRYPT
    with _BCRYPT_MADE:
        if _BCRYPT is None:
            _BCRYPT = _Bcrypt()
        return _BCRYPT


class BasicAuth:
    """Whether an Authorization header holds a user's password (basic_auth_users). A config read
    again makes a new one: the passwords the old one remembered are forgotten."""

    def __init__(self, users: dict[str, str]):
        self._users = {u.encode(): h.encode() for u, h in users.items()}
        self._bcrypt = _shared_bcrypt()
        self._key = os.urandom(32)
        self._matched: dict[bytes, bytes] = {}  # user: HMAC of the password that last matched
        self._lock = threading.Lock()

    def allows(self, authorization: str | None) -> bool:
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        mac = hmac.new(self._key, password, hashlib.sha256).digest()
        with self._lock:
            matched = self._matched.get(user)
        if matched is not None and hmac.compare_digest(matched, mac):
            return True
        stored = self._users.get(user)
        computed = self._bcrypt(password, stored or FAKE_HASH)  # an unknown user costs a check too
        if stored is None or computed is None or not hmac.compare_digest(computed, stored):
            return False
        with self._lock:
            self._matched[user] = mac
        return True


def _basic_credentials(authorization: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) of "Basic BASE64(user:password)", or None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip().encode("latin-1"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    user, colon, password = raw.partition(b":")
    if not colon or b"\0" in raw:  # crypt takes a C string: a NUL would cut the password short
        return None
    return user, password


class Watched:
    """The web-config a /metrics server serves each connection with: the start's, then the file read
    again at a connection when it or a file it names changed since it was last read (a stat of
    each; nothing read when none did). A changed file that cannot be used, or that would change
    what the start decided (TLS or not; users beyond loopback), leaves no config (None: the
    connection is refused) until it changes again; said in one log line a change, as is a file
    read again."""

    def __init__(self, first: WebConfig, beyond_loopback: bool = False, where: str = "") -> None:
        self.path = first.path  # "": no web-config, nothing to watch
        self.tls = first.context is not None  # decided at the start, for good
        self.users_needed = beyond_loopback
        self.where = where  # what the log lines begin with ("sink URL: ")
        self._config: WebConfig | None = first
        self._stamps = first.stamps
        self._lock = threading.Lock()

    def current(self) -> WebConfig | None:
        """The config for a connection now: None when the file, changed, cannot be used."""
        with self._lock:
            if not self.path or all(_stamp(s[0]) == s for s in self._stamps):
                return self._config
            try:
                fresh = load(self.path)
                self._usable(fresh)
            except WebConfigError as exc:
                self._stamps, self._config = exc.stamps, None
                log.warning("%sweb_config %s: /metrics refused until the file is fixed", self.where, exc)
                return None
            self._stamps, self._config = fresh.stamps, fresh
            log.info("%sweb_config %s: read again (%d users)", self.where, self.path, len(fresh.users))
            return fresh

    def _usable(self, fresh: WebConfig) -> None:
        """WebConfigError when fresh would change what the start decided."""
        why = ""
        if (fresh.context is not None) != self.tls:
            why = (
                f"tls_server_config: {'new' if fresh.context is not None else 'gone'} since the start:"
                " TLS or not is decided at the start (restart to change it)"
            )
        elif self.users_needed and not fresh.users:
            why = "basic_auth_users: none left, and /metrics is served beyond loopback"
        if why:
            exc = WebConfigError(f"{self.path}: {why}")
            exc.stamps = fresh.stamps
            raise exc
