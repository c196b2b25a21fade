"""What every local server of the stack shares: where it lives, how it starts, stops and is
checked, and the errors a person can act on (which port, which download, which log)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import requests

from flowstat.proc.procfs import log_tail, pid_file_process, write_pid_file

if TYPE_CHECKING:
    from . import Stack

SERVICE_USER = "flowstat"  # servers never run as root


class StackError(RuntimeError):
    """Something a person must fix: the message says what and where to look."""


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _system_program(name: str) -> str:
    """A program of the system's administration (in /usr/sbin, which a user's PATH may not hold)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if not found:
        raise StackError(f"`{name}` is needed to run the servers as user {SERVICE_USER} (Debian: util-linux, passwd)")
    return found


def run_as_prefix() -> list[str]:
    """Root starts servers as the unprivileged service user (created when missing)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        r = subprocess.run(
            [_system_program("useradd"), "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise StackError(
                f"cannot create the service user {SERVICE_USER}: useradd: {r.stderr.strip()[-300:]}"
            ) from None
    return [_system_program("runuser"), "-u", SERVICE_USER, "--"]


def _can_enter(path: Path, uid: int, gids: set[int]) -> bool:
    st = path.stat()
    if uid == st.st_uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid in gids:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def unreachable_by_service_user(path: Path) -> Path | None:
    """The first folder on the way to ``path`` that the service user cannot enter (root's home, a
    private temporary folder...), or None. Only root runs servers as another user."""
    if os.geteuid() != 0:
        return None
    pw = pwd.getpwnam(SERVICE_USER)
    gids = set(os.getgrouplist(SERVICE_USER, pw.pw_gid))
    for folder in reversed([path, *path.parents]):
        if folder.exists() and not _can_enter(folder, pw.pw_uid, gids):
            return folder
    return None


def make_folder(path: Path) -> None:
    """mkdir -p, and the folders it makes enterable by all (rwxr-xr-x, whatever the umask): the
    servers run as another user, who must reach their files."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for folder in missing:
        folder.chmod(0o755)


def give_to_service_user(*paths: Path) -> None:
    if os.geteuid() != 0:
        return
    pw = pwd.getpwnam(SERVICE_USER)
    for top in paths:
        if not top.is_dir():  # a file of its own (os.walk lists only what a folder holds)
            os.lchown(top, pw.pw_uid, pw.pw_gid)
        for root, dirs, files in os.walk(top):
            os.chown(root, pw.pw_uid, pw.pw_gid)
            for name in dirs + files:
                os.lchown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)


def apt_install(*packages: str) -> None:
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    if sudo and not shutil.which("sudo"):
        raise StackError(f"need root or sudo to install {' '.join(packages)} with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        r = subprocess.run(sudo + cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise StackError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()[-500:]}")


@dataclass
class Service:
    """One server. Subclasses fill in the class attributes, install(), command(), healthy() and,
    when they use more than one port, ports()."""

    name: str
    cache: Path
    port: int
    extra: dict = field(default_factory=dict)  # saved in stack.json with the port
    options: dict = field(default_factory=dict)  # what this `up` was told beyond ports; not saved

    health_timeout_s: ClassVar[float] = 60.0
    # how long `up` waits for a server that runs but does not answer before it restarts it: one that
    # is slow for a while (a GC pause, a loaded machine, a rule's first run) keeps its pid and its work
    busy_grace_s: ClassVar[float] = 20.0
    default_port: ClassVar[int]
    port_option: ClassVar[str | None]  # flowstat stack up --PORT_OPTION P; None: a server without a port
    port_help: ClassVar[str] = ""  # what else the port decides, for --help
    store: ClassVar[str | None] = None  # the flowstat.stores store to set up once the server answers

    @property
    def home(self) -> Path:
        return self.cache / self.name

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    @property
    def pid_path(self) -> Path:
        return self.home / "server.pid"

    @property
    def ports_path(self) -> Path:
        return self.home / "server.ports"  # what the running server was started on

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ports(self) -> list[int]:
        return [self.port]

    # -- to implement ---------------------------------------------------------------------------
    def link(self, stack: Stack, ports: dict[str, int]) -> None:
        """Learn what this server needs of the others (their ports), before it starts."""

    def install(self) -> None:
        raise NotImplementedError

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def healthy(self) -> bool:
        raise NotImplementedError

    def owned_paths(self) -> list[Path]:
        """Folders the server writes (handed to the service user)."""
        return [self.home]

    # -- shared ---------------------------------------------------------------------------------
    def _ports_changed(self) -> bool:
        """The running server was started on other ports than this `up` asks for: it never will answer
        on these, and is restarted at once (a server of a flowstat before server.ports: as it says)."""
        try:
            return self.ports_path.read_text().split() != [str(p) for p in self.ports()]
        except OSError:
            return False

    def _answers_within(self, seconds: float, running: Callable[[], bool]) -> bool:
        """Whether the server answers within ``seconds``; False at once when ``running`` says it has
        ended (polling its health endpoint: each probe has its own time-out)."""
        deadline = time.monotonic() + seconds
        while running():
            if self.healthy():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.25)
        return False

    def pid(self) -> int | None:
        """The server's pid if it is alive; an exited server started by this process is reaped."""
        try:
            pid = int(self.pid_path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return None
        except ChildProcessError:
            pass  # started by another flowstat process
        return pid_file_process(self.pid_path)  # not a later process that took over the pid

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    def up(self) -> str:
        """Start the server unless it already runs and answers (within busy_grace_s); return what was done."""
        grace = 0.0 if self._ports_changed() else self.busy_grace_s
        if self._answers_within(grace, lambda: self.pid() is not None):
            return "already running"
        self.down()
        for p in self.ports():
            if not port_free(p):
                raise StackError(
                    f"{self.name}: port {p} on 127.0.0.1 is taken by another program; "
                    f"choose another port (see flowstat stack up --help)"
                )
        make_folder(self.home)
        prefix = run_as_prefix()
        blocked = unreachable_by_service_user(self.home)  # before a download or build that would be in vain
        if blocked is not None:
            raise StackError(
                f"{self.name}: the servers run as user {SERVICE_USER}, which cannot enter {blocked} "
                f"(mode {blocked.stat().st_mode & 0o777:o}); give a --cache it can reach, such as "
                f"/var/lib/flowstat/stack (root's default)"
            )
        self.install()
        give_to_service_user(*self.owned_paths())
        cmd, env = self.command()
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                prefix + cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
                cwd=self.home,
            )
        write_pid_file(self.pid_path, proc.pid)
        self.ports_path.write_text(" ".join(map(str, self.ports())) + "\n")
        if self._answers_within(self.health_timeout_s, lambda: proc.poll() is None):
            return f"started{f' on 127.0.0.1:{self.port}' if self.ports() else ''} (pid {proc.pid})"
        if proc.poll() is not None:
            raise StackError(
                f"{self.name} died while starting (exit code {proc.returncode}); "
                f"log: {self.log_path}\n{self.log_tail()}"
            )
        self.down()
        raise StackError(
            f"{self.name} did not answer at {self.url} within {self.health_timeout_s:.0f} s; "
            f"log: {self.log_path}\n{self.log_tail()}"
        )

    def down(self) -> str:
        pid = self.pid()
        if pid is None:
            self.pid_path.unlink(missing_ok=True)
            return "not running"
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while self.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.1)  # waiting for the server to exit after SIGTERM
        if self.pid() is not None:
            os.killpg(pid, signal.SIGKILL)
        self.pid_path.unlink(missing_ok=True)
        return f"stopped (pid {pid})"

    def status(self) -> dict:
        pid = self.pid()
        return {
            "service": self.name,
            "url": self.url,
            "pid": pid,
            "running": pid is not None,
            "healthy": pid is not None and self.healthy(),
            "log": str(self.log_path),
        }

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.url + path, timeout=kw.pop("timeout", 2.0), **kw)


def save_state(cache: Path, services: list[Service]) -> None:
    (cache / "stack.json").write_text(json.dumps({s.name: {"port": s.port, **s.extra} for s in services}, indent=1))


def load_state(cache: Path) -> dict:
    try:
        return json.loads((cache / "stack.json").read_text())
    except (OSError, ValueError):
        return {}
