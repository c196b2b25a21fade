"""``flowstat run``: start every device of a topology, run, stop cleanly, and summarise.

Devices are started downstream first (viewer, the last layer of mergers, ..., the first layer,
producers) so that every connect finds its peer bound; each binds an ephemeral loopback port and
reports it on its stdout. The producers start sending together on a ``start`` command. Stopping
goes upstream first, stage by stage: producers get SIGTERM, send what their buffers still hold and
an end-of-stream marker; each merger ends when all its inputs (producers, or mergers of the layer
below) have ended, layer after layer, the viewer when the last layer has. A stage that lost a member
is told to stop instead of waiting for markers that will never come. Devices run in their own
session (Ctrl-C reaches only the orchestrator) and get SIGTERM from the kernel if the orchestrator
dies, so nothing is orphaned.
A topology's ``cpus`` pins devices and agents to CPUs as each is started. A run that ends in order
(its duration is over, or the user interrupts it) first gives the agents the run-ending notice, so
that they report the nodes it stops as STOPPED, not DOWN; a run broken by a node's crash does not.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowstat.node import curve
from flowstat.node.protocol import ControlClient, ControlError
from flowstat.proc.procfs import format_cpu_list, log_tail, pin_threads, set_from_signal
from flowstat.schema import endpoints as endpoints_schema
from flowstat.schema import run as run_schema
from flowstat.schema.sample import PIPELINE_ROLES
from flowstat.timeutil import compact_utc

from . import clocks
from .agents import AgentOptions, RunAgents
from .flowwatch import FlowWatch
from .launch import Launcher, LaunchError, LocalLauncher, host_lost
from .online import OnlineJudge, reading
from .summary import RunOutcome, build_summary, run_document
from .topology import VIEWER_NODE, Topology, producer_process_name

if TYPE_CHECKING:
    from flowstat.flow import Verdict

READY_TIMEOUT_S = 60.0  # building a producer's pool of 50 MB objects takes a while
STAGE_TIMEOUT_S = 60.0  # a stage stopping with nothing taken nor sent for this long is stopped
PROGRESS_EVERY_S = 2.0  # how often a stopping stage's counters are read
QUIET_S = 4.0  # a stage whose inputs cannot all end it is stopped once it took nothing for this long
READ_END_S = 10.0  # for an exited device's last lines to be read (at once, unless a child holds its pipe)


# How long the devices that end after one that ended on its own get to be seen ending too.
ENDS_SETTLE_S = 2.0


class RunError(RuntimeError):
    """The run could not start or was broken; the message says which node and where its log is."""


@dataclass
class DeviceProcess:
    name: str
    role: str
    config: dict[str, Any]
    log_path: Path
    proc: subprocess.Popen | None = None
    ready: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    events: queue.Queue[dict] = field(default_factory=queue.Queue)
    signalled: bool = False
    gave_up: bool = False  # told to stop without delivering what it holds (SIGUSR1, SIGKILL)
    cpus: list[int] | None = None  # the CPUs it may run on, read back after pinning; None: it died at once
    host: str = ""  # where it runs, as samples name the host (the launcher's placement)
    reader: threading.Thread | None = None  # takes its stdout's events

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def read_to_end(self, timeout: float = READ_END_S) -> None:
        """Wait for its reader to take its last line: its final report may still be in the pipe."""
        if self.reader is not None:
            self.reader.join(timeout)

    @property
    def pid(self) -> int:
        """Its process id on its host: what it said when ready (under srun, proc is srun's)."""
        if self.ready is not None and isinstance(self.ready.get("pid"), int):
            return int(self.ready["pid"])
        if self.proc is None:
            raise RunError(f"{self.name} was not started")
        return self.proc.pid

    def ready_event(self) -> dict[str, Any]:
        """What it said when it was ready (its endpoints), once Orchestrator.wait_ready has seen it."""
        if self.ready is None:
            raise RunError(f"{self.name} has not said it is ready")
        return self.ready

    def log_tail(self, lines: int = 12) -> str:
        return log_tail(self.log_path, lines)


def sent_end_of_stream(dev: DeviceProcess) -> bool:
    """Whether a device that ended sent its end-of-stream markers downstream: it ended well (code 0
    and its final report) and was not told to give up (a producer that gives up sends none)."""
    return dev.exit_code == 0 and dev.final is not None and not dev.gave_up


# (seconds since the start, the run's length, every node's get-metrics reply, the mergers' verdicts,
# which node holds the flow back as of this reading: the orchestrator's own FlowWatch, judged once)
ProgressCallback = Callable[[float, float, list[dict], dict[str, dict], "Verdict | None"], None]


class Orchestrator:
    def __init__(
        self,
        topo: Topology,
        run_id: str,
        run_dir: Path,
        on_progress: ProgressCallback | None = None,
        agent: AgentOptions | None = None,
        launcher: Launcher | None = None,
    ):
        self.topo, self.run_id, self.run_dir = topo, run_id, run_dir
        self.launcher: Launcher = launcher or LocalLauncher(topo.host)
        self.on_progress = on_progress
        self.agents = RunAgents(run_id, run_dir, agent or AgentOptions(enabled=False), self.pin, launcher)
        self.devices: list[DeviceProcess] = []
        self.wakeup = threading.Event()  # set by a device's exit or by Ctrl-C
        self.interrupts = 0
        self.failures: list[str] = []
        self.started_at = self.stopped_at = 0.0  # monotonic: the start command, the stop signal
        self.started_wall = time.time()  # the start command, wall clock (the run document's start)
        self.clients: dict[str, ControlClient] = {}
        self.clocks: dict[str, dict[str, Any]] = {}  # device -> its host, offsets and round trips (clocks.py)
        self.layer_of = topo.layer_of()
        self.ready_timeout_s = READY_TIMEOUT_S
        self.judge = self.new_judge(topo.duration)
        self.flow = self.new_flow_watch(topo.duration)
        # CURVE: the run's keys, made before any node starts (flowstat.node.curve)
        binds = {self.launcher.bind_host(n) for n, r in topo.node_roles().items() if r != "agent"}
        self.keys: Path | None = None
        self.curve: tuple[bytes, tuple[bytes, bytes]] | None = None  # the nodes' key, our pair
        if topo.curve_on_control(binds) or topo.data_security == "curve":
            self.keys = curve.create_run_keys(run_dir)
            self.curve = (
                curve.read_key_file(self.keys / "node.key")[0],
                curve.client_keys(self.keys / "client.key_secret"),
            )

    def new_judge(self, duration: float) -> OnlineJudge:
        """Every merger is judged, whatever its layer: a merger above the first is offered what its
        input mergers sent it, as one of the first layer is what its producers sent it."""
        topo = self.topo
        inputs = {
            **{m.node_id: len(m.producers) for m in topo.mergers},
            **{m: len(ins) for m, ins in topo.merger_inputs().items()},
        }
        # A merger may hold one object of each of its inputs' for a merge.
        return OnlineJudge(duration, {m: n * topo.obj.nbytes for m, n in inputs.items()})

    def new_flow_watch(self, duration: float) -> FlowWatch:
        """Which node holds the flow back, judged at each reading over the topology's edges."""
        inputs = self.topo.inputs_of()
        nodes = [n for n, role in self.topo.node_roles().items() if role != "agent"]
        return FlowWatch({n: inputs.get(n, ()) for n in nodes}, run_schema.startup_s(duration))

    def stage_of(self, dev: DeviceProcess) -> tuple[int, int]:
        """Where a device is in the pipeline: its role's place, then its layer (mergers)."""
        return PIPELINE_ROLES.index(dev.role), self.layer_of.get(dev.name, 0)

    # -- processes ------------------------------------------------------------------------------
    def spawn(self, name: str, role: str, config: dict[str, Any]) -> DeviceProcess:
        dev = DeviceProcess(
            name,
            role,
            {
                "node_id": name,
                "run_id": self.run_id,
                "host": self.launcher.bind_host(name),
                **self.security(),
                **config,
            },
            self.run_dir / "logs" / f"{name}.log",
            host=self.launcher.host_of(name),
        )
        cmd = [sys.executable, "-m", "flowstat.harness.devices", role, "--config", json.dumps(dev.config)]
        with open(dev.log_path, "ab") as log:
            dev.proc = self.launcher.start(name, cmd, log)
        dev.reader = threading.Thread(target=self._read_events, args=(dev,), daemon=True, name=f"read-{name}")
        dev.reader.start()
        self.devices.append(dev)  # before pinning: a device that cannot be pinned is still stopped
        if self.launcher.kind == "local":  # pinned where it runs: a Slurm site pins with its own options
            dev.cpus = self.pin(name, role, dev.proc.pid)
        return dev

    def security(self) -> dict[str, Any]:
        """What a device is told of CURVE: the run's keys folder, and whether data is secured too."""
        if self.keys is None:
            return {}
        return {"curve_keys": str(self.keys), "curve_data": self.topo.data_security == "curve"}

    def pin(self, name: str, role: str, pid: int) -> list[int] | None:
        """Pin a process just started to the CPUs the topology gives its node or role, and return
        the CPUs it may run on as the kernel reports them (unpinned: those it inherited). None when
        it has exited already: waiting for it says why."""
        wanted = self.topo.cpus_for(name, role)
        try:
            got = pin_threads(pid, wanted) if wanted else os.sched_getaffinity(pid)
        except ProcessLookupError:
            return None
        except OSError as exc:  # its CPUs were checked at loading: since then one went offline, or a cpuset changed
            raise RunError(f"cannot pin {name} to CPUs {format_cpu_list(wanted or ())}: {exc.strerror}") from None
        if wanted and got != wanted:
            raise RunError(
                f"{name} was to run on CPUs {format_cpu_list(wanted)}, the kernel lets it run on "
                f"{format_cpu_list(got)}"
            )
        return sorted(got)

    def affinity(self) -> list[dict[str, Any]]:
        """The run document's affinity: every device's and agent's CPUs, as read back."""
        return [
            {"node_id": d.name, "role": d.role, "cpus": d.cpus} for d in self.devices if d.cpus is not None
        ] + self.agents.affinity()

    def _read_events(self, dev: DeviceProcess) -> None:
        assert dev.proc is not None and dev.proc.stdout is not None
        for line in dev.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "final":
                dev.final = event
            dev.events.put(event)
        dev.proc.wait()
        dev.events.put({"event": "exit", "code": dev.proc.returncode})
        self.wakeup.set()

    def wait_ready(self, dev: DeviceProcess) -> dict[str, Any]:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.interrupts:
                raise RunError("interrupted while starting")
            try:
                event = dev.events.get(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise RunError(
                        f"{dev.name} on {dev.host} did not become ready in {self.ready_timeout_s:g} s; "
                        f"log: {dev.log_path}"
                    ) from None
                continue
            if event.get("event") == "ready":
                dev.ready = event
                return event
            if event.get("event") == "exit":
                raise RunError(
                    f"{dev.name} on {dev.host} exited with code {event['code']} while starting; log: "
                    f"{dev.log_path}\n{dev.log_tail()}"
                )

    def signal(self, dev: DeviceProcess, sig: int) -> None:
        if dev.proc is not None and dev.proc.poll() is None:
            self.launcher.signal(dev.proc, sig)
            dev.signalled = True
            dev.gave_up = dev.gave_up or sig in (signal.SIGUSR1, signal.SIGKILL)

    def kill_all(self) -> None:
        self.agents.kill()
        for dev in self.devices:
            self.signal(dev, signal.SIGKILL)
        for dev in self.devices:
            if dev.proc is not None:
                dev.proc.wait()

    # -- phases ---------------------------------------------------------------------------------
    def start(self) -> None:
        topo = self.topo
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            self.launcher.prepare(topo.placement, device_names(topo))
        except LaunchError as exc:
            raise RunError(str(exc)) from None
        viewer = self.spawn(
            VIEWER_NODE,
            "viewer",
            {
                "mergers": len(topo.layers()[-1]),
                "buffer_size": topo.merger_send_buffer,
                "output": str(self.run_dir / "viewer.root"),
                "write_interval": topo.viewer_write_interval,
                "merge_cost": _cost_config(topo, VIEWER_NODE),
            },
        )
        endpoints = {VIEWER_NODE: self.wait_ready(viewer)["data"]}
        self.start_mergers(endpoints)
        merger_endpoints = {mi: endpoints[spec.node_id] for mi, spec in enumerate(topo.mergers)}
        owner = topo.merger_of()
        # The kernel's socket buffers of the producer->merger connections (None: auto-tuned)
        kernel = {"kernel_buffer_size": topo.kernel_buffer_size} if topo.kernel_buffer_size else {}
        obj = {
            "type": topo.obj.kind.name,
            "shape": list(topo.obj.shape),
            "entries": topo.obj.entries,
            "names": topo.obj.names,
        }
        producers = []
        for gi, ids in enumerate(topo.producer_groups()):
            producers.append(
                self.spawn(
                    producer_process_name(gi),
                    "producer",
                    {
                        "producers": ids,
                        "endpoints": [merger_endpoints[owner[p]] for p in ids],
                        "mergers": [topo.mergers[owner[p]].node_id for p in ids],
                        "rate": topo.rate,
                        "buffer_size": topo.buffer_size,
                        "object": obj,
                        "seed": gi,
                        **kernel,
                    },
                )
            )
        for dev in producers:
            self.wait_ready(dev)
        for dev in self.devices:
            self.clients[dev.name] = ControlClient(dev.ready_event()["control"], timeout_s=2.0, curve=self.curve)
        self.measure_clocks("start")
        self.write_endpoints()
        self.started_wall = time.time()  # the run's start for run.json, the run file and the summary
        self.write_run_document()  # what the Python agent reads as it starts: what is run
        self.agents.start()
        self.write_run_document()  # again, with the agents' CPUs
        self.started_at = time.monotonic()
        for dev in producers:
            self.clients[dev.name].request("start")

    def measure_clocks(self, when: str) -> None:
        """Every running device's clock offset from ours (clocks.measure), as ``when`` (start, end)."""
        for dev in self.devices:
            client = self.clients.get(dev.name)
            if client is None or dev.exit_code is not None:
                continue
            measured = clocks.measure(client)
            entry = self.clocks.setdefault(dev.name, {"host": dev.host})
            if measured is not None:
                entry[f"offset_{when}_ms"] = measured["offset_ms"]
                entry[f"round_trip_{when}_ms"] = measured["round_trip_ms"]

    def start_mergers(self, endpoints: dict[str, str]) -> None:
        """Start the mergers, the last layer first, a layer once what it sends to is ready (the
        mergers of a layer start together); add their data endpoints to ``endpoints`` (node id ->
        endpoint)."""
        topo = self.topo
        layers, downstream, inputs = topo.layers(), topo.downstream_of(), topo.merger_inputs()
        for li in range(len(layers), 0, -1):
            started = []
            for index, name in enumerate(layers[li - 1]):
                extra = {}
                if li == 1:  # fed by producers, over the producers' buffer and kernel buffers
                    sources, buffer_size = list(topo.mergers[index].producers), topo.buffer_size
                    if topo.kernel_buffer_size:
                        extra["kernel_buffer_size"] = topo.kernel_buffer_size
                else:  # fed by mergers of the layer below, as the viewer is: over their send buffer
                    sources, buffer_size = [layers[li - 2].index(m) for m in inputs[name]], topo.merger_send_buffer
                dev = self.spawn(
                    name,
                    "merger",
                    {
                        "index": index,
                        "layer": li,
                        "producers": sources,
                        "buffer_size": buffer_size,
                        "send_buffer": topo.merger_send_buffer,
                        "downstream_endpoint": endpoints[downstream[name]],
                        "merge_cost": _cost_config(topo, name),
                        **extra,
                    },
                )
                started.append(dev)
            for dev in started:
                endpoints[dev.name] = self.wait_ready(dev)["data"]

    def write_endpoints(self) -> None:
        """Where each node's control socket is, for monitors (the agents) to find them, and who feeds
        each (the pipeline's edges, from the topology: producers are fed by none)."""
        inputs = self.topo.inputs_of()
        nodes = [
            {
                "node_id": d.name,
                "role": d.role,
                "pid": d.pid,
                "host": d.host,
                "control": d.ready_event()["control"],
                "data": d.ready_event().get("data"),
                "upstream": list(inputs.get(d.name, ())),
                **({"curve_server_key": self.curve[0].decode()} if self.curve else {}),
            }
            for d in self.devices
        ]
        doc = endpoints_schema.document(self.run_id, nodes)
        # Whole or absent: the agents, and whoever waits for it, read it as soon as it is there.
        _replace_whole(self.run_dir / "endpoints.json", json.dumps(doc, indent=1))

    def write_run_document(self, summary: dict[str, Any] | None = None) -> None:
        """RUN_DIR/run.json: at the start what is run, at the end how it went (flowstat.schema.run)."""
        doc = run_document(
            self.topo,
            self.run_id,
            self.started_wall,
            summary,
            [d.name for d in self.devices],
            self.affinity(),
            self.clocks,
        )
        # Replaced whole, never rewritten in place: the Python agent may be reading it as it starts.
        _replace_whole(self.run_dir / "run.json", json.dumps(doc, indent=1))

    def outcome(self) -> RunOutcome:
        """What the run ended with, for its summary."""
        finals = {d.name: d.final for d in sorted(self.devices, key=self.stage_of) if d.final is not None}
        return RunOutcome(
            self.run_id,
            self.run_dir,
            finals,
            {d.name: d.log_path for d in self.devices},
            max(0.0, self.stopped_at - self.started_at),
            self.failures + ["interrupted by the user"] * bool(self.interrupts),
            self.judge.verdicts(),
            self.affinity(),
            self.flow.run_verdict(),
        )

    def crashed(self) -> list[DeviceProcess]:
        """The devices that ended without flowstat telling them to: dead, or stopped from outside
        (a SIGTERM from someone else, or Slurm's at scancel: a device ends well on it, code 0 and
        its final report, and no device ends on its own before the run's end)."""
        return [d for d in self.devices if d.exit_code is not None and not d.signalled]

    def ends_settled(self, broken: list[DeviceProcess]) -> list[DeviceProcess]:
        """Every device that ended on its own, upstream first. A device stopped from outside ends
        those downstream of it too (a merger's end reaches the viewer), and the viewer may be seen
        to exit first: the others get ENDS_SETTLE_S to be seen, so that the run names its cause."""
        deadline = time.monotonic() + ENDS_SETTLE_S
        while time.monotonic() < deadline and len(self.crashed()) < len(self.devices):
            self.wakeup.wait(deadline - time.monotonic())  # set at each device's exit
            self.wakeup.clear()
        ended = sorted(self.crashed() or broken, key=self.stage_of)
        for dev in ended:  # whether it ended well is in its final report
            dev.read_to_end()
        return ended

    def poll_metrics(self) -> list[dict]:
        """Every running node's get-metrics reply. Producers are read first, then the mergers layer
        by layer, and each merger is told what its inputs sent it (upstream_sent), so that it
        reports what is in flight to it; the mergers' readings go to the online judge."""
        replies = []
        sent: dict[str, list[int]] = {}  # per merger: objects sent to it, overload events
        downstream = self.topo.downstream_of()
        running = [d for d in self.devices if d.exit_code is None]
        for dev in sorted(running, key=self.stage_of):
            fields: dict[str, Any] = {}
            if dev.role == "merger" and dev.name in sent:
                fields["upstream_sent"] = sent[dev.name][0]
            try:
                reply = self.clients[dev.name].request("get-metrics", **fields)
            except (ControlError, ValueError):
                continue
            replies.append(reply)
            if dev.role == "producer":
                for merger, m in (reply.get("to_mergers") or {}).items():
                    self.count_sent(sent, merger, m["sent"], m["overload_events"])
            elif dev.role == "merger":
                if downstream[dev.name] != VIEWER_NODE:  # what the next layer's merger is offered
                    self.count_sent(
                        sent,
                        downstream[dev.name],
                        reply.get("objects_sent") or 0,
                        reply.get("send_overload_events") or 0,
                    )
                if dev.name in sent:
                    self.judge.add(dev.name, reading(reply, time.monotonic() - self.started_at, *sent[dev.name]))
        self.flow.add(time.monotonic() - self.started_at, replies)
        return replies

    @staticmethod
    def count_sent(sent: dict[str, list[int]], merger: str, objects: int, overload_events: int) -> None:
        total = sent.setdefault(merger, [0, 0])
        total[0] += objects
        total[1] += overload_events

    def run_for(self, duration: float) -> None:
        deadline = self.started_at + duration
        self.judge = self.new_judge(duration)
        self.flow = self.new_flow_watch(duration)
        next_progress = self.started_at + 1.0  # a first sample would measure start-up, not the run
        while not self.interrupts:
            now = time.monotonic()
            if now >= deadline:
                break
            broken = self.crashed()
            if broken:
                for dev in self.ends_settled(broken):
                    tail = dev.log_tail()
                    lost = host_lost(tail)
                    if lost:
                        how = f"lost with its host ({lost}: Slurm's node failure)"
                    elif dev.exit_code == 0 and dev.final is not None:
                        how = "was stopped from outside (it ended well, as on a SIGTERM flowstat did not send)"
                    else:
                        how = f"exited with code {dev.exit_code}"
                    self.failures.append(
                        f"{dev.name} ({dev.role}) on {dev.host} {how} during the run; log: {dev.log_path}\n{tail}"
                    )
                break
            if now >= next_progress:
                metrics = self.poll_metrics()
                if self.on_progress is not None:
                    self.on_progress(
                        now - self.started_at, duration, metrics, self.judge.verdicts(), self.flow.latest()
                    )
                next_progress = now + 1.0
            self.wakeup.wait(max(0.0, min(next_progress, deadline) - time.monotonic()))
            self.wakeup.clear()
        self.stopped_at = time.monotonic()

    def stop(self, force: bool = False) -> None:
        """Stop upstream first and wait for each stage to drain; escalate on time-outs.

        ``force`` tells every stage to stop at once (the run never started properly).
        """
        order = sorted({self.stage_of(d) for d in self.devices})  # producers, each layer of mergers, the viewer
        stages = [[d for d in self.devices if self.stage_of(d) == stage] for stage in order]
        # With a merger or the viewer dead, producers cannot deliver everything: SIGUSR1 tells them
        # to stop retrying and report what they could not send. A dead producer takes only its own
        # objects with it: the others deliver theirs and declare them, as in a run that ends well.
        downstream_dead = any(d.role != "producer" for d in self.crashed())
        stop_signal = signal.SIGUSR1 if (force or downstream_dead) else signal.SIGTERM
        for i, stage in enumerate(stages):
            hurried = stage if (i == 0 or force) else self.cut_off(stage)
            if i > 0 and hurried and not force:
                # Some of their inputs will never send their end-of-stream marker (a device upstream
                # died, or producers gave up on their channels): once nothing more arrives, stop
                # them, rather than waiting STAGE_TIMEOUT_S for markers that cannot come. The
                # others' markers are on their way: they end on them, however long the drain.
                self.wait_exit(hurried, QUIET_S, while_progressing=True)
            for dev in hurried:
                self.signal(dev, stop_signal)
            if not self.wait_exit(stage, STAGE_TIMEOUT_S, while_progressing=True):
                for dev in stage:
                    if dev.exit_code is None:
                        self.failures.append(
                            f"{dev.name} made no progress for {STAGE_TIMEOUT_S:.0f} s while stopping; stopping it"
                        )
                        self.signal(dev, signal.SIGUSR1)
                if not self.wait_exit(stage, 10.0):
                    for dev in stage:
                        self.signal(dev, signal.SIGKILL)
                    self.wait_exit(stage, 10.0)
            for dev in stage:
                if dev.exit_code != 0 or dev.final is None:
                    msg = f"{dev.name} ({dev.role}) ended with code {dev.exit_code} without its final report"
                    if dev.final is None and not any(f.startswith(dev.name) for f in self.failures):
                        self.failures.append(f"{msg}; log: {dev.log_path}")

    def cut_off(self, stage: list[DeviceProcess]) -> list[DeviceProcess]:
        """The devices of a stage that some input will not send its end of stream: one that ended
        badly (a crash, a host lost, no final report) or was told to give up (SIGUSR1, SIGKILL)."""
        by_name = {d.name: d for d in self.devices}
        inputs = self.topo.inputs_of()
        return [
            dev
            for dev in stage
            if not all(
                (src := by_name.get(name)) is not None and sent_end_of_stream(src) for name in inputs.get(dev.name, ())
            )
        ]

    def wait_exit(self, stage: list[DeviceProcess], timeout: float, while_progressing: bool = False) -> bool:
        """Wait for every device of ``stage`` to exit, at most ``timeout`` s; ``while_progressing``:
        ``timeout`` s without progress (a merger draining a long queue takes what it takes, a hung one
        is stopped: its counters tell them apart)."""
        deadline = time.monotonic() + timeout
        last, next_look = None, time.monotonic() + PROGRESS_EVERY_S
        while any(d.exit_code is None for d in stage):
            if self.interrupts > 1:
                self.kill_all()
                return True
            if while_progressing and time.monotonic() >= next_look:
                now = self.stage_counters(stage)
                if last is not None and now != last:
                    deadline = time.monotonic() + timeout
                last, next_look = now, time.monotonic() + PROGRESS_EVERY_S
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.wakeup.wait(min(remaining, 0.5))
            self.wakeup.clear()
        for dev in stage:
            dev.read_to_end()
        return True

    def stage_counters(self, stage: list[DeviceProcess]) -> tuple[tuple[Any, ...] | None, ...]:
        """What a stage's running devices have taken and sent so far (None for one that does not answer)."""
        out: list[tuple[Any, ...] | None] = []
        for dev in stage:
            if dev.exit_code is not None or dev.name not in self.clients:
                continue
            try:
                reply = self.clients[dev.name].request("get-metrics")
            except (ControlError, ValueError):
                out.append(None)
                continue
            out.append(tuple(reply.get(k) for k in ("objects_received", "objects_merged", "objects_sent")))
        return tuple(out)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def device_names(topo: Topology) -> list[str]:
    """Every device a run of ``topo`` starts (its agents aside)."""
    return [name for name, role in topo.node_roles().items() if role != "agent"]


def _cost_config(topo: Topology, node: str) -> dict[str, float] | None:
    """The merge cost a merger or the viewer is configured with (Topology.cost_of); None: none."""
    cost = topo.cost_of(node)
    return cost.config() if cost else None


def run_topology(
    topo: Topology,
    *,
    duration: float | None = None,
    run_id: str | None = None,
    runs_dir: Path = Path("runs"),
    on_progress: ProgressCallback | None = None,
    agent: AgentOptions | None = None,
    launcher: Launcher | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> dict[str, Any]:
    """Run a topology to completion and return its summary (see summary.build_summary); the run
    directory gets summary.json and the complete run document (run.json)."""
    run_id = run_id or f"{topo.run_id}-{compact_utc()}"
    run_dir = runs_dir / run_id
    if run_dir.exists():
        raise RunError(f"run directory {run_dir} already exists; choose another --run-id")
    run_dir.mkdir(parents=True)
    orch = Orchestrator(topo, run_id, run_dir, on_progress, agent if agent is not None else AgentOptions(), launcher)
    orch.ready_timeout_s = ready_timeout_s

    def on_signal(signum, _frame):
        orch.interrupts += 1
        set_from_signal(orch.wakeup)
        if orch.interrupts > 1:
            print("\nflowstat: second interrupt, killing every device", file=sys.stderr)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    agent_stats = None
    try:
        try:
            orch.start()
        except RunError as exc:
            orch.failures.append(str(exc))
        except ControlError as exc:
            orch.failures.append(f"cannot start the producers: {exc}")
        started = not orch.failures
        if started:
            orch.run_for(duration if duration is not None else topo.duration)
            if not orch.failures:  # else devices may be gone, their srun not yet ended: no answer
                orch.measure_clocks("end")
            if not orch.failures and not orch.crashed():  # its duration is over, or the user interrupted it
                orch.agents.notice_run_ending()
        else:
            orch.stopped_at = orch.started_at = time.monotonic()
        orch.stop(force=not started)  # a device dead during the run: stop() chooses how (see there)
        agent_stats = orch.agents.stop(orch.failures)
    finally:
        orch.kill_all()  # no-op when everything ended; never leave a device behind
        orch.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    ended = orch.launcher.ended_by()  # a job cancelled or timed out ended every device at once
    orch.launcher.close()  # then the allocation it asked for is given back
    if ended:
        orch.failures.insert(0, ended)
    summary = build_summary(topo, orch.outcome(), started_epoch=orch.started_wall)
    summary["cancelled"] = bool(ended)
    summary["clocks"] = orch.clocks
    summary["warnings"] = clocks.correct(summary, topo, orch.clocks)
    summary["agent"] = agent_stats
    summary["launcher"] = orch.launcher.describe()
    summary["placement"] = {**{d.name: d.host for d in orch.devices}, **orch.agents.hosts}  # process -> host
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    orch.write_run_document(summary)
    problem = orch.agents.send_run_document()
    if problem:
        print(f"flowstat: {problem}", file=sys.stderr)
    return summary


def _replace_whole(path: Path, text: str) -> None:
    """Write a file a reader may open at any moment: under another name, then renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
