"""Writing merged QC objects to a ROOT file with uproot, readable by ROOT and uproot alike.

TH1F, TH2F and TH3F are written as such. uproot cannot write THnF, so a THnF is written as a TH1F
over its flattened cells (row-major, flow cells included) whose title gives the real shape.
A TTree-like object is written as a real TTree, one float branch per branch.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import uproot
from uproot.writing import identify

from .qcobjects import DTYPE, Kind, ObjectDesc


def _axis(name: str, n_cells: int, lo: float, hi: float):
    return identify.to_TAxis(name, "", n_cells - 2, lo, hi)


def _histogram(desc: ObjectDesc, data: np.ndarray, entries: float):
    common = dict(fEntries=entries, fTsumw=entries, fTsumw2=entries, fTsumwx=0.0, fTsumwx2=0.0)
    if desc.kind is Kind.TH1F:
        (n,), ((lo, hi),) = desc.shape, desc.axes
        return identify.to_TH1x(desc.name, desc.name, data, fSumw2=None, fXaxis=_axis("xaxis", n, lo, hi), **common)
    if desc.kind is Kind.TH2F:
        (nx, ny), ((xl, xh), (yl, yh)) = desc.shape, desc.axes
        # ROOT stores multi-dimensional bins with x varying fastest.
        return identify.to_TH2x(
            desc.name,
            desc.name,
            np.ascontiguousarray(data.T).ravel(),
            fSumw2=None,
            fXaxis=_axis("xaxis", nx, xl, xh),
            fYaxis=_axis("yaxis", ny, yl, yh),
            fTsumwy=0.0,
            fTsumwy2=0.0,
            fTsumwxy=0.0,
            **common,
        )
    if desc.kind is Kind.TH3F:
        (nx, ny, nz), ((xl, xh), (yl, yh), (zl, zh)) = desc.shape, desc.axes
        return identify.to_TH3x(
            desc.name,
            desc.name,
            np.ascontiguousarray(data.T).ravel(),
            fSumw2=None,
            fXaxis=_axis("xaxis", nx, xl, xh),
            fYaxis=_axis("yaxis", ny, yl, yh),
            fZaxis=_axis("zaxis", nz, zl, zh),
            fTsumwy=0.0,
            fTsumwy2=0.0,
            fTsumwxy=0.0,
            fTsumwz=0.0,
            fTsumwz2=0.0,
            fTsumwxz=0.0,
            fTsumwyz=0.0,
            **common,
        )
    # THnF: flattened
    flat = data.ravel()
    title = f"THnF {'x'.join(str(b) for b in desc.bins)} bins, flattened row-major with flow cells"
    return identify.to_TH1x(
        desc.name,
        title,
        np.concatenate([[0], flat, [0]]).astype(DTYPE),
        fSumw2=None,
        fXaxis=identify.to_TAxis("xaxis", "", flat.size, 0.0, float(flat.size)),
        **common,
    )


def write_objects(path: str | Path, objects: list[tuple[ObjectDesc, np.ndarray, float]]) -> None:
    """Write objects to ``path`` atomically (a reader never sees a half-written file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with uproot.recreate(tmp) as f:
        for desc, data, entries in objects:
            if desc.kind is Kind.TTree:
                f.mktree(desc.name, {f"b{i}": np.float32 for i in range(desc.shape[0])})
                f[desc.name].extend({f"b{i}": data[i] for i in range(desc.shape[0])})
            else:
                f[desc.name] = _histogram(desc, data, entries)
    os.replace(tmp, path)
