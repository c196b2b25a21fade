import os

import pytest
import yaml

from flowstat.harness.mergecost import MergeCost
from flowstat.harness.topology import TopologyError, from_dict, load
from flowstat.units import parse_size
from support.common import TOPOLOGIES, topology_dict


def test_shipped_topologies_load_as_their_files_say():
    paths = sorted(TOPOLOGIES.glob("*.yaml"))
    assert len(paths) >= 6
    for path in paths:
        if "-pinned" in path.name and not {0, 1} <= os.sched_getaffinity(0):
            # it describes a machine of two CPUs at least: elsewhere it must say so
            with pytest.raises(TopologyError, match=r"cpus\.\w+: CPU 1 (does not exist|is not available) here"):
                load(path)
            continue
        raw = yaml.safe_load(path.read_text())
        t = load(path)
        loaded = (
            t.run_id,
            t.duration,
            t.buffer_size,
            t.n_producers,
            t.rate,
            t.producer_processes,
            t.obj.kind.name,
            t.obj.nbytes,
            len(t.mergers),
            list(t.merger_layers),
        )
        said = (
            raw["run_id"],
            raw["duration"],
            raw["buffer_size"],
            raw["producers"]["count"],
            raw["producers"]["rate"],
            raw["producers"].get("processes", 1),
            raw["object"]["type"],
            parse_size(raw["object"]["size"]),
            raw["mergers"],
            raw.get("merger_layers", []),
        )
        assert loaded == said, path.name
        # every producer feeds exactly one merger of the first layer
        assert sorted(p for m in t.mergers for p in m.producers) == list(range(t.n_producers)), path.name


def test_thesis_scenarios_are_there():
    t = load(TOPOLOGIES / "thesis-5.1-buffer-1.yaml")
    assert (t.n_producers, t.buffer_size, t.obj.kind.name, t.obj.nbytes) == (4, 1, "TH1F", 1000)
    t = load(TOPOLOGIES / "thesis-5.3-500kB-TH1F.yaml")
    assert t.n_producers == 20 and abs(t.obj.nbytes - 500_000) < 10
    for m in (1, 2, 4):
        t = load(TOPOLOGIES / f"thesis-5.5-500-producers-{m}-merger{'s' if m > 1 else ''}.yaml")
        assert t.n_producers == 500 and len(t.mergers) == m and t.rate == 100
        assert sorted(p for spec in t.mergers for p in spec.producers) == list(range(500))
        assert not t.cpus


@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="the pinned scenario needs CPUs 0 and 1")
def test_the_pinned_scenario_is_the_one_merger_one_pinned():
    plain = load(TOPOLOGIES / "thesis-5.5-500-producers-1-merger.yaml")
    pinned = load(TOPOLOGIES / "thesis-5.5-500-producers-1-merger-pinned.yaml")
    assert pinned.cpus == {"merger": {1}, "producer": {0}, "viewer": {0}, "agent": {0}}
    same = (
        "duration",
        "buffer_size",
        "obj",
        "n_producers",
        "rate",
        "producer_processes",
        "mergers",
        "merger_send_buffer",
        "viewer_write_interval",
        "host",
    )
    assert [getattr(pinned, f) for f in same] == [getattr(plain, f) for f in same]


def test_even_split_and_explicit_assignment():
    t = from_dict(topology_dict(producers={"count": 10}, mergers=3))
    assert [len(m.producers) for m in t.mergers] == [3, 4, 3]
    t = from_dict(
        topology_dict(
            producers={"count": 6}, mergers=[{"id": "a", "producers": "0-1,5"}, {"id": "b", "producers": [2, 3, "4"]}]
        )
    )
    assert t.mergers[0].producers == (0, 1, 5) and t.merger_of()[4] == 1


@pytest.mark.parametrize(
    "change,field",
    [
        ({"object": {"type": "TH5F", "size": "1kB"}}, "object.type"),
        ({"object": {"type": "TH1F", "size": "big"}}, "object.size"),
        ({"object": {"type": "TH1F"}}, "object"),
        ({"object": {"type": "TH2F", "bins": [10]}}, "object.bins"),
        ({"buffer_size": 0}, "buffer_size"),
        ({"buffer_size": "1"}, "buffer_size"),
        ({"duration": -1}, "duration"),
        ({"producers": {"count": 0}}, "producers.count"),
        ({"producers": {"count": 2, "rate": -5}}, "producers.rate"),
        ({"producers": {"count": 2, "colour": 1}}, "producers.colour"),
        ({"mergers": 9}, "mergers"),
        ({"mergers": [{"producers": "0-1"}, {"producers": "1-3"}]}, "mergers[1].producers"),
        ({"mergers": [{"producers": "0-2"}]}, "mergers"),
        ({"mergers": [{"producers": "0-9"}]}, "mergers[0].producers"),
        ({"run_id": "no spaces please"}, "run_id"),
        ({"typo_field": 1}, "typo_field"),
        ({"cpus": {"merger": os.cpu_count()}}, "cpus.merger"),
        ({"cpus": {"producers-0": [0, 4096]}}, "cpus.producers-0"),
        ({"cpus": {"merger-7": 0}}, "cpus.merger-7"),
        ({"cpus": {"producers-1": 0}}, "cpus.producers-1"),  # 4 producers: one process, producers-0
        ({"cpus": {"agent": []}}, "cpus.agent"),
        ({"cpus": {"viewer": "zero"}}, "cpus.viewer"),
        ({"cpus": [0]}, "cpus"),
        ({"mergers": [{"id": "producer", "producers": "0-3"}]}, "mergers[0].id"),
        ({"mergers": 2, "merger_layers": [0]}, "merger_layers[0]"),
        ({"mergers": 2, "merger_layers": [-1]}, "merger_layers[0]"),
        ({"mergers": 2, "merger_layers": [1.5]}, "merger_layers[0]"),
        ({"mergers": 2, "merger_layers": [True]}, "merger_layers[0]"),
        ({"mergers": 2, "merger_layers": 1}, "merger_layers"),
        ({"mergers": 2, "merger_layers": [3]}, "merger_layers[0]"),  # more than the layer below
        ({"mergers": 4, "merger_layers": [2, 3]}, "merger_layers[1]"),
        ({"mergers": 4, "merger_layers": [2, 1, 2]}, "merger_layers[2]"),
        ({"mergers": 2, "merger_layers": [1], "object": {"type": "TTree", "size": "1kB"}}, "merger_layers"),
        (
            {"mergers": [{"id": "merger-l2-0", "producers": "0-1"}, {"producers": "2-3"}], "merger_layers": [1]},
            "mergers[0].id",
        ),
        ({"mergers": 2, "cpus": {"merger-l2-0": 0}}, "cpus.merger-l2-0"),  # no layer above the first
        ({"mergers": 2, "merger_layers": [1], "cpus": {"merger-l2-1": 0}}, "cpus.merger-l2-1"),
        ({"mergers": 2, "merger_layers": [1], "cpus": {"merger-l3-0": 0}}, "cpus.merger-l3-0"),
        ({"kernel_buffer_size": 0}, "kernel_buffer_size"),
        ({"kernel_buffer_size": -4096}, "kernel_buffer_size"),
        ({"kernel_buffer_size": "4 parsecs"}, "kernel_buffer_size"),
        ({"kernel_buffer_size": True}, "kernel_buffer_size"),
        ({"kernel_buffer_size": 4096.0}, "kernel_buffer_size"),
        ({"kernel_buffer_size": 2**31}, "kernel_buffer_size"),  # SO_SNDBUF takes a C int
        ({"kernel_buffer_size": "3GB"}, "kernel_buffer_size"),
        ({"merge_cost": "1ms"}, "merge_cost"),
        ({"merge_cost": {"per_object": "1 parsec"}}, "merge_cost.per_object"),
        ({"merge_cost": {"per_object": -0.001}}, "merge_cost.per_object"),
        ({"merge_cost": {"per_object": True}}, "merge_cost.per_object"),
        ({"merge_cost": {"per_MB": "5 kB"}}, "merge_cost.per_MB"),
        ({"merge_cost": {"factor": 0.5}}, "merge_cost.factor"),
        ({"merge_cost": {"factor": "3"}}, "merge_cost.factor"),
        ({"merge_cost": {"per_merge": "1ms"}}, "merge_cost.per_merge"),
        ({"mergers": 2, "merge_cost": {"nodes": {"merger-9": {"per_object": "1ms"}}}}, "merge_cost.nodes.merger-9"),
        ({"merge_cost": {"nodes": {"merger-l2-0": {"per_object": "1ms"}}}}, "merge_cost.nodes.merger-l2-0"),
        ({"merge_cost": {"nodes": {"producers-0": {"per_object": "1ms"}}}}, "merge_cost.nodes.producers-0"),
        ({"merge_cost": {"nodes": {"merger": {"per_object": "1ms"}}}}, "merge_cost.nodes.merger"),  # a role
        ({"merge_cost": {"nodes": {"viewer": {"per_object": "1 parsec"}}}}, "merge_cost.nodes.viewer.per_object"),
        ({"merge_cost": {"nodes": {"merger-0": {"per_MB": -1}}}}, "merge_cost.nodes.merger-0.per_MB"),
        ({"merge_cost": {"nodes": {"viewer": {"factor": 0.5}}}}, "merge_cost.nodes.viewer.factor"),
        ({"merge_cost": {"nodes": {"viewer": {"per_merge": "1ms"}}}}, "merge_cost.nodes.viewer.per_merge"),
        ({"merge_cost": {"nodes": {"viewer": "20ms"}}}, "merge_cost.nodes.viewer"),
        ({"merge_cost": {"nodes": ["viewer"]}}, "merge_cost.nodes"),
        ({"security": {"control": "on"}}, "security.control"),
        ({"security": {"data": "auto"}}, "security.data"),
        ({"security": {"transport": "curve"}}, "security.transport"),
        ({"security": "curve"}, "security"),
    ],
)
def test_errors_name_the_field(change, field):
    with pytest.raises(TopologyError) as err:
        from_dict(topology_dict(**change), "t.yaml")
    assert f"t.yaml: {field}:" in str(err.value)


def test_missing_required_fields():
    data = topology_dict()
    del data["producers"]
    with pytest.raises(TopologyError, match="producers: required"):
        from_dict(data)


def test_bad_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("run_id: x\nobject: {type: TH1F\n")
    with pytest.raises(TopologyError, match=r"bad.yaml: line \d+"):
        load(p)


def test_not_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(TopologyError, match="expected a mapping"):
        load(p)


def test_producer_processes_split_evenly():
    t = from_dict(topology_dict(producers={"count": 500, "rate": 100}))
    groups = t.producer_groups()
    assert len(groups) == 2 and sum(map(len, groups)) == 500
    assert sorted(p for g in groups for p in g) == list(range(500))


def test_merger_layers_spread_each_layer_over_the_next():
    t = from_dict(topology_dict(producers={"count": 8}, mergers=5, merger_layers=[2, 1]))
    assert t.layers() == [
        ("merger-0", "merger-1", "merger-2", "merger-3", "merger-4"),
        ("merger-l2-0", "merger-l2-1"),
        ("merger-l3-0",),
    ]
    assert t.all_mergers() == [*t.layers()[0], "merger-l2-0", "merger-l2-1", "merger-l3-0"]
    # contiguous and balanced, as producers over the first layer: round(2.5) = 2
    assert t.merger_inputs() == {
        "merger-l2-0": ("merger-0", "merger-1"),
        "merger-l2-1": ("merger-2", "merger-3", "merger-4"),
        "merger-l3-0": ("merger-l2-0", "merger-l2-1"),
    }
    assert t.downstream_of()["merger-4"] == "merger-l2-1" and t.downstream_of()["merger-l3-0"] == "viewer"
    assert t.layer_of()["merger-l2-1"] == 2 and t.layer_of()["merger-0"] == 1
    assert {n for n, role in t.node_roles().items() if role == "merger"} == set(t.all_mergers())
    # first-layer names are unchanged; the producers still go to the first layer only
    assert [len(m.producers) for m in t.mergers] == [2, 1, 2, 1, 2] and t.merger_layers == (2, 1)


def test_one_layer_by_default_and_equal_layers_allowed():
    t = from_dict(topology_dict(mergers=2))
    assert t.merger_layers == () and t.layers() == [("merger-0", "merger-1")] and t.merger_inputs() == {}
    t = from_dict(topology_dict(mergers=2, merger_layers=[2, 2, 1]))  # as many as below: one input each
    assert t.merger_inputs()["merger-l2-1"] == ("merger-1",) and t.merger_inputs()["merger-l4-0"] == (
        "merger-l3-0",
        "merger-l3-1",
    )


def test_cpus_may_name_upper_mergers():
    t = from_dict(topology_dict(mergers=2, merger_layers=[1], cpus={"merger": 0, "merger-l2-0": "0"}))
    assert t.cpus_for("merger-l2-0", "merger") == {0} and t.cpus_for("merger-1", "merger") == {0}
    assert t.cpus_text() == "merger=0 merger-l2-0=0"


@pytest.mark.parametrize(
    "value,nbytes", [(None, None), (1, 1), (4096, 4096), ("4kB", 4000), ("4KiB", 4096), (2**31 - 1, 2**31 - 1)]
)
def test_kernel_buffer_size_in_bytes_or_as_a_size(value, nbytes):
    data = topology_dict() if value is None else topology_dict(kernel_buffer_size=value)
    assert from_dict(data).kernel_buffer_size == nbytes


def test_kernel_buffer_size_is_recorded_only_when_set():
    from flowstat.harness.summary import parameters

    assert "kernel_buffer_bytes" not in parameters(from_dict(topology_dict()))
    assert parameters(from_dict(topology_dict(kernel_buffer_size="4KiB")))["kernel_buffer_bytes"] == 4096


@pytest.mark.parametrize(
    "given,per_object_s,per_byte_s,factor",
    [
        ({"per_object": "1ms"}, 1e-3, 0.0, 1.0),
        ({"per_object": 0.002, "per_MB": "250us"}, 2e-3, 250e-6 / 1e6, 1.0),
        ({"factor": 3}, 0.0, 0.0, 3.0),
        ({"per_object": "1.5 ms", "per_MB": "2ms", "factor": 2.5}, 1.5e-3, 2e-3 / 1e6, 2.5),
    ],
)
def test_merge_cost_is_read_in_seconds_per_object_and_per_byte(given, per_object_s, per_byte_s, factor):
    c = from_dict(topology_dict(merge_cost=given)).merge_cost
    assert (c.per_object_s, c.per_byte_s, c.factor) == pytest.approx((per_object_s, per_byte_s, factor), rel=1e-12)


def test_a_merge_cost_that_adds_nothing_is_none():
    assert from_dict(topology_dict()).merge_cost is None
    assert from_dict(topology_dict(merge_cost={"per_object": 0, "factor": 1})).merge_cost is None


def test_an_unknown_merge_cost_node_is_named_with_the_nodes_that_are():
    with pytest.raises(TopologyError) as err:
        from_dict(topology_dict(mergers=2, merge_cost={"nodes": {"merger-9": {"per_object": "5ms"}}}), "t.yaml")
    assert str(err.value) == "t.yaml: merge_cost.nodes.merger-9: no such merger or viewer (merger-0, merger-1, viewer)"


MS = MergeCost(per_object_s=1e-3)


@pytest.mark.parametrize(
    "given,default,nodes",
    [
        ({"per_object": "1ms"}, MS, {}),  # every merger alike, as before
        ({"nodes": {"merger-1": {"per_object": "5ms"}}}, None, {"merger-1": MergeCost(5e-3)}),
        (
            {"per_object": "1ms", "nodes": {"merger-1": {"per_object": "5ms"}, "viewer": {"per_object": "20ms"}}},
            MS,
            {"merger-1": MergeCost(5e-3), "viewer": MergeCost(20e-3)},
        ),
        (
            {"nodes": {"merger-l2-0": {"per_MB": "2ms", "factor": 3}}},  # a merger of an upper layer
            None,
            {"merger-l2-0": MergeCost(0.0, 2e-3 / 1e6, 3.0)},
        ),
        ({"per_object": "1ms", "nodes": {"merger-0": {"per_object": 0}}}, MS, {"merger-0": MergeCost()}),  # exempt
        ({"per_object": "1ms", "nodes": None}, MS, {}),
    ],
)
def test_merge_cost_nodes_are_read_beside_every_merger_s(given, default, nodes):
    t = from_dict(topology_dict(mergers=2, merger_layers=[1], merge_cost=given))
    assert t.merge_cost == default
    assert t.merge_cost_nodes.keys() == nodes.keys()
    for name, cost in nodes.items():
        got = t.merge_cost_nodes[name]
        assert (got.per_object_s, got.per_byte_s, got.factor) == pytest.approx(
            (cost.per_object_s, cost.per_byte_s, cost.factor), rel=1e-12
        )


def test_cost_of_a_node_is_its_own_else_every_merger_s_and_the_viewer_has_none_by_default():
    five, twenty = MergeCost(5e-3), MergeCost(20e-3)
    t = from_dict(
        topology_dict(
            mergers=3,
            merger_layers=[1],
            merge_cost={
                "per_object": "1ms",
                "nodes": {
                    "merger-1": {"per_object": "5ms"},
                    "merger-2": {"per_object": 0},
                    "viewer": {"per_object": "20ms"},
                },
            },
        )
    )
    assert {n: t.cost_of(n) for n in [*t.all_mergers(), "viewer", "producers-0"]} == {
        "merger-0": MS,
        "merger-1": five,
        "merger-2": None,  # its entry adds nothing: exempt from every merger's
        "merger-l2-0": MS,  # every layer's mergers take the default
        "viewer": twenty,
        "producers-0": None,
    }
    alone = from_dict(topology_dict(mergers=2, merge_cost={"nodes": {"merger-1": {"per_object": "5ms"}}}))
    assert [alone.cost_of(n) for n in ("merger-0", "merger-1", "viewer")] == [None, five, None]
    every = from_dict(topology_dict(mergers=2, merge_cost={"per_object": "1ms"}))
    assert [every.cost_of(n) for n in ("merger-0", "merger-1", "viewer")] == [MS, MS, None]
    assert from_dict(topology_dict()).cost_of("merger-0") is None


def test_merge_cost_nodes_are_recorded_in_pipeline_order_and_shown_in_the_label():
    from flowstat.harness.summary import parameters
    from flowstat.schema.run import label, merge_cost_text, validate

    t = from_dict(
        topology_dict(
            mergers=2,
            merge_cost={
                "per_object": "1ms",
                "nodes": {
                    "viewer": {"per_object": "20ms"},
                    "merger-1": {"per_object": "5ms", "factor": 2},
                    "merger-0": {},
                },
            },
        )
    )
    p = parameters(t)
    assert p["merge_cost_per_object_ms"] == 1.0
    assert p["merge_cost_nodes"] == "merger-0 none; merger-1 +5 ms/object x2; viewer +20 ms/object"
    assert merge_cost_text(p) == "merges +1 ms/object, node costs: " + p["merge_cost_nodes"]
    doc = {"run_id": "r", "started": "2026-01-01T00:00:00.000Z", "parameters": p}
    assert label(doc).endswith(", 2 mergers, merges +1 ms/object, node costs: " + p["merge_cost_nodes"])
    assert validate({**doc, "label": label(doc)}) == []
    only = parameters(from_dict(topology_dict(merge_cost={"nodes": {"viewer": {"per_MB": "3ms"}}})))
    assert "merge_cost_per_object_ms" not in only and merge_cost_text(only) == "node costs: viewer +3 ms/MB"
    assert "merge_cost_nodes" not in parameters(from_dict(topology_dict(merge_cost={"per_object": "1ms"})))


def test_control_channels_are_secured_whenever_a_node_binds_beyond_loopback_unless_told():
    auto = from_dict(topology_dict())
    assert (auto.control_security, auto.data_security) == ("auto", "off")
    assert not auto.curve_on_control(["127.0.0.1", "127.0.0.12", "::1"])
    assert auto.curve_on_control(["127.0.0.1", "10.1.2.3"])
    assert auto.curve_on_control(["@node"])  # a Slurm host's own address: not known to be loopback
    assert auto.curve_on_control(["0.0.0.0"]) and auto.curve_on_control(["node01"])
    forced = from_dict(topology_dict(security={"control": "curve"}))
    assert forced.curve_on_control(["127.0.0.1"])
    off = from_dict(topology_dict(security={"control": "off"}))
    assert not off.curve_on_control(["10.1.2.3"])


def test_inputs_of_names_who_each_merger_and_the_viewer_hear_from():
    # 8 producers in 3 processes ([0-2], [3-4], [5-7]) over 2 mergers ([0-3], [4-7]): producers-1 feeds both
    t = from_dict(topology_dict(producers={"count": 8, "processes": 3}, mergers=2, merger_layers=[1]))
    assert t.producer_groups() == [[0, 1, 2], [3, 4], [5, 6, 7]]
    assert t.inputs_of() == {
        "merger-0": ("producers-0", "producers-1"),
        "merger-1": ("producers-1", "producers-2"),
        "merger-l2-0": ("merger-0", "merger-1"),
        "viewer": ("merger-l2-0",),
    }
    assert from_dict(topology_dict(mergers=2)).inputs_of()["viewer"] == ("merger-0", "merger-1")


def test_a_node_s_cost_may_start_later_and_only_a_node_s():
    """merge_cost.nodes.NODE.after: a node that slows down during a run (issue 46: how soon the
    verdict names it); every merger's cost has no delay."""
    from flowstat.harness.summary import merge_cost_nodes_text

    t = from_dict(topology_dict(mergers=2, merge_cost={"nodes": {"merger-1": {"per_object": "10ms", "after": "5s"}}}))
    assert t.cost_of("merger-1") == MergeCost(10e-3, 0.0, 1.0, 5.0)
    assert merge_cost_nodes_text(t) == "merger-1 +10 ms/object after 5 s"
    assert MergeCost.from_config(t.cost_of("merger-1").config()) == t.cost_of("merger-1")
    with pytest.raises(TopologyError, match="after"):
        from_dict(topology_dict(merge_cost={"per_object": "1ms", "after": "5s"}))
    with pytest.raises(TopologyError, match=r"merge_cost\.nodes\.merger-0\.after"):
        from_dict(topology_dict(merge_cost={"nodes": {"merger-0": {"per_object": "1ms", "after": "soon"}}}))
