"""The Python agent's spool (agent.spool) on a real folder: its order, its bound, what it counts,
what a restarted agent finds, and the folder names the C agent shares. The agents' spools in use
(a sink down, then back) are in test_agent.py and test_c_agent_delivery.py."""

from __future__ import annotations

import pytest

from flowstat.agent.spool import URL_FILE, Spool, folder_name


def batches(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("*.batch"))


def test_batches_leave_in_the_order_they_came_and_are_counted(tmp_path):
    sp = Spool(tmp_path, max_bytes=10_000)
    assert sp.peek() is None and len(sp) == 0 and sp.samples == 0
    sp.push(b"a" * 10, count=3)
    sp.push(b"bb" * 10, count=5)
    assert batches(tmp_path) == ["000000000000-3.batch", "000000000001-5.batch"]
    assert len(sp) == 2 and sp.samples == 8 and sp.dropped_samples == 0
    assert sp.peek() == (b"a" * 10, 3)
    sp.pop()
    assert sp.peek() == (b"bb" * 10, 5) and len(sp) == 1 and sp.samples == 5
    sp.pop()
    assert sp.peek() is None and sp.samples == 0 and batches(tmp_path) == []


def test_over_its_bound_the_oldest_batches_go_and_are_counted(tmp_path):
    sp = Spool(tmp_path, max_bytes=250)
    for i in range(5):
        sp.push(bytes([i]) * 100, count=10 + i)
    # 5 x 100 bytes over a bound of 250: the three oldest went, the two newest stay
    assert batches(tmp_path) == ["000000000003-13.batch", "000000000004-14.batch"]
    assert sp.dropped_samples == 10 + 11 + 12 and sp.samples == 13 + 14 and len(sp) == 2
    assert sp.peek() == (b"\x03" * 100, 13)


def test_a_spool_exactly_at_its_bound_keeps_everything(tmp_path):
    sp = Spool(tmp_path, max_bytes=200)
    sp.push(b"x" * 100, count=1)
    sp.push(b"y" * 100, count=1)
    assert len(sp) == 2 and sp.dropped_samples == 0
    sp.push(b"z", count=1)  # one byte over
    assert len(sp) == 2 and sp.dropped_samples == 1 and sp.peek() == (b"y" * 100, 1)


def test_a_batch_larger_than_the_bound_is_kept_alone(tmp_path):
    """The newest batch is never dropped: dropping it would lose what was just taken."""
    sp = Spool(tmp_path, max_bytes=50)
    sp.push(b"a" * 10, count=2)
    sp.push(b"b" * 100, count=7)
    assert batches(tmp_path) == ["000000000001-7.batch"] and sp.dropped_samples == 2 and sp.samples == 7


def test_the_bound_counts_bytes_freed_by_pop_and_replace(tmp_path):
    sp = Spool(tmp_path, max_bytes=300)
    sp.push(b"a" * 200, count=4)
    sp.pop()
    sp.push(b"b" * 200, count=4)
    sp.replace_oldest(b"c" * 50, count=1)
    sp.push(b"d" * 200, count=4)  # 50 + 200 <= 300: nothing dropped
    assert sp.dropped_samples == 0 and len(sp) == 2 and sp.samples == 5
    sp.push(b"e" * 51, count=1)  # 301: the oldest goes
    assert sp.dropped_samples == 1 and sp.samples == 5 and sp.peek() == (b"d" * 200, 4)


def test_replace_oldest_keeps_its_place_and_its_count(tmp_path):
    sp = Spool(tmp_path, max_bytes=10_000)
    sp.push(b"first" * 10, count=10)
    sp.push(b"second", count=2)
    sp.replace_oldest(b"rest", count=4)  # a store took 6 of the 10
    assert batches(tmp_path) == ["000000000000-4.batch", "000000000001-2.batch"]
    assert sp.peek() == (b"rest", 4) and sp.samples == 6 and len(sp) == 2
    sp.replace_oldest(b"same", count=4)  # same count: the same file, rewritten
    assert batches(tmp_path) == ["000000000000-4.batch", "000000000001-2.batch"] and sp.peek() == (b"same", 4)


def test_a_restarted_agent_finds_what_is_left_in_order_and_goes_on_numbering(tmp_path):
    sp = Spool(tmp_path, max_bytes=10_000)
    for i in range(3):
        sp.push(bytes([65 + i]) * (i + 1), count=i + 1)
    sp.pop()
    (tmp_path / "000000000009-1.tmp").write_bytes(b"cut short")  # a write a crash cut short
    again = Spool(tmp_path, max_bytes=10_000)
    assert len(again) == 2 and again.samples == 5 and again.peek() == (b"BB", 2)
    assert not list(tmp_path.glob("*.tmp"))  # never acknowledged: not a batch
    again.push(b"D", count=1)
    assert batches(tmp_path)[-1] == "000000000003-1.batch"
    # the bound holds over what the last agent left
    small = Spool(tmp_path, max_bytes=4)
    small.push(b"E", count=1)
    assert small.dropped_samples == 2 + 3 and small.peek() == (b"D", 1) and small.samples == 2


def test_a_spool_names_its_sink_and_refuses_another(tmp_path):
    url = "http://127.0.0.1:8086/write?db=x"
    Spool(tmp_path, url=url)
    assert (tmp_path / URL_FILE).read_text() == url + "\n"
    Spool(tmp_path, url=url)  # the same sink again: fine
    with pytest.raises(ValueError, match="holds the batches of another sink"):
        Spool(tmp_path, url="http://elsewhere:1/write")
    assert (tmp_path / URL_FILE).read_text() == url + "\n"


@pytest.mark.parametrize(
    "url,name",
    [
        # FNV-1a 32 of the URL (the FNV reference vectors)
        ("", "-811c9dc5"),
        ("a", "a-e40c292c"),
        ("foobar", "foobar-bf9cf968"),
    ],
)
def test_folder_names_are_the_url_then_its_fnv1a_hash(url, name):
    assert folder_name(url) == name


def test_folder_names_keep_64_bytes_of_the_url_and_differ_by_the_rest():
    long_a, long_b = "http://x/" + "a" * 100, "http://x/" + "a" * 99 + "b"
    a, b = folder_name(long_a), folder_name(long_b)
    assert a.split("-")[0] == b.split("-")[0] == "http___x_" + "a" * 55 and a != b
    assert folder_name("http://hôte/") == "http___h__te_-" + folder_name("http://hôte/").split("-")[1]


def test_a_spool_folder_is_made_with_its_parents(tmp_path):
    sp = Spool(tmp_path / "spool" / "sink-a", max_bytes=100)
    sp.push(b"x", count=1)
    assert batches(tmp_path / "spool" / "sink-a") == ["000000000000-1.batch"]


def test_dropping_a_batch_is_logged_with_the_spool_its_bound_and_what_went(tmp_path, caplog):
    sp = Spool(tmp_path, max_bytes=150)
    with caplog.at_level("ERROR", logger="flowstat.agent"):
        sp.push(b"a" * 100, count=10)
        sp.push(b"b" * 100, count=20)
    assert [r.getMessage() for r in caplog.records] == [
        f"spool {tmp_path} is over 150 bytes: dropped its oldest batch (10 samples)"
    ]


def test_a_write_cut_short_leaves_nothing_a_restarted_agent_would_take_for_a_batch(tmp_path, monkeypatch):
    """A disk error (or a crash) between writing a batch and renaming it: the half-written file
    is never taken for a batch, and the next agent removes it."""
    sp = Spool(tmp_path, max_bytes=1000)
    sp.push(b"kept", count=1)

    def disk_error(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("flowstat.agent.spool.os.fsync", disk_error)
    with pytest.raises(OSError):
        sp.push(b"half", count=2)
    monkeypatch.undo()
    again = Spool(tmp_path, max_bytes=1000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000000-1.batch"]
    assert len(again) == 1 and again.peek() == (b"kept", 1)
