"""Vectorised bit packing of b-bit indices (1 <= b <= 8).

Layout: index i occupies bits [i*b, (i+1)*b) of a little-endian bit stream (bit 0 of byte 0 first);
n indices take ceil(n*b/8) bytes and the unused high bits of the last byte are zero. b in {1, 2, 4, 8}
use byte-aligned shortcuts, other widths pack 8 indices into b bytes through one uint64 word — all paths
produce the same stream.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]


def packed_size(n: int, bits: int) -> int:
    return (n * bits + 7) // 8


def pack(idx: U8, bits: int) -> U8:
    """Pack uint8 indices (each < 2**bits) into ceil(n*bits/8) bytes."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bit width must be 1..8, got {bits}")
    idx = np.ascontiguousarray(idx, dtype=np.uint8)
    n = idx.size
    if bits == 8:
        return idx.copy()
    if bits == 1:
        return np.packbits(idx, bitorder="little")
    if bits in (2, 4):
        per = 8 // bits
        pad = (-n) % per
        if pad:
            idx = np.concatenate((idx, np.zeros(pad, np.uint8)))
        v = idx.reshape(-1, per)
        out = v[:, 0].copy()
        for k in range(1, per):
            out |= v[:, k] << np.uint8(k * bits)
        return out
    pad = (-n) % 8
    if pad:
        idx = np.concatenate((idx, np.zeros(pad, np.uint8)))
    g = idx.reshape(-1, 8).astype(np.uint64)
    g <<= np.arange(8, dtype=np.uint64) * np.uint64(bits)
    words = np.bitwise_or.reduce(g, axis=1).astype("<u8", copy=False)
    out = np.ascontiguousarray(words.view(np.uint8).reshape(-1, 8)[:, :bits]).ravel()
    return out[: packed_size(n, bits)]


def check_packed(buf: U8, bits: int, n: int) -> U8:
    """`buf` as a uint8 array after checking that it can hold exactly n indices of `bits` bits:
    ValueError if the width or the length is wrong or the padding bits of the last byte are not zero."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bit width must be 1..8, got {bits}")
    buf = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    need = packed_size(n, bits)
    if buf.size != need:
        raise ValueError(f"{n} indices of {bits} bits need {need} bytes, got {buf.size}")
    tail_bits = (n * bits) % 8
    if tail_bits and int(buf[-1]) >> tail_bits:
        raise ValueError("non-zero padding bits after the last index")
    return buf


def unpack(buf: U8, bits: int, n: int) -> U8:
    """Inverse of `pack`: n indices from exactly packed_size(n, bits) bytes. Raises ValueError if the
    length is wrong or the padding bits of the last byte are not zero."""
    buf = check_packed(buf, bits, n)
    if bits == 8:
        return buf.copy()
    if bits == 1:
        return np.unpackbits(buf, count=n, bitorder="little")
    if bits in (2, 4):
        per = 8 // bits
        mask = np.uint8((1 << bits) - 1)
        out = np.empty((buf.size, per), np.uint8)
        for k in range(per):
            np.bitwise_and(buf >> np.uint8(k * bits), mask, out=out[:, k])
        return out.ravel()[:n]
    groups = (n + 7) // 8
    full = np.zeros((groups, 8), np.uint8)
    flat = full[:, :bits]
    padded = np.zeros(groups * bits, np.uint8)
    padded[: buf.size] = buf
    flat[...] = padded.reshape(groups, bits)
    words = full.view("<u8").ravel()
    vals = (words[:, None] >> (np.arange(8, dtype=np.uint64) * np.uint64(bits))) & np.uint64((1 << bits) - 1)
    res: U8 = vals.astype(np.uint8).ravel()[:n]
    return res
