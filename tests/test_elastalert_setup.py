"""ElastAlert in the stack without a server: the rules' preparation (alerters added, a rule to fix
named), the CLI's webhook from the environment, and the pinned venv installed once and again when
the pins change. The rest, with the session's servers, is test_elastalert.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flowstat.stack import StackError
from flowstat.stack import elastalert as ea
from support.common import ELASTALERT_RULES

RULE = ELASTALERT_RULES / "send-buffer-overloaded.yaml"


def test_rules_are_prepared_with_the_alerters_or_refused_by_name(tmp_path):
    service = ea.ElastAlertServer(
        "elastalert",
        tmp_path,
        0,
        extra={"es_url": "http://127.0.0.1:1"},
        options={"webhook": "http://127.0.0.1:9/hook"},
    )
    name, text = service.prepare_rule("name: mine\ntype: any\nindex: x\nalert: debug\n", "mine.yaml")
    rule = yaml.safe_load(text)
    assert name == "mine" and rule["alert"] == ["debug", "command", "post2"]  # a rule's own alerter is kept
    assert rule["command"] == [
        str(service.venv / "bin" / "python"),
        str(service.home / "alert_log.py"),
        str(service.alerts_log),
        "mine",
    ]
    assert rule["http_post2_url"] == "http://127.0.0.1:9/hook" and rule["http_post2_payload"] == {"rule": "mine"}
    for bad, says in [
        ("name: [unclosed\n", "mine.yaml: not valid YAML"),
        ("type: any\n", "mine.yaml: an ElastAlert rule"),
        ("name: 100% {x}\n", "must not hold %"),
        ("name: n\ncommand: [ls]\n", "mine.yaml: sets command, which flowstat's alerters use"),
    ]:
        with pytest.raises(StackError, match=says):
            service.prepare_rule(bad, "mine.yaml")
    twins = tmp_path / "twins"
    twins.mkdir()
    for f in ("a.yaml", "b.yml"):
        (twins / f).write_text(RULE.read_text())
    service.options["rules_dirs"] = [twins]
    with pytest.raises(StackError, match=f"rules {twins / 'a.yaml'} and {twins / 'b.yml'} are both named"):
        service.rules()
    service.options.update(rules_dirs=[tmp_path / "missing"])
    with pytest.raises(StackError, match="--alert-rules .*missing: no such folder"):
        service.rules()
    service.options.update(rules_dirs=[], webhook="ftp://example")
    with pytest.raises(StackError, match="webhook 'ftp://example' is not an http:// or https:// URL"):
        service.up()
    # at up, the rules are copied (a stale one goes) before Elasticsearch is asked: here it is down
    service.options.update(rules_dirs=[ELASTALERT_RULES], webhook=None)
    service.rules_dir.mkdir(parents=True)
    (service.rules_dir / "gone.yaml").write_text("name: gone\n")
    with pytest.raises(StackError, match="Elasticsearch at http://127.0.0.1:1 does not answer"):
        service.up()
    assert sorted(p.name for p in service.rules_dir.iterdir()) == sorted([RULE.name, *ea.packaged_rules()])
    assert (service.rules_dir / RULE.name).stat().st_mode & 0o777 == 0o600  # a webhook URL may hold a token
    assert yaml.safe_load((service.rules_dir / RULE.name).read_text())["alert"] == ["command"]


def test_cli_takes_the_webhook_from_the_environment(reachable_tmp):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowstat.cli",
            "stack",
            "up",
            "--only",
            "elastalert",
            "--cache",
            str(reachable_tmp),
            "--alert-rules",
            str(ELASTALERT_RULES),
        ],
        env={**os.environ, "FLOWSTAT_ALERT_WEBHOOK": "ftp://from-env"},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "webhook 'ftp://from-env' is not an http:// or https:// URL" in out.stderr


def test_the_venv_is_installed_once_and_again_when_the_pins_change(tmp_path, monkeypatch):
    # a small stand-in for the pins: pytz alone
    venv, small = tmp_path / "venv", "pytz==2026.6\n"
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # as here and in CI

    def compiled() -> list[Path]:
        return list(venv.glob("lib/python3*/site-packages/pytz/__pycache__/__init__.*.pyc"))

    ea.install_venv(venv, small, ("pytz",), "pytz")
    assert compiled()
    (venv / "marker").touch()
    ea.install_venv(venv, small, ("pytz",), "pytz")
    assert (venv / "marker").exists()
    # a venv an older flowstat left without bytecode is compiled, not installed again
    (venv / ea.COMPILED).unlink()
    for pyc in compiled():
        pyc.unlink()
    ea.install_venv(venv, small, ("pytz",), "pytz")
    assert compiled() and (venv / "marker").exists()
    ea.install_venv(venv, "# changed\n" + small, ("pytz",), "pytz")
    assert not (venv / "marker").exists() and (venv / "flowstat-constraints.txt").read_text() == "# changed\n" + small
