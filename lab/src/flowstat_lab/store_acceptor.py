"""A loopback HTTP endpoint that takes what agents send to the stores and stores nothing.

For benchmarks that measure what *sending* costs an agent (encoding, batching, HTTP), not what
storing costs a store: a real InfluxDB or Elasticsearch indexing 5,000 samples a second would take
the CPU the agent is measured on. Each request is read whole and answered as the store answers
when everything was stored: InfluxDB's `/write` with 204, Elasticsearch's `/_bulk` with 200 and
`"errors": false`. Anything else is 404.

    python -m flowstat_lab.store_acceptor --port-file FILE   # prints nothing; writes its port to FILE
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BULK_STORED = json.dumps({"took": 0, "errors": False, "items": []}).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the agents' clients use it

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        path = self.path.split("?", 1)[0]
        if path.endswith("/write"):
            self._answer(204, b"")
        elif path.endswith("/_bulk"):
            self._answer(200, BULK_STORED)
        else:
            self._answer(404, b"")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the http.server API)
        pass  # thousands of requests: a line each would cost more than answering them


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port-file", type=Path, required=True, help="where the chosen loopback port is written")
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    tmp = args.port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    os.replace(tmp, args.port_file)  # whole or absent: the reader polls for it
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
