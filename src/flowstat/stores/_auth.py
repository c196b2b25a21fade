"""How a client of a store logs in: credentials from the environment or a credentials file, never
from a command line or a URL (docs/security.md). The C agent follows the same rules and says the
same things (collectors/c/agent/creds.c, sinks.c): tests/test_agent_credentials.py holds both to them.

A store names its variables by a prefix (``FLOWSTAT_ES``): PREFIX_USER and PREFIX_PASSWORD for
basic authentication, or PREFIX_API_KEY (Elasticsearch: ``Authorization: ApiKey``) /
PREFIX_TOKEN (InfluxDB 2.x/3.x: ``Authorization: Token``), and PREFIX_CA_FILE (else
FLOWSTAT_CA_FILE) for the CA that signed an https:// store's certificate. A variable set (not
empty) in the environment wins over the credentials file (FLOWSTAT_CREDENTIALS, or --credentials).
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

CREDENTIALS_VAR = "FLOWSTAT_CREDENTIALS"
CA_FILE_VAR = "FLOWSTAT_CA_FILE"
NAMES = (
    "FLOWSTAT_INFLUX_USER",
    "FLOWSTAT_INFLUX_PASSWORD",
    "FLOWSTAT_INFLUX_TOKEN",
    "FLOWSTAT_ES_USER",
    "FLOWSTAT_ES_PASSWORD",
    "FLOWSTAT_ES_API_KEY",
    "FLOWSTAT_INFLUX_CA_FILE",
    "FLOWSTAT_ES_CA_FILE",
    CA_FILE_VAR,
)


class CredentialsError(ValueError):
    """Credentials that cannot be used: a credentials file others may read or that is not made of
    NAME=VALUE lines, a URL holding a password, variables that do not fit together. The message
    says what to do, and never holds a secret."""


def read_credentials_file(path: str) -> dict[str, str]:
    """The file's NAME=VALUE lines (# comments, blank lines), each NAME one of NAMES, once; a value
    is the rest of its line, unquoted. The file must be a regular file its owner alone may read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # a FIFO must not hold the start
    except OSError as exc:
        raise CredentialsError(f"credentials file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CredentialsError(f"credentials file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise CredentialsError(
                f"credentials file {path} has mode {stat.S_IMODE(st.st_mode):04o}: it must be "
                f"readable by its owner only, as it holds passwords (run: chmod 600 {path})"
            )
    except CredentialsError:
        os.close(fd)
        raise
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        return _lines(f, path)


def _lines(f: Iterable[str], path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for number, raw in enumerate(f, 1):
        line = raw.strip(" \t\r\n")
        if not line or line.startswith("#"):
            continue
        where = f"credentials file {path} line {number}"
        if line.startswith("export "):
            raise CredentialsError(f"{where}: NAME=VALUE, without export")
        name, sep, value = line.partition("=")
        if not sep:
            raise CredentialsError(f"{where}: expected NAME=VALUE")
        if name not in NAMES:
            raise CredentialsError(f"{where}: unknown name {name[:60]!r} ({', '.join(NAMES)})")
        if name in out:
            raise CredentialsError(f"{where}: {name} given twice")
        if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
            raise CredentialsError(f"{where}: the value of {name} is quoted: write it without quotes")
        if value:
            out[name] = value
    return out


def credentials(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every credential this process may use: the credentials file's (FLOWSTAT_CREDENTIALS), then
    the environment's that are set over them."""
    env = os.environ if env is None else env
    path = env.get(CREDENTIALS_VAR)
    return {**(read_credentials_file(path) if path else {}), **{k: v for k, v in env.items() if v}}


def refuse_secrets_in_url(url: str, prefix: str, key_name: str, option: str = "--sink") -> None:
    """A URL with a user or password in it shows them in process lists, logs and errors: refused,
    naming the host but not who logs in."""
    try:
        parts = urlsplit(url)
        held = parts.username is not None or parts.password is not None
    except ValueError:
        return  # not a URL: whoever parses it says so
    if held:
        raise CredentialsError(
            f"{option} {parts.scheme}://***@{parts.netloc.rpartition('@')[2]}{parts.path}: a user "
            f"or password in a URL shows in process lists and logs: set {prefix}_USER and "
            f"{prefix}_PASSWORD (or {prefix}_{key_name}) in the environment or in a --credentials "
            f"file instead"
        )


@dataclass(frozen=True)
class StoreAuth:
    """The credentials of one store's client, from the variables named by ``prefix``."""

    prefix: str  # FLOWSTAT_ES, FLOWSTAT_INFLUX
    key_name: str  # API_KEY or TOKEN: the variable of a key sent in the Authorization header ...
    key_scheme: str  # ... as "ApiKey KEY" or "Token KEY"
    user: str | None = None
    password: str | None = None
    key: str | None = None
    ca_file: str | None = None

    @classmethod
    def from_credentials(
        cls, prefix: str, key_name: str, key_scheme: str, found: Mapping[str, str] | None = None
    ) -> StoreAuth:
        """The store's credentials; CredentialsError when they do not fit together."""
        found = credentials() if found is None else found
        ca_var = f"{prefix}_CA_FILE" if found.get(f"{prefix}_CA_FILE") else CA_FILE_VAR
        auth = cls(
            prefix,
            key_name,
            key_scheme,
            found.get(f"{prefix}_USER"),
            found.get(f"{prefix}_PASSWORD"),
            found.get(f"{prefix}_{key_name}"),
            found.get(ca_var),
        )
        auth._check(ca_var)
        return auth

    def _check(self, ca_var: str) -> None:
        p = self.prefix
        if self.key and (self.user or self.password):
            raise CredentialsError(
                f"{p}_{self.key_name} and a user are both set: give one way to log in " f"({self.variables()})"
            )
        if self.user and not self.password:
            raise CredentialsError(f"{p}_USER is set without {p}_PASSWORD")
        if self.password and not self.user:
            raise CredentialsError(f"{p}_PASSWORD is set without {p}_USER")
        if self.ca_file:
            try:
                with open(self.ca_file, "rb"):
                    pass
            except OSError as exc:
                raise CredentialsError(f"{ca_var}={self.ca_file}: cannot read that CA file: {exc.strerror}") from None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"{self.key_scheme} {self.key}"} if self.key else {}

    def basic(self) -> tuple[str, str] | None:
        return (self.user, self.password or "") if self.user and not self.key else None

    def given(self) -> bool:
        return bool(self.user or self.key)

    def key_is(self) -> str:
        what = "API key" if self.key_name == "API_KEY" else self.key_name.lower()
        return f"the {what} ({self.prefix}_{self.key_name})"

    def who(self) -> str:
        """Who the client is, for messages: "as USER", "with the API key (...)" (never the secret)."""
        return f"as {self.user}" if self.user else f"with {self.key_is()}" if self.key else "without credentials"

    def subject(self) -> str:
        """Who, as the subject of a sentence."""
        return self.user or (self.key_is() if self.key else "anonymous")

    def variables(self) -> str:
        return f"{self.prefix}_USER and {self.prefix}_PASSWORD, or {self.prefix}_{self.key_name}"

    def ca_variable(self) -> str:
        return f"{self.prefix}_CA_FILE"

    def secrets(self) -> list[str]:
        """Every form of a secret a store could echo back: the values, and base64(user:password)."""
        out = [s for s in (self.password, self.key) if s]
        if self.user and self.password:
            out.append(base64.b64encode(f"{self.user}:{self.password}".encode()).decode())
        return sorted(out, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """``text`` (a store's answer, to be shown) with every secret replaced by at most three *."""
        for secret in self.secrets():
            text = text.replace(secret, "*" * min(3, len(secret)))
        return text
