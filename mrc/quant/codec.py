"""The compressed-vector wire format (version 1) and the encode/decode entry points.

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

Everything random is regenerated from the seed with PCG64(SeedSequence((seed, stream, i))).random_raw:
stream 1 = the signs of rotation i (rht.py), 2 = the Bernoulli group mask of fractional / b < 1 budgets
(eden.py), 3 = the QJL Gaussian (turboquant.py). Indices are the Lloyd–Max cell numbers, 0 = most negative.

Decoding checks every field against the others and raises `CodecError(reason)` on the first
inconsistency — never returns an array from a malformed buffer. Only seeds and scalars travel.

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
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from mrc.errors import MrcError
from mrc.wire.crc import crc32

from . import accel, bitpack, eden, turboquant
from .adaptive import choose_rotations, fits_theory
from .rht import MAX_ROTATIONS, FloatArray, next_pow2, rotate, unrotate

MAGIC = b"MRCQ"
VERSION = 1
SCHEMES = {"eden-unbiased": 1, "eden-biased": 2, "drive": 3, "turboquant-mse": 4, "turboquant-prod": 5}
SCHEME_NAMES = {v: k for k, v in SCHEMES.items()}
DTYPES: dict[int, np.dtype[Any]] = {1: np.dtype(np.float16), 2: np.dtype(np.float32), 3: np.dtype(np.float64)}
DTYPE_CODES: dict[np.dtype[Any], int] = {v: k for k, v in DTYPES.items()}
FLAG_AUTO = 0x01
MAX_NDIM = 32
MAX_PADDED = 1 << 34

_FIXED = struct.Struct("<4sBBBBBBHdQQQ")
_U64 = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class CodecError(MrcError):
    """A compressed vector that cannot be produced or decoded; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"quant codec: {reason}")
        self.reason = reason


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


def check_bits(scheme: str, bits: float) -> None:
    """Raise CodecError if `bits` is not a valid budget for `scheme`."""
    if scheme not in SCHEMES:
        raise CodecError(f"unknown scheme {scheme!r} (known: {', '.join(SCHEMES)})")
    if not (isinstance(bits, numbers.Real) and not isinstance(bits, bool) and math.isfinite(bits)
            and 0 < bits <= 8):
        raise CodecError(f"bit budget must be in (0, 8], got {bits!r}")
    if scheme == "drive" and bits != 1:
        raise CodecError(f"drive is the 1-bit scheme, got bits={bits}")
    if scheme.startswith("turboquant") and bits != int(bits):
        raise CodecError(f"{scheme} takes an integer bit budget, got {bits}")


def compute_dtype(dtype: np.dtype[Any]) -> np.dtype[np.floating]:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _qjl_blocks(padded: int) -> int:
    return padded // turboquant.qjl_block(padded)


def encode(
    x: npt.ArrayLike, scheme: str, bits: float, *, seed: int | None = None, rotations: int | str = "auto",
    backend: str | None = None,
) -> bytes:
    """Compress an array of any shape (float16/32/64) into one self-describing buffer. `backend`:
    'numba' or 'numpy' (same wire format, rounding may differ); None: the process default
    (MRC_QUANT_KERNELS, accel.py)."""
    kern = accel.kernels(backend)
    check_bits(scheme, bits)
    bits = float(bits)
    a = np.asarray(x)
    if a.dtype not in DTYPE_CODES:
        raise CodecError(f"unsupported dtype {a.dtype} (float16, float32 or float64)")
    if a.ndim > MAX_NDIM:
        raise CodecError(f"at most {MAX_NDIM} dimensions, got {a.ndim}")
    d = a.size
    padded = next_pow2(max(d, 1))
    if padded > MAX_PADDED:
        raise CodecError(f"vector too large ({d} elements)")
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    if not 0 <= seed < 1 << 64:
        raise CodecError(f"seed must be a 64-bit unsigned integer, got {seed}")
    cdt = compute_dtype(a.dtype)
    flat = a.reshape(-1)
    auto = rotations == "auto"
    if auto:  # rule (a), before rotating
        rho = float(kern.participation(flat)) if kern is not None else None
        rot, _ = choose_rotations(flat, float(bits), scheme, padded, rho=rho)
    elif isinstance(rotations, int) and 1 <= rotations <= MAX_ROTATIONS:
        rot = rotations
    else:
        raise CodecError(f"rotations must be 1..{MAX_ROTATIONS} or 'auto', got {rotations!r}")
    ny2: float | None = None
    if kern is not None:
        y, ny2 = kern.rotate_from(flat, padded, cdt, seed, rot)  # copy, pad, signs, FWHT: one pass
    else:
        if d == padded:
            y = flat.astype(cdt, copy=True)
        else:
            y = np.zeros(padded, cdt)
            y[:d] = flat
        y = rotate(y, seed, rot)
    try:
        scales, sections, fit, fit_bits = _encode_rotated(y, scheme, float(bits), seed, auto, kern, ny2)
        if auto and rot == 1 and not fits_theory(fit, fit_bits, padded):  # rule (b), after one rotation
            rot = 2
            y = rotate(y, seed, 1, start=1) if kern is None else kern.rotate(y, seed, 1, start=1)
            scales, sections, _, _ = _encode_rotated(y, scheme, float(bits), seed, False, kern, None)
    except ValueError as e:
        raise CodecError(str(e)) from e
    payload = b"".join(packed.tobytes() for packed in sections)
    head = _FIXED.pack(
        MAGIC, VERSION, SCHEMES[scheme], DTYPE_CODES[a.dtype], rot, FLAG_AUTO if auto else 0, a.ndim,
        len(scales), float(bits), seed, d, padded,
    )
    body = b"".join((
        head,
        struct.pack(f"<{a.ndim}Q", *a.shape),
        struct.pack(f"<{len(scales)}d", *scales),
        _U64.pack(len(payload)),
        payload,
    ))
    return body + _CRC.pack(crc32(body))


def _encode_rotated(
    y: FloatArray, scheme: str, bits: float, seed: int, check: bool, kern: ModuleType | None,
    ny2: float | None,
) -> tuple[list[float], list[npt.NDArray[np.uint8]], float, float]:
    """(scales, packed sections, check, bits the check refers to) for the rotated vector y (||y||^2 =
    ny2 when given). The EDEN schemes run on `kern` (numba kernels, or numpy for None)."""
    mode = {"eden-unbiased": "unbiased", "drive": "unbiased", "eden-biased": "biased",
            "turboquant-mse": "fixed"}.get(scheme)
    if mode is not None:
        enc = eden.quantize(y, bits, seed, mode, kernels=kern, ny2=ny2, pack=True)
        return [enc.scale], [packed for _, packed in enc.sections], enc.check, bits
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
    return [scale, *norms.tolist()], [bitpack.pack(idx, b) for b, idx in sections], fit, fit_bits


def parse(buf: bytes | bytearray | memoryview) -> Header:
    """Parse and check a buffer's header and framing (not the payload contents)."""
    mv = memoryview(buf).cast("B")
    n = len(mv)
    if n < _FIXED.size + _U64.size + _CRC.size:
        raise CodecError(f"buffer too short for a header ({n} bytes)")
    magic, version, scheme_id, dtype_code, rot, flags, ndim, nscales, bits, seed, d, padded = (
        _FIXED.unpack_from(mv, 0)
    )
    if magic != MAGIC:
        raise CodecError("bad magic: not an MRC compressed vector")
    if version != VERSION:
        raise CodecError(f"unsupported codec version {version} (this decoder reads {VERSION})")
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
    scales = struct.unpack_from(f"<{nscales}d", mv, off)
    off += 8 * nscales
    if not all(math.isfinite(s) for s in scales):
        raise CodecError("non-finite scale")
    want_scales = 1 + (_qjl_blocks(padded) if scheme == "turboquant-prod" else 0)
    if nscales != want_scales:
        raise CodecError(f"{scheme} at D={padded} carries {want_scales} scales, header says {nscales}")
    if scheme == "turboquant-prod" and any(s < 0 for s in scales[1:]):
        raise CodecError("negative QJL block norm")
    (plen,) = _U64.unpack_from(mv, off)
    off += _U64.size
    if off + plen + _CRC.size != n:
        raise CodecError(f"payload length {plen} does not match the buffer ({n - off - _CRC.size} bytes)")
    return Header(
        scheme, DTYPES[dtype_code], rot, bool(flags & FLAG_AUTO), bits, seed, tuple(shape), d, padded,
        tuple(scales), off, plen,
    )


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


def decode(buf: bytes | bytearray | memoryview, *, backend: str | None = None) -> npt.NDArray[np.floating]:
    """Reconstruct the array (original shape and dtype) from `encode`'s output. `backend`: as for
    `encode`; a buffer decodes on either path, whichever encoded it."""
    kern = accel.kernels(backend)
    h = parse(buf)
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
    packed = kern is not None and h.scheme != "turboquant-prod"
    for (b, c), size in zip(counts, sizes, strict=True):
        try:
            chunk = payload[pos : pos + size]
            sections.append(bitpack.check_packed(chunk, b, c) if packed else bitpack.unpack(chunk, b, c))
        except ValueError as e:
            raise CodecError(str(e)) from e
        pos += size
    if packed and len(layout) == 1 and layout[0][2] is None:  # one section: lookup fused into the FWHT
        assert kern is not None
        b = layout[0][0]
        y = np.asarray(kern.unrotate_packed(sections[0], b, eden.scaled_table(b, h.scales[0], cdt), n,
                                            h.seed, h.rotations))
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
    return out.astype(h.dtype, copy=False).reshape(h.shape)
