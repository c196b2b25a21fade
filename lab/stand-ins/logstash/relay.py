"""Stand-in for the compose stack's Logstash: what pipelines/logstash/pipeline/flowstat.conf does,
in Python, for the tests that run docker-compose.yml where no Logstash image can be had.

Input as Logstash's ``tcp { port => 5044 codec => json_lines }``: one JSON document a line, on any
number of connections. Each document goes where the pipeline's filter sends it:

- with ``node_id``: a sample, into ``flowstat-samples-YYYY.MM.DD`` (the UTC day of its ``time``),
  id ``run_id/agent/node_id/seq``;
- else with ``from`` and ``to``: an agent's edge counter, into ``flowstat-edges-YYYY.MM.DD``, id
  ``run_id/from/to/agent/time``;
- else with ``agent``: an agent's self-sample, into ``flowstat-agents-YYYY.MM.DD``, id
  ``host/agent/time/seq``;
- else: a run document, into ``flowstat-runs``, id ``run_id``;

with ``action => index``, through ``_bulk``, as ELASTICSEARCH_USER with ELASTICSEARCH_PASSWORD at
ELASTICSEARCH_URL (the logstash service's environment: one URL, or several separated by spaces, as
Logstash expands them; a node that gives no answer is left for the next). Like Logstash's elasticsearch output it
retries a batch while Elasticsearch is down or answers 429/5xx (reading no more meanwhile: the
agents' sends then wait, as they do on a busy Logstash), and drops, logging them, documents
Elasticsearch refuses (4xx: Logstash's behaviour without a dead letter queue).

``GET :9600/_node/pipelines/main`` answers 200 once Elasticsearch has taken the user's credentials,
as Logstash's API answers once its pipeline runs. Listens on loopback (the stand-in runs on the
host network): RELAY_LISTEN, RELAY_API (default 127.0.0.1:5044 and 127.0.0.1:9600).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

DAY = re.compile(r"^(\d{4})-(\d{2})-(\d{2})")
BATCH = 1000
FLUSH_S = 0.5
STOP_FLUSH_S = 10.0  # at a stop, how long what was received may take to be written
lines: queue.Queue[bytes] = queue.Queue(maxsize=20000)
ready = threading.Event()


def log(msg: str) -> None:
    print(f"[logstash-relay] {msg}", file=sys.stderr, flush=True)


def route(doc: dict) -> tuple[str, str]:
    """The index and id pipelines/logstash/pipeline/flowstat.conf gives a document."""
    if doc.get("node_id"):
        index, doc_id = "flowstat-samples", f"{doc.get('run_id')}/{doc.get('agent')}/{doc['node_id']}/{doc.get('seq')}"
    elif doc.get("from") and doc.get("to"):
        index, doc_id = (
            "flowstat-edges",
            f"{doc.get('run_id')}/{doc['from']}/{doc['to']}/{doc.get('agent')}/{doc.get('time')}",
        )
    elif doc.get("agent"):
        index, doc_id = "flowstat-agents", f"{doc.get('host')}/{doc['agent']}/{doc.get('time')}/{doc.get('seq')}"
    else:
        return "flowstat-runs", str(doc.get("run_id"))
    m = DAY.match(str(doc.get("time", "")))
    return (f"{index}-{m[1]}.{m[2]}.{m[3]}" if m else index), doc_id


class Input(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            if line.strip():
                lines.put(line)  # blocks while the writer is behind: back-pressure, as Logstash


class Writer:
    def __init__(self) -> None:
        self.urls = [u.rstrip("/") for u in os.environ.get("ELASTICSEARCH_URL", "").split()]
        if not self.urls:
            sys.exit("[logstash-relay] ELASTICSEARCH_URL is empty: give one URL, or several separated by spaces")
        self.url = self.urls[0]
        self.session = requests.Session()
        self.session.auth = (os.environ.get("ELASTICSEARCH_USER", ""), os.environ.get("ELASTICSEARCH_PASSWORD", ""))
        self.session.headers["Content-Type"] = "application/x-ndjson"
        self.written = 0
        self.busy = False  # a batch taken from the queue and not yet stored (or dropped)

    def _next_node(self) -> None:
        """The next node of the list, after one that gave no answer."""
        self.url = self.urls[(self.urls.index(self.url) + 1) % len(self.urls)]

    def wait_for_credentials(self) -> None:
        said = None
        while True:
            try:
                r = self.session.get(f"{self.url}/_security/_authenticate", timeout=10)
                why = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
            except requests.RequestException as exc:
                why = f"no answer ({type(exc).__name__})"
                self._next_node()
            if why is None:
                log(f"writing to {self.url} as {self.session.auth[0]}")
                ready.set()
                return
            if why != said:
                log(f"waiting for Elasticsearch at {self.url}: {why}")
                said = why
            time.sleep(2)

    def send(self, batch: list[bytes]) -> None:
        body = []
        for raw in batch:
            try:
                doc = json.loads(raw)
            except ValueError:
                log(f"not JSON, dropped: {raw[:200]!r}")
                continue
            index, doc_id = route(doc)
            body.append(json.dumps({"index": {"_index": index, "_id": doc_id}}).encode())
            body.append(json.dumps(doc, separators=(",", ":")).encode())
        if not body:
            return
        payload = b"\n".join(body) + b"\n"
        delay = 1.0
        while True:
            try:
                r = self.session.post(f"{self.url}/_bulk", data=payload, timeout=60)
                if r.status_code == 200:
                    answer = r.json()
                    retry = [
                        i
                        for i, item in enumerate(answer.get("items", []))
                        if item["index"].get("status", 0) in (429,) or item["index"].get("status", 0) >= 500
                    ]
                    for item in answer.get("items", []):
                        status = item["index"].get("status", 0)
                        if 400 <= status < 500 and status != 429:
                            log(
                                f"refused ({status}), dropped: {item['index'].get('_index')} "
                                f"{item['index'].get('_id')}: {json.dumps(item['index'].get('error'))[:300]}"
                            )
                    if not retry:
                        self.written += len(body) // 2
                        return
                    payload = b"".join(body[2 * i] + b"\n" + body[2 * i + 1] + b"\n" for i in retry)
                    why = f"{len(retry)} documents answered 429/5xx"
                else:
                    why = f"HTTP {r.status_code}: {r.text[:200]}"
                    if 400 <= r.status_code < 500 and r.status_code not in (401, 403, 429):
                        log(f"batch refused, dropped: {why}")
                        return
            except (requests.RequestException, ValueError) as exc:
                why = f"no answer from {self.url} ({type(exc).__name__})"
                self._next_node()
            log(f"retrying in {delay:.0f} s: {why}")
            time.sleep(delay)
            delay = min(delay * 2, 16.0)

    def run(self) -> None:
        self.wait_for_credentials()
        while True:
            batch = [lines.get()]
            self.busy = True
            deadline = time.monotonic() + FLUSH_S
            while len(batch) < BATCH:
                try:
                    batch.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            self.send(batch)
            self.busy = False


class Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path.startswith("/_node/pipelines/main") and ready.is_set()
        body = json.dumps({"pipelines": {"main": {}}} if ok else {"status": "starting"}).encode()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args) -> None:
        pass


def address(var: str, default: str) -> tuple[str, int]:
    host, _, port = os.environ.get(var, default).rpartition(":")
    return host, int(port)


def main() -> None:
    writer = Writer()
    threading.Thread(target=writer.run, daemon=True, name="writer").start()
    api = ThreadingHTTPServer(address("RELAY_API", "127.0.0.1:9600"), Api)
    threading.Thread(target=api.serve_forever, daemon=True, name="api").start()
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    socketserver.ThreadingTCPServer.daemon_threads = True
    with socketserver.ThreadingTCPServer(address("RELAY_LISTEN", "127.0.0.1:5044"), Input) as server:
        # docker stop: as PID 1 a signal without a handler is ignored; Logstash stops its input and
        # flushes what its pipeline holds, so does this
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        log(f"json_lines on {server.server_address[0]}:{server.server_address[1]}")
        server.serve_forever()
    deadline = time.monotonic() + STOP_FLUSH_S
    while (writer.busy or not lines.empty()) and time.monotonic() < deadline:
        time.sleep(0.1)
    log(f"stopped; {lines.qsize()} documents not written")


if __name__ == "__main__":
    main()
