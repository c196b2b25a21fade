"""The wire format of QC objects between producers, mergers and the viewer.

One ZeroMQ message per object. Frame 0 is a little-endian header; the float32 payload follows
the header in the same frame (small objects: one copy is cheaper than a second frame) or comes
as frame 1 (large objects: sent and received without copying). The payload starts at an 8-byte
aligned offset, so ``numpy.frombuffer`` views it in place. Nothing here is ever unpickled.

Header::

    0  4s  magic b"FSQ1"
    4  B   kind (Kind; 0 for an end-of-stream marker)
    5  B   ndim
    6  H   flags (FLAG_*)
    8  I   source id (producer id, or merger index for merged objects)
    12 Q   seq (per-source sequence number; end-of-stream: number of objects sent)
    20 d   entries (histograms: sum of cells; trees: rows)
    28 d   t_sent (Unix time, s, the sender first tried to send the object: producers stamp their
           objects, mergers their results; 0 when not stamped, as end-of-stream markers)
    36 I   n_inputs (raw objects merged into this one; 1 for a producer's object)
    40 H   name length
    42 H   reserved
    44     ndim x u32 shape, ndim x (f64 low, f64 high) axis ranges (histograms only), name,
           zero padding to a multiple of 8, then the payload (inline objects)
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

import numpy as np

from .qcobjects import DTYPE, Kind, ObjectDesc

MAGIC = b"FSQ1"
FIXED = struct.Struct("<4sBBHIQddIHH")
STAMP = struct.Struct("<IQdd")  # source, seq, entries, t_sent: what a producer patches in a pooled object
RESTAMP = struct.Struct("<IQddI")  # the same and n_inputs: what a merger patches in its merged objects' header
OFF_SOURCE = 8
FLAG_EOS = 1  # end of stream: no more objects from this source
FLAG_PAYLOAD_FRAME = 2  # the payload is frame 1, not inline
FLAG_MERGED = 4  # a merger's output
KNOWN_FLAGS = FLAG_EOS | FLAG_PAYLOAD_FRAME | FLAG_MERGED
INLINE_LIMIT = 64 * 1024  # payloads above this travel as their own zero-copy frame
MAX_NDIM = 8
MAX_NAME = 256
MAGIC_U32 = int.from_bytes(MAGIC, "little")  # the magic as the header record reads it
_HEADER_NAMES = ["magic", "kind", "ndim", "flags", "source", "seq", "entries", "t_sent", "n_inputs", "name_len"]
_HEADER_FORMATS = ["<u4", "u1", "u1", "<u2", "<u4", "<u8", "<f8", "<f8", "<u4", "<u2"]
_HEADER_OFFSETS = [0, 4, 5, 6, 8, 12, 20, 28, 36, 40]


class WireError(ValueError):
    """A message that is not a valid flowstat QC object."""


class Header(NamedTuple):
    kind: int
    flags: int
    source: int
    seq: int
    entries: float
    t_sent: float
    n_inputs: int
    desc_key: bytes  # kind, rank, shape, axes and name: objects with equal keys merge
    payload_offset: int


def _align8(n: int) -> int:
    return (n + 7) & ~7


def descriptor_bytes(desc: ObjectDesc) -> bytes:
    name = desc.name.encode()
    parts = [struct.pack(f"<{len(desc.shape)}I", *desc.shape)]
    for lo, hi in desc.axes:
        parts.append(struct.pack("<dd", lo, hi))
    parts.append(name)
    raw = b"".join(parts)
    return raw + b"\0" * (_align8(FIXED.size + len(raw)) - FIXED.size - len(raw))


@functools.lru_cache(maxsize=64)
def header_records(length: int) -> np.dtype:
    """FIXED as a numpy record of ``length`` bytes: a block of messages of that length, joined, is an
    array of these, which parses every header of the block at once (Merger.on_batch)."""
    return np.dtype(
        {"names": _HEADER_NAMES, "formats": _HEADER_FORMATS, "offsets": _HEADER_OFFSETS, "itemsize": length}
    )


def encode_header(
    desc: ObjectDesc,
    *,
    source: int,
    seq: int,
    entries: float,
    n_inputs: int = 1,
    flags: int = 0,
    t_sent: float = 0.0,
    inline: bool,
    descriptor: bytes | None = None,
) -> bytes:
    """``descriptor``: descriptor_bytes(desc), when the caller keeps it (a merger sends the same one
    again and again)."""
    name_len = len(desc.name.encode())
    if name_len > MAX_NAME or len(desc.shape) > MAX_NDIM:
        raise WireError(f"object {desc.name!r}: name or rank too large for the wire format")
    if not inline:
        flags |= FLAG_PAYLOAD_FRAME
    fixed = FIXED.pack(
        MAGIC, int(desc.kind), len(desc.shape), flags, source, seq, entries, t_sent, n_inputs, name_len, 0
    )
    return fixed + (descriptor if descriptor is not None else descriptor_bytes(desc))


def encode(
    desc: ObjectDesc,
    data: np.ndarray,
    *,
    source: int,
    seq: int,
    entries: float,
    n_inputs: int = 1,
    flags: int = 0,
    t_sent: float = 0.0,
    descriptor: bytes | None = None,
) -> list:
    """Frames for one object: [header+payload] when small, [header, payload] when large."""
    if data.dtype != DTYPE or data.shape != desc.shape:
        raise WireError(
            f"object {desc.name!r}: array {data.dtype}{data.shape} does not match " f"descriptor float32{desc.shape}"
        )
    payload = np.ascontiguousarray(data)
    inline = payload.nbytes <= INLINE_LIMIT
    header = encode_header(
        desc,
        source=source,
        seq=seq,
        entries=entries,
        n_inputs=n_inputs,
        flags=flags,
        t_sent=t_sent,
        inline=inline,
        descriptor=descriptor,
    )
    if inline:
        return [header + payload.tobytes()]
    return [header, payload]


def encode_eos(source: int, count: int) -> bytes:
    """End-of-stream marker: ``count`` objects were sent by ``source`` (seq 0 .. count-1)."""
    return FIXED.pack(MAGIC, 0, 0, FLAG_EOS, source, count, 0.0, 0.0, 0, 0, 0)


def decode_header(buf) -> Header:
    """Parse and check frame 0. Raises WireError naming what is wrong."""
    if len(buf) < FIXED.size:
        raise WireError(f"message of {len(buf)} bytes is shorter than the {FIXED.size}-byte header")
    magic, kind, ndim, flags, source, seq, entries, t_sent, n_inputs, name_len, _ = FIXED.unpack_from(buf)
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if flags & ~KNOWN_FLAGS:
        raise WireError(f"unknown flags {flags:#x}")
    if flags & FLAG_EOS:
        if kind or ndim or name_len:
            raise WireError("end-of-stream marker with an object descriptor")
        return Header(0, flags, source, seq, 0.0, t_sent, 0, b"", FIXED.size)
    if kind not in Kind._value2member_map_ or not 1 <= ndim <= MAX_NDIM or name_len > MAX_NAME:
        raise WireError(f"bad kind {kind}, rank {ndim} or name length {name_len}")
    axes = ndim if kind != Kind.TTree else 0
    offset = _align8(FIXED.size + 4 * ndim + 16 * axes + name_len)
    if len(buf) < offset:
        raise WireError(f"header truncated: {len(buf)} bytes, descriptor needs {offset}")
    key = bytes(buf[4:6]) + bytes(buf[FIXED.size : offset])  # kind, rank, shape, axes, name
    return Header(kind, flags, source, seq, entries, t_sent, n_inputs, key, offset)


def parse_descriptor(key: bytes) -> ObjectDesc:
    """The ObjectDesc behind a header's descriptor key (devices cache this by key)."""
    kind, ndim = key[0], key[1]
    k = Kind(kind)
    naxes = ndim if k.is_histogram else 0
    fixed_len = 2 + 4 * ndim + 16 * naxes
    if k.is_histogram and k is not Kind.THnF and ndim != k.hist_ndim or k is Kind.TTree and ndim != 2:
        raise WireError(f"{k.name} with rank {ndim}")
    shape = struct.unpack_from(f"<{ndim}I", key, 2)
    if min(shape) < 1:
        raise WireError(f"descriptor with an empty axis: shape {shape}")
    axes = tuple(struct.unpack_from("<dd", key, 2 + 4 * ndim + 16 * i) for i in range(naxes))
    try:
        name = key[fixed_len:].rstrip(b"\0").decode()
    except UnicodeDecodeError as exc:
        raise WireError("object name is not UTF-8") from exc
    return ObjectDesc(name, k, tuple(shape), axes)


def payload_array(desc: ObjectDesc, header: Header, frames: list) -> np.ndarray:
    """A read-only float32 view of the payload, checked against the descriptor's size."""
    if header.flags & FLAG_PAYLOAD_FRAME:
        if len(frames) < 2:
            raise WireError(f"object {desc.name!r}: payload frame missing")
        buf, offset = frames[1], 0
    else:
        buf, offset = frames[0], header.payload_offset
    size = len(memoryview(buf)) - offset
    if size != desc.nbytes:
        raise WireError(f"object {desc.name!r}: payload is {size} bytes, descriptor says {desc.nbytes}")
    return np.frombuffer(buf, dtype=DTYPE, offset=offset).reshape(desc.shape)


def decode(frames: list) -> tuple[Header, ObjectDesc | None, np.ndarray | None]:
    """Decode a whole message (slow path for tests and tools; devices cache descriptors)."""
    header = decode_header(frames[0])
    if header.flags & FLAG_EOS:
        return header, None, None
    desc = parse_descriptor(header.desc_key)
    return header, desc, payload_array(desc, header, frames)
