"""What every store writer shares: the outcome of a write, the retry policy, the registry.

The retry policy (docs/ingest.md; the C agent follows it too):

- A request that cannot connect, times out or is cut: the store is *down*.
- HTTP 2xx: taken. HTTP 408, 429, every 5xx, and anything neither 2xx nor 4xx (a redirect is not
  followed: nothing was stored): down for now. Any other 4xx: the data is *refused*: retrying the
  same bytes cannot help.
- HTTP 401 and 403, and a certificate that is not trusted: the store refuses *who we are*, not the
  data (StoreAuthError, a kind of down: docs/security.md). A TLS handshake cut short (EOF) is no
  answer, as above. The agents spool and retry as for down;
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

Several nodes (a store whose ``multi_node`` says so: Elasticsearch): the URL names them all,
``SCHEME://HOST:PORT,HOST:PORT,.../PATH``, the same scheme, credentials and CA for each. A request
goes to the first node listed that has not failed lately. A node that cannot be reached, times out
or answers 502, 503 or 504 (down, or not part of a cluster yet) has failed: the same request goes to
the next node at once, and the failed one is left alone for ``node_backoff_s`` (30 s, as the
official clients' dead-node pool), then asked first again. When every node fails, the store is
down, as above (all nodes resting: the one whose rest ends first is asked, alone). Any other
answer is the store's, whichever node gave it: a 4xx, a 429, a 500 are not failed over. Resending to
another node a batch that the failed node may have stored in part is safe for the reason above.
Each change of the node that takes the requests is logged once, not each request: a failover
(naming the nodes resting, and why each failed), a node back.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar
from urllib.parse import urlsplit

from ._auth import StoreAuth, refuse_secrets_in_url

if TYPE_CHECKING:  # imported by the first Writer: an agent with file sinks starts 0.07 CPU-s sooner
    import requests

Encoded = TypeVar("Encoded", str, bytes)  # a sample as an encoder takes it: its line protocol, its JSON document
_T = TypeVar("_T")

MAX_REASONS = 5  # refusal reasons kept per outcome: enough to say why, bounded for huge batches
MAX_NODES = 16  # nodes a URL may list (the C agent's bound too)
NODE_BACKOFF_S = 30.0  # how long a node that failed is left alone (the official clients' dead-node time-out)
FAILOVER_STATUSES = (502, 503, 504)  # a node that answers these is down or outside a cluster: ask the next

log = logging.getLogger("flowstat.stores")
# An SSLError that is the connection's end, not the certificate's or the protocol's fault: a node
# killed as a client connects (the C agent's curl says "SSL connect error" and fails over too).
_TLS_CUT = re.compile(r"UNEXPECTED_EOF|EOF occurred in violation of protocol|ECONNRESET|Connection reset")


class StoreURLError(ValueError):
    """A store URL that cannot be used: a list of nodes for a store that takes one, a node of the
    list that is empty, without a host or with a bad port. The message names the URL and the part."""


class StoreDown(Exception):
    """The store cannot take the data now (no connection, time-out, HTTP 408/429/5xx): retry later.
    ``timed_out``: a node took the request and gave no answer in time (a smaller one may go)."""

    timed_out = False


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


def parse_nodes(url: str, authority: str, default_port: int | None = None) -> list[str]:
    """The nodes of a URL's authority, ``HOST[:PORT][,HOST[:PORT]...]``, each as ``HOST:PORT`` (an
    IPv6 address in brackets; without a port when none is given and there is no ``default_port``).
    StoreURLError names the URL and what is wrong: "URL: node 2 of 3 ('h2:99999'): bad port"."""
    entries = authority.split(",")
    if len(entries) > MAX_NODES:
        raise StoreURLError(f"{url}: more than {MAX_NODES} nodes")
    out: list[str] = []
    for n, entry in enumerate(entries, 1):
        where = f"{url}: node {n} of {len(entries)} ({entry!r})" if len(entries) > 1 else url
        if not entry and len(entries) > 1:
            raise StoreURLError(f"{url}: node {n} of {len(entries)} is empty")
        if any(c.isspace() or c in "/?#@" for c in entry):
            raise StoreURLError(f"{where}: bad host")
        parts = urlsplit(f"//{entry}")
        try:
            port = parts.port or default_port
        except ValueError:
            raise StoreURLError(f"{where}: bad port") from None
        if not parts.hostname or (default_port is not None and not port):
            raise StoreURLError(f"{where}: needs HOST:PORT")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        node = f"{host}:{port}" if port else host
        if node in out:
            raise StoreURLError(f"{where}: given twice")
        out.append(node)
    return out


@dataclass
class StoreNode:
    """One node of a store: its base URL (requests go to URL + path) and until when it is left alone."""

    name: str  # HOST:PORT, for messages
    url: str
    resting_until: float = 0.0  # time.monotonic(): a node that failed is not asked before
    why: str = ""  # what its last failure was
    failing: bool = False  # failed since it last answered (named when requests move on, however long that took)


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
    multi_node: ClassVar[bool] = False  # its URL may list several nodes, to fail over (see the module)

    def __init__(
        self,
        url: str,
        target: str | None = None,
        *,
        timeout_s: float = 60.0,
        auth: StoreAuth | None = None,
        shown_url: str | None = None,
        node_backoff_s: float = NODE_BACKOFF_S,
    ):
        """``auth``: who to log in as; by default the credentials of the environment and of the
        credentials file (flowstat.stores._auth). A URL holding credentials is refused
        (CredentialsError). ``shown_url``: the store as messages name it (an agent's sink URL).
        ``url`` may list nodes (SCHEME://HOST:PORT,HOST:PORT/...) when the store is ``multi_node``
        (StoreURLError otherwise, or when one is bad); ``timeout_s`` is each node's, and
        ``node_backoff_s`` how long a node that failed is left alone."""
        refuse_secrets_in_url(url, self.auth_prefix, self.auth_key[0], f"--{self.option}")
        self.url = url.rstrip("/")
        self.shown_url = shown_url or self.url
        self.target = target or self.default_target
        self.timeout_s = timeout_s
        self.node_backoff_s = node_backoff_s
        self.nodes = self._nodes()
        self.serving: StoreNode | None = None  # the node that took the last request
        self.failovers = 0  # times the requests moved to another node because one failed
        self.log_failovers = True  # each change of node logged (flowstat.stores), once
        self.auth = auth or StoreAuth.from_credentials(self.auth_prefix, *self.auth_key)
        import requests

        self.session = requests.Session()
        self.session.auth = self.auth.basic()
        self.session.headers.update(self.auth.headers())
        if self.auth.ca_file:
            self.session.verify = self.auth.ca_file
        self.requests = 0  # requests started
        self.retries = 0  # attempts that failed and were tried again (by write() and ask())

    def _nodes(self) -> list[StoreNode]:
        """The nodes ``self.url`` names: itself, or each of its list with its scheme and path."""
        parts = urlsplit(self.url)
        if "," not in parts.netloc:
            return [StoreNode(parts.netloc, self.url)]
        if not self.multi_node:
            raise StoreURLError(f"{self.shown_url}: {self.title} takes one node, not a list")
        names = parse_nodes(self.shown_url, parts.netloc)
        return [StoreNode(name, f"{parts.scheme}://{name}{parts.path}") for name in names]

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

    def encode_flow(self, kind: str, docs: Iterable[dict[str, Any]]) -> bytes:
        """A request body holding verdicts (``kind`` "verdict", verdict.schema.json) or edge points
        ("edge", edge.schema.json), as flowstat verdict writes them: each under an identity of its
        own, so that writing one again overwrites it."""
        raise NotImplementedError

    def post(self, body: bytes, count: int) -> Outcome:
        """Send one body of ``count`` items, once. Raises StoreDown when the store cannot take it now."""
        raise NotImplementedError

    def loaded(self, start_ns: int, end_ns: int, run_id: str | None = None) -> None:
        """A run's samples from ``start_ns`` to ``end_ns`` were loaded after the fact (replay): do
        what the store would have done had they arrived live (for ``run_id`` alone if given). Nothing,
        unless a store says."""

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
        the response otherwise. A request to ``self.url`` + PATH goes to its nodes in turn (see
        the module): StoreDown once every node it asked has failed."""
        if not url.startswith(self.url):  # not the store's own (InfluxDB's endpoint as given)
            try:
                resp = self._once(url, method, body, content_type, kw)
            except _NodeFailed as exc:
                raise _down(_said(f"{self.title} at {self.url}", str(exc)), [exc]) from exc
            return self._answer(resp, method, url, action)
        path = url[len(self.url) :]
        failed: list[tuple[StoreNode, _NodeFailed]] = []
        for node in self._ask_order():
            try:
                resp = self._once(node.url + path, method, body, content_type, kw)
            except _NodeFailed as exc:
                node.resting_until, node.why = time.monotonic() + self.node_backoff_s, str(exc)
                node.failing = True
                failed.append((node, exc))
                continue
            self._took(node)
            return self._answer(resp, method, url, action)
        if len(self.nodes) == 1:  # as before there were lists: the store is down
            raise _down(_said(f"{self.title} at {self.url}", str(failed[0][1])), [failed[0][1]])
        raise _down(
            f"{self.title} at {self.shown_url}: no node answers ("
            + "; ".join(_said(node.name, str(exc)) for node, exc in failed)
            + ")",
            [exc for _, exc in failed],
        )

    def _ask_order(self) -> list[StoreNode]:
        """The nodes not resting, as listed; when all rest, the one whose rest ends first, alone."""
        now = time.monotonic()
        awake = [n for n in self.nodes if n.resting_until <= now]
        return awake or [min(self.nodes, key=lambda n: n.resting_until)]

    def _took(self, node: StoreNode) -> None:
        """``node`` answered: said once as the requests move to it — away from a node that failed,
        naming the nodes that failed since they last answered (not "those resting": a slow answer
        may outlast a short rest), and counted; or back to a node listed earlier, after its rest.
        Nothing at the first answer of the first node listed."""
        node.resting_until, node.failing = 0.0, False
        if node is self.serving:
            return
        before, self.serving = self.serving, node
        if before is None and node is self.nodes[0]:
            return
        # a move away from a node that failed (or, at the start, past those that did); otherwise the
        # node listed earlier is back after its rest, whatever others still failed when last asked
        failed = [n for n in self.nodes if n.failing] if before is None or before.failing else []
        if failed:
            self.failovers += 1
        if not self.log_failovers:
            return
        if failed:
            log.warning(
                "%s at %s: %s failed (%s); batches go to %s now (a node that fails is left alone for %g s)",
                self.title,
                self.shown_url,
                ", ".join(n.name for n in failed),
                "; ".join(n.why.removeprefix(": ") for n in failed),
                node.name,
                self.node_backoff_s,
            )
        elif before is not None:
            log.warning("%s at %s: %s answers again; batches go to it now", self.title, self.shown_url, node.name)

    def _once(
        self, url: str, method: str, body: bytes | None, content_type: str | None, kw: dict[str, Any]
    ) -> requests.Response:
        """One request to one node; _NodeFailed when it gives no answer or answers 502, 503 or 504."""
        import requests

        headers = {"Content-Type": content_type or self.content_type} if body is not None else None
        self.requests += 1
        # given each time: requests prefers REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE to the session's CA file
        kw = {"verify": self.session.verify, **kw}
        try:
            resp = self.session.request(
                method, url, data=body, headers=headers, timeout=self.timeout_s, allow_redirects=False, **kw
            )
        except requests.exceptions.SSLError as exc:
            if _TLS_CUT.search(str(exc)):  # the node went away mid-handshake: its failure, not ours
                raise _NodeFailed(f"cannot be reached ({exc.__class__.__name__}: the TLS handshake was cut)") from exc
            raise StoreAuthError(self._tls_problem(exc, urlsplit(url).netloc), "tls") from exc
        except requests.RequestException as exc:
            failed = _NodeFailed(f"cannot be reached ({exc.__class__.__name__})")
            failed.timed_out = isinstance(exc, requests.Timeout) and not isinstance(exc, requests.ConnectTimeout)
            raise failed from exc
        if resp.status_code in FAILOVER_STATUSES:
            raise _NodeFailed(f": HTTP {resp.status_code} {resp.text[:200].strip()}")
        return resp

    def _answer(
        self, resp: requests.Response, method: str, url: str, action: Callable[[], str] | str | None
    ) -> requests.Response:
        """The store's answer, whichever node gave it: StoreAuthError (401, 403), StoreDown (another
        "not now" status), else the response."""
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
        reason = shortened(self.auth.redact(_reason(resp)))  # redacted whole, then cut: a cut secret would show
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

    def _tls_problem(self, exc: Exception, host: str) -> str:
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
        backoff = _Backoff(policy, sleep)
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
                    backoff.restart()
                body, count = done.retry, done.retry_count
                why = f"{self.title} at {self.url}: {count} items refused for now"
            backoff.wait(why)
            self.retries += 1

    def ask(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        content_type: str | None = None,
        action: Callable[[], str] | str | None = None,
        *,
        policy: RetryPolicy = DEFAULT_RETRY,
        **kw: Any,
    ) -> requests.Response:
        """A request that carries no batch of data (a search, a refresh, a set-up call), asked again
        while the store cannot answer it now (see retried)."""
        return self.retried(lambda: self._http(method, url, body, content_type, action, **kw), policy)

    def retried(
        self,
        attempt: Callable[[], _T],
        policy: RetryPolicy = DEFAULT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> _T:
        """``attempt()`` again while it raises StoreDown, as write() waits: the store down, or slower
        than ``timeout_s`` (a store paused by a loaded machine), until ``policy.give_up_s`` have passed.
        Only for what may be done twice: the store may have done what it did not answer."""
        backoff = _Backoff(policy, sleep)
        while True:
            try:
                return attempt()
            except StoreAuthError:
                raise  # waiting will not change who we are
            except StoreDown as exc:
                backoff.wait(str(exc))
            self.retries += 1

    def close(self) -> None:
        self.session.close()


class _Backoff:
    """The waits between attempts under a RetryPolicy: doubling from ``first_s`` up to ``max_s``;
    StoreDown (saying why the last attempt failed) once the next wait would pass ``give_up_s`` since
    the start or the last progress."""

    def __init__(self, policy: RetryPolicy, sleep: Callable[[float], None]) -> None:
        self.policy, self.sleep = policy, sleep
        self.restart()

    def restart(self) -> None:
        self.deadline, self.delay = time.monotonic() + self.policy.give_up_s, self.policy.first_s

    def wait(self, why: str) -> None:
        if time.monotonic() + self.delay > self.deadline:
            raise StoreDown(f"{why} (gave up after {self.policy.give_up_s:.0f} s of retries)")
        self.sleep(self.delay)
        self.delay = min(self.delay * 2, self.policy.max_s)


class _NodeFailed(Exception):
    """A node gave no answer, or answered 502, 503 or 504: the next node may take the request.
    The message, after "STORE at URL", says what happened ("cannot be reached (...)", ": HTTP 503 ...").
    ``timed_out``: it took the request and did not answer in time."""

    timed_out = False


def _down(why: str, failures: list[_NodeFailed]) -> StoreDown:
    """StoreDown saying ``why``, timed out when a node that failed did."""
    down = StoreDown(why)
    down.timed_out = any(f.timed_out for f in failures)
    return down


def _said(where: str, why: str) -> str:
    """ "Elasticsearch at URL cannot be reached (...)", "Elasticsearch at URL: HTTP 503 ..." """
    return f"{where}{why}" if why.startswith(":") else f"{where} {why}"


def shortened(text: str, at_most: int = 300, tail: int = 100) -> str:
    """TEXT, its middle left out past AT_MOST characters: a store says what was refused first and
    why last (InfluxDB: "error authorizing query: USER on STATEMENT, requires READ on DB")."""
    return text if len(text) <= at_most else f"{text[: at_most - tail - 5]} ... {text[-tail:]}"


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
