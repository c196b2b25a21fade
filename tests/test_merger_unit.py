"""The Merger class fed directly (no producer processes), its output read from a real socket."""

import numpy as np
import pytest
import zmq

from flowstat.harness import wire
from flowstat.harness.devices.merger import MAX_SEQ, MIN_BATCH, Merger
from flowstat.harness.qcobjects import Kind, fill_gaussian, make_desc


@pytest.fixture
def merger_and_output():
    ctx = zmq.Context()
    out = ctx.socket(zmq.PULL)
    port = out.bind_to_random_port("tcp://127.0.0.1")
    m = Merger(
        {
            "node_id": "m",
            "index": 0,
            "producers": [10, 11, 12],
            "buffer_size": 100,
            "send_buffer": 100,
            "downstream_endpoint": f"tcp://127.0.0.1:{port}",
        }
    )
    yield m, out
    m.out.close(0)
    m.data.close(0)
    m.control.close(0)
    m.ctx.term()
    out.close(0)
    ctx.term()


def frame(desc, data, source, seq, entries=None):
    if entries is None:
        entries = float(data.sum(dtype=np.float64))
    return wire.encode(desc, data, source=source, seq=seq, entries=entries)[0]


def receive(out, n):
    got = []
    for _ in range(n):
        assert out.poll(5000), "merged object did not arrive"
        got.append(wire.decode(out.recv_multipart()))
    return got


def test_merges_when_it_holds_one_object_per_producer(merger_and_output):
    m, out = merger_and_output
    desc = make_desc("TH1F_0", Kind.TH1F, (50,))
    rng = np.random.default_rng(0)
    inputs = [fill_gaussian(desc, 100, rng)[0] for _ in range(3)]
    m.on_message(frame(desc, inputs[0], 10, 0))
    m.on_message(frame(desc, inputs[1], 11, 0))
    assert m.merges == 0 and m.objects_held() == 2
    m.on_message(frame(desc, inputs[2], 12, 0))
    assert m.merges == 1 and m.objects_held() == 0 and len(m.merge_times) == 1
    ((header, got_desc, merged),) = receive(out, 1)
    np.testing.assert_array_equal(merged, inputs[0] + inputs[1] + inputs[2])
    assert header.n_inputs == 3 and header.entries == 300 and header.flags & wire.FLAG_MERGED


def test_injected_gap_is_counted(merger_and_output):
    m, _ = merger_and_output
    desc = make_desc("TH1F_0", Kind.TH1F, (10,))
    z = np.zeros(10, np.float32)
    for seq in (0, 1, 2, 5, 6):  # 3 and 4 never come
        m.on_message(frame(desc, z, 11, seq))
    assert m.seq.gaps == 2 and m.seq.gap_events == 1 and m.seq.reordered == 0
    m.on_message(frame(desc, z, 11, 4))  # late: a reordering
    assert m.seq.reordered == 1
    assert m.seq.received[1] == 6


def test_end_of_stream_reveals_objects_missing_at_the_tail(merger_and_output):
    m, _ = merger_and_output
    desc = make_desc("TH1F_0", Kind.TH1F, (10,))
    for seq in range(3):
        m.on_message(frame(desc, np.zeros(10, np.float32), 10, seq))
    m.on_message(wire.encode_eos(10, 5))  # the producer says it sent 5
    assert m.seq.gaps == 2 and m.seq.eos_count[0] == 5


def test_garbage_and_strangers_are_counted_and_dropped(merger_and_output):
    m, _ = merger_and_output
    desc = make_desc("TH1F_0", Kind.TH1F, (10,))
    m.on_message(b"\x00garbage")
    m.on_message(frame(desc, np.zeros(10, np.float32), 99, 0))  # producer 99 is not ours
    m.on_message(frame(desc, np.zeros(10, np.float32), 10, 0)[:-8])  # truncated
    assert m.malformed == 2 and m.unexpected == 1 and m.objects_received == 0


def test_flush_merges_incomplete_groups(merger_and_output):
    m, out = merger_and_output
    desc = make_desc("t", Kind.TTree, (11, 7))
    data = np.arange(77, dtype=np.float32).reshape(11, 7)
    m.on_message(frame(desc, data, 10, 0, entries=7.0))
    m.flush()
    ((header, got_desc, merged),) = receive(out, 1)
    assert got_desc.shape == (11, 7) and header.entries == 7
    np.testing.assert_array_equal(merged, data)


def test_average_merge_time_covers_the_last_ten(merger_and_output):
    m, _ = merger_and_output
    desc = make_desc("TH1F_0", Kind.TH1F, (10,))
    for seq in range(15):
        for p in (10, 11, 12):
            m.on_message(frame(desc, np.zeros(10, np.float32), p, seq))
    assert m.merges == 15 and len(m.merge_times) == 10 and m.average_merge_time() > 0


# -- sequence checks, exactly ---------------------------------------------------------------------
# Each case runs both ways the merger takes objects: one message at a time (on_message) and a batch
# parsed at once (on_batch, MIN_BATCH messages or more), whose sequence check falls back to the
# one-at-a-time check when a run of objects does not simply continue every producer's sequence.
# Every case starts with PREFIX: seq 0..10 from each of the three producers (33 objects, 11 merges).
H = make_desc("TH1F_0", Kind.TH1F, (10,))
PREFIX = [(p, s) for s in range(11) for p in (10, 11, 12)]


def feed(m, way, objects):
    """``objects``: (producer, seq) pairs, or ready-made messages (end-of-stream markers)."""
    msgs = [frame(H, np.ones(10, np.float32), *o) if isinstance(o, tuple) else o for o in objects]
    if way == "batch":
        assert len(msgs) >= MIN_BATCH
        m.on_batch(msgs)
    else:
        for msg in msgs:
            m.on_message(msg)


def sequence_state(m):
    return {
        "gaps": m.seq.gaps,
        "gap_events": m.seq.gap_events,
        "reordered": m.seq.reordered,
        "expected": m.seq.expected.tolist(),
        "received": m.seq.received.tolist(),
    }


WAYS = pytest.mark.parametrize("way", ["one", "batch"])


@WAYS
def test_a_clean_prefix_continues_every_sequence(merger_and_output, way):
    m, _ = merger_and_output
    one_by_one = []  # objects checked one at a time: a batch that continues every sequence needs none
    check = m.seq.check_sequence
    m.seq.check_sequence = lambda local, seq: (one_by_one.append(seq), check(local, seq))
    feed(m, way, PREFIX)
    assert one_by_one == []
    assert sequence_state(m) == {
        "gaps": 0,
        "gap_events": 0,
        "reordered": 0,
        "expected": [11, 11, 11],
        "received": [11, 11, 11],
    }
    assert m.merges == 11 and m.seq.merged_in.tolist() == [11, 11, 11] and m.objects_received == 33
    m.on_message(frame(H, np.ones(10, np.float32), 10, 11))  # the next one, on its own: no gap
    m.on_message(frame(H, np.ones(10, np.float32), 11, 12))  # one skipped
    assert (m.seq.gaps, m.seq.gap_events, m.seq.expected.tolist()) == (1, 1, [12, 13, 11])


@WAYS
def test_a_gap_of_one(merger_and_output, way):
    m, _ = merger_and_output
    feed(m, way, PREFIX + [(11, 12), (11, 13)])  # 11 never comes
    assert sequence_state(m) == {
        "gaps": 1,
        "gap_events": 1,
        "reordered": 0,
        "expected": [11, 14, 11],
        "received": [11, 13, 11],
    }


@WAYS
def test_a_duplicate_is_a_reordering_and_leaves_the_sequence_where_it_was(merger_and_output, way):
    m, _ = merger_and_output
    feed(m, way, PREFIX + [(12, 10), (12, 11)])
    assert sequence_state(m) == {
        "gaps": 0,
        "gap_events": 0,
        "reordered": 1,
        "expected": [11, 11, 12],
        "received": [11, 11, 13],
    }


@WAYS
def test_a_late_object_is_a_reordering_not_a_second_gap(merger_and_output, way):
    m, _ = merger_and_output
    feed(m, way, PREFIX + [(11, 14), (11, 12), (11, 15)])  # 11, 12, 13 skipped; 12 comes late
    assert sequence_state(m) == {
        "gaps": 3,
        "gap_events": 1,
        "reordered": 1,
        "expected": [11, 16, 11],
        "received": [11, 14, 11],
    }


@WAYS
def test_a_producers_first_object_must_be_seq_0(merger_and_output, way):
    m, _ = merger_and_output
    late_start = [(p, s) for s in range(11) for p in (10, 11)] + [(12, s) for s in range(2, 14)]
    feed(m, way, late_start)
    assert sequence_state(m) == {
        "gaps": 2,
        "gap_events": 1,
        "reordered": 0,
        "expected": [11, 11, 14],
        "received": [11, 11, 12],
    }


@WAYS
def test_end_of_stream_declared_against_received(merger_and_output, way):
    m, _ = merger_and_output
    # one more declared than received (a lost tail of one), one fewer, and as many
    feed(m, way, PREFIX + [wire.encode_eos(10, 12), wire.encode_eos(11, 10)])
    assert (m.seq.gaps, m.seq.eos_seen, m.seq.eos_count, m.all_ended()) == (1, 2, [12, 10, None], False)
    m.on_message(wire.encode_eos(12, 11))
    assert (m.seq.gaps, m.seq.eos_seen, m.seq.eos_count, m.all_ended()) == (1, 3, [12, 10, 11], True)
    m.on_message(wire.encode_eos(10, 14))  # said again, and otherwise: counted once, the last word kept
    assert (m.seq.gaps, m.seq.eos_seen, m.seq.eos_count) == (4, 3, [14, 10, 11])
    assert m.seq.gap_events == 0 and m.seq.received.tolist() == [11, 11, 11]


@WAYS
def test_sequence_numbers_up_to_max_seq_are_taken_and_max_seq_is_malformed(merger_and_output, way):
    m, _ = merger_and_output
    feed(m, way, PREFIX + [(10, MAX_SEQ - 1), (11, MAX_SEQ)])
    assert m.malformed == 1
    assert sequence_state(m) == {
        "gaps": MAX_SEQ - 1 - 11,
        "gap_events": 1,
        "reordered": 0,
        "expected": [MAX_SEQ, 11, 11],
        "received": [12, 11, 11],
    }


@WAYS
def test_per_producer_counts_received_and_merged_in(merger_and_output, way):
    m, _ = merger_and_output
    feed(m, way, PREFIX + [(10, 11), (10, 12)])  # two more from one producer: held, not merged
    assert m.seq.received.tolist() == [13, 11, 11] and m.seq.merged_in.tolist() == [11, 11, 11]
    assert m.objects_held() == 2 and m.merges == 11 and m.objects_merged == 33
    m.flush()
    assert m.seq.merged_in.tolist() == [13, 11, 11] and m.merges == 12 and m.objects_merged == 35
    assert m.counters()["sequence_gaps"] == 0 and m.counters()["objects_received"] == 35


def test_gaps_and_reorderings_add_up_over_several_events(merger_and_output):
    m, _ = merger_and_output
    feed(m, "one", PREFIX + [(11, 13), (11, 17), (11, 12), (11, 14)])  # two gaps (2 and 3), two late
    assert (m.seq.gaps, m.seq.gap_events, m.seq.reordered) == (2 + 3, 2, 2)


def test_the_log_names_the_merger_the_producer_and_the_sequence(merger_and_output, caplog):
    m, _ = merger_and_output
    with caplog.at_level("ERROR", logger="flowstat.merger"):
        feed(m, "one", PREFIX + [(11, 13), (11, 12)])
        m.on_message(wire.encode_eos(12, 14))
    assert [r.getMessage() for r in caplog.records] == [
        "m: producer 11 skipped from seq 11 to 13",
        "m: producer 11 sent seq 12 after 13",
        "m: producer 12 ended at 14 objects, 11 received",
    ]


def test_a_batch_checks_sequences_near_max_seq_exactly(merger_and_output):
    """Near 2**62 a float64 cannot tell seq n from n + 1: the batch check must compare integers."""
    m, _ = merger_and_output
    feed(m, "one", PREFIX + [(10, MAX_SEQ - 3)])
    assert m.seq.expected.tolist() == [MAX_SEQ - 2, 11, 11]
    feed(m, "batch", [(10, MAX_SEQ - 1)] + [(p, s) for s in range(11, 11 + MIN_BATCH) for p in (11, 12)])
    assert (m.seq.gaps, m.seq.gap_events) == (MAX_SEQ - 3 - 11 + 1, 2)
