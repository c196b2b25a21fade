"""The inbox's HTTP server: Grafana and ElastAlert2 POST their alerts; a person reads them at /.

POST /grafana, POST /elastalert   an alert (see alerts.py); answered 200, or 400 saying what is wrong
GET /                              the alerts, newest first, as a page that refreshes itself
GET /alerts.json[?run=RUN_ID]      the same as JSON
GET /health                        200 while it serves

Every alert is appended to the log (a JSON line each) before it is answered, printed as a line on
stdout (`docker compose logs alerts`), and handed to the relays. The log is read back at start, so
that the page survives a restart.
"""

from __future__ import annotations

import html
import json
import logging
import os
import sys
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from .received import BadAlert, ReceivedAlert, parse
from .relay import Relay

log = logging.getLogger("flowstat.inbox")
MAX_BODY = 1 << 20  # an alert is a few kB; Grafana groups at most a few hundred
SHOWN = 1000  # alerts kept for the page


class Inbox:
    """What the server holds: the alerts so far (the last SHOWN), the log, the relays."""

    def __init__(self, log_path: Path | None, grafana_url: str, relays: list[Relay]):
        self.log_path, self.grafana_url, self.relays = log_path, grafana_url, relays
        self.alerts: deque[dict] = deque(maxlen=SHOWN)
        self.lock = threading.Lock()
        if log_path is not None and log_path.exists():
            with open(log_path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    try:
                        self.alerts.append(json.loads(line))
                    except ValueError:
                        log.error("%s, line %d: not an alert (JSON): left out", log_path, number)

    def take(self, source: str, payload: object) -> list[ReceivedAlert]:
        got = parse(source, payload, self.grafana_url)
        with self.lock:
            if self.log_path is not None:
                lines = "".join(json.dumps(a.as_dict(), sort_keys=True) + "\n" for a in got)
                fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
                try:
                    os.write(fd, lines.encode())
                finally:
                    os.close(fd)
            self.alerts.extend(a.as_dict() for a in got)
        for a in got:
            print(a.line(), flush=True)
            for relay in self.relays:
                relay.submit(a)
        return got

    def listed(self, run_id: str | None = None) -> list[dict]:
        with self.lock:
            return [a for a in reversed(self.alerts) if run_id is None or a.get("run_id") == run_id]

    def page(self) -> str:
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(a.get(k, '')))}</td>"
                for k in ("received", "rule", "status", "run_id", "node_id", "host", "source")
            )
            + (f'<td><a href="{html.escape(a["dashboard"])}">run view</a></td>' if a.get("dashboard") else "<td></td>")
            + "</tr>"
            for a in self.listed()
        )
        relays = ", ".join(f"{r.target.name} ({html.escape(r.target.where())})" for r in self.relays) or "none"
        return (
            "<!doctype html><html><head><meta charset=utf-8><meta http-equiv=refresh content=10>"
            "<title>flowstat alerts</title><style>body{font-family:sans-serif;margin:1em}table{border-collapse:"
            "collapse}td,th{border-bottom:1px solid #ddd;padding:.3em .6em;text-align:left}</style></head><body>"
            f"<h1>flowstat alerts</h1><p>{len(self.alerts)} alert(s), newest first; forwarded to: {relays}. "
            "From Grafana's contact point and ElastAlert2's rules (docs/alerts.md).</p><table><tr><th>received"
            "</th><th>rule</th><th>status</th><th>run</th><th>node</th><th>host</th><th>from</th><th></th></tr>"
            f"{rows}</table></body></html>"
        )


def handler(inbox: Inbox) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "flowstat-inbox"

        def answer(self, status: int, body: str | bytes, kind: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            source = urlsplit(self.path).path.strip("/")
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                self.answer(413, json.dumps({"error": f"a body of 0 to {MAX_BODY} bytes, with its Content-Length"}))
                return
            try:
                got = inbox.take(source, json.loads(self.rfile.read(length) or b"null"))
            except (BadAlert, ValueError) as exc:
                log.error("POST %s from %s refused: %s", self.path, self.client_address[0], exc)
                self.answer(400, json.dumps({"error": str(exc)}))
                return
            self.answer(200, json.dumps({"taken": len(got)}))

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/":
                self.answer(200, inbox.page(), "text/html; charset=utf-8")
            elif url.path == "/alerts.json":
                run = parse_qs(url.query).get("run", [None])[-1]
                self.answer(200, json.dumps(inbox.listed(run)))
            elif url.path == "/health":
                self.answer(200, json.dumps({"ok": True, "alerts": len(inbox.alerts)}))
            else:
                self.answer(404, json.dumps({"error": "GET /, /alerts.json or /health"}))

        def log_message(self, fmt: str, *args) -> None:  # requests are not news; alerts are printed
            pass

    return Handler


def serve(inbox: Inbox, host: str, port: int, ready=None) -> None:
    """Serve until interrupted (``ready``: called with the bound server, for tests and messages)."""
    server = ThreadingHTTPServer((host, port), handler(inbox))
    server.daemon_threads = True
    for relay in inbox.relays:
        relay.start()
    if ready is not None:
        ready(server)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        for relay in inbox.relays:
            relay.stop()
        sys.stdout.flush()
