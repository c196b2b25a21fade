"""The sample schema (sample.schema.json, beside this file) and the two encodings derived from it.

Nothing about a field is written here: names, types, units, enumerations and which fields are
Influx tags all come from the schema file, so the agents, the stores' templates and the dashboards
cannot drift apart.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from operator import itemgetter
from typing import Any

from . import _files
from ._check import INT64_MAX, type_ok
from ._flat import Field, problems, read_fields
from ._flat import markdown_table as _markdown_table
from ._flat import to_json as _to_json
from .lineprotocol import escape_key as _escape_key
from .lineprotocol import escape_string as _escape_string

SCHEMA_FILE = "sample.schema.json"

Values = tuple[Any, ...]  # a sample's values, in its keys' order


def schema() -> dict[str, Any]:
    return _files.load(SCHEMA_FILE)


@lru_cache(maxsize=1)
def fields() -> tuple[Field, ...]:
    return read_fields(schema())


def _enum(name: str) -> tuple[tuple[str, ...], str]:
    prop = schema()["properties"][name]
    default: str = prop["default"]
    return tuple(prop["enum"]), default


_ROLE = schema()["properties"]["role"]
ROLE_PATTERN: str = _ROLE["pattern"]  # every role a sample may carry (matched whole: role_or_default)
DEFAULT_ROLE: str = _ROLE["default"]  # a process that names no role, or one outside the pattern
PIPELINE_ROLES: tuple[str, ...] = tuple(_ROLE["x-pipeline-roles"])  # the harness's roles, in pipeline order
_ROLE_FIELD = next(f for f in fields() if f.name == "role")


def role_or_default(role: object) -> str:
    """The role a sample records for the role a node gave: itself when the schema allows it (a
    string matching ROLE_PATTERN), else DEFAULT_ROLE."""
    return role if isinstance(role, str) and _ROLE_FIELD.matches(role) else DEFAULT_ROLE


NODE_STATES, STATE_UP = _enum("node_state")  # UP: a process without a control channel
STATE_DOWN = "DOWN"  # reported once, when the process is gone
STATE_STOPPED = "STOPPED"  # reported once instead, when it is gone after the agent's run-ending notice
STATE_LEFT_TOP = "LEFT_TOP"  # reported once when it leaves an agent's top-N (--top) while still running
assert {STATE_DOWN, STATE_STOPPED, STATE_LEFT_TOP} <= set(
    NODE_STATES
), "sample.schema.json: node_state must list DOWN, STOPPED and LEFT_TOP"


def from_control_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """The sample fields a get-metrics reply provides; fields of the wrong type, outside their
    enumeration or not matching their pattern, are left out."""
    out: dict[str, Any] = {}
    for f in fields():
        if f.control is None or reply.get(f.control) is None:
            continue
        value = reply[f.control]
        if f.type == "number" and type_ok(value, "number"):
            out[f.name] = float(value)
        elif (
            type_ok(value, f.type)
            and not (f.type == "integer" and not 0 <= value <= INT64_MAX)
            and not (f.type == "string" and not f.matches(value))
        ):
            out[f.name] = value
    return out


def measurement() -> str:
    name: str = schema()["x-measurement"]
    return name


def validate(sample: dict[str, Any]) -> list[str]:
    """Everything wrong with a sample, as texts naming the field; [] when it conforms."""
    return problems(sample, fields())


def problems_with_time(doc: dict[str, Any], flat: tuple[Any, ...]) -> list[str]:
    """A flat document's problems (the self-sample's, a verdict's, an edge's) and, when it has none,
    whether its time reads as an ISO-8601 UTC time."""
    errors = problems(doc, flat)
    if not errors:
        try:
            time_ns(doc["time"])
        except ValueError:
            errors.append(f"time: not an ISO-8601 UTC time ({str(doc['time'])[:40]!r})")
    return errors


_TIME_CACHE: dict[str, int] = {}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def time_ns(iso: str) -> int:
    """Nanoseconds since the epoch of an ISO-8601 UTC time with milliseconds ('...T10:51:14.123Z').

    Cached: every node sampled in one tick shares the time string.
    """
    ns = _TIME_CACHE.get(iso)
    if ns is None:
        dt = datetime.fromisoformat(iso)  # takes the Z since Python 3.11
        if dt.tzinfo is None:  # it would be read as local time
            raise ValueError(f"{iso!r}: no time zone (flowstat writes UTC, with a Z)")
        # whole milliseconds, counted down to the one the time falls in (int(dt.timestamp()) rounded a
        # time before 1970 towards the epoch: 1969-12-31T23:59:59.999Z came out a second late, in 1970)
        ns = (dt - _EPOCH) // _MILLISECOND * 1_000_000
        if len(_TIME_CACHE) > 4096:
            _TIME_CACHE.clear()
        _TIME_CACHE[iso] = ns
    return ns


@lru_cache(maxsize=1)
def _line_plan() -> tuple[str, tuple[str, ...], tuple[tuple[str, str, str], ...]]:
    """What to_line_protocol needs, worked out once: the measurement, the tag names sorted (as
    Influx prefers), and each field's name, escaped key and type, in schema order."""
    tags = tuple(sorted(f.name for f in fields() if f.influx == "tag"))
    plan = tuple((f.name, _escape_key(f.name), f.type) for f in fields() if f.influx == "field")
    return _escape_key(measurement()), tags, plan


_SERIES_CACHE: dict[Values, str] = {}


def _series(tag_values: Values) -> str:
    """The line's series prefix ('measurement,tag=value,...') for tag values in sorted tag order; cached."""
    measurement_key, tags, _ = _line_plan()
    head = ",".join(
        [measurement_key]
        + [
            f"{_escape_key(t)}={_escape_key(str(v))}"
            for t, v in zip(tags, tag_values, strict=False)
            if v not in (None, "")
        ]
    )
    if len(_SERIES_CACHE) > 65536:
        _SERIES_CACHE.clear()
    _SERIES_CACHE[tag_values] = head
    return head


def to_line_protocol(sample: dict[str, Any]) -> str:
    """InfluxDB line protocol: tags sorted by key, fields in schema order, ns time.

    On every sample's path (agents, replay of millions): the series prefix is cached per tag values.
    """
    _, tags, plan = _line_plan()
    tag_values = tuple(sample.get(t) for t in tags)
    head = _SERIES_CACHE.get(tag_values) or _series(tag_values)
    parts: list[str] = []
    get = sample.get
    for name, key, typ in plan:
        value = get(name)
        if value is None:
            continue
        if typ == "integer":
            parts.append(f"{key}={value}i")
        elif typ == "number":
            parts.append(f"{key}={float(value)!r}")
        elif typ == "boolean":
            parts.append(f"{key}=true" if value else f"{key}=false")
        else:
            parts.append(f"{key}={_escape_string(value)}")
    return f"{head} {','.join(parts)} {time_ns(sample['time'])}"


def _getter(positions: list[int]) -> Callable[[Values], Values]:
    """itemgetter that always returns a tuple (itemgetter(i) alone returns the item)."""
    if len(positions) == 1:
        (i,) = positions
        return lambda values: (values[i],)
    return itemgetter(*positions)


_FIELD_FORMAT = {int: "%di", float: "%r", str: '"%s"'}  # how to_line_protocol writes each field type
# The exact Python types (as JSON decoding gives them) each schema type accepts; the first is the
# type written to line protocol (an int in a number field is written as a float).
PY_TYPES = {"string": (str,), "integer": (int,), "number": (float, int), "boolean": (bool,)}


def _no_integers(values: Values) -> Values:
    return (0,)


def _not_fast(values: Values) -> Values:
    raise ValueError("not a fast layout: its samples are encoded by to_line_protocol()")


@dataclass(frozen=True)
class Layout:
    """Every sample whose keys come in one order with one Python type per value, checked and
    encoded by what is worked out here once. A run file holds a handful of layouts and millions of
    samples: a sample then costs a few C-level calls instead of a Python loop over its fields.

    ``conforms``: the keys are schema fields, the required ones are there, every value has its
    field's type; the integers (``integers()``) must still be in 0..INT64_MAX, the enumerated
    strings in their enumeration (``enums(values) in allowed``) and the strings with a pattern must
    match it (``patterned(values)``, when there are some). ``fast``: the
    line protocol can come from ``line()``, byte for byte what to_line_protocol writes, for a
    sample none of whose strings holds a quote or a backslash (the caller checks that: in a JSON
    line, both need a backslash). Layouts that do not conform, or are not fast, are left to
    validate() and to_line_protocol().
    """

    conforms: bool
    fast: bool
    integers: Callable[[Values], Values] = _no_integers
    tags: Callable[[Values], Values] = _not_fast
    fields: Callable[[Values], Values] = _not_fast
    booleans: Callable[[Values], Values] | None = None
    formats: dict[Values, str] = field(default_factory=dict)  # the fields' format, by the booleans' values
    enums: Callable[[Values], Values] | None = None  # the values of the enumerated fields present
    allowed: frozenset[Values] = frozenset()  # every allowed combination of those values
    patterned: Callable[[Values], bool] | None = None  # whether the strings with a pattern match it

    def line(self, values: Values, time_ns_: int) -> str:
        """The sample's line protocol with its newline; only for a fast layout (see the class)."""
        tag_values = self.tags(values)
        head = _SERIES_CACHE.get(tag_values) or _series(tag_values)
        fmt = self.formats[self.booleans(values) if self.booleans else ()]
        return f"{head} {fmt % self.fields(values)} {time_ns_}\n"


def _pattern_check(patterned: list[tuple[int, Field]]) -> Callable[[Values], bool]:
    """Whether the values at these positions match their fields' patterns. A run file repeats a
    handful of roles millions of times: the values found good are remembered (a few thousand)."""
    good: set[tuple[int, str]] = set()

    def check(values: Values) -> bool:
        for i, f in patterned:
            if (i, values[i]) not in good:
                if not f.matches(values[i]):
                    return False
                if len(good) > 4096:
                    good.clear()
                good.add((i, values[i]))
        return True

    return check


@lru_cache(maxsize=256)
def layout(keys: tuple[str, ...], types: tuple[type, ...]) -> Layout:
    """The Layout of samples with these keys, in this order, and these value types."""
    by_name = {f.name: f for f in fields()}
    required = {f.name for f in fields() if f.required}
    position = {k: i for i, k in enumerate(keys)}
    conforms = (
        len(position) == len(keys)
        and all(k in by_name for k in keys)
        and required <= position.keys()
        and all(t in PY_TYPES[by_name[k].type] for k, t in zip(keys, types, strict=False))
    )
    if not conforms:
        return Layout(False, False)
    ints = [i for i, k in enumerate(keys) if by_name[k].type == "integer"]
    integers = _getter(ints) if ints else _no_integers
    enumerated = [k for k in keys if by_name[k].enum]
    value_checks: dict[str, Any] = (
        dict(
            enums=_getter([position[k] for k in enumerated]),
            allowed=frozenset(itertools.product(*(by_name[k].enum for k in enumerated))),
        )
        if enumerated
        else {}
    )
    patterned = [(position[k], by_name[k]) for k in keys if by_name[k].pattern]
    if patterned:
        value_checks["patterned"] = _pattern_check(patterned)
    _, tag_names, plan = _line_plan()
    # Not fast: a tag left out (its series differs), or an integer in a number field (it must be
    # written as a float: repr(float(v)) is not a format a %-spec gives).
    fast = all(t in position for t in tag_names) and all(
        types[position[name]] is float for name, _, typ in plan if typ == "number" and name in position
    )
    if not fast:
        return Layout(True, False, integers, **value_checks)
    present = [(name, key, typ) for name, key, typ in plan if name in position]
    bools = [name for name, _, typ in present if typ == "boolean"]
    formats: dict[Values, str] = {}
    for values in itertools.product((False, True), repeat=len(bools)):
        given = dict(zip(bools, values, strict=False))
        formats[values] = ",".join(
            f"{key}={'true' if given[name] else 'false'}"
            if typ == "boolean"
            else f"{key}={_FIELD_FORMAT[PY_TYPES[typ][0]]}"
            for name, key, typ in present
        )
    return Layout(
        True,
        True,
        integers,
        _getter([position[t] for t in tag_names]),
        _getter([position[name] for name, _, typ in present if typ != "boolean"]),
        _getter([position[b] for b in bools]) if bools else None,
        formats,
        **value_checks,
    )


def to_json(sample: dict[str, Any]) -> str:
    """The JSON document (what Elasticsearch stores): the sample's fields in schema order."""
    return _to_json(sample, fields())


def document_id(sample: dict[str, Any]) -> str:
    """Deterministic Elasticsearch _id: re-sending a sample overwrites it instead of duplicating it."""
    return f"{sample['run_id']}/{sample['agent']}/{sample['node_id']}/{sample['seq']}"


def markdown_table() -> str:
    """The field-by-field documentation of the schema (docs/schema.md embeds it)."""
    return _markdown_table(fields(), schema()["properties"], control=True)
