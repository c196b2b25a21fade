"""flowstat's Debian packages (packaging/, `make deb`: docs/farm.md) built by debhelper from the
checkout, checked by lintian, and installed with apt into a Debian bookworm root made by mmdebstrap:
what lands where, the agent run as its systemd unit runs it (user, no privileges) with /proc as Debian
mounts it and with hidepid=, the units as systemd-analyze reads them, an upgrade, a purge, and the
C++ example built against the -dev package with pkg-config alone.

Each root is the cached one (.cache/packages/root-*, made once from its tarball) under an overlay of
the test's own, so every test starts from the same fresh root and leaves nothing in it. Commands run
in the root in mount and pid namespaces of their own (/proc theirs, gone with them). The packages are
cached under a digest of what they are built from; a change to packaging/ or collectors/c builds them
again (about 10 s); the root is made again only when its package list changes (about 2 minutes)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flowstat import __version__
from support.common import ROOT

CACHE = ROOT / ".cache" / "packages"
DOCS = ROOT / "docs" / "farm.md"
UNITS = ROOT / "packaging" / "systemd"
EXAMPLE = ROOT / "examples" / "cpp-pipeline"
MULTIARCH = "x86_64-linux-gnu"

# What packaging/build-deb copies and builds from: the packages' digest is these files'.
DEB_INPUTS = ("collectors/c", "packaging", "src/flowstat/__init__.py", "src/flowstat/schema")
PACKAGES = ("flowstat-agent", "libflowstat-node0", "libflowstat-node-dev")

# The root: Debian's smallest (essential packages and apt), what the packages depend on (so apt installs
# them offline), systemd (its tmpfiles, systemctl and systemd-analyze in the root), and what building
# the C++ example needs.
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
ROOT_PACKAGES = (
    "adduser",
    "procps",  # /bin/kill, the unit's ExecReload
    "systemd",
    "libzmq5",
    "libcjson1",
    "libcurl4",
    "libssl3",  # the C agent's /metrics over TLS, its web-config read with libyaml
    "libyaml-0-2",
    "g++",
    "make",
    "pkg-config",
    "libzmq3-dev",
    "cppzmq-dev",
)
CHROOT_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C",
    "HOME": "/root",
    "DEBIAN_FRONTEND": "noninteractive",
}

TOOLS = ("mmdebstrap", "dpkg-buildpackage", "dh", "unshare", "zstd", "systemd-analyze")
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chroot, mounts): make test runs as root"),
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in TOOLS),
        reason=f"needs {', '.join(t for t in TOOLS if shutil.which(t) is None)}: make test installs them (TEST_DEPS)",
    ),
]


# -- the packages and the root, made once --------------------------------------------------------------


@contextlib.contextmanager
def locked(name: str):
    """One maker at a time across pytest's workers (the others wait, then find it made)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def files_under(top: Path, rel: str) -> list[Path]:
    path = top / rel
    if path.is_file():
        return [path]
    return sorted(
        p
        for p in path.rglob("*")
        if (p.is_file() or p.is_symlink())
        and "__pycache__" not in p.parts
        and not p.relative_to(top).as_posix().startswith("collectors/c/build/")
    )


@functools.cache
def inputs_digest() -> str:
    h = hashlib.sha256()
    for rel in DEB_INPUTS:
        for p in files_under(ROOT, rel):
            h.update(p.relative_to(ROOT).as_posix().encode() + b"\0")
            h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:16]


def changelog_version(changelog: Path) -> str:
    return re.match(r"flowstat \(([^)]+)\)", changelog.read_text()).group(1)


def build_debs(top: Path, out: Path, version: str | None = None) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    run = subprocess.run(
        [str(top / "packaging" / "build-deb"), str(tmp), *([version] if version else [])],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    tmp.rename(out)


def debs(upgrade: bool = False) -> Path:
    """The folder of the packages built from the checkout as it is, or (upgrade) of the same sources
    rebuilt with a higher version and one more line in the default agent.toml: an upgrade whose
    conffile changed, as dpkg meets it when the admin edited it too."""
    digest = inputs_digest()
    out = CACHE / f"debs-{digest}{'-upgrade' if upgrade else ''}"
    with locked("debs"):
        if not out.exists():
            # A few older builds stay (a few hundred kB each): a worker that read the sources before
            # an edit may still install them.
            builds = [p for p in CACHE.glob("debs-*") if p.is_dir() and not p.name.endswith(("-upgrade", ".tmp"))]
            older = sorted(builds, key=lambda p: p.stat().st_mtime)[:-6]
            older += [p for p in CACHE.glob("debs-*.tmp") if p != out.with_name(out.name + ".tmp")]  # failed builds
            for old in older:
                shutil.rmtree(old, ignore_errors=True)
                shutil.rmtree(f"{old}-upgrade", ignore_errors=True)
            if not upgrade:
                build_debs(ROOT, out)
            else:
                tmp = CACHE / "upgrade-sources"
                shutil.rmtree(tmp, ignore_errors=True)
                for rel in DEB_INPUTS:
                    for p in files_under(ROOT, rel):
                        dest = tmp / p.relative_to(ROOT)
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(p, dest, follow_symlinks=False)
                with open(tmp / "packaging" / "agent.toml", "a") as f:
                    f.write("# (a line the next version added)\n")
                build_debs(tmp, out, changelog_version(ROOT / "packaging" / "debian" / "changelog") + "+upgrade1")
                shutil.rmtree(tmp)
    return out


def deb_files(folder: Path) -> list[str]:
    """The three packages' file names (not the -dbgsym ones)."""
    return sorted(p.name for p in folder.glob("*.deb") if p.name.split("_")[0] in PACKAGES)


def debian_root() -> Path:
    """The root, extracted from its tarball (made first, by mmdebstrap, if need be)."""
    key = hashlib.sha256(repr((SUITE, MIRRORS, ROOT_PACKAGES)).encode()).hexdigest()[:12]
    tarball, base = CACHE / f"root-{key}.tar.zst", CACHE / f"root-{key}"
    with locked("root"):
        if not tarball.exists():
            for old in CACHE.glob("root-*"):
                shutil.rmtree(old) if old.is_dir() else old.unlink()
            part = CACHE / f"root-{key}.part.tar.zst"
            made = subprocess.run(
                [
                    "mmdebstrap",
                    "--variant=apt",
                    "--mode=root",
                    f"--include={','.join(ROOT_PACKAGES)}",
                    '--customize-hook=chroot "$1" dpkg-query -W > "$1/root/packages.txt"',
                    '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin',
                    SUITE,
                    str(part),
                    *MIRRORS,
                ],
                capture_output=True,
                text=True,
                timeout=1200,
            )
            assert made.returncode == 0, made.stderr[-3000:]
            part.rename(tarball)
        if not base.exists():
            part = CACHE / f"root-{key}.part"
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir()
            subprocess.run(["tar", "--zstd", "-xf", str(tarball), "-C", str(part)], check=True)
            shutil.copy(part / "root" / "packages.txt", CACHE / f"root-{key}.packages.txt")  # the versions in it
            part.rename(base)
    return base


# -- a fresh root and commands in it -----------------------------------------------------------------


class Chroot:
    """A fresh copy of the root: the cached one under an overlay (its changes in ``upper``)."""

    def __init__(self, path: Path, upper: Path):
        self.path, self.upper = path, upper

    def run(self, script: str, binds: dict[Path, str] | None = None, check: bool = True, timeout: float = 120):
        """``script`` run by ``/bin/sh -e`` in the root, as its pid 1, in new mount and pid namespaces:
        their own /proc mounted, ``binds`` (a host folder -> a folder of the root) bind-mounted; all of
        it, and every process the script left, gone when it ends."""
        mounts = "".join(f'mount --bind "{host}" "$R{inside}"; ' for host, inside in (binds or {}).items())
        outer = f'set -e; mount -t proc proc "$R/proc"; {mounts}exec chroot "$R" /bin/sh -ec "$1"'
        out = subprocess.run(
            ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", outer, "sh", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**CHROOT_ENV, "R": str(self.path)},
        )
        if check:
            assert out.returncode == 0, f"{script}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}"
        return out

    def install(self, folder: Path, *extra: str) -> subprocess.CompletedProcess:
        """apt-get install of the three packages of ``folder``, offline: their dependencies are in the root."""
        names = " ".join(f"./{n}" for n in deb_files(folder))
        return self.run(f"cd /mnt && apt-get install -y -q {' '.join(extra)} {names}", binds={folder: "/mnt"})

    def read(self, path: str) -> str:
        return (self.path / path.lstrip("/")).read_text()


@pytest.fixture
def root(tmp_path):
    """A fresh root for one test, unmounted after it."""
    base = debian_root()
    merged, upper, work = (tmp_path / d for d in ("root", "upper", "work"))
    for d in (merged, upper, work):
        d.mkdir()
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={base},upperdir={upper},workdir={work}", str(merged)],
        check=True,
    )
    try:
        yield Chroot(merged, upper)
    finally:
        subprocess.run(["umount", "--lazy", str(merged)], check=True)


@pytest.fixture(scope="module")
def built() -> Path:
    return debs()


# -- the agent as its unit runs it ---------------------------------------------------------------------


def unit_settings(text: str) -> dict[str, list[str]]:
    """The [Service] settings of a unit's text as systemd reads them: for the list settings an empty
    assignment empties the list and the others add to it; otherwise the last one wins."""
    lists = ("CapabilityBoundingSet", "AmbientCapabilities", "SupplementaryGroups")
    found: dict[str, list[str]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            if key in lists:
                found[key] = found.get(key, []) + value.split() if value else []
            else:
                found[key] = [value]
    return found


def uncommented(text: str, *settings: str) -> str:
    """The unit's text with its commented ``#Setting=...`` lines of these settings made real."""
    return re.sub(rf"^#(({'|'.join(settings)})=)", r"\1", text, flags=re.M)


def as_unit(unit_text: str, gids: str = "") -> str:
    """The setpriv command that puts a process where the unit puts the agent: its user and group,
    supplementary groups (``gids``: their ids, as the root names them), no_new_privs, the bounding and
    ambient capability sets."""
    s = unit_settings(unit_text)
    caps = [c.removeprefix("CAP_").lower() for c in s.get("CapabilityBoundingSet", [])]
    ambient = [c.removeprefix("CAP_").lower() for c in s.get("AmbientCapabilities", [])]
    assert set(ambient) <= set(caps), s  # systemd drops ambient capabilities the bounding set lacks
    cmd = ["setpriv", f"--reuid {s['User'][0]}", f"--regid {s['Group'][0]}"]
    cmd.append(f"--groups $(id -G {s['User'][0]} | tr ' ' ,){gids}" if gids else "--init-groups")
    if s.get("NoNewPrivileges") == ["yes"]:
        cmd.append("--no-new-privs")
    if ambient:
        plus = ",".join(f"+{c}" for c in ambient)
        cmd += [f"--inh-caps {plus}", f"--ambient-caps {plus}"]
    cmd.append("--bounding-set " + ",".join(["-all", *(f"+{c}" for c in caps)]))
    return " ".join(cmd)


def agent_script(unit_text: str, proc_options: str = "", gids: str = "", before: str = "") -> str:
    """A `sleep` of root's, added as a target to the installed /etc/flowstat/agent.toml with stdout as
    the sink; then the agent run as the unit runs it (its ExecStart, umask, user, groups, capabilities,
    a clean environment, its state directory made as systemd makes it), told to stop after 3 rounds;
    /proc mounted again with ``proc_options`` first."""
    s = unit_settings(unit_text)
    return f"""
        sleep infinity &
        target=$!
        echo "target $target"
        sed -i '/^# the test:$/,$d' /etc/flowstat/agent.toml  # a previous run's lines
        printf '# the test:\\npid = [%d]\\nsink = ["stdout://"]\\ninterval = 0.1\\n' $target >> /etc/flowstat/agent.toml
        {before}
        {f"mount -t proc -o {proc_options} proc /proc" if proc_options else ""}
        install -d -o flowstat -g flowstat -m {s["StateDirectoryMode"][0]} /var/lib/{s["StateDirectory"][0]}
        umask {s["UMask"][0]}
        exec env -i PATH=/usr/bin:/bin {as_unit(unit_text, gids)} {s["ExecStart"][0]} --count 3
    """


def samples_of(stdout: str) -> tuple[int, list[str], list[str]]:
    """(the target's pid, its samples, the agent's self-samples) in the agent's line-protocol output."""
    pid = int(re.search(r"^target (\d+)$", stdout, re.M).group(1))
    mine = [line for line in stdout.splitlines() if line.startswith("flowstat_node,") and f",pid={pid}i," in line]
    own = [line for line in stdout.splitlines() if line.startswith("flowstat_agent,")]
    return pid, mine, own


# -- the tests -------------------------------------------------------------------------------------------


def test_make_deb_builds_the_three_packages_and_lintian_finds_only_what_farm_md_explains(built, tmp_path):
    """`make deb` runs packaging/build-deb into dist/; the packages' version is the changelog's,
    whose upstream part is flowstat's; each lintian tag (warnings, info, pedantic) is one farm.md
    explains."""
    steps = subprocess.run(["make", "-n", "deb"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "packaging/build-deb dist" in steps
    version = changelog_version(ROOT / "packaging" / "debian" / "changelog")
    assert version.rsplit("-", 1)[0] == __version__
    assert deb_files(built) == [
        f"flowstat-agent_{version}_amd64.deb",
        f"libflowstat-node-dev_{version}_amd64.deb",
        f"libflowstat-node0_{version}_amd64.deb",
    ]
    if shutil.which("lintian") is None:
        pytest.skip("no lintian: make test installs it (TEST_DEPS)")
    changes = next(built.glob("*.changes"))
    lint = subprocess.run(
        ["lintian", "--display-info", "--pedantic", str(changes)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # lintian leaves files in its TMPDIR (mldbm-elf-*) at each run
    )
    tags = sorted(set(re.findall(r"^[EWIPX]: \S+: (\S+)", lint.stdout, re.M)))
    assert not re.search(r"^E: ", lint.stdout, re.M), lint.stdout
    section = DOCS.read_text().split("## What lintian says", 1)[1].split("\n## ", 1)[0]
    explained = re.findall(r"^- `([\w.-]+)`", section, re.M)
    assert [t for t in tags if t not in explained] == [], lint.stdout


def test_the_default_config_names_every_key_of_the_schema_and_sets_the_services_own():
    """packaging/agent.toml: valid TOML whose keys, set or commented out, are the schema's (each said
    once, with what it does above it); it sets the service's endpoints directory and spool, and no sink."""
    import tomllib

    schema = json.loads((ROOT / "src/flowstat/schema/agent-config.schema.json").read_text())["properties"]
    text = (ROOT / "packaging" / "agent.toml").read_text()
    active = tomllib.loads(text)
    commented = re.findall(r"^# (\w+) = ", text, re.M)
    assert set(active) | set(commented) == set(schema) and not set(active) & set(commented)
    assert active == {"endpoints_dir": ["/run/flowstat/endpoints"], "spool_dir": "/var/lib/flowstat-agent/spool"}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^#? ?\w+ = ", line) and not re.match(r"^#? ?\w+ = ", lines[i - 1]):
            assert lines[i - 1].startswith("# ") and len(lines[i - 1]) > 12, line  # what it does, above it
    farm = DOCS.read_text()
    assert [k for k in schema if f"| `{k}` |" not in farm] == []


def test_install_puts_files_in_place_marks_the_config_a_conffile_adds_the_user_and_starts_nothing(built, root):
    """apt-get install of the three packages: the files where farm.md says; /etc/flowstat/agent.toml a
    conffile; the system user flowstat; the endpoints directory sticky and writable by all; the unit
    neither enabled nor started; the pkg-config file multiarch with prefix /usr."""
    root.install(built)
    for path in (
        "usr/bin/flowstat-agent",
        "lib/systemd/system/flowstat-agent.service",
        "usr/lib/tmpfiles.d/flowstat-agent.conf",
        "usr/share/man/man1/flowstat-agent.1.gz",
        "etc/flowstat/agent.toml",
        f"usr/lib/{MULTIARCH}/libflowstat-node.so.0",
        f"usr/lib/{MULTIARCH}/libflowstat-node.a",
        f"usr/lib/{MULTIARCH}/pkgconfig/flowstat-node.pc",
        "usr/include/flowstat/node.h",
    ):
        assert (root.path / path).is_file(), path
    assert (root.path / "etc/flowstat/agent.d").is_dir() and not list((root.path / "etc/flowstat/agent.d").iterdir())
    assert os.readlink(root.path / f"usr/lib/{MULTIARCH}/libflowstat-node.so") == "libflowstat-node.so.0"
    assert (root.read("lib/systemd/system/flowstat-agent.service")) == (UNITS / "flowstat-agent.service").read_text()
    assert root.read("etc/flowstat/agent.toml") == (ROOT / "packaging" / "agent.toml").read_text()
    pc = root.read(f"usr/lib/{MULTIARCH}/pkgconfig/flowstat-node.pc")
    assert re.findall(r"^(prefix|libdir|includedir)=(.*)$", pc, re.M) == [
        ("prefix", "/usr"),
        ("libdir", f"/usr/lib/{MULTIARCH}"),
        ("includedir", "/usr/include"),
    ]
    out = root.run(
        "dpkg-query -W -f='${Conffiles}\\n' flowstat-agent; getent passwd flowstat; getent group flowstat;"
        " stat -c '%a %U %n' /run/flowstat/endpoints; systemctl is-enabled flowstat-agent || true;"
        " ls /etc/systemd/system/multi-user.target.wants/"
    ).stdout
    conffiles = [line.split()[0] for line in out.splitlines() if line.startswith(" /")]
    assert conffiles == ["/etc/flowstat/agent.toml"], out
    user = next(line for line in out.splitlines() if line.startswith("flowstat:x:")).split(":")
    assert (user[5], user[6]) == ("/nonexistent", "/usr/sbin/nologin") and int(user[2]) < 1000, user
    assert re.search(rf"^flowstat:x:{user[3]}:", out, re.M)  # its own group
    assert "1777 root /run/flowstat/endpoints" in out
    assert "\ndisabled\n" in out and "flowstat" not in out.split("disabled", 1)[1], out
    # Started by nothing: (no systemd runs in the root, so this is read in the maintainer scripts) the
    # one action on the unit is a try-restart, on upgrades (when configure is given the old version).
    info = root.path / "var/lib/dpkg/info"
    scripts = "".join(
        (info / f"flowstat-agent.{s}").read_text()
        for s in ("preinst", "postinst", "prerm", "postrm")
        if (info / f"flowstat-agent.{s}").exists()
    )
    assert re.findall(r"deb-systemd-invoke (\S+)", scripts) == ["try-restart"], scripts
    assert 'if [ -n "$2" ]; then\n\t\t\tdeb-systemd-invoke try-restart' in scripts
    unit = root.read("lib/systemd/system/flowstat-agent.service")
    settings = root.run(f"{as_unit(unit)} {unit_settings(unit)['ExecStart'][0]} --print-config").stdout
    config = json.loads(settings)  # the shipped file, read by the agent as its unit runs it
    assert (config["endpoints_dir"], config["spool_dir"], config["sink"]) == (
        ["/run/flowstat/endpoints"],
        "/var/lib/flowstat-agent/spool",
        [],
    ), settings


def test_the_agent_run_as_its_unit_runs_it_samples_a_process_of_root(built, root):
    """User flowstat, no capabilities, no_new_privs, /proc as Debian mounts it: another user's
    process is readable, and the agent samples root's `sleep` every round."""
    root.install(built)
    unit = root.read("lib/systemd/system/flowstat-agent.service")
    assert unit_settings(unit)["CapabilityBoundingSet"] == []
    out = root.run(agent_script(unit))
    pid, mine, own = samples_of(out.stdout)
    assert len(mine) == 3 and all('node_state="UP"' in s and f"node_id=sleep-{pid}," in s for s in mine), out.stdout
    assert ",targets=1i," in own[-1], out.stdout
    assert re.search(r"^flowstat_agent,.*,proc_errors=0i,", out.stdout, re.M), out.stdout


def test_under_hidepid_the_agent_samples_roots_process_only_with_cap_sys_ptrace_or_the_gid_group(built, root):
    """/proc mounted with hidepid=invisible: with the unit as shipped the agent gets no sample of
    root's process (it sees no target); with the unit's commented CAP_SYS_PTRACE lines, or its
    SupplementaryGroups= line and the mount's gid= that group, it samples it."""
    root.install(built)
    unit = root.read("lib/systemd/system/flowstat-agent.service")
    hidden = root.run(agent_script(unit, "hidepid=invisible"))
    pid, mine, own = samples_of(hidden.stdout)
    assert mine == [] and ",targets=0i," in own[-1], hidden.stdout

    ptrace = uncommented(unit, "AmbientCapabilities", "CapabilityBoundingSet")
    assert unit_settings(ptrace)["CapabilityBoundingSet"] == ["CAP_SYS_PTRACE"]
    out = root.run(agent_script(ptrace, "hidepid=invisible"))
    pid, mine, own = samples_of(out.stdout)
    assert len(mine) == 3 and ",targets=1i," in own[-1], out.stdout

    group = uncommented(unit, "SupplementaryGroups")
    name = unit_settings(group)["SupplementaryGroups"][0]
    gid = f"$(getent group {name} | cut -d: -f3)"
    out = root.run(
        agent_script(group, f"hidepid=invisible,gid={gid}", gids=f",{gid}", before=f"groupadd --system {name}")
    )
    pid, mine, own = samples_of(out.stdout)
    assert len(mine) == 3 and ",targets=1i," in own[-1], out.stdout


def test_under_hidepid_the_agent_says_why_it_sees_nothing(built, root):
    """The agent without the privilege says that the process exists and /proc hides it."""
    root.install(built)
    hidden = root.run(agent_script(root.read("lib/systemd/system/flowstat-agent.service"), "hidepid=invisible"))
    assert re.search(r"hidepid|hidden", hidden.stderr), hidden.stderr


def test_systemd_analyze_verify_accepts_both_units_against_the_real_binaries(built, root):
    """systemd-analyze verify, silent (it exits 0 on an unknown or misspelt setting, and only says so):
    the installed unit in the installed root (its ExecStart there), with each of its commented
    alternatives made real; the Python agent's unit with /opt/flowstat the checkout's venv (where
    `flowstat` is the console script pip made), in a mount namespace of its own, where that
    `flowstat agent` reads the shipped configuration as the C agent does."""
    root.install(built)
    unit = root.read("lib/systemd/system/flowstat-agent.service")
    variants = {
        "flowstat-agent.service": unit,
        "ptrace.service": uncommented(unit, "AmbientCapabilities", "CapabilityBoundingSet"),
        "group.service": uncommented(unit, "SupplementaryGroups"),
    }
    for name, text in variants.items():
        path = root.path / "etc/systemd/system" / name
        if name != "flowstat-agent.service":
            path.write_text(text)
        out = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", f"--root={root.path}", name], capture_output=True, text=True
        )
        assert (out.returncode, out.stdout + out.stderr) == (0, ""), name
    venv = Path(os.environ.get("VIRTUAL_ENV") or ROOT / ".venv")
    assert (venv / "bin" / "flowstat").is_file()
    python_unit = UNITS / "flowstat-agent-python.service"
    out = subprocess.run(
        [
            "unshare",
            "--mount",
            "sh",
            "-ec",
            'mount -t tmpfs tmpfs /opt; mkdir /opt/flowstat; mount --bind "$1" /opt/flowstat;'
            ' systemd-analyze verify --man=no "$2" 2>&1; /opt/flowstat/bin/flowstat agent --config "$3" --print-config',
            "sh",
            str(venv),
            str(python_unit),
            str(root.path / "etc/flowstat/agent.toml"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.startswith("{"), out.stdout + out.stderr
    unit_run = f"{as_unit(unit)} {unit_settings(unit)['ExecStart'][0]} --print-config"
    assert json.loads(out.stdout) == json.loads(root.run(unit_run).stdout)
    assert unit_settings(python_unit.read_text())["ExecStart"] == [
        "/opt/flowstat/bin/flowstat agent --config /etc/flowstat/agent.toml"
    ]


def test_an_upgrade_keeps_the_edited_config_and_the_spool(built, root):
    """Version A installed, its agent.toml edited, a batch in the spool; then the same packages at a
    higher version whose agent.toml changed too, with --force-confold: the admin's file stays (the new
    one beside it as .dpkg-dist), the spool file stays, the user keeps its uid."""
    upgrade = debs(upgrade=True)
    root.install(built)
    before = root.run(
        "echo 'interval = 2.0' >> /etc/flowstat/agent.toml;"
        " install -d -o flowstat -g flowstat /var/lib/flowstat-agent /var/lib/flowstat-agent/spool;"
        " echo batch > /var/lib/flowstat-agent/spool/0001.batch; id -u flowstat"
    ).stdout
    edited = root.read("etc/flowstat/agent.toml")
    out = root.install(upgrade, "-o", "Dpkg::Options::=--force-confold")
    assert "Unpacking flowstat-agent" in out.stdout and "over (" in out.stdout, out.stdout
    after = root.run("dpkg-query -W -f='${Version}\\n' flowstat-agent; id -u flowstat").stdout.split()
    assert after == [changelog_version(ROOT / "packaging/debian/changelog") + "+upgrade1", before.strip()]
    assert root.read("etc/flowstat/agent.toml") == edited
    assert root.read("etc/flowstat/agent.toml.dpkg-dist").endswith("# (a line the next version added)\n")
    assert root.read("var/lib/flowstat-agent/spool/0001.batch") == "batch\n"


def test_purge_removes_everything_the_install_added_but_the_user(built, root):
    """dpkg -P after an install and a run's spool: every file and folder the packages or the agent
    added is gone (the overlay's upper layer, what differs from the root, holds only the package
    databases and the user), and the user flowstat stays, as Debian leaves system users."""
    root.install(built)
    root.run("install -d -o flowstat -g flowstat /var/lib/flowstat-agent/spool; touch /var/lib/flowstat-agent/spool/x")
    root.run("dpkg -P flowstat-agent libflowstat-node-dev libflowstat-node0")
    assert root.run("getent passwd flowstat").stdout.startswith("flowstat:x:")
    # What a package's install and purge leave anywhere: dpkg's and apt's records and logs, the user's
    # lines and the locks of the tools that wrote them, the dynamic linker's cache, deb-systemd-helper's
    # state folder.
    expected = re.compile(
        r"^(var/lib/dpkg/|var/lib/apt/|var/log/|var/cache/(apt|debconf|ldconfig)/|etc/ld\.so\.cache$"
        r"|etc/(passwd|group|shadow|gshadow)-?$|etc/\.pwd\.lock$|run/adduser$|var/lib/systemd/deb-systemd-helper-)"
    )
    left, base = [], debian_root()
    for p in sorted(root.upper.rglob("*")):
        rel = p.relative_to(root.upper).as_posix()
        if expected.match(rel):
            continue
        if not p.is_dir() or p.is_symlink():
            left.append(rel)
        elif not (base / rel).is_dir():
            left.append(rel + "/")  # a folder the root did not have
    assert left == [], left
    assert not (root.path / "etc/flowstat").exists() and not (root.path / "var/lib/flowstat-agent").exists()


def test_the_dev_package_builds_the_cpp_example_with_pkg_config_alone(built, root):
    """The C++ example (examples/cpp-pipeline) copied into the root, built there against the installed
    -dev package: by its Makefile (which finds flowstat-node with pkg-config and links the library
    statically) and by hand with `pkg-config --cflags --libs flowstat-node libzmq` (the shared library);
    both run a pipeline of 500 objects end to end."""
    root.install(built)
    example = root.path / "tmp" / "example"
    example.mkdir()
    for name in ("Makefile", "pipeline.cpp"):
        shutil.copy(EXAMPLE / name, example / name)
    out = root.run(
        """cd /tmp/example
        pkg-config --cflags --libs flowstat-node
        make
        ./pipeline run --dir /tmp/ipc-static --count 500 --rate 0
        c++ -std=c++17 -O1 -o pipeline-shared pipeline.cpp $(pkg-config --cflags --libs flowstat-node libzmq)
        ldd ./pipeline-shared
        ./pipeline-shared run --dir /tmp/ipc-shared --count 500 --rate 0
        """,
        timeout=300,
    ).stdout
    flags = out.splitlines()[0].split()
    assert "-lflowstat-node" in flags and not [f for f in flags if f.startswith(("-I", "-L")) and "flowstat" in f]
    assert "libflowstat-node: installed" in out
    assert out.count("sink: 500 source objects arrived") == 2, out
    assert re.search(rf"libflowstat-node\.so\.0 => /(usr/)?lib/{MULTIARCH}/libflowstat-node\.so\.0", out), out
