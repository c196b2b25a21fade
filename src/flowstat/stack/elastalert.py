"""ElastAlert2 watching the local Elasticsearch: flowstat's alert rules, an alert log a person can
tail, and an optional webhook. Pinned (elastalert-files/constraints.txt), in a virtualenv of its
own under the stack's cache: its dependencies (elasticsearch==7.10.1, urllib3 1.x...) would clash
with flowstat's.

The rules come from one function, packaged_rules(), plus any folders given with --alert-rules. At
each `up` they are copied into HOME/rules with the alerters added to each (the rules themselves stay
alerter-neutral): ElastAlert's command alerter appends one JSON line per alert to HOME/alerts.log,
and with a webhook its post2 alerter POSTs the match. An `up` that changes the rules or the
configuration restarts a running ElastAlert.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import requests
import yaml

from flowstat.proc.procfs import ProcessGone, start_time
from flowstat.timeutil import iso_utc_ms
from flowstat.views import elastalert as views_elastalert

from .base import (SERVICE_USER, Service, StackError, apt_install, give_to_service_user, load_state, make_folder,
                   run_as_prefix)
from .elasticsearch import Elasticsearch

if TYPE_CHECKING:
    from . import Stack

VERSION = "2.19.0"  # elastalert2's pin in elastalert-files/constraints.txt (a test checks they agree)
REQUIREMENTS = ("elastalert2", "pytz")  # pytz: ElastAlert imports it without declaring it
IMPORTS = "pytz, elastalert.elastalert, elastalert.create_index, elastalert.test_rule"  # what the stack runs
FILES = "elastalert-files"  # package data: the pins, and the two scripts the venv's Python runs
WRITEBACK_INDEX = "flowstat-elastalert"  # ElastAlert keeps its state in it and in its _status, _error... siblings
RUN_EVERY_S = 10  # samples come every second: an alert follows its sample within about run_every
BUFFER_TIME_S = 60  # each query looks a minute back, so samples an agent delivers late are still seen
RULE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.ya?ml")
LOGGING = {  # ElastAlert's log (server.log) with times, without the Elasticsearch client's deprecation chatter
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"timed": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"log": {"class": "logging.StreamHandler", "formatter": "timed", "stream": "ext://sys.stderr"}},
    "root": {"level": "INFO", "handlers": ["log"]},
    "loggers": {"elasticsearch": {"level": "ERROR"}, "py.warnings": {"level": "ERROR"},
                "apscheduler": {"level": "WARNING"}},
}


def packaged_rules() -> dict[str, str]:
    """flowstat's own alert rules: file name -> YAML text, alerter-neutral; the same text as
    dashboards/elastalert/ (both come from flowstat.views)."""
    return views_elastalert.rules()


def _packaged(name: str) -> str:
    return files(__package__).joinpath(FILES, name).read_text(encoding="utf-8")


def _run(cmd: list[str], what: str, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StackError(f"elastalert: {what} failed: {exc}") from exc
    if out.returncode != 0:
        raise StackError(f"elastalert: {what} failed (exit code {out.returncode}): "
                         f"{(out.stdout + out.stderr).strip()[-1500:]}")
    return out


def _base_python() -> str:
    """A Python >= 3.11 with venv that the service user can run: flowstat's own, unless it lives
    where that user cannot go (a pyenv in root's home), else the system's (python3-venv, from apt)."""
    probe = "import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))"
    prefix = run_as_prefix()

    def usable(python: str) -> bool:
        return Path(python).exists() and subprocess.run(prefix + [python, "-c", probe], capture_output=True,
                                                        cwd="/").returncode == 0

    candidates = dict.fromkeys([getattr(sys, "_base_executable", sys.executable), "/usr/bin/python3"])
    for python in candidates:
        if usable(python):
            return python
    apt_install("python3-venv")
    if usable("/usr/bin/python3"):
        return "/usr/bin/python3"
    raise StackError(f"elastalert: no Python >= 3.11 with venv that user {SERVICE_USER} can run "
                     f"(tried {', '.join(candidates)}; Debian: python3-venv)")


def install_venv(venv: Path, pins: str | None = None, requirements: tuple[str, ...] = REQUIREMENTS,
                 imports: str = IMPORTS) -> None:
    """The pinned ElastAlert2 (PINS: constraints.txt) in VENV, installed once, and again only when the
    pins change: the copy of the pins in the venv says what it holds, and is written last, so a
    broken install is redone. IMPORTS is the check that it works."""
    pins = _packaged("constraints.txt") if pins is None else pins
    stamp = venv / "flowstat-constraints.txt"
    if stamp.exists() and stamp.read_text() == pins:
        return
    shutil.rmtree(venv, ignore_errors=True)
    _run([_base_python(), "-m", "venv", str(venv)], f"creating the virtualenv {venv}")
    pending = venv / "constraints.pending.txt"
    pending.write_text(pins)
    python = str(venv / "bin" / "python")
    # --no-compile: half the time and space (one of its dependencies alone is 400 MB of .py files);
    # what ElastAlert imports is compiled by the check below, as the service user could not.
    _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input", "--no-compile",
          "-c", str(pending), *requirements], f"pip install of {' '.join(requirements)} into {venv}")
    _run([python, "-c", f"import {imports}"], f"importing {imports} from {venv}")
    pending.rename(stamp)


def _write_file(path: Path, text: str, mode: int = 0o644, service_owned: bool = False) -> bool:
    """Replace PATH by TEXT unless it holds it already (then False), never leaving it half written
    (ElastAlert may be reading its rules); a file the service user reads is its own before it appears."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    tmp = path.with_name(f".{path.name}.tmp")  # not *.yaml: ElastAlert does not load it
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(mode)
    if service_owned:
        give_to_service_user(tmp)
    os.replace(tmp, path)
    return True


@dataclass(frozen=True)
class Result:
    """What elastalert-test-rule found between start and end: the rule's name, its matches (the alerts
    it would have sent), its hits (the documents its query returned), ElastAlert's errors, its output."""

    rule: str
    matches: int
    hits: int
    errors: tuple[str, ...]
    output: str

    @property
    def fired(self) -> bool:
        return self.matches > 0


class ElastAlert(Service):
    """ElastAlert2. Options (flowstat stack up --alert-webhook, --alert-rules): ``webhook``, a URL to
    POST each alert to; ``rules_dirs``, folders of more rules (*.yaml) to run beside flowstat's."""

    health_timeout_s = 90.0  # starting (about 3 s), then a rule's first run: 0-15 s after (ElastAlert's jitter)
    default_port = 0
    port_option = None  # it listens on no port: it queries Elasticsearch and writes back into it

    @property
    def es_url(self) -> str:
        return self.extra["es_url"]

    @property
    def url(self) -> str:
        """Where its state is: its writeback index."""
        return f"{self.es_url}/{WRITEBACK_INDEX}"

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    @property
    def rules_dir(self) -> Path:
        return self.home / "rules"

    @property
    def alerts_log(self) -> Path:
        return self.home / "alerts.log"

    @property
    def config_path(self) -> Path:
        return self.home / "config.yaml"

    def ports(self) -> list[int]:
        return []

    def link(self, stack, ports) -> None:
        self.extra["es_url"] = f"http://127.0.0.1:{ports['elasticsearch']}"

    def owned_paths(self) -> list[Path]:
        return [self.rules_dir, self.alerts_log]  # the venv stays root's: the server cannot change its own code

    def install(self) -> None:
        make_folder(self.home)
        install_venv(self.venv)
        for script in ("launch.py", "alert_log.py"):  # beside the venv: the service user may not reach the package
            _write_file(self.home / script, _packaged(script))

    def command(self):
        return [*self._program("elastalert"), "--config", str(self.config_path), "--verbose"], {}

    def _program(self, name: str) -> list[str]:
        return [str(self.venv / "bin" / "python"), str(self.home / "launch.py"), name]

    # -- rules ----------------------------------------------------------------------------------
    def _sources(self) -> dict[str, tuple[str, str]]:
        """File name -> (where it comes from, YAML text): flowstat's rules, then the folders given."""
        found: dict[str, tuple[str, str]] = {}

        def add(name: str, origin: str, text: str) -> None:
            if not RULE_FILE.fullmatch(name):
                raise StackError(f"elastalert: rule {origin}: a rule file is named NAME.yaml (letters, digits, _.-)")
            if name in found:
                raise StackError(f"elastalert: rules {found[name][0]} and {origin} have the same file name")
            found[name] = (origin, text)

        for name, text in packaged_rules().items():
            add(name, f"{name} (flowstat's)", text)
        for folder in map(Path, self.options.get("rules_dirs") or ()):
            if not folder.is_dir():
                raise StackError(f"elastalert: --alert-rules {folder}: no such folder")
            for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
                add(path.name, str(path), path.read_text(encoding="utf-8"))
        return found

    def _alerters(self, name: str) -> dict:
        """What flowstat adds to a rule named NAME: its alert log, and the webhook if there is one."""
        command = [str(self.venv / "bin" / "python"), str(self.home / "alert_log.py"), str(self.alerts_log), name]
        # ElastAlert formats each argument of a command with the match (% and {} fields)
        if any(set(arg) & set("%{}") for arg in command):
            raise StackError(f"elastalert: {' '.join(command)}: the rule name and the cache folder must not "
                             f"hold %, {{ or }} (ElastAlert fills in match fields there)")
        added = {"alert": ["command"], "command": command, "pipe_match_json": True, "fail_on_non_zero_exit": True}
        webhook = self.options.get("webhook")
        if webhook:
            added["alert"].append("post2")
            added.update(http_post2_url=webhook, http_post2_payload={"rule": name}, http_post2_all_values=True,
                         http_post2_timeout=10)
        return added

    def prepare_rule(self, text: str, origin: str) -> tuple[str, str]:
        """(rule name, the rule's YAML with flowstat's alerters added); a rule a person must fix is
        named with what is wrong."""
        try:
            rule = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise StackError(f"elastalert: rule {origin}: not valid YAML: {exc}") from exc
        if not isinstance(rule, dict) or not isinstance(rule.get("name"), str) or not rule["name"].strip():
            raise StackError(f"elastalert: rule {origin}: an ElastAlert rule is a mapping with a `name` "
                             f"(and type, index...)")
        added = self._alerters(rule["name"])
        taken = sorted((set(rule) & set(added)) - {"alert"})
        if taken:
            raise StackError(f"elastalert: rule {origin}: sets {', '.join(taken)}, which flowstat's alerters use")
        own = rule.get("alert") or []
        rule.update(added, alert=([own] if isinstance(own, str) else list(own)) + added["alert"])
        return rule["name"], (f"# {origin}, with the alerters of `flowstat stack up` added\n"
                              + yaml.safe_dump(rule, sort_keys=False, allow_unicode=True))

    def rules(self) -> dict[str, str]:
        """The rules to run, as copied at `up`: file name -> YAML with the alerters added."""
        prepared: dict[str, str] = {}
        origins: dict[str, str] = {}
        for file_name, (origin, text) in self._sources().items():
            name, prepared[file_name] = self.prepare_rule(text, origin)
            if name in origins:
                raise StackError(f"elastalert: rules {origins[name]} and {origin} are both named {name!r}")
            origins[name] = origin
        return prepared

    def _copy_rules(self) -> tuple[dict[str, str], bool]:
        """Copy the rules into the rules folder: (the rules, whether the folder changed)."""
        webhook = self.options.get("webhook")
        if webhook and (urlsplit(webhook).scheme not in ("http", "https") or not urlsplit(webhook).hostname):
            raise StackError(f"elastalert: webhook {webhook!r} is not an http:// or https:// URL")
        prepared = self.rules()
        make_folder(self.rules_dir)
        self.rules_dir.chmod(0o700)  # a webhook URL may hold a token
        changed = [_write_file(self.rules_dir / name, text, 0o600, service_owned=True)
                   for name, text in prepared.items()]
        for old in self.rules_dir.iterdir():
            if old.name not in prepared:
                old.unlink()
                changed.append(True)
        self.alerts_log.touch()
        give_to_service_user(self.rules_dir, self.alerts_log)
        return prepared, any(changed)

    # -- start ----------------------------------------------------------------------------------
    def config_text(self, rules_dir: Path, buffer_time_s: float = BUFFER_TIME_S) -> str:
        es = urlsplit(self.es_url)
        conf = {"es_host": es.hostname, "es_port": es.port, "writeback_index": WRITEBACK_INDEX,
                "rules_folder": str(rules_dir), "run_every": {"seconds": RUN_EVERY_S},
                "buffer_time": {"seconds": buffer_time_s},
                "old_query_limit": {"hours": 1},  # after a longer stop, start afresh rather than query the gap
                "alert_time_limit": {"hours": 1},  # how long an alert that could not be sent is retried
                "disable_rules_on_error": False,  # an Elasticsearch restart must not switch the rules off
                "logging": LOGGING}
        return ("# Written by `flowstat stack up` (flowstat.stack.elastalert) at each start: edits are lost.\n"
                + yaml.safe_dump(conf, sort_keys=False))

    def _es_down(self, exc: Exception) -> StackError:
        return StackError(f"elastalert: Elasticsearch at {self.es_url} does not answer ({type(exc).__name__}): "
                          f"ElastAlert can neither query the samples nor record its runs; start it (flowstat stack up)")

    def _es(self, method: str, path: str, **kw) -> requests.Response:
        try:
            return requests.request(method, self.es_url + path, timeout=kw.pop("timeout", 5.0), **kw)
        except requests.RequestException as exc:
            raise self._es_down(exc) from exc

    def _create_index(self) -> None:
        """ElastAlert's writeback indices, made once by its own program (as that program does, the
        first index says they exist)."""
        if self._es("HEAD", f"/{WRITEBACK_INDEX}").status_code == 200:
            return
        _run([*self._program("elastalert-create-index"), "--config", str(self.config_path)],
             f"elastalert-create-index (Elasticsearch at {self.es_url})", timeout=300)

    def up(self) -> str:
        prepared, changed = self._copy_rules()  # a rule to fix is named before any install or start
        if not prepared:
            self.down()
            return "no rules to run (none packaged, none given with --alert-rules): not started"
        self._es("GET", "/_cluster/health")
        self.install()
        changed |= _write_file(self.config_path, self.config_text(self.rules_dir))
        self._create_index()
        if changed:
            # It would re-read changed rules by itself, but only at its next check (run_every): after
            # `up`, what runs is what was asked for.
            self.down()
        started = super().up()
        webhook = self.options.get("webhook")
        return (f"{started}; {len(prepared)} rule(s), alerts to {self.alerts_log}"
                + (f" and {urlsplit(webhook).hostname}" if webhook else ""))

    # -- health and status ----------------------------------------------------------------------
    def _since_start(self, pid: int, kind: str, body: dict) -> dict:
        """Search ElastAlert's KIND index (status, error) for what it wrote since process PID started."""
        since = {"range": {"@timestamp": {"gte": iso_utc_ms(start_time(pid))}}}
        r = self._es("POST", f"/{WRITEBACK_INDEX}_{kind}/_search", json={"query": since, **body})
        if r.status_code == 404:
            return {}  # not created yet
        r.raise_for_status()
        return r.json()

    def rules_run(self, pid: int) -> set[str]:
        """The rules ElastAlert (process PID) has run since it started, as its writeback index says."""
        found = self._since_start(pid, "status", {"size": 0, "aggs": {"rules": {"terms": {"field": "rule_name",
                                                                                          "size": 1000}}}})
        return {b["key"] for b in found.get("aggregations", {}).get("rules", {}).get("buckets", [])}

    def last_error(self, pid: int) -> str | None:
        found = self._since_start(pid, "error", {"size": 1, "sort": [{"@timestamp": "desc"}]})
        hits = found.get("hits", {}).get("hits", [])
        if not hits:
            return None
        message = str(hits[0]["_source"].get("message", "")).strip().splitlines() or [""]
        return f"{hits[0]['_source'].get('@timestamp')}: {message[0][:300]}"

    def healthy(self) -> bool:
        """Running, and it has run a rule and recorded that in its writeback index since it started."""
        pid = self.pid()
        try:
            return pid is not None and bool(self.rules_run(pid))
        except (StackError, ProcessGone, requests.RequestException, ValueError):
            return False

    def alerts_so_far(self) -> int:
        try:
            with open(self.alerts_log, "rb") as f:
                return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except OSError:
            return 0

    def status(self) -> dict:
        pid = self.pid()
        copied = sorted(p.name for p in self.rules_dir.glob("*.y*ml")) if self.rules_dir.is_dir() else []
        ran, error, problem, es_down = set(), None, None, False
        try:
            if pid is not None:
                ran, error = self.rules_run(pid), self.last_error(pid)
            else:
                self._es("GET", "/_cluster/health")
        except StackError as exc:  # Elasticsearch does not answer
            problem, es_down = str(exc).removeprefix("elastalert: "), True
        except (ProcessGone, requests.RequestException, ValueError) as exc:
            problem = f"cannot read its writeback index: {exc}"
        healthy = not copied or (pid is not None and bool(ran) and problem is None)
        state = ("idle: no rules" if not copied else "healthy" if healthy else
                 "stopped" if pid is None else "running, Elasticsearch down" if es_down else
                 "running, not answering" if problem else "running, no rule run yet")
        details = [f"rules: {len(copied)} copied, {len(ran)} run since start; "
                   f"alerts so far: {self.alerts_so_far()} in {self.alerts_log}"]
        details += [f"problem: {problem}"] * bool(problem) + [f"last ElastAlert error: {error}"] * bool(error)
        return {"service": self.name, "url": self.url, "pid": pid, "running": pid is not None, "healthy": healthy,
                "log": str(self.log_path), "state": state, "rules": len(copied), "rules_run": len(ran),
                "alerts": self.alerts_so_far(), "alerts_log": str(self.alerts_log), "problem": problem,
                "last_error": error, "details": details}


@dataclass(frozen=True)
class Alerts:
    """What an alert log holds: its alerts (a JSON object per line: time, rule, match), and the lines
    that are not one (named by number; a line being written is not whole yet)."""

    alerts: list[dict]
    bad: list[str]


def read_alerts(log: Path, run_id: str | None = None, rule: str | None = None) -> Alerts:
    """The alerts in LOG (of the run RUN_ID only, of the rule named RULE only, if given). No log
    yet: no alert."""
    try:
        text = log.read_bytes()
    except FileNotFoundError:
        return Alerts([], [])
    except OSError as exc:
        raise StackError(f"alert log {log}: {exc}") from None
    alerts, bad = [], []
    lines = text.split(b"\n")
    for n, line in enumerate(lines[:-1], 1):  # after the last newline: a line still being written
        try:
            doc = json.loads(line)
            ok = isinstance(doc, dict) and isinstance(doc.get("match"), dict) and isinstance(doc.get("rule"), str)
        except ValueError:
            ok = False
        if not ok:
            bad.append(f"{log}:{n}: not an alert (a JSON object with time, rule and match)")
        elif (run_id is None or doc["match"].get("run_id") == run_id) and (rule is None or doc["rule"] == rule):
            alerts.append(doc)
    return Alerts(alerts, bad)


def describe_alert(alert: dict) -> str:
    """One line a person reads: when it was sent, the rule, and who it is about."""
    m = alert["match"]
    who = " ".join(f"{k}={m[k]}" for k in ("run_id", "node_id", "host", "agent") if m.get(k) is not None)
    sample = f" (sample of {m['time']})" if m.get("time") else ""
    return f"{alert.get('time', '?')}  {alert['rule']}: {who}{sample}"


def test_rule(stack: Stack | Path, rule: Path, start: datetime | str, end: datetime | str) -> Result:
    """Run ``elastalert-test-rule`` on the rule file RULE (alerter-neutral, as packaged) from START to
    END against the stack's Elasticsearch, with the stack's ElastAlert; nothing is sent. STACK is a
    Stack, or its cache folder (whose stack.json says the ports)."""
    if hasattr(stack, "services"):
        service: ElastAlert = stack["elastalert"]  # type: ignore[index,assignment]
    else:
        service = ElastAlert("elastalert", Path(stack).resolve(), 0)
        es_port = load_state(Path(stack)).get("elasticsearch", {}).get("port", Elasticsearch.default_port)
        service.link(None, {"elasticsearch": es_port})
    service.install()
    def aware(t: datetime | str) -> datetime:
        when = t if isinstance(t, datetime) else datetime.fromisoformat(t)
        if when.tzinfo is None:
            raise ValueError(f"{t!r} has no time zone")
        return when

    try:
        window_s = (aware(end) - aware(start)).total_seconds()
    except (ValueError, TypeError) as exc:
        raise StackError(f"test_rule {rule}: start and end are ISO 8601 times with a time zone ({exc})") from exc
    start, end = (t.isoformat() if isinstance(t, datetime) else t for t in (start, end))
    with tempfile.TemporaryDirectory(prefix="flowstat-test-rule-") as tmp:
        rules_dir = Path(tmp, "rules")
        rules_dir.mkdir()
        _, text = service.prepare_rule(rule.read_text(encoding="utf-8"), str(rule))
        (rules_dir / rule.name).write_text(text, encoding="utf-8")
        # one query over the whole window (ElastAlert would split it into buffer_time pieces)
        Path(tmp, "config.yaml").write_text(service.config_text(rules_dir, max(window_s, 1.0)), encoding="utf-8")
        out = subprocess.run([*service._program("elastalert-test-rule"), "--config", str(Path(tmp, "config.yaml")),
                              "--start", start, "--end", end, "--formatted-output", str(rules_dir / rule.name)],
                             capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    return _test_result(rule, out)


test_rule.__test__ = False  # type: ignore[attr-defined]  # a helper for tests, not one for pytest to collect


def _test_result(rule: Path, out: subprocess.CompletedProcess) -> Result:
    """elastalert-test-rule --formatted-output prints a JSON line; under "writeback" it holds the last
    status ElastAlert would have recorded (rule_name, matches, hits) and the last error, if any."""
    output = out.stdout + out.stderr
    found = next((line for line in reversed(out.stdout.splitlines()) if line.startswith("{")), None)
    try:
        writeback = json.loads(found)["writeback"] if found else {}
        status = writeback["elastalert_status"]
        error = writeback.get("elastalert_error")
        return Result(rule=status["rule_name"], matches=int(status["matches"]), hits=int(status["hits"]),
                      errors=(str(error.get("message")),) if error else (), output=output)
    except (ValueError, KeyError, TypeError) as exc:
        # the exceptions' own lines say why (a rule ElastAlert refuses: its schema's complaint), not
        # the schema ElastAlert prints after them
        why = [line for line in output.splitlines() if re.match(r"[\w.]+(Error|Exception): ", line)]
        raise StackError(f"elastalert-test-rule {rule}: no result (exit code {out.returncode}): "
                         f"{'; '.join(why) or output.strip()[-1500:]}") from exc
