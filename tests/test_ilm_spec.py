"""flowstat's lifecycle configuration (the ILM policy, the lifecycle component template and the daily
index names it dates indices by) checked by Elasticsearch's own ILM code.

The Elasticsearch the tests run (Maven's integ-test zip) has no ILM module, so the policy cannot be
PUT there; but the classes that parse and check it on a server with ILM are in the zip's
modules/x-pack-core jar. tests/ilm-check/IlmCheck.java calls them (its header says how, and what it
answers): it is compiled once per source and Elasticsearch version (.cache/ilm-check/) and run in
one JVM per test session on what ElasticsearchWriter.install() PUTs on a server with ILM, on broken copies
(so that the check is seen to say no), on the index names flowstat writes and on names it must not.

A missing JDK, zip or distribution fails the tests with what to install: nothing here is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from datetime import date
from pathlib import Path

import pytest

from support.common import ROOT

SOURCE = ROOT / "tests" / "ilm-check" / "IlmCheck.java"
TEMPLATES = ROOT / "index-templates" / "elasticsearch"
CACHE = ROOT / ".cache" / "ilm-check"
JDK = Path("/usr/lib/jvm/java-17-openjdk-amd64")  # javac --release 17: the release Elasticsearch 8 runs on
DAY_MS = 86_400_000

# Document times (what a sample's or self-sample's "time" holds) and the UTC day each belongs to:
# ends and starts of days, years and leap days, the epoch and before it, and the first and last
# day a time can name (years below 1000 written with four digits, as RFC 3339 has them).
TIMES = {
    "2026-11-26T12:34:56.789Z": date(2026, 11, 26),
    "2025-12-31T23:59:59.999Z": date(2025, 12, 31),
    "2026-01-01T00:00:00.000Z": date(2026, 1, 1),
    "2024-02-28T23:59:59.999Z": date(2024, 2, 28),
    "2024-02-29T00:00:00.000Z": date(2024, 2, 29),
    "2024-02-29T23:59:59.999Z": date(2024, 2, 29),
    "2024-03-01T00:00:00.000Z": date(2024, 3, 1),
    "2000-02-29T12:00:00.000Z": date(2000, 2, 29),
    "2100-03-01T00:00:00.000Z": date(2100, 3, 1),  # 2100 is no leap year: after Feb 28
    "1970-01-01T00:00:00.000Z": date(1970, 1, 1),
    "1969-12-31T23:59:59.999Z": date(1969, 12, 31),
    "0999-12-31T23:59:59.999Z": date(999, 12, 31),
    "0001-01-01T00:00:00.000Z": date(1, 1, 1),
    "9999-12-31T23:59:59.999Z": date(9999, 12, 31),
}

# Names flowstat must never write into an index that carries the lifecycle: not PREFIX-YYYY.MM.DD.
NOT_DAILY = [
    "flowstat-samples",
    "flowstat-agents",
    "flowstat-samples-2026-11-26",
    "flowstat-agents-20261126",
    "flowstat-samples-26.11.2026",
    "flowstat-samples-2026.11.26-reindexed",
    "flowstat-samples-2026.13.01",
    "flowstat-samples-2026.02.30",
]

# Broken copies of the policy, each with what Elasticsearch must say of it.
BROKEN_POLICIES = {
    "unknown-action": ({"delete": {"min_age": "90d", "actions": {"delete": {}, "shred": {}}}}, "[shred]"),
    "delete-in-hot": (
        {"hot": {"min_age": "0ms", "actions": {"delete": {}}}},
        "invalid action [delete] defined in phase [hot]",
    ),
    "unknown-phase": ({"archive": {"min_age": "90d", "actions": {"delete": {}}}}, "does not support phase [archive]"),
    "min-age-in-words": ({"delete": {"min_age": "90 days", "actions": {"delete": {}}}}, "90 days"),
    "timings-decreasing": (
        {
            "warm": {"min_age": "100d", "actions": {"readonly": {}}},
            "delete": {"min_age": "90d", "actions": {"delete": {}}},
        },
        "run the delete phase (min_age: 90d) before the warm phase",
    ),
}
# Broken copies of the lifecycle component's settings, each with what Elasticsearch must say.
BROKEN_SETTINGS = {
    "misspelt-key": ({"index.lifecycle.nmae": "flowstat"}, "unknown setting [index.lifecycle.nmae]"),
    "not-a-boolean": (
        {"index.lifecycle.name": "flowstat", "index.lifecycle.parse_origination_date": "yes"},
        "Failed to parse value [yes]",
    ),
}


def _fail(what: str) -> None:
    pytest.fail(f"test_ilm_spec needs {what}", pytrace=False)


def java_tools() -> tuple[Path, Path]:
    javac, java = JDK / "bin" / "javac", JDK / "bin" / "java"
    if not (javac.exists() and java.exists()):
        _fail(
            f"a JDK 17 at {JDK} (its javac compiles tests/ilm-check/IlmCheck.java): "
            "apt-get install openjdk-17-jdk-headless"
        )
    return javac, java


def es_classpath() -> str:
    """lib/ and modules/x-pack-core/ of the Elasticsearch the tests run: the distribution make test
    unpacks into .cache/test-stack, or else the same jars taken once from its zip in ~/.m2."""
    from flowstat.stack.elasticsearch import ES_VERSION, m2_zip

    dist = ROOT / ".cache" / "test-stack" / "elasticsearch" / f"elasticsearch-{ES_VERSION}"
    if not (dist / "modules" / "x-pack-core" / f"x-pack-core-{ES_VERSION}.jar").exists():
        dist = CACHE / f"elasticsearch-{ES_VERSION}"
        if not (dist / "modules" / "x-pack-core" / f"x-pack-core-{ES_VERSION}.jar").exists():
            archive = m2_zip(ES_VERSION)
            if not archive.exists():
                _fail(
                    f"Elasticsearch {ES_VERSION}'s integ-test zip ({archive}): `flowstat stack install "
                    f"--cache .cache/test-stack` fetches it (make test does)"
                )
            _extract_jars(archive, dist)
    return f"{dist / 'lib' / '*'}{os.pathsep}{dist / 'modules' / 'x-pack-core' / '*'}"


def _extract_jars(archive: Path, dest: Path) -> None:
    """The zip's lib/*.jar and modules/x-pack-core/*.jar, put in place in one rename."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=".jars-"))
    try:
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                parts = name.split("/")
                if name.endswith(".jar") and (
                    parts[1:2] == ["lib"]
                    and len(parts) == 3
                    or parts[1:3] == ["modules", "x-pack-core"]
                    and len(parts) == 4
                ):
                    target = tmp / "/".join(parts[1:])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(name) as src, open(target, "wb") as out:
                        shutil.copyfileobj(src, out)
        try:
            tmp.rename(dest)
        except OSError:
            if not dest.exists():  # else the other worker put it there first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compiled(javac: Path, classpath: str) -> Path:
    """IlmCheck.class, compiled once per source and Elasticsearch version."""
    from flowstat.stack.elasticsearch import ES_VERSION

    key = hashlib.sha256(SOURCE.read_bytes() + f"\0{ES_VERSION}\0{javac}".encode()).hexdigest()[:16]
    classes = CACHE / f"classes-{key}"
    if (classes / "IlmCheck.class").exists():
        return classes
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=".classes-"))
    try:
        out = subprocess.run(
            [str(javac), "--release", "17", "-Xlint:-options", "-cp", classpath, "-d", str(tmp), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, f"javac {SOURCE.name}:\n{out.stdout}{out.stderr}"
        try:
            tmp.rename(classes)
        except OSError:
            if not (classes / "IlmCheck.class").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in CACHE.glob("classes-*"):  # an older source's
        if old != classes:
            shutil.rmtree(old, ignore_errors=True)
    return classes


class _Answer:
    def __init__(self, status: int) -> None:
        self.status_code, self.text = status, ""

    def json(self) -> dict:
        return {}


def installed_on_an_ilm_server() -> dict[str, dict]:
    """What Elasticsearch.install() PUTs on a server that has ILM and no index yet: path -> body."""
    from flowstat.stores.elasticsearch import ElasticsearchWriter

    writer = ElasticsearchWriter("http://127.0.0.1:9")  # never reached: every request is answered here
    puts: dict[str, dict] = {}

    def http(method: str, url: str, body: bytes | None = None, *args, **kw) -> _Answer:
        path = url.removeprefix(writer.url + "/")
        if method == "PUT":
            puts[path] = json.loads(body)
            return _Answer(404 if path.endswith("/_mapping") else 200)  # no index to give new fields
        return _Answer(200 if (method, path) == ("GET", "_ilm/status") else 404)  # ILM; no older index

    writer._http = http
    try:
        writer.install()
    finally:
        writer.close()
    return {path: body for path, body in puts.items() if not path.endswith("/_mapping")}


def _file_of(body: dict) -> Path:
    """The generated file (index-templates/elasticsearch/) that holds exactly this body."""
    same = [p for p in sorted(TEMPLATES.glob("*.json")) if json.loads(p.read_text()) == body]
    assert len(same) == 1, f"{len(same)} files of {TEMPLATES} hold {body}"
    return same[0]


def written_names() -> dict[str, set[str]]:
    """The index names flowstat's writers put in their _bulk requests for a document of each of
    TIMES: the samples' (one at a time and the batch encoder's), the self-samples', the legacy
    move's (daily_index), the rollup's (of the window holding it) and flowstat verdict's (a verdict,
    an edge rate) -> the names."""
    from flowstat.schema import sample as sample_schema
    from flowstat.stores.elasticsearch import AGENTS_INDEX, SAMPLES_INDEX, ElasticsearchWriter, daily_index
    from flowstat.stores.elasticsearch_rollup import Rollup, window_of

    writer = ElasticsearchWriter("http://127.0.0.1:9")
    rollup = Rollup(writer)

    def index_of(body: bytes) -> str:
        return json.loads(body.splitlines()[0])["index"]["_index"]

    try:
        out = {}
        for iso in TIMES:
            ns = sample_schema.time_ns(iso)
            bodies = [
                writer.encode([{"time": iso, "run_id": "r", "agent": "a", "node_id": "n", "seq": 1}]),
                writer.encoder().encode([b"{}"], ["r/a/n/1"], [ns]),
                writer.encode_self_samples([{"time": iso, "host": "h", "agent": "a", "seq": 1}]),
                writer.encode_flow("verdict", [{"time": iso, "run_id": "r", "flow": "none"}]),
                writer.encode_flow("edge", [{"time": iso, "run_id": "r", "from": "a", "to": "b"}]),
            ]
            out[iso] = {index_of(b) for b in bodies} | {daily_index(SAMPLES_INDEX, ns), daily_index(AGENTS_INDEX, ns)}
            out[iso].add(rollup.index_of(window_of(ns // 1_000_000)))
        return out
    finally:
        writer.close()


@pytest.fixture(scope="module")
def ilm(tmp_path_factory) -> dict:
    """IlmCheck's answer (one JVM) on everything the tests below look at."""
    javac, java = java_tools()
    classpath = es_classpath()
    classes = compiled(javac, classpath)
    puts = installed_on_an_ilm_server()
    tmp = tmp_path_factory.mktemp("ilm")
    policy_path = next(p for p in puts if p.startswith("_ilm/policy/"))
    policies = [{"label": "flowstat", "name": policy_path.rsplit("/", 1)[1], "file": str(_file_of(puts[policy_path]))}]
    for label, (phases, _) in BROKEN_POLICIES.items():
        broken = tmp / f"policy-{label}.json"
        broken.write_text(json.dumps({"policy": {"phases": phases}}))
        policies.append({"label": label, "name": "flowstat", "file": str(broken)})
    components = {p.split("/", 1)[1]: str(_file_of(b)) for p, b in puts.items() if p.startswith("_component_template/")}
    for label, (settings, _) in BROKEN_SETTINGS.items():
        broken = tmp / f"component-{label}.json"
        broken.write_text(json.dumps({"template": {"settings": settings}}))
        components[f"broken-{label}"] = str(broken)
    request = {
        "policies": policies,
        "component_templates": components,
        "index_templates": {
            p.split("/", 1)[1]: str(_file_of(b)) for p, b in puts.items() if p.startswith("_index_template/")
        },
        "indices": sorted(set().union(*written_names().values())) + NOT_DAILY + ["flowstat-runs"],
    }
    (tmp / "request.json").write_text(json.dumps(request, indent=1))
    out = subprocess.run(
        [str(java), "-cp", f"{classes}{os.pathsep}{classpath}", "IlmCheck", str(tmp / "request.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"IlmCheck:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
    return {"answer": json.loads(out.stdout), "puts": puts, "request": request}


def test_what_install_puts_is_what_is_checked(ilm):
    """install() on a server with ILM PUTs the generated files (which templates() makes), and the
    check reads those files."""
    from flowstat.stores.elasticsearch import templates

    made = templates()
    for path, body in ilm["puts"].items():
        assert made[_file_of(body).name] == body, path
    assert {p.split("/")[0] for p in ilm["puts"]} == {"_ilm", "_component_template", "_index_template"}


def test_the_policy_is_what_elasticsearch_takes(ilm):
    from flowstat.stores.elasticsearch import RETENTION_DAYS

    got = ilm["answer"]["policies"]["flowstat"]
    assert got["ok"], got["error"]
    assert got["name"] == "flowstat"
    assert got["actions"] == {"delete": ["delete"]}  # delete-only: no rollover, which needs an alias
    assert got["min_age_ms"] == {"delete": RETENTION_DAYS * DAY_MS}
    assert got["policy"]["phases"]["delete"]["min_age"] == f"{RETENTION_DAYS}d"


@pytest.mark.parametrize("label", BROKEN_POLICIES)
def test_a_broken_policy_is_refused(ilm, label):
    """The same check says no to a policy Elasticsearch would refuse."""
    got = ilm["answer"]["policies"][label]
    assert not got["ok"], f"{label}: taken as {got.get('policy')}"
    assert BROKEN_POLICIES[label][1] in got["error"], got["error"]


def test_the_lifecycle_settings_are_ilms_and_well_typed(ilm):
    """Each key of the lifecycle component is an index setting ILM defines, its value read by that
    setting as the type it takes; the policy it names is the one install() PUTs."""
    policy_name = next(p for p in ilm["puts"] if p.startswith("_ilm/policy/")).rsplit("/", 1)[1]
    got = ilm["answer"]["component_templates"]["flowstat-lifecycle"]
    assert got["ok"], got["error"]
    assert got["settings"] == {
        "index.lifecycle.name": {
            "value": policy_name,
            "type": "String",
            "ilm_setting": "LifecycleSettings.LIFECYCLE_NAME_SETTING",
        },
        "index.lifecycle.parse_origination_date": {
            "value": True,
            "type": "Boolean",
            "ilm_setting": "IndexSettings.LIFECYCLE_PARSE_ORIGINATION_DATE_SETTING",
        },
    }
    for name, got in ilm["answer"]["component_templates"].items():  # the others are valid index settings too
        if not name.startswith("broken-"):
            assert got["ok"], f"{name}: {got['error']}"


@pytest.mark.parametrize("label", BROKEN_SETTINGS)
def test_broken_lifecycle_settings_are_refused(ilm, label):
    got = ilm["answer"]["component_templates"][f"broken-{label}"]
    assert not got["ok"], f"{label}: taken as {got.get('settings')}"
    assert BROKEN_SETTINGS[label][1] in got["error"], got["error"]


def test_each_daily_index_is_dated_by_the_utc_midnight_of_its_day(ilm):
    """Every writer names a document's index PREFIX-YYYY.MM.DD by its UTC day, the same name for
    the same day; the name takes the lifecycle, is created (ILM parses it), and is dated the UTC
    midnight its day starts at: deleted RETENTION_DAYS after that."""
    from flowstat.stores.elasticsearch import AGENTS_INDEX, EDGES_INDEX, SAMPLES_INDEX, VERDICTS_INDEX
    from flowstat.stores.elasticsearch_rollup import ROLLUP_INDEX

    prefixes = (SAMPLES_INDEX, AGENTS_INDEX, ROLLUP_INDEX, VERDICTS_INDEX, EDGES_INDEX)
    days: dict[str, date] = {}
    for iso, names in written_names().items():
        day = TIMES[iso]
        stamp = f"{day.year:04d}.{day.month:02d}.{day.day:02d}"
        assert names == {f"{p}-{stamp}" for p in prefixes}, f"{iso}: written into {sorted(names)}"
        for name in names:
            assert days.setdefault(name, day) == day
    for name, day in days.items():
        got = ilm["answer"]["indices"][name]
        (prefix,) = [p for p in prefixes if name.startswith(f"{p}-")]
        assert got["templates"] == [prefix], f"{name}: matched by {got['templates']}"
        assert got["lifecycle_name"] == "flowstat" and got["parse_origination_date"], name
        assert got["created"] == {"ok": True}, f"{name}: {got['created']}"
        assert got["name_date"] == {"millis": (day - date(1970, 1, 1)).days * DAY_MS}, f"{name} ({day}): {got}"


@pytest.mark.parametrize("name", NOT_DAILY)
def test_a_name_that_is_not_a_day_cannot_take_the_lifecycle(ilm, name):
    """ILM parses the name for real: an index of the lifecycle templates whose name holds no
    YYYY.MM.DD day is not created (a writer's mistake is refused, not kept for ever)."""
    got = ilm["answer"]["indices"][name]
    assert got["templates"] and got["parse_origination_date"], got
    assert not got["created"]["ok"], f"{name}: created, dated {got['name_date']}"
    assert "index name [" in got["created"]["error"], got["created"]["error"]


def test_only_the_daily_indices_carry_the_lifecycle(ilm):
    """The index templates composed of the lifecycle component are the samples', the
    self-samples', the rollup's and flowstat verdict's verdicts and edge rates (PREFIX*, all of whose written
    names are days: above); the runs' index, one for all runs and kept, takes none."""
    from flowstat.stores.elasticsearch import AGENTS_INDEX, EDGES_INDEX, RUNS_INDEX, SAMPLES_INDEX, VERDICTS_INDEX
    from flowstat.stores.elasticsearch_rollup import ROLLUP_INDEX

    templates = {p.split("/", 1)[1]: b for p, b in ilm["puts"].items() if p.startswith("_index_template/")}
    with_lifecycle = {
        name: t["index_patterns"] for name, t in templates.items() if "flowstat-lifecycle" in t["composed_of"]
    }
    daily = (SAMPLES_INDEX, AGENTS_INDEX, ROLLUP_INDEX, VERDICTS_INDEX, EDGES_INDEX)
    assert with_lifecycle == {p: [f"{p}*"] for p in daily}
    runs = ilm["answer"]["indices"][RUNS_INDEX]
    assert runs["templates"] == [RUNS_INDEX] and runs["lifecycle_name"] == "" and not runs["parse_origination_date"]
    assert runs["created"] == {"ok": True}
