"""The merger's batch path (Merger.on_batch, drain_input) against its one-message-at-a-time path.

The same messages go to two mergers: one takes them one by one (on_message), the other in batches.
Whatever a batch holds (malformed messages, strangers, gaps, end-of-stream markers, new names,
trees, large objects in two frames), both must end with the same counters and send the same merged
objects in the same order.
"""

import time

import numpy as np
import pytest
import zmq

from flowstat.harness import wire
from flowstat.harness.devices import merger as merger_module
from flowstat.harness.devices.merger import Merger, Multipart
from flowstat.harness.qcobjects import Kind, entries_of, fill_gaussian, make_desc

H1 = make_desc("TH1F_0", Kind.TH1F, (10,))
H1_OTHER = make_desc("TH1F_1", Kind.TH1F, (10,))  # same length, another name
H1_LONG_NAME = make_desc("TH1F_10", Kind.TH1F, (10,))  # same message length, longer name (padding)
H2 = make_desc("TH2F_0", Kind.TH2F, (4, 5))
TREE = make_desc("tree", Kind.TTree, (3, 4))
BIG = make_desc("big", Kind.TH1F, (20_000,))  # 80 kB: its payload travels as a frame of its own
RNG = np.random.default_rng(1)


class Pair:
    """Two mergers fed the same messages: ``one`` one by one, ``batched`` in batches."""

    def __init__(self, producers):
        self.ctx = zmq.Context()
        self.mergers, self.outputs = [], []
        for _ in range(2):
            out = self.ctx.socket(zmq.PULL)
            port = out.bind_to_random_port("tcp://127.0.0.1")
            self.outputs.append(out)
            self.mergers.append(
                Merger(
                    {
                        "node_id": "m",
                        "index": 0,
                        "producers": producers,
                        "buffer_size": 1000,
                        "send_buffer": 100_000,
                        "downstream_endpoint": f"tcp://127.0.0.1:{port}",
                    }
                )
            )
        self.one, self.batched = self.mergers
        self.pushers = []
        self.taken_at_once = 0  # objects the batched merger took a run at a time
        take_run = self.batched.take_run

        def counting(b, first, end):
            self.taken_at_once += end - first
            take_run(b, first, end)

        self.batched.take_run = counting

    def feed(self, msgs, batch=256):
        self.feed_one(msgs)
        for i in range(0, len(msgs), batch):
            self.batched.on_batch(msgs[i : i + batch])

    def feed_one(self, msgs):
        for msg in msgs:
            if isinstance(msg, Multipart):
                self.one.on_message(msg.frames[0], msg.frames[1:])
            else:
                self.one.on_message(msg)
            self.one.record_latency()

    def merged(self, m, out):
        m.flush()
        got = []
        while out.poll(200):
            header, desc, data = wire.decode(out.recv_multipart())
            got.append((header._replace(t_sent=0.0), desc, data.copy()))
        return got

    def assert_same(self):
        a, b = self.one, self.batched
        same = {k: v for k, v in a.counters().items() if k != "receive_overload_events"}  # the socket's business
        assert same == {k: v for k, v in b.counters().items() if k != "receive_overload_events"}
        for field in ("expected", "received", "merged_in"):
            np.testing.assert_array_equal(getattr(a.seq, field), getattr(b.seq, field), err_msg=field)
        assert a.seq.eos_count == b.seq.eos_count
        # every object's wait is measured, once
        assert (
            a.latency.total()["input_latency_objects"]
            == b.latency.total()["input_latency_objects"]
            == a.objects_received
        )
        got_a, got_b = (self.merged(m, out) for m, out in zip(self.mergers, self.outputs, strict=False))
        assert len(got_a) == len(got_b) > 0
        for (ha, da, xa), (hb, db, xb) in zip(got_a, got_b, strict=False):
            assert ha == hb and da == db
            np.testing.assert_array_equal(xa, xb)
            if da.kind.is_histogram:  # exact: the cells add up to the entries declared
                assert entries_of(da, xb) == hb.entries
        return got_b

    def pusher(self, inproc: str | None = None):
        """A PUSH socket to the batched merger (closed with the pair, even when a test fails); over
        ``inproc`` (an address the merger's data socket binds too) in the merger's own context."""
        if inproc:
            self.batched.data.bind(inproc)
        push = (self.batched.ctx if inproc else self.ctx).socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(inproc or self.batched.data_endpoint)
        self.pushers.append(push)
        return push

    def close(self):
        for push in self.pushers:
            push.close(0)
        for m in self.mergers:
            m.out.close(0)
            m.data.close(0)
            m.control.close(0)
            m.ctx.term()
        for out in self.outputs:
            out.close(0)
        self.ctx.term()


@pytest.fixture
def pair_of(request):
    made = []

    def make(producers):
        made.append(Pair(producers))
        return made[-1]

    yield make
    for p in made:
        p.close()


def obj(desc, source, seq, entries=None, t_sent=None):
    data = (
        fill_gaussian(desc, 20, RNG)[0] if desc.kind.is_histogram else RNG.standard_normal(desc.shape, dtype=np.float32)
    )
    if entries is None:
        entries = entries_of(desc, data)
    frames = wire.encode(
        desc, data, source=source, seq=seq, entries=entries, t_sent=time.time() if t_sent is None else t_sent
    )
    if len(frames) == 1:
        return frames[0]
    return Multipart([frames[0], frames[1].tobytes()])


def rounds(desc, producers, seqs):
    return [obj(desc, p, s) for s in seqs for p in producers]


def test_a_batch_of_good_objects_is_taken_at_once_and_merged_exactly(pair_of):
    pair = pair_of([10, 11, 12])
    pair.feed(rounds(H1, [10, 11, 12], range(100)))
    got = pair.assert_same()
    assert pair.batched.merges == 100 and pair.batched.objects_merged == 300 and pair.batched.seq.gaps == 0
    assert pair.taken_at_once == 300 - 1  # all but the first: its name was new
    assert all(h.n_inputs == 3 for h, _, _ in got)


@pytest.mark.parametrize("batch", [256, 16, 1])
def test_a_mixed_batch_gives_what_one_message_at_a_time_gives(pair_of, batch):
    producers = [10, 11, 12]
    pair = pair_of(producers)
    good = rounds(H1, producers, range(15))
    bad_magic = b"XXXX" + good[0][4:]  # of the common length, as the next one
    unknown_flags = bytearray(good[1])
    unknown_flags[6] = 0x40
    msgs = [
        *good[:30],
        b"\x00garbage",  # short
        bad_magic,
        bytes(unknown_flags),
        good[0][:-8],  # truncated
        obj(H1, 99, 0),  # a stranger
        *good[30:45],
        obj(H1_OTHER, 10, 15),
        obj(H1_OTHER, 11, 15),  # a new name in the middle ...
        obj(H1, 12, 15),
        obj(H1_OTHER, 12, 16),  # ... and again, known by now
        obj(H1, 10, 18),  # producer 10 skips 16 and 17
        obj(H1, 11, 16),
        obj(H1, 11, 17),
        wire.encode_eos(12, 20),  # producer 12 says it sent 20: 17, 18 and 19 are missing
        obj(H1, 10, 16),  # late: a reordering
        obj(H2, 10, 19),
        obj(H2, 11, 18),  # another length
        obj(TREE, 12, 17),  # a tree (after its producer's end-of-stream marker: taken all the same)
        obj(BIG, 10, 20),
        obj(BIG, 11, 19),  # two frames
        obj(H1, 11, 20),
        *rounds(H1, [10, 11], range(21, 50)),
        obj(H1_LONG_NAME, 10, 50),
        obj(H1_LONG_NAME, 11, 50),
        obj(H1_LONG_NAME, 12, 18),
        *rounds(H1_LONG_NAME, [10, 11], range(51, 54)),
    ]
    assert len(bad_magic) == len(good[0]) == len(unknown_flags) and len(msgs) <= 256
    pair.feed(msgs, batch)
    pair.assert_same()
    m = pair.batched
    assert (m.malformed, m.unexpected, m.seq.gaps, m.seq.gap_events, m.seq.reordered, m.seq.eos_seen) == (
        4,
        1,
        5,
        1,
        1,
        1,
    )
    assert m.objects_received == len(msgs) - 5 - 1
    if batch >= merger_module.MIN_BATCH:  # the good ones of known names went the batch way
        assert pair.taken_at_once >= (100 if batch == 256 else 50)


def test_a_batch_of_the_usual_name_with_a_stranger_and_a_gap(pair_of):
    """Every message has the usual header words (Merger.match_usual): producer and sequence still count."""
    pair = pair_of([10, 11])
    first = rounds(H1, [10, 11], range(20))
    then = rounds(H1, [10, 11], range(20, 40))
    then[5] = obj(H1, 12, 0)  # a stranger in place of producer 11's seq 22
    del then[10]  # and producer 10's seq 25 is lost
    pair.feed(first + then, batch=len(first))
    pair.assert_same()
    m = pair.batched
    assert (m.unexpected, m.seq.gaps, m.seq.gap_events, m.objects_received) == (1, 2, 2, 78)
    assert pair.taken_at_once == 78 - 1


def test_end_of_stream_in_the_middle_of_a_batch_sees_only_what_came_before(pair_of):
    pair = pair_of([10, 11])
    msgs = [
        *rounds(H1, [10, 11], range(5)),
        wire.encode_eos(10, 5),
        wire.encode_eos(11, 7),
        obj(H1, 11, 5),
        obj(H1, 11, 6),
    ]
    pair.feed(msgs)
    pair.assert_same()
    assert pair.batched.seq.gaps == 2 and pair.batched.seq.eos_count == [5, 7]


def test_merges_that_span_batches(pair_of):
    producers = list(range(300))  # more than a batch: every merge spans two or three
    pair = pair_of(producers)
    msgs = rounds(H1, producers, range(3))
    msgs[400], msgs[401] = msgs[401], msgs[400]  # two producers swap places: no reordering within one
    pair.feed(msgs)
    pair.assert_same()
    assert pair.batched.merges == 3 and pair.batched.seq.gaps == 0 and pair.batched.seq.reordered == 0
    assert pair.taken_at_once == 900 - 1


@pytest.mark.parametrize("batch", [1, 7, 64, 256])
def test_several_names_interleaved_in_any_batch_size(pair_of, batch):
    producers = [1, 2, 3, 4]
    pair = pair_of(producers)
    names = [H1, H1_OTHER, H1_LONG_NAME]
    msgs, seq = [], dict.fromkeys(producers, 0)
    for _ in range(600):
        p = producers[int(RNG.integers(4))]
        msgs.append(obj(names[seq[p] % 3], p, seq[p]))
        seq[p] += 1
    pair.feed(msgs, batch)
    pair.assert_same()
    assert pair.batched.merges > 100
    assert pair.taken_at_once > (500 if batch >= merger_module.MIN_BATCH else -1)


def test_received_from_the_socket_in_batches(pair_of):
    """drain_input: multipart messages and oddities read from a real socket, then taken in order."""
    pair = pair_of([10, 11])
    msgs = [
        *rounds(H1, [10, 11], range(300)),
        obj(BIG, 10, 300),
        obj(BIG, 11, 300),
        b"junk",
        *rounds(H1, [10, 11], range(301, 400)),
        obj(TREE, 10, 400),
        obj(TREE, 11, 400),
        wire.encode_eos(10, 401),
        wire.encode_eos(11, 401),
    ]
    m = pair.batched
    # Over inproc, a message sent is already in the merger's queue: all of them are there before it
    # reads, so the batches it reads are full whatever the speed of ZeroMQ's I/O threads.
    push = pair.pusher("inproc://batches")
    for msg in msgs:
        push.send_multipart(msg.frames if isinstance(msg, Multipart) else [msg])
    deadline = time.monotonic() + 10
    while m.objects_received + m.malformed + m.seq.eos_seen < len(msgs) and time.monotonic() < deadline:
        if m.data.poll(100):
            m.drain_input()
    pair.feed_one(msgs)
    got = pair.assert_same()
    assert (m.malformed, m.seq.eos_seen, m.seq.gaps, m.objects_received) == (1, 2, 0, 802)
    assert pair.taken_at_once > 700
    names = [d.name for _, d, _ in got]
    assert names.count("big") == 1 and names.count("tree") == 1 and names.count("TH1F_0") == 399


def test_a_turn_of_reading_ends_in_time_for_the_control_socket(pair_of, monkeypatch):
    """However much is queued, a turn stops after TURN_S (here: after its first batch), and a
    turn that did not empty the queue is a receive overload."""
    producers = list(range(8))
    pair = pair_of(producers)
    m = pair.batched
    # Over inproc, a message sent is already in the merger's queue: all 800 are queued before it reads.
    push = pair.pusher("inproc://turn")
    for msg in rounds(H1, producers, range(100)):
        push.send(msg)
    monkeypatch.setattr(merger_module, "TURN_S", 0.0)
    m.drain_input()
    assert m.objects_received == 256 and m.receive_overloaded() and m.receive_overload_events == 1
    monkeypatch.setattr(merger_module, "TURN_S", 10.0)
    m.drain_input()  # the other 544, in one turn: it ends when the queue is empty
    assert m.objects_received == 800 and not m.receive_overloaded() and m.merges == 100
    # Over, but each monitor is told once that it happened since it last asked; check-state says now.
    flags = lambda client: m.answer(client, "get-metrics", {"command": "get-metrics"}, None)[
        "receive_buffer_overloaded"
    ]  # noqa: E731
    assert [flags(b"agent-a"), flags(b"agent-a"), flags(b"agent-b"), flags(b"agent-b")] == [True, False, True, False]
    assert m.answer(b"agent-c", "check-state", {"command": "check-state"}, None)["receive_buffer_overloaded"] is False
