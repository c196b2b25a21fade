import numpy as np
import pytest

from flowstat.harness import wire
from flowstat.harness.qcobjects import Kind, fill_gaussian, make_desc


@pytest.mark.parametrize(
    "kind,shape",
    [
        (Kind.TH1F, (250,)),
        (Kind.TH2F, (20, 30)),
        (Kind.TH3F, (5, 6, 7)),
        (Kind.THnF, (4, 4, 4, 4)),
        (Kind.TTree, (11, 20)),
    ],
)
def test_roundtrip_inline(kind, shape):
    desc = make_desc(f"{kind.name}_0", kind, shape)
    data, entries = fill_gaussian(desc, 100, np.random.default_rng(0))
    frames = wire.encode(desc, data, source=7, seq=42, entries=entries)
    assert len(frames) == 1
    header, got_desc, got = wire.decode(frames)
    assert (header.source, header.seq, header.entries, header.n_inputs) == (7, 42, entries, 1)
    assert got_desc == desc
    np.testing.assert_array_equal(got, data)
    assert header.payload_offset % 8 == 0


def test_large_payload_travels_as_its_own_frame_without_copy():
    desc = make_desc("big", Kind.TH1F, (100_000,))
    data = np.arange(100_000, dtype=np.float32)
    frames = wire.encode(desc, data, source=1, seq=0, entries=1.0)
    assert len(frames) == 2 and frames[1].base is data or np.shares_memory(frames[1], data)
    header, _, got = wire.decode([frames[0], frames[1].tobytes()])
    assert header.flags & wire.FLAG_PAYLOAD_FRAME
    np.testing.assert_array_equal(got, data)


def test_end_of_stream_marker():
    header, desc, data = wire.decode([wire.encode_eos(3, 1234)])
    assert header.flags & wire.FLAG_EOS and header.source == 3 and header.seq == 1234
    assert desc is None and data is None


@pytest.mark.parametrize("garbage", [b"", b"hello", b"\x00" * 100, b"FSQ1" + b"\xff" * 60, bytes(range(256)) * 4])
def test_garbage_is_a_wire_error_not_a_crash(garbage):
    with pytest.raises(wire.WireError):
        wire.decode([garbage])


def test_truncated_payload_is_detected():
    desc = make_desc("h", Kind.TH1F, (100,))
    frame = wire.encode(desc, np.zeros(100, np.float32), source=0, seq=0, entries=0.0)[0]
    with pytest.raises(wire.WireError, match="payload is"):
        wire.decode([frame[:-4]])


def test_array_must_match_descriptor():
    desc = make_desc("h", Kind.TH1F, (100,))
    with pytest.raises(wire.WireError):
        wire.encode(desc, np.zeros(99, np.float32), source=0, seq=0, entries=0.0)
    with pytest.raises(wire.WireError):
        wire.encode(desc, np.zeros(100, np.float64), source=0, seq=0, entries=0.0)
