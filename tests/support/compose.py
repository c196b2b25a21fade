"""What the modules that run compose files on the suite's own Docker engine share
(tests/test_compose_up.py: docker-compose.yml; tests/test_es_cluster_up.py: Elasticsearch as three
nodes): the engine, started in its network namespace and stopped with the machine's interfaces as
they were; a compose project on it; the check that an override of the stand-ins changes nothing but
images, host networking and what is left out; and threads that work inside the engine's namespace
(the stack's "host" network), where the test process's own sockets cannot reach."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from flowstat_lab import compose as ce
from flowstat_lab import netns
from support.common import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"
LEFT_OUT = {"kibana", "setup-kibana", "grafana"}  # no source for Kibana or Grafana here
LEFT_OUT_VOLUMES = {"kibana-data", "grafana-data"}
FLOWSTAT_SERVICES = {"secrets", "setup", "setup-kibana", "rollup", "verdict", "verdict-influxdb", "alerts", "harness"}
HOSTNAME = {"FLOWSTAT_HOSTNAME": socket.gethostname()}  # the overrides resolve it (extra_hosts)
BIND_KEYS = {
    "elasticsearch": {"network.host": "127.0.0.1"},
    "influxdb": {"INFLUXDB_HTTP_BIND_ADDRESS": "127.0.0.1:8086"},
}  # settings the images' own 0.0.0.0 gives way to

MISSING = [
    p
    for p in ("dockerd", "containerd", "mmdebstrap", "ip", "nsenter")
    if not shutil.which(p) and not shutil.which(p, path="/usr/sbin:/sbin")
]
if os.geteuid() != 0:
    MISSING.append("root")
needs_engine = pytest.mark.skipif(
    bool(MISSING) and not os.environ.get("CI"),
    reason=f"needs {', '.join(MISSING)} (make test installs the engine and builds the images)",
)


def host_addresses() -> list[tuple[str, str]]:
    """Every interface of the machine and its addresses (`ip -j addr`)."""
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    return sorted(
        (link["ifname"], f"{a['local']}/{a['prefixlen']}")
        for link in json.loads(out)
        for a in link.get("addr_info", []) or [{"local": "", "prefixlen": ""}]
    )


def loopback_only(addresses: list[str]) -> bool:
    """Every ADDRESS/PREFIX in 127.0.0.0/8 (or ::1): nothing the machines' rules forbid."""
    return bool(addresses) and all(on_loopback(a.split("/")[0]) for a in addresses)


def compose_v2() -> Path:
    """Compose v2, built (make compose-images); skipped without it, failed in CI."""
    if not Path(
        ce.state_root(), "go", f"compose-{ce.COMPOSE_VERSION}", "docker-compose"
    ).exists() and not os.environ.get("CI"):
        pytest.skip("Compose v2 is not built yet: make compose-images")
    return ce.compose_binary()


def compose_config(*files: Path, env_file: Path, profiles: tuple[str, ...] = ("harness",)) -> dict:
    """The merged configuration, as Compose v2 reads it (with the harness profile, or ``profiles``)."""
    out = subprocess.run(
        [
            str(ce.compose_binary()),
            "--project-directory",
            str(ROOT),
            "--env-file",
            str(env_file),
            *(a for f in files for a in ("-f", str(f))),
            *(a for p in profiles for a in ("--profile", p)),
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], **HOSTNAME},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def override_differences(
    base: dict, merged: dict, addresses: dict[str, str] | None = None, bind_keys: dict | None = None
) -> list[str]:
    """Every difference between the users' configuration and the merged one that is not an image
    swap, host networking (network_mode, ports, extra_hosts, binding a loopback address instead of
    0.0.0.0, a healthcheck asking its service's own address instead of localhost, which on the host
    network is another's) or a service left out: empty when the overrides do only what they say.
    ``addresses``: each service name's loopback address where it is not 127.0.0.1; ``bind_keys``:
    the settings that bind it, by service, beside BIND_KEYS."""
    addresses = addresses or {}
    bind_keys = {**BIND_KEYS, **(bind_keys or {})}
    wrong = []
    names = set(base["services"])
    if set(merged["services"]) != names - LEFT_OUT:
        wrong.append(f"services: {sorted(set(merged['services']) ^ (names - LEFT_OUT))} differ")
    for name, after in merged["services"].items():
        before = base["services"][name]
        for key in sorted(set(before) | set(after)):
            old, new = before.get(key), after.get(key)
            if old == new:
                continue
            if (
                key == "image"
                and (name in FLOWSTAT_SERVICES) == (new == old)
                and (name in FLOWSTAT_SERVICES or new in ce.STANDIN.values())
            ):
                continue  # a stand-in; flowstat's own image keeps its tag (built here from the Dockerfile)
            if (
                key in ("pull_policy", "build")
                and name in FLOWSTAT_SERVICES
                and ((key, new) == ("pull_policy", "never") or (key, new) == ("build", None))
            ):
                continue  # built beforehand, by the suite, from the same Dockerfile
            if key == "network_mode" and new == "host":
                continue
            if key == "networks" and new is None and old == {"default": None}:
                continue  # the host network replaces the default network
            if key == "ports" and not new:
                continue  # meaningless with host networking
            if (
                key == "extra_hosts"
                and old is None
                and all(
                    (m := re.fullmatch(r"([\w.-]+)[:=](127\.\d+\.\d+\.\d+)", h))
                    and m.group(1) in names | {HOSTNAME["FLOWSTAT_HOSTNAME"]}
                    and m.group(2) == addresses.get(m.group(1), "127.0.0.1")
                    for h in new
                )
            ):
                continue  # the service names, each at its own address, and the machine's name, on loopback
            if (
                key == "healthcheck"
                and name in addresses
                and json.loads(json.dumps(old).replace("//localhost:", f"//{addresses[name]}:")) == new
            ):
                continue  # its own address: localhost is 127.0.0.1, another service's on the host network
            if key == "environment":
                for var in sorted(set(old) | set(new)):
                    if old.get(var) == new.get(var):
                        continue
                    if var in old and old[var].startswith("0.0.0.0:") and new.get(var) == "127.0.0.1:" + old[var][8:]:
                        continue
                    if var not in old and bind_keys.get(name, {}).get(var) == new[var]:
                        continue
                    wrong.append(f"{name}.environment.{var}: {old.get(var)!r} -> {new.get(var)!r}")
                continue
            if key == "command" and [c.replace("0.0.0.0:", "127.0.0.1:") for c in old] == new:
                continue
            wrong.append(f"{name}.{key}: {json.dumps(old)[:120]} -> {json.dumps(new)[:120]}")
    for key in sorted(set(base) | set(merged)):
        if key in ("services", "name") or (key.startswith("x-") and key not in base):
            continue  # the overrides' own anchors (x-host...) hold only what their services take
        if key == "volumes":
            used = {
                v["source"]
                for svc in merged["services"].values()
                for v in svc.get("volumes", [])
                if v["type"] == "volume"
            }
            if {k: v for k, v in base["volumes"].items() if k in used} != merged["volumes"]:
                wrong.append(f"volumes: {sorted(base['volumes'])} -> {sorted(merged['volumes'])}")
            if set(base["volumes"]) - set(merged["volumes"]) != LEFT_OUT_VOLUMES:
                wrong.append(f"volumes left out: {sorted(set(base['volumes']) - set(merged['volumes']))}")
            continue
        if key == "networks" and "networks" not in merged:
            continue  # no service uses a network any longer (each is on the host's): compose drops them
        if base.get(key) != merged.get(key):
            wrong.append(f"{key}: differs")
    return wrong


@contextmanager
def engine_up() -> Iterator[ce.Engine]:
    """The suite's engine, images ready, started in its namespace under the machine-wide lock (another
    compose run waits); stopped by its pid at the end, after which the machine has exactly the
    interfaces and addresses it had before and the namespace is gone."""
    if MISSING:
        pytest.fail(f"CI is set and the engine cannot run: {', '.join(MISSING)} missing (make installs them)")
    before = host_addresses()
    e = ce.Engine(ce.state_root())
    with ce.machine_lock(e.root):
        t0 = time.monotonic()
        built = ce.ensure_images(e, report=lambda m: print(m, file=sys.stderr))
        print(f"images: {len(built)} built in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        e.start(isolated=True)
        try:
            yield e
        finally:
            e.stop()
    after = host_addresses()
    assert after == before, f"interfaces or addresses changed: {sorted(set(after) ^ set(before))}"
    assert not ce.netns_exists()


class Project:
    """A compose project on the engine: compose commands with its files and .env, its containers."""

    def __init__(self, engine: ce.Engine, env_file: Path, name: str, files: list[Path]):
        self.engine = engine
        self.env_file = env_file
        self.name = name
        self.files = files
        self.base = [
            str(ce.compose_binary()),
            "--project-directory",
            str(ROOT),
            "-p",
            name,
            "--env-file",
            str(env_file),
            *(a for f in files for a in ("-f", str(f))),
        ]

    def __call__(
        self, *args: str, check: bool = True, env: dict | None = None, timeout: float = 600, stdin: str | None = None
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [*self.base, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env={**self.engine.env, **HOSTNAME, **(env or {})},
            input=stdin,
        )
        if check:
            assert out.returncode == 0, f"compose {' '.join(args)}: {out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    @property
    def values(self) -> dict[str, str]:
        return dict(
            line.split("=", 1)
            for line in self.env_file.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        )

    def ps(self) -> dict[str, dict]:
        out = self("ps", "--all", "--format", "json").stdout.strip()
        rows = json.loads(out) if out.startswith("[") else [json.loads(x) for x in out.splitlines() if x.strip()]
        return {r["Service"]: r for r in rows}

    def container(self, service: str) -> dict:
        cid = self("ps", "--all", "-q", service).stdout.split()[0]
        return json.loads(self.engine.docker("inspect", cid).stdout)[0]

    def volume_dir(self, volume: str) -> Path:
        """A named volume of the project, read from the engine's data root."""
        return Path(
            self.engine.docker(
                "volume", "inspect", "--format", "{{.Mountpoint}}", f"{self.name}_{volume}"
            ).stdout.strip()
        )

    def volumes(self) -> list[str]:
        """The engine's volumes that belong to this project."""
        return self.engine.docker(
            "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={self.name}"
        ).stdout.split()

    def wait_healthy(self, service: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = self.ps().get(service, {})
            if row.get("State") == "running" and row.get("Health") in ("healthy", ""):
                return
            time.sleep(1)
        raise AssertionError(
            f"{service} not healthy after {timeout_s:.0f} s: {self.ps().get(service)}\n"
            f"{self('logs', '--tail', '30', service, check=False).stdout}"
        )


# -- inside the engine's namespace ------------------------------------------------------------------


def in_namespace(workers: int = 2, namespace: Path | None = None) -> ThreadPoolExecutor:
    """Threads that live in the engine's namespace (the stack's "host" network): whatever runs
    there (requests, sockets) reaches the stack's loopback addresses, not the machine's. Shut it
    down when done (a `with` block)."""
    return ThreadPoolExecutor(
        max_workers=workers,
        thread_name_prefix="in-netns",
        initializer=netns.enter_namespace,
        initargs=(namespace or ce.NAMESPACE.path,),
    )


def listening_addresses() -> list[str]:
    """The local address of every TCP and UDP socket that listens in the engine's namespace (an
    IPv4-mapped IPv6 address as its IPv4 one; a wildcard as ``*``, ``0.0.0.0`` or ``::``)."""
    out = subprocess.run(
        ["nsenter", f"--net={ce.NAMESPACE.path}", "--", "ss", "-Hltun"], capture_output=True, text=True, check=True
    ).stdout
    found = set()
    for line in out.splitlines():
        if line.strip():
            host = line.split()[4].rsplit(":", 1)[0].strip("[]").split("%")[0]
            found.add(host.removeprefix("::ffff:"))
    return sorted(found)


def on_loopback(address: str) -> bool:
    """An address in 127.0.0.0/8 or ::1 (a wildcard is not)."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def socket_addresses() -> list[str]:
    """The local address of every TCP and UDP socket in the engine's namespace, and the peer's of
    every one connected: what the stack listens on and talks to."""
    out = subprocess.run(
        ["nsenter", f"--net={ce.NAMESPACE.path}", "--", "ss", "-Htuna"], capture_output=True, text=True, check=True
    ).stdout
    found = set()
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 6:
            continue
        ends = [cols[4]] if cols[1] in ("LISTEN", "UNCONN") else [cols[4], cols[5]]
        for end in ends:
            found.add(end.rsplit(":", 1)[0].strip("[]").split("%")[0].removeprefix("::ffff:"))
    return sorted(found)
