"""What every store writer shares: the outcome of a write, the retry policy, the registry.

The retry policy (docs/ingest.md; the C agent follows it too):

- A request that cannot connect, times out or is cut: the store is *down*.
- HTTP 2xx: taken. HTTP 408, 429, every 5xx, and anything neither 2xx nor 4xx (a redirect is not
  followed: nothing was stored): down for now. Any other 4xx: the data is *refused*: retrying the
  same bytes cannot help.
- HTTP 401 and 403, and a certificate that is not trusted: the store refuses *who we are*, not the
  data (StoreAuthError, a kind of down: docs/security.md). The agents spool and retry as for down;
  ``Writer.write`` stops at once, since waiting cannot change the credentials.
- Down means: retry later, the whole batch, in order. The agents spool it on disk and try again
  every second; ``Writer.write`` (replay, benchmarks) backs off 0.5 s, doubling to 8 s, and gives
  up after 120 s without progress.
- A store can also take part of a batch (an InfluxDB partial write, a ``_bulk`` answer with
  per-document errors): what it took is counted accepted, what it refused is counted refused with
  its reason and never resent, and what it could not take *for now* (a document answered 429 or
  5xx) is all that is retried.

Resending is safe: an InfluxDB point is identified by its series and time, an Elasticsearch
document by an ``_id`` taken from the sample (run_id/agent/node_id/seq).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar
from urllib.parse import urlsplit

import requests

from ._auth import StoreAuth, refuse_secrets_in_url

Encoded = TypeVar("Encoded", str, bytes)  # a sample as an encoder takes it: its line protocol, its JSON document

MAX_REASONS = 5  # refusal reasons kept per outcome: enough to say why, bounded for huge batches


class StoreDown(Exception):
    """The store cannot take the data now (no connection, time-out, HTTP 408/429/5xx): retry later."""


class StoreAuthError(StoreDown):
    """The store will not take data from who we are (HTTP 401, 403), or we do not trust its
    certificate: nothing was stored, and only other credentials (or a CA file) can help.
    ``trouble``: auth (401), forbidden (403) or tls."""

    def __init__(self, why: str, trouble: str):
        super().__init__(why)
        self.trouble = trouble


@dataclass
class Outcome:
    """What a store did with a batch of ``count`` items."""

    accepted: int = 0
    refused: int = 0
    reasons: list[str] = field(default_factory=list)  # why items were refused (the first few)
    retry: bytes | None = None  # the items the store could not take now, to send again later
    retry_count: int = 0
    forbidden: str = ""  # why some of them wait: who may not write where (documents answered 403)

    def merge(self, later: Outcome) -> None:
        """Add a later attempt's results (its retry part replaces ours)."""
        self.accepted += later.accepted
        self.refused += later.refused
        self.reasons = (self.reasons + later.reasons)[:MAX_REASONS]
        self.retry, self.retry_count, self.forbidden = later.retry, later.retry_count, later.forbidden


@dataclass(frozen=True)
class RetryPolicy:
    """How ``Writer.write`` waits for a store that is down: backoff from ``first_s`` doubling up to
    ``max_s``, until ``give_up_s`` have passed without success."""

    first_s: float = 0.5
    max_s: float = 8.0
    give_up_s: float = 120.0


DEFAULT_RETRY = RetryPolicy()


def status_is_down(status: int) -> bool:
    """HTTP statuses that mean "not now" rather than "taken" or "not this data"."""
    return status in (408, 429) or not (200 <= status < 300 or 400 <= status < 500)


class BatchEncoder(Generic[Encoded]):
    """Builds request bodies from batches of samples already encoded the way the store wants them
    (replay, millions of samples: its hot loop encodes each sample once, in one of the schema's two
    encodings, and a store's encoder then puts a batch together in one call)."""

    wants: ClassVar[str]  # "line": InfluxDB line protocol lines; "json": JSON documents and their ids

    def encode(self, encoded: list[Encoded], ids: list[str], stamps: list[int]) -> bytes:
        """A body from the batch: ``encoded`` holds each sample's line protocol (str, with its
        newline) or JSON document (bytes, without), as ``wants`` says; ``ids`` their
        schema.document_id and ``stamps`` their times (ns) when some store wants JSON, else both
        are empty."""
        raise NotImplementedError


class Writer:
    """One store, reached over HTTP at ``url`` (scheme, host and port), writing into ``target``
    (a database, an index). Subclasses fill in the class attributes and the methods marked."""

    name: ClassVar[str]  # registry name; also the agents' sink scheme (influxdb://HOST:PORT/TARGET)
    title: str  # for people: "InfluxDB" (an instance may say more: a line protocol endpoint)
    default_port: ClassVar[int]
    target_kind: ClassVar[str]  # "database", "index"
    default_target: ClassVar[str]
    option: ClassVar[str]  # flowstat replay --OPTION URL
    target_option: ClassVar[str]  # flowstat replay --TARGET_OPTION NAME
    content_type: ClassVar[str]
    health_path: ClassVar[str]  # GET here answers 2xx when the store is up
    auth_prefix: ClassVar[str]  # its credentials' variables: PREFIX_USER, PREFIX_PASSWORD, ... (docs/security.md)
    auth_key: ClassVar[tuple[str, str]]  # the key variable's name, and its Authorization scheme

    def __init__(
        self,
        url: str,
        target: str | None = None,
        *,
        timeout_s: float = 60.0,
        auth: StoreAuth | None = None,
        shown_url: str | None = None,
    ):
        """``auth``: who to log in as; by default the credentials of the environment and of the
        credentials file (flowstat.stores._auth). A URL holding credentials is refused
        (CredentialsError). ``shown_url``: the store as messages name it (an agent's sink URL)."""
        refuse_secrets_in_url(url, self.auth_prefix, self.auth_key[0], f"--{self.option}")
        self.url = url.rstrip("/")
        self.shown_url = shown_url or self.url
        self.target = target or self.default_target
        self.timeout_s = timeout_s
        self.auth = auth or StoreAuth.from_credentials(self.auth_prefix, *self.auth_key)
        self.session = requests.Session()
        self.session.auth = self.auth.basic()
        self.session.headers.update(self.auth.headers())
        if self.auth.ca_file:
            self.session.verify = self.auth.ca_file
        self.requests = 0  # requests started
        self.retries = 0  # attempts that failed and were tried again (by write())

    # -- to implement ---------------------------------------------------------------------------
    def encode(self, samples: Iterable[dict[str, Any]]) -> bytes:
        """A request body holding these samples."""
        raise NotImplementedError

    def encoder(self) -> BatchEncoder[Any]:
        """A BatchEncoder writing the same bytes as encode()."""
        raise NotImplementedError

    def encode_run(self, doc: dict[str, Any]) -> bytes:
        """A request body holding one run document (run.schema.json)."""
        raise NotImplementedError

    def encode_self_samples(self, docs: Iterable[dict[str, Any]]) -> bytes:
        """A request body holding agents' self-samples (agent.schema.json)."""
        raise NotImplementedError

    def post(self, body: bytes, count: int) -> Outcome:
        """Send one body of ``count`` items, once. Raises StoreDown when the store cannot take it now."""
        raise NotImplementedError

    def loaded(self, start_ns: int, end_ns: int) -> None:
        """A run's samples from ``start_ns`` to ``end_ns`` were loaded after the fact (replay): do
        what the store would have done had they arrived live. Nothing, unless a store says."""

    def install(self) -> list[str]:
        """Create what the store needs before data arrives (templates, database, rollups);
        idempotent. Returns what was done, for people."""
        raise NotImplementedError

    @classmethod
    def setup_files(cls) -> dict[str, str]:
        """The store's set-up as files (index-templates/NAME/...), for those who install by hand or
        with Docker; the same definitions install() applies."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------
    def _http(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        content_type: str | None = None,
        action: Callable[[], str] | str | None = None,
        **kw: Any,
    ) -> requests.Response:
        """One request; StoreDown for no answer or a "not now" status, StoreAuthError when the store
        will not have us (``action``: what we asked, for its message: "write flowstat-samples-..."),
        the response otherwise."""
        headers = {"Content-Type": content_type or self.content_type} if body is not None else None
        self.requests += 1
        # given each time: requests prefers REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE to the session's CA file
        kw.setdefault("verify", self.session.verify)
        try:
            resp = self.session.request(
                method, url, data=body, headers=headers, timeout=self.timeout_s, allow_redirects=False, **kw
            )
        except requests.exceptions.SSLError as exc:
            raise StoreAuthError(self._tls_problem(exc), "tls") from exc
        except requests.RequestException as exc:
            raise StoreDown(f"{self.title} at {self.url} cannot be reached ({exc.__class__.__name__})") from exc
        if resp.status_code in (401, 403):
            what = (
                action()
                if callable(action)
                else action
                if action is not None
                else f"{method} {url.removeprefix(self.url)}"
            )
            raise StoreAuthError(self._login_problem(resp, what), "forbidden" if resp.status_code == 403 else "auth")
        if status_is_down(resp.status_code):
            raise StoreDown(f"{self.title} at {self.url}: HTTP {resp.status_code} {resp.text[:200].strip()}")
        return resp

    def _login_problem(self, resp: requests.Response, action: str) -> str:
        """What to say of a 401 or 403, as docs/security.md (and the C agent) say it."""
        reason = self.auth.redact(_reason(resp))[:300]  # redacted whole, then cut: a cut secret would show
        if not self.auth.given():
            return (
                f"{self.shown_url} needs credentials: set {self.auth.variables()} (HTTP {resp.status_code}: {reason})"
            )
        if resp.status_code == 403:
            return self.forbidden(action, reason)
        return f"authentication failed {self.auth.who()} at {self.shown_url} (set {self.auth.variables()}): {reason}"

    def forbidden(self, action: str | None, reason: str) -> str:
        """Who may not do what where: "flowstat_agent may not write flowstat-samples-2026.11.26 at URL: ..."."""
        if not action:
            return f"{self.auth.subject()} may not write to {self.shown_url}: {reason}"
        return f"{self.auth.subject()} may not {action} at {self.shown_url}: {reason}"

    def _tls_problem(self, exc: Exception) -> str:
        host = urlsplit(self.url).netloc
        found = re.search(r"certificate verify failed: ([^(\"')]+)", str(exc))
        if found:
            return (
                f"TLS: the certificate of {host} is not trusted (set {self.auth.ca_variable()} to the CA that "
                f"signed it): {found.group(1).strip()}"
            )
        return f"TLS: no secure connection to {host}: {self.auth.redact(str(exc))[:200]}"

    def check(self) -> None:
        """Raise StoreDown unless the store answers now (a wrong address fails at once, rather than
        after a write's patient retries)."""
        resp = self._http("GET", self.url + self.health_path)
        if resp.status_code >= 300:
            raise StoreDown(
                f"{self.title} at {self.url}: HTTP {resp.status_code} at {self.health_path}: is it " f"{self.title}?"
            )

    def write(
        self, body: bytes, count: int, policy: RetryPolicy = DEFAULT_RETRY, sleep: Callable[[float], None] = time.sleep
    ) -> Outcome:
        """Send a body until the store has taken or refused every item, waiting while it is down
        (see the module's retry policy). Raises StoreDown once ``policy.give_up_s`` have passed
        without progress."""
        total = Outcome()
        deadline = time.monotonic() + policy.give_up_s
        delay = policy.first_s
        while True:
            try:
                done = self.post(body, count)
            except StoreAuthError:
                raise  # waiting will not change who we are
            except StoreDown as exc:
                why = str(exc)
            else:
                total.merge(done)
                if done.retry is None:
                    return total
                if done.forbidden:
                    raise StoreAuthError(done.forbidden, "forbidden")
                if done.accepted or done.refused:  # progress: the store answers, item by item
                    deadline, delay = time.monotonic() + policy.give_up_s, policy.first_s
                body, count = done.retry, done.retry_count
                why = f"{self.title} at {self.url}: {count} items refused for now"
            if time.monotonic() + delay > deadline:
                raise StoreDown(f"{why} (gave up after {policy.give_up_s:.0f} s of retries)")
            self.retries += 1
            sleep(delay)
            delay = min(delay * 2, policy.max_s)

    def close(self) -> None:
        self.session.close()


_REGISTRY: dict[str, type[Writer]] = {}


def register(cls: type[Writer]) -> type[Writer]:
    """Class decorator: make a writer known by its name."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"two stores named {cls.name!r}: {_REGISTRY[cls.name]} and {cls}")
    _REGISTRY[cls.name] = cls
    return cls


def _reason(resp: requests.Response) -> str:
    """The store's own words for a refusal (its answer may echo a secret: redact it before showing)."""
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):
        error = None
    return error_reason(error, resp.text or f"HTTP {resp.status_code}")


def error_reason(error: object, fallback: str = "") -> str:
    """Elasticsearch's error.reason (with additional_unsuccessful_credentials, where an expired API
    key is told), InfluxDB's error; else the fallback. On one line; whole (redact, then cut)."""
    if isinstance(error, dict):
        more = error.get("additional_unsuccessful_credentials")
        text = str(error.get("reason") or error.get("type") or fallback) + (
            f"; {more}" if isinstance(more, str) else ""
        )
    else:
        text = str(error or fallback or "(no reason given)")
    return " ".join(text.split())
