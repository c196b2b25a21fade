"""QC objects: histograms with float32 bins (TH1F, TH2F, TH3F, THnF) and a TTree-like table.

An object is a descriptor (name, kind, shape, axis ranges) plus one float32 array. Histogram
arrays include the under/overflow bins of every axis, so the sum of all cells equals the number
of entries filled and merging is an element-wise sum. A TTree is ``branches x entries`` and merges
by concatenating entries.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import boost_histogram as bh
import numpy as np

DTYPE = np.dtype("<f4")
AXIS_RANGE = (-5.0, 5.0)  # Gaussian(0, 1) fills: a little lands in the flow bins, as in ROOT
DEFAULT_TREE_BRANCHES = 11  # thesis section 5.3: 11 branches


class Kind(enum.IntEnum):
    TH1F = 1
    TH2F = 2
    TH3F = 3
    THnF = 4
    TTree = 5

    @property
    def is_histogram(self) -> bool:
        return self is not Kind.TTree

    @property
    def hist_ndim(self) -> int:
        return {Kind.TH1F: 1, Kind.TH2F: 2, Kind.TH3F: 3, Kind.THnF: 4}.get(self, 0)


KIND_NAMES = {k.name: k for k in Kind}


@dataclass(frozen=True)
class ObjectDesc:
    """What identifies an object on the wire; objects merge only with equal descriptors."""

    name: str
    kind: Kind
    shape: tuple[int, ...]  # array shape (histograms: bins + 2 flow cells per axis)
    axes: tuple[tuple[float, float], ...]  # (low, high) per histogram axis; () for a TTree

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE.itemsize

    @property
    def bins(self) -> tuple[int, ...]:
        return tuple(n - 2 for n in self.shape) if self.kind.is_histogram else self.shape


def shape_for_size(kind: Kind, size_bytes: int, branches: int = DEFAULT_TREE_BRANCHES) -> tuple[int, ...]:
    """Array shape whose float32 payload is about ``size_bytes`` (thesis sections 5.2-5.3)."""
    cells = max(1, size_bytes // DTYPE.itemsize)
    if kind is Kind.TTree:
        return (branches, max(1, cells // branches))
    ndim = kind.hist_ndim
    per_axis = max(3, round(cells ** (1.0 / ndim)))  # at least one real bin besides the flow cells
    return (per_axis,) * ndim


def make_desc(name: str, kind: Kind, shape: tuple[int, ...]) -> ObjectDesc:
    axes = (AXIS_RANGE,) * len(shape) if kind.is_histogram else ()
    return ObjectDesc(name, kind, tuple(int(n) for n in shape), axes)


def fill_gaussian(desc: ObjectDesc, entries: int, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """A freshly filled object: Gaussian(0, 1) values, ``entries`` of them.

    Returns the float32 array and its entry count (histograms: the sum of all cells).
    """
    if desc.kind is Kind.TTree:
        branches, n = desc.shape
        return rng.standard_normal((branches, n), dtype=np.float32), float(n)
    axes = [bh.axis.Regular(n - 2, lo, hi) for n, (lo, hi) in zip(desc.shape, desc.axes, strict=False)]
    hist = bh.Histogram(*axes, storage=bh.storage.Double())
    hist.fill(*rng.standard_normal((len(axes), entries)))
    cells = np.ascontiguousarray(hist.view(flow=True), dtype=DTYPE)
    return cells, float(entries)


def merge(desc: ObjectDesc, arrays: list[np.ndarray]) -> np.ndarray:
    """Merge objects sharing ``desc``: the bin-wise sum of histograms, the concatenation of trees.

    The result is a new array; inputs are untouched (they may be read-only network buffers).
    """
    if not arrays:
        raise ValueError("merge needs at least one object")
    if desc.kind is Kind.TTree:
        return np.concatenate(arrays, axis=1)
    out = np.array(arrays[0], dtype=DTYPE, copy=True)
    for arr in arrays[1:]:
        np.add(out, arr, out=out)
    return out


def entries_of(desc: ObjectDesc, data: np.ndarray) -> float:
    """Entries an array holds: the exact cell total of a histogram, the row count of a tree."""
    if desc.kind is Kind.TTree:
        return float(data.shape[1])
    return float(data.sum(dtype=np.float64))
