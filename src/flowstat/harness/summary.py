"""The run summary (per-node figures and the no-loss proof, as JSON and as a table) and the run
document (flowstat.schema.run) that describes the run to the stores and dashboards."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowstat.proc import machine
from flowstat.proc.procfs import format_cpu_list
from flowstat.schema import run as run_schema
from flowstat.timeutil import iso_utc_ms
from flowstat.units import format_size

from .conservation import check_conservation
from .topology import VIEWER_NODE

if TYPE_CHECKING:
    from .topology import Topology


@dataclass(frozen=True)
class RunOutcome:
    """What a run ended with, as the orchestrator hands it to the summary."""

    run_id: str
    run_dir: Path
    finals: dict[str, dict[str, Any]]  # each device's final report, producers first, then each layer, the viewer
    logs: dict[str, Path]  # each device's log
    seconds: float  # from the start command to the stop signal
    failures: list[str]
    verdicts: dict[str, dict[str, Any]]  # each merger's online verdict
    affinity: list[dict[str, Any]]  # every process's CPUs (the run document's affinity)
    # which node held the flow back in the steady state (harness.flowwatch.FlowWatch.run_verdict)
    flow: dict[str, Any] = field(default_factory=dict)


def _node_row(fin: dict, seconds: float) -> dict[str, Any]:
    row = {
        k: fin.get(k)
        for k in (
            "node_id",
            "role",
            "layer",
            "objects_sent",
            "objects_received",
            "objects_merged",
            "merges",
            "send_overload_events",
            "receive_overload_events",
            "sequence_gaps",
            "average_merge_time",
            "mean_merge_time",
            "bytes_sent",
            "bytes_received",
            "objects_held",
            "malformed_messages",
            "input_latency",
        )
    }
    if fin["role"] == "merger":
        # first receive -> last merge: start-up and the final drain are in it (the verdict's rate is not)
        row["merged_objects_per_second_whole_run"] = fin.get("merged_objects_per_second")
    if fin["role"] == "producer":
        row["objects_sent_per_second"] = round(fin["objects_sent"] / seconds, 3) if seconds > 0 else 0.0
    return {k: v for k, v in row.items() if v is not None}


def build_summary(topo: Topology, run: RunOutcome, started_epoch: float) -> dict[str, Any]:
    finals, logs, seconds, verdicts = run.finals, run.logs, run.seconds, run.verdicts
    producers = [f for f in finals.values() if f["role"] == "producer"]
    mergers = [f for f in finals.values() if f["role"] == "merger"]
    viewer = next((f for f in finals.values() if f["role"] == "viewer"), None)
    conservation = check_conservation(topo, finals, producers, viewer) if producers and mergers else {"ok": False}
    failures = list(run.failures)
    nodes = [_node_row(f, seconds) for f in finals.values()]
    for row in nodes:
        if row["node_id"] in verdicts:
            row["merged_objects_per_second_steady"] = verdicts[row["node_id"]].get("merged_per_second")
    for name, why in conservation.get("failed_checks", {}).items():
        if name == "no_malformed_messages":
            why += (
                " (each node's log names the socket and what was wrong: "
                + ", ".join(str(logs[n]) for n, f in finals.items() if f.get("malformed_messages"))
                + ")"
            )
        failures.append(f"no-loss check failed: {name}: {why}")
    if not producers or not mergers:
        failures.append("no-loss check impossible: the producers and mergers did not all report their totals")
    return {
        "run_id": run.run_id,
        "run_dir": str(run.run_dir),
        "topology": topo.source,
        "started": iso_utc_ms(started_epoch),
        "finished": iso_utc_ms(),
        "seconds": round(seconds, 3),
        "parameters": parameters(topo),
        "machine": dict(machine.describe()),
        "affinity": run.affinity,
        "nodes": nodes,
        "online": verdicts,
        "flow": run.flow,
        "conservation": conservation,
        "viewer_output": (viewer or {}).get("output"),
        "failures": failures,
        "ok": bool(conservation.get("ok")) and not failures,
    }


def parameters(topo: Topology) -> dict[str, Any]:
    """The run document's parameters: what the topology asked for."""
    out = {
        "object_type": topo.obj.kind.name,
        "object_bytes": topo.obj.nbytes,
        "object_shape": list(topo.obj.shape),
        "producers": topo.n_producers,
        "rate_per_producer": topo.rate,
        "buffer_size": topo.buffer_size,
        "mergers": len(topo.all_mergers()),
        "merger_layers": list(topo.merger_layers),
        "producer_processes": topo.producer_processes,
        "duration_s": topo.duration,
    }
    if topo.cpus:
        out["cpus"] = topo.cpus_text()
    if topo.kernel_buffer_size is not None:
        out["kernel_buffer_bytes"] = topo.kernel_buffer_size
    if topo.merge_cost:
        c = topo.merge_cost
        out.update(
            merge_cost_per_object_ms=round(c.per_object_s * 1e3, 6),
            merge_cost_per_mb_ms=round(c.per_byte_s * 1e9, 6),
            merge_cost_factor=c.factor,
        )
    if topo.merge_cost_nodes:
        out["merge_cost_nodes"] = merge_cost_nodes_text(topo)
    return out


def merge_cost_nodes_text(topo: Topology) -> str:
    """merge_cost.nodes in one canonical line, in pipeline order (the mergers layer by layer, then
    the viewer), so that runs costed alike compare equal: "merger-1 +5 ms/object; viewer +20
    ms/object"; a node its entry exempts from merge_cost: "merger-0 none"."""
    order = [*topo.all_mergers(), VIEWER_NODE]
    costs = sorted(topo.merge_cost_nodes.items(), key=lambda item: order.index(item[0]))
    return "; ".join(
        f"{node} {run_schema.cost_text(c.per_object_s * 1e3, c.per_byte_s * 1e9, c.factor) or 'none'}"
        + (f" after {c.after_s:g} s" if c.after_s else "")
        for node, c in costs
    )


def run_machine() -> dict[str, Any]:
    """This machine as a run document records it (flowstat.schema.run's ``machine``)."""
    known = run_schema.schema()["properties"]["machine"]["properties"]
    return {k: v for k, v in machine.describe().items() if k in known}


def run_document(
    topo: Topology,
    run_id: str,
    started_epoch: float,
    summary: dict[str, Any] | None = None,
    nodes: list[str] | None = None,
    affinity: list[dict[str, Any]] | None = None,
    clocks: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The run as flowstat.schema.run describes it: at the start (what and where), or, given the
    run's summary, complete (when it finished, the verdict, the figures). ``affinity``: the CPUs
    each process may run on (Orchestrator.affinity)."""
    doc: dict[str, Any] = {
        "run_id": run_id,
        "topology": topo.source,
        "started": iso_utc_ms(started_epoch),
        "host": platform.node(),
        "machine": run_machine(),
        "parameters": parameters(topo),
    }
    doc["label"] = run_schema.label(doc)
    if topo.description:
        doc["description"] = topo.description
    if nodes:
        doc["nodes"] = nodes
    if affinity:
        doc["affinity"] = affinity
    doc["edges"] = [{"from": up, "to": node} for node, ups in topo.inputs_of().items() for up in ups]
    if clocks:
        doc["clocks"] = [{"node_id": name, **c} for name, c in clocks.items()]
    if summary is not None:
        c = summary["conservation"]
        totals = {
            key: sum(n.get(key) or 0 for n in summary["nodes"])
            for key in ("send_overload_events", "receive_overload_events", "sequence_gaps")
        }
        first = set(topo.layers()[0])
        # The producers' objects merged: by the first layer (an upper layer merges merged objects again).
        merged_in = sum(n.get("objects_merged") or 0 for n in summary["nodes"] if n["node_id"] in first)
        steady = {m: v for m, v in (summary.get("online") or {}).items() if m in first}
        doc["finished"] = summary["finished"]
        doc["verdict"] = {
            "ok": summary["ok"],
            "conserved": bool(c.get("ok")),
            "failed_checks": sorted(c.get("failed_checks", {})),
            "failures": summary["failures"],
            **_online_verdict(summary.get("online") or {}),
            **{k: v for k, v in (summary.get("flow") or {}).items() if k in ("flow", "held_back_by", "flow_evidence")},
        }
        doc["summary"] = {
            "seconds": summary["seconds"],
            **{k: c[k] for k in ("objects_sent", "objects_received", "merged_objects") if k in c},
            "merged_objects_per_second": round(merged_in / summary["seconds"], 3) if summary["seconds"] > 0 else 0.0,
            **totals,
            **_steady_figures(steady),
        }
    errors = run_schema.validate(doc)
    if errors:  # a bug of ours, not of the run: say where
        raise ValueError(f"run document of {run_id}: {'; '.join(errors[:3])}")
    return doc


def _online_verdict(verdicts: dict[str, dict]) -> dict[str, Any]:
    judged = {m: v for m, v in verdicts.items() if v["online"] is not None}
    if not judged or len(judged) < len(verdicts):
        return {}
    return {
        "online": all(v["online"] for v in judged.values()),
        "not_online": [f"{m}: {v['state']}: {'; '.join(v['why'])}" for m, v in judged.items() if not v["online"]],
    }


def _steady_figures(verdicts: dict[str, dict]) -> dict[str, Any]:
    """The steady state's figures over the mergers that were judged (harness.online). Given the
    first layer's verdicts only (run_document): the rates are of the producers' objects, which an
    upper layer would count again, merged."""
    judged = [v for v in verdicts.values() if v["online"] is not None]
    if not judged or len(judged) < len(verdicts):
        return {}
    out: dict[str, Any] = {
        "steady_merged_objects_per_second": round(sum(v["merged_per_second"] for v in judged), 1),
        "steady_offered_objects_per_second": round(sum(v["offered_per_second"] for v in judged), 1),
        "objects_in_flight_max": max(v["in_flight_max"] for v in judged),
    }
    worst = [v["latency_p99_ms_worst_second"] for v in judged if v["latency_p99_ms_worst_second"] is not None]
    if worst:
        out["input_latency_p99_ms_worst_second"] = max(worst)
    slopes = [v["vmrss_slope_mb_per_min"] for v in judged if v["vmrss_slope_mb_per_min"] is not None]
    if slopes:
        out["merger_vmrss_slope_mb_per_min_max"] = max(slopes)
    return out


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    if isinstance(value, (int, float)):
        return f"{value:,.0f}"
    return str(value)


def format_verdict(merger: str, v: dict[str, Any]) -> str:
    if v["online"] is None:
        return f"{merger}: no online verdict: {'; '.join(v['why'])}"
    head = f"{merger}: {'ONLINE' if v['online'] else v['state'].upper()}"
    figures = (
        f"merged {v['merged_per_second']:,.0f}/s of {v['offered_per_second']:,.0f}/s sent to it "
        f"({v['merged_to_offered'] or 0:.1%}) over {v['window_s'][0]:.0f}-{v['window_s'][1]:.0f} s; input "
        f"latency p99 {_fmt(v['latency_p99_ms_first_third'], 1)} -> {_fmt(v['latency_p99_ms_last_third'], 1)} ms "
        f"(worst second {_fmt(v['latency_p99_ms_worst_second'], 1)} ms); VmRSS "
        f"{_fmt(v['vmrss_slope_mb_per_min'], 1)} MB/min; in flight up to {v['in_flight_max']:,}"
    )
    return f"{head} - {figures}" + ("" if v["online"] else f"\n  why: {'; '.join(v['why'])}")


def mergers_text(p: dict[str, Any]) -> str:
    """ "2 merger(s)", or per layer for a layered run: "4+2+1 mergers" (as the run's label)."""
    return run_schema.mergers_text(p) if p.get("merger_layers") else f"{p['mergers']} merger(s)"


def _by_layer(c: dict[str, Any]) -> str:
    by_layer = c.get("merged_objects_by_layer") or []
    return f" (by layer: {', '.join(f'{n:,}' for n in by_layer)})" if len(by_layer) > 1 else ""


def format_flow(flow: dict[str, Any]) -> str:
    """The steady state's "held back by" verdict, in one line."""
    if flow["flow"] == "held_back":
        shares = ", ".join(f"{n} {flow['held_back_share'][n]:.0%} of the time judged" for n in flow["held_back_by"])
        return f"flow: held back by {shares}: {flow['flow_evidence']}"
    if flow["flow"] == "none":
        return f"flow: {flow['flow_evidence']}"
    return f"flow: unknown: {flow['flow_evidence']}"


def format_summary(s: dict[str, Any]) -> str:
    p = s["parameters"]
    lines = [
        f"run {s['run_id']}: {s['seconds']:.1f} s, {p['producers']} producers x {p['rate_per_producer']:g} obj/s "
        f"({'unlimited' if not p['rate_per_producer'] else 'paced'}), {p['object_type']} "
        f"{format_size(p['object_bytes'])}, buffer {p['buffer_size']}, {mergers_text(p)}"
        + (f", {run_schema.merge_cost_text(p)}" if run_schema.merge_cost_text(p) else ""),
        "",
        f"{'node':<16} {'role':<9} {'sent':>11} {'received':>11} {'merged':>11} {'overloads':>9} "
        f"{'gaps':>5} {'avg merge ms':>12} {'merged/s':>10} {'p99 wait ms':>11}",
    ]
    for n in s["nodes"]:
        overloads = (n.get("send_overload_events") or 0) + (n.get("receive_overload_events") or 0)
        lines.append(
            f"{n['node_id']:<16} {n['role']:<9} {_fmt(n.get('objects_sent')):>11} "
            f"{_fmt(n.get('objects_received')):>11} "
            f"{_fmt(n.get('objects_merged')):>11} {overloads:>9,} {_fmt(n.get('sequence_gaps')):>5} "
            f"{_fmt(n.get('average_merge_time'), 4):>12} {_fmt(n.get('merged_objects_per_second_steady'), 1):>10} "
            f"{_fmt((n.get('input_latency') or {}).get('input_latency_p99_ms'), 1):>11}"
        )
    lines.append(
        "(merged/s: in the steady state, start-up and drain excluded; p99 wait: input latency, sent -> taken, "
        "whole run)"
    )
    for merger, v in (s.get("online") or {}).items():
        lines.append(format_verdict(merger, v))
    if s.get("flow"):
        lines.append(format_flow(s["flow"]))
    c = s["conservation"]
    lines.append("")
    if "checks" in c:
        verdict = "OK" if c["ok"] else "FAILED"
        lines.append(
            f"no loss: {verdict} - {c['producers']} producers, sent {c['objects_sent']:,} = received "
            f"{c['objects_received']:,} = merged-in {c['objects_merged_in']:,}; "
            f"{c['merged_objects']:,} merged objects{_by_layer(c)}; entries sent {c['entries_sent']:,.0f}, "
            f"at the viewer {_fmt(c['entries_at_viewer'])}"
        )
        if c.get("producers_not_conserved"):
            lines.append(f"  producers not conserved (first 20): {c['producers_not_conserved']}")
        if c.get("merger_inputs_not_conserved"):
            lines.append(f"  merger inputs not conserved (first 20): {', '.join(c['merger_inputs_not_conserved'])}")
    launcher = s.get("launcher") or {}
    if launcher.get("launcher") == "slurm":
        hosts: dict[str, list[str]] = {}
        for process, host in (s.get("placement") or {}).items():
            hosts.setdefault(host, []).append(process)
        lines.append(f"across hosts (Slurm job {launcher.get('job_id')}):")
        lines += [f"  {host}: {', '.join(sorted(procs))}" for host, procs in sorted(hosts.items())]
    for failure in s["failures"]:
        lines.append(f"error: {failure}")
    for warning in s.get("warnings") or []:
        lines.append(f"warning: {warning}")
    for name, agent in (s.get("agent") or {}).items():
        if not isinstance(agent, dict):
            continue
        sinks = ", ".join(
            f"{url}: {v['delivered']:,} delivered" + (f", {v['spooled']} batches spooled" if v["spooled"] else "")
            for url, v in agent["sinks"].items()
        )
        lines.append(
            f"{name + ':':<15} {agent['samples']:,} samples, {agent.get('self_samples', 0):,} self-samples "
            f"({sinks})"
        )
    spooled = sum(
        v.get("spooled", 0) for a in (s.get("agent") or {}).values() if isinstance(a, dict) for v in a["sinks"].values()
    )
    if spooled:
        lines.append(
            f"still spooled:  {spooled} batches a sink did not take in time; send them once it is back: "
            f"flowstat agent --flush-spool {s['run_dir']}/spool"
        )
    if p.get("cpus"):
        lines.append(
            "pinned:         "
            + ", ".join(f"{a['node_id']} on CPU {format_cpu_list(a['cpus'])}" for a in s.get("affinity") or [])
        )
    if s.get("agent"):
        lines.append(f"run file:       {s['agent']['run_file']}")
    if s.get("viewer_output"):
        lines.append(f"merged objects: {s['viewer_output']}")
    lines.append(f"run directory:  {s['run_dir']} (summary.json, logs/)")
    return "\n".join(lines)
