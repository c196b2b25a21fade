"""The agent's loop: find targets, read /proc, ask control channels, build samples, hand them to
the sinks. Ticks are scheduled from a monotonic start (tick k at start + k x interval), so there
is no drift over hours; a tick that overruns skips to the next one due rather than bunching up."""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from flowstat.timeutil import iso_utc_ms

from . import AGENT_NAME, schema
from .control import ControlPool
from .procsample import ProcessGone, ProcFormatError, cpu_rates
from .sinks import SinkRunner, open_sink
from .spool import Spool
from .targets import Target, TargetSpec, discover, open_reader

log = logging.getLogger("flowstat.agent")
ROLES = {"producer", "merger", "viewer"}


@dataclass
class AgentConfig:
    spec: TargetSpec
    sinks: list[str] = field(default_factory=lambda: ["stdout://"])
    interval_s: float = 1.0
    rescan_s: float = 5.0
    control_timeout_s: float = 0.25
    spool_dir: str | None = None
    spool_max_bytes: int = 64 * 1024 * 1024
    run_file: str | None = None
    run_params: dict | None = None
    name: str = ""
    duration_s: float | None = None
    count: int | None = None
    exit_when_all_down: bool = False
    drain_s: float = 5.0  # at exit, how long to keep resending what a down sink left in the spool


def _slug(url: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in url)[:80]


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.agent_name = AGENT_NAME + (f"/{cfg.name}" if cfg.name else "")
        self.host = socket.gethostname()
        self.targets: dict[tuple[int, str], Target] = {}
        self.gone: set[tuple[int, str]] = set()
        self.seqs: dict[str, int] = {}  # per node: survives the node being re-found
        self.control = ControlPool(cfg.control_timeout_s)
        self.stop_event = threading.Event()
        self.samples_taken = 0
        self.proc_errors = 0
        self.rounds = 0
        self.skipped_rounds = 0  # a round overran its interval: the rounds it ran into are skipped
        self.runners: list[SinkRunner] = []
        for url in cfg.sinks:
            sink = open_sink(url)
            spool = None
            if sink.reliable and sink.scheme not in ("stdout",) and cfg.spool_dir:
                spool = Spool(Path(cfg.spool_dir) / _slug(url), cfg.spool_max_bytes)
            self.runners.append(SinkRunner(sink, spool, drain_s=cfg.drain_s))
        if cfg.run_file:
            self.runners.append(SinkRunner(RunFileSink(cfg.run_file, self._run_header()), None))

    def _run_header(self) -> dict:
        return {"flowstat_run": {"run_id": self.cfg.spec.run_id, "agent": self.agent_name, "host": self.host,
                                 "started": iso_utc_ms(), "interval_s": self.cfg.interval_s,
                                 "schema": schema.schema()["$id"], "parameters": self.cfg.run_params or {}}}

    # -- targets --------------------------------------------------------------------------------
    def rescan(self, first: bool = False) -> None:
        for t in discover(self.cfg.spec, first):
            if t.key in self.targets or t.key in self.gone:
                continue
            if open_reader(t):
                try:
                    t.prev, t.prev_t = t.reader.read(), time.monotonic()
                except (ProcessGone, ProcFormatError, OSError):
                    t.reader.close()
                    continue
                self.targets[t.key] = t
                log.info("watching %s (pid %d, %s)", t.node_id, t.pid, t.source)

    # -- sampling -------------------------------------------------------------------------------
    def _next_seq(self, node_id: str) -> int:
        seq = self.seqs.get(node_id, 0)
        self.seqs[node_id] = seq + 1
        return seq

    def _base(self, t: Target, stamp: str, role: str, state: str) -> dict:
        return {"time": stamp, "run_id": t.run_id, "host": self.host, "node_id": t.node_id,
                "role": role if role in ROLES else "other", "agent": self.agent_name,
                "seq": self._next_seq(t.node_id), "pid": t.pid, "node_state": state}

    def sample_all(self) -> list[dict]:
        stamp = iso_utc_ms()
        now = time.monotonic()
        endpoints = [t.control for t in self.targets.values() if t.control]
        replies = self.control.query(endpoints) if endpoints else {}
        samples = []
        for key, t in list(self.targets.items()):
            try:
                reading = t.reader.read()
            except (ProcessGone, ProcFormatError, OSError) as exc:
                if not isinstance(exc, ProcessGone):
                    self.proc_errors += 1
                    log.error("%s (pid %d): %s", t.node_id, t.pid, exc)
                samples.append(self._base(t, stamp, t.role, "DOWN"))  # reported once, then dropped
                log.warning("%s (pid %d) is gone", t.node_id, t.pid)
                t.reader.close()
                del self.targets[key]
                self.gone.add(key)
                if t.control:
                    self.control.forget(t.control)
                continue
            reply = replies.get(t.control) if t.control else None
            metrics = schema.from_control_reply(reply) if reply else {}
            role = t.role if t.role != "other" else (reply or {}).get("role", "other")
            sample = self._base(t, stamp, role, metrics.pop("node_state", "UP"))
            total, user, system = cpu_rates(t.prev, reading, now - t.prev_t)
            sample.update(vmrss_kb=reading.rss_kb, cpu_clock_hz=total, cpu_user_hz=user, cpu_system_hz=system,
                          threads=reading.threads)
            sample.update(metrics)
            t.prev, t.prev_t = reading, now
            samples.append(sample)
        self.samples_taken += len(samples)
        return samples

    # -- loop -----------------------------------------------------------------------------------
    def run(self) -> int:
        for r in self.runners:
            r.start()
        start = time.monotonic()
        self.rescan(first=True)
        next_rescan = start + self.cfg.rescan_s
        tick = 0
        try:
            while not self.stop_event.is_set():
                now = time.monotonic()
                if now >= next_rescan:
                    self.rescan()
                    next_rescan = now + self.cfg.rescan_s
                if tick > 0:
                    samples = self.sample_all()
                    for r in self.runners:
                        r.submit(samples)
                    self.rounds += 1
                if self.cfg.count is not None and self.rounds >= self.cfg.count:
                    break
                if self.cfg.duration_s is not None and now - start >= self.cfg.duration_s:
                    break
                if self.cfg.exit_when_all_down and tick > 0 and not self.targets and self.gone:
                    break
                due = math.floor((time.monotonic() - start) / self.cfg.interval_s) + 1
                self.skipped_rounds += max(0, due - tick - 1)
                tick = max(tick + 1, due)
                self.stop_event.wait(max(0.0, start + tick * self.cfg.interval_s - time.monotonic()))
            if self.stop_event.is_set() and self.targets:
                # Stopped from outside: one last pass, so that nodes which ended are reported DOWN.
                samples = self.sample_all()
                for r in self.runners:
                    r.submit(samples)
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        for r in self.runners:
            if r.is_alive():
                r.stop()
        for r in self.runners:
            r.done.wait(30 + self.cfg.drain_s)
        self.control.close()
        for t in self.targets.values():
            t.reader.close()

    def stats(self) -> dict:
        return {"samples": self.samples_taken, "rounds": self.rounds, "skipped_rounds": self.skipped_rounds,
                "targets": len(self.targets), "gone": len(self.gone),
                "control_errors": self.control.errors, "proc_errors": self.proc_errors,
                "sinks": {r.sink.url: {"delivered": r.delivered, "rejected": r.rejected, "lost": r.lost,
                                       "spooled": len(r.spool) if r.spool else 0,
                                       "spool_dropped": r.spool.dropped_samples if r.spool else 0}
                          for r in self.runners}}


class RunFileSink:
    """The run file: NDJSON, a header line with the run's parameters, then one sample a line."""

    def __init__(self, path: str, header: dict):
        from .sinks.console import FileSink

        self._file = FileSink(f"file://{path}", path)
        self._file.format = "json"
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists() or p.stat().st_size == 0:
            self._file.send((json.dumps(header) + "\n").encode())
        self.url, self.scheme, self.reliable = self._file.url, "runfile", True

    def encode(self, samples):
        return self._file.encode(samples)

    def send(self, payload: bytes) -> None:
        self._file.send(payload)

    def close(self) -> None:
        self._file.close()
