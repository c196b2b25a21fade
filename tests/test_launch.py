"""Where a run's devices go (flowstat.harness.launch): the topology's placement read and checked,
the hosts it needs, and every device's host, before any Slurm is asked. Runs across real hosts:
tests/test_slurm_cluster.py."""

from __future__ import annotations

import pytest

from flowstat.harness.launch import assign, hosts_needed
from flowstat.harness.orchestrator import device_names
from flowstat.harness.topology import TopologyError, from_dict
from support.common import topology_dict

NAMES = ["viewer", "merger-0", "merger-1", "producers-0", "producers-1", "producers-2"]


def test_by_default_the_mergers_and_viewer_get_a_host_and_producers_spread_over_two_more():
    assert hosts_needed({}, NAMES) == (3, [])
    assert hosts_needed({}, ["viewer", "merger-0", "producers-0"]) == (2, [])
    assert assign({}, NAMES, ["n1", "n2", "n3"]) == {
        "viewer": "n3",
        "merger-0": "n3",
        "merger-1": "n3",
        "producers-0": "n1",
        "producers-1": "n2",
        "producers-2": "n1",
    }


def test_named_hosts_are_kept_and_counts_take_hosts_from_either_end():
    spec = {"producers": ["a", "b", "c"], "mergers": ["d"], "viewer": ["a"]}
    assert hosts_needed(spec, NAMES) == (4, ["a", "b", "c", "d"])
    placed = assign(spec, NAMES, ["a", "b", "c", "d"])
    assert placed == {
        "viewer": "a",
        "merger-0": "d",
        "merger-1": "d",
        "producers-0": "a",
        "producers-1": "b",
        "producers-2": "c",
    }
    counted = assign({"producers": 1, "mergers": 2}, NAMES, ["h1", "h2", "h3"])
    assert [counted[n] for n in NAMES] == ["h2", "h2", "h3", "h1", "h1", "h1"]
    assert hosts_needed({"producers": 3, "mergers": 2}, NAMES) == (5, [])


def test_one_host_runs_everything_when_the_allocation_has_one():
    assert set(assign({}, NAMES, ["solo"]).values()) == {"solo"}


@pytest.mark.parametrize(
    "placement, message",
    [
        ({"producers": 0}, "placement.producers: expected at least 1 host, got 0"),
        ({"mergers": ["n1", "bad host"]}, "placement.mergers: expected host names"),
        ({"viewer": 2}, "placement.viewer: the viewer is one process"),
        ({"producers": True}, "placement.producers: expected host names or a count of hosts"),
        ({"workers": 2}, "placement"),
    ],
)
def test_a_placement_that_cannot_be_is_refused_naming_the_field(placement, message):
    with pytest.raises(TopologyError, match=message.replace(".", r"\.")):
        from_dict({**topology_dict(), "placement": placement})


def test_a_placement_is_read_as_lists_of_hosts_or_counts():
    topo = from_dict({**topology_dict(), "placement": {"producers": "n1, n2", "mergers": 1, "viewer": "n9"}})
    assert topo.placement == {"producers": ["n1", "n2"], "mergers": 1, "viewer": ["n9"]}
    assert "viewer" in device_names(topo) and not any(n.startswith("agent") for n in device_names(topo))
