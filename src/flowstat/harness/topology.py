"""Topology files: who produces what, which merger each producer feeds, and the run parameters.

The YAML plays the role of the thesis's DDS topology. It is validated completely before anything
starts; every error names the file and the field.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import yaml

from flowstat.node.curve import is_loopback
from flowstat.proc.procfs import format_cpu_list
from flowstat.schema.run import AFFINITY_ROLES, IN_CODE
from flowstat.units import parse_duration, parse_size

from .mergecost import MergeCost
from .qcobjects import DEFAULT_TREE_BRANCHES, KIND_NAMES, Kind, ObjectDesc, make_desc, shape_for_size

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
NODE_ID_RE = RUN_ID_RE
PRODUCERS_PER_PROCESS = 250  # one Python process sends 25k objects/s comfortably
VIEWER_NODE = "viewer"
AGENT_NODES = ("agent-py", "agent-c")  # the monitoring agents flowstat run starts with every run
CPU_ROLES = AFFINITY_ROLES  # the keys of cpus: that name a role ("agent": both agents)
MAX_KERNEL_BUFFER = 2**31 - 1  # SO_SNDBUF and SO_RCVBUF take a C int


def producer_process_name(index: int) -> str:
    return f"producers-{index}"


def upper_merger_name(layer: int, index: int) -> str:
    """The name of the index-th merger of a layer above the first (layers count from 1)."""
    return f"merger-l{layer}-{index}"


def spread(n_items: int, n_groups: int) -> list[range]:
    """n_items split into n_groups contiguous, balanced ranges (producers over mergers, mergers over
    the next layer's)."""
    bounds = [round(i * n_items / n_groups) for i in range(n_groups + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(n_groups)]


class TopologyError(ValueError):
    """A topology that cannot run; the message names the file and the field."""


@dataclass(frozen=True)
class ObjectSpec:
    kind: Kind
    shape: tuple[int, ...]
    entries: int  # Gaussian fills per histogram
    names: int  # distinct object names each producer cycles through

    def descs(self) -> list[ObjectDesc]:
        return [make_desc(f"{self.kind.name}_{i}", self.kind, self.shape) for i in range(self.names)]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * 4


@dataclass(frozen=True)
class MergerSpec:
    node_id: str
    producers: tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    run_id: str
    duration: float
    buffer_size: int
    obj: ObjectSpec
    n_producers: int
    rate: float  # objects/s per producer, 0 = unlimited
    producer_processes: int
    mergers: tuple[MergerSpec, ...]  # the first layer: those the producers feed
    merger_send_buffer: int
    viewer_write_interval: float
    host: str
    source: str = IN_CODE
    description: str = ""
    raw: dict = field(default_factory=dict, compare=False, repr=False)
    # cpus: as given, by role or node name: the CPUs to pin to. Empty: nothing is pinned.
    cpus: dict[str, frozenset[int]] = field(default_factory=dict, hash=False)  # a dict: kept out of the hash
    # SO_SNDBUF of the producers' data sockets and SO_RCVBUF of the mergers', in bytes; None: the
    # kernel's auto-tuning (up to tcp_wmem / tcp_rmem max), which ZeroMQ's HWM does not count.
    kernel_buffer_size: int | None = None
    # Mergers in each layer above the first (merger_layers:); () for one layer.
    merger_layers: tuple[int, ...] = ()
    # CPU time every merger spends on each merge beyond its own (merge_cost:), but those with an
    # entry of their own in merge_cost_nodes; None: none added.
    merge_cost: MergeCost | None = None
    # Per node (merge_cost.nodes:, a merger or the viewer): its cost instead of merge_cost; an entry
    # that adds nothing exempts its node. See cost_of.
    merge_cost_nodes: dict[str, MergeCost] = field(default_factory=dict, hash=False)  # a dict: kept out of the hash
    # Where each role runs when the run spans hosts (flowstat run --slurm): host names, or a count
    # of hosts (placement:); empty: the launcher's default (flowstat.harness.launch.assign).
    placement: dict[str, list[str] | int] = field(default_factory=dict, hash=False)
    # ZeroMQ CURVE (security:): on control sockets "auto" (whenever a node binds anything but
    # loopback), "curve" (always) or "off"; on data sockets "curve" or "off".
    control_security: str = "auto"
    data_security: str = "off"

    def curve_on_control(self, bind_hosts: Iterable[str]) -> bool:
        """Whether the control channels are secured, for nodes binding those hosts."""
        if self.control_security == "auto":
            return not all(is_loopback(h) for h in bind_hosts)
        return self.control_security == "curve"

    def layers(self) -> list[tuple[str, ...]]:
        """The mergers' node ids, layer by layer: the first layer (fed by the producers), then each
        layer above it; the last one feeds the viewer."""
        return [
            tuple(m.node_id for m in self.mergers),
            *(tuple(upper_merger_name(li, i) for i in range(n)) for li, n in enumerate(self.merger_layers, 2)),
        ]

    def all_mergers(self) -> list[str]:
        """Every merger's node id, layer by layer."""
        return [m for layer in self.layers() for m in layer]

    def layer_of(self) -> dict[str, int]:
        """Each merger's layer, counted from 1 (the first layer)."""
        return {m: li for li, layer in enumerate(self.layers(), 1) for m in layer}

    def merger_inputs(self) -> dict[str, tuple[str, ...]]:
        """For each merger above the first layer, the mergers of the layer below that feed it: they
        are spread over it as the producers are over the first layer (contiguous, balanced)."""
        layers, out = self.layers(), {}
        for below, above in zip(layers, layers[1:], strict=False):
            for upper, span in zip(above, spread(len(below), len(above)), strict=False):
                out[upper] = tuple(below[i] for i in span)
        return out

    def downstream_of(self) -> dict[str, str]:
        """Where each merger sends its merged objects: a merger of the next layer, or the viewer."""
        out = {m: VIEWER_NODE for m in self.layers()[-1]}
        out.update({lower: upper for upper, inputs in self.merger_inputs().items() for lower in inputs})
        return out

    def inputs_of(self) -> dict[str, tuple[str, ...]]:
        """The processes each merger and the viewer hear from: for a first-layer merger, the producer
        processes that host any of its producers; for an upper merger, the mergers below that feed
        it; for the viewer, the last layer. A process ends once every one of these sent its end of
        stream."""
        groups = self.producer_groups()
        out: dict[str, tuple[str, ...]] = {
            m.node_id: tuple(producer_process_name(gi) for gi, ids in enumerate(groups) if set(ids) & set(m.producers))
            for m in self.mergers
        }
        out.update(self.merger_inputs())
        out[VIEWER_NODE] = self.layers()[-1]
        return out

    def node_roles(self) -> dict[str, str]:
        """Every process a run of this topology starts, by name, and its role (agents included,
        whether or not the C agent is built)."""
        return {
            VIEWER_NODE: "viewer",
            **{m: "merger" for m in self.all_mergers()},
            **{producer_process_name(i): "producer" for i in range(self.producer_processes)},
            **{name: "agent" for name in AGENT_NODES},
        }

    def cost_of(self, node: str) -> MergeCost | None:
        """The CPU time ``node`` adds to what it takes: its own merge_cost.nodes entry, else, for a
        merger, merge_cost (the viewer has none by default); None: none added."""
        if node in self.merge_cost_nodes:
            return self.merge_cost_nodes[node] or None
        return self.merge_cost if node in self.all_mergers() else None

    def cpus_for(self, node: str, role: str) -> frozenset[int] | None:
        """The CPUs to pin a process to: its node's entry, else its role's; None: not pinned."""
        return self.cpus.get(node, self.cpus.get(role))

    def cpus_text(self) -> str:
        """cpus: in one canonical line (roles in pipeline order, then nodes in start order), so
        that runs pinned alike compare equal: "producer=0 merger=1 viewer=0 agent=0"."""
        order = [*CPU_ROLES, *(n for n in self.node_roles() if n not in CPU_ROLES)]
        return " ".join(f"{key}={format_cpu_list(self.cpus[key])}" for key in order if key in self.cpus)

    def producer_groups(self) -> list[list[int]]:
        """Logical producer ids hosted by each producer process (contiguous, balanced)."""
        return [list(span) for span in spread(self.n_producers, self.producer_processes)]

    def merger_of(self) -> dict[int, int]:
        return {p: mi for mi, m in enumerate(self.mergers) for p in m.producers}


class _Fields:
    """Reads one mapping of the YAML, naming the path of every field in errors."""

    def __init__(self, source: str, path: str, data: Any, allowed: set[str]):
        self.source, self.path = source, path
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping, got {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - allowed)
        if unknown:
            self.fail(
                f"{path}.{unknown[0]}" if path else unknown[0], f"unknown field (allowed: {', '.join(sorted(allowed))})"
            )
        self.data = data

    def fail(self, where: str, message: str) -> NoReturn:
        raise TopologyError(f"{self.source}: {where or 'topology'}: {message}")

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default: Any = ..., *, required: bool = False) -> Any:
        if key not in self.data:
            if required or default is ...:
                self.fail(self.where(key), "required field is missing")
            return default
        return self.data[key]

    def number(
        self, key: str, default: Any = ..., *, minimum: float, integer: bool = False, exclusive: bool = False
    ) -> Any:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
            self.fail(self.where(key), f"expected {'an integer' if integer else 'a number'}, got {value!r}")
        if value < minimum or (exclusive and value == minimum):
            self.fail(self.where(key), f"must be {'>' if exclusive else '>='} {minimum}, got {value!r}")
        return value


def parse_id_ranges(spec: Any, n_producers: int, where: str, fail: Callable[[str, str], NoReturn]) -> tuple[int, ...]:
    """Producer ids from a list of ints / "a-b" ranges, or one such string ("0-249,300")."""
    items: list[Any] | None = (
        spec if isinstance(spec, list) else str(spec).split(",") if isinstance(spec, (str, int)) else None
    )
    if items is None:
        fail(where, f'expected producer ids such as [0, 1] or "0-249", got {spec!r}')
    ids: list[int] = []
    for item in items:
        text = str(item).strip()
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", text)
        if isinstance(item, bool) or not m:
            fail(where, f"bad producer id or range {item!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo or hi >= n_producers:
            fail(where, f"range {text} is outside producers 0-{n_producers - 1}")
        ids.extend(range(lo, hi + 1))
    return tuple(ids)


def _object_spec(source: str, data: Any) -> ObjectSpec:
    f = _Fields(source, "object", data, {"type", "size", "bins", "entries", "branches", "names"})
    type_name = f.get("type", required=True)
    if type_name not in KIND_NAMES:
        f.fail("object.type", f"unknown type {type_name!r} (one of {', '.join(KIND_NAMES)})")
    kind = KIND_NAMES[type_name]
    entries = f.number("entries", 1000, minimum=1, integer=True)
    names = f.number("names", 1, minimum=1, integer=True)
    branches = f.number("branches", DEFAULT_TREE_BRANCHES, minimum=1, integer=True)
    if "branches" in f.data and kind is not Kind.TTree:
        f.fail("object.branches", "only a TTree has branches")
    if ("size" in f.data) == ("bins" in f.data):
        f.fail("object", "give exactly one of size (e.g. 1kB, 500kB) or bins")
    if "size" in f.data:
        try:
            size = parse_size(f.data["size"])
        except ValueError as exc:
            f.fail("object.size", str(exc))
        shape = shape_for_size(kind, size, branches)
    else:
        bins = f.data["bins"]
        bins = [bins] if isinstance(bins, int) else bins
        want = kind.hist_ndim if kind.is_histogram else 1
        if (
            not isinstance(bins, list)
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bins)
            or (kind is not Kind.THnF and len(bins) != want)
            or not 1 <= len(bins) <= 8
        ):
            f.fail("object.bins", f"expected {want} positive integer(s) for {type_name}, got {bins!r}")
        shape = (branches, bins[0]) if kind is Kind.TTree else tuple(b + 2 for b in bins)
    return ObjectSpec(kind, tuple(shape), entries, names)


def _kernel_buffer(source: str, data: Any) -> int | None:
    """kernel_buffer_size: bytes as an integer or a size such as "4kB"; absent: auto-tuned."""
    if data is None:
        return None
    try:
        size = parse_size(data)
    except ValueError as exc:
        raise TopologyError(f"{source}: kernel_buffer_size: {exc}") from None
    if size > MAX_KERNEL_BUFFER:
        raise TopologyError(f"{source}: kernel_buffer_size: at most {MAX_KERNEL_BUFFER} bytes (a C int), got {size}")
    return size


COST_FIELDS = {"per_object", "per_MB", "factor"}
NODE_COST_FIELDS = {*COST_FIELDS, "after"}  # a node's own may start later: a node that slows down


def _cost(f: _Fields) -> MergeCost:
    """One merge cost's fields (per_object, per_MB, after: durations; factor >= 1), read from ``f``."""
    times = {}
    for key in ("per_object", "per_MB", "after"):
        try:
            times[key] = parse_duration(f.get(key, 0))
        except ValueError as exc:
            f.fail(f.where(key), str(exc))
    factor = float(f.number("factor", 1, minimum=1))
    return MergeCost(times["per_object"], times["per_MB"] / 1e6, factor, times["after"])


def _merge_cost(source: str, data: Any) -> MergeCost | None:
    """merge_cost: CPU time added to every merge (see mergecost); absent or all zero: None. Its
    nodes: are read by _merge_cost_nodes, once the topology's node names are known."""
    if data is None:
        return None
    return _cost(_Fields(source, "merge_cost", data, {*COST_FIELDS, "nodes"})) or None


def _merge_cost_nodes(source: str, data: Any, names: list[str]) -> dict[str, MergeCost]:
    """merge_cost.nodes: {node: {per_object, per_MB, factor}} for mergers (of any layer) and the
    viewer (``names``): each replaces merge_cost for its node; one that adds nothing exempts it."""
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if nodes is None:
        return {}
    nf = _Fields(source, "merge_cost.nodes", nodes, set(map(str, nodes)) if isinstance(nodes, dict) else set())
    out = {}
    for key, value in nf.data.items():
        name, where = str(key), nf.where(str(key))
        if name not in names:
            shown = ", ".join(names[:8]) + (f", ... ({len(names)} nodes)" if len(names) > 8 else "")
            nf.fail(where, f"no such merger or viewer ({shown})")
        out[name] = _cost(_Fields(source, where, value, NODE_COST_FIELDS))
    return out


def _merger_specs(source: str, data: Any, n_producers: int) -> tuple[MergerSpec, ...]:
    def fail(where: str, msg: str) -> NoReturn:
        raise TopologyError(f"{source}: {where}: {msg}")

    if isinstance(data, int) and not isinstance(data, bool):
        if not 1 <= data <= n_producers:
            fail("mergers", f"expected 1 to {n_producers} mergers, got {data}")
        return tuple(MergerSpec(f"merger-{i}", tuple(span)) for i, span in enumerate(spread(n_producers, data)))
    if not isinstance(data, list) or not data:
        fail("mergers", f"expected a number of mergers or a list of {{id, producers}}, got {data!r}")
    specs: list[MergerSpec] = []
    owner: dict[int, str] = {}  # producer -> the merger it feeds
    for i, item in enumerate(data):
        f = _Fields(source, f"mergers[{i}]", item, {"id", "producers"})
        node_id = str(f.get("id", f"merger-{i}"))
        if not NODE_ID_RE.match(node_id):
            f.fail(f"mergers[{i}].id", f"bad id {node_id!r} (letters, digits, '.', '_', '-')")
        if node_id in CPU_ROLES or node_id in AGENT_NODES or re.fullmatch(r"producers-\d+", node_id):
            # a node's name keys its log, its control client and its cpus: entry
            f.fail(
                f"mergers[{i}].id",
                f"{node_id!r} is a role's name or one the harness gives its own processes "
                f"({VIEWER_NODE}, producers-N, {', '.join(AGENT_NODES)})",
            )
        ids = parse_id_ranges(f.get("producers", required=True), n_producers, f"mergers[{i}].producers", fail)
        if not ids:
            fail(f"mergers[{i}].producers", "a merger needs at least one producer")
        for p in ids:
            if p in owner:
                fail(f"mergers[{i}].producers", f"producer {p} is already fed to {owner[p]}")
            owner[p] = node_id
        specs.append(MergerSpec(node_id, ids))
    if len({s.node_id for s in specs}) != len(specs):
        fail("mergers", "merger ids must be unique")
    missing = sorted(set(range(n_producers)) - set(owner))
    if missing:
        fail("mergers", f"producer {missing[0]} feeds no merger ({len(missing)} unassigned)")
    return tuple(specs)


def _merger_layers(source: str, data: Any, first: tuple[MergerSpec, ...], kind: Kind) -> tuple[int, ...]:
    """merger_layers: the number of mergers in each layer above the first, each at most the
    layer's below (every merger feeds one of the next layer, and each of those needs an input)."""

    def fail(where: str, msg: str) -> NoReturn:
        raise TopologyError(f"{source}: {where}: {msg}")

    if data is None:
        return ()
    if not isinstance(data, list):
        fail(
            "merger_layers",
            f"expected a list of merger counts, one per layer above the first, such as [1], got {data!r}",
        )
    below = len(first)
    for i, n in enumerate(data):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            fail(f"merger_layers[{i}]", f"expected a number of mergers >= 1, got {n!r}")
        if n > below:
            fail(
                f"merger_layers[{i}]",
                f"at most {below} mergers (the layer below has {below}, and each merger " f"needs an input), got {n}",
            )
        below = n
    if data and kind is Kind.TTree:
        # A merged tree's length is the sum of its inputs': the trees reaching an upper merger differ
        # in shape, and a merger merges objects of one shape only.
        fail("merger_layers", "a TTree cannot go through merger layers (merged trees differ in length)")
    upper = {upper_merger_name(li, i) for li, n in enumerate(data, 2) for i in range(n)}
    for i, m in enumerate(first):
        if m.node_id in upper:
            fail(f"mergers[{i}].id", f"{m.node_id!r} is the name of a merger of an upper layer (merger_layers)")
    return tuple(data)


def _usable_cpus() -> tuple[frozenset[int], int]:
    """The CPUs this process may run on (its affinity: the cpuset, taskset), and how many the
    machine has; what the harness starts inherits the former."""
    return frozenset(os.sched_getaffinity(0)), os.cpu_count() or 0


def _cpu_set(value: Any, where: str, fail: Callable[[str, str], NoReturn]) -> frozenset[int]:
    """CPUs given as 1, [0, 1] or "0-1,3" (as in Cpus_allowed_list), each one usable here."""
    usable, count = _usable_cpus()
    here = f"CPUs {format_cpu_list(usable)}"
    if isinstance(value, bool) or not isinstance(value, (int, str, list)):
        fail(where, f'expected CPUs such as 1, [0, 1] or "0-1,3", got {value!r}')
    items = value if isinstance(value, list) else str(value).split(",")
    cpus: set[int] = set()
    for item in items:
        text = str(item).strip()
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", text)
        if isinstance(item, bool) or not isinstance(item, (int, str)) or not m:
            fail(where, f'bad CPU or range {item!r} (expected CPUs such as 1, [0, 1] or "0-1,3")')
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            fail(where, f"range {text} is empty")
        if hi >= count:  # checked before expanding: "0-99999999" must not build a set
            fail(where, f"CPU {max(lo, count)} does not exist here ({here})")
        cpus.update(range(lo, hi + 1))
    if not cpus:
        fail(where, "no CPUs: a node needs at least one to run on")
    outside = sorted(cpus - usable)
    if outside:
        fail(
            where,
            f"CPU {outside[0]} is not available here ({here}; the others are outside the affinity or "
            f"cpuset flowstat runs in)",
        )
    return frozenset(cpus)


def _cpu_pins(source: str, data: Any, nodes: dict[str, str]) -> dict[str, frozenset[int]]:
    def fail(where: str, msg: str) -> NoReturn:
        raise TopologyError(f"{source}: {where}: {msg}")

    if data is None:
        return {}
    if not isinstance(data, dict):
        fail("cpus", f"expected a mapping of roles or nodes to CPUs, such as {{merger: 1, producer: 0}}, got {data!r}")
    pins = {}
    for key, value in data.items():
        name = str(key)
        if name not in CPU_ROLES and name not in nodes:
            names = list(nodes)
            shown = ", ".join(names[:8]) + (f", ... ({len(names)} nodes)" if len(names) > 8 else "")
            fail(f"cpus.{name}", f"neither a role ({', '.join(CPU_ROLES)}) nor a node of this topology ({shown})")
        pins[name] = _cpu_set(value, f"cpus.{name}", fail)
    return pins


HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _placement(source: str, value: Any) -> dict[str, list[str] | int]:
    """placement: {producers|mergers|viewer: [host, ...] | "n1,n2" | count}."""
    if value is None:
        return {}
    pf = _Fields(source, "placement", value, {"producers", "mergers", "viewer"})
    out: dict[str, list[str] | int] = {}
    for role in ("producers", "mergers", "viewer"):
        given = pf.get(role, None)
        if given is None:
            continue
        if isinstance(given, bool) or not isinstance(given, (int, str, list)):
            pf.fail(f"placement.{role}", f"expected host names or a count of hosts, got {given!r}")
        if isinstance(given, int):
            if given < 1:
                pf.fail(f"placement.{role}", f"expected at least 1 host, got {given}")
            out[role] = given
            continue
        hosts = [h.strip() for h in given.split(",")] if isinstance(given, str) else given
        bad = [h for h in hosts if not isinstance(h, str) or not HOST_NAME_RE.match(h)]
        if bad or not hosts:
            pf.fail(f"placement.{role}", f"expected host names (letters, digits, '.', '_', '-'), got {given!r}")
        out[role] = list(hosts)
    if isinstance(out.get("viewer"), int):
        pf.fail("placement.viewer", "the viewer is one process: give its host's name")
    return out


SECURITY = {"control": ("auto", "curve", "off"), "data": ("off", "curve")}


def _security(source: str, value: Any) -> dict[str, str]:
    """security: {control: auto|curve|off, data: off|curve}."""
    sf = _Fields(source, "security", value or {}, set(SECURITY))
    out = {}
    for channel, choices in SECURITY.items():
        given = sf.get(channel, choices[0])
        if given not in choices:
            sf.fail(f"security.{channel}", f"expected {' or '.join(choices)}, got {given!r}")
        out[channel] = given
    return out


def from_dict(data: Any, source: str = IN_CODE) -> Topology:
    top = _Fields(
        source,
        "",
        data,
        {
            "run_id",
            "description",
            "duration",
            "buffer_size",
            "object",
            "producers",
            "mergers",
            "merger_layers",
            "viewer",
            "merger_send_buffer",
            "host",
            "cpus",
            "kernel_buffer_size",
            "merge_cost",
            "placement",
            "security",
        },
    )
    run_id = top.get("run_id", required=True)
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        top.fail("run_id", f"expected letters, digits, '.', '_', '-' (max 100), got {run_id!r}")
    duration = float(top.number("duration", 20, minimum=0, exclusive=True))
    buffer_size = top.number("buffer_size", 1000, minimum=1, integer=True)
    obj = _object_spec(source, top.get("object", required=True))
    pf = _Fields(source, "producers", top.get("producers", required=True), {"count", "rate", "processes"})
    n_producers = pf.number("count", minimum=1, integer=True)
    rate = float(pf.number("rate", 100, minimum=0))
    processes = pf.number("processes", math.ceil(n_producers / PRODUCERS_PER_PROCESS), minimum=1, integer=True)
    if processes > n_producers:
        pf.fail("producers.processes", f"{processes} processes for {n_producers} producers")
    mergers = _merger_specs(source, top.get("mergers", 1), n_producers)
    layers = _merger_layers(source, top.get("merger_layers", None), mergers, obj.kind)
    vf = _Fields(source, "viewer", top.get("viewer", {}) or {}, {"write_interval"})
    write_interval = float(vf.number("write_interval", 5, minimum=0, exclusive=True))
    send_buffer = top.number("merger_send_buffer", 1000, minimum=1, integer=True)
    host = top.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        top.fail("host", f"expected an address to bind, got {host!r}")
    security = _security(source, top.get("security", None))
    description = top.get("description", "")
    if not isinstance(description, str):
        top.fail("description", f"expected text, got {description!r}")
    topo = Topology(
        run_id,
        duration,
        buffer_size,
        obj,
        n_producers,
        rate,
        processes,
        mergers,
        send_buffer,
        write_interval,
        host,
        source,
        description,
        data,
        merger_layers=layers,
        kernel_buffer_size=_kernel_buffer(source, top.get("kernel_buffer_size", None)),
        merge_cost=_merge_cost(source, top.get("merge_cost", None)),
        placement=_placement(source, top.get("placement", None)),
        control_security=security["control"],
        data_security=security["data"],
    )
    # The node names a cpus: key or merge_cost.nodes may use depend on everything above: they are read last.
    costs = _merge_cost_nodes(source, top.get("merge_cost", None), [*topo.all_mergers(), VIEWER_NODE])
    pins = _cpu_pins(source, top.get("cpus", None), topo.node_roles())
    return replace(topo, cpus=pins, merge_cost_nodes=costs) if pins or costs else topo


def read_yaml(path: Path, error: type[Exception] = TopologyError) -> Any:
    """A YAML file's data; ``error`` names the file, and the line and column of a syntax error."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        raise error(f"{path}: {where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None


def load(path: str | Path) -> Topology:
    return from_dict(read_yaml(Path(path)), str(path))
