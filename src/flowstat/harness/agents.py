"""The agents that watch a run: started as its producers start, told when it ends in order, stopped
and heard from (their statistics), and sent its complete run document at the end. Every run is
monitored and recorded by the Python agent (it writes the run file); the C agent watches beside
it when it is built. A run across hosts (flowstat run --slurm) gets them on every host that runs
devices, as job steps beside the devices, each taking its host's nodes and naming its host
(``--host-name``); their run files are joined into the run's at the end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from flowstat.proc.procfs import catches
from flowstat.schema import prometheus

from .launch import Launcher
from .topology import AGENT_NODES

AGENT_START_S = 10.0  # how long an agent may take to start (the Python one imports) before it takes signals
RUN_ENDING = signal.SIGUSR1  # the agents' run-ending notice (collectors/README.md)
C_AGENT = "flowstat-agent"
READY_FILE_ENV = "FLOWSTAT_AGENT_READY_FILE"  # both agents create it once they take the notice


@dataclass
class AgentOptions:
    """The Python agent that watches every run (``flowstat run`` starts it unless told not to)."""

    enabled: bool = True
    interval_s: float = 1.0
    sinks: list[str] = field(default_factory=list)
    c_agent: bool = True  # also start the C agent, when it is built
    self_interval_s: float = 5.0  # the agents' self-samples (flowstat_agent)


def find_c_agent() -> Path | None:
    """The C agent: $FLOWSTAT_C_AGENT, else beside this Python (make installs it into the venv's
    bin/, as pip does console scripts), else on the PATH."""
    if os.environ.get("FLOWSTAT_C_AGENT"):
        return Path(os.environ["FLOWSTAT_C_AGENT"])
    beside = Path(sys.executable).parent / C_AGENT
    if beside.exists():
        return beside
    found = shutil.which(C_AGENT)
    return Path(found) if found else None


PULL_SCHEMES = ("prometheus",)  # sinks that serve samples to whoever asks and keep none


def agent_sinks(sinks: list[str], index: int, run_file: Path) -> list[str]:
    """The sinks of the run's INDEX-th agent (0: the Python one, 1: the C one). A /metrics endpoint
    given once serves each agent on a port of its own: the Python agent on the port given, the C
    agent on the next (``prometheus://127.0.0.1:9464`` -> 9464 and 9465). When every sink given only
    serves what is scraped, the agent also writes the run's line-protocol file (RUN_DIR/samples-NAME.lp):
    a scrape keeps only the samples it saw, the run keeps them all."""
    out = []
    for url in sinks:
        parts = urlsplit(url)
        if parts.scheme in PULL_SCHEMES and index:
            port = (parts.port or prometheus.DEFAULT_PORT) + index
            url = urlunsplit(parts._replace(netloc=f"{_bracketed(parts.hostname or '127.0.0.1')}:{port}"))
        out.append(url)
    if all(urlsplit(url).scheme in PULL_SCHEMES for url in out):
        out.append(f"file://{run_file}")
    return out


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class RunAgents:
    """The agents of one run (``run_dir``: where they find its endpoints and write their files);
    ``pin`` pins a process just started as the topology says and returns its CPUs."""

    def __init__(
        self,
        run_id: str,
        run_dir: Path,
        options: AgentOptions,
        pin: Callable[[str, str, int], list[int] | None],
        launcher: Launcher | None = None,
    ):
        self.run_id, self.run_dir, self.options, self.pin = run_id, run_dir, options, pin
        self.launcher = launcher  # None or local: child processes here; else one set per host
        self.procs: dict[str, subprocess.Popen] = {}
        self.hosts: dict[str, str] = {}  # agent -> host, across hosts
        self.cpus: dict[str, list[int] | None] = {}

    def log(self, name: str) -> Path:
        return self.run_dir / "logs" / f"{name}.log"

    @property
    def across_hosts(self) -> bool:
        return self.launcher is not None and self.launcher.kind != "local"

    def commands(self, host: str | None = None) -> list[tuple[str, list[str]]]:
        """The agents to start: the Python agent (it also records the run file), and the C agent
        when it is built. Each ships to the user's sinks, or to a line-protocol file in the run.
        ``host``: the agents of one host of a run across hosts (named NAME-HOST, their run file
        samples.HOST.ndjson)."""
        opts, rd = self.options, self.run_dir.resolve()  # file:// URLs need absolute paths
        common = [
            "--run-id",
            self.run_id,
            "--endpoints",
            str(rd / "endpoints.json"),
            "--interval",
            str(opts.interval_s),
            "--self-interval",
            str(opts.self_interval_s),
            "--rescan",
            str(max(opts.interval_s, 1.0)),
            "--quiet",
        ]
        if host:
            common += ["--host-name", host, "--name", host]
        py_agent, c_agent_name = (f"{a}-{host}" for a in AGENT_NODES) if host else AGENT_NODES
        run_file = f"samples.{host}.ndjson" if host else "samples.ndjson"
        agents = [
            (
                py_agent,
                [
                    sys.executable,
                    "-m",
                    "flowstat.agent",
                    *common,
                    "--run-file",
                    str(rd / run_file),
                    "--run-doc",
                    str(rd / "run.json"),
                ],
            )
        ]
        c_agent = find_c_agent()
        if c_agent is not None and opts.c_agent:
            agents.append((c_agent_name, [str(c_agent), *common]))
        for index, (name, cmd) in enumerate(agents):
            cmd += ["--stats", str(rd / f"{name}-stats.json"), "--spool-dir", str(rd / "spool" / name)]
            for url in agent_sinks(opts.sinks, index, rd / f"samples-{name}.lp"):
                cmd += ["--sink", url]
        return agents

    def start(self) -> None:
        """Start the agents, each pinned as the topology says; they stop with this process (by
        PDEATHSIG, or at once if it died before they could ask for it)."""
        if not self.options.enabled:
            return
        if self.across_hosts:
            self.start_on_hosts()
            return
        env = dict(os.environ, FLOWSTAT_DIE_WITH_PARENT=str(os.getpid()))
        for name, cmd in self.commands():
            with open(self.log(name), "ab") as log:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=True,
                    env=env,
                )
            self.procs[name] = proc
            self.cpus[name] = self.pin(name, "agent", proc.pid)

    def ready_file(self, name: str) -> Path:
        return self.run_dir / "agents" / f"{name}.ready"

    def start_on_hosts(self) -> None:
        """The agents of every host that runs devices, as job steps there (they end with the
        allocation's steps, not by PDEATHSIG: their parent is Slurm's)."""
        assert self.launcher is not None
        (self.run_dir / "agents").mkdir(exist_ok=True)
        for host in self.launcher.hosts_in_use():
            for name, cmd in self.commands(host):
                with open(self.log(name), "ab") as log:
                    self.procs[name] = self.launcher.start(
                        name,
                        cmd,
                        log,
                        host=host,
                        stdout=subprocess.DEVNULL,
                        env={READY_FILE_ENV: str(self.ready_file(name).resolve())},
                    )
                self.hosts[name] = host

    def affinity(self) -> list[dict[str, Any]]:
        """The run document's affinity entries of the agents: their CPUs, as read back."""
        return [
            {"node_id": name, "role": "agent", "cpus": cpus} for name, cpus in self.cpus.items() if cpus is not None
        ]

    def notice_run_ending(self) -> None:
        """The run ends as planned: tell the agents (SIGUSR1) before any node is told to stop, so that
        a node that exits from now on is reported STOPPED, not DOWN. An agent still starting has not
        installed its handler yet, and the signal would kill it: it gets AGENT_START_S to do so."""
        deadline = time.monotonic() + AGENT_START_S
        if self.across_hosts:
            self._notice_on_hosts(deadline)
            return
        for name, proc in self.procs.items():
            while proc.poll() is None and not catches(proc.pid, RUN_ENDING) and time.monotonic() < deadline:
                time.sleep(0.05)  # polling /proc for the handler, with a deadline
            if proc.poll() is None and catches(proc.pid, RUN_ENDING):
                proc.send_signal(RUN_ENDING)
            elif proc.poll() is None:  # not a failure of the run: its nodes will just show DOWN at the end
                print(
                    f"flowstat: {name} did not take the run-ending notice within {AGENT_START_S:.0f} s; log: "
                    f"{self.log(name)}",
                    file=sys.stderr,
                )

    def _notice_on_hosts(self, deadline: float) -> None:
        """The notice to agents on other hosts, each once it said it takes it (its ready file: its
        process, not srun's, is what installs the handler)."""
        assert self.launcher is not None
        for name, proc in self.procs.items():
            while proc.poll() is None and not self.ready_file(name).exists() and time.monotonic() < deadline:
                time.sleep(0.05)  # polling a file another host writes, with a deadline
            if proc.poll() is None and self.ready_file(name).exists():
                self.launcher.signal(proc, RUN_ENDING)
            elif proc.poll() is None:
                print(
                    f"flowstat: {name} on {self.hosts[name]} did not say it takes the run-ending notice within "
                    f"{AGENT_START_S:.0f} s; log: {self.log(name)}",
                    file=sys.stderr,
                )

    def join_run_files(self) -> None:
        """The run file of a run across hosts: the first host's header, then every host's lines."""
        parts = sorted(self.run_dir.glob("samples.*.ndjson"))
        if not parts:
            return
        with open(self.run_dir / "samples.ndjson", "w") as out:
            for k, part in enumerate(parts):
                with open(part) as f:
                    header = f.readline()
                    if k == 0:
                        out.write(header)
                    shutil.copyfileobj(f, out)

    def stop(self, failures: list[str]) -> dict | None:
        """Let the agents take their last samples (nodes reported STOPPED, or DOWN without the
        run-ending notice) and deliver what they hold; their statistics, by agent. What went wrong
        is added to ``failures``."""
        if not self.procs:
            return None
        result: dict[str, Any] = {}
        for name, proc in self.procs.items():
            if proc.poll() is None and self.launcher is not None and self.across_hosts:
                self.launcher.signal(proc, signal.SIGTERM)
            elif proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                failures.append(f"{name} did not stop within 60 s; log: {self.log(name)}")
            try:
                result[name] = json.loads((self.run_dir / f"{name}-stats.json").read_text())
            except (OSError, ValueError):
                failures.append(f"{name} ended with code {proc.returncode} and no statistics; log: {self.log(name)}")
        if self.across_hosts:
            self.join_run_files()
        result["run_file"] = str(self.run_dir / "samples.ndjson")
        return result

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                if self.launcher is not None and self.across_hosts:
                    self.launcher.signal(proc, signal.SIGKILL)
                proc.kill()
                proc.wait()

    def send_run_document(self) -> str | None:
        """The complete run document (run.json, written last) to the user's sinks, through the Python
        agent's sinks and spool: the agent sent its first version as the run began (verdict
        pending). Returns what went wrong, or None."""
        opts = self.options
        if not (opts.enabled and opts.sinks):
            return None
        rd = self.run_dir.resolve()
        cmd = [
            sys.executable,
            "-m",
            "flowstat.agent",
            "--send-run",
            str(rd / "run.json"),
            "--quiet",
            "--spool-dir",
            str(rd / "spool" / AGENT_NODES[0]),
            *(a for url in opts.sinks for a in ("--sink", url)),
        ]
        try:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            return "sending the run document to the sinks took more than 120 s: it may be missing from them"
        return None if done.returncode == 0 else done.stderr.strip() or f"exit code {done.returncode}"
