"""The Merger class fed directly (no producer processes), its output read from a real socket."""

import numpy as np
import pytest
import zmq

from flowstat.harness import wire
from flowstat.harness.devices.merger import Merger
from flowstat.harness.qcobjects import Kind, fill_gaussian, make_desc


@pytest.fixture
def merger_and_output():
    ctx = zmq.Context()
    out = ctx.socket(zmq.PULL)
    port = out.bind_to_random_port("tcp://127.0.0.1")
    m = Merger({"node_id": "m", "index": 0, "producers": [10, 11, 12], "buffer_size": 100,
                "send_buffer": 100, "downstream_endpoint": f"tcp://127.0.0.1:{port}"})
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
    (header, got_desc, merged), = receive(out, 1)
    np.testing.assert_array_equal(merged, inputs[0] + inputs[1] + inputs[2])
    assert header.n_inputs == 3 and header.entries == 300 and header.flags & wire.FLAG_MERGED


def test_injected_gap_is_counted(merger_and_output):
    m, _ = merger_and_output
    desc = make_desc("TH1F_0", Kind.TH1F, (10,))
    z = np.zeros(10, np.float32)
    for seq in (0, 1, 2, 5, 6):  # 3 and 4 never come
        m.on_message(frame(desc, z, 11, seq))
    assert m.gaps == 2 and m.gap_events == 1 and m.reordered == 0
    m.on_message(frame(desc, z, 11, 4))  # late: a reordering
    assert m.reordered == 1
    assert m.received[1] == 6


def test_end_of_stream_reveals_objects_missing_at_the_tail(merger_and_output):
    m, _ = merger_and_output
    desc = make_desc("TH1F_0", Kind.TH1F, (10,))
    for seq in range(3):
        m.on_message(frame(desc, np.zeros(10, np.float32), 10, seq))
    m.on_message(wire.encode_eos(10, 5))  # the producer says it sent 5
    assert m.gaps == 2 and m.eos_count[0] == 5


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
    (header, got_desc, merged), = receive(out, 1)
    assert got_desc.shape == (11, 7) and header.entries == 7
    np.testing.assert_array_equal(merged, data)


def test_average_merge_time_covers_the_last_ten(merger_and_output):
    m, _ = merger_and_output
    desc = make_desc("TH1F_0", Kind.TH1F, (10,))
    for seq in range(15):
        for p in (10, 11, 12):
            m.on_message(frame(desc, np.zeros(10, np.float32), p, seq))
    assert m.merges == 15 and len(m.merge_times) == 10 and m.average_merge_time() > 0
