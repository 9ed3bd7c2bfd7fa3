"""The compressed-vector wire format (versions 1 and 2) and the encode/decode entry points.

One compressed vector, all integers little-endian::

    offset size  field
    0      4     magic "MRCQ"
    4      1     version = 1
    5      1     scheme: 1 eden-unbiased, 2 eden-biased, 3 drive, 4 turboquant-mse, 5 turboquant-prod
    6      1     dtype of the original array: 1 float16, 2 float32, 3 float64
    7      1     rotations (1..3)
    8      1     flags: bit 0 = rotation count chosen by `auto`; other bits must be 0
    9      1     ndim (0..32)
    10     2     nscales (u16)
    12     8     bits: the budget b (float64, 0 < b <= 8)
    20     8     seed (u64): rotations, masks and the QJL sketch derive from it
    28     8     d: number of elements (= product of the shape)
    36     8     D: padded size, the next power of two >= max(d, 1)
    44     8*ndim        shape
    ..     8*nscales     scales (float64): EDEN/DRIVE/TurboQuant_mse: [S];
                         TurboQuant_prod: [S_mse (0 when b = 1), ||r_block|| for each QJL block]
    ..     8     payload length P
    ..     P     payload: the sections, each packed on its own (bitpack.py) and byte-aligned:
                 EDEN/DRIVE/TurboQuant_mse: the indices of each coordinate group (eden.parts order);
                 TurboQuant_prod: the (b-1)-bit indices (b >= 2), then D QJL sign bits
    ..     4     CRC-32 (zlib) of everything before it

Version 2 (grouped scales, `encode(..., group=G)`, EDEN/DRIVE schemes only) is the same layout with
nscales = D / G > 1 scales, one per block of G consecutive coordinates of the rotated vector (G a power
of two, MIN_GROUP <= G < D): block j decodes as scales[j] * c (c the unit Lloyd–Max centroids of its
indices), its scale fitted to that block alone (unbiased: ||y_j||^2 / <y_j, c_j>; biased: the least
squares multiple). The indices are those of the block-normalised vector z_j = y_j sqrt(G) / ||y_j||,
in the version-1 section order and masks. The encoder writes version 1 (same bytes as before) unless a
group smaller than D is asked for; the decoder reads both. Grouped frames are quantized by the numpy
reference on both backends and choose their rotation count by rule (a) alone (adaptive.py).

Everything random is regenerated from the seed with PCG64(SeedSequence((seed, stream, i))).random_raw:
stream 1 = the signs of rotation i (rht.py), 2 = the Bernoulli group mask of fractional / b < 1 budgets
(eden.py), 3 = the QJL Gaussian (turboquant.py). Indices are the Lloyd–Max cell numbers, 0 = most negative.

Decoding checks every field against the others and raises `CodecError(reason)` on the first
inconsistency — never returns an array from a malformed buffer, nor a non-finite value: a frame whose
scales cannot describe finite output (the lookup table would overflow the compute dtype, or the inverse
rotation's sums do) is refused naming the scale. Only seeds and scalars travel.

Range: the encoder rescales a rotated vector whose squares would underflow the compute dtype by an exact
power of two and folds the factor into the float64 scales, so tiny inputs (float32 ~1e-25) keep their
normal error and ordinary inputs encode to the same bytes. A float16 frame's reconstruction (computed in
float32) can leave the float16 range through quantization noise: `decode` saturates it to ±65504 and says
how many values with a `QuantRangeWarning`; `decode(buf, dtype=np.float32)` returns them unclipped.

Two implementations produce and read this format: the numba kernels (kernels.py, the default when numba
imports) and the numpy reference; MRC_QUANT_KERNELS=numba|numpy picks one per process (accel.py). A
buffer from either decodes with the other. They round differently (FWHT order, float64 sums), so the
decoded values agree to float tolerance, not bit for bit, and a coordinate within rounding of a cell
boundary may get the neighbouring index; on one path every result is deterministic.
"""

from __future__ import annotations

import math
import numbers
import os
import struct
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from mrc.errors import MrcError
from mrc.wire.crc import crc32

from . import accel, bitpack, eden, turboquant
from .adaptive import choose_rotations, fits_theory
from .rht import MAX_ROTATIONS, FloatArray, next_pow2, rotate, sumsq64, unrotate

MAGIC = b"MRCQ"
VERSION = 1
VERSION_GROUPED = 2
VERSIONS = (VERSION, VERSION_GROUPED)
GROUPED_SCHEMES = ("eden-unbiased", "eden-biased", "drive")
MIN_GROUP = 1 << 8
SCHEMES = {"eden-unbiased": 1, "eden-biased": 2, "drive": 3, "turboquant-mse": 4, "turboquant-prod": 5}
SCHEME_NAMES = {v: k for k, v in SCHEMES.items()}
DTYPES: dict[int, np.dtype[Any]] = {1: np.dtype(np.float16), 2: np.dtype(np.float32), 3: np.dtype(np.float64)}
DTYPE_CODES: dict[np.dtype[Any], int] = {v: k for k, v in DTYPES.items()}
FLAG_AUTO = 0x01
MAX_NDIM = 32
#: the smallest bit budget: below it a frame's payload says almost nothing about its element count (a
#: 72-byte frame at b = 1e-300 claimed 2^26 elements and its decode built 672 MB of masks and output);
#: at 1/64 bit every 512 coordinates cost about a payload byte, which bounds what a frame can make a
#: decoder allocate by its own size
MIN_BITS = 1.0 / 64.0
MAX_PADDED = 1 << 34
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504
# sigma^2 = ||y||^2 / D below which the encoder rescales y (exactly, by a power of two): the squared
# residuals the scales and the adaptive check sum must stay normal numbers of the compute dtype
_TINY_SIGMA2 = {np.dtype(np.float32): 2.0**-80, np.dtype(np.float64): 2.0**-600}
#: an input whose largest magnitude is below this loses bits in the rotation (1/sqrt(D) with D up to
#: 2^31 takes 2^-15.5 more; 24 or 53 bits of mantissa must stay normal): rescaled before it (`encode`)
_SUBNORMAL_RISK = {np.dtype(np.float32): 2.0**(-126 + 16 + 24), np.dtype(np.float64): 2.0**(-1022 + 16 + 53)}
# one rotation is exact when the realized relative squared error is within the sums' rounding
_EXACT_ERROR = {np.dtype(np.float32): 64 * float(np.finfo(np.float32).eps),
                np.dtype(np.float64): 64 * float(np.finfo(np.float64).eps)}
_NORMAL64 = 2.0**-1000
_SPIKE_RHO = 0.99  # rho(x) of an input with one non-zero coordinate is 1 (up to rounding)
# |G_ij| of the QJL Gaussian is at most sqrt(-2 ln 2^-53) (Box-Muller from 53-bit uniforms)
_QJL_COEF = math.sqrt(math.pi / 2.0) * math.sqrt(-2.0 * math.log(2.0**-53))

#: the largest float32 (float): energies above it do not fit the compute precision
F32_MAX = float(np.finfo(np.float32).max)
_FIXED = struct.Struct("<4sBBBBBBHdQQQ")
_U64 = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class CodecError(MrcError):
    """A compressed vector that cannot be produced or decoded; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"quant codec: {reason}")
        self.reason = reason


class CodecValueError(CodecError, ValueError):
    """An argument of the right type outside its allowed range (the message names it and the range)."""


class CodecTypeError(CodecError, TypeError):
    """An argument of the wrong type (bools are not integers here: `rotations=True` is refused)."""


class QuantRangeWarning(RuntimeWarning):
    """Decoded values beyond the output dtype's finite range were saturated (float16 frames)."""


def _is_int(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def check_seed(seed: object, none_ok: bool = True) -> int:
    """The seed as an int; CodecTypeError / CodecValueError for anything but an integer in [0, 2^64)
    (`none_ok`: the message says whether None, encode's "draw one", was an option for the caller)."""
    if not _is_int(seed):
        alt = " or None" if none_ok else " (this call needs an explicit seed)"
        raise CodecTypeError(f"seed must be an integer in [0, 2^64){alt}, got {type(seed).__name__} "
                             f"{seed!r}")
    value = int(cast(numbers.Integral, seed))
    if not 0 <= value < 1 << 64:
        raise CodecValueError(f"seed must be a 64-bit unsigned integer in [0, 2^64), got {value}")
    return value


def check_rotations(rotations: object) -> int | None:
    """The rotation count (None for 'auto'); CodecTypeError / CodecValueError otherwise."""
    if isinstance(rotations, str):
        if rotations == "auto":
            return None
        raise CodecValueError(f"rotations must be 1..{MAX_ROTATIONS} or 'auto', got {rotations!r}")
    if not _is_int(rotations):
        raise CodecTypeError(f"rotations must be an integer 1..{MAX_ROTATIONS} or 'auto', got "
                             f"{type(rotations).__name__} {rotations!r}")
    value = int(cast(numbers.Integral, rotations))
    if not 1 <= value <= MAX_ROTATIONS:
        raise CodecValueError(f"rotations must be 1..{MAX_ROTATIONS} or 'auto', got {value}")
    return value


@dataclass(frozen=True)
class Header:
    scheme: str
    dtype: np.dtype[Any]
    rotations: int
    auto: bool
    bits: float
    seed: int
    shape: tuple[int, ...]
    d: int
    padded: int
    scales: tuple[float, ...]
    payload_offset: int
    payload_length: int
    group: int = 0  # coordinates per scale: D for version 1, D / nscales for version 2

    @property
    def grouped(self) -> bool:
        return self.group != self.padded


def check_bits(scheme: str, bits: float) -> None:
    """Raise CodecError (a CodecTypeError or CodecValueError) if `bits` is not a valid budget for
    `scheme`."""
    if not isinstance(scheme, str):
        raise CodecTypeError(f"scheme must be a string (known: {', '.join(SCHEMES)}), got {scheme!r}")
    if scheme not in SCHEMES:
        raise CodecValueError(f"unknown scheme {scheme!r} (known: {', '.join(SCHEMES)})")
    if not isinstance(bits, numbers.Real) or isinstance(bits, (bool, np.bool_)):
        raise CodecTypeError(f"bit budget must be a number in [{MIN_BITS}, 8], got {type(bits).__name__} "
                             f"{bits!r}")
    if not (math.isfinite(bits) and MIN_BITS <= bits <= 8):
        raise CodecValueError(f"bit budget must be in [{MIN_BITS}, 8], got {bits!r}")
    if scheme == "drive" and bits != 1:
        raise CodecValueError(f"drive is the 1-bit scheme, got bits={bits}")
    if scheme.startswith("turboquant") and bits != int(bits):
        raise CodecValueError(f"{scheme} takes an integer bit budget, got {bits}")


#: Backend names a caller may mean the GPU by: there is none (numba's kernels are compiled for the CPU).
_GPU_BACKENDS = ("cuda", "gpu")


def check_backend(backend: object) -> ModuleType | None:
    """accel.kernels(`backend`), an unknown name refused here as CodecValueError naming it and the
    backends there are: accel's own ValueError would reach the caller as a plain ValueError, from
    deep inside encode / decode, and say nothing of a GPU."""
    if backend is not None and not isinstance(backend, str):
        raise CodecTypeError(f"backend must be one of {', '.join(accel.BACKENDS)} or None, got "
                             f"{type(backend).__name__} {backend!r}")
    if backend is not None and backend not in accel.BACKENDS:
        gpu = " (the codec runs on the CPU: this package has no GPU backend)" if (
            backend.lower() in _GPU_BACKENDS) else ""
        raise CodecValueError(f"unknown backend {backend!r}: available are {', '.join(accel.BACKENDS)}, or "
                              f"None for the process default ({accel.ENV}){gpu}")
    return accel.kernels(backend)


def compute_dtype(dtype: np.dtype[Any]) -> np.dtype[np.floating]:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _qjl_blocks(padded: int) -> int:
    return padded // turboquant.qjl_block(padded)


def encode(
    x: npt.ArrayLike, scheme: str, bits: float, *, seed: int | None = None, rotations: int | str = "auto",
    backend: str | None = None, group: int | None = None,
) -> bytes:
    """Compress an array of any shape (float16/32/64) into one self-describing buffer. `group`: one scale
    per block of that many rotated coordinates (a power of two >= MIN_GROUP; a version-2 frame when it
    is below the padded size D, else the ordinary version-1 frame); None: one scale. `backend`:
    'numba' or 'numpy' (same wire format, rounding may differ); None: the process default
    (MRC_QUANT_KERNELS, accel.py).

    `rotations="auto"` (adaptive.py, docs/quant.md §3) rotates once, or twice when the input's moment
    statistic (rule a) or the first quantization's error (rule b) shows that one rotation leaves the
    coordinates far from Gaussian: EDEN's unbiasedness and its error bound assume near-Gaussian rotated
    coordinates, which a lattice-like input does not give after one rotation. One exception: when one
    rotation and the optimised scale already reproduce the rotated vector exactly (to rounding, e.g. a
    one-hot input, whose rotation is a flat ±1/sqrt(D) vector), that frame is kept: its error is 0 for
    this draw, so it adds neither error nor bias, where a second rotation would make it lossy.

    Raises CodecTypeError (wrong type: a non-integer seed, `rotations=True`, ...) or CodecValueError
    (out of range), both CodecError, naming the argument and its allowed range."""
    kern = check_backend(backend)
    check_bits(scheme, bits)
    check_group(scheme, group)
    bits = float(bits)
    seed = int.from_bytes(os.urandom(8), "little") if seed is None else check_seed(seed)
    fixed_rot = check_rotations(rotations)
    a = np.asarray(x)
    if a.dtype not in DTYPE_CODES:
        raise CodecError(f"unsupported dtype {a.dtype} (float16, float32 or float64)")
    if a.ndim > MAX_NDIM:
        raise CodecError(f"at most {MAX_NDIM} dimensions, got {a.ndim}")
    d = a.size
    padded = next_pow2(max(d, 1))
    if padded > MAX_PADDED:
        raise CodecError(f"vector too large ({d} elements)")
    cdt = compute_dtype(a.dtype)
    flat = a.reshape(-1)
    auto = fixed_rot is None
    probe = False  # rule (a) said two rotations, one is tried first: the input may be a single spike
    if fixed_rot is None:  # rule (a), before rotating
        rho = float(kern.participation(flat)) if kern is not None else None
        rot, probe = rotation_count(flat, bits, scheme, padded, rho)
    else:
        rot = fixed_rot
    if group is not None and group < padded:
        if probe:
            rot = 2  # no rule (b) here: a grouped frame takes rule (a)'s count
        y, _ = _rotated(flat, padded, cdt, seed, rot, None)
        gpre = _huge_prescale(flat, y)
        if gpre:
            y, _ = _rotated(np.ldexp(flat.astype(cdt), -gpre), padded, cdt, seed, rot, None)
        buf = _finish_grouped(y, rot, auto, scheme, bits, seed, group, a.dtype, a.shape, gpre)
        return _check_decodes(buf, a.dtype) if gpre else buf
    y, ny2 = _rotated(flat, padded, cdt, seed, rot, kern)
    pre = _huge_prescale(flat, y, ny2)
    if pre:  # finite values the rotation's sums may overflow on: scaled first (`_huge_prescale`)
        y, ny2 = _rotated(np.ldexp(flat.astype(cdt), -pre), padded, cdt, seed, rot, kern)
        return _check_decodes(finish(y, ny2, rot, probe, auto, scheme, bits, seed, kern, a.dtype, a.shape,
                                     pre), a.dtype)
    if not ny2 >= _TINY_SIGMA2[cdt] * padded:  # tiny (or NaN, reported later): are the inputs subnormal?
        peak = float(np.max(np.abs(flat))) if d else 0.0
        if 0.0 < peak < _SUBNORMAL_RISK[cdt]:
            # the rotation's 1/sqrt(D) rounds subnormal inputs before `finish` could rescale y (all-1e-45
            # float32 decoded to zeros): scale the input by a power of two first, exact for these values
            pre = math.frexp(peak)[1]
            y, ny2 = _rotated(np.ldexp(flat.astype(cdt), -pre), padded, cdt, seed, rot, kern)
    return finish(y, ny2, rot, probe, auto, scheme, bits, seed, kern, a.dtype, a.shape, pre)


def _check_decodes(buf: bytes, dtype: np.dtype[Any]) -> bytes:
    """`buf` when it decodes; CodecError when its reconstruction overflows the compute dtype (an input
    near its maximum: float32 1e38 everywhere, whose rotated values and the codec's noise pass 3.4e38),
    rather than a frame no decoder accepts (docs/quant.md, "Finite output, always": the encoder's frames
    decode). Only prescaled inputs (`_huge_prescale`) pay this decode."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            decode(buf)
    except DecodeOverflow as e:
        raise CodecError(f"input beyond what a {dtype} frame can represent (non-finite output): its "
                         f"reconstruction overflows ({e.reason})") from e
    return buf


def _huge_prescale(flat: npt.NDArray[Any], y: FloatArray, ny2: float | None = None) -> int:
    """e > 0 when the input must be multiplied by 2^-e and rotated again, else 0. The unnormalised
    FWHT's partial sums reach sqrt(D) ||x|| (the compiled one applies 1/sqrt(D) only at its end): a
    finite float32 input near its maximum (1e38 at 4,096 elements) overflowed there and was refused as
    "non-finite", failing a compressed all-reduce of finite values. So when sqrt(D ||x||^2) is beyond
    half the compute dtype's range (||x||^2 = ||y||^2: `ny2`, which the numba rotation sums from the
    input, or summed here), or not finite, and the input is all finite, it is scaled by 2^-e, 2^e the
    order of max |x|. Exact for normal numbers (a power of two changes no rounding), so the frame is
    the one of x * 2^-e with its scales multiplied by 2^e, as accurate as any ordinary input's (only
    values 2^-126 below the largest, which its float32 reconstruction cannot resolve anyway, round to
    zero). Ordinary inputs pay nothing: the check is on the norm the quantizer computes anyway."""
    if ny2 is None:
        with np.errstate(over="ignore", invalid="ignore"):
            ny2 = sumsq64(y)
    limit = float(np.finfo(y.dtype).max) / 2
    if (math.isfinite(ny2) and math.sqrt(ny2) * math.sqrt(y.size) <= limit) or not flat.size:
        return 0
    with np.errstate(over="ignore", invalid="ignore"):
        peak = float(np.max(np.abs(flat)))
    if not math.isfinite(peak) or peak == 0.0:  # NaN/inf input: refused later, as before
        return 0
    return math.frexp(peak)[1]


def _rotated(flat: npt.NDArray[Any], padded: int, cdt: np.dtype[Any], seed: int, rot: int,
             kern: ModuleType | None) -> tuple[FloatArray, float]:
    """The input zero-padded to `padded`, in the compute dtype, rotated `rot` times; with ||y||^2."""
    if kern is not None:
        y, ny2 = kern.rotate_from(flat, padded, cdt, seed, rot)  # copy, pad, signs, FWHT: one pass
        return y, float(ny2)
    d = flat.size
    if d == padded:
        y = flat.astype(cdt, copy=True)
    else:
        y = np.zeros(padded, cdt)
        y[:d] = flat
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow: `_huge_prescale`, or refused later
        y = rotate(y, seed, rot)
        return y, sumsq64(y)


def check_group(scheme: str, group: object) -> None:
    """Raise CodecError unless `group` is None or a power of two >= MIN_GROUP for a grouped scheme."""
    if group is None:
        return
    if not _is_int(group):
        raise CodecTypeError(f"group must be an integer power of two >= {MIN_GROUP} or None, got "
                             f"{type(group).__name__} {group!r}")
    g = int(cast(numbers.Integral, group))
    if g < MIN_GROUP or g & (g - 1):
        raise CodecValueError(f"group must be a power of two >= {MIN_GROUP}, got {g}")
    if scheme not in GROUPED_SCHEMES:
        raise CodecValueError(f"grouped scales are for {', '.join(GROUPED_SCHEMES)}, not {scheme}")


def _finish_grouped(
    y: FloatArray, rot: int, auto: bool, scheme: str, bits: float, seed: int, group: int,
    dtype: np.dtype[Any], shape: tuple[int, ...], pre: int = 0,
) -> bytes:
    """The version-2 frame of the rotated vector y: indices of the block-normalised vector (each block
    of `group` coordinates divided by its own sigma_j = ||y_j|| / sqrt(G)), one scale per block fitted
    to it. Why per block: a block whose energy differs from the vector's mean (a partial sum's rotated
    coordinates are Gaussian with one variance only in expectation) gets cells matched to its spread."""
    cdt = y.dtype
    padded = y.size
    nblocks = padded // group
    if nblocks > 0xFFFF:
        raise CodecValueError(f"group {group} gives {nblocks} scales for {padded} coordinates "
                              "(at most 65535)")
    blocks = y.reshape(nblocks, group).astype(np.float64)
    e2 = np.einsum("ij,ij->i", blocks, blocks)
    if not np.all(np.isfinite(e2)):
        raise CodecError("input has non-finite values (or overflows the compute precision)")
    factor = 1.0
    if cdt == np.float32 and float(e2.sum()) > F32_MAX:  # finite but beyond float32: as `_rescale`
        e = math.frexp(float(np.max(np.abs(blocks))))[1]
        blocks = np.ldexp(blocks, -e)
        e2 = np.einsum("ij,ij->i", blocks, blocks)
        factor = math.ldexp(1.0, e)
    sig = np.sqrt(e2 / group)
    inv = np.divide(1.0, sig, out=np.zeros_like(sig), where=sig > 0)
    z = (blocks * inv[:, None]).reshape(-1).astype(cdt)
    sp = eden.split(bits)
    sections: list[npt.NDArray[np.uint8]] = []
    idx_parts = []
    for b, sel in eden.parts(sp, seed, padded):
        zs = z if sel is None else z.take(sel)
        idx, _ = eden.nearest(zs, b, 1.0)
        idx_parts.append(idx)
        sections.append(bitpack.pack(idx, b))
    layout = eden.section_sizes(bits, seed, padded)
    c = eden.reconstruct(layout, idx_parts, 1.0, padded, np.dtype(np.float64)).reshape(nblocks, group)
    yc = np.einsum("ij,ij->i", blocks, c)
    cc = np.einsum("ij,ij->i", c, c)
    if scheme == "eden-biased":
        scales = np.divide(yc, cc, out=np.zeros_like(yc), where=cc > 0)
    else:
        scales = np.divide(e2, yc, out=np.zeros_like(yc), where=yc > 0)
    if pre:  # the input was scaled by 2^-pre before rotating (`_huge_prescale`)
        factor = math.ldexp(factor, pre)
    scales = np.maximum(scales, 0.0) * factor  # a block with <y, c> <= 0 sends S = 0, as version 1 does
    _check_representable(scheme, bits, scales.tolist(), dtype)
    payload = b"".join(p.tobytes() for p in sections)
    head = _FIXED.pack(
        MAGIC, VERSION_GROUPED, SCHEMES[scheme], DTYPE_CODES[dtype], rot, FLAG_AUTO if auto else 0,
        len(shape), nblocks, float(bits), seed, math.prod(shape), padded,
    )
    body = b"".join((
        head,
        struct.pack(f"<{len(shape)}Q", *shape),
        struct.pack(f"<{nblocks}d", *scales.tolist()),
        _U64.pack(len(payload)),
        payload,
    ))
    return body + _CRC.pack(crc32(body))


def rotation_count(
    flat: FloatArray, bits: float, scheme: str, padded: int, rho: float | None,
) -> tuple[int, bool]:
    """Rule (a) for `auto`: (rotations to apply first, probe). probe: rule (a) said two, but the input
    has a single non-zero coordinate (rho = 1; the count costs a pass only for inputs this
    concentrated), whose rotation is flat and may be represented exactly with one: try one first."""
    rot, rho_x = choose_rotations(flat, float(bits), scheme, padded, rho=rho)
    if rot == 2 and rho_x > _SPIKE_RHO and np.count_nonzero(flat) == 1:
        return 1, True
    return rot, False


def finish(
    y: FloatArray, ny2: float | None, rot: int, probe: bool, auto: bool, scheme: str, bits: float,
    seed: int, kern: ModuleType | None, dtype: np.dtype[Any], shape: tuple[int, ...], pre: int = 0,
) -> bytes:
    """The rest of `encode` once the padded input is rotated `rot` times into y (||y||^2 = ny2 when
    known): rescaling, quantization, rule (b), the frame. Shared with the fused ring hop (hop.py), which
    produces y its own way, so that both frames are built by the same code."""
    cdt = y.dtype
    padded = y.size
    d = math.prod(shape)
    y, ny2, factor = _rescale(y, ny2, kern)
    try:
        scales, sections, fit, fit_bits, err = _encode_rotated(y, scheme, float(bits), seed, auto, kern, ny2)
        if (auto and rot == 1 and not err <= _EXACT_ERROR[cdt]  # one exact rotation is kept, else
                and (probe or not fits_theory(fit, fit_bits, padded))):  # rule (a) or (b) adds one
            rot = 2
            y = rotate(y, seed, 1, start=1) if kern is None else kern.rotate(y, seed, 1, start=1)
            scales, sections, _, _, _ = _encode_rotated(y, scheme, float(bits), seed, False, kern, None)
    except ValueError as e:
        raise CodecError(str(e)) from e
    if pre:  # the input was scaled by 2^-pre before rotating (`encode`, subnormal inputs)
        factor = math.ldexp(factor, pre)
    if factor != 1.0:
        scales = [v * factor for v in scales]
    _check_representable(scheme, bits, scales, dtype)
    payload = b"".join(packed.tobytes() for packed in sections)
    head = _FIXED.pack(
        MAGIC, VERSION, SCHEMES[scheme], DTYPE_CODES[dtype], rot, FLAG_AUTO if auto else 0, len(shape),
        len(scales), float(bits), seed, d, padded,
    )
    body = b"".join((
        head,
        struct.pack(f"<{len(shape)}Q", *shape),
        struct.pack(f"<{len(scales)}d", *scales),
        _U64.pack(len(payload)),
        payload,
    ))
    return body + _CRC.pack(crc32(body))


def _rescale(y: FloatArray, ny2: float | None, kern: ModuleType | None) -> tuple[FloatArray, float, float]:
    """(y', ||y'||^2, factor) with y = factor * y': y itself (factor 1) unless its mean square is below
    `_TINY_SIGMA2` (then the squares the quantizer sums underflow or lose their precision: float32 input
    of magnitude 1e-25 quantized to all zeros) or, for float32, ||y||^2 is finite but beyond float32's
    range (one coordinate of 2e19: the quantizer refused it as "non-finite", and a compressed all-reduce
    of a finite gradient failed); then y' = y * 2^-e with 2^e the order of max |y|, exact since a power of
    two changes no rounding of normal numbers. `ny2`: ||y||^2 when the caller has it (the numba rotation
    sums it in float64); for numpy it is computed here as eden.quantize would."""
    given = ny2
    if ny2 is None:
        ny2 = sumsq64(y)
    huge = y.dtype == np.float32 and F32_MAX < ny2 < math.inf
    if not huge and not ny2 < _TINY_SIGMA2[y.dtype] * y.size:  # also NaN/inf: eden.quantize reports those
        return y, ny2, 1.0
    peak = float(np.max(np.abs(y))) if y.size else 0.0
    if peak == 0.0:
        return y, ny2, 1.0
    e = math.frexp(peak)[1]  # peak = m 2^e, 0.5 <= m < 1
    np.ldexp(y, -e, out=y)
    if given is not None and given >= _NORMAL64:  # the float64 sum is exact to scale: keep its rounding
        ny2 = math.ldexp(given, -2 * e)
    else:  # underflowed (float64 input below 1e-154): sum the rescaled vector
        ny2 = float(kern.sumsq(y)) if kern is not None else sumsq64(y)
    return y, ny2, math.ldexp(1.0, e)


def _encode_rotated(
    y: FloatArray, scheme: str, bits: float, seed: int, check: bool, kern: ModuleType | None,
    ny2: float | None,
) -> tuple[list[float], list[npt.NDArray[np.uint8]], float, float, float]:
    """(scales, packed sections, check, bits the check refers to, realized relative error of the frame
    in the rotated domain) for the rotated vector y (||y||^2 = ny2 when given). The EDEN schemes run on
    `kern` (numba kernels, or numpy for None)."""
    mode = {"eden-unbiased": "unbiased", "drive": "unbiased", "eden-biased": "biased",
            "turboquant-mse": "fixed"}.get(scheme)
    if mode is not None:
        enc = eden.quantize(y, bits, seed, mode, kernels=kern, ny2=ny2, pack=True)
        return [enc.scale], [packed for _, packed in enc.sections], enc.check, bits, enc.error
    # turboquant-prod
    mse_bits = int(bits) - 1
    sections: list[tuple[int, npt.NDArray[np.uint8]]] = []
    residual: FloatArray
    if mse_bits:
        enc = eden.quantize(y, mse_bits, seed, "fixed")
        layout = eden.section_sizes(mse_bits, seed, y.size)
        residual = y - eden.reconstruct(layout, [i for _, i in enc.sections], enc.scale, y.size, y.dtype)
        scale = enc.scale
        fit, fit_bits = enc.check, float(mse_bits)
        sections.extend(enc.sections)
    else:
        residual = y
        scale = 0.0
        if not math.isfinite(float(np.dot(y, y))):
            raise ValueError("input has non-finite values (or overflows the compute precision)")
        # the QJL has no codebook; the adaptive check looks at the 1-bit quantizer of y instead
        fit, fit_bits = (eden.quantize(y, 1, seed, "biased").check if check else 0.0), 1.0
    signs, norms = turboquant.qjl_encode(residual, seed)
    sections.append((1, signs))
    # the QJL sketch of a non-zero residual is never exact
    err = 0.0 if not np.any(residual) else math.inf
    return [scale, *norms.tolist()], [bitpack.pack(idx, b) for b, idx in sections], fit, fit_bits, err


def parse(buf: bytes | bytearray | memoryview) -> Header:
    """Parse and check a buffer's header and framing (not the payload contents)."""
    try:
        mv = memoryview(buf).cast("B")
    except TypeError as e:  # not a buffer, or a strided view of one
        raise CodecTypeError(f"a frame is a contiguous bytes-like object, got {type(buf).__name__}: "
                             f"{e}") from None
    n = len(mv)
    if n < _FIXED.size + _U64.size + _CRC.size:
        raise CodecError(f"buffer too short for a header ({n} bytes)")
    magic, version, scheme_id, dtype_code, rot, flags, ndim, nscales, bits, seed, d, padded = (
        _FIXED.unpack_from(mv, 0)
    )
    if magic != MAGIC:
        raise CodecError("bad magic: not an MRC compressed vector")
    if version not in VERSIONS:
        raise CodecError(f"unsupported codec version {version} (this decoder reads "
                         f"{', '.join(map(str, VERSIONS))})")
    (crc,) = _CRC.unpack_from(mv, n - _CRC.size)
    if crc32(mv[: n - _CRC.size]) != crc:
        raise CodecError("CRC mismatch: buffer corrupted or truncated")
    if scheme_id not in SCHEME_NAMES:
        raise CodecError(f"unknown scheme id {scheme_id}")
    scheme = SCHEME_NAMES[scheme_id]
    if dtype_code not in DTYPES:
        raise CodecError(f"unknown dtype code {dtype_code}")
    if not 1 <= rot <= MAX_ROTATIONS:
        raise CodecError(f"rotation count {rot} outside 1..{MAX_ROTATIONS}")
    if flags & ~FLAG_AUTO:
        raise CodecError(f"unknown flag bits 0x{flags:02x}")
    if ndim > MAX_NDIM:
        raise CodecError(f"ndim {ndim} exceeds {MAX_NDIM}")
    check_bits(scheme, bits)
    if padded != next_pow2(max(d, 1)) or padded > MAX_PADDED:
        raise CodecError(f"padded size {padded} inconsistent with {d} elements")
    off = _FIXED.size
    need = off + 8 * ndim + 8 * nscales + _U64.size + _CRC.size
    if n < need:
        raise CodecError("buffer too short for its shape and scales")
    shape = struct.unpack_from(f"<{ndim}Q", mv, off)
    off += 8 * ndim
    if math.prod(shape) != d:
        raise CodecError(f"shape {shape} does not hold {d} elements")
    if any(dim > MAX_PADDED for dim in shape):  # (0, 2^63) holds 0 elements, but numpy cannot build it
        raise CodecError(f"shape {shape} has a dimension above {MAX_PADDED}")
    scales = struct.unpack_from(f"<{nscales}d", mv, off)
    off += 8 * nscales
    if not all(math.isfinite(s) for s in scales):
        raise CodecError("non-finite scale")
    group = padded
    if version == VERSION_GROUPED:
        if scheme not in GROUPED_SCHEMES:
            raise CodecError(f"version-2 (grouped) frame of scheme {scheme}")
        if nscales < 2 or nscales & (nscales - 1) or padded // nscales < MIN_GROUP:
            raise CodecError(f"{nscales} grouped scales cannot split D={padded} into blocks of >= "
                             f"{MIN_GROUP}")
        group = padded // nscales
        if any(s < 0 for s in scales):
            raise CodecError("negative block scale")
    else:
        want_scales = 1 + (_qjl_blocks(padded) if scheme == "turboquant-prod" else 0)
        if nscales != want_scales:
            raise CodecError(f"{scheme} at D={padded} carries {want_scales} scales, header says {nscales}")
        if scheme == "turboquant-prod" and any(s < 0 for s in scales[1:]):
            raise CodecError("negative QJL block norm")
        if scales[0] < 0:  # every scheme's encoder makes S >= 0 (a non-positive <y, c> gives S = 0)
            raise CodecError(f"negative scale {scales[0]!r}")
    limit = float(np.finfo(compute_dtype(DTYPES[dtype_code])).max)
    if _value_bound(scheme, bits, scales) > limit:
        raise CodecError(f"scale field {max(scales):g} cannot describe finite output: the "
                         f"{compute_dtype(DTYPES[dtype_code])} lookup table would overflow")
    (plen,) = _U64.unpack_from(mv, off)
    off += _U64.size
    if off + plen + _CRC.size != n:
        raise CodecError(f"payload length {plen} does not match the buffer ({n - off - _CRC.size} bytes)")
    return Header(
        scheme, DTYPES[dtype_code], rot, bool(flags & FLAG_AUTO), bits, seed, tuple(shape), d, padded,
        tuple(scales), off, plen, group,
    )


def _check_representable(scheme: str, bits: float, scales: list[float], dtype: np.dtype[Any]) -> None:
    """CodecError unless `parse` will accept these scales: a finite input near the compute dtype's
    maximum (float32 values whose rotated spread times the largest centroid passes 3.4e38) gives a frame
    whose lookup table overflows, which every decoder refuses as malformed. Refusing it here, where it
    is made, lets the sender say so (the ring carries it as its NONFINITE marker to every rank) instead
    of a receiver failing alone on a frame it was sent."""
    limit = float(np.finfo(compute_dtype(dtype)).max)
    if _value_bound(scheme, float(bits), tuple(scales)) > limit:
        raise CodecError(f"input beyond what a {dtype} frame can represent (non-finite output): scale "
                         f"{max(scales):g} would decode past {limit:g}")


def peek_magnitude(buf: bytes | bytearray | memoryview) -> float:
    """The largest scale field of a frame, read from its header without the CRC pass (inf for a
    float64 frame or anything that does not look like a frame): a cheap "could this frame's values be
    near float32's maximum?" for the ring (mrc.collective.ring), which sends such sums as float64
    frames. Not a validation: `parse`/`decode` still check the frame."""
    try:
        f = _FIXED.unpack_from(buf, 0)
        if f[3] != DTYPE_CODES[np.dtype(np.float32)]:
            return math.inf
        scales = struct.unpack_from(f"<{f[7]}d", buf, _FIXED.size + 8 * f[6])
        return max(scales, default=0.0)
    except (struct.error, ValueError, TypeError):
        return math.inf


def _value_bound(scheme: str, bits: float, scales: tuple[float, ...]) -> float:
    """An upper bound on |coordinate| of the decoded vector in the rotated domain, from the header: S
    times the largest centroid the budget's widths use (TurboQuant_prod: plus the QJL estimate's
    sqrt(pi/2) ||r_block|| max |G_ij|)."""
    if scheme == "turboquant-prod":
        mse_bits = int(bits) - 1
        qjl = _QJL_COEF * max(scales[1:], default=0.0)
        return (scales[0] * eden.max_centroid(mse_bits) if mse_bits else 0.0) + qjl
    sp = eden.split(bits)
    widths = [w for w in (sp.lo, sp.hi) if w]
    return max(scales) * max(eden.max_centroid(w) for w in widths)  # grouped: the largest block scale


def _check_payload_bounds(h: Header) -> None:
    """The payload size a header allows, bounded without the masks: a Bernoulli(p) group of D
    coordinates has p D +- 8 sd members (a legitimate buffer falls outside with probability ~1e-15), so
    a header claiming a huge D over a small payload is refused before anything D-sized is allocated."""
    n = h.padded
    bits = h.bits if h.scheme != "turboquant-prod" else h.bits - 1
    extra = bitpack.packed_size(n, 1) if h.scheme == "turboquant-prod" else 0
    if bits == 0:
        lo_b = hi_b = extra
    else:
        sp = eden.split(bits)
        if not sp.masked:
            lo_b = hi_b = bitpack.packed_size(n, sp.lo) + extra
        else:
            slack = 8.0 * math.sqrt(n * sp.p * (1.0 - sp.p)) + 8.0
            m_lo = max(0, math.floor(n * sp.p - slack))
            m_hi = min(n, math.ceil(n * sp.p + slack))
            # bytes grow with the member count m (hi > lo); each group rounds up by < 1 byte
            lo_b = ((n - m_lo) * sp.lo + m_lo * sp.hi) // 8 + extra
            hi_b = -(-((n - m_hi) * sp.lo + m_hi * sp.hi) // 8) + 2 + extra
    if not lo_b <= h.payload_length <= hi_b:
        raise CodecError(f"payload of {h.payload_length} bytes cannot hold {n} coordinates at b={h.bits:g}")


class DecodeOverflow(CodecError):
    """A frame whose reconstruction overflows the compute dtype (`decode`)."""


def decode(
    buf: bytes | bytearray | memoryview, *, backend: str | None = None, dtype: npt.DTypeLike | None = None,
    out: npt.NDArray[np.floating] | None = None, max_elements: int | None = None,
) -> npt.NDArray[np.floating]:
    """Reconstruct the array (original shape and dtype) from `encode`'s output. `backend`: as for
    `encode`; a buffer decodes on either path, whichever encoded it. `dtype` (float16/32/64): return that
    dtype instead of the frame's (the reconstruction is computed in float32, or float64 for float64
    frames, whatever is asked).

    Never returns a non-finite value. A frame whose scales make the output overflow the compute dtype is
    malformed (a legitimate encoder cannot produce it: it refuses inputs whose norm overflows) and raises
    CodecError. Values beyond the *output* dtype's range — a float16 frame whose reconstruction exceeds
    ±65504 through quantization noise, the input having been within range — are saturated to the largest
    finite value, with a QuantRangeWarning counting them: a DDP user's fp16 gradient must not turn into
    inf (which gradient scalers read as an overflow of the model and skip the step for) because of the
    codec's own noise, and the saturated coordinate's error is at most its reconstruction error.
    `dtype=np.float32` gives those values unclipped.

    `out`: a writable C-contiguous array of the frame's element count and the output dtype, which receives
    the result (and is returned, in the frame's shape). Where the reconstruction is computed in that dtype
    with no padding (a float32 frame of a power-of-two length, the ring's pieces), the inverse rotation
    writes into it directly: no array of its own and no copy. Its contents are unspecified if decode
    raises.

    `max_elements`: a frame claiming more elements is refused before anything is decoded. A sub-1-bit
    frame legitimately holds ~500 coordinates per payload byte, so a receiver that knows the size to
    expect (the ring checks every frame's count) should say so rather than decode what a peer claims."""
    kern = check_backend(backend)
    out_dtype = _output_dtype(dtype)
    h = parse(buf)
    if max_elements is not None and h.d > max_elements:
        raise CodecError(f"frame holds {h.d} elements, more than the {max_elements} expected")
    if out is not None:
        _check_out(out, h.dtype if out_dtype is None else out_dtype, h.d)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, not warned about
        try:
            res = _decode(buf, h, kern, out_dtype, out)
        except DecodeOverflow:
            if kern is None:
                raise
            # the compiled inverse rotation applies 1/sqrt(D) once, at its last stage, so its partial
            # sums can overflow where the reference's, scaled at every step, do not: a finite float32
            # gradient with an outlier near float32's maximum / sqrt(D) (1e37 at 2^16) encodes, and
            # the reference decodes it
            res = _decode(buf, h, None, out_dtype, out)
    if out is None:
        return res
    flat = out.reshape(-1)
    if not np.may_share_memory(res, flat):  # computed elsewhere: copied in
        flat[...] = res.reshape(-1)
    return out.reshape(h.shape)


def _decode(
    buf: bytes | bytearray | memoryview, h: Header, kern: ModuleType | None, out_dtype: np.dtype[Any] | None,
    into: npt.NDArray[np.floating] | None = None,
) -> npt.NDArray[np.floating]:
    """The reconstruction; `into` (checked by decode) is the compute buffer where it can be (decode's
    `out`), else unused (decode copies the result into it)."""
    mv = memoryview(buf).cast("B")
    payload = np.frombuffer(mv, np.uint8, h.payload_length, h.payload_offset)
    cdt = compute_dtype(h.dtype)
    n = h.padded
    _check_payload_bounds(h)  # before regenerating any D-sized mask
    if h.scheme == "turboquant-prod":
        mse_bits = int(h.bits) - 1
        layout = eden.section_sizes(mse_bits, h.seed, n) if mse_bits else []
        counts = [(b, c) for b, c, _ in layout] + [(1, n)]
    else:
        layout = eden.section_sizes(h.bits, h.seed, n)
        counts = [(b, c) for b, c, _ in layout]
    sizes = [bitpack.packed_size(c, b) for b, c in counts]
    if sum(sizes) != h.payload_length:
        raise CodecError(f"payload is {h.payload_length} bytes, the header implies {sum(sizes)}")
    sections = []
    pos = 0
    # numba path, EDEN schemes: the sections stay packed, unpacking is fused with the lookup
    packed = kern is not None and h.scheme != "turboquant-prod" and not h.grouped
    for (b, c), size in zip(counts, sizes, strict=True):
        try:
            chunk = payload[pos : pos + size]
            sections.append(bitpack.check_packed(chunk, b, c) if packed else bitpack.unpack(chunk, b, c))
        except ValueError as e:
            raise CodecError(str(e)) from e
        pos += size
    if h.grouped:  # unit centroids, each block times its scale
        y = eden.reconstruct(layout, sections, 1.0, n, cdt)
        y = (y.reshape(-1, h.group) * np.asarray(h.scales, cdt)[:, None]).reshape(-1)
        y = unrotate(y, h.seed, h.rotations) if kern is None else kern.unrotate(y, h.seed, h.rotations)
    elif packed and len(layout) == 1 and layout[0][2] is None:  # one section: lookup fused into the FWHT
        assert kern is not None
        b = layout[0][0]
        direct = (into is not None and h.d == n and into.dtype == cdt
                  and (out_dtype is None or out_dtype == cdt))
        y = np.asarray(kern.unrotate_packed(sections[0], b, eden.scaled_table(b, h.scales[0], cdt), n,
                                            h.seed, h.rotations,
                                            into.reshape(-1) if direct and into is not None else None))
    else:
        if packed:
            assert kern is not None
            y = eden.reconstruct_packed(layout, sections, h.scales[0], n, cdt, kern)
        elif h.scheme == "turboquant-prod":
            y = turboquant.qjl_decode(sections[-1], np.asarray(h.scales[1:]), h.seed, n, cdt)
            if layout:
                y += eden.reconstruct(layout, sections[:-1], h.scales[0], n, cdt)
        else:
            y = eden.reconstruct(layout, sections, h.scales[0], n, cdt)
        y = unrotate(y, h.seed, h.rotations) if kern is None else kern.unrotate(y, h.seed, h.rotations)
    out = y[: h.d] if h.d != n else y
    # the inverse FWHT's partial sums are at most D max|rotated value| (each level preserves the norm up
    # to sqrt(2), the unnormalised H scales it by sqrt(D), ||y|| <= sqrt(D) max|y|): below the compute
    # dtype's maximum no overflow is possible and no pass is spent on checking
    limit = float(np.finfo(cdt).max)
    if n * _value_bound(h.scheme, h.bits, h.scales) > limit / 2 and not np.all(np.isfinite(out)):
        raise DecodeOverflow(f"scale field {max(h.scales):g} decodes to non-finite values (overflows {cdt})")
    target = h.dtype if out_dtype is None else out_dtype
    if target.itemsize < out.dtype.itemsize and out.size:
        out = _saturate(out, target)
    return out.astype(target, copy=False).reshape(h.shape)


def _check_out(out: Any, want: np.dtype[Any], d: int) -> None:
    """decode's `out`: CodecValueError naming what is wrong with it."""
    if not isinstance(out, np.ndarray):
        raise CodecValueError(f"decode: out must be a numpy array, got {type(out).__name__}")
    why = [w for bad, w in ((out.dtype != want, f"of dtype {want} (not {out.dtype})"),
                            (out.size != d, f"of the frame's {d} elements (not {out.size})"),
                            (not out.flags.c_contiguous, "C-contiguous"),
                            (not out.flags.writeable, "writable")) if bad]
    if why:
        raise CodecValueError("decode: out must be " + ", ".join(why))


def _output_dtype(dtype: npt.DTypeLike | None) -> np.dtype[Any] | None:
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise CodecTypeError(f"dtype must be float16, float32 or float64, got {dtype!r}") from e
    if dt not in DTYPE_CODES:
        raise CodecTypeError(f"dtype must be float16, float32 or float64, got {dt}")
    return dt


def _saturate(out: FloatArray, target: np.dtype[Any]) -> FloatArray:
    """out clipped to target's finite range (a copy when anything is clipped), warning with the count."""
    top = float(np.finfo(target).max)
    hi, lo = float(np.max(out)), float(np.min(out))
    if hi <= top and lo >= -top:
        return out
    count = int(np.count_nonzero(out > top)) + int(np.count_nonzero(out < -top))
    warnings.warn(f"quant codec: {count} of {out.size} decoded values exceed the {target} range "
                  f"(±{top:g}) and were saturated (decode(..., dtype=np.float32) keeps them)",
                  QuantRangeWarning, stacklevel=3)
    return np.clip(out, -top, top)
