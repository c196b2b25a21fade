"""What the suite's own daemons share (flowstat_lab.compose, flowstat_lab.slurm): a network
namespace of their own that holds only loopback addresses, commands whose failure is named, and the
state of a process read from /proc. Root only."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

CLONE_NEWNET = 0x40000000


def enter_namespace(namespace: Path) -> None:
    """This thread into the network namespace (setns applies to the calling thread only)."""
    fd = os.open(namespace, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(fd)


def run_checked(
    cmd: list, what: str, error: type[Exception] = RuntimeError, **kw: object
) -> subprocess.CompletedProcess:
    """Run ``cmd``; a non-zero exit raises ``error`` naming ``what`` and the command's last output."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    out = subprocess.run([str(c) for c in cmd], **kw)  # type: ignore[call-overload]
    if out.returncode != 0:
        tail = ((out.stdout or "") + (out.stderr or "")).strip()[-3000:] if kw["capture_output"] else ""
        raise error(f"{what} failed (exit code {out.returncode}): {tail}")
    return out


def process_state(pid: int) -> str | None:
    """The process's state letter (R, S, Z...), None once it is gone; a zombie child of ours is reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return state


def alive(pid: int | None) -> bool:
    return pid is not None and process_state(pid) not in (None, "Z")


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def pid_file_alive(path: Path) -> int | None:
    """The pid PATH names while that process runs and is the one the file was written for. Pids wrap
    at 32768 here and the suite starts more processes than that: a process started after the file
    was written took the pid over and is a stranger, never to be signalled. (The daemons write some
    of these files themselves, so the file's time is the witness; its start is known to 10 ms, the
    2 s allow for the wall clock's slewing over a cluster's life, minutes.)"""
    pid = read_pid(path)
    try:
        written = path.stat().st_mtime
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    started = time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    return pid if alive(pid) and started <= written + 2.0 else None


class Namespace:
    """A named network namespace (`ip netns`): made with its loopback up and the loopback addresses
    asked for, and nothing else; entered with `nsenter --net` (not `ip netns exec`, which remounts
    /sys and hides cgroups)."""

    def __init__(self, name: str, error: type[Exception] = RuntimeError):
        self.name, self.error = name, error
        self.path = Path("/run/netns") / name

    def _ip(self, args: list[str], what: str) -> subprocess.CompletedProcess:
        return run_checked(["ip", *args], what, self.error)

    def exists(self) -> bool:
        return self.path.exists()

    def add(self, addresses: tuple[str, ...] = ()) -> None:
        """The namespace with lo up and each of ``addresses`` (127.x.y.z) on it; kept if it exists."""
        if not self.exists():
            self._ip(["netns", "add", self.name], f"ip netns add {self.name}")
        self._ip(["-n", self.name, "link", "set", "lo", "up"], f"lo up in {self.name}")
        have = self.addresses()
        for addr in addresses:
            if f"{addr}/8" not in have:
                self._ip(["-n", self.name, "addr", "add", f"{addr}/8", "dev", "lo"], f"{addr} in {self.name}")

    def delete(self) -> None:
        if self.exists():
            self._ip(["netns", "del", self.name], f"ip netns del {self.name}")

    def addresses(self) -> list[str]:
        """Every address in the namespace, as ADDRESS/PREFIX."""
        out = self._ip(["-n", self.name, "-j", "addr"], f"ip -j addr in {self.name}").stdout
        return [f"{a['local']}/{a['prefixlen']}" for link in json.loads(out) for a in link.get("addr_info", [])]

    def inode(self) -> int | None:
        try:
            return os.stat(self.path).st_ino
        except OSError:
            return None

    def pids(self, inode: int | None = None) -> list[int]:
        """Every live process whose network namespace is this one (or the one of ``inode``, which
        outlives its name)."""
        inode = inode or self.inode()
        if inode is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.stat(entry / "ns" / "net").st_ino == inode and alive(int(entry.name)):
                        found.append(int(entry.name))
                except OSError:
                    continue
        return sorted(found)

    def enter(self) -> list[str]:
        """The command prefix that runs a program in the namespace."""
        return ["nsenter", f"--net={self.path}", "--"]


class Forward:
    """A TCP port forwarded to another of this machine's loopback: from a namespace's loopback to
    the machine's (``namespace``), so that its tasks reach a server outside (the suite's stores), or
    within the machine (``namespace`` None). Its listening socket is made by a thread that entered
    the namespace (setns applies to the calling thread only), every connection to the server by
    threads that stay outside. Nothing leaves 127.0.0.0/8. For the faults of benchmarks:
    ``stall()`` keeps accepting but reads nothing (a sink that stops reading), ``refuse()`` closes
    the listener and cuts every connection (a sink that is down), ``resume()`` undoes either."""

    def __init__(self, port: int, target_port: int, namespace: Path | None = None):
        self.port, self.target_port, self.namespace = port, target_port, namespace
        self.sockets: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.reading = threading.Event()
        self.reading.set()
        self.listener: socket.socket | None = None
        self._open()

    def _open(self) -> None:
        listener = self._listen(self.namespace, self.port)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name=f"forward-{self.port}").start()

    @staticmethod
    def _listen(namespace: Path | None, port: int) -> socket.socket:
        made: dict[str, object] = {}

        def make() -> None:
            try:
                if namespace is not None:
                    enter_namespace(namespace)
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen(64)
                made["socket"] = s
            except OSError as exc:
                made["error"] = exc

        t = threading.Thread(target=make)  # a thread that entered the namespace ends there: never reused
        t.start()
        t.join()
        if "error" in made:
            raise made["error"]  # type: ignore[misc]
        return made["socket"]  # type: ignore[return-value]

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                inside, _ = listener.accept()
            except OSError:
                return  # closed (refuse, close)
            try:
                outside = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                inside.close()
                continue
            outside.settimeout(None)
            with self.lock:
                self.sockets |= {inside, outside}
            threading.Thread(target=self._pump, args=(inside, outside, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(outside, inside, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while True:
                if from_client:
                    self.reading.wait()
                data = src.recv(65536)
                if not data:
                    break
                if from_client:  # read before a stall began: held until it ends, not passed on
                    self.reading.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
                with self.lock:
                    self.sockets.discard(s)

    def stall(self) -> None:
        self.reading.clear()

    def refuse(self) -> None:
        if self.listener is not None:
            with contextlib.suppress(OSError):  # wakes the accepting thread (a bare close would not)
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()
            self.listener = None
        with self.lock:
            open_now = list(self.sockets)
        for s in open_now:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def resume(self) -> None:
        if self.listener is None:
            self._open()
        self.reading.set()

    def close(self) -> None:
        self.reading.set()
        self.refuse()
