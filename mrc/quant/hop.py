"""One reduce-scatter hop of the compressed ring all-reduce (mrc/collective/ring.py): the incoming frame
of a partial sum, plus this rank's own chunk, re-encoded with a fresh seed.

    frame_out = hop(frame_in, own, scheme, bits, seed)
              == encode(decode(frame_in) + own, scheme, bits, seed=seed)      (bit for bit)

The three-pass path runs exactly the right-hand side: decode (unpack, look up, inverse-rotate), add, encode
(moment statistic, rotate, quantize, pack), each a pass of its own over the chunk plus the temporaries
between them. The fused path (numba, kernels.hop_rotate) runs the data-heavy part in one sweep: the
incoming vector's lookup and inverse rotation up to its last butterfly stage, then that stage chunk by
chunk, each chunk completing cache-resident blocks of the decoded vector which are, while still in cache,
added to the local chunk, measured (the moments `auto` needs, ||y||^2) and given the forward rotation's
signs and block levels; then the forward rotation's outer levels. Quantization, packing, the adaptive
rules and the frame are the codec's own code (codec.finish), so the frame is the same bytes.

Which path: MRC_HOP_KERNEL=fused|three-pass, read at each call (default fused where the numba kernels
run); `path=` overrides it. Both give the same bytes, so ranks may even differ. The fused path takes the
common case: numba kernels, float32, an EDEN/DRIVE frame with one packed section (integer budget), one
rotation, more than one FWHT block (2^15 elements), a scale whose output needs no overflow check, and a
sum that `auto` rotates once or twice by rule (a) without the single-spike probe. Anything else runs
the three-pass path (same result by definition).
"""

from __future__ import annotations

import math
import os

import numpy as np
import numpy.typing as npt

from . import accel, bitpack, codec, eden
from .adaptive import choose_rotations
from .rht import next_pow2

ENV = "MRC_HOP_KERNEL"
PATHS = ("fused", "three-pass")
_FUSED_SCHEMES = ("eden-unbiased", "eden-biased", "drive")

F32 = npt.NDArray[np.float32]
Buffer = bytes | bytearray | memoryview


def default_path() -> str:
    """The path MRC_HOP_KERNEL asks for ('fused' when unset or empty)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value and value not in PATHS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(PATHS)} (or unset)")
    return value or "fused"


def three_pass(frame_in: Buffer, own: F32, scheme: str, bits: float, seed: int,
               group: int | None = None) -> bytes:
    """decode, add, encode: the reference the fused path must equal byte for byte. `group`: the outgoing
    frame's scale group (codec.encode; None: one scale)."""
    own = np.ascontiguousarray(own, dtype=np.float32).reshape(-1)
    d = codec.parse(frame_in).d  # before decoding: a frame must not make us build what we would refuse
    if d != own.size:
        raise codec.CodecValueError(f"hop: incoming frame holds {d} elements, own chunk {own.size}")
    work = np.asarray(codec.decode(frame_in), np.float32).reshape(-1)  # a frame of any shape, as a chunk
    work += own
    return codec.encode(work, scheme, bits, seed=seed, group=group)


def hop(frame_in: Buffer, own: npt.ArrayLike, scheme: str, bits: float, seed: int,
        path: str | None = None, group: int | None = None) -> bytes:
    """encode(decode(frame_in) + own, scheme, bits, seed=seed, group=group), fused where it can be
    (module doc). Grouped-scale frames (codec version 2), in or out, always take the three passes: the
    fused sweep's lookup uses one scale and its output is the one-scale frame."""
    # the outgoing frame's seed is the ring's to give: both paths refuse None (encode would draw one at
    # random, and the two paths, or two ranks, would then differ)
    seed = codec.check_seed(seed, none_ok=False)
    own32 = np.ascontiguousarray(own, dtype=np.float32).reshape(-1)
    which = default_path() if path is None else path
    if which not in PATHS:
        raise ValueError(f"hop path must be one of {', '.join(PATHS)}, got {which!r}")
    if which == "fused" and (group is None or group >= next_pow2(max(own32.size, 1))):
        out = _fused(frame_in, own32, scheme, bits, seed)
        if out is not None:
            return out
    return three_pass(frame_in, own32, scheme, bits, seed, group)


def _fused(frame_in: Buffer, own: F32, scheme: str, bits: float, seed: int) -> bytes | None:
    """The fused hop, or None when the inputs are outside what it covers (the caller runs three-pass)."""
    kern = accel.kernels()
    if kern is None or scheme not in _FUSED_SCHEMES:
        return None
    codec.check_bits(scheme, bits)
    h = codec.parse(frame_in)
    n = h.padded
    block = 1 << kern._block_bits(np.dtype(np.float32))
    if (h.grouped or h.scheme not in _FUSED_SCHEMES or h.dtype != np.float32 or h.rotations != 1 or n <= block
            or h.d != own.size or len(h.shape) != 1 or n != next_pow2(max(own.size, 1))):
        return None
    if n * codec._value_bound(h.scheme, h.bits, h.scales) > float(np.finfo(np.float32).max) / 2:
        return None  # decode would have to check its output for overflow
    codec._check_payload_bounds(h)
    layout = eden.section_sizes(h.bits, h.seed, n)
    if len(layout) != 1 or layout[0][2] is not None:
        return None
    b = layout[0][0]
    if bitpack.packed_size(n, b) != h.payload_length:
        raise codec.CodecError(f"payload is {h.payload_length} bytes, the header implies "
                               f"{bitpack.packed_size(n, b)}")
    mv = memoryview(frame_in).cast("B")
    payload = np.frombuffer(mv, np.uint8, h.payload_length, h.payload_offset)
    try:
        packed = bitpack.check_packed(payload, b, n)
    except ValueError as e:
        raise codec.CodecError(str(e)) from e
    table = eden.scaled_table(b, h.scales[0], np.dtype(np.float32))
    fbits = float(bits)
    y, ny2, s2, s4 = kern.hop_rotate(packed, b, table, n, h.seed, own, seed)
    rho = float(s4 / (s2 * s2)) if (s2 > 0.0 and math.isfinite(s2) and math.isfinite(s4)) else 0.0
    rot, _ = choose_rotations(own, fbits, scheme, n, rho=rho)  # rho given: `own` is not read
    if rot == 2 and rho > codec._SPIKE_RHO:
        return None  # encode's single-spike probe counts non-zeros of the sum, never materialised here
    if rot == 2:
        ny2 = float(kern._rotate_into(y, y, seed, 1))
    return codec.finish(y, ny2, rot, False, True, scheme, fbits, seed, kern, np.dtype(np.float32),
                        (own.size,))
