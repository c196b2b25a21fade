"""The no-loss proof of a run: every object and every entry a producer sent was received, merged
and reached the viewer, layer by layer. Judged from the nodes' final counters alone, so that the
verdict can be checked on counters made up by hand (tests/test_conservation.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .topology import Topology


def _producer_counts(producers: list[dict]) -> tuple[dict[int, int], dict[int, float]]:
    """Per producer: objects sent, and the entries they held."""
    sent: dict[int, int] = {}
    entries: dict[int, float] = {}
    for fin in producers:
        for p in fin["per_producer"]:
            sent[p["producer"]] = p["sent"]
            entries[p["producer"]] = p["sent"] * fin["entries_per_object"]
    return sent, entries


def _first_layer_counts(mergers: list[dict]) -> tuple[dict[int, int], dict[int, int], dict[int, int | None]]:
    """Per producer, as its first-layer merger counted: received, merged-in, declared at end of stream."""
    received: dict[int, int] = {}
    merged_in: dict[int, int] = {}
    declared: dict[int, int | None] = {}
    for fin in mergers:
        pp = fin["per_producer"]
        for i, pid in enumerate(pp["producer"]):
            received[pid], merged_in[pid], declared[pid] = pp["received"][i], pp["merged_in"][i], pp["declared_sent"][i]
    return received, merged_in, declared


def _upper_layers(topo: Topology, finals: dict[str, dict]) -> list[str]:
    """The inputs of upper mergers whose counts differ: "lower->upper" for each input merger whose
    merged objects sent != declared at its end of stream != received != merged-in by its upper merger."""
    bad = []
    for upper, inputs in topo.merger_inputs().items():
        fin = finals.get(upper)
        pp = fin["per_producer"] if fin else {"producer": []}
        counted = {
            pp["producer"][i]: (pp["received"][i], pp["merged_in"][i], pp["declared_sent"][i])
            for i in range(len(pp["producer"]))
        }
        layer = topo.layers()[topo.layer_of()[upper] - 2]
        for lower in inputs:
            sent = (finals.get(lower) or {}).get("objects_sent")
            received, merged_in, declared = counted.get(layer.index(lower), (None, None, None))
            if sent is None or not sent == declared == received == merged_in:
                bad.append(f"{lower}->{upper}")
    return bad


def _entries_by_layer(topo: Topology, finals: dict[str, dict], entries_sent: dict[int, float]) -> list[str]:
    """The mergers whose merged objects do not hold the entries their inputs sent them: a
    first-layer merger's producers', an upper merger's input mergers'."""
    bad = []
    for m in topo.mergers:
        merged = (finals.get(m.node_id) or {}).get("entries_merged")
        if merged is None or merged != sum(entries_sent.get(p, 0.0) for p in m.producers):
            bad.append(m.node_id)
    for upper, inputs in topo.merger_inputs().items():
        merged = (finals.get(upper) or {}).get("entries_merged")
        if merged is None or merged != sum((finals.get(m) or {}).get("entries_merged") or 0.0 for m in inputs):
            bad.append(upper)
    return bad


def check_conservation(
    topo: Topology, finals: dict[str, dict], producers: list[dict], viewer: dict | None
) -> dict[str, Any]:
    """Check sent == received == merged-in for every producer, and for every input of an upper
    merger (layer by layer), and objects and entries end to end."""
    layers = [[finals[m] for m in layer if m in finals] for layer in topo.layers()]
    mergers = [fin for layer in layers for fin in layer]
    sent, entries_by_producer = _producer_counts(producers)
    entries_sent = sum(entries_by_producer.values())
    received, merged_in, declared = _first_layer_counts(layers[0])
    all_ids = sorted(set(sent) | set(received))
    bad = [
        pid
        for pid in all_ids
        if not (
            sent.get(pid) is not None and sent.get(pid) == declared.get(pid) == received.get(pid) == merged_in.get(pid)
        )
    ]
    bad_inputs = _upper_layers(topo, finals)
    bad_entries = _entries_by_layer(topo, finals, entries_by_producer)
    gaps = sum(m["sequence_gaps"] for m in mergers) + (viewer or {}).get("sequence_gaps", 0)
    reordered = sum(m["reordered_objects"] for m in mergers)
    merged_by_layer = [sum(m["merges"] for m in layer) for layer in layers]
    merged_objects = merged_by_layer[-1]  # those the viewer should have: the last layer's
    inputs_at_viewer = (viewer or {}).get("inputs_received")
    entries_at_viewer = (viewer or {}).get("entries_received")
    malformed = {name: f["malformed_messages"] for name, f in finals.items() if f.get("malformed_messages")}
    checks = {
        "every_producer_sent_eq_received_eq_merged": not bad and bool(all_ids),
        "every_merger_sent_eq_received_eq_merged": not bad_inputs,  # layers above the first; one layer: none
        "entries_conserved_in_every_layer": not bad_entries,
        "no_sequence_gaps": gaps == 0,
        "no_reordering": reordered == 0,
        "viewer_received_every_merged_object": viewer is not None and viewer["objects_received"] == merged_objects,
        "viewer_inputs_eq_objects_sent": inputs_at_viewer == sum(sent.values()),
        "entries_sent_eq_entries_at_viewer": entries_at_viewer == entries_sent,
        "merged_contents_eq_declared_entries": viewer is not None and viewer["content_mismatches"] == 0,
        "no_malformed_messages": not malformed,
    }
    merged_at_viewer = (viewer or {}).get("objects_received")
    why = {  # what each check's failure means here, in words
        "every_producer_sent_eq_received_eq_merged": f"sent, received and merged-in counts differ for producers "
        f"{bad[:10]}"
        if all_ids
        else "no producer reported",
        "every_merger_sent_eq_received_eq_merged": f"sent, received and merged-in counts differ between mergers "
        f"{', '.join(bad_inputs[:10])}",
        "entries_conserved_in_every_layer": f"the merged objects of {', '.join(bad_entries[:10])} do not hold the "
        f"entries their inputs sent them",
        "no_sequence_gaps": f"{gaps:,} objects missing from sequences",
        "no_reordering": f"{reordered:,} objects arrived out of order",
        "viewer_received_every_merged_object": f"the viewer received {merged_at_viewer} of {merged_objects:,} "
        f"merged objects",
        "viewer_inputs_eq_objects_sent": f"the merged objects at the viewer hold {inputs_at_viewer} inputs, "
        f"{sum(sent.values()):,} were sent",
        "entries_sent_eq_entries_at_viewer": f"{entries_sent:,.0f} entries sent, {entries_at_viewer} at the viewer",
        "merged_contents_eq_declared_entries": f"{(viewer or {}).get('content_mismatches')} merged objects whose "
        f"cells do not add up to their inputs' entries",
        "no_malformed_messages": "malformed messages dropped: " + ", ".join(f"{n} {c:,}" for n, c in malformed.items()),
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "failed_checks": {name: why[name] for name, passed in checks.items() if not passed},
        "producers": len(all_ids),
        "producers_not_conserved": bad[:20],
        "merger_inputs_not_conserved": bad_inputs[:20],
        "mergers_entries_not_conserved": bad_entries[:20],
        "objects_sent": sum(sent.values()),
        "objects_received": sum(received.values()),
        "objects_merged_in": sum(merged_in.values()),
        "merged_objects": merged_objects,
        "merged_objects_by_layer": merged_by_layer,
        "entries_sent": entries_sent,
        "entries_at_viewer": entries_at_viewer,
        "sequence_gaps": gaps,
        "reordered_objects": reordered,
    }
