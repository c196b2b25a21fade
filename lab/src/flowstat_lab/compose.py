"""The suite's own Docker engine, the images built here, and Compose v2: what `make compose-images`
and tests/test_compose_up.py both use to run docker-compose.yml for real on a machine that reaches
no image registry.

- **Compose v2**, built from the Go module proxy at COMPOSE_VERSION (v2.28.1: the newest the proxy
  holds that still talks to Debian's engine 20.10, API 1.41: it checks the engine's version before
  using anything of API 1.44, and keeps the classic builder).
- **The engine**: Debian's dockerd and containerd started by us as root, with their own sockets,
  data root (kept between runs, in /var/lib/flowstat/compose: FLOWSTAT_COMPOSE_ROOT) and state
  (/run/flowstat-compose), never a bridge (--bridge=none --iptables=false --ip-forward=false
  --ip-masq=false). Images are built with the engine in the machine's network (their RUN steps
  fetch Debian packages and wheels); the stack runs with the engine in a network namespace of its
  own, NETNS, which holds only its loopback (127.0.0.1/8, ::1): every container is on the "host"
  network, which is that namespace, so nothing of the stack is on the machine's interfaces, its
  ports (9200, 8086...) collide with nothing else on the machine, and a healthcheck on
  localhost:PORT probes the stack, not another server. One engine a machine: a lock file.
- **The images**, each tagged as the override (lab/stand-ins/docker-compose.stand-ins.yml)
  names it and labelled with the digest of its inputs: built again only when they change.
  Debian bookworm and Python 3.11 bases made with mmdebstrap (the machine's CA certificates added,
  for pip behind its TLS proxy); flowstat's from the project's Dockerfile on that Python base;
  stand-ins for Elasticsearch (the integ-test zip, security on, with flowstat's analysis module),
  InfluxDB (Debian's 1.6.7), Telegraf and ElastAlert2 at their pins, the Logstash relay, and
  Prometheus (Debian's 2.42.0, for the `prometheus` profile's pinned 2.53).

    python -m flowstat_lab.compose images      build what is missing or stale (make compose-images)
    python -m flowstat_lab.compose up|down     the engine in its namespace, for a person to use:
                                               DOCKER_HOST=unix:///var/lib/flowstat/compose/docker.sock
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flowstat.stack.telegraf import go_build_env
from flowstat_lab import ROOT, STAND_INS
from flowstat_lab.netns import Namespace, pid_file_alive, run_checked

OVERRIDE = STAND_INS / "docker-compose.stand-ins.yml"
ES_CLUSTER_OVERRIDE = STAND_INS / "docker-compose.es-cluster.stand-ins.yml"  # with docker-compose.es-cluster.yml
COMPOSE_VERSION = "v2.28.1"
NETNS = "flowstat-compose"
DEBIAN_SUITE = "bookworm"
DOCKER_CLI = "/usr/bin/docker"  # Debian's docker.io, the engine's own version (make installs it)


def say(msg: str) -> None:
    print(f"composeengine: {msg}", file=sys.stderr, flush=True)


class EngineError(RuntimeError):
    """What a person must fix, named."""


def _run(cmd: list, what: str, **kw) -> subprocess.CompletedProcess:
    return run_checked(cmd, what, EngineError, **kw)


# -- where things live ------------------------------------------------------------------------------
def state_root() -> Path:
    """Kept between runs: the engine's data root (its images), Compose's build, the build contexts."""
    return Path(os.environ.get("FLOWSTAT_COMPOSE_ROOT", "/var/lib/flowstat/compose"))


RUN_ROOT = Path("/run/flowstat-compose")  # the daemons' state: sockets, pid files (gone at a reboot)


# -- Compose v2 -----------------------------------------------------------------------------------
def go() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if not found:
        raise EngineError("Go is needed to build Compose v2 (go >= 1.22 on the PATH or in /usr/local/go)")
    return found


def compose_binary() -> Path:
    """Compose v2 at COMPOSE_VERSION, built once (about 2 minutes cold) from the Go module proxy."""
    top = state_root() / "go"
    binary = top / f"compose-{COMPOSE_VERSION}" / "docker-compose"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    env = go_build_env(top, binary.parent)
    say(f"building Compose {COMPOSE_VERSION} from the Go module proxy (about 2 minutes, once)")
    _run(
        [
            go(),
            "install",
            "-ldflags",
            f"-s -w -X github.com/docker/compose/v2/internal.Version={COMPOSE_VERSION}",
            f"github.com/docker/compose/v2/cmd@{COMPOSE_VERSION}",
        ],
        f"building Compose {COMPOSE_VERSION}",
        env=env,
    )
    (binary.parent / "cmd").rename(binary)
    return binary


# -- the engine -------------------------------------------------------------------------------------
def _pid_alive(pid_file: Path) -> int | None:
    """The pid the file names while that process runs (a zombie child of ours is reaped: ended)."""
    return pid_file_alive(pid_file)


NAMESPACE = Namespace(NETNS, EngineError)  # the stack's: a loopback and nothing else


def netns_exists() -> bool:
    return NAMESPACE.exists()


def netns_add() -> None:
    NAMESPACE.add()


def netns_addresses() -> list[str]:
    """Every address in the stack's namespace, as ADDRESS/PREFIX."""
    return NAMESPACE.addresses()


def netns_del() -> None:
    NAMESPACE.delete()


@dataclass
class Engine:
    """dockerd and containerd of our own. ``start(isolated=True)``: in NETNS (the stack runs);
    False: in the machine's network, for builds only (nothing is run then but build steps)."""

    root: Path
    run: Path = RUN_ROOT

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def env(self) -> dict[str, str]:
        """For docker and compose: this engine, the classic builder (no buildx here), no stray config."""
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "DOCKER_HOST": self.host,
            "DOCKER_BUILDKIT": "0",
            "COMPOSE_DOCKER_CLI_BUILD": "0",
            "DOCKER_CONFIG": str(self.root / "client-config"),
        }

    @property
    def dockerd_pid(self) -> Path:
        return self.run / "dockerd.pid"

    @property
    def containerd_pid(self) -> Path:
        return self.run / "containerd.pid"

    @property
    def mode_file(self) -> Path:
        return self.run / "mode"

    def running(self) -> str | None:
        """'isolated' or 'machine' while our engine runs, else None."""
        if _pid_alive(self.dockerd_pid) and self.socket.exists():
            return self.mode_file.read_text().strip() if self.mode_file.exists() else "machine"
        return None

    def docker(self, *args: str, what: str | None = None, **kw) -> subprocess.CompletedProcess:
        return _run([DOCKER_CLI, *args], what or f"docker {' '.join(args[:3])}", env=self.env, **kw)

    def start(self, isolated: bool = True, timeout_s: float = 60.0) -> None:
        want = "isolated" if isolated else "machine"
        now = self.running()
        if now == want:
            return
        if now:
            self.stop()
        for program in ("dockerd", "containerd", "runc", "nsenter", "ip"):
            if not shutil.which(program) and not shutil.which(program, path="/usr/sbin:/sbin"):
                raise EngineError(
                    f"`{program}` is missing (make installs docker.io: Debian's dockerd, containerd, runc)"
                )
        self.root.mkdir(parents=True, exist_ok=True)
        self.run.mkdir(parents=True, exist_ok=True)
        (self.root / "client-config").mkdir(exist_ok=True)
        prefix: list[str] = []
        if isolated:
            netns_add()
            prefix = ["nsenter", f"--net=/run/netns/{NETNS}", "--"]
        # containerd of our own: dockerd would otherwise use the system's, if one runs, and the
        # containers would be in that one's network, not the namespace.
        config = self.run / "containerd.toml"
        config.write_text('version = 2\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n')
        csock = self.run / "containerd.sock"
        with open(self.root / "containerd.log", "ab") as log:
            proc = subprocess.Popen(
                prefix
                + [
                    "containerd",
                    "--config",
                    str(config),
                    "--root",
                    str(self.root / "containerd"),
                    "--state",
                    str(self.run / "containerd-state"),
                    "--address",
                    str(csock),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.containerd_pid.write_text(str(proc.pid))
        self._wait(lambda: csock.exists(), "containerd's socket", timeout_s, self.root / "containerd.log", proc)
        with open(self.root / "dockerd.log", "ab") as log:
            proc = subprocess.Popen(
                prefix
                + [
                    "dockerd",
                    "--data-root",
                    str(self.root / "data"),
                    "--exec-root",
                    str(self.run / "exec"),
                    "--pidfile",
                    str(self.dockerd_pid),
                    "-H",
                    self.host,
                    "--containerd",
                    str(csock),
                    "--bridge=none",
                    "--iptables=false",
                    "--ip6tables=false",
                    "--ip-forward=false",
                    "--ip-masq=false",
                    "--userland-proxy=false",
                    "--storage-driver=overlay2",
                    "--log-driver=json-file",
                    "--log-opt",
                    "max-size=10m",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.mode_file.write_text(want)
        self._wait(
            lambda: self.socket.exists()
            and subprocess.run([DOCKER_CLI, "version"], env=self.env, capture_output=True).returncode == 0,
            "dockerd",
            timeout_s,
            self.root / "dockerd.log",
            proc,
        )
        networks = self.networks()
        if set(networks) != {"host", "none"}:
            self.stop()
            raise EngineError(f"the engine made networks {networks}: only host and none may exist")

    @staticmethod
    def _wait(ready: Callable[[], bool], what: str, timeout_s: float, log: Path, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise EngineError(f"{what} did not start (exit code {proc.poll()}); {log}:\n{tail}")
            time.sleep(0.2)

    def networks(self) -> list[str]:
        return self.docker("network", "ls", "--format", "{{.Name}}").stdout.split()

    def stop(self, timeout_s: float = 60.0) -> None:
        """dockerd, then containerd, by their pids; then the namespace."""
        for pid_file in (self.dockerd_pid, self.containerd_pid):
            pid = _pid_alive(pid_file)
            if pid:
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout_s
                while _pid_alive(pid_file) == pid and time.monotonic() < deadline:
                    time.sleep(0.2)
                if _pid_alive(pid_file) == pid:
                    os.kill(pid, signal.SIGKILL)
            pid_file.unlink(missing_ok=True)
        self.mode_file.unlink(missing_ok=True)
        netns_del()


@contextmanager
def machine_lock(root: Path, wait_s: float = 1800) -> Iterator[None]:
    """One engine on this data root at a time (another checkout's suite waits for this one)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "engine.lock", "w") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EngineError(f"{root / 'engine.lock'} held for {wait_s:.0f} s by another run") from None
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- images -----------------------------------------------------------------------------------------
INPUTS_LABEL = "org.flowstat.inputs"


def digest(*parts: bytes | str | Path) -> str:
    """sha256 over texts, bytes and files or folders (paths and contents, in order)."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = [part] if part.is_file() else sorted(p for p in part.rglob("*") if p.is_file())
            for f in files:
                h.update(str(f.relative_to(part) if f != part else f.name).encode() + b"\0")
                h.update(hashlib.sha256(f.read_bytes()).digest())
        else:
            h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\1")
    return h.hexdigest()[:16]


def image_inputs(engine: Engine, tag: str) -> str | None:
    out = subprocess.run(
        [DOCKER_CLI, "image", "inspect", "--format", f'{{{{index .Config.Labels "{INPUTS_LABEL}"}}}}', tag],
        env=engine.env,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() if out.returncode == 0 else None


def image_id(engine: Engine, tag: str) -> str:
    return engine.docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def ca_certificates() -> list[Path]:
    return sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))


@dataclass
class Image:
    tag: str
    inputs: Callable[[], str]  # the digest of what it is made of (read once its bases exist)
    make: Callable[[str], None]  # builds it, labelled with that digest


def mmdebstrap_image(engine: Engine, tag: str, include: list[str], customize: list[str], changes: list[str]) -> Image:
    """A Debian bookworm image made with mmdebstrap from the Debian mirror, the machine's CA
    certificates added (so that pip works behind its TLS proxy), then `docker import`ed."""
    certs = ca_certificates()

    def make(inputs: str) -> None:
        if not shutil.which("mmdebstrap"):
            raise EngineError("mmdebstrap is missing (make installs it)")
        with tempfile.TemporaryDirectory(prefix="mmdebstrap-", dir=state_root()) as tmp:
            for c in certs:
                shutil.copy(c, Path(tmp) / c.name)
            hooks = [
                f'mkdir -p "$1/usr/local/share/ca-certificates" && cp {tmp}/*.crt '
                '"$1/usr/local/share/ca-certificates/"',
                'chroot "$1" update-ca-certificates',
                *customize,
                'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin',
            ]
            out = Path(tmp) / "rootfs.tar"
            _run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    "--mode=root",
                    f"--include={','.join(include)}",
                    *(f"--customize-hook={h}" for h in hooks),
                    DEBIAN_SUITE,
                    out,
                    "deb http://deb.debian.org/debian bookworm main",
                    "deb http://deb.debian.org/debian bookworm-updates main",
                    "deb http://deb.debian.org/debian-security bookworm-security main",
                ],
                f"mmdebstrap for {tag}",
            )
            args = [a for c in [*changes, f"LABEL {INPUTS_LABEL}={inputs}"] for a in ("--change", c)]
            engine.docker("import", *args, str(out), tag, what=f"docker import {tag}")

    return Image(
        tag, lambda: digest(DEBIAN_SUITE, ",".join(include), "\n".join(customize), "\n".join(changes), *certs), make
    )


def docker_build(engine: Engine, tag: str, context: Path, inputs: str, args: dict[str, str]) -> None:
    cmd = ["build", "--network", "host", "--label", f"{INPUTS_LABEL}={inputs}", "-t", tag]
    for k, v in args.items():
        cmd += ["--build-arg", f"{k}={v}"]
    engine.docker(*cmd, str(context), what=f"docker build {tag}")


def _staged(name: str, sources: dict[str, Path]) -> Path:
    """A build context under the state root: the stand-in's own files, plus ``sources``
    (name in the context -> file or folder), hard-linked where they are on the same disk."""
    ctx = state_root() / "contexts" / name
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(STAND_INS / name, ctx)
    for dest, src in sources.items():
        target = ctx / dest
        if src.is_dir():
            if subprocess.run(["cp", "-al", str(src), str(target)], capture_output=True).returncode != 0:
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(src, target, symlinks=True)
        else:
            shutil.copy2(src, target)
    return ctx


def env_example() -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )


STANDIN = {
    "elasticsearch": "flowstat-standin/elasticsearch:8.19.21",
    "influxdb": "flowstat-standin/influxdb:1.6.7",
    "telegraf": "flowstat-standin/telegraf:1.37.2",
    "elastalert": "flowstat-standin/elastalert2:2.19.0",
    "logstash": "flowstat-standin/logstash-relay:0.1.0",
    "prometheus": "flowstat-standin/prometheus:2.42.0",
}
BASES = {"debian": "flowstat-local/debian:bookworm", "python": "flowstat-local/python:3.11-bookworm"}


def _tree(top: Path, skip: tuple[str, ...] = ()) -> list[Path]:
    """The files of a source folder that a build context holds (no caches, no build outputs)."""
    return [
        p
        for p in sorted(top.rglob("*"))
        if p.is_file()
        and "__pycache__" not in p.parts
        and not p.name.endswith(".pyc")
        and not any(part.endswith(".egg-info") for part in p.parts)
        and not any(s in p.relative_to(top).parts[:1] for s in skip)
    ]


def images(engine: Engine) -> list[Image]:
    """Every image the override names, in build order (bases first); the versions are .env.example's,
    checked against flowstat's own pins."""
    from flowstat.stack import elasticsearch as es
    from flowstat.stack import telegraf

    versions = env_example()
    fv, ev, tv, av = (
        versions[k] for k in ("FLOWSTAT_VERSION", "ELASTIC_VERSION", "TELEGRAF_VERSION", "ELASTALERT_VERSION")
    )
    if ev != es.ES_VERSION or "v" + tv != telegraf.VERSION:
        raise EngineError(
            f".env.example pins Elasticsearch {ev} and Telegraf {tv}; flowstat builds "
            f"{es.ES_VERSION} and {telegraf.VERSION}"
        )

    def base(name: str) -> str:
        return image_id(engine, BASES[name])

    def build(tag: str, name: str, args: dict[str, str], sources: Callable[[], dict[str, Path]] = dict):
        return lambda inputs: docker_build(engine, tag, _staged(name, sources()), inputs, args)

    debian = mmdebstrap_image(
        engine,
        BASES["debian"],
        ["ca-certificates", "passwd", "curl", "procps"],
        [],
        ['CMD ["bash"]', "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt"],
    )
    # Python 3.11 where the official image has it: `python` and `pip` in /usr/local/bin (a venv,
    # as Debian keeps pip out of its own Python), and the CA bundle for pip.
    python = mmdebstrap_image(
        engine,
        BASES["python"],
        ["ca-certificates", "passwd", "python3", "python3-venv"],
        ['chroot "$1" python3 -m venv /usr/local'],
        [
            'CMD ["python3"]',
            "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
            "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
        ],
    )
    flowstat_files = [
        ROOT / "Dockerfile",
        ROOT / ".dockerignore",
        ROOT / "pyproject.toml",
        ROOT / "README.md",
        ROOT / "requirements.lock",
        *_tree(ROOT / "src"),
        *_tree(ROOT / "collectors" / "c", ("build",)),
        ROOT / "benchmark-harness" / "topologies",
    ]
    constraints = ROOT / "src" / "flowstat" / "stack" / "elastalert-files" / "constraints.txt"
    launcher = constraints.with_name("launch.py")
    zip_or_version = lambda: es.m2_zip(ev) if es.m2_zip(ev).exists() else ev
    return [
        debian,
        python,
        # flowstat's image: the project's Dockerfile, unchanged, on the Python base (PYTHON_IMAGE)
        Image(
            f"flowstat:{fv}",
            lambda: digest(base("python"), fv, *flowstat_files),
            lambda inputs: docker_build(
                engine, f"flowstat:{fv}", ROOT, inputs, {"FLOWSTAT_VERSION": fv, "PYTHON_IMAGE": BASES["python"]}
            ),
        ),
        Image(
            STANDIN["elasticsearch"],
            lambda: digest(
                base("debian"),
                STAND_INS / "elasticsearch",
                ev,
                zip_or_version(),
                ROOT / "src" / "flowstat" / "stack" / "es-analysis",
            ),
            build(
                STANDIN["elasticsearch"],
                "elasticsearch",
                {"DEBIAN_IMAGE": BASES["debian"]},
                lambda: {"elasticsearch": es.secured_distribution(ROOT / ".cache" / "test-stack")},
            ),
        ),
        Image(
            STANDIN["influxdb"],
            lambda: digest(base("debian"), STAND_INS / "influxdb"),
            build(STANDIN["influxdb"], "influxdb", {"DEBIAN_IMAGE": BASES["debian"]}),
        ),
        Image(
            STANDIN["telegraf"],
            lambda: digest(base("debian"), STAND_INS / "telegraf", tv, ",".join(telegraf.PLUGINS)),
            build(
                STANDIN["telegraf"],
                "telegraf",
                {"DEBIAN_IMAGE": BASES["debian"]},
                lambda: {"telegraf": telegraf.build()},
            ),
        ),
        Image(
            STANDIN["elastalert"],
            lambda: digest(base("python"), STAND_INS / "elastalert", constraints, launcher, av),
            build(
                STANDIN["elastalert"],
                "elastalert",
                {"PYTHON_IMAGE": BASES["python"], "ELASTALERT_VERSION": av},
                lambda: {"constraints.txt": constraints, "launch.py": launcher},
            ),
        ),
        Image(
            STANDIN["prometheus"],
            lambda: digest(base("debian"), STAND_INS / "prometheus"),
            build(STANDIN["prometheus"], "prometheus", {"DEBIAN_IMAGE": BASES["debian"]}),
        ),
        Image(
            STANDIN["logstash"],
            lambda: digest(image_id(engine, f"flowstat:{fv}"), STAND_INS / "logstash"),
            build(STANDIN["logstash"], "logstash", {"FLOWSTAT_IMAGE": f"flowstat:{fv}"}),
        ),
    ]


def ensure_images(engine: Engine, report: Callable[[str], None] = say) -> list[str]:
    """Build what is missing or stale, with the engine in the machine's network; returns what was
    built. Leaves the engine stopped if it had to start it for the builds."""
    stale = []
    started = False
    try:
        for img in images(engine):
            if not engine.running():
                engine.start(isolated=True)  # reading labels needs an engine; builds switch it below
            inputs = img.inputs()
            if image_inputs(engine, img.tag) == inputs:
                continue
            if engine.running() != "machine":
                engine.start(isolated=False)
                started = True
            t0 = time.monotonic()
            report(f"building {img.tag}")
            img.make(inputs)
            report(f"built {img.tag} in {time.monotonic() - t0:.0f} s")
            stale.append(img.tag)
    finally:
        if started:
            engine.stop()
    return stale


def main(argv: list[str]) -> int:
    engine = Engine(state_root())
    cmd = argv[0] if argv else "images"
    try:
        if cmd == "images":
            with machine_lock(engine.root):
                compose_binary()
                was = engine.running()
                built = ensure_images(engine)
                if not was and engine.running():
                    engine.stop()
                say(f"images ready ({len(built)} built)")
        elif cmd == "up":
            engine.start(isolated=True)
            say(f"engine up in namespace {NETNS}: DOCKER_HOST={engine.host}; compose: {compose_binary()}")
        elif cmd == "down":
            engine.stop()
            say("engine stopped")
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except EngineError as exc:
        say(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
