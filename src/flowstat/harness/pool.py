"""Pre-encoded objects a producer process sends over and over.

Filling a histogram costs far more than sending it; the thesis saw its production rate fall with
object size for that reason (section 5.2). A producer fills a small pool of distinct Gaussian
objects at start-up and cycles through it, so the harness loads the merger, not the producer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import wire
from .qcobjects import ObjectDesc, fill_gaussian

POOL_BYTES = 64 * 1024 * 1024  # memory a producer process may spend on its pool


@dataclass
class PooledObject:
    desc: ObjectDesc
    entries: float
    header: bytearray  # frame 0; for inline objects it holds the payload too
    payload: bytes | None  # frame 1 for large objects (sent without copying), else None

    @property
    def nbytes(self) -> int:
        return len(self.header) + (len(self.payload) if self.payload is not None else 0)


def build_pool(
    descs: list[ObjectDesc], entries: int, seed: int, variants: int | None = None
) -> list[list[PooledObject]]:
    """``pool[name_index][variant]``: a few distinct filled objects for each object name."""
    rng = np.random.default_rng(seed)
    per_object = max(d.nbytes for d in descs)
    if variants is None:
        variants = max(1, min(8, POOL_BYTES // (per_object * len(descs))))
    pool: list[list[PooledObject]] = []
    for desc in descs:
        row = []
        for _ in range(variants):
            data, n = fill_gaussian(desc, entries, rng)
            frames = wire.encode(desc, data, source=0, seq=0, entries=n)
            if len(frames) == 1:
                row.append(PooledObject(desc, n, bytearray(frames[0]), None))
            else:
                row.append(PooledObject(desc, n, bytearray(frames[0]), frames[1].tobytes()))
        pool.append(row)
    return pool
