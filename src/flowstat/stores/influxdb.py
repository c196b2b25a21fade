"""InfluxDB 1.x (and 2.x/3.x through their v1 API): line protocol to ``/write``; the database, its
retention policies and the rollups (continuous queries) as its set-up."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from flowstat.schema import agent as agent_schema
from flowstat.schema import flow as flow_schema
from flowstat.schema import run as run_schema
from flowstat.schema import sample as sample_schema

from ._auth import StoreAuth
from ._base import DEFAULT_RETRY, NODE_BACKOFF_S, BatchEncoder, Outcome, RetryPolicy, Writer, shortened

DATABASE = "flowstat"
_DROPPED = re.compile(r"dropped=(\d+)")


class _LineEncoder(BatchEncoder[str]):
    wants = "line"

    def encode(self, encoded: list[str], ids: list[str], stamps: list[int]) -> bytes:
        return "".join(encoded).encode()


class InfluxDBWriter(Writer):
    name = "influxdb"
    title = "InfluxDB"
    default_port = 8086
    target_kind = "database"
    default_target = DATABASE
    option = "influx"
    target_option = "db"
    health_path = "/ping"
    content_type = "text/plain; charset=utf-8"
    auth_prefix = "FLOWSTAT_INFLUX"
    auth_key = ("TOKEN", "Token")

    def __init__(
        self,
        url: str,
        target: str | None = None,
        *,
        endpoint: str | None = None,
        timeout_s: float = 60.0,
        auth: StoreAuth | None = None,
        shown_url: str | None = None,
        node_backoff_s: float = NODE_BACKOFF_S,
    ) -> None:
        """``endpoint``: post to this URL as it is instead of URL/write?db=TARGET (an InfluxDB-compatible
        listener, such as Telegraf's influxdb_listener)."""
        super().__init__(
            url, target, timeout_s=timeout_s, auth=auth, shown_url=shown_url, node_backoff_s=node_backoff_s
        )
        if endpoint:
            self.title = "the line protocol endpoint"  # Telegraf, often: not necessarily InfluxDB
        self.endpoint = endpoint or f"{self.url}/write"
        self.params = None if endpoint else {"db": self.target, "precision": "ns"}

    def encode(self, samples: Iterable[dict[str, Any]]) -> bytes:
        return "".join(sample_schema.to_line_protocol(s) + "\n" for s in samples).encode()

    def encoder(self) -> BatchEncoder[Any]:
        return _LineEncoder()

    def encode_run(self, doc: dict[str, Any]) -> bytes:
        """The flowstat_run point, and one flowstat_edge topology point per edge of the run (a point
        cannot hold a list), at the run's start: written again with the run document, each
        overwrites itself."""
        lines = [run_schema.to_line_protocol(doc)]
        lines += [flow_schema.to_line_protocol("edge", point) for point in topology_points(doc)]
        return "".join(line + "\n" for line in lines).encode()

    def encode_flow(self, kind: str, docs: Iterable[dict[str, Any]]) -> bytes:
        return "".join(flow_schema.to_line_protocol(kind, d) + "\n" for d in docs).encode()

    def encode_self_samples(self, docs: Iterable[dict[str, Any]]) -> bytes:
        return "".join(agent_schema.to_line_protocol(d) + "\n" for d in docs).encode()

    def post(self, body: bytes, count: int) -> Outcome:
        resp = self._http(
            "POST", self.endpoint, body, params=self.params, action=f"write {self.target}" if self.params else ""
        )
        if resp.status_code < 300:
            return Outcome(accepted=count)
        return self.refusal(resp.status_code, resp.text, count)

    def refusal(self, status: int, text: str, count: int) -> Outcome:
        """A 4xx answer. A partial write stored every point but those it could not write (dropped=N)
        and the lines it could not parse (one 'unable to parse' each: they are not in N)."""
        why = f"{self.title} {self.endpoint}: HTTP {status}: {shortened(self.auth.redact(text.strip()))}"
        if "partial write" in text:
            found = _DROPPED.search(text)
            dropped = (int(found.group(1)) if found else 0) + text.count("unable to parse")
            if 0 < dropped < count:
                return Outcome(accepted=count - dropped, refused=dropped, reasons=[why])
        return Outcome(refused=count, reasons=[why])

    # -- set-up ---------------------------------------------------------------------------------
    def query(self, statement: str, db: str | None = None, retry: RetryPolicy | None = None) -> dict[str, Any]:
        """Run an InfluxQL statement (times in ns), in database ``db`` if given; an error answer
        raises RuntimeError naming the statement. ``retry``: asked again while InfluxDB is down or
        slow (for a statement that may run twice)."""
        params = {"q": statement, "epoch": "ns", **({"db": db} if db else {})}
        args = ("POST", f"{self.url}/query", None, None, f"run {statement[:60]!r}")
        resp = self.ask(*args, policy=retry, params=params) if retry else self._http(*args, params=params)
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        errors = [r["error"] for r in body.get("results", []) if "error" in r]
        if resp.status_code >= 300 or errors:
            raise RuntimeError(f"influxdb {statement[:60]!r}: {errors[0] if errors else resp.text[:300]}")
        return body

    def loaded(self, start_ns: int, end_ns: int, run_id: str | None = None) -> None:
        """Roll the replayed samples up (continuous queries only roll up recent buckets), each statement
        asked again while InfluxDB is down or slow, as the samples' writes are (SELECT INTO the same
        points twice writes them once)."""
        for statement in backfill_statements(start_ns, end_ns, self.target, run_id):
            self.query(statement, self.target, retry=DEFAULT_RETRY)

    def install(self) -> list[str]:
        """Create the database and retention policies; (re)create the continuous queries whose
        definitions are not this version's. One already in place is left alone: dropped, even for a
        moment, it would skip the window it was due to roll up (stack up again while samples flow)."""
        existing: dict[str, str] = {}
        for series in self.query("SHOW CONTINUOUS QUERIES")["results"][0].get("series", []):
            if series.get("name") == self.target:
                existing |= {row[0]: row[1] for row in series.get("values", [])}
        done: list[str] = []
        for statement in statements(self.target):
            done.append(statement.split(" BEGIN")[0])
            name = statement.split('"')[1] if statement.startswith("CREATE CONTINUOUS QUERY") else ""
            if existing.get(name) == as_shown(statement):
                continue
            if name in existing:
                self.query(f'DROP CONTINUOUS QUERY "{name}" ON "{self.target}"')
            self.query(statement)
        return done

    @classmethod
    def setup_files(cls) -> dict[str, str]:
        return {
            "setup.iql": (
                "-- Generated by `make generate` (python -m flowstat.generate): do not edit. Applied by "
                "`flowstat stack up` and by\n"
                "-- `flowstat provision` (the compose stack's setup). By hand:\n"
                '--   influx -host 127.0.0.1 -port 8086 -execute "$(cat setup.iql)"\n' + ";\n".join(statements()) + "\n"
                # ';' between statements, none after the last: influx -execute would read an empty statement
            )
        }


def topology_points(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A run document's edges as flowstat_edge topology points (edge.schema.json): at its start,
    no rate, each edge once."""
    seen: set[tuple[str, str]] = set()
    out: list[dict[str, Any]] = []
    for edge in doc.get("edges") or []:
        key = (edge["from"], edge["to"])
        if key not in seen:
            seen.add(key)
            out.append(
                {"time": doc["started"], "run_id": doc["run_id"], "from": key[0], "to": key[1], "topology": True}
            )
    return out


def rollup_fields() -> list[str]:
    """The sample fields totalled over a run's nodes (x-rollup: sum in the sample schema)."""
    return [f.name for f in sample_schema.fields() if f.rollup == "sum"]


RAW_POLICY, ROLLUP_POLICY = "raw", "rollup"
ROLLUP_BUCKETS = (("10s", "1m"), ("1m", "5m"))  # each rollup's bucket, and how far back its totals resample
_MINUTE_NS = 60_000_000_000


def totals_measurement(every: str) -> str:
    """Where the sums over a run's nodes per ``every`` bucket go (in the rollup policy)."""
    return f"flowstat_total_{every}"


def rollup_queries(db: str = DATABASE, where: str = "") -> list[tuple[str, str, str]]:
    """Each rollup step as (continuous query name, its RESAMPLE clause or '', its SELECT ... INTO
    ... FROM ... GROUP BY ...), in the order they must run.

    Rollups happen in two steps, as dateStat aggregated: per node, the mean of each bucket
    (flowstat_node_10s, _1m); then per run, role and agent, the sum over nodes of those means
    (flowstat_total_10s, _1m) — the aggregate rate at one time. Per agent, because two agents
    watching the same nodes must not add up to twice the rate. The second step resamples the last
    buckets so that it sees the first step's late results. ``where``: a condition on the source
    (a backfill's time range).
    """
    where = f" WHERE {where}" if where else ""
    totals = ", ".join(f'sum("mean_{f}") AS "{f}"' for f in rollup_fields())
    node = sample_schema.measurement()
    out: list[tuple[str, str, str]] = []
    for every, resample in ROLLUP_BUCKETS:
        out.append(
            (
                f"{node}_{every}",
                "",
                f'SELECT mean(*) INTO "{db}"."{ROLLUP_POLICY}"."{node}_{every}" '
                f'FROM "{db}"."{RAW_POLICY}"."{node}"{where} GROUP BY time({every}), *',
            )
        )
        total = totals_measurement(every)
        out.append(
            (
                total,
                f"RESAMPLE EVERY {every} FOR {resample} ",
                f'SELECT {totals} INTO "{db}"."{ROLLUP_POLICY}"."{total}" '
                f'FROM "{db}"."{ROLLUP_POLICY}"."{node}_{every}"{where} GROUP BY time({every}), "run_id", '
                '"role", "agent"',
            )
        )
    return out


def statements(db: str = DATABASE) -> list[str]:
    """Database, retention policies and continuous queries (the rollups), in order."""
    return [
        f'CREATE DATABASE "{db}"',
        f'CREATE RETENTION POLICY "{RAW_POLICY}" ON "{db}" DURATION 30d REPLICATION 1 DEFAULT',
        f'CREATE RETENTION POLICY "{ROLLUP_POLICY}" ON "{db}" DURATION 730d REPLICATION 1',
        *(
            f'CREATE CONTINUOUS QUERY "{name}" ON "{db}" {resample}BEGIN {select} END'
            for name, resample, select in rollup_queries(db)
        ),
    ]


def as_shown(statement: str) -> str:
    """A statement as InfluxDB's SHOW gives it back: a plain identifier without its double quotes."""
    return re.sub(r'"([A-Za-z_][A-Za-z0-9_]*)"', r"\1", statement)


def string_literal(value: str) -> str:
    """An InfluxQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def backfill_statements(start_ns: int, end_ns: int, db: str = DATABASE, run_id: str | None = None) -> list[str]:
    """The rollups' queries over [start, end], whole buckets, of the run ``run_id`` alone if given:
    continuous queries only ever roll up the last buckets, so replayed (past) samples are rolled up
    by running these once."""
    span = f"time >= {start_ns - start_ns % _MINUTE_NS} AND time < {end_ns - end_ns % _MINUTE_NS + _MINUTE_NS}"
    if run_id is not None:
        span += f' AND "run_id" = {string_literal(run_id)}'
    return [select for _, _, select in rollup_queries(db, span)]
