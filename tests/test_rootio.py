import numpy as np
import pytest
import uproot

from flowstat.harness.qcobjects import Kind, fill_gaussian, make_desc
from flowstat.harness.rootio import write_objects


@pytest.mark.parametrize("kind,shape", [(Kind.TH1F, (12,)), (Kind.TH2F, (7, 9)), (Kind.TH3F, (4, 5, 6))])
def test_histograms_read_back_bin_for_bin(tmp_path, kind, shape):
    desc = make_desc(f"{kind.name}_0", kind, shape)
    data, entries = fill_gaussian(desc, 500, np.random.default_rng(5))
    path = tmp_path / "v.root"
    write_objects(path, [(desc, data, entries)])
    with uproot.open(path) as f:
        h = f[desc.name]
        assert h.classname == kind.name
        np.testing.assert_array_equal(h.values(flow=True), data)
        assert [ax.edges()[0] for ax in h.axes] == [-5.0] * len(shape)


def test_thnf_is_written_flattened_with_its_shape_in_the_title(tmp_path):
    desc = make_desc("THnF_0", Kind.THnF, (4, 4, 4, 4))
    data, entries = fill_gaussian(desc, 300, np.random.default_rng(6))
    write_objects(tmp_path / "v.root", [(desc, data, entries)])
    with uproot.open(tmp_path / "v.root") as f:
        h = f["THnF_0"]
        assert "2x2x2x2" in h.title
        np.testing.assert_array_equal(h.values(), data.ravel())


def test_tree_is_a_real_ttree(tmp_path):
    desc = make_desc("TTree_0", Kind.TTree, (3, 10))
    data = np.arange(30, dtype=np.float32).reshape(3, 10)
    write_objects(tmp_path / "v.root", [(desc, data, 10.0)])
    with uproot.open(tmp_path / "v.root") as f:
        t = f["TTree_0"]
        assert t.classname == "TTree" and t.num_entries == 10
        np.testing.assert_array_equal(t["b2"].array(library="np"), data[2])


def test_write_is_atomic_and_leaves_no_temporary(tmp_path):
    desc = make_desc("h", Kind.TH1F, (5,))
    write_objects(tmp_path / "v.root", [(desc, np.ones(5, np.float32), 5.0)])
    write_objects(tmp_path / "v.root", [(desc, np.full(5, 2, np.float32), 10.0)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.root"]
    with uproot.open(tmp_path / "v.root") as f:
        assert f["h"].values(flow=True).sum() == 10
