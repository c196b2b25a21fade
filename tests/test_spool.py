"""The Python agent's spool (agent.spool) on a real folder: its order, its bound, what it counts,
what a restarted agent finds, and the folder names the C agent shares. The agents' spools in use
(a sink down, then back) are in test_agent.py and test_c_agent_delivery.py."""

from __future__ import annotations

import os

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

    def disk_error(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("flowstat.agent.spool.os.replace", disk_error)
    with pytest.raises(OSError):
        sp.push(b"half", count=2)
    monkeypatch.undo()
    again = Spool(tmp_path, max_bytes=1000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000000-1.batch"]
    assert len(again) == 1 and again.peek() == (b"kept", 1)


# -- the batch being sent, and two threads: the sampling thread writes ahead, the sink's sends ----------


def test_a_batch_the_bound_drops_while_it_is_sent_is_settled_by_what_became_of_it(tmp_path):
    """The bound may drop the oldest batch while the sink thread sends it (peek): taken by the sink,
    it was delivered, not dropped (pop); not taken, it was dropped (release). Counted once, either way."""
    sp = Spool(tmp_path, max_bytes=150)
    sp.push(b"a" * 100, count=10)
    assert sp.peek() == (b"a" * 100, 10)  # being sent
    sp.push(b"b" * 100, count=20)  # over the bound: the file of the batch being sent goes
    assert batches(tmp_path) == ["000000000001-20.batch"]
    assert sp.dropped_samples == 0 and sp.samples == 30 and len(sp) == 2  # not settled yet
    sp.pop()  # the sink took it
    assert sp.dropped_samples == 0 and sp.samples == 20 and len(sp) == 1
    assert sp.peek() == (b"b" * 100, 20)
    sp.push(b"c" * 100, count=30)  # drops b, being sent
    sp.release()  # the sink did not take it: dropped after all
    assert sp.dropped_samples == 20 and sp.samples == 30 and len(sp) == 1
    assert sp.peek() == (b"c" * 100, 30) and batches(tmp_path) == ["000000000002-30.batch"]
    sp.push(b"d" * 100, count=40)  # drops c, being sent; the store takes 25 of its 30
    sp.replace_oldest(b"rest", count=5)  # the rest had lost its place: dropped with it
    assert sp.dropped_samples == 25 and sp.samples == 40 and len(sp) == 1
    assert batches(tmp_path) == ["000000000003-40.batch"]


def test_the_batches_waiting_go_together_up_to_a_size_and_are_settled_together(tmp_path):
    """peek(max_bytes): the oldest batch and those after it while all fit (a sink that fell behind
    catches up a request at a time); pop settles them all, release none, replace_oldest puts what
    the store did not take in their place, as one batch."""
    sp = Spool(tmp_path, max_bytes=10_000)
    for i, c in enumerate(b"abcd"):
        sp.push(bytes([c]) * 10, count=i + 1)  # 10 bytes each; 1+2+3+4 samples
    assert sp.peek(25) == (b"a" * 10 + b"b" * 10, 3)  # a third would be 30 > 25
    sp.release()
    assert len(sp) == 4 and sp.samples == 10
    assert sp.peek(5) == (b"a" * 10, 1)  # one batch goes, however large
    sp.release()
    assert sp.peek(30) == (b"a" * 10 + b"b" * 10 + b"c" * 10, 6)
    sp.pop()
    assert len(sp) == 1 and sp.samples == 4 and batches(tmp_path) == ["000000000003-4.batch"]
    sp.push(b"e" * 10, count=5)
    assert sp.peek(10_000) == (b"d" * 10 + b"e" * 10, 9)
    sp.replace_oldest(b"rest", count=2)  # the store took 7 of the 9
    assert batches(tmp_path) == ["000000000003-2.batch"] and sp.peek(10_000) == (b"rest", 2) and sp.samples == 2


def test_batches_the_bound_drops_while_they_are_sent_together_are_settled_by_what_became_of_them(tmp_path):
    """Three batches sent together, and the bound drops two of them meanwhile: taken, all three
    were delivered; not taken, the two are dropped and the third stays; partly taken, what the
    store did not take stays, in their place."""
    for outcome in ("pop", "release", "replace"):
        folder = tmp_path / outcome
        sp = Spool(folder, max_bytes=300)
        for c in b"abc":
            sp.push(bytes([c]) * 100, count=10)
        assert sp.peek(300) == (b"a" * 100 + b"b" * 100 + b"c" * 100, 30)
        sp.push(b"d" * 150, count=7)  # 450 > 300: a and b go, c stays (150 + 100 <= 300)
        assert batches(folder) == ["000000000002-10.batch", "000000000003-7.batch"]
        assert sp.samples == 37 and len(sp) == 4 and sp.dropped_samples == 0  # not settled yet
        if outcome == "pop":
            sp.pop()
            assert (sp.samples, len(sp), sp.dropped_samples) == (7, 1, 0)
            assert batches(folder) == ["000000000003-7.batch"]
        elif outcome == "release":
            sp.release()
            assert (sp.samples, len(sp), sp.dropped_samples) == (17, 2, 20)
            assert sp.peek(300) == (b"c" * 100 + b"d" * 150, 17)
        else:
            sp.replace_oldest(b"r" * 40, count=4)  # 26 of the 30 taken
            assert (sp.samples, len(sp), sp.dropped_samples) == (11, 2, 0)
            assert batches(folder) == ["000000000002-4.batch", "000000000003-7.batch"]
            assert sp.peek(300) == (b"r" * 40 + b"d" * 150, 11)


def test_a_batch_released_stays_the_oldest(tmp_path):
    sp = Spool(tmp_path, max_bytes=10_000)
    sp.push(b"a", count=1)
    sp.push(b"b", count=2)
    assert sp.peek() == (b"a", 1)
    sp.release()  # the sink was down
    assert sp.peek() == (b"a", 1) and len(sp) == 2 and sp.samples == 3 and sp.dropped_samples == 0


def test_a_batch_removed_by_hand_is_skipped_and_no_longer_counted(tmp_path, caplog):
    sp = Spool(tmp_path, max_bytes=10_000)
    sp.push(b"aaaaa", count=1)
    sp.push(b"b", count=2)
    (tmp_path / "000000000000-1.batch").unlink()
    with caplog.at_level("ERROR", logger="flowstat.agent"):
        assert sp.peek() == (b"b", 2) and len(sp) == 1 and sp.samples == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"spool {tmp_path}: batch 000000000000-1.batch is gone (removed by hand?): skipped"
    ]
    sp.release()
    sp.max_bytes = 3
    sp.push(b"cc", count=3)  # 1 + 2 bytes: within the bound, the 5 bytes removed no longer counted
    assert sp.dropped_samples == 0 and len(sp) == 2
    small = Spool(tmp_path, max_bytes=1)  # the bound reaches a file removed by hand: dropped all the same
    (tmp_path / "000000000001-2.batch").unlink()
    small.push(b"d", count=4)
    assert small.dropped_samples == 2 + 3 and len(small) == 1 and small.samples == 4


@pytest.mark.parametrize("fails_at", ["open", "write"])
def test_a_batch_that_cannot_be_written_leaves_nothing_and_counts_nothing(tmp_path, monkeypatch, fails_at):
    """A full disk, as the file is made or as it is written: the error is the disk's, no file is
    left (not even the one being written), and the spool says what it said before."""
    sp = Spool(tmp_path, max_bytes=10_000)
    sp.push(b"kept", count=1)
    full = OSError(28, "No space left on device")

    class Full:
        def __init__(self, path, mode):
            if fails_at == "open":
                raise full
            self.f = open(path, mode)  # noqa: SIM115 - closed in __exit__

        def __enter__(self):
            return self

        def write(self, data):
            raise full

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr("flowstat.agent.spool.open", Full, raising=False)
    with pytest.raises(OSError) as raised:
        sp.push(b"more", count=5)
    assert raised.value is full
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000000-1.batch"]
    assert len(sp) == 1 and sp.samples == 1 and sp.dropped_samples == 0
    sp.push(b"next", count=2)  # numbered on: no gap where the write failed
    assert batches(tmp_path) == ["000000000000-1.batch", "000000000001-2.batch"]


def test_a_push_drops_as_many_batches_as_the_bound_needs_the_one_being_sent_first(tmp_path):
    sp = Spool(tmp_path, max_bytes=150)
    sp.push(b"a" * 100, count=1)
    assert sp.peek() == (b"a" * 100, 1)
    sp.push(b"b" * 40, count=2)  # 140: within the bound
    sp.push(b"c" * 120, count=3)  # 260: a (being sent) goes, then b
    assert batches(tmp_path) == ["000000000002-3.batch"] and sp.dropped_samples == 2 and sp.samples == 1 + 3
    sp.release()  # a was not taken either
    assert sp.dropped_samples == 1 + 2 and sp.samples == 3 and len(sp) == 1


def test_what_stays_is_flushed_to_disk_once(tmp_path, monkeypatch):
    """Batches are written without fsync (write-ahead, on the sampling thread); sync flushes those
    written since it last ran, and the folder, once each; one the sink took meanwhile needs none."""
    flushed: list[str] = []
    real = os.fsync
    monkeypatch.setattr(
        "flowstat.agent.spool.os.fsync", lambda fd: (flushed.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))
    )
    sp = Spool(tmp_path, max_bytes=10_000)
    for i in range(3):
        sp.push(b"x", count=i + 1)
    assert flushed == []
    sp.peek()
    sp.pop()  # the sink took the first
    sp.sync()
    folder = str(tmp_path)
    assert sorted(flushed) == sorted([folder, f"{folder}/000000000001-2.batch", f"{folder}/000000000002-3.batch"])
    flushed.clear()
    sp.sync()  # nothing new
    assert flushed == []
    sp.push(b"y", count=4)
    sp.sync()
    assert sorted(flushed) == sorted([folder, f"{folder}/000000000003-4.batch"])
    flushed.clear()
    Spool(tmp_path, max_bytes=10_000).sync()  # what an earlier agent left was flushed by it
    assert flushed == []


def test_batches_written_by_one_thread_and_sent_by_another_are_each_counted_once(tmp_path):
    """The sampling thread pushes (write-ahead) while the sink thread takes, sends and settles, the
    bound dropping some meanwhile: every sample ends delivered, dropped or still spooled, once."""
    import threading

    sp = Spool(tmp_path, max_bytes=250)  # two batches
    pushed = 3000
    ten_pushed = threading.Event()  # the sink starts behind, so the bound drops some on any machine

    def write():
        for i in range(pushed):
            sp.push(b"x" * 100, count=1 + i % 3)
            if i == 9:
                ten_pushed.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert ten_pushed.wait(30)
    delivered = 0
    turn = 0
    while writer.is_alive() or len(sp):
        item = sp.peek()
        if item is None:
            continue
        turn += 1
        if turn % 5 == 0:  # the sink is down now and then
            sp.release()
        else:
            sp.pop()
            delivered += item[1]
    writer.join()
    total = sum(1 + i % 3 for i in range(pushed))
    assert sp.dropped_samples > 0 and delivered + sp.dropped_samples + sp.samples == total
    assert sp.samples == 0 and batches(tmp_path) == []


def test_a_batch_removed_by_hand_while_batches_are_gathered_ends_the_gathering_not_the_send(tmp_path):
    """The batches before it go together; it is met as the oldest next time, and skipped then."""
    sp = Spool(tmp_path, max_bytes=10_000)
    for i, c in enumerate(b"abc"):
        sp.push(bytes([c]) * 10, count=i + 1)
    (tmp_path / "000000000001-2.batch").unlink()
    assert sp.peek(10_000) == (b"a" * 10, 1)
    sp.pop()
    assert sp.peek(10_000) == (b"c" * 10, 3) and sp.samples == 3


def test_at_most_take_max_batches_go_together(tmp_path):
    """They are read under the spool's lock, which a push waits for."""
    from flowstat.agent.spool import TAKE_MAX

    sp = Spool(tmp_path, max_bytes=10**9)
    for _ in range(TAKE_MAX + 3):
        sp.push(b"x", count=1)
    assert sp.peek(10**9) == (b"x" * TAKE_MAX, TAKE_MAX)
    sp.pop()
    assert sp.peek(10**9) == (b"x" * 3, 3)


def test_the_bound_counts_a_replaced_batch_beside_those_not_sent(tmp_path):
    sp = Spool(tmp_path, max_bytes=100)
    sp.push(b"a" * 40, count=4)
    sp.push(b"b" * 40, count=4)
    sp.push(b"c" * 10, count=1)
    assert sp.peek(80) == (b"a" * 40 + b"b" * 40, 8)
    sp.replace_oldest(b"r" * 30, count=3)  # 30 + 10 held
    sp.push(b"d" * 55, count=5)  # 95: nothing dropped
    assert sp.dropped_samples == 0
    sp.push(b"e" * 6, count=1)  # 101: the replaced batch goes
    assert sp.dropped_samples == 3 and sp.peek() == (b"c" * 10, 1)


def test_settling_an_empty_spool_changes_nothing(tmp_path):
    """pop and release with nothing handed out and nothing spooled (a sink runner's first settle)."""
    sp = Spool(tmp_path, max_bytes=100)
    sp.pop()
    sp.release()
    assert len(sp) == 0 and sp.samples == 0 and sp.peek() is None
    sp.push(b"a", count=1)
    assert sp.peek() == (b"a", 1)


# -- fresh batches before a backlog ----------------------------------------------------------------


def test_fresh_batches_go_before_the_backlog_and_settle_in_their_place(tmp_path):
    """peek(fresh_from=N): the batches numbered N on (written since the sink was last found down)
    before the older ones, as long as older ones wait; taken from the middle of the index, they
    leave it there (pop), keep their place (release), or leave what the store did not take in
    their place (replace_oldest); the backlog goes on in its order."""
    sp = Spool(tmp_path, max_bytes=10_000)
    assert sp.handed_out_from() == -1  # nothing handed out yet
    for i, c in enumerate(b"abcde"):
        sp.push(bytes([c]) * 10, count=i + 1)
    assert sp.next_number == 5
    assert sp.peek(25, fresh_from=3) == (b"d" * 10 + b"e" * 10, 9) and sp.handed_out_from() == 3
    sp.release()  # not taken: still in their place
    assert sp.peek(15, fresh_from=3) == (b"d" * 10, 4)
    sp.replace_oldest(b"D", count=2)  # the store took 2 of d's 4
    assert batches(tmp_path)[3] == "000000000003-2.batch" and sp.samples == 1 + 2 + 3 + 2 + 5
    assert sp.peek(100, fresh_from=3) == (b"D" + b"e" * 10, 7)
    sp.pop()
    assert batches(tmp_path) == ["000000000000-1.batch", "000000000001-2.batch", "000000000002-3.batch"]
    assert len(sp) == 3 and sp.samples == 6
    assert sp.peek(100, fresh_from=3) == (b"a" * 10 + b"b" * 10 + b"c" * 10, 6)  # none fresh: the oldest
    sp.pop()
    assert len(sp) == 0 and sp.samples == 0 and sp.peek(fresh_from=3) is None
    assert sp.handed_out_from() == -1  # all of it taken: nothing handed out
    sp.push(b"f", count=1)  # all of them fresh: in order
    sp.push(b"g", count=1)
    assert sp.peek(fresh_from=3) == (b"f", 1) and sp.handed_out_from() == 5


def test_fresh_batches_the_bound_drops_while_they_are_sent_are_counted_once(tmp_path):
    """The bound drops from the oldest: it reaches fresh batches being sent only once the backlog
    is gone; settled as delivered (pop) or dropped (release), once."""
    sp = Spool(tmp_path, max_bytes=250)
    sp.push(b"a" * 100, count=1)
    sp.push(b"b" * 100, count=2)
    assert sp.peek(fresh_from=1) == (b"b" * 100, 2)
    sp.push(b"c" * 100, count=4)  # drops a (the backlog, not being sent)
    assert sp.dropped_samples == 1 and sp.samples == 6
    sp.push(b"d" * 100, count=8)  # drops b, being sent
    assert batches(tmp_path) == ["000000000002-4.batch", "000000000003-8.batch"] and sp.samples == 14
    sp.release()
    assert sp.dropped_samples == 1 + 2 and sp.samples == 12 and len(sp) == 2
    assert sp.peek(fresh_from=3) == (b"d" * 100, 8)
    sp.push(b"e" * 100, count=16)  # drops c, the backlog
    sp.push(b"f" * 100, count=32)  # drops d, being sent
    sp.pop()  # the sink took d: delivered
    assert sp.dropped_samples == 1 + 2 + 4 and sp.samples == 48 and len(sp) == 2
    assert batches(tmp_path) == ["000000000004-16.batch", "000000000005-32.batch"]
