"""How a client of a store logs in: credentials from the environment or a credentials file, never
from a command line or a URL (docs/security.md).

A store names its variables by a prefix (``FLOWSTAT_ES``): PREFIX_USER and PREFIX_PASSWORD for
basic authentication, or PREFIX_API_KEY (Elasticsearch: ``Authorization: ApiKey``) /
PREFIX_TOKEN (InfluxDB 2.x/3.x: ``Authorization: Token``), and PREFIX_CA_FILE (else
FLOWSTAT_CA_FILE) for the CA that signed an https:// store's certificate. A variable set in the
environment wins over the credentials file (FLOWSTAT_CREDENTIALS, or a command's --credentials).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

CREDENTIALS_VAR = "FLOWSTAT_CREDENTIALS"
CA_FILE_VAR = "FLOWSTAT_CA_FILE"


class CredentialsError(ValueError):
    """Credentials that cannot be used: a credentials file others may read, a URL holding a
    password. The message says what to do."""


def read_credentials_file(path: str) -> dict[str, str]:
    """NAME=VALUE lines (# comments, blank lines); the file must be readable by its owner only."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CredentialsError(f"credentials file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CredentialsError(f"credentials file {path}: not a regular file")
    if st.st_mode & 0o077:
        raise CredentialsError(f"credentials file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets other users "
                               f"read it: run `chmod 600 {path}`")
    out = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, value = line.partition("=")
            if not sep or not name.strip().isidentifier():
                raise CredentialsError(f"credentials file {path}, line {number}: expected NAME=VALUE")
            out[name.strip()] = value.strip()
    return out


def credentials(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every credential this process may use: the credentials file's (FLOWSTAT_CREDENTIALS), then
    the environment's over them."""
    env = os.environ if env is None else env
    path = env.get(CREDENTIALS_VAR)
    return {**(read_credentials_file(path) if path else {}), **env}


def refuse_secrets_in_url(url: str, prefix: str) -> None:
    """A URL with a user or password in it shows them in process lists, logs and errors: refused."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return  # not a URL: whoever parses it says so
    if parts.username is not None or parts.password is not None:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        raise CredentialsError(f"{shown}: credentials in a URL show in process lists and logs: set "
                               f"{prefix}_USER and {prefix}_PASSWORD in the environment or in a credentials "
                               f"file ({CREDENTIALS_VAR} or --credentials) instead")


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
    def from_credentials(cls, prefix: str, key_name: str, key_scheme: str,
                         found: Mapping[str, str] | None = None) -> StoreAuth:
        found = credentials() if found is None else found

        def get(name: str) -> str | None:
            return found.get(name) or None

        return cls(prefix, key_name, key_scheme, get(f"{prefix}_USER"), get(f"{prefix}_PASSWORD"),
                   get(f"{prefix}_{key_name}"), get(f"{prefix}_CA_FILE") or get(CA_FILE_VAR))

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"{self.key_scheme} {self.key}"} if self.key else {}

    def basic(self) -> tuple[str, str] | None:
        return (self.user, self.password or "") if self.user and not self.key else None

    def who(self) -> str:
        """Who the client is, for messages (never the secret)."""
        if self.key:
            return f"with the {self.key_name.replace('_', ' ').lower().replace('api', 'API')} ({self.prefix}_{self.key_name})"
        return f"as {self.user}" if self.user else "without credentials"

    def subject(self) -> str:
        """Who, as the subject of a sentence."""
        if self.key:
            return f"the {self.key_name.replace('_', ' ').lower().replace('api', 'API')} ({self.prefix}_{self.key_name})"
        return self.user or "a client without credentials"

    def where_to_set(self) -> str:
        return (f"set {self.prefix}_USER and {self.prefix}_PASSWORD, or {self.prefix}_{self.key_name}, in the "
                f"environment or a credentials file")

    def ca_hint(self) -> str:
        return f"set {self.prefix}_CA_FILE to the CA that signed it"
