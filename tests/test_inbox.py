"""flowstat inbox, the compose stack's `alerts` service: Grafana's and ElastAlert2's alerts POSTed
to a real inbox process, shown, logged, forwarded to a real webhook and by e-mail through a real
SMTP conversation; bad payloads refused, nothing lost across a restart. (ElastAlert2 itself posting
to an inbox: tests/test_elastalert.py.)"""

from __future__ import annotations

import email
import email.policy
import json
import socketserver
import subprocess
import sys
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from flowstat.inbox.received import ReceivedAlert
from flowstat.inbox.relay import Relay, Webhook
from flowstat.views import ALERTS
from flowstat.views.panels import RUN_VIEW
from support.agents import wait_until
from support.inbox import Inbox

OVERLOAD = next(a for a in ALERTS if a.uid == "flowstat-buffer-overload")

# Grafana's webhook body, as its documentation shows it, with the labels flowstat's rules give an
# alert (the rule's own, and the tags its query groups by)
GRAFANA = {
    "receiver": "flowstat-webhook",
    "status": "firing",
    "orgId": 1,
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": OVERLOAD.title,
                "grafana_folder": "flowstat",
                "alert": OVERLOAD.uid,
                "source": "flowstat",
                "run_id": "demo-overload-20261126T101500Z",
                "node_id": "producers-0",
                "agent": "flowstat-agent-c",
            },
            "annotations": {
                "summary": "producers-0 of run demo-overload-20261126T101500Z: its send or receive buffer was "
                "overloaded in the last minute",
                "description": OVERLOAD.why,
            },
            "startsAt": "2026-11-26T11:15:03.157076+01:00",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://grafana:3000/alerting/grafana/flowstat-buffer-overload/view",
            "fingerprint": "c6eadffa33fcdf37",
            "silenceURL": "",
            "dashboardURL": "",
            "panelURL": "",
            "values": {"A": 3, "THRESHOLD": 1},
        }
    ],
    "groupLabels": {"alertname": OVERLOAD.title, "run_id": "demo-overload-20261126T101500Z"},
    "commonLabels": {},
    "commonAnnotations": {},
    "externalURL": "http://grafana:3000/",
    "version": "1",
    "groupKey": "{}:{}",
    "truncatedAlerts": 0,
    "title": "[FIRING:1]",
    "state": "alerting",
    "message": "",
}
# ElastAlert2's HTTP POST 2 alerter: the matching sample's fields, and the rule's payload
ELASTALERT = {
    "time": "2026-11-26T10:15:04.000Z",
    "run_id": "demo-overload-20261126T101500Z",
    "host": "vm",
    "node_id": "merger-0",
    "role": "merger",
    "agent": "flowstat-agent-py",
    "seq": 3,
    "receive_buffer_overloaded": True,
    "rule": OVERLOAD.title,
    "alert": OVERLOAD.uid,
}


class SmtpSink(socketserver.ThreadingTCPServer):
    """An SMTP server that takes every message (the conversation smtplib holds) and keeps it."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        self.messages: list[email.message.Message] = []
        super().__init__(("127.0.0.1", 0), self.Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    class Handler(socketserver.StreamRequestHandler):
        def reply(self, line: str) -> None:
            self.wfile.write((line + "\r\n").encode())

        def handle(self) -> None:
            self.reply("220 sink ESMTP")
            while line := self.rfile.readline().decode():
                verb = line[:4].upper()
                if verb in ("EHLO", "HELO"):
                    self.reply("250 sink")
                elif verb == "DATA":
                    self.reply("354 go on")
                    lines = []
                    while (data := self.rfile.readline().decode()) not in (".\r\n", ""):
                        lines.append(data[1:] if data.startswith("..") else data)
                    self.server.messages.append(email.message_from_string("".join(lines), policy=email.policy.default))
                    self.reply("250 taken")
                elif verb == "QUIT":
                    self.reply("221 bye")
                    return
                else:  # MAIL, RCPT, RSET, NOOP
                    self.reply("250 ok")


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.server.posts.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(self.server.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.posts, server.status = [], 200
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def inbox_env(hook):
    smtp = SmtpSink()
    env = {
        "PATH": "/usr/bin:/bin",
        "FLOWSTAT_RELAY_WEBHOOK": f"http://127.0.0.1:{hook.server_port}/alerts?token=t0ken",
        "FLOWSTAT_RELAY_EMAIL_TO": "oncall@example.org, lead@example.org",
        "FLOWSTAT_SMTP_HOST": "127.0.0.1",
        "FLOWSTAT_SMTP_PORT": str(smtp.server_address[1]),
        "FLOWSTAT_SMTP_FROM": "flowstat@example.org",
    }
    yield env, smtp
    smtp.shutdown()
    smtp.server_close()


def test_an_alert_of_each_source_is_shown_logged_and_forwarded_with_its_run_node_and_link(tmp_path, hook, inbox_env):
    env, smtp = inbox_env
    inbox = Inbox(tmp_path / "alerts.jsonl", env)
    try:
        for source, body in (("grafana", GRAFANA), ("elastalert", ELASTALERT)):
            resp = requests.post(f"{inbox.url}/{source}", json=body, timeout=5)
            assert resp.status_code == 200 and resp.json() == {"taken": 1}
        got = inbox.listed("demo-overload-20261126T101500Z")
        assert [(a["source"], a["rule"], a["uid"], a["node_id"], a["status"]) for a in got] == [
            ("elastalert", OVERLOAD.title, OVERLOAD.uid, "merger-0", "firing"),  # newest first
            ("grafana", OVERLOAD.title, OVERLOAD.uid, "producers-0", "firing"),
        ]
        assert got[1]["agent"] == "flowstat-agent-c" and got[1]["summary"].startswith("producers-0 of run")
        assert got[0]["at"] == ELASTALERT["time"] and got[0]["host"] == "vm"
        for a, at in zip(
            got, (ELASTALERT["time"], GRAFANA["alerts"][0]["startsAt"]), strict=False
        ):  # the run view, node, time
            at_ms = int(datetime.fromisoformat(at).timestamp() * 1000)
            link = urlsplit(a["dashboard"])
            q = parse_qs(link.query)
            assert (link.netloc, link.path) == ("grafana.example:3000", f"/d/{RUN_VIEW.uid}/")
            assert q["var-run"] == [a["run_id"]] and q["var-node"] == [a["node_id"]]
            assert int(q["from"][0]) == at_ms - 15 * 60_000 and int(q["to"][0]) == at_ms + 15 * 60_000
        assert inbox.listed("another-run") == []
        page = requests.get(inbox.url, timeout=5).text
        assert page.count(OVERLOAD.title) == 2 and "producers-0" in page and "merger-0" in page
        # forwarded: the webhook gets each as JSON, e-mail to every address
        wait_until(lambda: len(hook.posts) == 2 and len(smtp.messages) == 2, "both relays", timeout=30)
        assert sorted(hook.posts, key=lambda p: p["source"]) == sorted(got, key=lambda p: p["source"])
        subjects = sorted(m["Subject"].strip() for m in smtp.messages)  # folded: a long line
        assert subjects == [
            f"flowstat: {OVERLOAD.title}: merger-0 of run demo-overload-20261126T101500Z",
            f"flowstat: {OVERLOAD.title}: producers-0 of run demo-overload-20261126T101500Z",
        ]
        assert all(m["To"] == "oncall@example.org, lead@example.org" for m in smtp.messages)
        assert sorted(a["dashboard"] for a in got) == sorted(
            line.removeprefix("dashboard: ")
            for m in smtp.messages
            for line in m.get_content().splitlines()
            if line.startswith("dashboard: ")
        )
    finally:
        out, err = inbox.stop()
    printed = [line for line in out.splitlines() if OVERLOAD.title in line]
    assert len(printed) == 2 and "run_id=demo-overload-20261126T101500Z node_id=merger-0" in printed[1]
    assert "t0ken" not in out + err  # a webhook's query (its token) is never shown
    logged = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert logged == list(reversed(got))


def test_bad_payloads_are_refused_saying_why_and_nothing_is_lost_across_a_restart(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    log = tmp_path / "alerts.jsonl"
    inbox = Inbox(log, env)
    try:
        assert requests.post(f"{inbox.url}/elastalert", json=ELASTALERT, timeout=5).status_code == 200
        for path, body, why in (
            ("grafana", {"alerts": "x"}, "list `alerts`"),
            ("elastalert", {"run_id": "r"}, "`rule`"),
            ("elastalert", [1, 2], "JSON object"),
            ("nagios", {"x": 1}, "unknown source 'nagios'"),
        ):
            resp = requests.post(f"{inbox.url}/{path}", json=body, timeout=5)
            assert resp.status_code == 400 and why in resp.json()["error"], (path, resp.text)
        resp = requests.post(f"{inbox.url}/grafana", data=b"{not json", timeout=5)
        assert resp.status_code == 400
        resp = requests.post(f"{inbox.url}/grafana", data=b"x" * (2 << 20), timeout=5)
        assert resp.status_code == 413
        assert len(inbox.listed()) == 1
    finally:
        inbox.stop()
    again = Inbox(log, env)
    try:
        assert [a["node_id"] for a in again.listed()] == ["merger-0"]  # the page survives a restart
        assert "merger-0" in requests.get(again.url, timeout=5).text
    finally:
        again.stop()
    assert len(log.read_text().splitlines()) == 1


def test_a_relay_retries_a_destination_that_fails_then_gives_up_saying_so_once(hook, caplog):
    alert = ReceivedAlert(
        "2026-11-26T10:15:05.000Z",
        "elastalert",
        OVERLOAD.title,
        OVERLOAD.uid,
        "firing",
        "r",
        "n",
        "a",
        "h",
        "2026-11-26T10:15:04.000Z",
        "s",
        "",
    )
    relay = Relay(Webhook(f"http://127.0.0.1:{hook.server_port}/alerts"), retry_for_s=2.0)
    hook.status = 503
    assert relay.deliver(alert) is False and len(hook.posts) >= 2  # retried, then given up
    assert [r.message for r in caplog.records].count(
        f"relay to webhook http://127.0.0.1:{hook.server_port}/alerts: gave up on an alert of {OVERLOAD.title} "
        "(HTTP 503)"
    ) == 1
    hook.status = 200
    assert relay.deliver(alert) is True and hook.posts[-1] == alert.as_dict()


def test_a_relay_the_environment_cannot_describe_stops_the_inbox_naming_it(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "flowstat.cli", "inbox", "--listen", "127.0.0.1:0"],
        env={"PATH": "/usr/bin:/bin", "FLOWSTAT_RELAY_EMAIL_TO": "a@example.org"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "FLOWSTAT_SMTP_HOST must say which SMTP server sends" in out.stderr


def test_an_aggregation_rules_compound_key_gives_the_alert_its_run_and_node():
    """ElastAlert's spike_aggregation match (the memory rule) holds its query key as one field; the
    generated rule's text names it, and the inbox splits it into run, node and agent."""
    import yaml

    from flowstat.inbox.received import parse
    from support.common import ROOT

    rule = yaml.safe_load((ROOT / "dashboards/elastalert/rules/flowstat-vmrss-growing.yaml").read_text())
    assert rule["type"] == "spike_aggregation" and rule["alert_text_args"] == ["run_id,node_id,agent"]
    payload = {"rule": "Memory growing", "alert": "flowstat-vmrss-growing", "time": "2026-11-26T10:00:00Z",
               "run_id,node_id,agent": "night-7,merger-0,flowstat-agent-c"}  # fmt: skip
    (alert,) = parse("elastalert", payload, "http://grafana:3000")
    assert (alert.run_id, alert.node_id, alert.agent) == ("night-7", "merger-0", "flowstat-agent-c")
    assert "merger-0 of run night-7" in alert.summary and "var-node=merger-0" in alert.dashboard
