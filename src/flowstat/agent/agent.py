"""The agent's loop: find targets, read /proc, ask control channels, build samples, hand them to
the sinks. Ticks are scheduled from a monotonic start (tick k at start + k x interval), so there
is no drift over hours; a tick that overruns skips to the next one due rather than bunching up.
Every self_interval_s, after a round, and once at exit, the agent reports on itself (a self-sample,
flowstat.schema.agent) through the same sinks. After the run-ending notice (SIGUSR1, see
``notice_run_ending``) a node that vanishes ended as planned: STOPPED, not DOWN."""

from __future__ import annotations

import logging
import math
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from flowstat import stores
from flowstat.node import curve
from flowstat.proc.machine import host_identity
from flowstat.proc.procfs import set_from_signal
from flowstat.proc.reader import ProcessGone, ProcFormatError, ProcReading, cpu_rates, cpu_seconds
from flowstat.schema import flow as flow_schema
from flowstat.schema import sample as sample_schema
from flowstat.timeutil import iso_utc_from_ms, iso_utc_ms

from . import AGENT_NAME
from .control import ControlPool
from .selection import Ranker
from .sinks import SinkDown, SinkRunner, SinkURLError, open_sink
from .sinks.console import RunFileSink
from .spool import Spool, folder_name
from .targets import Target, TargetSpec, discover, open_reader

log = logging.getLogger("flowstat.agent")
RUN_FIELDS_IN_HEADER = ("run_id", "description", "topology", "started", "host", "machine", "parameters")
FDS_PER_TARGET = 2  # /proc/PID/stat and statm, held open (flowstat.proc.reader)
SEND_TIMEOUT_MAX_S = 10.0  # the longest one send may block (the HTTP sinks' 5 s, TCP's 3 s), with margin
SINK_TIMEOUT_S = 5.0  # --sink-timeout: an HTTP sink's request time-out (each node's, for a list of nodes)


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
    run_doc: dict | None = None  # the run document (run.json): what heads the run file
    name: str = ""
    duration_s: float | None = None
    count: int | None = None
    exit_when_all_down: bool = False
    drain_s: float = 5.0  # at exit, how long to keep resending what a down sink left in the spool
    self_interval_s: float = 5.0  # seconds between self-samples (and one at exit); 0: none
    sink_timeout_s: float = SINK_TIMEOUT_S
    node_backoff_s: float = stores.NODE_BACKOFF_S  # --node-backoff: how long a store's node that failed is left alone
    send_max_bytes: int = SinkRunner.SEND_MAX_BYTES  # --send-max-kb: spooled batches sent together, at most


def open_runner(
    url: str,
    spool_dir: str | None,
    spool_max_bytes: int,
    drain_s: float,
    sink_timeout_s: float = SINK_TIMEOUT_S,
    node_backoff_s: float = stores.NODE_BACKOFF_S,
    send_max_bytes: int = SinkRunner.SEND_MAX_BYTES,
    fresh_first: bool = True,
) -> SinkRunner:
    """The delivery of one sink, with its spool folder under ``spool_dir`` when it can be spooled
    (``fresh_first``: see SinkRunner)."""
    sink = open_sink(url, sink_timeout_s, node_backoff_s)
    spool = None
    if sink.reliable and sink.spooled and spool_dir:
        spool = Spool(Path(spool_dir) / folder_name(url), spool_max_bytes, url)
    return SinkRunner(sink, spool, drain_s=drain_s, send_max_bytes=send_max_bytes, fresh_first=fresh_first)


class Agent:
    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.agent_name = AGENT_NAME + (f"/{cfg.name}" if cfg.name else "")
        self.host = host_identity(cfg.spec.host)
        self.targets: dict[tuple[int, str], Target] = {}
        self.gone: set[tuple[int, str]] = set()
        self.seqs: dict[str, int] = {}  # per node: survives the node being re-found
        self.control = ControlPool(cfg.control_timeout_s)
        self.stop_event = threading.Event()
        self.wake = threading.Event()  # what the loop's wait between rounds ends on: a stop, a reload
        self.samples_taken = 0
        self.proc_errors = 0
        self.rounds = 0
        self.skipped_rounds = 0  # a round overran its interval: the rounds it ran into are skipped
        self.self_seq = 0  # self-samples emitted
        self.last_self_ms = 0  # the time of the last one: each is given a later one
        self.last_round_ms = 0  # the same for rounds of samples
        self.targets_run_id: str | None = ""  # see _note_run: "" none seen yet, None several
        self.said: set[tuple[str, ...]] = set()  # endpoint files' problems, told once each
        self.dirs_mtime_ns: list[int] = []  # the endpoints directories as last seen (dirs_changed)
        self.ending = False  # the run-ending notice came: nodes that vanish now ended with their run
        self.reload_requested = False  # SIGHUP came: the loop asks self.reloader for the new configuration
        self.reloader: Callable[[], AgentConfig] | None = None  # raises ValueError for a bad configuration
        self.retired: list[SinkRunner] = []  # sinks a reload removed: stopped, counted in stats still
        self.ranker = Ranker(cfg.spec.top_by)  # --top: CPU rates between rankings
        self.leaving: list[Target] = []  # left the top-N at the last rescan: reported LEFT_TOP once
        self.runners = self._open_runners(cfg, cfg.sinks)
        self.sink_runners = list(self.runners)  # what the self-samples' delivery figures sum over
        if cfg.run_file:
            self.runners.append(SinkRunner(RunFileSink(cfg.run_file, self._run_header()), None))

    @staticmethod
    def _open_runners(cfg: AgentConfig, urls: list[str]) -> list[SinkRunner]:
        runners = [
            open_runner(
                url,
                cfg.spool_dir,
                cfg.spool_max_bytes,
                cfg.drain_s,
                cfg.sink_timeout_s,
                cfg.node_backoff_s,
                cfg.send_max_bytes,
            )
            for url in urls
        ]
        twice = sorted({url for url in cfg.sinks if cfg.sinks.count(url) > 1})  # checked after each URL: none
        if twice:  # two deliveries would share one spool folder                   # names a password now
            raise SinkURLError(f"{twice[0]}: --sink given twice")
        return runners

    # -- reload (SIGHUP) ------------------------------------------------------------------------
    def request_reload(self) -> None:
        """SIGHUP: the loop reloads before its next round. Safe in a signal handler."""
        self.reload_requested = True
        set_from_signal(self.wake)

    def request_stop(self) -> None:
        """SIGTERM, SIGINT: one last round, then delivery. Safe in a signal handler."""
        set_from_signal(self.stop_event)
        set_from_signal(self.wake)

    def _reload(self) -> bool:
        """The configuration read again and applied in place: targets the new one does not name
        are no longer watched, new ones are taken at once; sinks it removes are stopped (what they
        queued is delivered, or spooled for --flush-spool), new ones opened; the timings change.
        A sink kept keeps its delivery, spool and counts, a node its seq: nothing is sent twice or
        skipped. A bad configuration changes nothing and is said. True when the timings changed."""
        self.reload_requested = False
        try:
            assert self.reloader is not None
            new = self.reloader()
            kept = [r for r in self.sink_runners if r.sink.url in new.sinks]
            urls = {r.sink.url for r in kept}
            added = self._open_runners(new, [u for u in new.sinks if u not in urls])
        except (ValueError, OSError, SinkDown) as exc:  # a bad file, a bad sink URL, a spool that cannot be used
            log.error("reload refused, the running configuration kept: %s", exc)
            return False
        for r in self.sink_runners:
            if r not in kept:
                r.stop()
                self.retired.append(r)
                log.info("reload: sink %s removed (what it held is delivered or stays in its spool)", r.sink.url)
        for r in added:
            r.start()
            log.info("reload: sink %s added", r.sink.url)
        others = [r for r in self.runners if r not in self.sink_runners]  # the run file's
        self.sink_runners = kept + added
        self.runners = self.sink_runners + others
        timings = (new.interval_s, new.rescan_s, new.self_interval_s) != (
            self.cfg.interval_s,
            self.cfg.rescan_s,
            self.cfg.self_interval_s,
        )
        self.cfg = replace(new, run_file=self.cfg.run_file, run_doc=self.cfg.run_doc)
        self.control.timeout_s = new.control_timeout_s
        if new.spec.top_by != self.ranker.by:
            self.ranker = Ranker(new.spec.top_by)
        wanted = {t.key for t in discover(new.spec, True, self.said, self.ranker)}
        for key in [k for k in self.targets if k not in wanted]:
            t = self.targets.pop(key)
            t.close()
            log.info("reload: %s (pid %d) no longer watched", t.node_id, t.pid)
        self.gone.clear()  # a node the new configuration names again is taken again
        self.rescan(first=True)
        log.info("reload: %d targets, %d sinks", len(self.targets), len(self.sink_runners))
        return timings

    def _run_header(self) -> dict:
        """The run file's first line: the run document's description of the run (run id, topology,
        parameters, machine), and who recorded it how."""
        doc = self.cfg.run_doc or {}
        head = {
            "run_id": self.cfg.spec.run_id,
            "host": self.host,
            "started": iso_utc_ms(),
            **{k: doc[k] for k in RUN_FIELDS_IN_HEADER if k in doc},
        }
        return {
            "flowstat_run": {
                **head,
                "agent": self.agent_name,
                "interval_s": self.cfg.interval_s,
                "schema": sample_schema.schema()["$id"],
            }
        }

    # -- targets --------------------------------------------------------------------------------
    def rescan(self, first: bool = False) -> None:
        found = discover(self.cfg.spec, first, self.said, self.ranker)
        if self.cfg.spec.top:
            ranked = {t.key for t in found}
            for key, t in list(self.targets.items()):
                # still running and no longer among the heaviest; one that died is reported DOWN
                if t.source.startswith("--top") and key not in ranked and os.path.exists(f"/proc/{t.pid}"):
                    self.leaving.append(self.targets.pop(key))
        room, left_out = self._fd_room(), 0
        for t in found:
            if t.key in self.targets or t.key in self.gone:
                continue
            if len(self.targets) >= room:
                left_out += 1
                continue
            if open_reader(t):
                try:
                    t.prev, t.prev_t = t.read(), time.monotonic()
                except (ProcessGone, ProcFormatError, OSError):
                    t.close()
                    continue
                self._secure(t)
                self.targets[t.key] = t
                self._note_run(t.run_id)
                log.info("watching %s (pid %d, %s)", t.node_id, t.pid, t.source)
        if left_out:
            log.error(
                "cannot watch more processes: the open files limit (%d, RLIMIT_NOFILE) is reached: %d watched, "
                "%d left out; raise LimitNOFILE (2 files a process)",
                resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                len(self.targets),
                left_out,
            )

    @staticmethod
    def _fd_room() -> int:
        """How many processes may be watched (each holds FDS_PER_TARGET files open) while files stay
        free for the sinks, spools and control sockets: an eighth of the limit, 16 to 256, as the
        C agent keeps."""
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return sys.maxsize
        return max(0, (limit - min(256, max(16, limit // 8))) // FDS_PER_TARGET)

    def _secure(self, t: Target) -> None:
        """A node whose channel takes CURVE clients only is asked with the run's client key; without
        a usable one it is sampled from /proc only, said once (its channel would not answer)."""
        if not (t.control and t.curve_server_key):
            return
        assert t.curve_client_key is not None  # targets.discover gives every secured node one
        try:
            self.control.secure(t.control, t.curve_server_key, t.curve_client_key)
        except curve.CurveError as exc:
            log.warning(
                "%s (pid %d): its control channel needs the run's client key: %s; /proc only", t.node_id, t.pid, exc
            )
            t.control = None

    def dirs_changed(self) -> bool:
        """Whether an endpoints directory changed (a file written, renamed or removed) since the
        last look: one stat each, so a node that announces itself is taken within a round, not at
        the next --rescan."""
        now = []
        for folder in self.cfg.spec.endpoints_dirs:
            try:
                now.append(os.stat(folder).st_mtime_ns)
            except OSError:
                now.append(-1)  # a directory that cannot be read: its problem is said by the search
        changed = now != self.dirs_mtime_ns
        self.dirs_mtime_ns = now
        return changed

    def _note_run(self, run_id: str) -> None:
        """The run the agent's self-samples belong to, without --run-id: the one its targets' run
        ids (from endpoints files) all name; none once two differ."""
        if run_id and self.targets_run_id is not None:
            self.targets_run_id = run_id if self.targets_run_id in ("", run_id) else None

    # -- sampling -------------------------------------------------------------------------------
    def _next_seq(self, node_id: str) -> int:
        seq = self.seqs.get(node_id, 0)
        self.seqs[node_id] = seq + 1
        return seq

    def _base(self, t: Target, stamp: str, role: str, state: str) -> dict:
        return {
            "time": stamp,
            "run_id": t.run_id,
            "host": self.host,
            "node_id": t.node_id,
            "role": sample_schema.role_or_default(role),
            "agent": self.agent_name,
            "seq": self._next_seq(t.node_id),
            "pid": t.pid,
            "node_state": state,
        }

    def notice_run_ending(self) -> None:
        """The run-ending notice (SIGUSR1; flowstat run sends it as it starts ending a run in order):
        from now on a node that vanishes is reported STOPPED, not DOWN. Safe in a signal handler."""
        self.ending = True

    def sample_all(self) -> tuple[list[dict], list[dict]]:
        """A round: a sample of every target, and the edge counters of their replies
        (flow_schema.counter_points), sent behind the samples."""
        # Each round a later millisecond than the last: a round woken late and the next one due right
        # after it could share one, and InfluxDB keeps one point per series and time (the other is lost).
        self.last_round_ms = max(int(time.time() * 1000), self.last_round_ms + 1)
        stamp = iso_utc_from_ms(self.last_round_ms)
        now = time.monotonic()
        endpoints = [t.control for t in self.targets.values() if t.control]
        replies = self.control.query(endpoints) if endpoints else {}
        samples: list[dict] = []
        edges: list[dict] = []
        for t in self.leaving:  # still running, no longer among the heaviest: said once, not gone
            samples.append(self._base(t, stamp, t.role, sample_schema.STATE_LEFT_TOP))
            t.close()
        self.leaving = []
        for key, t in list(self.targets.items()):
            reply = replies.get(t.control) if t.control else None
            try:
                reading = t.read()
            except (ProcessGone, ProcFormatError, OSError) as exc:
                sample = self._gone(key, t, stamp, reply, exc)
            else:
                sample = self._live(t, stamp, now, reading, reply)
            samples.append(sample)
            if reply:
                edges += flow_schema.counter_points(sample, reply.get("received_from"))
        self.samples_taken += len(samples)
        return samples, edges

    def _gone(self, key: tuple[int, str], t: Target, stamp: str, reply: dict | None, exc: Exception) -> dict:
        """The last sample of a target whose process is gone (or unreadable); the target dropped."""
        if not isinstance(exc, ProcessGone):
            self.proc_errors += 1
            log.error("%s (pid %d): %s", t.node_id, t.pid, exc)
        # Reported once, then dropped. Read ``ending`` after the read that found it gone: a
        # notice sent before the node was stopped has been handled by then.
        # A node that announced itself in a directory withdraws its file when it stops
        # cleanly: the file gone, it stopped; left behind, it died.
        ended = self.ending or (t.announced_by is not None and not t.announced_by.exists())
        gone = self._base(t, stamp, t.role, sample_schema.STATE_STOPPED if ended else sample_schema.STATE_DOWN)
        # a reply taken this round carries its counts: a node that closes answers its final
        # ones and may exit before /proc is read (its state is what became of the process)
        final = sample_schema.from_control_reply(reply) if reply else {}
        final.pop("node_state", None)
        log.log(
            logging.INFO if ended else logging.WARNING,
            "%s (pid %d) is gone%s",
            t.node_id,
            t.pid,
            (" (stopped)" if not self.ending else " (stopped with its run)") if ended else "",
        )
        t.close()
        del self.targets[key]
        self.gone.add(key)
        if t.control:
            self.control.forget(t.control)
        return {**gone, **final}

    def _live(self, t: Target, stamp: str, now: float, reading: ProcReading, reply: dict | None) -> dict:
        """A live target's sample: /proc's reading, and its control reply's role, state and metrics."""
        metrics = sample_schema.from_control_reply(reply) if reply else {}
        role = t.role if t.role != sample_schema.DEFAULT_ROLE else (reply or {}).get("role", sample_schema.DEFAULT_ROLE)
        sample = self._base(t, stamp, role, metrics.pop("node_state", sample_schema.STATE_UP))
        assert t.prev is not None  # read when the target was found (rescan)
        total, user, system = cpu_rates(t.prev, reading, now - t.prev_t)
        sample.update(
            vmrss_kb=reading.rss_kb,
            cpu_clock_hz=total,
            cpu_user_hz=user,
            cpu_system_hz=system,
            cpu_user_seconds=cpu_seconds(reading.utime_ticks),
            cpu_system_seconds=cpu_seconds(reading.stime_ticks),
            threads=reading.threads,
        )
        sample.update(metrics)
        t.prev, t.prev_t = reading, now
        return sample

    # -- self-samples ---------------------------------------------------------------------------
    def self_sample(self) -> dict:
        """The agent's figures now (flowstat.schema.agent); delivery summed over its --sink sinks.
        Their counters belong to the sink threads: read unlocked, each is a moment's value."""
        sinks = self.sink_runners + self.retired  # cumulative figures: a sink a reload removed still counts
        spools = [r.spool for r in self.sink_runners if r.spool is not None]
        # InfluxDB keeps one point per series and time: the last self-sample, taken at exit, may fall
        # in the millisecond of the one before, and would replace it.
        self.last_self_ms = max(int(time.time() * 1000), self.last_self_ms + 1)
        doc = {
            "time": iso_utc_from_ms(self.last_self_ms),
            "run_id": self.cfg.spec.run_id or self.targets_run_id or "",
            "host": self.host,
            "agent": self.agent_name,
            "seq": self.self_seq,
            "interval_s": float(self.cfg.interval_s),
            "rounds": self.rounds,
            "skipped_rounds": self.skipped_rounds,
            "samples": self.samples_taken,
            "control_errors": self.control.errors,
            "proc_errors": self.proc_errors,
            "delivered": sum(r.delivered for r in sinks),
            "refused": sum(r.refused for r in sinks),
            "lost": sum(r.lost for r in sinks),
            "send_failures": sum(r.send_failures for r in sinks),
            "spool_dropped": sum(s.dropped_samples for s in spools),
            "targets": len(self.targets),
            # the sinks of now (as each sink thread settled its last batch), as the C agent counts them
            "spooled_batches": sum(r.spooled[0] for r in self.sink_runners),
            "spooled_samples": sum(r.spooled[1] for r in self.sink_runners),
            "sinks_down": sum(1 for r in self.sink_runners if r.failing),
            "failovers": sum(r.failovers() for r in sinks),
        }
        if not doc["run_id"]:
            del doc["run_id"]
        self.self_seq += 1
        return doc

    def _submit_round(self, round_: tuple[list[dict], list[dict]]) -> None:
        samples, edges = round_
        for r in self.runners:
            r.submit(samples, edges)

    def _submit_self_sample(self) -> None:
        doc = self.self_sample()
        for r in self.runners:
            r.submit_self_sample(doc)

    # -- loop -----------------------------------------------------------------------------------
    def run(self) -> int:
        for r in self.runners:
            r.start()
        if self.cfg.run_doc:  # the run is in the stores from its start, verdict pending (flowstat run
            for r in self.sink_runners:  # sends the complete document again at its end)
                r.submit_run(self.cfg.run_doc)
        start = time.monotonic()
        self.rescan(first=True)
        next_rescan = start + self.cfg.rescan_s
        every = self.cfg.self_interval_s
        next_self = start + every if every > 0 else math.inf
        tick = 0
        noticed = False
        try:
            while not self.stop_event.is_set():
                self.wake.clear()
                if self.reload_requested:
                    if self._reload():  # new timings: counted from now
                        start, tick = time.monotonic() - self.cfg.interval_s, 1
                        every = self.cfg.self_interval_s
                        next_self = time.monotonic() + every if every > 0 else math.inf
                    next_rescan = time.monotonic() + self.cfg.rescan_s
                now = time.monotonic()
                if now >= next_rescan or self.dirs_changed():
                    self.rescan()
                    next_rescan = now + self.cfg.rescan_s
                if tick > 0:
                    self._submit_round(self.sample_all())
                    self.rounds += 1
                    if time.monotonic() >= next_self:
                        self._submit_self_sample()
                        next_self += every * (1 + (time.monotonic() - next_self) // every)  # none to catch up
                if self.ending and not noticed:
                    noticed = True
                    log.info("run-ending notice: nodes that exit from now on are reported STOPPED")
                if self.cfg.count is not None and self.rounds >= self.cfg.count:
                    break
                if self.cfg.duration_s is not None and now - start >= self.cfg.duration_s:
                    break
                if self.cfg.exit_when_all_down and tick > 0 and not self.targets and self.gone:
                    break
                due = math.floor((time.monotonic() - start) / self.cfg.interval_s) + 1
                self.skipped_rounds += max(0, due - tick - 1)
                tick = max(tick + 1, due)
                self.wake.wait(max(0.0, start + tick * self.cfg.interval_s - time.monotonic()))
            if self.stop_event.is_set() and self.targets:
                # Stopped from outside: one last pass, so that nodes which ended are reported (DOWN,
                # or STOPPED after the run-ending notice).
                self._submit_round(self.sample_all())
            if every > 0:
                self._submit_self_sample()  # the last one, behind every sample
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        for r in self.runners:
            if r.is_alive():
                r.stop()
        self.runners += self.retired  # stopped by a reload: their drain, and its deadline, with the others'
        self.retired = []
        # Queued batches get max(drain, 5 s), a send in progress its time-out (each node's, for a
        # list of nodes), the spool drain_s.
        deadline = (
            time.monotonic()
            + max(self.cfg.drain_s, SinkRunner.QUEUED_AT_STOP_S)
            + self.cfg.drain_s
            + max([SEND_TIMEOUT_MAX_S] + [r.sink.longest_send_s() + 5 for r in self.runners])
        )
        for r in self.runners:
            if not r.done.wait(max(0.0, deadline - time.monotonic())):
                log.error("sink %s did not finish delivering: %d queued samples are lost", r.sink.url, r.abandon())
        self.control.close()
        for t in self.targets.values():
            t.close()

    def stats(self) -> dict:
        return {
            "samples": self.samples_taken,
            "self_samples": self.self_seq,
            "rounds": self.rounds,
            "skipped_rounds": self.skipped_rounds,
            "targets": len(self.targets),
            "gone": len(self.gone),
            "control_errors": self.control.errors,
            "proc_errors": self.proc_errors,
            "sinks": {
                r.sink.url: {
                    "delivered": r.delivered,
                    "refused": r.refused,
                    "lost": r.lost,
                    # `is not None`: an empty spool is falsy (len 0), and its drops still count
                    "spooled": len(r.spool) if r.spool is not None else 0,
                    "spooled_samples": r.spool.samples if r.spool is not None else 0,
                    "spool_dropped": r.spool.dropped_samples if r.spool is not None else 0,
                    "failovers": r.failovers(),
                }
                for r in self.runners
            },
        }
