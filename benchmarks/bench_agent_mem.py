#!/usr/bin/env python3
"""An agent's memory through sink faults (issue 28, the soak's VmRSS steps, small and local).

What runs. The agents of the soak (benchmarks/bench_soak.py), each started as it starts them: c
(the C agent, its spool on disk), t (the C agent, its spool on a 1 MiB tmpfs: once it is full,
batches wait in memory) and py (the Python agent, its spool on disk), each watching --processes
idle processes (benchmarks/soak/idler.c) at --interval, with two sinks of this script's own on
loopback: a line-protocol endpoint (http://127.0.0.1:PORT/write, as Telegraf's) and
an Elasticsearch-like one (elasticsearch://127.0.0.1:PORT/flowstat: every _bulk answered
{"errors": false}). Each agent has its own pair; the faults hit both pairs at the same times:
  es-down     the _bulk endpoint refuses connections (its port bound, not listening) for --down-s,
              its open connections closed, as a store killed;
  line-stall  the line endpoint accepts connections and stops reading for --stall-s;
after --warm-s, each followed by --gap-s, the pair --cycles times, then --tail-s more.

What is recorded (benchmarks/results/raw/agent-mem[-LABEL].json, not tracked): each agent's VmRSS every second, and
per agent: the median over the last 20 s of the warm-up (before), the highest, the median over
the last 30 s (end), the step (end - before), the slope (least squares, MB per hour) from the end
of the warm-up, the value at the end of each fault and gap, the lines each sink received and the
agent's own --stats. --env NAME=VALUE (repeatable) is put in every agent's environment (e.g.
MALLOC_MMAP_THRESHOLD_=131072 to compare with glibc's dynamic threshold off). Runs as root (the
tmpfs mount) for t.

Usage: benchmarks/bench_agent_mem.py [--agents c,t,py] [--processes 150] [--interval 1] [--cycles 2]
        [--warm-s 60] [--down-s 45] [--stall-s 60] [--gap-s 75] [--tail-s 60] [--env N=V] [--label L]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
C_AGENT = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
IDLER_SOURCE = ROOT / "benchmarks" / "soak" / "idler.c"
RESULTS = ROOT / "benchmarks" / "results"
TMPFS_SIZE = "1m"  # the t agent's spool, as the soak's tmpfs agent's


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class FaultySink:
    """An HTTP endpoint on loopback that takes every POST (a _bulk: 200 {"errors": false}; any other
    path: 204), and can refuse connections (``down``) or accept them and stop reading (``stall``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reading = threading.Event()
        self.reading.set()
        self.conns: set[socket.socket] = set()
        self.lines = 0  # line protocol lines, or _bulk documents, received
        self.sock = self._bound(0)
        self.port = self.sock.getsockname()[1]
        self._listen()

    @staticmethod
    def _bound(port: int) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return s

    def _listen(self) -> None:
        self.sock.listen(64)
        threading.Thread(target=self._accept, args=(self.sock,), daemon=True).start()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with self.lock:
                self.conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        try:
            while True:
                self.reading.wait()
                first = f.readline()
                if not first:
                    return
                headers = {}
                while (h := f.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                method, path = first.decode("latin-1").split(" ")[:2]
                if headers.get("expect", "").lower() == "100-continue":
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = f.read(int(headers.get("content-length", 0)))
                if method == "POST" and "_bulk" in path:
                    n, reply = body.count(b"\n") // 2, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    text = bulk_answer(body)
                elif method == "POST":
                    n, reply, text = body.count(b"\n"), b"HTTP/1.1 204 No Content\r\n", b""
                else:
                    n, reply, text = 0, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n", b"{}"
                with self.lock:
                    self.lines += n
                conn.sendall(reply + b"Content-Length: %d\r\n\r\n" % len(text) + text)
        except (OSError, ValueError):
            return
        finally:
            with self.lock:
                self.conns.discard(conn)
            conn.close()

    def down(self) -> None:
        """Refuse connections: the listening socket closed and the port bound again, not listening;
        the open connections closed."""
        with self.lock:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread: close alone would not
            self.sock.close()
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.sock = self._bound(self.port)

    def up(self) -> None:
        self._listen()

    def stall(self) -> None:
        self.reading.clear()

    def resume(self) -> None:
        self.reading.set()


def bulk_answer(body: bytes) -> bytes:
    """What Elasticsearch answers a _bulk that it stored whole: an item per document (an agent reads
    it all, as it would a real one's)."""
    items = []
    for action in body.splitlines()[::2]:
        meta = next(iter(json.loads(action).values()))
        items.append(
            {
                "index": {
                    "_index": meta.get("_index", "flowstat"),
                    "_id": meta.get("_id", ""),
                    "_version": 1,
                    "result": "created",
                    "_shards": {"total": 1, "successful": 1, "failed": 0},
                    "_seq_no": len(items),
                    "_primary_term": 1,
                    "status": 201,
                }
            }
        )
    return json.dumps({"errors": False, "took": 3, "items": items}, separators=(",", ":")).encode()  # as 8.19


def rss_kb(pid: int) -> tuple[int, int] | None:
    """VmRSS and its anonymous part (RssAnon: the heap; the rest is mapped files and shared memory)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]), int(fields["RssAnon"].split()[0])
    except (OSError, KeyError, ValueError):
        return None


def slope_mb_h(series: list[tuple[float, int]]) -> float:
    """Least squares, MB per hour (0 with fewer than two times)."""
    if len({t for t, _ in series}) < 2:
        return 0.0
    return statistics.linear_regression([t for t, _ in series], [kb / 1024 for _, kb in series]).slope * 3600


def main() -> int:
    from run_benchmarks import command_line  # beside this script, on its path when it runs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", default="c,t,py")
    ap.add_argument("--processes", type=int, default=150)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--warm-s", type=float, default=60)
    ap.add_argument("--down-s", type=float, default=45)
    ap.add_argument("--stall-s", type=float, default=60)
    ap.add_argument("--gap-s", type=float, default=75)
    ap.add_argument("--tail-s", type=float, default=60)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for both agents' environment")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    kinds = [k for k in args.agents.split(",") if k]
    out = args.out or RESULTS / "raw" / f"agent-mem{'-' + args.label if args.label else ''}.json"
    work = Path(tempfile.mkdtemp(prefix="agent-mem-"))
    env = dict(os.environ)
    env.update(dict(e.split("=", 1) for e in args.env))
    idler = work / "mem-idler"
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(idler), str(IDLER_SOURCE)], check=True)
    group = subprocess.Popen([str(idler), str(args.processes)], stdout=subprocess.PIPE, text=True)
    assert group.stdout is not None and group.stdout.readline().split() == ["ready", str(args.processes)]
    sinks = {k: {"line": FaultySink(), "es": FaultySink()} for k in kinds}
    tmpfs = work / "tmpfs-spool"
    if "t" in kinds:
        tmpfs.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(tmpfs)], check=True)
    procs: dict[str, subprocess.Popen] = {}
    for k in kinds:
        line, es = sinks[k]["line"], sinks[k]["es"]
        argv = [sys.executable, "-m", "flowstat", "agent"] if k == "py" else [str(C_AGENT)]
        argv += ["--pattern", "^" + str(idler), "--interval", str(args.interval), "--rescan", "5"]
        argv += ["--run-id", "agent-mem", "--name", f"mem-{k}"]
        argv += ["--spool-dir", str(tmpfs), "--spool-max-mb", "64"] if k == "t" else ["--spool-dir", str(work / k)]
        argv += ["--stats", str(work / f"{k}.stats.json"), "--quiet", "--drain-timeout", "5"]
        argv += ["--sink", f"http://127.0.0.1:{line.port}/write"]
        argv += ["--sink", f"elasticsearch://127.0.0.1:{es.port}/flowstat"]
        with open(work / f"{k}.log", "wb") as log:
            procs[k] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    series: dict[str, list[tuple[float, int]]] = {k: [] for k in kinds}
    anon: dict[str, list[int]] = {k: [] for k in kinds}
    marks: list[dict] = []
    t0 = time.monotonic()
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            now = time.monotonic() - t0
            for k, p in procs.items():
                kb = rss_kb(p.pid)
                if kb is not None and p.poll() is None:
                    series[k].append((round(now, 2), kb[0]))
                    anon[k].append(kb[1])
            stop.wait(1.0 - (time.monotonic() - t0) % 1.0)

    threading.Thread(target=sample, daemon=True).start()

    def phase(name: str, seconds: float) -> None:
        say(f"{name} for {seconds:.0f} s")
        time.sleep(seconds)
        marks.append({"phase": name, "end_s": round(time.monotonic() - t0, 1)})

    try:
        phase("warm-up", args.warm_s)
        # (which sink of each pair, what starts the fault, what ends it, its name, how long)
        faults = (("es", "down", "up", "es-down", args.down_s), ("line", "stall", "resume", "line-stall", args.stall_s))
        for _ in range(args.cycles):
            for which, start, end, name, seconds in faults:
                for s in sinks.values():
                    getattr(s[which], start)()
                phase(name, seconds)
                for s in sinks.values():
                    getattr(s[which], end)()
                phase(f"after {name}", args.gap_s)
        phase("tail", args.tail_s)
    finally:
        stop.set()
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(60)
        group.terminate()
        group.wait(60)
        if "t" in kinds:
            subprocess.run(["umount", str(tmpfs)], check=False)
    warm_end = marks[0]["end_s"]
    report: dict = {
        "command": command_line(),
        "env": dict(e.split("=", 1) for e in args.env),
        "processes": args.processes,
        "interval_s": args.interval,
        "phases": marks,
        "agents": {},
    }
    for k in kinds:
        s = series[k]
        before = [kb for t, kb in s if warm_end - 20 <= t <= warm_end]
        last = [kb for t, kb in s if t >= s[-1][0] - 30]
        anon_before = [a for (t, _), a in zip(s, anon[k], strict=True) if warm_end - 20 <= t <= warm_end]
        anon_last = [a for (t, _), a in zip(s, anon[k], strict=True) if t >= s[-1][0] - 30]
        at_marks = {}
        for m in marks:
            near = [kb for t, kb in s if t <= m["end_s"]]
            at_marks[f"{m['phase']}@{m['end_s']:.0f}s"] = round(near[-1] / 1024, 1) if near else None
        stats = work / f"{k}.stats.json"
        report["agents"][k] = {
            "before_mb": round(statistics.median(before) / 1024, 1),
            "max_mb": round(max(kb for _, kb in s) / 1024, 1),
            "end_mb": round(statistics.median(last) / 1024, 1),
            "step_mb": round((statistics.median(last) - statistics.median(before)) / 1024, 1),
            "anon_step_mb": round((statistics.median(anon_last) - statistics.median(anon_before)) / 1024, 1),
            "slope_mb_h": round(slope_mb_h([(t, kb) for t, kb in s if t >= warm_end]), 2),
            "at_phase_ends_mb": at_marks,
            "received": {n: sinks[k][n].lines for n in ("line", "es")},
            "stats": json.loads(stats.read_text()) if stats.exists() else None,
            "log_tail": (work / f"{k}.log").read_text(errors="replace").splitlines()[-5:],
            "vmrss_kb": s,
            "rss_anon_kb": anon[k],
        }
        a = report["agents"][k]
        say(
            f"{k}: before {a['before_mb']} MB, max {a['max_mb']}, end {a['end_mb']} (step {a['step_mb']}, "
            f"anonymous {a['anon_step_mb']}), "
            f"slope {a['slope_mb_h']} MB/h; at phase ends {at_marks}"
        )
    out.write_text(json.dumps(report, indent=1) + "\n")
    say(f"written {out}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
