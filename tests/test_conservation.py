"""The no-loss verdict (harness.conservation) on final counters made up by hand: a clean run is
conserved, and each way of losing, duplicating or misreporting an object fails the check it
belongs to, and only that check, saying why. The real runs that reach the same verdict are in
test_harness_runs.py and test_merger_layers.py."""

from __future__ import annotations

import copy

import pytest

from flowstat.harness.conservation import check_conservation
from flowstat.harness.topology import from_dict
from support.common import topology_dict

ENTRIES = 100.0  # per producer object


def finals_of(topo) -> tuple[dict[str, dict], list[dict], dict]:
    """The final counters of a run of ``topo`` that lost nothing: producer p sent 10 + p objects,
    each merger merged as often as its busiest input sent, and the viewer got every merged object
    of the last layer."""
    finals: dict[str, dict] = {}
    producers = {
        "role": "producer",
        "entries_per_object": ENTRIES,
        "per_producer": [{"producer": p, "sent": 10 + p} for p in range(topo.n_producers)],
    }
    sent = {p["producer"]: p["sent"] for p in producers["per_producer"]}
    for m in topo.mergers:
        counts = [sent[p] for p in m.producers]
        finals[m.node_id] = {
            "role": "merger",
            "merges": max(counts),
            "objects_sent": max(counts),
            "sequence_gaps": 0,
            "reordered_objects": 0,
            "entries_merged": sum(counts) * ENTRIES,
            "per_producer": {
                "producer": list(m.producers),
                "received": list(counts),
                "merged_in": list(counts),
                "declared_sent": list(counts),
            },
        }
    for upper, inputs in topo.merger_inputs().items():
        layer = topo.layers()[topo.layer_of()[upper] - 2]
        counts = [finals[m]["objects_sent"] for m in inputs]
        finals[upper] = {
            "role": "merger",
            "merges": max(counts),
            "objects_sent": max(counts),
            "sequence_gaps": 0,
            "reordered_objects": 0,
            "entries_merged": sum(finals[m]["entries_merged"] for m in inputs),
            "per_producer": {
                "producer": [layer.index(m) for m in inputs],
                "received": list(counts),
                "merged_in": list(counts),
                "declared_sent": list(counts),
            },
        }
    last = topo.layers()[-1]
    viewer = {
        "role": "viewer",
        "objects_received": sum(finals[m]["merges"] for m in last),
        "inputs_received": sum(sent.values()),
        "entries_received": sum(sent.values()) * ENTRIES,
        "content_mismatches": 0,
        "sequence_gaps": 0,
    }
    finals["viewer"] = viewer
    return finals, [producers], viewer


def failed(result: dict) -> set[str]:
    return {name for name, passed in result["checks"].items() if not passed}


@pytest.fixture
def one_merger():
    return from_dict(topology_dict(producers={"count": 3, "rate": 10}, mergers=1))


@pytest.fixture
def layered():
    """4 producers on 2 first-layer mergers, merged again by one upper merger."""
    return from_dict(topology_dict(producers={"count": 4, "rate": 10}, mergers=2, merger_layers=[1]))


@pytest.mark.parametrize("name", ["one_merger", "layered"])
def test_a_run_that_lost_nothing_is_conserved_with_its_totals(name, request):
    topo = request.getfixturevalue(name)
    result = check_conservation(topo, *finals_of(topo))
    assert result["ok"] is True and failed(result) == set() and result["failed_checks"] == {}
    n = topo.n_producers
    sent = sum(10 + p for p in range(n))
    assert result["producers"] == n
    assert result["objects_sent"] == result["objects_received"] == result["objects_merged_in"] == sent
    assert result["entries_sent"] == result["entries_at_viewer"] == sent * ENTRIES
    assert result["producers_not_conserved"] == result["merger_inputs_not_conserved"] == []
    assert result["mergers_entries_not_conserved"] == []
    assert result["sequence_gaps"] == 0 and result["reordered_objects"] == 0
    if name == "one_merger":
        assert result["merged_objects_by_layer"] == [12] and result["merged_objects"] == 12
    else:  # m0 merges producers 0-1 (max 11), m1 producers 2-3 (max 13); the upper merges 13 times
        assert result["merged_objects_by_layer"] == [11 + 13, 13] and result["merged_objects"] == 13


def _first_layer(finals, topo, merger=0):
    return finals[topo.mergers[merger].node_id]["per_producer"]


# Each way a producer's objects go missing or are counted twice: the producer is named, and the
# checks that must fail are exactly these (the others hold: each check judges one thing).
PRODUCER_FAULTS = {
    "lost on the way (received one less)": (
        lambda f, topo: _first_layer(f, topo)["received"].__setitem__(1, 10),
        {"every_producer_sent_eq_received_eq_merged"},
    ),
    "received twice": (
        lambda f, topo: _first_layer(f, topo)["received"].__setitem__(1, 12),
        {"every_producer_sent_eq_received_eq_merged"},
    ),
    "received but not merged": (
        lambda f, topo: _first_layer(f, topo)["merged_in"].__setitem__(1, 10),
        {"every_producer_sent_eq_received_eq_merged"},
    ),
    "merged twice": (
        lambda f, topo: _first_layer(f, topo)["merged_in"].__setitem__(1, 12),
        {"every_producer_sent_eq_received_eq_merged"},
    ),
    "declared other than it sent": (
        lambda f, topo: _first_layer(f, topo)["declared_sent"].__setitem__(1, 12),
        {"every_producer_sent_eq_received_eq_merged"},
    ),
    "never declared its end (killed)": (
        lambda f, topo: _first_layer(f, topo)["declared_sent"].__setitem__(1, None),
        {"every_producer_sent_eq_received_eq_merged"},
    ),
}


@pytest.mark.parametrize("fault", PRODUCER_FAULTS)
def test_a_producer_lost_duplicated_or_mismatched_is_named(one_merger, fault):
    finals, producers, viewer = finals_of(one_merger)
    change, checks = PRODUCER_FAULTS[fault]
    change(finals, one_merger)
    result = check_conservation(one_merger, finals, producers, viewer)
    assert result["ok"] is False and failed(result) == checks
    assert result["producers_not_conserved"] == [1]
    assert "[1]" in result["failed_checks"]["every_producer_sent_eq_received_eq_merged"]


def test_a_producer_whose_count_its_merger_never_reported_is_named(one_merger):
    finals, producers, viewer = finals_of(one_merger)
    producers[0]["per_producer"].append({"producer": 7, "sent": 0})  # a producer no merger knows of
    result = check_conservation(one_merger, finals, producers, viewer)
    assert result["ok"] is False and result["producers_not_conserved"] == [7]
    assert result["producers"] == 4


def test_a_producer_only_its_merger_knows_is_named(one_merger):
    finals, producers, viewer = finals_of(one_merger)
    producers[0]["per_producer"].pop()  # producer 2 never reported what it sent
    result = check_conservation(one_merger, finals, producers, viewer)
    assert result["ok"] is False and result["producers_not_conserved"] == [2]
    assert "every_producer_sent_eq_received_eq_merged" in failed(result)


def test_no_producer_at_all_is_not_conserved(one_merger):
    finals, _, viewer = finals_of(one_merger)
    for name in [m.node_id for m in one_merger.mergers]:
        finals[name]["per_producer"] = {"producer": [], "received": [], "merged_in": [], "declared_sent": []}
    result = check_conservation(one_merger, finals, [{"per_producer": [], "entries_per_object": ENTRIES}], viewer)
    assert result["ok"] is False and "every_producer_sent_eq_received_eq_merged" in failed(result)
    assert result["failed_checks"]["every_producer_sent_eq_received_eq_merged"] == "no producer reported"


def _merger(finals, topo, key, value, merger=0):
    finals[topo.mergers[merger].node_id][key] = value


def _viewer(finals, key, value):
    finals["viewer"][key] = value


# One fault per check, whose failure says what it counted.
CHECK_FAULTS = {
    "sequence gap at a merger": (
        lambda f, t: _merger(f, t, "sequence_gaps", 2),
        "no_sequence_gaps",
        "2 objects missing from sequences",
    ),
    "sequence gap at the viewer": (
        lambda f, t: _viewer(f, "sequence_gaps", 1),
        "no_sequence_gaps",
        "1 objects missing from sequences",
    ),
    "reordering": (
        lambda f, t: _merger(f, t, "reordered_objects", 3),
        "no_reordering",
        "3 objects arrived out of order",
    ),
    "viewer missed a merged object": (
        lambda f, t: _viewer(f, "objects_received", 11),
        "viewer_received_every_merged_object",
        "the viewer received 11 of 12 merged",
    ),
    "viewer got one more": (
        lambda f, t: _viewer(f, "objects_received", 13),
        "viewer_received_every_merged_object",
        "the viewer received 13 of 12 merged",
    ),
    "merged objects hold fewer inputs": (
        lambda f, t: _viewer(f, "inputs_received", 32),
        "viewer_inputs_eq_objects_sent",
        "hold 32 inputs, 33 were sent",
    ),
    "entries lost before the viewer": (
        lambda f, t: _viewer(f, "entries_received", 3299.0),
        "entries_sent_eq_entries_at_viewer",
        "3,300 entries sent, 3299.0 at the viewer",
    ),
    "merged contents wrong": (
        lambda f, t: _viewer(f, "content_mismatches", 1),
        "merged_contents_eq_declared_entries",
        "1 merged objects whose cells",
    ),
    "entries lost in a merger": (
        lambda f, t: _merger(f, t, "entries_merged", 3200.0),
        "entries_conserved_in_every_layer",
        "the merged objects of merger-0 do not hold",
    ),
    "malformed messages dropped": (
        lambda f, t: _merger(f, t, "malformed_messages", 4),
        "no_malformed_messages",
        "malformed messages dropped: merger-0 4",
    ),
}


@pytest.mark.parametrize("fault", CHECK_FAULTS)
def test_each_check_fails_alone_and_says_why(one_merger, fault):
    finals, producers, viewer = finals_of(one_merger)
    change, check, why = CHECK_FAULTS[fault]
    change(finals, one_merger)
    result = check_conservation(one_merger, finals, producers, finals["viewer"])
    assert result["ok"] is False and failed(result) == {check}
    assert list(result["failed_checks"]) == [check] and why in result["failed_checks"][check]


def test_the_totals_count_what_each_counter_says(one_merger):
    finals, producers, viewer = finals_of(one_merger)
    _merger(finals, one_merger, "sequence_gaps", 2)
    _viewer(finals, "sequence_gaps", 1)
    _merger(finals, one_merger, "reordered_objects", 3)
    _first_layer(finals, one_merger)["received"][0] = 9
    _first_layer(finals, one_merger)["merged_in"][2] = 11
    result = check_conservation(one_merger, finals, producers, viewer)
    assert result["sequence_gaps"] == 3 and result["reordered_objects"] == 3
    assert result["objects_received"] == 33 - 1 and result["objects_merged_in"] == 33 - 1
    assert result["producers_not_conserved"] == [0, 2]


def test_no_viewer_fails_every_viewer_check(one_merger):
    finals, producers, _ = finals_of(one_merger)
    del finals["viewer"]
    result = check_conservation(one_merger, finals, producers, None)
    assert failed(result) == {
        "viewer_received_every_merged_object",
        "viewer_inputs_eq_objects_sent",
        "entries_sent_eq_entries_at_viewer",
        "merged_contents_eq_declared_entries",
    }
    assert (
        "the viewer received None of 12 merged objects"
        in result["failed_checks"]["viewer_received_every_merged_object"]
    )


def test_a_merger_that_never_reported_fails_the_entries_check(one_merger):
    finals, producers, viewer = finals_of(one_merger)
    del finals["merger-0"]
    result = check_conservation(one_merger, finals, producers, viewer)
    assert result["ok"] is False and result["mergers_entries_not_conserved"] == ["merger-0"]


# -- merger layers: the inputs of an upper merger, and the entries in every layer --

LAYER_FAULTS = {
    "upper received one less from merger-0": ("received", 0, 10),
    "upper merged one more from merger-1": ("merged_in", 1, 14),
    "merger-0 declared one more than it sent": ("declared_sent", 0, 12),
}


@pytest.mark.parametrize("fault", LAYER_FAULTS)
def test_an_upper_merger_input_that_differs_is_named(layered, fault):
    finals, producers, viewer = finals_of(layered)
    key, index, value = LAYER_FAULTS[fault]
    upper = layered.all_mergers()[-1]
    finals[upper]["per_producer"][key][index] = value
    result = check_conservation(layered, finals, producers, viewer)
    lower = layered.layers()[0][index]
    assert result["ok"] is False and failed(result) == {"every_merger_sent_eq_received_eq_merged"}
    assert result["merger_inputs_not_conserved"] == [f"{lower}->{upper}"]
    assert f"{lower}->{upper}" in result["failed_checks"]["every_merger_sent_eq_received_eq_merged"]


def test_a_lower_merger_that_sent_other_than_its_upper_counted_is_named(layered):
    finals, producers, viewer = finals_of(layered)
    first = layered.layers()[0][1]
    finals[first]["objects_sent"] += 1
    result = check_conservation(layered, finals, producers, viewer)
    assert result["merger_inputs_not_conserved"] == [f"{first}->{layered.all_mergers()[-1]}"]


def test_an_upper_merger_that_never_reported_names_all_its_inputs(layered):
    finals, producers, viewer = finals_of(layered)
    upper = layered.all_mergers()[-1]
    del finals[upper]
    result = check_conservation(layered, finals, producers, viewer)
    assert result["merger_inputs_not_conserved"] == [f"{m}->{upper}" for m in layered.layers()[0]]
    assert upper in result["mergers_entries_not_conserved"]


def test_entries_lost_in_an_upper_layer_name_the_upper_merger(layered):
    finals, producers, viewer = finals_of(layered)
    upper = layered.all_mergers()[-1]
    finals[upper]["entries_merged"] -= ENTRIES
    result = check_conservation(layered, finals, producers, viewer)
    assert failed(result) == {"entries_conserved_in_every_layer"}
    assert result["mergers_entries_not_conserved"] == [upper]


def test_the_verdict_does_not_change_the_counters_it_is_given(layered):
    finals, producers, viewer = finals_of(layered)
    before = copy.deepcopy((finals, producers))
    check_conservation(layered, finals, producers, viewer)
    assert (finals, producers) == before


def test_a_producer_that_never_started_fails_its_own_check_only(one_merger):
    """Producer 2 neither reported nor sent: its merger got nothing from it, so the entries it
    merged are those of the others, as they should be."""
    finals, producers, viewer = finals_of(one_merger)
    producers[0]["per_producer"].pop()
    pp = _first_layer(finals, one_merger)
    pp["received"][2] = pp["merged_in"][2] = 0
    pp["declared_sent"][2] = None
    finals["merger-0"]["entries_merged"] = (10 + 11) * ENTRIES
    viewer.update(inputs_received=21, entries_received=21 * ENTRIES)
    result = check_conservation(one_merger, finals, producers, viewer)
    assert failed(result) == {"every_producer_sent_eq_received_eq_merged"}
    assert result["producers_not_conserved"] == [2]


def test_a_lower_merger_that_never_reported_is_named_and_its_upper_judged_on_the_rest(layered):
    finals, producers, viewer = finals_of(layered)
    lower, upper = layered.layers()[0][0], layered.all_mergers()[-1]
    finals[upper]["entries_merged"] -= finals[lower]["entries_merged"]
    del finals[lower]
    result = check_conservation(layered, finals, producers, viewer)
    assert result["mergers_entries_not_conserved"] == [lower]
    assert result["merger_inputs_not_conserved"] == [f"{lower}->{upper}"]


def test_many_failures_are_listed_up_to_twenty_and_said_up_to_ten():
    topo = from_dict(topology_dict(producers={"count": 25, "rate": 10}, mergers=1))
    finals, producers, viewer = finals_of(topo)
    pp = _first_layer(finals, topo)
    pp["received"] = [n - 1 for n in pp["received"]]
    result = check_conservation(topo, finals, producers, viewer)
    assert result["producers_not_conserved"] == list(range(20))
    assert result["failed_checks"]["every_producer_sent_eq_received_eq_merged"] == (
        f"sent, received and merged-in counts differ for producers {list(range(10))}"
    )


def test_failures_of_several_nodes_are_said_in_a_list():
    topo = from_dict(topology_dict(producers={"count": 22, "rate": 10}, mergers=22, merger_layers=[1]))
    finals, producers, viewer = finals_of(topo)
    upper = topo.all_mergers()[-1]
    firsts = topo.layers()[0]
    finals[upper]["per_producer"]["received"] = [n + 1 for n in finals[upper]["per_producer"]["received"]]
    for m in firsts:
        finals[m]["entries_merged"] += 1
    finals[firsts[0]]["malformed_messages"] = 1
    finals[firsts[1]]["malformed_messages"] = 2000
    result = check_conservation(topo, finals, producers, viewer)
    why = result["failed_checks"]
    assert why["every_merger_sent_eq_received_eq_merged"] == (
        "sent, received and merged-in counts differ between mergers " + ", ".join(f"{m}->{upper}" for m in firsts[:10])
    )
    assert why["entries_conserved_in_every_layer"] == (
        f"the merged objects of {', '.join(firsts[:10])} do not hold the entries their inputs sent them"
    )
    assert why["no_malformed_messages"] == f"malformed messages dropped: {firsts[0]} 1, {firsts[1]} 2,000"
    assert result["merger_inputs_not_conserved"] == [f"{m}->{upper}" for m in firsts[:20]]
    assert result["mergers_entries_not_conserved"] == list(firsts[:20])
