"""EDEN (Vargaftik et al., ICML 2022) and DRIVE (NeurIPS 2021) in the rotated domain.

Given the rotated, zero-padded vector y (length D), EDEN normalises z = y * sqrt(D) / ||y|| (so z is
approximately N(0,1) per coordinate), maps each coordinate to its nearest Lloyd–Max centroid c_i of N(0,1)
and sends the indices plus one scale S, the receiver's rotated estimate being S * c:

* unbiased: S = ||y||^2 / <y, c>  (the estimate's projection on y is exactly y; with a uniformly random
  rotation the orthogonal part averages to zero, so E[x_hat] = x);
* biased:   S = <y, c> / ||c||^2  (least squares: the best multiple of c, minimising ||y - S c||).

Budgets: integer b uses the b-bit codebook; fractional b in (1, 8) sends a seeded random fraction
frac(b) of coordinates with ceil(b) bits and the rest with floor(b); b in (0, 1) keeps a seeded random
fraction b of coordinates (1 bit each) and drops the rest (c_i = 0). The scale formulas are unchanged in
every case. DRIVE is the 1-bit unbiased case: c = sign(y) * sqrt(2/pi), S <-> ||y||^2 / ||y||_1.

Everything here works in "y units": comparisons use the boundaries times sigma = ||y|| / sqrt(D), so z
is never materialised.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

import numpy as np
import numpy.typing as npt

from . import bitpack
from .lloydmax import MAX_BITS, codebook, error_clip
from .rht import STREAM_MASK, FloatArray, dot64, sumsq64

_CHUNK = 1 << 15
_F32_MAX = float(np.finfo(np.float32).max)
U8 = npt.NDArray[np.uint8]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]


@dataclass(frozen=True)
class Split:
    """How a bit budget is spent: a fraction `p` of coordinates (seeded mask) uses `hi` bits, the rest
    `lo` bits (0: dropped). p == 0 means every coordinate uses `lo` bits and there is no mask."""

    lo: int
    hi: int
    p: float

    @property
    def masked(self) -> bool:
        return self.p > 0.0


def split(bits: float) -> Split:
    if not (math.isfinite(bits) and 0.0 < bits <= MAX_BITS):
        raise ValueError(f"bit budget must be in (0, {MAX_BITS}], got {bits}")
    if bits < 1.0:
        return Split(0, 1, bits)
    lo = math.floor(bits)
    frac = bits - lo
    if frac == 0.0:
        return Split(lo, lo, 0.0)
    return Split(lo, lo + 1, frac)


#: Raw words drawn at once for a mask: the stream is the same drawn in pieces, and a mask costs one byte
#: per coordinate instead of the eight of one D-sized uint64 draw (4 GiB at D = 2^29).
MASK_CHUNK = 1 << 20


def coordinate_mask(seed: int, n: int, p: float) -> BoolArray:
    """Bernoulli(p) mask of n coordinates from PCG64 raw words (version-stable): u < p with u the top
    53 bits of each word."""
    bg = np.random.PCG64(np.random.SeedSequence((int(seed), STREAM_MASK, 0)))
    thr = np.uint64(round(p * 2.0**53))
    out = np.empty(n, np.bool_)
    for lo in range(0, n, MASK_CHUNK):
        raw = bg.random_raw(min(MASK_CHUNK, n - lo))
        raw >>= np.uint64(11)
        np.less(raw, thr, out=out[lo : lo + raw.size])
    return out


def parts(sp: Split, seed: int, n: int) -> Iterator[tuple[int, IndexArray | None]]:
    """The coordinate groups of a split, in wire order: (bits, ascending coordinate indices or None for
    all). Index arrays, not boolean masks: take/put by index is ~8x faster than boolean indexing."""
    if not sp.masked:
        yield sp.lo, None
        return
    mask = coordinate_mask(seed, n, sp.p)
    if sp.lo:
        yield sp.lo, np.flatnonzero(~mask)
    yield sp.hi, np.flatnonzero(mask)


@lru_cache(maxsize=64)
def _tables(bits: int, dtype: np.dtype[np.floating]) -> tuple[FloatArray, FloatArray]:
    cb = codebook(bits)
    c = cb.centroids.astype(dtype)
    t = cb.boundaries.astype(dtype)
    c.setflags(write=False)
    t.setflags(write=False)
    return c, t


@dataclass
class GroupStats:
    """Sums over one coordinate group, c = unit centroids, r = y - sigma c (the residual at the unit
    scale): <r, c> and ||c||^2 (for the scales), and for the adaptive check the clipped squared errors
    sum min(r^2, L_b sigma^2) and, when asked, sum min(y^2, L_0 sigma^2)."""

    rc: float = 0.0
    cc: float = 0.0
    q: float = 0.0
    q0: float = 0.0


def nearest(y: FloatArray, bits: int, sigma: float, with_q0: bool = False) -> tuple[U8, GroupStats]:
    """Index of the nearest centroid of sigma * codebook(bits) for each y_i (ties go down), and the
    group's GroupStats.

    Up to 4 bits: count the boundaries below y (2^b - 1 vectorised compares); above: a b-step
    branch-free binary search over the boundaries. Works chunk by chunk so that every pass runs over
    cache-resident data and no D-sized temporary is allocated."""
    cent, t = _tables(bits, y.dtype)
    thr = t * y.dtype.type(sigma)
    ext = np.concatenate((thr, [np.inf])).astype(y.dtype)  # ext[j] = upper edge of cell j
    idx = np.zeros(y.size, np.uint8)
    tmp = np.empty(min(y.size, _CHUNK), np.bool_)
    cand = np.empty(min(y.size, _CHUNK), np.uint8)
    st = GroupStats()
    sig = y.dtype.type(sigma)
    clip = y.dtype.type(error_clip(bits) * sigma * sigma)
    clip0 = y.dtype.type(error_clip(0) * sigma * sigma)
    for lo in range(0, y.size, _CHUNK):
        ych = y[lo : lo + _CHUNK]
        ic = idx[lo : lo + _CHUNK]
        tc = tmp[: ych.size]
        if bits <= 4:
            for v in thr:
                np.greater(ych, v, out=tc)
                np.add(ic, tc, out=ic, casting="unsafe")
        else:
            cc_ = cand[: ych.size]
            step = 1 << (bits - 1)
            while step:
                np.add(ic, np.uint8(step - 1), out=cc_)
                np.greater(ych, ext.take(cc_), out=tc)
                tc_u8 = tc.view(np.uint8)
                np.multiply(tc_u8, np.uint8(step), out=tc_u8)
                np.add(ic, tc_u8, out=ic)
                step >>= 1
        c = cent.take(ic)
        r = ych - sig * c
        st.rc += dot64(r, c)
        st.cc += dot64(c, c)
        np.square(r, out=r)
        st.q += float(np.minimum(r, clip, out=r).sum(dtype=np.float64))
        if with_q0:
            np.square(ych, out=r)
            st.q0 += float(np.minimum(r, clip0, out=r).sum(dtype=np.float64))
    return idx, st


@dataclass
class Encoded:
    """Indices per coordinate group (wire order), the scale S (per unit of centroid), `check`: the
    realized mean clipped squared error at the unit scale, (1/D) sum min((z_i - c_i)^2, L), which the
    adaptive rule (b) compares with its expectation under Gaussian coordinates (adaptive.py), and
    `error`: the realized relative squared error ||y - S c||^2 / ||y||^2 of what is sent (from the same
    sums, no pass of its own; 0 for a zero vector), which tells `auto` that one rotation was exact."""

    sections: list[tuple[int, U8]]
    scale: float
    check: float
    error: float = math.inf


def quantize(
    y: FloatArray, bits: float, seed: int, mode: str, *, kernels: ModuleType | None = None,
    ny2: float | None = None, pack: bool = False,
) -> Encoded:
    """EDEN quantization of the rotated vector y. mode: 'unbiased', 'biased' or 'fixed' (TurboQuant_mse:
    S = ||y|| / sqrt(D)). `kernels`: the numba kernels module (accel.py) or None for numpy; `ny2`:
    ||y||^2 if the caller has it; `pack`: sections hold the packed bytes (bitpack.pack) instead of the
    indices."""
    n = y.size
    if ny2 is None:
        ny2 = float(kernels.sumsq(y)) if kernels is not None else sumsq64(y)
    if not math.isfinite(ny2) or (y.dtype == np.float32 and ny2 > _F32_MAX):
        # (both paths sum in float64; refuse what float32 cannot hold, as the kernels do)
        raise ValueError("input has non-finite values (or overflows the compute precision)")
    sigma = math.sqrt(ny2 / n)
    sp = split(bits)
    sparse = sp.lo == 0
    rc = cc = q = q0_kept = 0.0
    sections: list[tuple[int, U8]] = []
    for b, sel in parts(sp, seed, n):
        ys = y if sel is None else y.take(sel)
        st: GroupStats
        if kernels is not None:
            data, st = (kernels.nearest_packed if pack else kernels.nearest)(ys, b, sigma, sparse)
        else:
            data, st = nearest(ys, b, sigma, with_q0=sparse)
            if pack:
                data = bitpack.pack(data, b)
        rc += st.rc
        cc += st.cc
        q += st.q
        q0_kept += st.q0
        sections.append((b, data))
    if sparse and sigma > 0.0:  # dropped coordinates: their error is y itself, clipped at L_0
        clip0 = y.dtype.type(error_clip(0) * sigma * sigma)
        q0_all = 0.0
        if kernels is not None:
            q0_all = float(kernels.clipped_sumsq(y, clip0))
        else:
            for lo in range(0, n, _CHUNK):
                sq = np.square(y[lo : lo + _CHUNK])
                q0_all += float(np.minimum(sq, clip0, out=sq).sum(dtype=np.float64))
        q += max(q0_all - q0_kept, 0.0)
    yc = rc + sigma * cc
    if mode == "fixed":
        scale = sigma
    elif yc <= 0.0:
        scale = 0.0
    elif mode == "unbiased":
        scale = ny2 / yc
    elif mode == "biased":
        scale = yc / cc
    else:
        raise ValueError(f"unknown scale mode {mode!r}")
    check = q / ny2 if ny2 > 0.0 else 0.0
    # ||y - S c||^2 = ||y||^2 - 2 S <y, c> + S^2 ||c||^2 (dropped coordinates: in ||y||^2 only)
    error = max(ny2 - 2.0 * scale * yc + scale * scale * cc, 0.0) / ny2 if ny2 > 0.0 else 0.0
    return Encoded(sections, scale, check, error)


def max_centroid(bits: int) -> float:
    """The largest |centroid| of the b-bit codebook (the outermost cell's)."""
    return float(np.max(np.abs(codebook(bits).centroids)))


def section_sizes(bits: float, seed: int, n: int) -> list[tuple[int, int, IndexArray | None]]:
    """(bits, count, selector) of each wire section for a budget — what a decoder expects."""
    out: list[tuple[int, int, IndexArray | None]] = []
    for b, sel in parts(split(bits), seed, n):
        out.append((b, n if sel is None else sel.size, sel))
    return out


def scaled_table(bits: int, scale: float, dtype: np.dtype[np.floating]) -> FloatArray:
    """The decoder's lookup table S * c for `bits`, in `dtype` (as `reconstruct` computes it)."""
    table: FloatArray = (_tables(bits, dtype)[0] * dtype.type(scale)).astype(dtype)
    return table


def reconstruct(
    layout: list[tuple[int, int, IndexArray | None]], sections: list[U8], scale: float, n: int,
    dtype: np.dtype[np.floating],
) -> FloatArray:
    """The rotated estimate S * c from decoded indices (dropped coordinates are 0)."""
    if len(layout) == 1 and layout[0][2] is None:
        return scaled_table(layout[0][0], scale, dtype).take(sections[0])
    out = np.zeros(n, dtype)
    for (b, _, sel), idx in zip(layout, sections, strict=True):
        out[sel] = scaled_table(b, scale, dtype).take(idx)
    return out


def reconstruct_packed(
    layout: list[tuple[int, int, IndexArray | None]], packed: list[U8], scale: float, n: int,
    dtype: np.dtype[np.floating], kernels: ModuleType,
) -> FloatArray:
    """`reconstruct` from the packed sections (sizes and padding bits already checked), unpacking
    fused with the centroid lookup in the numba kernels."""
    tables = [scaled_table(b, scale, dtype) for b, _, _ in layout]
    if len(layout) == 1 and layout[0][2] is None:
        res: FloatArray = kernels.lookup(packed[0], layout[0][0], n, tables[0])
        return res
    out = np.zeros(n, dtype)
    for (b, count, sel), buf, table in zip(layout, packed, tables, strict=True):
        out[sel] = kernels.lookup(buf, b, count, table)
    return out
