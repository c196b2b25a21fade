import numpy as np
import pytest

from flowstat.harness.qcobjects import Kind, entries_of, fill_gaussian, make_desc, merge, shape_for_size

ALL_KINDS = list(Kind)


@pytest.mark.parametrize("kind", [k for k in Kind if k.is_histogram])
def test_histogram_merge_is_exactly_the_bin_wise_sum(kind):
    rng = np.random.default_rng(1)
    desc = make_desc("h", kind, shape_for_size(kind, 20_000))
    inputs = [fill_gaussian(desc, 1000, rng)[0] for _ in range(7)]
    merged = merge(desc, inputs)
    expected = np.sum([a.astype(np.float64) for a in inputs], axis=0)
    assert merged.dtype == np.float32 and merged.shape == desc.shape
    np.testing.assert_array_equal(merged.astype(np.float64), expected)
    assert entries_of(desc, merged) == 7 * 1000


def test_merge_does_not_touch_its_inputs():
    desc = make_desc("h", Kind.TH1F, (12,))
    a, b = np.ones(12, np.float32), np.full(12, 2, np.float32)
    a.flags.writeable = False  # inputs may be read-only network buffers
    merge(desc, [a, b])
    assert a.sum() == 12 and b.sum() == 24


def test_tree_merge_concatenates_entries_in_order():
    rng = np.random.default_rng(2)
    desc = make_desc("t", Kind.TTree, (11, 50))
    inputs = [fill_gaussian(desc, 0, rng)[0] for _ in range(3)]
    merged = merge(desc, inputs)
    assert merged.shape == (11, 150)
    np.testing.assert_array_equal(merged[:, 50:100], inputs[1])
    assert entries_of(desc, merged) == 150


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("size", [1000, 500_000, 5_000_000])
def test_object_size_sets_the_payload_size(kind, size):
    shape = shape_for_size(kind, size)
    nbytes = int(np.prod(shape)) * 4
    # rounding to whole bins per axis: within 15% for the sizes the thesis used
    assert abs(nbytes - size) / size < 0.15, (kind, shape, nbytes)


def test_gaussian_fill_puts_every_entry_in_a_cell():
    desc = make_desc("h", Kind.TH2F, (30, 30))
    data, entries = fill_gaussian(desc, 5000, np.random.default_rng(3))
    assert entries == 5000 and data.sum(dtype=np.float64) == 5000
    # Gaussian around 0: the central cells hold more than the edges
    assert data[14:16, 14:16].sum() > data[1:3, 1:3].sum()


def test_merge_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        merge(make_desc("h", Kind.TH1F, (5,)), [])
