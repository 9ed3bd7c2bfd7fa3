"""Randomized Hadamard transform (docs/design.md §8): zero-pad to D = 2**n, flip signs with a seeded ±1
vector, apply the orthonormal Walsh–Hadamard transform H_D / sqrt(D); 1, 2 or 3 such rotations composed,
each with its own signs. Only the seed crosses the wire.

Fast exact FWHT in numpy. H_D = H_{2^m1} ⊗ H_{2^m2} ⊗ ... (Sylvester), so the transform is a sequence of
small dense Hadamard contractions, one per factor, each applied along one axis of the vector viewed as a
(left, 2^m, right) array; a contraction is one BLAS matmul over the whole vector (one memory pass) instead
of m radix-2 passes. Factors of 2^4 were fastest here (bench/quant.py compares against the textbook
radix-2 loop). Vectors larger than `_BLOCK` are cache-blocked: the inner factors run chunk by chunk on
cache-resident rows, then the outer factors stream once each. The 1/sqrt(D) normalisation is folded
into the small matrices. H is symmetric and orthonormal, so the same function is its own inverse.

Signs come from PCG64's raw output (`random_raw`), which numpy guarantees stable across versions, seeded
by SeedSequence((seed, stream, index)): the same header decodes identically anywhere.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.floating]

STREAM_ROTATION = 1
STREAM_MASK = 2
STREAM_QJL = 3
MAX_ROTATIONS = 3

_FACTOR_BITS = 4
_BLOCK_BITS = 16  # 2^16 elements per cache block (256 KiB in float32)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@lru_cache(maxsize=64)
def _hadamard(m: int, dtype: np.dtype[np.floating]) -> npt.NDArray[np.floating]:
    """H_{2^m} / 2^(m/2), Sylvester order, read-only."""
    h = np.ones((1, 1), dtype=np.float64)
    for _ in range(m):
        h = np.block([[h, h], [h, -h]])
    out: npt.NDArray[np.floating] = (h * 2.0 ** (-m / 2)).astype(dtype)
    out.setflags(write=False)
    return out


def _factors(n_bits: int) -> list[int]:
    """Split log2(D) into factor sizes as equal as possible around _FACTOR_BITS."""
    if n_bits == 0:
        return []
    k = max(1, round(n_bits / _FACTOR_BITS))
    base, extra = divmod(n_bits, k)
    return [base + 1] * extra + [base] * (k - extra)


def _stages(a: FloatArray, buf: FloatArray, lead: int, factors: list[int]) -> tuple[FloatArray, FloatArray]:
    """Apply the Hadamard factors to each of `lead` contiguous rows of `a` (flat), ping-ponging with
    `buf`. Returns (result, scratch)."""
    n = 1 << sum(factors)
    left = lead
    right = n
    for m in factors:
        k = 1 << m
        right //= k
        h = _hadamard(m, a.dtype)
        if right == 1:
            np.matmul(a.reshape(-1, k), h, out=buf.reshape(-1, k))
        else:
            np.matmul(h, a.reshape(left, k, right), out=buf.reshape(left, k, right))
        left *= k
        a, buf = buf, a
    return a, buf


def fwht(a: FloatArray, scratch: FloatArray | None = None) -> FloatArray:
    """Orthonormal Walsh–Hadamard transform of the 1-D float32/float64 array `a` (length 2**n).

    Works in `a` and `scratch` (allocated if not given, same shape/dtype); the result is returned and is
    one of those two buffers — the other holds garbage afterwards. Self-inverse: fwht(fwht(a)) == a."""
    if a.ndim != 1 or a.dtype not in (np.float32, np.float64):
        raise TypeError("fwht needs a 1-D float32 or float64 array")
    n = a.size
    if n & (n - 1):
        raise ValueError(f"fwht length must be a power of two, got {n}")
    if n <= 1:
        return a
    if scratch is None:
        scratch = np.empty_like(a)
    n_bits = n.bit_length() - 1
    if n_bits <= _BLOCK_BITS + 2:
        res, _ = _stages(a, scratch, 1, _factors(n_bits))
        return res
    # Cache blocking: inner 2^_BLOCK_BITS factor row by row (chunks stay in cache), outer factors after.
    inner = _factors(_BLOCK_BITS)
    rows = n >> _BLOCK_BITS
    width = 1 << _BLOCK_BITS
    a2 = a.reshape(rows, width)
    s2 = scratch.reshape(rows, width)
    for r in range(rows):
        res, _ = _stages(a2[r], s2[r], 1, inner)
        if not np.shares_memory(res, a2[r]):
            a2[r] = res
    outer = _factors(n_bits - _BLOCK_BITS)
    cur, other = a, scratch
    left = 1
    right = n
    for m in outer:
        k = 1 << m
        right //= k
        h = _hadamard(m, a.dtype)
        np.matmul(h, cur.reshape(left, k, right), out=other.reshape(left, k, right))
        left *= k
        cur, other = other, cur
    return cur


def fwht_textbook(a: FloatArray) -> FloatArray:
    """The textbook radix-2 butterfly, vectorised per stage (log2 D Python-level stages, each a full pass
    over the data). Kept as the reference and the benchmark baseline; returns a new array."""
    out = np.array(a, copy=True)
    n = out.size
    h = 1
    while h < n:
        v = out.reshape(-1, 2, h)
        t = v[:, 0, :] - v[:, 1, :]
        v[:, 0, :] += v[:, 1, :]
        v[:, 1, :] = t
        h *= 2
    out *= out.dtype.type(1.0 / np.sqrt(n))
    return out


def sign_words(seed: int, index: int, n: int, stream: int = STREAM_ROTATION) -> npt.NDArray[np.uint64]:
    """The ceil(n/64) raw 64-bit words of PCG64(SeedSequence((seed, stream, index))) behind n sign
    bits: bit k of the stream is bit k % 64 of word k // 64."""
    bg = np.random.PCG64(np.random.SeedSequence((int(seed), stream, int(index))))
    words: npt.NDArray[np.uint64] = bg.random_raw((n + 63) // 64).astype("<u8", copy=False)
    return words


def sign_bits(seed: int, index: int, n: int, stream: int = STREAM_ROTATION) -> npt.NDArray[np.uint8]:
    """n pseudo-random bits (0/1, uint8) from PCG64(SeedSequence((seed, stream, index))).random_raw —
    little-endian bit order of the raw 64-bit words, stable across numpy versions and platforms."""
    words = sign_words(seed, index, n, stream)
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n]


def signs(seed: int, index: int, n: int, dtype: npt.DTypeLike = np.float32) -> FloatArray:
    """The ±1 vector of rotation `index` (0-based) for `seed` (bit 1 -> -1)."""
    s: FloatArray = sign_bits(seed, index, n).astype(dtype)
    s *= -2
    s += 1
    return s


def rotate(y: FloatArray, seed: int, rotations: int, start: int = 0) -> FloatArray:
    """Apply RHTs number start .. start+rotations-1 to the padded vector y (length D = 2**n,
    float32/64), in place where possible; returns the rotated vector (y or a buffer of the same size).
    rotate(rotate(y, s, 1), s, 1, start=1) == rotate(y, s, 2)."""
    _check_rotations(start + rotations)
    scratch = np.empty_like(y)
    for k in range(start, start + rotations):
        y *= signs(seed, k, y.size, y.dtype)
        res = fwht(y, scratch)
        if res is not y:
            y, scratch = res, y
    return y


def unrotate(y: FloatArray, seed: int, rotations: int) -> FloatArray:
    """Inverse of `rotate` (same seed and count): H then signs, in reverse order."""
    _check_rotations(rotations)
    scratch = np.empty_like(y)
    for k in reversed(range(rotations)):
        res = fwht(y, scratch)
        if res is not y:
            y, scratch = res, y
        y *= signs(seed, k, y.size, y.dtype)
    return y


def _check_rotations(rotations: int) -> None:
    if not 1 <= rotations <= MAX_ROTATIONS:
        raise ValueError(f"rotation count must be 1..{MAX_ROTATIONS}, got {rotations}")


def participation(x: FloatArray) -> float:
    """rho(x) = sum x_i^4 / (sum x_i^2)^2 in O(d): 1/d for a flat vector, 3/d for Gaussian, 1 for a spike.

    After one RHT each coordinate is a Rademacher sum whose kurtosis is exactly 3 - 2 rho(x) (see
    docs/quant.md), so rho measures how far one rotation leaves the coordinates from Gaussian."""
    v = np.asarray(x).ravel()
    if v.dtype not in (np.float32, np.float64):
        v = v.astype(np.float64)
    peak = float(np.max(np.abs(v))) if v.size else 0.0
    if peak == 0.0 or not np.isfinite(peak):
        return 0.0
    # scale-free: no overflow of x^4; by a power of two, so that a subnormal peak (whose inverse is
    # beyond the dtype's range: a cast overflow warning, inf, a NaN rho) scales as exactly as any other
    s2 = np.ldexp(v, -math.frexp(peak)[1])
    np.square(s2, out=s2)
    total = float(s2.sum(dtype=np.float64))
    return sumsq64(s2) / (total * total)


#: elements per float64 conversion in sumsq64 (a 256 KiB float64 chunk)
_SUM_CHUNK = 1 << 15


def dot64(a: npt.NDArray[np.floating], b: npt.NDArray[np.floating]) -> float:
    """<a, b> summed in float64, as the numba kernels sum. A float32 `np.dot` is BLAS's sdot, which
    accumulates in float32 in an order of the BLAS build's choosing: its rounding (~1e-5 relative over
    2^15 terms with numpy 2.4's OpenBLAS) made a frame's realized error of an exact encoding look
    non-zero, and `auto` add a rotation that made it lossy."""
    return float(np.dot(a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)))


def sumsq64(y: npt.NDArray[np.floating]) -> float:
    """||y||^2 in float64, a chunk at a time (no float64 copy of a large y)."""
    total = 0.0
    for lo in range(0, y.size, _SUM_CHUNK):
        ch = y[lo : lo + _SUM_CHUNK]
        total += dot64(ch, ch)
    return total
