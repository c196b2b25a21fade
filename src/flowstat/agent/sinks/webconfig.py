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

The C agent reads the same files alike, with the same messages (collectors/c/agent/webconfig.c). The
file is read once, at the start (exporter-toolkit reads it at every request): a change needs the
agent restarted. Any key it does not know is an error naming the file and the key, and so are
exporter-toolkit's keys flowstat does not do (inline cert, key and client_ca, cipher_suites,
curve_preferences, prefer_server_cipher_suites, client_allowed_sans, http_server_config, rate_limit).

A password is checked with bcrypt through libxcrypt (ctypes: no Python package), one check at a
time; the one that last matched a user is kept as an HMAC under a key of this process, so that a
scraper's every scrape does not pay bcrypt's 50-100 ms again. An unknown user is checked against a
fixed hash, as exporter-toolkit does: a wrong user takes as long as a wrong password.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import ctypes.util
import hashlib
import hmac
import os
import re
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

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
    """A web-config file that cannot be used: the message names the file and the key."""


@dataclass
class WebConfig:
    path: str
    context: ssl.SSLContext | None = None  # tls_server_config: the server's TLS
    users: dict[str, str] = field(default_factory=dict)  # basic_auth_users
    auth: BasicAuth | None = None  # with users: their passwords' check


def load(path: str) -> WebConfig:
    """The web-config file at path, checked whole: its certificate and key loaded, its hashes
    bcrypt's; a WebConfigError naming the file and the key when it cannot be used."""
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
        config.context = _tls(path, _mapping(path, "tls_server_config", top["tls_server_config"], TLS_KEYS))
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


def _file(path: str, key: str, value: Any) -> str:
    """A file the config names, from the config's folder when relative, readable."""
    name = os.path.join(os.path.dirname(path), _string(path, key, value))
    try:
        with open(name, "rb"):
            pass
    except OSError as exc:
        raise WebConfigError(f"{path}: {key}: cannot read {name}: {exc.strerror}") from None
    return name


def _tls(path: str, tls: dict[str, Any]) -> ssl.SSLContext:
    where = "tls_server_config"
    for key in ("cert_file", "key_file"):
        if not tls.get(key):
            raise WebConfigError(f"{path}: {where}.{key}: missing")
    cert, key = (_file(path, f"{where}.{k}", tls[k]) for k in ("cert_file", "key_file"))
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
        name = _file(path, f"{where}.client_ca_file", ca)
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


class BasicAuth:
    """Whether an Authorization header holds a user's password (basic_auth_users)."""

    def __init__(self, users: dict[str, str]):
        self._users = {u.encode(): h.encode() for u, h in users.items()}
        self._bcrypt = _Bcrypt()
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
