"""The Dockerfile and the compose harness profile, checked without a Docker engine: every file the
build copies is in the build context (.dockerignore) and nothing else is; the base images are
pinned; the wheel is built as test_wheel.py builds it and installed with the lock; the C agent's
build has every -dev package its Makefile's pkg-config asks for and the image their libraries; the
image runs the flowstat CLI as an unprivileged user who can write its runs; and the harness
service's command is one flowstat takes."""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field

import pytest
import yaml

from support.common import ROOT, WHEEL_IGNORE, WHEEL_OPTIONS, WHEEL_SOURCES

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE = ROOT / "docker-compose.yml"
C_MAKEFILE = ROOT / "collectors" / "c" / "Makefile"

# pip options and environment that change what pip prints or caches, never what it builds or installs
PIP_NEUTRAL = {"-q", "--quiet", "--no-cache-dir", "--disable-pip-version-check", "--root-user-action=ignore"}
PIP_NEUTRAL_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_CACHE_DIR", "PIP_ROOT_USER_ACTION", "PIP_PROGRESS_BAR"}
# what the image's install may add to test_wheel.py's: it only refuses to build a dependency from source
PIP_INSTALL_EXTRA = {"--only-binary=:all:"}
COMPILERS = {"cc": "gcc", "gcc": "gcc", "clang": "clang"}  # a Makefile's CC, and the Debian package giving it


# -- the Dockerfile, parsed -------------------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    args: str
    workdir: str  # the stage's working directory when it runs


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def commands(self) -> list[list[str]]:
        """Each simple command of its RUN instructions, as words: split at ;, &&, || and | outside
        quotes, leading VAR=value assignments dropped."""
        out = []
        for run in self.all("RUN"):
            lexer = shlex.shlex(run.args, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words: list[str] = []
            for token in [*lexer, ";"]:
                if token in (";", "&&", "||", "|"):
                    while words and re.fullmatch(r"\w+=.*", words[0]):
                        words.pop(0)
                    if words:
                        out.append(words)
                    words = []
                else:
                    words.append(token)
        return out


def parse_dockerfile(text: str) -> list[Stage]:
    lines, pending = [], ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") or (not raw.strip() and not pending):
            continue  # comments go, inside a continued instruction too
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    stages: list[Stage] = []
    global_args: dict[str, str] = {}  # ARGs before the first FROM: what FROM lines may use, with their defaults
    for line in lines:
        keyword, _, args = line.strip().partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "ARG" and not stages:
            name, _, default = args.partition("=")
            global_args[name] = default.strip('"')
            continue
        if keyword == "FROM":
            words = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: global_args[m[1] or m[2]], args).split()
            stages.append(Stage(words[0], words[2] if len(words) == 3 and words[1].upper() == "AS" else None))
            continue
        stage = stages[-1]
        workdir = stage.last("WORKDIR").args if stage.all("WORKDIR") else "/"
        if keyword == "WORKDIR":
            args = posixpath.join(workdir, args)
        stage.instructions.append(Instruction(keyword, args, workdir))
    return stages


def exec_form(ins: Instruction) -> list[str]:
    value = json.loads(ins.args)
    assert isinstance(value, list), f"{ins.keyword} {ins.args}: not in exec (JSON) form"
    return value


def copy_parts(ins: Instruction) -> tuple[dict[str, str], list[str], str]:
    """A COPY's (or ADD's) flags, sources and destination, made absolute."""
    words = json.loads(ins.args) if ins.args.startswith("[") else ins.args.split()
    flags = {}
    while words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        flags[key] = value
    *sources, dest = words
    absolute = posixpath.join(ins.workdir, dest)
    return flags, sources, absolute + ("/" if dest.endswith("/") and not absolute.endswith("/") else "")


def copied(stage: Stage, from_stage: str | None = None) -> dict[str, str]:
    """Where a stage's COPYs put things: image path -> source path (in the build context, or in
    the stage from_stage). A directory copied maps to the directory its content lands in."""
    out = {}
    for ins in stage.all("COPY") + stage.all("ADD"):
        flags, sources, dest = copy_parts(ins)
        if flags.get("from") != from_stage:
            continue
        for source in sources:
            is_dir = (ROOT / source).is_dir() if from_stage is None else source.endswith("/")
            into = dest.endswith("/") or len(sources) > 1
            target = dest.rstrip("/") if is_dir or not into else posixpath.join(dest, posixpath.basename(source))
            out[posixpath.normpath(target)] = source.rstrip("/")
    return out


def to_context(stage: Stage, image_path: str) -> str | None:
    """The build-context path a stage's image_path was copied from, or None."""
    image_path = posixpath.normpath(image_path)
    for target, source in sorted(copied(stage).items(), key=lambda kv: -len(kv[0])):
        if image_path == target:
            return source
        if image_path.startswith(target + "/"):
            return posixpath.join(source, image_path[len(target) + 1 :])
    return None


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def stage_running(stages: list[Stage], pattern: str) -> Stage:
    found = [s for s in stages if any(re.search(pattern, run.args) for run in s.all("RUN"))]
    assert len(found) == 1, f"{len(found)} stages run {pattern!r}"
    return found[0]


def apt_installed(stage: Stage) -> set[str]:
    packages = set()
    for words in stage.commands():
        if words[:2] == ["apt-get", "install"]:
            packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages


# -- .dockerignore: Docker's rules (moby/patternmatcher) ------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern:
    """* and ? stop at a slash, ** spans any number of directories, [...] is a class."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out, i = out + "[" + ("^" + body[1:] if body[:1] in "!^" and body else body) + "]", end + 1
        elif pattern[i] == "\\" and i + 1 < len(pattern):
            out, i = out + re.escape(pattern[i + 1]), i + 2
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def ignore_rules() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = posixpath.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((keep, _glob_regex(pattern)))
    return rules


def in_context(path: str, rules=None) -> bool:
    """Whether Docker sends path (relative to the repository) to the build: the last pattern that
    matches it or one of its parent folders decides."""
    parts = posixpath.normpath(path).split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    sent = True
    for keep, rx in rules if rules is not None else ignore_rules():
        if any(rx.fullmatch(p) for p in prefixes):
            sent = keep
    return sent


def files_under(folder: str, keep) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(ROOT / folder):
        rel = os.path.relpath(dirpath, ROOT)
        dirnames[:] = [d for d in dirnames if keep(posixpath.join(rel, d), d)]
        out |= {posixpath.join(rel, f) for f in filenames if keep(posixpath.join(rel, f), f)}
    return out


def git_files(path: str) -> list[str]:
    return subprocess.run(
        ["git", "ls-files", "--", path], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()


# -- the build context ------------------------------------------------------------------------------


def test_every_copied_source_is_in_the_build_context(stages):
    rules = ignore_rules()
    sources = [s for stage in stages for s in copied(stage).values()]
    assert "src" in sources and "requirements.lock" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert in_context(source, rules), f"COPY {source}: .dockerignore leaves it out of the build context"
        tracked = git_files(source)
        assert tracked, f"COPY {source}: nothing of it is in git"
        left_out = [f for f in tracked if not in_context(f, rules)]
        assert not left_out, f"COPY {source}: .dockerignore leaves out {left_out[:5]}"
    for stage in stages:
        assert not stage.all("ADD"), "ADD fetches and unpacks: COPY says what it does"


def test_the_build_context_leaves_out_secrets_and_what_builds_and_runs_leave():
    rules = ignore_rules()
    # what this checkout's installs, builds and runs left (git ignores them), and what any may leave
    ignored = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    made_up = [
        ".env",
        ".git/HEAD",
        ".venv/bin/python",
        ".cache/test-stack/stack.json",
        "runs/demo/run.json",
        "benchmarks/results/harness-x.json",
        "collectors/c/build/flowstat-agent",
        "dist/flowstat.whl",
        "build/lib/flowstat/cli.py",
        ".pytest_cache/v/cache/nodeids",
        "tests/test_wheel.py",
    ]
    made_up += [
        f"{folder}/{pattern.replace('*', 'flowstat')}/x"
        for pattern in WHEEL_IGNORE
        for folder in ("src", "src/flowstat", "src/flowstat/harness")
    ]
    sent = [p for p in ignored + made_up if in_context(p.rstrip("/"), rules)]
    assert not sent, f"sent to the build: {sent}"


# -- the stages ---------------------------------------------------------------------------------------


def test_base_images_are_pinned_to_full_versions(stages):
    names = {s.name for s in stages if s.name}
    bases = [s.base for s in stages if s.base not in names]
    assert bases
    for base in bases:
        m = re.fullmatch(r"(?P<repo>[\w./-]+):(?P<tag>[\w.-]+)(?:@sha256:[0-9a-f]{64})?", base)
        assert m, f"FROM {base}: no tag"
        assert (
            re.match(r"\d+\.\d+\.\d+(?:$|[-.])", m["tag"]) and "latest" not in m["tag"]
        ), f"FROM {base}: not pinned to a full version"
    # the image's Python is the one requirements.lock was made for: the oldest pyproject.toml allows
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    oldest = re.fullmatch(r">=\s*(\d+\.\d+)", project["requires-python"])[1]
    final = stages[-1].base
    assert final.startswith(f"python:{oldest}."), f"the image runs {final}, the lock is for Python {oldest}"


def test_the_image_runs_as_an_unprivileged_user(stages):
    final = stages[-1]
    user = final.last("USER")
    assert user is not None, "no USER: the image would run as root"
    name = user.args.split(":")[0]
    assert name not in ("root", "0"), f"USER {user.args}"
    # a user of the image's own (a home, a name for the files it owns)
    made = [w for w in final.commands() if w[:1] == ["useradd"]]
    assert len(made) == 1, "the user is made once, by useradd"
    uid = made[0][made[0].index("--uid") + 1]
    assert name in (made[0][-1], uid), f"USER {user.args} is not the user made ({made[0][-1]}, uid {uid})"
    assert int(uid) >= 1000


def test_the_entrypoint_is_the_flowstat_cli(stages):
    from flowstat.cli import build_parser

    final = stages[-1]
    assert exec_form(final.last("ENTRYPOINT")) == ["flowstat"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("flowstat") == "flowstat.cli:main"
    with pytest.raises(SystemExit) as done:  # the default command is one the CLI takes
        build_parser().parse_args(exec_form(final.last("CMD")))
    assert done.value.code == 0


def _pip(stage: Stage, verb: str) -> list[str]:
    """The arguments after `pip VERB` of the stage's one such command."""
    found = [
        w[w.index(verb) + 1 :]
        for w in stage.commands()
        if "pip" in w and verb in w and w.index(verb) == w.index("pip") + 1
    ]
    assert len(found) == 1, f"{len(found)} `pip {verb}` commands"
    return found[0]


def _options(args: list[str], takes_value: set[str]) -> tuple[dict[str, str | None], list[str]]:
    options, positional, words = {}, [], list(args)
    while words:
        word = words.pop(0)
        if word in takes_value:
            options[word] = words.pop(0)
        elif word.startswith("-"):
            options[word] = None
        else:
            positional.append(word)
    return options, positional


def test_the_wheel_is_built_as_test_wheel_builds_it(stages):
    stage = stage_running(stages, r"pip wheel")
    options, positional = _options(_pip(stage, "wheel"), {"-w", "--wheel-dir"})
    dist = options.pop("-w", None) or options.pop("--wheel-dir", None)
    assert dist, "pip wheel without -w"
    assert set(options) - PIP_NEUTRAL == set(WHEEL_OPTIONS), f"pip wheel options {sorted(options)}"
    (source,) = positional
    assert source.startswith("/"), f"pip wheel {source}: a relative path may be taken for a package name"
    # from WHEEL_SOURCES alone, copied there, and nothing else done in the stage
    assert copied(stage) == {posixpath.join(source, name): name for name in WHEEL_SOURCES}
    assert len(stage.all("RUN")) == 1
    for env in stage.all("ENV"):
        names = {w.split("=")[0] for w in shlex.split(env.args)}
        assert names <= PIP_NEUTRAL_ENV, f"ENV {env.args}: may change the build"
    # the same files: what .dockerignore sends of each source is what test_wheel.py copies
    rules = ignore_rules()
    for name in WHEEL_SOURCES:
        if not (ROOT / name).is_dir():
            assert in_context(name, rules)
            continue
        sent = files_under(name, lambda path, _: in_context(path, rules))
        copied_by_test = files_under(name, lambda _, base: not any(fnmatch.fnmatch(base, p) for p in WHEEL_IGNORE))
        assert sent == copied_by_test, (
            f"sent, not in test_wheel's copy: {sorted(sent - copied_by_test)[:5]}; "
            f"the other way: {sorted(copied_by_test - sent)[:5]}"
        )
    # and the image installs that wheel, with the lock, as test_wheel.py does
    final = stages[-1]
    wheels = {
        target: src
        for target, src in copied(final, from_stage=stage.name).items()
        if posixpath.normpath(src) == posixpath.normpath(dist)
    }
    assert wheels, f"the image does not take {dist} from the {stage.name} stage"
    options, positional = _options(_pip(final, "install"), {"-c", "--constraint"})
    lock = options.pop("-c", None) or options.pop("--constraint", None)
    assert lock and to_context(final, lock) == "requirements.lock", f"pip install -c {lock}: not requirements.lock"
    assert set(options) <= PIP_NEUTRAL | PIP_INSTALL_EXTRA, f"pip install options {sorted(options)}"
    (wanted,) = positional
    # the wheel with every extra (the harness, report and stack: the image runs them all)
    found = re.fullmatch(r"\$\(ls (\S+)\)\[all\]", wanted)
    assert found, f"pip install {wanted}: not the wheel with its [all] extra"
    wheel = found[1]
    assert posixpath.dirname(wheel) in wheels and fnmatch.fnmatch(posixpath.basename(wheel), "flowstat-*.whl")


def _makefile_vars() -> dict[str, str]:
    found = re.findall(r"^(\w+)\s*[:?]?=\s*(.*)$", C_MAKEFILE.read_text(), flags=re.M)
    return {name: value.strip() for name, value in found}


def _dev_package(pc_name: str) -> tuple[str, str]:
    """The Debian -dev package holding a pkg-config module, and the library package it depends
    on at its own version (the one whose shared library a program linked with it loads)."""
    if not shutil.which("dpkg"):
        pytest.skip("needs Debian's dpkg (make test installs the C agent's packages with apt)")
    out = subprocess.run(["dpkg", "-S", f"*/pkgconfig/{pc_name}.pc"], capture_output=True, text=True)
    assert out.returncode == 0, f"{pc_name}.pc: no installed package has it ({out.stderr.strip()}); run make install"
    dev = out.stdout.split(":")[0]
    depends = subprocess.run(
        ["dpkg-query", "-W", "-f=${Depends}", dev], capture_output=True, text=True, check=True
    ).stdout
    library = [d.split()[0] for d in depends.split(",") if "(= " in d]
    assert len(library) == 1, f"{dev}: which library? {depends}"
    return dev, library[0].split(":")[0]


def test_the_c_agent_is_built_with_every_package_its_makefile_needs(stages):
    make = r"make -C collectors/c( all)?$"
    stage = stage_running(stages, make)
    final = stages[-1]
    assert stage.base == final.base, "the C agent is built on the Debian it runs on (same libraries)"
    build_packages, image_packages = apt_installed(stage), apt_installed(final)
    variables = _makefile_vars()
    modules = variables["PKGS"].split()
    text = C_MAKEFILE.read_text()
    assert modules and "pkg-config --cflags $(PKGS)" in text and "pkg-config --libs $(PKGS)" in text
    for module in modules:
        dev, library = _dev_package(module)
        assert dev in build_packages, f"{module}: the build stage does not install {dev}"
        assert library in image_packages, f"{module}: the image does not install {library} (of {dev})"
    compiler = COMPILERS[variables.get("CC", "cc")]
    assert {compiler, "libc6-dev", "make", "pkg-config"} <= build_packages, build_packages
    assert variables["PYTHON"] == "python3" and stage.base.startswith("python:")  # gen_schema_header.py
    # nothing to build with in the image
    assert not {p for p in image_packages if p.endswith("-dev") or p in {"gcc", "clang", "make", "pkg-config"}}
    # the Makefile's inputs outside collectors/c (the schemas) are where it looks for them
    run = next(r for r in stage.all("RUN") if re.search(make, r.args))
    c_dir = posixpath.join(run.workdir, "collectors/c")
    assert to_context(stage, c_dir) == "collectors/c"
    for name in ("SCHEMA", "AGENT_SCHEMA"):
        in_image = posixpath.normpath(posixpath.join(c_dir, variables[name]))
        assert to_context(stage, in_image) == posixpath.normpath(posixpath.join("collectors/c", variables[name]))


def test_the_c_agent_is_where_flowstat_run_finds_it(stages):
    from flowstat.harness.agents import C_AGENT

    stage = stage_running(stages, r"make -C collectors/c")
    c_dir = posixpath.join(next(r for r in stage.all("RUN") if "make -C" in r.args).workdir, "collectors/c")
    built = posixpath.join(c_dir, re.search(r"^all: (\S+)", C_MAKEFILE.read_text(), flags=re.M)[1])
    final = stages[-1]
    assert copied(final, from_stage=stage.name).get(f"/usr/local/bin/{C_AGENT}") == built
    # beside the Python running flowstat (the official image's, /usr/local/bin): found first
    assert final.base.startswith("python:") and not any("venv" in w for words in final.commands() for w in words)


def test_the_user_owns_its_working_folder_and_runs(stages):
    final = stages[-1]
    workdir = final.last("WORKDIR").args
    user = final.last("USER").args.split(":")[0]
    made = next(w for w in final.commands() if w[:1] == ["useradd"])
    names = {made[-1], made[made.index("--uid") + 1]}
    assert user in names
    owned = set()
    for words in final.commands():
        if words[:1] == ["install"] and "-d" in words and "-o" in words:
            options, folders = _options(words[1:], {"-o", "-g", "-m"})
            if options["-o"] in names:
                owned |= set(folders)
        if words[:1] == ["chown"] and words[-2].split(":")[0] in names:
            owned.add(words[-1])
    # `flowstat run` writes runs/ in its working folder (--runs-dir's default)
    assert {workdir, posixpath.join(workdir, "runs")} <= owned, owned
    env = {k: v for e in final.all("ENV") for k, _, v in (w.partition("=") for w in shlex.split(e.args))}
    assert env.get("HOME") in owned | {None}
    # and every folder compose mounts a named volume on in a service of this image (a new volume takes
    # the folder's owner; one the image lacks is made root's: the alert inbox could not write its log)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounted = {
        v.split(":")[1]
        for svc in compose["services"].values()
        if str(svc.get("image", "")).startswith("flowstat:")
        for v in svc.get("volumes", [])
        if not v.startswith((".", "/"))
    }
    assert mounted and mounted <= owned, mounted - owned


# -- the compose harness profile --------------------------------------------------------------------


def strings(value):
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def test_the_harness_profile_runs_a_topology_flowstat_takes(stages, tmp_path):
    from flowstat import __version__
    from flowstat.agent.sinks import open_sink
    from flowstat.cli import build_parser, main
    from flowstat.harness.topology import load

    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    harness = services["harness"]
    assert harness["profiles"] == ["harness"]
    assert harness["restart"] == "unless-stopped" and harness.get("mem_limit")
    for text in strings(harness):  # the file's convention: every variable required, and said where to set it
        for name, rest in re.findall(r"\$\{(\w+)([^}]*)\}", text):
            assert rest == f":?set {name} in .env (see .env.example)", text
    build = harness["build"] if isinstance(harness["build"], dict) else {"context": harness["build"]}
    assert build["context"] == "."
    variable = "${FLOWSTAT_VERSION:?set FLOWSTAT_VERSION in .env (see .env.example)}"
    assert harness["image"] == f"flowstat:{variable}"
    assert build.get("args", {}).get("FLOWSTAT_VERSION") == variable  # the build checks it is the package's
    env = dict(
        line.split("=", 1)
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert env.get("FLOWSTAT_VERSION") == __version__, "FLOWSTAT_VERSION in .env.example"

    # the command is one flowstat takes, its topology one the image has and flowstat validates
    args = build_parser().parse_args(harness["command"])
    assert args.command == "run"
    topology = to_context(stages[-1], args.topology)
    assert topology, f"{args.topology} is not a file the image copies from the repository"
    assert main(["validate", str(ROOT / topology)]) == 0
    assert not load(ROOT / topology).cpus, "a container may not have the CPUs a topology pins to"

    # the runs on the named volume, where `flowstat run` writes them
    runs = posixpath.join(stages[-1].last("WORKDIR").args, args.runs_dir)
    volumes = [v.split(":") for v in harness.get("volumes", [])]
    assert [v[0] for v in volumes if v[1] == runs] == ["harness-runs"] and "harness-runs" in compose["volumes"]
    assert all(v[-1] == "ro" for v in volumes if v[0].startswith("."))
    # healthy while a run is sampled: its healthcheck, run on a runs folder here
    kind, check = harness["healthcheck"]["test"]
    assert kind == "CMD-SHELL" and runs in check
    healthy = lambda: subprocess.run(["sh", "-c", check.replace(runs, str(tmp_path))]).returncode == 0  # noqa: E731
    assert not healthy()  # no run yet
    samples = tmp_path / "live-20261122T111056Z" / "samples.ndjson"
    samples.parent.mkdir()
    samples.write_text("{}\n")
    assert healthy()
    os.utime(samples, (samples.stat().st_mtime - 120,) * 2)  # a run that stopped being sampled
    assert not healthy()

    # each sink: a service the harness waits for, on the port it listens on; both agents take it
    sinks = {re.match(r"(\w+)://([\w.-]+):(\d+)", url).groups(): url for url in args.sink}
    assert {(scheme, host) for scheme, host, _ in sinks} == {("http", "telegraf"), ("tcp", "logstash")}
    listens = {
        "telegraf": services["telegraf"]["environment"]["FLOWSTAT_TELEGRAF_HTTP"].rsplit(":", 1)[1],
        "logstash": re.search(
            r"tcp\s*\{\s*port\s*=>\s*(\d+)", (ROOT / "pipelines/logstash/pipeline/flowstat.conf").read_text()
        )[1],
    }
    for (_scheme, host, port), url in sinks.items():
        assert port == listens[host], url
        assert harness["depends_on"][host] == {"condition": "service_healthy"} and "healthcheck" in services[host]
        open_sink(url).close()
    assert sinks[("tcp", "logstash", listens["logstash"])].endswith("?format=json")
    c_agent = ROOT / "collectors" / "c" / "build" / "flowstat-agent"
    if c_agent.exists():  # make test builds it; a URL it refuses exits 2 at once
        out = subprocess.run(
            [
                str(c_agent),
                "--pid",
                str(os.getpid()),
                "--count",
                "1",
                "--self-interval",
                "0",
                "--drain-timeout",
                "0",
                "--quiet",
                *[a for url in args.sink for a in ("--sink", url)],
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 2, out.stderr
