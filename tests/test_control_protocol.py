import json

from flowstat.harness.control import RateTracker, parse_request


def test_parse_request_accepts_known_commands():
    for command in ("check-state", "get-metrics"):
        assert parse_request(json.dumps({"command": command}).encode())[2] is None


def test_parse_request_errors_are_texts():
    assert "not JSON" in parse_request(b"\xff\xfe garbage")[2]
    assert "expected a JSON object" in parse_request(b"[1, 2]")[2]
    assert "missing" in parse_request(b'{"cmd": "x"}')[2]
    command, _, error = parse_request(b'{"command": "reboot"}')
    assert command == "reboot" and "unknown command" in error
    assert "exceeds" in parse_request(b" " * 70_000)[2]


def test_rates_are_per_client():
    tracker = RateTracker()
    tracker.rates(b"a", 0)
    tracker.rates(b"b", 0)
    _, rate_a = tracker.rates(b"a", 1000)
    _, rate_b = tracker.rates(b"b", 1000)
    # each client sees the 1000 merged objects since its own previous request
    assert rate_a > 0 and rate_b > 0
    _, again = tracker.rates(b"a", 1000)
    assert again == 0.0
