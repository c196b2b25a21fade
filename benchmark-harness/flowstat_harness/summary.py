"""The run summary: per-node figures and the no-loss proof, as JSON and as a table."""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING, Any

from flowstat.timeutil import iso_utc_ms
from flowstat.units import format_size

if TYPE_CHECKING:
    from .orchestrator import Orchestrator
    from .topology import Topology


def _conservation(finals: dict[str, dict], producers: list[dict], mergers: list[dict],
                  viewer: dict | None) -> dict[str, Any]:
    """Check sent == received == merged-in for every producer, and entries end to end."""
    sent: dict[int, int] = {}
    entries_sent = 0.0
    for fin in producers:
        for p in fin["per_producer"]:
            sent[p["producer"]] = p["sent"]
        entries_sent += fin["objects_sent"] * fin["entries_per_object"]
    received: dict[int, int] = {}
    merged_in: dict[int, int] = {}
    declared: dict[int, int | None] = {}
    for fin in mergers:
        pp = fin["per_producer"]
        for i, pid in enumerate(pp["producer"]):
            received[pid], merged_in[pid], declared[pid] = pp["received"][i], pp["merged_in"][i], pp["declared_sent"][i]
    all_ids = sorted(set(sent) | set(received))
    bad = [pid for pid in all_ids
           if not (sent.get(pid) is not None and sent.get(pid) == declared.get(pid) == received.get(pid) == merged_in.get(pid))]
    gaps = sum(m["sequence_gaps"] for m in mergers) + (viewer or {}).get("sequence_gaps", 0)
    reordered = sum(m["reordered_objects"] for m in mergers)
    merged_objects = sum(m["merges"] for m in mergers)
    inputs_at_viewer = (viewer or {}).get("inputs_received")
    entries_at_viewer = (viewer or {}).get("entries_received")
    checks = {
        "every_producer_sent_eq_received_eq_merged": not bad and bool(all_ids),
        "no_sequence_gaps": gaps == 0,
        "no_reordering": reordered == 0,
        "viewer_received_every_merged_object": viewer is not None and viewer["objects_received"] == merged_objects,
        "viewer_inputs_eq_objects_sent": inputs_at_viewer == sum(sent.values()),
        "entries_sent_eq_entries_at_viewer": entries_at_viewer == entries_sent,
        "merged_contents_eq_declared_entries": viewer is not None and viewer["content_mismatches"] == 0,
        "no_malformed_messages": all(f.get("malformed_messages", 0) == 0 for f in finals.values()),
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "producers": len(all_ids),
        "producers_not_conserved": bad[:20],
        "objects_sent": sum(sent.values()),
        "objects_received": sum(received.values()),
        "objects_merged_in": sum(merged_in.values()),
        "merged_objects": merged_objects,
        "entries_sent": entries_sent,
        "entries_at_viewer": entries_at_viewer,
        "sequence_gaps": gaps,
        "reordered_objects": reordered,
    }


def _node_row(fin: dict, seconds: float) -> dict[str, Any]:
    row = {k: fin.get(k) for k in (
        "node_id", "role", "objects_sent", "objects_received", "objects_merged", "merges",
        "send_overload_events", "receive_overload_events", "sequence_gaps", "average_merge_time",
        "mean_merge_time", "merged_objects_per_second", "bytes_sent", "bytes_received", "backlog",
        "malformed_messages")}
    if fin["role"] == "producer":
        row["objects_sent_per_second"] = round(fin["objects_sent"] / seconds, 3) if seconds > 0 else 0.0
    return {k: v for k, v in row.items() if v is not None}


def build_summary(topo: "Topology", orch: "Orchestrator", started_epoch: float) -> dict[str, Any]:
    order = {"producer": 0, "merger": 1, "viewer": 2}
    finals = {d.name: d.final for d in sorted(orch.devices, key=lambda d: order[d.role]) if d.final is not None}
    producers = [f for f in finals.values() if f["role"] == "producer"]
    mergers = [f for f in finals.values() if f["role"] == "merger"]
    viewer = next((f for f in finals.values() if f["role"] == "viewer"), None)
    seconds = max(0.0, orch.stopped_at - orch.started_at)
    conservation = _conservation(finals, producers, mergers, viewer) if producers and mergers else {"ok": False}
    failures = list(orch.failures)
    if orch.interrupts:
        failures.append("interrupted by the user")
    return {
        "run_id": orch.run_id,
        "run_dir": str(orch.run_dir),
        "topology": topo.source,
        "started": iso_utc_ms(started_epoch),
        "seconds": round(seconds, 3),
        "parameters": {
            "object_type": topo.obj.kind.name, "object_bytes": topo.obj.nbytes, "object_shape": list(topo.obj.shape),
            "producers": topo.n_producers, "rate_per_producer": topo.rate, "buffer_size": topo.buffer_size,
            "mergers": len(topo.mergers), "producer_processes": topo.producer_processes,
        },
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "nodes": [_node_row(f, seconds) for f in finals.values()],
        "conservation": conservation,
        "viewer_output": (viewer or {}).get("output"),
        "failures": failures,
        "ok": bool(conservation.get("ok")) and not failures,
    }


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    if isinstance(value, (int, float)):
        return f"{value:,.0f}"
    return str(value)


def format_summary(s: dict[str, Any]) -> str:
    p = s["parameters"]
    lines = [
        f"run {s['run_id']}: {s['seconds']:.1f} s, {p['producers']} producers x {p['rate_per_producer']:g} obj/s "
        f"({'unlimited' if not p['rate_per_producer'] else 'paced'}), {p['object_type']} "
        f"{format_size(p['object_bytes'])}, buffer {p['buffer_size']}, {p['mergers']} merger(s)",
        "",
        f"{'node':<16} {'role':<9} {'sent':>11} {'received':>11} {'merged':>11} {'overloads':>9} "
        f"{'gaps':>5} {'avg merge ms':>12} {'merged/s':>10}",
    ]
    for n in s["nodes"]:
        overloads = (n.get("send_overload_events") or 0) + (n.get("receive_overload_events") or 0)
        lines.append(
            f"{n['node_id']:<16} {n['role']:<9} {_fmt(n.get('objects_sent')):>11} {_fmt(n.get('objects_received')):>11} "
            f"{_fmt(n.get('objects_merged')):>11} {overloads:>9,} {_fmt(n.get('sequence_gaps')):>5} "
            f"{_fmt(n.get('average_merge_time'), 4):>12} {_fmt(n.get('merged_objects_per_second'), 1):>10}")
    c = s["conservation"]
    lines.append("")
    if "checks" in c:
        verdict = "OK" if c["ok"] else "FAILED"
        lines.append(f"no loss: {verdict} - {c['producers']} producers, sent {c['objects_sent']:,} = received "
                     f"{c['objects_received']:,} = merged-in {c['objects_merged_in']:,}; "
                     f"{c['merged_objects']:,} merged objects; entries sent {c['entries_sent']:,.0f}, "
                     f"at the viewer {_fmt(c['entries_at_viewer'])}")
        for name, passed in c["checks"].items():
            if not passed:
                lines.append(f"  check failed: {name}")
        if c.get("producers_not_conserved"):
            lines.append(f"  producers not conserved (first 20): {c['producers_not_conserved']}")
    for failure in s["failures"]:
        lines.append(f"error: {failure}")
    for name, agent in (s.get("agent") or {}).items():
        if not isinstance(agent, dict):
            continue
        sinks = ", ".join(f"{url}: {v['delivered']:,} delivered" + (f", {v['spooled']} batches spooled" if v["spooled"] else "")
                          for url, v in agent["sinks"].items())
        lines.append(f"{name + ':':<15} {agent['samples']:,} samples ({sinks})")
    if s.get("agent"):
        lines.append(f"run file:       {s['agent']['run_file']}")
    if s.get("viewer_output"):
        lines.append(f"merged objects: {s['viewer_output']}")
    lines.append(f"run directory:  {s['run_dir']} (summary.json, logs/)")
    return "\n".join(lines)
