"""numba kernels for the codec's hot path: the FWHT with the rotation signs fused in, EDEN quantization
fused with bit packing, decoding (unpacking fused with the centroid lookup), and the moment statistic.

Same results as the numpy reference (rht.py, eden.py, bitpack.py) and the same wire format: a buffer
made by either path decodes with the other. What may differ is floating-point rounding: the FWHT sums
in another order (radix-8/4/2 butterflies, 1/sqrt(D) applied once with the first signs instead of
folded into 2^4-point matrices), and the sums the scale and the adaptive check use (||y||^2, <r, c>,
||c||^2, the clipped errors) accumulate in float64 in another order. So the two paths agree to float
tolerance, and a coordinate that lands within rounding distance of a cell boundary can get the
neighbouring index (tests/unit/test_quant_kernels.py counts them: a few per million coordinates at b <= 4,
~50 at b = 8, always a neighbour).
Given the *same* rotated vector and sigma, the indices are identical: both compare y > sigma * t_k in
the compute dtype. Each path is deterministic, so every rank of a collective (all on one path) gets
bit-identical results.

Which path runs is chosen once per process by `accel.py` (MRC_QUANT_KERNELS=numba|numpy).

FWHT layout (why it is shaped like this: a plain radix-2 loop `a[j], a[j + h] = ...` does not vectorize,
LLVM cannot prove a[j] and a[j + h] apart): the vector is cut into blocks of 128 KiB (2^15 float32, 2^14
float64; L2-resident) and in each block levels 0..4 run in registers, 32 contiguous elements at a time (LLVM
vector intrinsics, "levels 0..4 in registers" below; MRC_FWHT_SIMD=0: levels 0..2 as one scalar radix-8
butterfly per 8 elements, which LLVM vectorizes as an interleaved access group), then levels 5..12 as two
radix-16 vertical passes (16 vectors of 64 bytes at stride h, four levels in registers per load and store:
`_vertical`) and the last levels of the block as radix-4/2 stages whose operands are separate slices of the
block (distinct array pointers: LLVM checks them apart once per loop and vectorizes the inner loop). The
outer levels (stride >= one block) are radix-8 vertical passes over the whole vector: eight sequential
streams per pass, which the hardware prefetchers follow (sixteen streams measured slower; a gather of column
strips into a scratch buffer was 10x slower: short runs at power-of-two strides). MRC_FWHT_VERTICAL=0: every
level from 5 up as the radix-4/2 slice stages (the same values). The signs of a forward rotation and the
1/sqrt(D) scale are fused into the first read of each block, as is ||y||^2 (= D scale^2 ||x||^2, the
rotation being orthonormal); those of an inverse rotation into the last butterfly stage, and decode's
unpacking and centroid lookup into the first read of each block.

All kernels are compiled on first use (`cache=True`: numba caches the machine code next to this file in
__pycache__, or in its user cache dir when that is not writable); see docs/quant.md §8 for the compile
times.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .eden import GroupStats, _tables
from .lloydmax import error_clip
from .rht import STREAM_ROTATION, FloatArray, sign_words

U8 = npt.NDArray[np.uint8]


#: False when MRC_FWHT_SIMD=0: levels 0..2 as the scalar radix-8 kernels below instead of levels 0..4
#: in registers (the intrinsics below); the same values either way. Numba compiles a global as a
#: constant and its cache would keep the value, so with it off every kernel is compiled afresh, uncached.
SIMD: bool = os.environ.get("MRC_FWHT_SIMD", "1").strip() != "0"
#: False when MRC_FWHT_VERTICAL=0 (or MRC_FWHT_SIMD=0): the butterfly levels from h = 32 up as radix-4/2
#: stages over slices (`_stages_slices`) instead of the radix-16/8 vertical passes in registers
#: (`_vstages`); the same values either way, compiled uncached when off (as SIMD).
VERTICAL: bool = SIMD and os.environ.get("MRC_FWHT_VERTICAL", "1").strip() != "0"


def _njit(fn: Callable[..., Any], **opts: Any) -> Any:
    cache = SIMD and VERTICAL
    try:
        return njit(cache=cache, boundscheck=False, nogil=True, **opts)(fn)
    except RuntimeError:  # no writable cache dir (read-only install and no writable user cache)
        return njit(cache=False, boundscheck=False, nogil=True, **opts)(fn)


def _jit(fn: Callable[..., Any]) -> Any:
    return _njit(fn)


def _jit_sum(fn: Callable[..., Any]) -> Any:
    """reassoc only: lets LLVM vectorize the float64 reductions (summation order changes, documented);
    no nnan/ninf/contract, so compares, min() and products are the IEEE operations of the numpy path."""
    return _njit(fn, fastmath={"reassoc"})


_CHUNK = 1024  # elements per quantization chunk (a multiple of 8: chunks start on byte boundaries)


def _block_bits(dtype: np.dtype[np.floating]) -> int:
    return 15 if dtype == np.float32 else 14



# ------------------------------------------------------------------ FWHT levels 0..4 in registers
#
# Numba intrinsics that emit LLVM vector code (shufflevector, vector fadd/fsub/fmul/select), which
# numba's own loops cannot say. They live in this file, not a module of their own, because numba's cache
# checks only the source file of the function it compiled: a kernel here that inlines an intrinsic from
# another file would keep its old machine code when only that file changed.
#
# Why: levels 0..2 pair elements inside one 8-wide vector (h = 1, 2, 4). Written as scalar code over
# groups of 8 (_radix8_first), LLVM vectorizes them as an interleaved access group and spends ~140
# shuffles per 64 elements on it; with the radix-4 stage at h = 8 after it, levels 0..4 took 0.95 ms of a
# 1.56 ms FWHT at 2^20 (float32, one core). Here each level is two shuffles, one add, one subtract and
# one blend per vector, and levels 3 and 4 (h = 8, 16) are a radix-4 butterfly between the four vectors
# of a 32-element group, still in registers: one load and one store per element; levels 0..4 took
# 0.32 ms on the same input.
#
# Bit for bit the scalar kernels: every output is the same IEEE additions and subtractions of the same
# operands in the same order (a level's lane j takes v[j & ~h] + v[j | h] where bit h of j is clear and
# v[j & ~h] - v[j | h] where it is set; levels in increasing order; a radix-4 step is two radix-2 levels).
# The signs of a forward rotation (one multiplication by +-scale) and decode's 2-bit centroid selection
# are applied to the loaded vectors before level 0, as the scalar kernels apply them to loaded scalars.
# The vectors are <8 x float> or <8 x double> on any machine: LLVM lowers them to AVX2 / AVX-512
# registers where it can and splits them (SSE, NEON) where it cannot, with the same results.

#: elements per group: four 8-wide vectors
_GROUP = 32
_W = 8
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_IDX = ir.VectorType(_I32, _W)


def _intrinsic(fn: Callable[..., Any]) -> Any:
    """numba's `intrinsic`, typed Any: called from jitted code without the typing context argument."""
    return intrinsic(fn)


def _lanes(values: list[int]) -> ir.Constant:
    return ir.Constant(_IDX, values)


def _level_in_vector(b: ir.IRBuilder, v: Any, h: int) -> Any:
    """One butterfly level of half-width h (1, 2 or 4) between the lanes of one vector."""
    lo = b.shuffle_vector(v, v, _lanes([j & ~h for j in range(_W)]))
    hi = b.shuffle_vector(v, v, _lanes([j | h for j in range(_W)]))
    s = b.fadd(lo, hi)
    d = b.fsub(lo, hi)
    return b.shuffle_vector(s, d, _lanes([_W + j if j & h else j for j in range(_W)]))


def _levels_0_to_4(b: ir.IRBuilder, v: list[Any]) -> list[Any]:
    """Levels 0..2 in each of the four vectors, then levels 3 and 4 as one radix-4 step between them (the
    operation order of kernels._stages_to at h = 8)."""
    for h in (1, 2, 4):
        v = [_level_in_vector(b, x, h) for x in v]
    s0 = b.fadd(v[0], v[1])
    d0 = b.fsub(v[0], v[1])
    s1 = b.fadd(v[2], v[3])
    d1 = b.fsub(v[2], v[3])
    return [b.fadd(s0, s1), b.fadd(d0, d1), b.fsub(s0, s1), b.fsub(d0, d1)]


def _float_array(a: Any) -> bool:
    return isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.dtype in (
        types.float32, types.float64)


def _byte_array(a: Any) -> bool:
    return isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.dtype == types.uint8


def _vectors(context: Any, b: ir.IRBuilder, aryty: Any, ary: Any, base: Any) -> list[Any]:
    """Pointers to the four 8-wide vectors at element `base` of a contiguous 1-D float array."""
    data = context.make_array(aryty)(context, b, ary).data
    vty = ir.VectorType(context.get_value_type(aryty.dtype), _W)
    vp = b.bitcast(b.gep(data, [base]), vty.as_pointer())
    return [b.gep(vp, [ir.Constant(_I64, k)]) for k in range(4)]


def _store(b: ir.IRBuilder, ptrs: list[Any], v: list[Any]) -> None:
    for p, x in zip(ptrs, v, strict=True):
        b.store(x, p, align=1)


def _vertical(radix: int) -> Any:
    """An intrinsic v(a, base, h): the `radix` vectors of 64 bytes (16 float32 or 8 float64 lanes) at
    a[base + k * h], k < radix, get log2(radix) butterfly levels between them in registers, in place:
    level m pairs vector k with k | 2^m, k + k|2^m -> k and k - k|2^m -> k|2^m, levels in increasing
    order, as `_stages_slices` computes them (a radix-4 step there is two of these levels), so every output
    is the same IEEE additions of the same operands. One load and one store per element for log2(radix)
    levels, where a stage over slices loads and stores each element every two levels: numba's loops
    cannot say this (LLVM does not vectorize a loop over more than four distinct slices: too many
    runtime overlap checks)."""

    def typer(typingctx: Any, a: Any, base: Any, h: Any) -> Any:
        if not (_float_array(a) and isinstance(base, types.Integer) and isinstance(h, types.Integer)):
            return None

        def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
            aty, bty, hty = sig.args
            data = context.make_array(aty)(context, b, args[0]).data
            vty = ir.VectorType(context.get_value_type(aty.dtype), 512 // aty.dtype.bitwidth)
            off = context.cast(b, args[1], bty, types.intp)
            step = context.cast(b, args[2], hty, types.intp)
            ptrs = []
            for _ in range(radix):
                ptrs.append(b.bitcast(b.gep(data, [off]), vty.as_pointer()))
                off = b.add(off, step)
            v = [b.load(p, align=1) for p in ptrs]
            m = 1
            while m < radix:
                w = list(v)
                for k in range(radix):
                    if not k & m:
                        w[k] = b.fadd(v[k], v[k | m])
                        w[k | m] = b.fsub(v[k], v[k | m])
                v = w
                m *= 2
            _store(b, ptrs, v)
            return context.get_dummy_value()

        return types.void(a, base, h), codegen

    typer.__name__ = f"_v{radix}"
    return _intrinsic(typer)


_v16 = _vertical(16)
_v8 = _vertical(8)


@_intrinsic
def _h32(typingctx: Any, a: Any, base: Any) -> Any:
    """a[base : base + 32] = levels 0..4 of itself, in place."""
    if not (_float_array(a) and isinstance(base, types.Integer)):
        return None

    def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
        ptrs = _vectors(context, b, sig.args[0], args[0], context.cast(b, args[1], sig.args[1], types.intp))
        _store(b, ptrs, _levels_0_to_4(b, [b.load(p, align=1) for p in ptrs]))
        return context.get_dummy_value()

    return types.void(a, base), codegen


@_intrinsic
def _h32_signed(typingctx: Any, dst: Any, src: Any, base: Any, sbytes: Any, sbase: Any, scale: Any) -> Any:
    """dst[base : base + 32] = levels 0..4 of (src[base + i] * (-scale if bit i % 8 of sbytes[sbase + i // 8]
    else scale)); dst may be src. `scale` has the arrays' dtype."""
    if not (_float_array(dst) and _float_array(src) and dst.dtype == src.dtype and _byte_array(sbytes)
            and isinstance(base, types.Integer) and isinstance(sbase, types.Integer) and scale == dst.dtype):
        return None

    def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
        dty, sty, bty, by, sbty, _ = sig.args
        base_v = context.cast(b, args[2], bty, types.intp)
        sbase_v = context.cast(b, args[4], sbty, types.intp)
        src_ptrs = _vectors(context, b, sty, args[1], base_v)
        dst_ptrs = _vectors(context, b, dty, args[0], base_v)
        bytes_data = context.make_array(by)(context, b, args[3]).data
        ety = context.get_value_type(dty.dtype)
        vty = ir.VectorType(ety, _W)
        pos = b.insert_element(ir.Constant(vty, ir.Undefined), args[5], ir.Constant(_I32, 0))
        pos = b.shuffle_vector(pos, pos, _lanes([0] * _W))
        neg = b.fneg(pos)
        bit = _lanes([1 << j for j in range(_W)])
        v = []
        for k, p in enumerate(src_ptrs):
            byte = b.load(b.gep(bytes_data, [b.add(sbase_v, ir.Constant(sbase_v.type, k))]))
            word = b.insert_element(ir.Constant(_IDX, ir.Undefined), b.zext(byte, _I32), ir.Constant(_I32, 0))
            word = b.shuffle_vector(word, word, _lanes([0] * _W))
            negative = b.icmp_unsigned("!=", b.and_(word, bit), ir.Constant(_IDX, [0] * _W))
            v.append(b.fmul(b.load(p, align=1), b.select(negative, neg, pos)))
        _store(b, dst_ptrs, _levels_0_to_4(b, v))
        return context.get_dummy_value()

    return types.void(dst, src, base, sbytes, sbase, scale), codegen


@_intrinsic
def _h32_lookup2(typingctx: Any, dst: Any, base: Any, packed: Any, pbase: Any, table: Any) -> Any:
    """dst[base : base + 32] = levels 0..4 of table[index i], index i = bits 2i..2i+1 of the 8 bytes at
    packed[pbase] read as a little-endian integer (kernels._lookup2_radix8's layout); table[0..3] are the
    centroids, of dst's dtype."""
    if not (_float_array(dst) and _byte_array(packed) and _float_array(table) and table.dtype == dst.dtype
            and isinstance(base, types.Integer) and isinstance(pbase, types.Integer)):
        return None

    def codegen(context: Any, b: ir.IRBuilder, sig: Any, args: Any) -> Any:
        dty, bty, pty, pbty, tty = sig.args
        ptrs = _vectors(context, b, dty, args[0], context.cast(b, args[1], bty, types.intp))
        pdata = context.make_array(pty)(context, b, args[2]).data
        pbase_v = context.cast(b, args[3], pbty, types.intp)
        tdata = context.make_array(tty)(context, b, args[4]).data
        ety = context.get_value_type(dty.dtype)
        vty = ir.VectorType(ety, _W)
        cents = []
        for c in range(4):
            x = b.load(b.gep(tdata, [ir.Constant(_I64, c)]))
            x = b.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(_I32, 0))
            cents.append(b.shuffle_vector(x, x, _lanes([0] * _W)))
        zero = ir.Constant(_IDX, [0] * _W)
        v = []
        for k in range(4):  # vector k: elements 8k..8k+7, their indices in bytes 2k and 2k+1
            lo = b.zext(b.load(b.gep(pdata, [b.add(pbase_v, ir.Constant(pbase_v.type, 2 * k))])), _I32)
            hi = b.zext(b.load(b.gep(pdata, [b.add(pbase_v, ir.Constant(pbase_v.type, 2 * k + 1))])), _I32)
            w = b.or_(lo, b.shl(hi, ir.Constant(_I32, 8)))
            wv = b.insert_element(ir.Constant(_IDX, ir.Undefined), w, ir.Constant(_I32, 0))
            wv = b.shuffle_vector(wv, wv, _lanes([0] * _W))
            idx = b.and_(b.lshr(wv, _lanes([2 * j for j in range(_W)])), ir.Constant(_IDX, [3] * _W))
            b0 = b.icmp_unsigned("!=", b.and_(idx, ir.Constant(_IDX, [1] * _W)), zero)
            b1 = b.icmp_unsigned("!=", b.and_(idx, ir.Constant(_IDX, [2] * _W)), zero)
            v.append(b.select(b1, b.select(b0, cents[3], cents[2]), b.select(b0, cents[1], cents[0])))
        _store(b, ptrs, _levels_0_to_4(b, v))
        return context.get_dummy_value()

    return types.void(dst, base, packed, pbase, table), codegen


# ---------------------------------------------------------------------------------------------- FWHT


@_jit
def _radix8_first(a):  # type: ignore[no-untyped-def]
    """Levels 0..2 (h = 1, 2, 4) of every group of 8 contiguous elements, in place. Written out rather
    than calling `_butterfly8` with the eight loaded values: that call measured 5-10 % slower here."""
    for k in range(a.size // 8):
        b = 8 * k
        x0 = a[b]
        x1 = a[b + 1]
        x2 = a[b + 2]
        x3 = a[b + 3]
        x4 = a[b + 4]
        x5 = a[b + 5]
        x6 = a[b + 6]
        x7 = a[b + 7]
        s0 = x0 + x1
        d0 = x0 - x1
        s1 = x2 + x3
        d1 = x2 - x3
        s2 = x4 + x5
        d2 = x4 - x5
        s3 = x6 + x7
        d3 = x6 - x7
        y0 = s0 + s1
        y1 = d0 + d1
        y2 = s0 - s1
        y3 = d0 - d1
        y4 = s2 + s3
        y5 = d2 + d3
        y6 = s2 - s3
        y7 = d2 - d3
        a[b] = y0 + y4
        a[b + 4] = y0 - y4
        a[b + 1] = y1 + y5
        a[b + 5] = y1 - y5
        a[b + 2] = y2 + y6
        a[b + 6] = y2 - y6
        a[b + 3] = y3 + y7
        a[b + 7] = y3 - y7


@_jit
def _signed_radix8(dst, src, sbytes, scale):  # type: ignore[no-untyped-def]
    """_signed_copy (sign bits from bytes: byte g holds the signs of elements 8g..8g+7, bit t for 8g+t)
    and _radix8_first in one loop; dst.size is a multiple of 8. (No fastmath here: the butterflies keep
    their order; the caller sums src^2 in a reassoc function of its own.)"""
    neg = -scale
    for g in range(src.size // 8):
        b = 8 * g
        byte = sbytes[g]
        _butterfly8(
            dst, b,
            src[b] * (neg if byte & 1 else scale),
            src[b + 1] * (neg if byte & 2 else scale),
            src[b + 2] * (neg if byte & 4 else scale),
            src[b + 3] * (neg if byte & 8 else scale),
            src[b + 4] * (neg if byte & 16 else scale),
            src[b + 5] * (neg if byte & 32 else scale),
            src[b + 6] * (neg if byte & 64 else scale),
            src[b + 7] * (neg if byte & 128 else scale),
        )


@_jit
def _signed_radix8_inplace(a, sbytes, scale):  # type: ignore[no-untyped-def]
    """_signed_radix8(a, a, sbytes, scale) on one array."""
    neg = -scale
    for g in range(a.size // 8):
        b = 8 * g
        byte = sbytes[g]
        _butterfly8(
            a, b,
            a[b] * (neg if byte & 1 else scale),
            a[b + 1] * (neg if byte & 2 else scale),
            a[b + 2] * (neg if byte & 4 else scale),
            a[b + 3] * (neg if byte & 8 else scale),
            a[b + 4] * (neg if byte & 16 else scale),
            a[b + 5] * (neg if byte & 32 else scale),
            a[b + 6] * (neg if byte & 64 else scale),
            a[b + 7] * (neg if byte & 128 else scale),
        )


@_jit
def _sign_inplace(a, words, scale):  # type: ignore[no-untyped-def]
    """a *= +-scale, signs as in _signed_copy with base 0 (one array: LLVM vectorizes it)."""
    neg = -scale
    full = a.size >> 6
    for w in range(full):
        word = words[w]
        blk = a[64 * w : 64 * w + 64]
        for b in range(64):
            blk[b] = blk[b] * (neg if (word >> np.uint64(b)) & np.uint64(1) else scale)
    for i in range(64 * full, a.size):
        bit = (words[i >> 6] >> np.uint64(i & 63)) & np.uint64(1)
        a[i] = a[i] * (neg if bit else scale)


@_jit_sum
def _scale_inplace(a, scale):  # type: ignore[no-untyped-def]
    """a *= scale; returns the sum of the squares before (float64)."""
    total = 0.0
    for i in range(a.size):
        v = a[i]
        a[i] = v * scale
        vd = np.float64(v)
        total += vd * vd
    return total


@_jit
def _lookup2_radix8(dst, packed, table):  # type: ignore[no-untyped-def]
    """_lookup of 2-bit indices and _radix8_first in one loop (the 4 centroids selected, not gathered:
    a gather keeps LLVM from vectorizing the loop); dst.size is a multiple of 8."""
    c0 = table[0]
    c1 = table[1]
    c2 = table[2]
    c3 = table[3]
    for g in range(dst.size // 8):
        w = np.int32(packed[2 * g]) | (np.int32(packed[2 * g + 1]) << 8)
        i0 = w & 3
        i1 = (w >> 2) & 3
        i2 = (w >> 4) & 3
        i3 = (w >> 6) & 3
        i4 = (w >> 8) & 3
        i5 = (w >> 10) & 3
        i6 = (w >> 12) & 3
        i7 = (w >> 14) & 3
        _butterfly8(
            dst, 8 * g,
            (c3 if i0 == 3 else c2) if i0 >= 2 else (c1 if i0 == 1 else c0),
            (c3 if i1 == 3 else c2) if i1 >= 2 else (c1 if i1 == 1 else c0),
            (c3 if i2 == 3 else c2) if i2 >= 2 else (c1 if i2 == 1 else c0),
            (c3 if i3 == 3 else c2) if i3 >= 2 else (c1 if i3 == 1 else c0),
            (c3 if i4 == 3 else c2) if i4 >= 2 else (c1 if i4 == 1 else c0),
            (c3 if i5 == 3 else c2) if i5 >= 2 else (c1 if i5 == 1 else c0),
            (c3 if i6 == 3 else c2) if i6 >= 2 else (c1 if i6 == 1 else c0),
            (c3 if i7 == 3 else c2) if i7 >= 2 else (c1 if i7 == 1 else c0),
        )


@njit(inline="always", boundscheck=False)
def _butterfly8(dst, b, x0, x1, x2, x3, x4, x5, x6, x7):  # type: ignore[no-untyped-def]
    """dst[b:b+8] = H_8 (x0..x7) (levels 0..2, unnormalised), same operation order as _radix8_first."""
    s0 = x0 + x1
    d0 = x0 - x1
    s1 = x2 + x3
    d1 = x2 - x3
    s2 = x4 + x5
    d2 = x4 - x5
    s3 = x6 + x7
    d3 = x6 - x7
    y0 = s0 + s1
    y1 = d0 + d1
    y2 = s0 - s1
    y3 = d0 - d1
    y4 = s2 + s3
    y5 = d2 + d3
    y6 = s2 - s3
    y7 = d2 - d3
    dst[b] = y0 + y4
    dst[b + 4] = y0 - y4
    dst[b + 1] = y1 + y5
    dst[b + 5] = y1 - y5
    dst[b + 2] = y2 + y6
    dst[b + 6] = y2 - y6
    dst[b + 3] = y3 + y7
    dst[b + 7] = y3 - y7


@_jit
def _first_h(size):  # type: ignore[no-untyped-def]
    """The half-width of the first butterfly level the `_first_*` kernels leave to `_stages` on a block
    of `size` (a power of two >= 8): 32 when levels 0..4 run in registers, else 8."""
    return _GROUP if SIMD and size >= _GROUP else 8


@_jit
def _first_plain(a):  # type: ignore[no-untyped-def]
    """Levels below _first_h(a.size), in place."""
    if SIMD and a.size >= _GROUP:
        for b in range(0, a.size, _GROUP):
            _h32(a, b)
    else:
        _radix8_first(a)


@_jit
def _first_signed(dst, src, sbytes, scale):  # type: ignore[no-untyped-def]
    """_signed_radix8(dst, src, sbytes, scale), then (in registers) levels up to _first_h(dst.size)."""
    if SIMD and dst.size >= _GROUP:
        for b in range(0, dst.size, _GROUP):
            _h32_signed(dst, src, b, sbytes, b // 8, scale)
    else:
        _signed_radix8(dst, src, sbytes, scale)


@_jit
def _first_signed_inplace(a, sbytes, scale):  # type: ignore[no-untyped-def]
    """_first_signed(a, a, sbytes, scale)."""
    if SIMD and a.size >= _GROUP:
        for b in range(0, a.size, _GROUP):
            _h32_signed(a, a, b, sbytes, b // 8, scale)
    else:
        _signed_radix8_inplace(a, sbytes, scale)


@_jit
def _first_lookup2(dst, packed, table):  # type: ignore[no-untyped-def]
    """_lookup2_radix8(dst, packed, table), then (in registers) levels up to _first_h(dst.size)."""
    if SIMD and dst.size >= _GROUP:
        for b in range(0, dst.size, _GROUP):
            _h32_lookup2(dst, b, packed, b // 4, table)
    else:
        _lookup2_radix8(dst, packed, table)


@_jit
def _stages(a, h):  # type: ignore[no-untyped-def]
    """Butterfly levels h, 2h, ... up to a.size (all powers of two), in place."""
    _stages_to(a, h, a.size)


@_jit
def _stages_to(a, h, limit):  # type: ignore[no-untyped-def]
    """The butterfly levels of half-width h, 2h, ..., limit / 2 (powers of two, limit <= a.size), in
    place: the vertical passes where they apply (`_vstages`), the rest as stages over slices."""
    if VERTICAL:
        h = _vstages(a, h, limit)
    _stages_slices(a, h, limit)


@_jit
def _vstages(a, h, limit):  # type: ignore[no-untyped-def]
    """The levels from half-width h up as vertical passes (`_vertical`) while they fit below limit;
    returns the half-width of the first level left. Radix-16 while a group of 16 rows lies inside one
    L2-resident block (limit <= 2^15 float32 / 2^14 float64 elements: 16 vectors in registers, two
    passes for levels 5..12), radix-8 otherwise (eight sequential streams over the whole vector, which
    the prefetchers follow; sixteen measured slower there). Needs h >= the vector's lanes."""
    lanes = 64 // a.itemsize
    if h < lanes:
        return h
    n = a.size
    if limit * a.itemsize <= (1 << 17):
        while h * 16 <= limit:
            for i in range(0, n, 16 * h):
                for j in range(i, i + h, lanes):
                    _v16(a, j, h)
            h *= 16
    while h * 8 <= limit:
        for i in range(0, n, 8 * h):
            for j in range(i, i + h, lanes):
                _v8(a, j, h)
        h *= 8
    return h


@_jit
def _stages_slices(a, h, limit):  # type: ignore[no-untyped-def]
    """The butterfly levels of half-width h, 2h, ..., limit / 2 (powers of two, limit <= a.size), in
    place: radix-4 stages while they fit, then one radix-2. The operands of a butterfly are separate
    slices (distinct pointers): LLVM checks four apart once per loop and vectorizes the inner loop
    (radix-8 stages over eight slices do not vectorize)."""
    n = a.size
    while h * 4 <= limit:
        for i in range(0, n, 4 * h):
            p0 = a[i : i + h]
            p1 = a[i + h : i + 2 * h]
            p2 = a[i + 2 * h : i + 3 * h]
            p3 = a[i + 3 * h : i + 4 * h]
            for j in range(h):
                x0 = p0[j]
                x1 = p1[j]
                x2 = p2[j]
                x3 = p3[j]
                s0 = x0 + x1
                d0 = x0 - x1
                s1 = x2 + x3
                d1 = x2 - x3
                p0[j] = s0 + s1
                p1[j] = d0 + d1
                p2[j] = s0 - s1
                p3[j] = d0 - d1
        h *= 4
    if h * 2 <= limit:
        for i in range(0, n, 2 * h):
            p0 = a[i : i + h]
            p1 = a[i + h : i + 2 * h]
            for j in range(h):
                x0 = p0[j]
                x1 = p1[j]
                p0[j] = x0 + x1
                p1[j] = x0 - x1


@_jit_sum
def _signed_copy(dst, src, base, words, scale):  # type: ignore[no-untyped-def]
    """dst[i] = src[i] * (+-scale), the sign of global element base + i from bit (base+i) % 64 of
    words[(base+i) // 64] (1 -> minus); no words: +scale. base is a multiple of 64 (or 0); dst and src
    may be the same array. Returns sum src[i]^2 (float64; reassoc only reorders this sum, each dst[i]
    is one IEEE multiplication)."""
    m = src.size
    total = 0.0
    if words.size == 0:
        for i in range(m):
            v = src[i]
            dst[i] = v * scale
            vd = np.float64(v)
            total += vd * vd
        return total
    neg = -scale
    w0 = base >> 6
    full = m >> 6
    for w in range(full):  # one word per 64 elements: a constant-trip inner loop LLVM vectorizes
        word = words[w0 + w]
        d = dst[64 * w : 64 * w + 64]
        s = src[64 * w : 64 * w + 64]
        for b in range(64):
            v = s[b]
            d[b] = v * (neg if (word >> np.uint64(b)) & np.uint64(1) else scale)
            vd = np.float64(v)
            total += vd * vd
    for i in range(64 * full, m):
        k = base + i
        bit = (words[k >> 6] >> np.uint64(k & 63)) & np.uint64(1)
        v = src[i]
        dst[i] = v * (neg if bit else scale)
        vd = np.float64(v)
        total += vd * vd
    return total


@_jit_sum
def _sumsq(a):  # type: ignore[no-untyped-def]
    s = 0.0
    for i in range(a.size):
        v = np.float64(a[i])
        s += v * v
    return s


@_jit
def _block_levels(blk):  # type: ignore[no-untyped-def]
    """All butterfly levels inside one block (a power of two), in place."""
    if blk.size >= 8:
        _first_plain(blk)
        _stages(blk, _first_h(blk.size))
    else:
        _stages(blk, 1)


@_jit
def _fwht_core(src, a, pre_words, pre_scale, block_bits, inplace):  # type: ignore[no-untyped-def]
    """A forward rotation: a = H (pre_signs * pre_scale * [src, 0...]) with H the unnormalised Hadamard
    matrix of size a.size (a power of two >= src.size); src may be a itself (then `inplace`). Returns
    ||a||^2 as a.size * pre_scale^2 * ||src||^2 (float64; H / sqrt(n) is orthonormal, so this is the
    norm of the result up to its rounding) — summed while src is read, no pass of its own."""
    n = a.size
    d = src.size
    bsz = min(n, 1 << block_bits)
    total = 0.0
    for base in range(0, n, bsz):
        blk = a[base : base + bsz]
        hi = min(max(d - base, 0), bsz)
        if hi == bsz and bsz >= 8 and pre_words.size > 0:  # a full block: signs fused into levels 0..2
            sb = pre_words.view(np.uint8)[base // 8 :]
            if inplace:  # one array: LLVM vectorizes; two views of one array fail its overlap check
                total += _sumsq(blk)
                _first_signed_inplace(blk, sb, pre_scale)
            else:
                sblk = src[base : base + bsz]
                total += _sumsq(sblk)
                _first_signed(blk, sblk, sb, pre_scale)
            _stages(blk, _first_h(bsz))
            continue
        if inplace and pre_words.size == 0:
            total += _scale_inplace(blk, pre_scale)
            _block_levels(blk)
            continue
        if hi > 0:
            total += _signed_copy(blk[:hi], src[base : base + hi], base, pre_words, pre_scale)
        for i in range(hi, bsz):
            blk[i] = 0.0
        _block_levels(blk)
    if n > bsz:
        _stages(a, bsz)  # outer levels: radix-4 passes over the whole vector, 4 sequential streams each
    ps = np.float64(pre_scale)
    return n * ps * ps * total


@_jit
def _fwht_signed(packed, bits, table, a, post_words, post_scale, block_bits):  # type: ignore[no-untyped-def]
    """An inverse rotation: a = post_signs * post_scale * H x, the signs applied inside the last
    butterfly stage; nothing is summed. x = table[indices of `packed`] when `packed` is not empty (the
    unpacking and centroid lookup fill each block in place of a pass of their own), else a itself."""
    n = a.size
    bsz = min(n, 1 << block_bits)
    for base in range(0, n, bsz):
        blk = a[base : base + bsz]
        if packed.size == 0:
            pass
        elif bits == 2 and bsz % 8 == 0:  # the common case: lookup fused into levels 0..2
            _first_lookup2(blk, packed[base // 4 : base // 4 + bsz // 4], table)
            _stages(blk, _first_h(bsz))
            if n == bsz:
                _sign_inplace(blk, post_words, post_scale)
            continue
        elif bsz % 8 == 0:
            lo = (base * bits) // 8
            _lookup(packed[lo : lo + (bsz * bits) // 8], bits, table, blk)
        else:  # n < 8: the whole (single) block
            _lookup(packed, bits, table, blk)
        _block_levels(blk)
        if n == bsz:
            _sign_inplace(blk, post_words, post_scale)
    if n > bsz:
        _stages_signed(a, bsz, post_words, post_scale)


@_jit
def _stages_signed(a, h, words, scale):  # type: ignore[no-untyped-def]
    """_stages(a, h) then a *= +-scale (signs as in _signed_copy), the signs applied inside the last
    stage (one radix-4 or radix-2 over the whole vector) instead of in a pass of their own.
    h < a.size, a.size / 4 is a multiple of 64 and words holds a.size / 64 words."""
    n = a.size
    neg = -scale
    one = np.uint64(1)
    if 2 * h == n:  # one level left: a signed radix-2
        hh = n // 2
        p0 = a[0:hh]
        p1 = a[hh:n]
        for w in range(hh >> 6):
            w0 = words[w]
            w1 = words[(hh >> 6) + w]
            q0 = p0[64 * w : 64 * w + 64]
            q1 = p1[64 * w : 64 * w + 64]
            for b in range(64):
                x0 = q0[b]
                x1 = q1[b]
                sb = np.uint64(b)
                q0[b] = (x0 + x1) * (neg if (w0 >> sb) & one else scale)
                q1[b] = (x0 - x1) * (neg if (w1 >> sb) & one else scale)
        return
    hh = n // 4
    _stages_to(a, h, hh)  # every level below half-width hh
    p0 = a[0:hh]
    p1 = a[hh : 2 * hh]
    p2 = a[2 * hh : 3 * hh]
    p3 = a[3 * hh : n]
    ws = hh >> 6
    for w in range(ws):
        w0 = words[w]
        w1 = words[ws + w]
        w2 = words[2 * ws + w]
        w3 = words[3 * ws + w]
        q0 = p0[64 * w : 64 * w + 64]
        q1 = p1[64 * w : 64 * w + 64]
        q2 = p2[64 * w : 64 * w + 64]
        q3 = p3[64 * w : 64 * w + 64]
        for b in range(64):
            x0 = q0[b]
            x1 = q1[b]
            x2 = q2[b]
            x3 = q3[b]
            s0 = x0 + x1
            d0 = x0 - x1
            s1 = x2 + x3
            d1 = x2 - x3
            sb = np.uint64(b)
            q0[b] = (s0 + s1) * (neg if (w0 >> sb) & one else scale)
            q1[b] = (d0 + d1) * (neg if (w1 >> sb) & one else scale)
            q2[b] = (s0 - s1) * (neg if (w2 >> sb) & one else scale)
            q3[b] = (d0 - d1) * (neg if (w3 >> sb) & one else scale)


_NO_WORDS = np.zeros(0, np.uint64)
_NO_U8 = np.zeros(0, np.uint8)
_NO_TABLE = {np.float32: np.zeros(1, np.float32), np.float64: np.zeros(1, np.float64)}


def _check_float(a: FloatArray) -> None:
    """The array an in-place kernel may take (numba's own error for a read-only one is a typing error
    that names none of this)."""
    if a.ndim != 1 or a.dtype not in (np.float32, np.float64) or not a.flags.c_contiguous:
        raise TypeError("needs a contiguous 1-D float32 or float64 array")
    if not a.flags.writeable:
        raise ValueError("output array is read-only: the transform works in place (pass a copy)")


def fwht(a: FloatArray, scratch: FloatArray | None = None) -> FloatArray:
    """Orthonormal Walsh–Hadamard transform of `a` (1-D float32/float64, length 2**n), in place;
    returns `a` (same contract as rht.fwht; `scratch` is accepted and unused)."""
    if a.ndim != 1 or a.dtype not in (np.float32, np.float64):
        raise TypeError("fwht needs a 1-D float32 or float64 array")
    n = a.size
    if n & (n - 1):
        raise ValueError(f"fwht length must be a power of two, got {n}")
    if n <= 1:
        return a
    _check_float(a)
    _fwht_core(a, a, _NO_WORDS, a.dtype.type(1.0 / math.sqrt(n)), _block_bits(a.dtype), True)
    return a


def _check_rotations(rotations: int) -> None:
    from .rht import _check_rotations as check

    check(rotations)


def rotate_from(
    x: FloatArray, padded: int, dtype: np.dtype[np.floating], seed: int, rotations: int,
) -> tuple[FloatArray, float]:
    """(y, ||y||^2): x (1-D, any float dtype, length <= padded) zero-padded to `padded`, in `dtype`,
    rotated by rotations 0 .. rotations-1 — one pass fuses the copy, padding, signs and scale."""
    _check_rotations(rotations)
    src = np.ascontiguousarray(x, dtype=dtype)
    y = np.empty(padded, dtype)
    ny2 = _rotate_into(src, y, seed, 0)
    for k in range(1, rotations):
        ny2 = _rotate_into(y, y, seed, k)
    return y, ny2


def _rotate_into(src: FloatArray, y: FloatArray, seed: int, k: int) -> float:
    n = y.size
    words = sign_words(seed, k, n, STREAM_ROTATION)
    scale = y.dtype.type(1.0 / math.sqrt(n))
    return float(_fwht_core(src, y, words, scale, _block_bits(y.dtype), src is y))


def rotate(y: FloatArray, seed: int, rotations: int, start: int = 0) -> FloatArray:
    """rht.rotate, in place (returns y)."""
    _check_rotations(start + rotations)
    _check_float(y)
    for k in range(start, start + rotations):
        _rotate_into(y, y, seed, k)
    return y


def unrotate(y: FloatArray, seed: int, rotations: int) -> FloatArray:
    """rht.unrotate, in place (returns y): H then the signs (fused into the last pass), in reverse."""
    _check_rotations(rotations)
    _check_float(y)
    n = y.size
    scale = y.dtype.type(1.0 / math.sqrt(n))
    for k in reversed(range(rotations)):
        words = sign_words(seed, k, n, STREAM_ROTATION)
        _fwht_signed(_NO_U8, 1, _NO_TABLE[y.dtype.type], y, words, scale, _block_bits(y.dtype))
    return y


def unrotate_packed(
    packed: U8, bits: int, table: FloatArray, n: int, seed: int, rotations: int,
    out: FloatArray | None = None,
) -> FloatArray:
    """unrotate(table[indices], seed, rotations) for one packed section of n indices (size and padding
    already checked): the unpacking and lookup are fused into the first inverse rotation. `out`: a
    contiguous array of n elements of the table's dtype to write the result into (returned)."""
    _check_rotations(rotations)
    if out is None:
        y = np.empty(n, table.dtype)
    else:
        if out.shape != (n,) or out.dtype != table.dtype or not out.flags.c_contiguous:
            raise ValueError(f"unrotate_packed: out must be a contiguous ({n},) {table.dtype} array")
        y = out
    scale = y.dtype.type(1.0 / math.sqrt(n))
    words = sign_words(seed, rotations - 1, n, STREAM_ROTATION)
    _fwht_signed(np.ascontiguousarray(packed), bits, np.ascontiguousarray(table), y, words, scale,
                 _block_bits(y.dtype))
    if rotations > 1:
        unrotate(y, seed, rotations - 1)
    return y


def sumsq(y: FloatArray) -> float:
    """||y||^2 accumulated in float64."""
    return float(_sumsq(y))


# -------------------------------------------------------------------------------- moment statistic


@_jit_sum
def _moments(v):  # type: ignore[no-untyped-def]
    s2 = 0.0
    s4 = 0.0
    for i in range(v.size):
        x = np.float64(v[i])
        x2 = x * x
        s2 += x2
        s4 += x2 * x2
    return s2, s4


@_jit_sum
def _moments_scaled(v):  # type: ignore[no-untyped-def]
    peak = 0.0
    for i in range(v.size):
        peak = max(peak, abs(v[i]))
    if peak == 0.0 or not np.isfinite(peak):
        return 0.0, 0.0
    inv = 1.0 / peak
    s2 = 0.0
    s4 = 0.0
    for i in range(v.size):
        x = v[i] * inv
        x2 = x * x
        s2 += x2
        s4 += x2 * x2
    return s2, s4


@_jit
def _moments_blocked(v, bsz):  # type: ignore[no-untyped-def]
    """_moments summed block by block (blocks of bsz, in order): the fused hop kernel (hop.py) gets the
    moments of each block while it is in cache, and must reach the same sums bit for bit."""
    s2 = 0.0
    s4 = 0.0
    for base in range(0, v.size, bsz):
        a2, a4 = _moments(v[base : base + bsz])
        s2 += a2
        s4 += a4
    return s2, s4


def participation(x: FloatArray) -> float:
    """rho(x) = sum x^4 / (sum x^2)^2 (rht.participation) in one pass. float16/32 inputs: x^4 of a
    float32 cannot overflow float64, so no rescaling (summed per FWHT block, as the hop kernel does);
    float64: scaled by max|x| first (two passes)."""
    v = np.asarray(x).ravel()
    if v.size == 0:
        return 0.0
    if v.dtype == np.float64:
        s2, s4 = _moments_scaled(np.ascontiguousarray(v))
    else:
        if v.dtype != np.float32:
            v = v.astype(np.float32)
        s2, s4 = _moments_blocked(np.ascontiguousarray(v), 1 << _block_bits(np.dtype(np.float32)))
    if not (s2 > 0.0 and math.isfinite(s2) and math.isfinite(s4)):
        return 0.0
    return float(s4 / (s2 * s2))


# ----------------------------------------------------------------------------------- quantization


@_jit_sum
def _quantize(y, thr, ext, cent, bits, sig, clip, clip0, with_q0, idx_out, packed):  # type: ignore[no-untyped-def]
    """Nearest centroid index of each y_i (count of thresholds below it; ties go down) and the sums
    (rc, cc, q, q0) of eden.nearest; the indices go to idx_out (uint8, when its size is y.size) and/or
    packed little-endian `bits` wide into `packed` (when its size is > 0)."""
    n = y.size
    ib = np.zeros(_CHUNK, np.int32)
    cv = np.empty(_CHUNK, y.dtype)
    rc = 0.0
    cc = 0.0
    q = 0.0
    q0 = 0.0
    nthr = thr.size
    want_idx = idx_out.size == n
    want_pack = packed.size > 0
    c0 = cent[0]
    t0 = thr[0]
    t1 = thr[min(1, nthr - 1)]
    t2 = thr[min(2, nthr - 1)]
    k1 = cent[min(1, cent.size - 1)]
    k2 = cent[min(2, cent.size - 1)]
    k3 = cent[min(3, cent.size - 1)]
    for base in range(0, n, _CHUNK):
        m = min(_CHUNK, n - base)
        ych = y[base : base + m]
        if bits == 2:
            # index and centroid by two compares and selects, sums in the same vectorized loop
            for i in range(m):
                v = ych[i]
                b1 = v > t1
                b0 = v > (t2 if b1 else t0)
                ib[i] = np.int32(b1) * 2 + np.int32(b0)
                c = (k3 if b0 else k2) if b1 else (k1 if b0 else c0)
                r = v - sig * c
                c64 = np.float64(c)
                rc += np.float64(r) * c64
                cc += c64 * c64
                q += np.float64(min(r * r, clip))
        else:
            if bits == 4:
                _search16(ych, thr, ib)
                for i in range(m):
                    cv[i] = cent[ib[i]]
            elif bits <= 3:
                # one vectorized pass per threshold over the L1-resident chunk: index count and centroid
                # (a select, no gather) together
                for i in range(m):
                    ib[i] = 0
                    cv[i] = c0
                for t in range(nthr):
                    tv = thr[t]
                    cn = cent[t + 1]
                    for i in range(m):
                        gt = ych[i] > tv
                        ib[i] += np.int32(gt)
                        cv[i] = cn if gt else cv[i]
            else:  # branch-free binary search over the cell upper edges
                for i in range(m):
                    ib[i] = 0
                step = 1 << (bits - 1)
                while step:
                    for i in range(m):
                        if ych[i] > ext[ib[i] + step - 1]:
                            ib[i] += step
                    step >>= 1
                for i in range(m):
                    cv[i] = cent[ib[i]]
            # (a gather in this loop would keep LLVM from vectorizing it: centroids come from cv)
            for i in range(m):
                c = cv[i]
                r = ych[i] - sig * c
                c64 = np.float64(c)
                rc += np.float64(r) * c64
                cc += c64 * c64
                q += np.float64(min(r * r, clip))
        if with_q0:
            for i in range(m):
                yv = ych[i]
                q0 += np.float64(min(yv * yv, clip0))
        if want_idx:
            for i in range(m):
                idx_out[base + i] = np.uint8(ib[i])
        if want_pack:
            _pack_chunk(ib, m, bits, packed, (base * bits) // 8)
    return rc, cc, q, q0


@_jit
def _search16(ych, thr, ib):  # type: ignore[no-untyped-def]
    """ib[i] = number of the 15 thresholds below ych[i] (ties go down): a 4-level binary search written
    as selects between scalars, so the loop over i vectorizes (no per-element branches or gathers)."""
    t0 = thr[0]
    t1 = thr[1]
    t2 = thr[2]
    t3 = thr[3]
    t4 = thr[4]
    t5 = thr[5]
    t6 = thr[6]
    t7 = thr[7]
    t8 = thr[8]
    t9 = thr[9]
    t10 = thr[10]
    t11 = thr[11]
    t12 = thr[12]
    t13 = thr[13]
    t14 = thr[14]
    for i in range(ych.size):
        v = ych[i]
        b3 = v > t7
        b2 = v > (t11 if b3 else t3)
        b1 = v > ((t13 if b2 else t9) if b3 else (t5 if b2 else t1))
        if b3:
            u = (t14 if b1 else t12) if b2 else (t10 if b1 else t8)
        else:
            u = (t6 if b1 else t4) if b2 else (t2 if b1 else t0)
        b0 = v > u
        ib[i] = np.int32(b3) * 8 + np.int32(b2) * 4 + np.int32(b1) * 2 + np.int32(b0)


@_jit
def _pack_chunk(ib, m, bits, out, pos):  # type: ignore[no-untyped-def]
    """Pack ib[:m] (m a multiple of 8 unless it is the last chunk) at byte `pos` of out."""
    if bits == 8:
        for i in range(m):
            out[pos + i] = np.uint8(ib[i])
    elif bits == 4:
        full = m // 2
        for j in range(full):
            out[pos + j] = np.uint8(ib[2 * j] | (ib[2 * j + 1] << 4))
        if m & 1:
            out[pos + full] = np.uint8(ib[m - 1])
    elif bits == 2:
        full = m // 4
        for j in range(full):
            b = 4 * j
            out[pos + j] = np.uint8(ib[b] | (ib[b + 1] << 2) | (ib[b + 2] << 4) | (ib[b + 3] << 6))
        rest = m - 4 * full
        if rest:
            v = 0
            for k in range(rest):
                v |= ib[4 * full + k] << (2 * k)
            out[pos + full] = np.uint8(v)
    elif bits == 1:
        full = m // 8
        for j in range(full):
            b = 8 * j
            out[pos + j] = np.uint8(
                ib[b] | (ib[b + 1] << 1) | (ib[b + 2] << 2) | (ib[b + 3] << 3) | (ib[b + 4] << 4)
                | (ib[b + 5] << 5) | (ib[b + 6] << 6) | (ib[b + 7] << 7)
            )
        rest = m - 8 * full
        if rest:
            v = 0
            for k in range(rest):
                v |= ib[8 * full + k] << k
            out[pos + full] = np.uint8(v)
    else:  # 3, 5, 6, 7: a bit accumulator, flushed byte by byte
        acc = np.uint64(0)
        nacc = 0
        p = pos
        for i in range(m):
            acc |= np.uint64(ib[i]) << np.uint64(nacc)
            nacc += bits
            while nacc >= 8:
                out[p] = np.uint8(acc & np.uint64(0xFF))
                acc >>= np.uint64(8)
                nacc -= 8
                p += 1
        if nacc > 0:
            out[p] = np.uint8(acc & np.uint64(0xFF))


Scalar = np.floating[Any]


def _prep(
    y: FloatArray, bits: int, sigma: float,
) -> tuple[FloatArray, FloatArray, FloatArray, Scalar, Scalar, Scalar]:
    """Thresholds exactly as eden.nearest computes them (so indices match for the same y and sigma)."""
    cent, t = _tables(bits, y.dtype)
    thr = t * y.dtype.type(sigma)
    ext = np.concatenate((thr, [np.inf])).astype(y.dtype)
    sig = y.dtype.type(sigma)
    clip = y.dtype.type(error_clip(bits) * sigma * sigma)
    clip0 = y.dtype.type(error_clip(0) * sigma * sigma)
    return np.ascontiguousarray(thr, y.dtype), ext, cent, sig, clip, clip0


def nearest(y: FloatArray, bits: int, sigma: float, with_q0: bool = False) -> tuple[U8, GroupStats]:
    """eden.nearest: (uint8 indices, GroupStats)."""
    y = np.ascontiguousarray(y)
    thr, ext, cent, sig, clip, clip0 = _prep(y, bits, sigma)
    idx = np.empty(y.size, np.uint8)
    rc, cc, q, q0 = _quantize(y, thr, ext, cent, bits, sig, clip, clip0, with_q0, idx, _NO_U8)
    return idx, GroupStats(float(rc), float(cc), float(q), float(q0))


def nearest_packed(y: FloatArray, bits: int, sigma: float, with_q0: bool = False) -> tuple[U8, GroupStats]:
    """eden.nearest followed by bitpack.pack, fused: (packed bytes, GroupStats)."""
    y = np.ascontiguousarray(y)
    thr, ext, cent, sig, clip, clip0 = _prep(y, bits, sigma)
    packed = np.empty((y.size * bits + 7) // 8, np.uint8)
    if packed.size == 0:
        return packed, GroupStats()
    rc, cc, q, q0 = _quantize(y, thr, ext, cent, bits, sig, clip, clip0, with_q0, _NO_U8, packed)
    return packed, GroupStats(float(rc), float(cc), float(q), float(q0))


@_jit_sum
def _clipped_sumsq(y, clip):  # type: ignore[no-untyped-def]
    s = 0.0
    for i in range(y.size):
        v = y[i]
        s += np.float64(min(v * v, clip))
    return s


def clipped_sumsq(y: FloatArray, clip: float) -> float:
    """sum min(y_i^2, clip) (clip in y's dtype), float64 accumulation."""
    return float(_clipped_sumsq(np.ascontiguousarray(y), y.dtype.type(clip)))


# ------------------------------------------------------------------------------------------ decode


@_jit
def _lookup(packed, bits, table, out):  # type: ignore[no-untyped-def]
    """out[i] = table[index i of the packed stream] for i < out.size."""
    n = out.size
    if bits == 8:
        for i in range(n):
            out[i] = table[packed[i]]
    elif bits == 4:
        full = n // 2
        for j in range(full):
            v = packed[j]
            out[2 * j] = table[v & 15]
            out[2 * j + 1] = table[v >> 4]
        if n & 1:
            out[n - 1] = table[packed[full] & 15]
    elif bits == 2:
        full = n // 4
        for j in range(full):
            v = packed[j]
            out[4 * j] = table[v & 3]
            out[4 * j + 1] = table[(v >> 2) & 3]
            out[4 * j + 2] = table[(v >> 4) & 3]
            out[4 * j + 3] = table[v >> 6]
        for i in range(4 * full, n):
            out[i] = table[(packed[full] >> (2 * (i - 4 * full))) & 3]
    elif bits == 1:
        full = n // 8
        for j in range(full):
            v = packed[j]
            for k in range(8):
                out[8 * j + k] = table[(v >> k) & 1]
        for i in range(8 * full, n):
            out[i] = table[(packed[full] >> (i - 8 * full)) & 1]
    else:
        mask = (1 << bits) - 1
        acc = np.int64(0)
        nacc = 0
        p = 0
        for i in range(n):
            while nacc < bits:
                acc |= np.int64(packed[p]) << nacc
                p += 1
                nacc += 8
            out[i] = table[acc & mask]
            acc >>= bits
            nacc -= bits


def lookup(packed: U8, bits: int, n: int, table: FloatArray) -> FloatArray:
    """table[index] for the n indices of a packed section (its size and padding already checked)."""
    out = np.empty(n, table.dtype)
    if n:
        _lookup(np.ascontiguousarray(packed), bits, np.ascontiguousarray(table), out)
    return out


# ------------------------------------------------------------------------------------ fused ring hop


@_jit
def _hop_inverse_head(packed, bits, table, a, block_bits):  # type: ignore[no-untyped-def]
    """_fwht_signed up to (not including) its last butterfly stage, for a.size > one block: the lookup
    fused into the block levels, then the outer levels but the last radix-4 (or radix-2) one. The same
    calls in the same order as _fwht_signed and _stages_signed, so the values are theirs bit for bit."""
    n = a.size
    bsz = 1 << block_bits
    for base in range(0, n, bsz):
        blk = a[base : base + bsz]
        if bits == 2:
            _first_lookup2(blk, packed[base // 4 : base // 4 + bsz // 4], table)
            _stages(blk, _first_h(bsz))
            continue
        lo = (base * bits) // 8
        _lookup(packed[lo : lo + (bsz * bits) // 8], bits, table, blk)
        _block_levels(blk)
    if 2 * bsz != n:
        _stages_to(a, bsz, n // 4)


@_jit
def _add_into(dst, src):  # type: ignore[no-untyped-def]
    """dst += src (float32, as numpy's in-place add: one IEEE addition per element)."""
    for i in range(dst.size):
        dst[i] = dst[i] + src[i]


@_jit
def _hop_block(a, base, bsz, own, d, fwd_words, fwd_scale, tot, m2, m4, bi):  # type: ignore[no-untyped-def]
    """Block `bi` (at `base`) of the decoded incoming vector is complete in `a`: add the local chunk
    (coordinates >= d become the encoder's zero padding), take the block's moments (rule a) and apply the
    forward rotation's signs, scale and block levels, as _fwht_core does for a full or partial block."""
    blk = a[base : base + bsz]
    hi = min(max(d - base, 0), bsz)
    _add_into(blk[:hi], own[base : base + hi])
    for i in range(hi, bsz):
        blk[i] = 0.0
    if hi > 0:
        a2, a4 = _moments(blk[:hi])
        m2[bi] = a2
        m4[bi] = a4
    if hi == bsz:
        tot[bi] = _sumsq(blk)
        _first_signed_inplace(blk, fwd_words.view(np.uint8)[base // 8 :], fwd_scale)
        _stages(blk, _first_h(bsz))
    else:
        if hi > 0:
            # from a copy, as _fwht_core reads its separate source: with dst and src the same array LLVM's
            # overlap check sends the loop to its scalar version, whose float64 sum (reassoc) rounds
            # differently from the vectorised one and changed the frame's scale (d not a power of two)
            src = blk[:hi].copy()
            tot[bi] = _signed_copy(blk[:hi], src, base, fwd_words, fwd_scale)
        _block_levels(blk)


@_jit
def _hop_fused(a, own, d, inv_words, inv_scale, fwd_words, fwd_scale, block_bits, tot, m2, m4):  # type: ignore[no-untyped-def]
    """The incoming vector's last inverse butterfly stage (with its signs and scale, as _stages_signed),
    chunk by chunk: each chunk of bsz butterflies completes 4 (radix-4) or 2 (radix-2) blocks of the
    decoded vector, which _hop_block turns into blocks of the forward rotation while they are in cache;
    then the forward rotation's outer levels. tot/m2/m4 get per-block sums (added in block order by the
    caller, as _fwht_core and _moments_blocked add them)."""
    n = a.size
    bsz = 1 << block_bits
    one = np.uint64(1)
    neg = -inv_scale
    scale = inv_scale
    if 2 * bsz == n:
        hh = n // 2
        p0 = a[0:hh]
        p1 = a[hh:n]
        for c in range(0, hh, bsz):
            for w in range(c >> 6, (c + bsz) >> 6):
                w0 = inv_words[w]
                w1 = inv_words[(hh >> 6) + w]
                q0 = p0[64 * w : 64 * w + 64]
                q1 = p1[64 * w : 64 * w + 64]
                for b in range(64):
                    x0 = q0[b]
                    x1 = q1[b]
                    sb = np.uint64(b)
                    q0[b] = (x0 + x1) * (neg if (w0 >> sb) & one else scale)
                    q1[b] = (x0 - x1) * (neg if (w1 >> sb) & one else scale)
            for q in range(2):
                base = q * hh + c
                _hop_block(a, base, bsz, own, d, fwd_words, fwd_scale, tot, m2, m4, base // bsz)
    else:
        hh = n // 4
        p0 = a[0:hh]
        p1 = a[hh : 2 * hh]
        p2 = a[2 * hh : 3 * hh]
        p3 = a[3 * hh : n]
        ws = hh >> 6
        for c in range(0, hh, bsz):
            for w in range(c >> 6, (c + bsz) >> 6):
                w0 = inv_words[w]
                w1 = inv_words[ws + w]
                w2 = inv_words[2 * ws + w]
                w3 = inv_words[3 * ws + w]
                q0 = p0[64 * w : 64 * w + 64]
                q1 = p1[64 * w : 64 * w + 64]
                q2 = p2[64 * w : 64 * w + 64]
                q3 = p3[64 * w : 64 * w + 64]
                for b in range(64):
                    x0 = q0[b]
                    x1 = q1[b]
                    x2 = q2[b]
                    x3 = q3[b]
                    s0 = x0 + x1
                    d0 = x0 - x1
                    s1 = x2 + x3
                    d1 = x2 - x3
                    sb = np.uint64(b)
                    q0[b] = (s0 + s1) * (neg if (w0 >> sb) & one else scale)
                    q1[b] = (d0 + d1) * (neg if (w1 >> sb) & one else scale)
                    q2[b] = (s0 - s1) * (neg if (w2 >> sb) & one else scale)
                    q3[b] = (d0 - d1) * (neg if (w3 >> sb) & one else scale)
            for q in range(4):
                base = q * hh + c
                _hop_block(a, base, bsz, own, d, fwd_words, fwd_scale, tot, m2, m4, base // bsz)
    _stages(a, bsz)


def hop_rotate(
    packed: U8, bits: int, table: FloatArray, n: int, seed_in: int, own: FloatArray, seed_out: int,
) -> tuple[FloatArray, float, float, float]:
    """One pass for the data-heavy part of a ring hop: y = rotation 0 of seed_out applied to
    (unrotate(table[packed], seed_in, 1)[:d] + own, zero-padded to n), with d = own.size. Returns
    (y, ||y||^2, s2, s4): ||y||^2 as rotate_from gives it, s2/s4 the moments participation() takes of
    the sum. Bit-identical to decode + add + rotate_from (tests/unit/test_quant_hop.py). Needs float32,
    one packed section of n indices (checked), n larger than one block."""
    bb = _block_bits(table.dtype)
    bsz = 1 << bb
    if n <= bsz or table.dtype != np.float32 or own.dtype != np.float32 or own.size > n:
        raise ValueError("hop_rotate: float32, more than one block, len(own) <= n")
    a = np.empty(n, np.float32)
    scale = np.float32(1.0 / math.sqrt(n))
    _hop_inverse_head(np.ascontiguousarray(packed), bits, np.ascontiguousarray(table), a, bb)
    nb = n // bsz
    tot = np.zeros(nb, np.float64)
    m2 = np.zeros(nb, np.float64)
    m4 = np.zeros(nb, np.float64)
    inv_words = sign_words(seed_in, 0, n, STREAM_ROTATION)
    fwd_words = sign_words(seed_out, 0, n, STREAM_ROTATION)
    _hop_fused(a, np.ascontiguousarray(own), own.size, inv_words, scale, fwd_words, scale, bb, tot, m2, m4)
    total = 0.0
    s2 = 0.0
    s4 = 0.0
    for k in range(nb):  # in block order, as _fwht_core and _moments_blocked accumulate
        total += float(tot[k])
        s2 += float(m2[k])
        s4 += float(m4[k])
    ps = float(np.float64(scale))
    return a, n * ps * ps * total, s2, s4
