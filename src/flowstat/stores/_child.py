"""The child of a WriterProcess (see _process): ``python -m flowstat.stores._child STORE URL TARGET
GIVE_UP_S TIMEOUT_S NODE_BACKOFF_S``. Batches arrive on stdin; one JSON line answers on stdout: at
once the error that stopped it, or, at the end, what the store accepted and refused. A failover
between a store's nodes is logged on stderr."""

from __future__ import annotations

import json
import logging
import signal
import sys

from . import get
from ._base import MAX_REASONS, RetryPolicy, StoreDown
from ._process import FRAME, WriterResult


def serve(store: str, url: str, target: str, give_up_s: str, timeout_s: str, node_backoff_s: str) -> int:
    """Write every batch in order; after the first error, read and drop the rest."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    policy = RetryPolicy(give_up_s=float(give_up_s))
    writer = get(store)(url, target, timeout_s=float(timeout_s), node_backoff_s=float(node_backoff_s))
    read = sys.stdin.buffer.read
    total: WriterResult = {"accepted": 0, "refused": 0, "reasons": []}
    error: str | None = None
    while (head := read(FRAME.size)) and len(head) == FRAME.size:
        size, count = FRAME.unpack(head)
        if size == 0:
            break
        body = read(size)
        if error is not None or len(body) != size:
            continue
        try:
            done = writer.write(body, count, policy)
        except StoreDown as exc:
            error = " ".join(str(exc).split())
        except Exception as exc:  # a bug, an answer nobody expected: the parent must hear of it
            error = f"{writer.title} at {url}: {exc.__class__.__name__}: {exc}"
        else:
            total["accepted"] += done.accepted
            total["refused"] += done.refused
            total["reasons"] = (total["reasons"] + done.reasons)[:MAX_REASONS]
            continue
        print(json.dumps({"error": error, **total}), flush=True)
    if error is None:
        print(json.dumps(total), flush=True)
    writer.close()
    return 0


if __name__ == "__main__" and len(sys.argv) == 7:
    sys.exit(serve(*sys.argv[1:]))
