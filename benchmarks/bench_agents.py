#!/usr/bin/env python3
"""Agent benchmarks (issue 3), each figure next to baselines measured in the same run.

cost_ratio       The C agent's CPU per process-sample against the floor's, in R interleaved rounds
                 (default 6): in each round the floor, the C agent and, given --reference-agent, an
                 older build each watch the same N processes (default 1,000) alone, at 4 Hz, for W
                 seconds (default 15) after 3 s of start-up, in an order rotated round by round. The
                 agents run in two configurations (--ratio-configs): "soak", as the soak runs them
                 (--pattern and --rescan 5, a spool, both of the soak's sinks, InfluxDB line protocol
                 over HTTP and Elasticsearch's _bulk, sent to a loopback endpoint that takes and drops
                 them: flowstat_lab.store_acceptor, what sending costs the agent, not what storing
                 costs a store), and "file", as cpu_per_sample runs them (--pid, one file sink). CPU
                 is the sum of the process's threads' schedstat run time over the window. Each round
                 gives a ratio to that round's floor; the median and the spread (min, max) are printed.
                 --perf adds a perf profile of the agent (per library, the heaviest functions).
cpu_per_sample   ONE run: the same N idle processes (default 500) watched at 1 Hz for D seconds
                 (default 60) at once by Telegraf's inputs.procstat (pid_finder=native,
                 properties=["cpu","memory"]), the C agent, the Python agent and a bare C loop of
                 held-fd preads (the floor). CPU (sum of /proc/PID/task/*/schedstat run time, ns resolution) over the
                 window, divided by the process-samples it took.
rss_soak         The agents' VmRSS while watching 1,000 processes at 10 Hz for S seconds (default
                 600), sampled every 10 s: it must be flat.
interval_10ms    Each agent sampling one idle process every 10 ms for R rounds (default 3000): the
                 span of its timestamps against (R - 1) x 10 ms (scheduled from the start, it must
                 not stretch with the work done), and the spread of the gaps between rounds.

Usage: benchmarks/bench_agents.py [--quick] [--targets N] [--seconds D] [--soak S] [--rounds R]
       [--ratio-rounds R] [--reference-agent EXE] [--perf] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flowstat.proc.procfs import cpu_seconds, vmrss_kb

ROOT = Path(__file__).resolve().parents[1]
C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
TARGET_ARG = "86399.5"  # the idle targets are `sleep 86399.5`: easy to find, nothing else looks like them


def spawn_targets(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sleep", TARGET_ARG]) for _ in range(n)]


def build_floor(tmp: Path) -> Path:
    exe = tmp / "proc_floor"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(ROOT / "benchmarks" / "floor" / "proc_floor.c")], check=True)
    return exe


def telegraf_config(tmp: Path, out: Path, interval: str) -> Path:
    conf = tmp / "telegraf.conf"
    conf.write_text(f"""
[agent]
  interval = "{interval}"
  round_interval = true
  flush_interval = "{interval}"
  omit_hostname = false
[[inputs.procstat]]
  pattern = "sleep {TARGET_ARG}"
  pid_finder = "native"
  properties = ["cpu", "memory"]
  tag_with = ["pid"]
[[outputs.file]]
  files = ["{out}"]
  data_format = "influx"
""")
    return conf


def bench_cpu(tmp: Path, n: int, seconds: float, telegraf: str | None) -> dict:
    targets = spawn_targets(n)
    pids = [str(p.pid) for p in targets]
    floor = build_floor(tmp)
    monitors: dict[str, subprocess.Popen] = {}
    outputs = {name: tmp / f"{name}.lp" for name in ("telegraf", "c_agent", "python_agent")}
    total = seconds + 10  # 5 s to settle before the window, 5 s of margin after it
    pid_args = [a for pid in pids for a in ("--pid", pid)]
    try:
        if telegraf:
            monitors["telegraf"] = subprocess.Popen(
                [telegraf, "--config", str(telegraf_config(tmp, outputs["telegraf"], "1s"))],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        monitors["c_agent"] = subprocess.Popen(
            [
                str(C_AGENT),
                *pid_args,
                "--interval",
                "1",
                "--duration",
                str(total),
                "--sink",
                f"file://{outputs['c_agent']}",
                "--quiet",
            ]
        )
        monitors["python_agent"] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowstat.agent",
                *pid_args,
                "--interval",
                "1",
                "--duration",
                str(total),
                "--sink",
                f"file://{outputs['python_agent']}",
                "--quiet",
            ]
        )
        monitors["floor"] = subprocess.Popen([str(floor), "1", str(total), *pids], stdout=subprocess.PIPE, text=True)
        time.sleep(5)  # start-up (imports, first /proc scan) is not what is measured
        start = {k: cpu_seconds(p.pid) for k, p in monitors.items()}
        lines0 = {k: sum(1 for _ in open(f)) if f.exists() else 0 for k, f in outputs.items()}
        t0 = time.monotonic()
        time.sleep(seconds)  # the measurement window
        elapsed = time.monotonic() - t0
        end = {k: cpu_seconds(p.pid) for k, p in monitors.items()}
        lines1 = {k: sum(1 for _ in open(f)) if f.exists() else 0 for k, f in outputs.items()}
    finally:
        for p in monitors.values():
            p.terminate()
        for p in monitors.values():
            p.wait()
        for p in targets:
            p.kill()
            p.wait()
    process_samples = n * round(elapsed)
    res = {"targets": n, "window_s": round(elapsed, 2), "process_samples_expected": process_samples, "monitors": {}}
    for k in monitors:
        cpu = end[k] - start[k]
        written = lines1.get(k, 0) - lines0.get(k, 0)
        res["monitors"][k] = {
            "cpu_seconds": round(cpu, 6),
            "us_per_process_sample": round(cpu / process_samples * 1e6, 3),
            "lines_written_in_window": written if k != "floor" else None,
        }
    m = res["monitors"]
    floor_us = max(m["floor"]["us_per_process_sample"], 1e-3)
    res["ratios"] = {
        "c_agent_to_floor": round(m["c_agent"]["us_per_process_sample"] / floor_us, 3),
        "python_agent_to_floor": round(m["python_agent"]["us_per_process_sample"] / floor_us, 3),
    }
    if "telegraf" in m:
        t = m["telegraf"]["us_per_process_sample"]
        res["ratios"].update(
            telegraf_to_c_agent=round(t / max(m["c_agent"]["us_per_process_sample"], 1e-3), 1),
            python_agent_to_telegraf=round(m["python_agent"]["us_per_process_sample"] / t, 4),
        )
        res["targets_met"] = {
            "c_agent_le_1.5x_floor": res["ratios"]["c_agent_to_floor"] <= 1.5,
            "c_agent_ge_100x_cheaper_than_telegraf": res["ratios"]["telegraf_to_c_agent"] >= 100,
            "python_agent_le_tenth_of_telegraf": res["ratios"]["python_agent_to_telegraf"] <= 0.1,
        }
    return res


RATIO_INTERVAL_S = 0.25  # 80 rounds in a 20 s window: a round more or less at its edges is 1.25%
RATIO_SETTLE_S = 3.0  # start-up (the first scan of /proc, opening the files) is not what is measured


def start_store_acceptor(tmp: Path) -> tuple[subprocess.Popen, int]:
    port_file = tmp / "acceptor.port"
    port_file.unlink(missing_ok=True)  # an earlier step's, whose acceptor is gone
    proc = subprocess.Popen([sys.executable, "-m", "flowstat_lab.store_acceptor", "--port-file", str(port_file)])
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("flowstat_lab.store_acceptor did not start")
        time.sleep(0.05)  # polling for the file it writes when it listens
    return proc, int(port_file.read_text())


RATIO_CONFIGS = {
    # as the soak runs it: found by --pattern and looked for again every 5 s, both of the soak's
    # sinks (to a loopback endpoint that drops what it takes), each batch spooled before it is sent
    "soak": "--pattern, --rescan 5, a spool, InfluxDB line protocol over HTTP and Elasticsearch _bulk",
    # as the first benchmark (cpu_per_sample) runs it: the processes by --pid, one file in line protocol
    "file": "--pid, one file sink (line protocol)",
}


def stop_acceptor_and_targets(acceptor: subprocess.Popen, targets: list[subprocess.Popen]) -> None:
    acceptor.terminate()
    acceptor.wait()
    for p in targets:
        p.kill()
        p.wait()


def ratio_monitor_argv(name: str, exe: Path, pids: list[str], port: int, tmp: Path, seconds: float) -> list[str]:
    """The command of one monitor of the cost_ratio step: the floor, or an agent in one of RATIO_CONFIGS
    (its name ends with _file for the file configuration)."""
    total = RATIO_SETTLE_S + seconds + 2
    if name == "floor":
        return [str(exe), str(RATIO_INTERVAL_S), str(total), *pids]
    run = ["--interval", str(RATIO_INTERVAL_S), "--duration", str(total), "--quiet"]
    if name.endswith("_file"):
        return [str(exe), *(a for pid in pids for a in ("--pid", pid)), *run, "--sink", f"file://{tmp / name}.lp"]
    spool = tmp / f"spool-{name}"
    spool.mkdir(exist_ok=True)
    return [
        str(exe),
        "--pattern",
        f"sleep {TARGET_ARG}",
        "--rescan",
        "5",
        *run,
        "--spool-dir",
        str(spool),
        "--sink",
        f"http://127.0.0.1:{port}/write",
        "--sink",
        f"elasticsearch://127.0.0.1:{port}/flowstat-samples",
    ]


def measure_alone(argv: list[str], seconds: float) -> tuple[float, float]:
    """(CPU seconds of all its threads, wall seconds) of one monitor over a window after its start-up."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        time.sleep(RATIO_SETTLE_S)
        t0, cpu0 = time.monotonic(), cpu_seconds(proc.pid)
        time.sleep(seconds)  # the window
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
    finally:
        proc.terminate()
        proc.wait()
    return cpu1 - cpu0, t1 - t0


def spread(values: list[float]) -> dict:
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return {"median": round(median, 3), "min": round(ordered[0], 3), "max": round(ordered[-1], 3), "n": n}


def bench_cost_ratio(
    tmp: Path, n: int, seconds: float, rounds: int, reference: Path | None, configs: list[str]
) -> dict:
    targets = spawn_targets(n)
    pids = [str(p.pid) for p in targets]
    monitors = {"floor": build_floor(tmp)}
    for config in configs:
        suffix = "" if config == "soak" else f"_{config}"
        monitors[f"c_agent{suffix}"] = C_AGENT
        if reference:
            monitors[f"reference_agent{suffix}"] = reference
    names = list(monitors)
    agents = names[1:]
    acceptor, port = start_store_acceptor(tmp)
    per_round: list[dict[str, float]] = []
    try:
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # rotated: no monitor always first
            us: dict[str, float] = {}
            for name in order:
                cpu, wall = measure_alone(ratio_monitor_argv(name, monitors[name], pids, port, tmp, seconds), seconds)
                us[name] = cpu / (n * wall / RATIO_INTERVAL_S) * 1e6
            per_round.append(us)
            line = "  ".join(f"{k} {us[k]:.2f}" for k in names)
            ratios = "  ".join(f"{us[k] / us['floor']:.3f}" for k in agents)
            print(f"  round {r + 1}/{rounds}, us: {line}  |  to the floor: {ratios}", flush=True)
    finally:
        stop_acceptor_and_targets(acceptor, targets)
    out: dict = {
        "targets": n,
        "interval_s": RATIO_INTERVAL_S,
        "window_s": seconds,
        "rounds": rounds,
        "order": "each monitor alone, in an order rotated each round",
        "configurations": {c: RATIO_CONFIGS[c] for c in configs},
        "reference_agent": str(reference) if reference else None,
        "us_per_process_sample": {k: spread([u[k] for u in per_round]) for k in names},
        "per_round_us": [{k: round(v, 3) for k, v in u.items()} for u in per_round],
        "ratio_to_floor": {k: spread([u[k] / u["floor"] for u in per_round]) for k in agents},
        "targets_met": {},
    }
    for k in agents:
        m = out["ratio_to_floor"][k]
        print(f"  {k} / floor: median {m['median']:.3f} (min {m['min']:.3f}, max {m['max']:.3f})", flush=True)
    if "soak" in configs:
        out["targets_met"]["c_agent_le_1.3x_floor"] = out["ratio_to_floor"]["c_agent"]["median"] <= 1.3
    if reference:
        out["c_agent_to_reference"] = {}
        for config in configs:
            suffix = "" if config == "soak" else f"_{config}"
            ref = spread([u[f"c_agent{suffix}"] / u[f"reference_agent{suffix}"] for u in per_round])
            out["c_agent_to_reference"][config] = ref
            out["targets_met"][f"c_agent_le_reference_{config}"] = ref["median"] <= 1.0
            m, lo, hi = ref["median"], ref["min"], ref["max"]
            print(f"  c_agent{suffix} / reference: median {m:.3f} (min {lo:.3f}, max {hi:.3f})")
    return out


def perf_profile(tmp: Path, n: int, seconds: float) -> dict:
    """Where the C agent's CPU goes, by perf (cycles, 10 kHz): per library, and the functions with the
    largest shares counting what they call (the agent's own) or not (libc, the kernel)."""
    targets = spawn_targets(n)
    data = tmp / "perf.data"
    acceptor, port = start_store_acceptor(tmp)
    try:
        argv = ratio_monitor_argv("c_agent", C_AGENT, [], port, tmp, seconds)
        subprocess.run(
            ["perf", "record", "-q", "-F", "10000", "--call-graph", "dwarf,16384", "-o", str(data), "--", *argv],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    finally:
        stop_acceptor_and_targets(acceptor, targets)

    def report(*extra: str) -> list[tuple[float, str]]:
        text = subprocess.run(
            ["perf", "report", "-i", str(data), "--stdio", "-g", "none", *extra],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = []
        for line in text.splitlines():
            parts = line.split()
            if parts and parts[0].endswith("%") and not line.startswith("#"):
                rows.append((parts, line))
        return rows

    by_dso = {p[-1]: float(p[0].rstrip("%")) for p, _ in report("--no-children", "--sort", "dso")}
    functions = []
    for p, _ in report("--children", "--sort", "dso,symbol"):
        while p and p[-1] == "-":  # perf's empty columns
            p.pop()
        children, self_share, dso, symbol = float(p[0].rstrip("%")), float(p[1].rstrip("%")), p[2], " ".join(p[4:])
        if dso == "flowstat-agent" or self_share >= 1.0:
            functions.append({"function": symbol, "dso": dso, "with_callees_pct": children, "self_pct": self_share})
    from run_benchmarks import table  # run from benchmarks/, as make bench does

    return {
        "command": "perf record -F 10000 --call-graph dwarf",
        "by_library_pct": by_dso,
        "functions": table(functions[:40], ["function", "dso", "with_callees_pct", "self_pct"]),
    }


def count_lines(path: Path) -> int:
    """Lines an agent wrote; 0 when it wrote none yet (it creates its file at its first write)."""
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def bench_rss(tmp: Path, n: int, seconds: float) -> dict:
    targets = spawn_targets(n)
    pid_args = [a for p in targets for a in ("--pid", str(p.pid))]
    agents = {
        "c_agent": subprocess.Popen(
            [
                str(C_AGENT),
                *pid_args,
                "--interval",
                "0.1",
                "--duration",
                str(seconds + 5),
                "--sink",
                f"file://{tmp / 'soak-c.lp'}",
                "--quiet",
            ]
        ),
        "python_agent": subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flowstat.agent",
                *pid_args,
                "--interval",
                "0.1",
                "--duration",
                str(seconds + 5),
                "--sink",
                f"file://{tmp / 'soak-py.lp'}",
                "--quiet",
            ]
        ),
    }
    series: dict[str, list[tuple[float, int]]] = {k: [] for k in agents}
    t0 = time.monotonic()
    try:
        while (elapsed := time.monotonic() - t0) < seconds:
            for k, p in agents.items():
                series[k].append((round(elapsed, 1), vmrss_kb(p.pid)))
            time.sleep(min(10.0, max(0.0, seconds - elapsed)))  # sampling period of the soak
        lines = {k: count_lines(tmp / f"soak-{'c' if k == 'c_agent' else 'py'}.lp") for k in agents}
    finally:
        for p in agents.values():
            p.terminate()
            p.wait()
        for p in targets:
            p.kill()
            p.wait()
    out = {"targets": n, "interval_s": 0.1, "seconds": seconds, "agents": {}}
    for k, s in series.items():
        settled = [kb for t, kb in s if t >= 30] or [kb for _, kb in s]
        out["agents"][k] = {
            "vmrss_kb_series": s,
            "vmrss_kb_after_30s": settled[0],
            "vmrss_kb_last": settled[-1],
            "vmrss_kb_max": max(settled),
            "samples_written": lines[k],
            "samples_per_second": round(lines[k] / seconds, 1),
            "flat": settled[-1] <= settled[0] * 1.05 + 1024,
        }
    return out


def percentile(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]


def bench_interval(tmp: Path, rounds: int, interval_s: float = 0.01) -> dict:
    from flowstat.schema.sample import time_ns

    target = subprocess.Popen(["sleep", TARGET_ARG])
    expected = (rounds - 1) * interval_s
    out = {"interval_s": interval_s, "rounds": rounds, "expected_span_s": round(expected, 3), "agents": {}}
    try:
        for name, command in (("c_agent", [str(C_AGENT)]), ("python_agent", [sys.executable, "-m", "flowstat.agent"])):
            samples, stats = tmp / f"interval-{name}.json", tmp / f"interval-{name}-stats.json"
            subprocess.run(
                [
                    *command,
                    "--pid",
                    str(target.pid),
                    "--interval",
                    str(interval_s),
                    "--count",
                    str(rounds),
                    "--self-interval",
                    "0",
                    "--quiet",
                    "--sink",
                    f"file://{samples}?format=json",
                    "--stats",
                    str(stats),
                ],
                check=True,
                timeout=rounds * interval_s + 60,
            )
            stamps_ms = [time_ns(json.loads(line)["time"]) // 1_000_000 for line in open(samples)]  # whole ms
            gaps = sorted(b - a for a, b in zip(stamps_ms, stamps_ms[1:], strict=False))
            jitter = sorted(abs(g - round(interval_s * 1000)) for g in gaps)
            span_ms = stamps_ms[-1] - stamps_ms[0]
            out["agents"][name] = {
                "samples": len(stamps_ms),
                "skipped_rounds": json.loads(stats.read_text())["skipped_rounds"],
                "span_s": span_ms / 1000,
                "span_minus_expected_ms": span_ms - round(expected * 1000),
                "gap_ms": {
                    "min": gaps[0],
                    "p50": percentile(gaps, 50),
                    "p99": percentile(gaps, 99),
                    "max": gaps[-1],
                    "mean": round(sum(gaps) / len(gaps), 3),
                },
                "jitter_ms": {"p50": percentile(jitter, 50), "p99": percentile(jitter, 99), "max": jitter[-1]},
                # what the functional test once asserted: 299 intervals within +-0.1 s
                "span_within_1_percent": abs(span_ms / 1000 - expected) <= 0.01 * expected + 0.01,
            }
    finally:
        target.kill()
        target.wait()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short windows (a sanity check, not a measurement)")
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--soak", type=float, default=600, help="seconds of the RSS soak (0: no soak)")
    ap.add_argument("--rounds", type=int, default=3000, help="rounds of the 10 ms interval step (0: no such step)")
    ap.add_argument("--no-telegraf", action="store_true", help="skip Telegraf (it needs Go to build)")
    ap.add_argument("--ratio-rounds", type=int, default=6, help="interleaved rounds of cost_ratio (0: no such step)")
    ap.add_argument(
        "--ratio-configs",
        default="soak,file",
        help="the agent configurations cost_ratio measures, among: " + ", ".join(RATIO_CONFIGS),
    )
    ap.add_argument("--ratio-targets", type=int, default=1000, help="processes cost_ratio watches")
    ap.add_argument("--ratio-seconds", type=float, default=15, help="each monitor's window in a cost_ratio round")
    ap.add_argument(
        "--reference-agent",
        type=Path,
        help="an older flowstat-agent build for cost_ratio to compare with (e.g. git worktree add REF d8c695c; "
        "make -C REF/collectors/c build/flowstat-agent)",
    )
    ap.add_argument("--perf", action="store_true", help="add a perf profile of the C agent (needs perf)")
    ap.add_argument("--only-ratio", action="store_true", help="only the cost_ratio step (and --perf)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.soak, args.rounds = 10, 60, min(args.rounds, 300)
        args.ratio_rounds, args.ratio_seconds = min(args.ratio_rounds, 2), min(args.ratio_seconds, 5)
    if args.seconds <= 0 or args.soak < 0 or args.rounds < 0 or args.rounds == 1:
        ap.error("--seconds must be positive, --soak at least 0, --rounds 0 or at least 2")
    if args.ratio_rounds < 0 or args.ratio_targets < 1 or args.ratio_seconds <= 0:
        ap.error("--ratio-rounds must be at least 0, --ratio-targets and --ratio-seconds positive")
    configs = [c for c in args.ratio_configs.split(",") if c]
    if not configs or any(c not in RATIO_CONFIGS for c in configs):
        ap.error(f"--ratio-configs {args.ratio_configs}: a list among {', '.join(RATIO_CONFIGS)}")
    if args.reference_agent and not args.reference_agent.is_file():
        ap.error(f"--reference-agent {args.reference_agent}: no such file")
    if not C_AGENT.exists():
        print("bench_agents: build the C agent first (make c-agent)", file=sys.stderr)
        return 2
    telegraf = None
    if not args.no_telegraf and not args.only_ratio:
        from flowstat.stack.telegraf import build

        telegraf = str(build())
    from run_benchmarks import command_line, machine, save_results  # shared with the harness benchmarks

    from flowstat.timeutil import compact_utc, iso_utc_ms

    results = {"started": iso_utc_ms(), "machine": machine(), "command": command_line(), "benchmarks": {}}
    out = args.out or ROOT / "benchmarks" / "results" / "raw" / f"agents-{compact_utc()}.json"
    steps = []
    if args.ratio_rounds:
        steps.append(
            (
                f"C agent / floor: {args.ratio_targets} processes, {args.ratio_rounds} interleaved rounds of "
                f"{args.ratio_seconds:g} s each",
                "cost_ratio",
                lambda tmp: bench_cost_ratio(
                    tmp, args.ratio_targets, args.ratio_seconds, args.ratio_rounds, args.reference_agent, configs
                ),
            )
        )
    if args.perf:
        steps.append(
            (
                f"perf profile of the C agent: {args.ratio_targets} processes, {args.ratio_seconds:g} s",
                "c_agent_profile",
                lambda tmp: perf_profile(tmp, args.ratio_targets, args.ratio_seconds),
            )
        )
    if args.only_ratio:
        args.rounds = args.soak = 0
    else:
        steps += [
            (
                f"CPU per process-sample: {args.targets} processes, 1 Hz, {args.seconds:g} s",
                "cpu_per_process_sample",
                lambda tmp: bench_cpu(tmp, args.targets, args.seconds, telegraf),
            ),
            # Telegraf's cost per process falls as it watches more (its per-gather overhead is
            # shared): the 50-process case is where ~0.6 ms per process-sample was first measured.
            (
                f"CPU per process-sample: 50 processes, 1 Hz, {args.seconds:g} s",
                "cpu_per_process_sample_50",
                lambda tmp: bench_cpu(tmp, 50, args.seconds, telegraf),
            ),
        ]
    if args.rounds:
        steps.append(
            (
                f"10 ms interval: {args.rounds} rounds of one process",
                "interval_10ms",
                lambda tmp: bench_interval(tmp, args.rounds),
            )
        )
    if args.soak:
        steps.append(
            (
                f"agent RSS: 1000 processes, 10 Hz, {args.soak:g} s",
                "rss_soak",
                lambda tmp: bench_rss(tmp, 1000, args.soak),
            )
        )
    with tempfile.TemporaryDirectory(prefix="flowstat-agents-") as tmp:
        for title, key, bench in steps:
            print(f"{title} ...", flush=True)
            results["benchmarks"][key] = bench(Path(tmp))
            save_results(results, out, quiet=True)  # a later step that fails keeps what was measured
    save_results(results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
