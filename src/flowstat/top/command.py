"""``flowstat top --metrics URL | --samples PATH [--endpoints PATH]``: the command's options, its
scrape loop (the agents' /metrics: Scraper; or the samples an agent writes: tail.Tail) and its
terminal (keys read in cbreak mode, the view drawn by rich's Live on the alternate screen, the
terminal given back as it was on q, Ctrl-C or SIGTERM)."""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from flowstat.flow import WINDOW_S
from flowstat.registry import Command

if TYPE_CHECKING:  # imported when the command runs: `flowstat --help` needs neither rich nor requests
    from .frame import Frame
    from .scrape import Scrape
    from .watch import Watch

HELP = "a live terminal view of a running pipeline: which node holds the flow back"
DESCRIPTION = (
    "Watch a running pipeline from its agents' /metrics (--metrics), or from the samples an agent writes "
    "(--samples: a JSON-lines file, or a run directory's samples.ndjson, followed as it grows): every "
    f"--interval, read them, keep each node's last {WINDOW_S:g} s and redraw. On top, the verdict in one "
    "line: HELD BACK by the nodes that hold the flow back (red), FLOWING (green) or UNKNOWN and why "
    "(yellow), with its evidence. Below, the pipeline from its sources down, a line a node: id, role, "
    "state, objects received per second, the shares of time busy, backpressured and idle (Flink's levels: "
    "OK up to 10%, LOW up to 50%, HIGH above) and the median input latency. The edges come from the "
    "nodes' endpoints (--endpoints). Keys: q quits (Ctrl-C too); arrows, j/k, PgUp/PgDn scroll. See "
    "docs/top.md."
)
EPILOG = f"""examples:
  flowstat top --metrics 127.0.0.1:9464 --endpoints $FLOWSTAT_ENDPOINTS_DIR
  flowstat top --metrics 127.0.0.1:9464 --metrics 127.0.0.1:9465 --endpoints runs/RUN_ID
  flowstat top --metrics 127.0.0.1:9464 --endpoints DIR --once --after 3   # one frame, plain text
  flowstat top --samples runs/RUN_ID     # what the run's agent writes (--endpoints: the run's)

exit status: 0 (q, Ctrl-C; --once: every agent answered, or the samples file was read), 1
(--once: an agent did not answer, or served no flowstat metrics; the samples file had a bad
line, or no sample in the last {WINDOW_S:g} s), 2 (a user error: an option, an endpoints or
samples path)"""
PARSER = dict(
    description=textwrap.fill(DESCRIPTION, 78),
    epilog=EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
MIN_INTERVAL_S = 0.1
TICK_S = 0.1  # how often the live view looks at its keys and the terminal's size


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics",
        action="append",
        metavar="URL",
        help="an agent's /metrics (flowstat agent or flowstat-agent with --sink prometheus://...); "
        "HOST:PORT means http://HOST:PORT/metrics. Several: one per host, or a run's Python and C agents "
        "(flowstat run --sink prometheus://127.0.0.1:P serves them on P and P+1); a node several report is "
        "taken from the first given",
    )
    p.add_argument(
        "--samples",
        type=Path,
        metavar="PATH",
        help="instead of --metrics: the samples an agent writes, one JSON object a line (flowstat agent "
        "--sink file:///PATH?format=json, or --run-file), read whole, then followed; or a run directory "
        "(flowstat run's RUN_DIR: its samples.ndjson, and --endpoints defaults to it). A node two agents "
        "write is taken from the first seen",
    )
    p.add_argument(
        "--endpoints",
        type=Path,
        metavar="PATH",
        help="who feeds whom: the nodes' endpoints directory (--endpoints-dir of the agents), a run "
        "directory or its endpoints.json; read again when it changes. Without it the verdict is UNKNOWN "
        "(no edges)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between scrapes and redraws (default 1; the agents' --interval at most this)",
    )
    p.add_argument("--timeout", type=float, default=2.0, metavar="S", help="how long a scrape may take (default 2 s)")
    p.add_argument(
        "--once",
        action="store_true",
        help="print one frame and exit (plain text when not a terminal: for scripts)",
    )
    p.add_argument(
        "--after",
        type=float,
        default=0.0,
        metavar="S",
        help="with --once: scrape every --interval for S seconds first (the verdict needs 3 samples of "
        "a node: --after 3 at 1 s); default 0, one scrape",
    )


class UserError(ValueError):
    """A bad option: said in one line, exit status 2."""


def metrics_url(text: str) -> str:
    """An agent's /metrics URL from what was given: HOST:PORT is http://HOST:PORT/metrics."""
    url = text if "://" in text else f"http://{text}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--metrics {text}: not an http:// or https:// URL of an agent's /metrics")
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        raise UserError(f"--metrics {text}: the port is not a number") from None
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urlunsplit(parts)


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except UserError as exc:
        print(f"flowstat top: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C in --once's scrapes (the live view takes it as q)
        return 130


def _main(args: argparse.Namespace) -> int:
    from .watch import Edges, EndpointsError, Watch

    if args.metrics and args.samples is not None:
        raise UserError("--metrics or --samples: one of them, not both")
    if not args.metrics and args.samples is None:
        raise UserError("which pipeline? --metrics URL (an agent's /metrics) or --samples PATH (what it writes)")
    if args.samples is not None:
        path, run_dir = samples_file(args.samples)
        if run_dir and args.endpoints is None:
            args.endpoints = args.samples
    else:
        urls = list(dict.fromkeys(metrics_url(u) for u in args.metrics))
    if args.interval < MIN_INTERVAL_S:
        raise UserError(f"--interval {args.interval:g}: at least {MIN_INTERVAL_S:g} s")
    if args.timeout <= 0:
        raise UserError(f"--timeout {args.timeout:g}: more than 0 s")
    if args.after < 0 or (args.after and not args.once):
        raise UserError("--after S: with --once, and S at least 0")
    try:
        edges = Edges(args.endpoints)
    except EndpointsError as exc:
        raise UserError(f"--endpoints {exc}") from None
    source: Feed
    if args.samples is not None:
        from .tail import Tail

        source = Tail(path)
        watch = Watch([source.url], edges)
    else:
        source = Scraper(urls, args.timeout)
        watch = Watch(urls, edges)
    hint = "" if args.endpoints else "--endpoints PATH gives them"
    if args.once:
        return _once(args, watch, source, hint)
    if not sys.stdout.isatty():
        raise UserError("the live view needs a terminal: --once prints one frame as plain text")
    return _live(args, watch, source, hint)


def samples_file(path: Path) -> tuple[Path, bool]:
    """The samples file --samples PATH names, and whether PATH is a run directory (whose samples.ndjson
    may not be there yet: the view waits for it). A file that is not there is a UserError."""
    from .tail import RUN_FILE

    if path.is_dir():
        return path / RUN_FILE, True
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise UserError(f"--samples {path}: {(exc.strerror or str(exc)).lower()}") from None
    return path, False


class Feed(Protocol):
    """What a round reads: the agents' /metrics (Scraper), or a samples file (tail.Tail)."""

    def round(self) -> list[Scrape]: ...


class Scraper:
    """A round of scrapes: every agent at once (in threads), answers in the order given."""

    def __init__(self, urls: Sequence[str], timeout: float):
        import requests

        self.urls, self.timeout = list(urls), timeout
        self.sessions = {u: requests.Session() for u in urls}
        self.pool = ThreadPoolExecutor(max_workers=min(16, len(urls))) if len(urls) > 1 else None

    def round(self) -> list[Scrape]:
        from .scrape import scrape

        if self.pool is None:
            return [scrape(u, self.timeout, self.sessions[u]) for u in self.urls]
        futures = [self.pool.submit(scrape, u, self.timeout, self.sessions[u]) for u in self.urls]
        return [f.result() for f in futures]


def _frame(watch: Watch, interval_s: float, hint: str, keys: bool, samples: bool) -> Frame:
    from .frame import Frame

    return Frame(
        verdict=watch.verdict(),
        views=watch.views(),
        upstream=dict(watch.edges.upstream),
        agents=[(u, watch.errors.get(u)) for u in watch.urls],
        interval_s=interval_s,
        at=watch.at,
        notes=[f"endpoints: {p}" for p in watch.edges.problems],
        hint=hint,
        keys=keys,
        samples=samples,
    )


def _once(args: argparse.Namespace, watch: Watch, source: Feed, hint: str) -> int:
    from rich.console import Console

    from .frame import render

    start = time.monotonic()
    rounds = 0
    while True:
        watch.update(source.round(), time.time())
        rounds += 1
        due = start + rounds * args.interval
        if due - start > args.after:
            break
        time.sleep(max(0.0, due - time.monotonic()))  # the next scrape's time
    console = Console(highlight=False, soft_wrap=False)
    samples = args.samples is not None
    lines, _ = render(_frame(watch, args.interval, hint, keys=False, samples=samples), console.width)
    for line in lines:
        console.print(line, no_wrap=True, overflow="ellipsis", crop=True)
    for url, error in watch.errors.items():
        print(f"flowstat top: {error if samples else f'agent {url}: {error}'}", file=sys.stderr)
    return 1 if watch.errors else 0


class _Stop(Exception):
    """SIGTERM: end as q does, the terminal given back."""


def _live(args: argparse.Namespace, watch: Watch, source: Feed, hint: str) -> int:
    from rich.console import Console, Group
    from rich.live import Live

    from .frame import render

    console = Console(highlight=False)
    lock, changed, stop = threading.Lock(), threading.Event(), threading.Event()

    def scrape_loop() -> None:
        due = time.monotonic()
        while not stop.is_set():
            results = source.round()
            with lock:
                watch.update(results, time.time())
            changed.set()
            due = max(due + args.interval, time.monotonic())
            stop.wait(due - time.monotonic())

    def on_term(*_: object) -> None:
        raise _Stop

    keys = _Keys(sys.stdin)
    previous = signal.signal(signal.SIGTERM, on_term)
    offset, size = 0, None
    try:
        with (
            keys,
            Live(
                console=console, screen=True, auto_refresh=False, redirect_stdout=False, redirect_stderr=False
            ) as live,
        ):
            threading.Thread(target=scrape_loop, name="flowstat-top-scrape", daemon=True).start()
            changed.set()
            while True:
                if changed.is_set() or console.size != size:
                    changed.clear()
                    size = console.size
                    with lock:
                        frame = _frame(watch, args.interval, hint, keys=True, samples=args.samples is not None)
                    lines, offset = render(frame, size.width, size.height, offset)
                    live.update(Group(*lines), refresh=True)
                pressed = keys.read(TICK_S)
                if "quit" in pressed:
                    break
                for key in pressed:
                    offset = _scrolled(key, offset, max(1, (size.height if size else 24) - 8))
                    changed.set()
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        stop.set()
        signal.signal(signal.SIGTERM, previous)
    return 0


def _scrolled(key: str, offset: int, page: int) -> int:
    step = {"up": -1, "down": 1, "pgup": -page, "pgdn": page, "home": -(1 << 30), "end": 1 << 30}.get(key, 0)
    return max(0, offset + step)  # render clamps the end


class _Keys:
    """Keys from a terminal in cbreak mode (no echo, no line editing, Ctrl-C still a signal); the
    terminal's mode given back on exit. Not a terminal: no keys (Ctrl-C or SIGTERM end the view)."""

    SEQUENCES = {
        "\x1b[A": "up",
        "\x1bOA": "up",
        "k": "up",
        "\x1b[B": "down",
        "\x1bOB": "down",
        "j": "down",
        "\x1b[5~": "pgup",
        "\x1b[6~": "pgdn",
        " ": "pgdn",
        "\x1b[H": "home",
        "g": "home",
        "\x1b[F": "end",
        "G": "end",
    }

    def __init__(self, stream: Any):
        self.fd = stream.fileno() if stream.isatty() else None
        self.saved: list[Any] | None = None

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            import termios
            import tty

            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def read(self, timeout: float) -> list[str]:
        """The keys pressed within ``timeout``: 'quit', or scrolls ('up', 'down', 'pgup', 'pgdn',
        'home', 'end'); others are left out."""
        if self.fd is None:
            time.sleep(timeout)
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        data = os.read(self.fd, 64).decode("utf-8", errors="replace")
        if not data:  # the terminal is gone: as q
            return ["quit"]
        keys = []
        while data:
            if data[0] in "qQ":
                return ["quit"]
            seq = next((s for s in self.SEQUENCES if data.startswith(s)), data[0])
            if seq in self.SEQUENCES:
                keys.append(self.SEQUENCES[seq])
            data = data[len(seq) :]
        return keys


# What flowstat.cli.COMMANDS names (the command line imports this module only for this command).
COMMAND = Command(HELP, configure, main, PARSER)
