"""ElastAlert2's command alerter runs this for every alert of every rule (flowstat.stack.elastalert
adds it when it copies the rules): ``python alert_log.py LOG RULE_NAME``, the matches as JSON on
stdin. Each match becomes one JSON line of LOG: the time of the alert, the rule's name and the
matching document, so that a person can tail the file and a program can read it.
"""

import json
import os
import sys
from datetime import UTC, datetime


def main() -> int:
    log, rule = sys.argv[1], sys.argv[2]
    matches = json.load(sys.stdin)
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    lines = "".join(json.dumps({"time": now, "rule": rule, "match": m}, sort_keys=True) + "\n" for m in matches)
    # One write(2) to a file opened for appending: the lines of two alerts sent at once never mix.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, lines.encode())
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
