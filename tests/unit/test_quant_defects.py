"""Codec defects of issue 19, each pinned by a test that failed before its fix (docs/quant.md §6, §3):
float16 overflow on decode, underflow of tiny inputs, argument validation, frames whose scale cannot
describe finite output, and `auto` on inputs that one rotation represents exactly."""

from __future__ import annotations

import math
import struct
import warnings
import zlib
from typing import Any

import numpy as np
import pytest

from mrc.quant import codec, hop

BACKENDS = ("numba", "numpy")
_FIXED = struct.Struct("<4sBBBBBBHdQQQ")


def _vnmse(est: Any, x: Any) -> float:
    e = np.asarray(est, np.float64)
    v = np.asarray(x, np.float64)
    return float(np.sum((e - v) ** 2) / np.sum(v * v))


def _with_scales(buf: bytes, scales: list[float]) -> bytes:
    """`buf` with its scales replaced (same count) and a valid CRC: only the field checks can refuse it."""
    f = list(_FIXED.unpack_from(buf, 0))
    ndim, nscales = f[6], f[7]
    assert len(scales) == nscales
    rest = bytearray(buf[_FIXED.size : -4])
    struct.pack_into(f"<{nscales}d", rest, 8 * ndim, *scales)
    body = buf[: _FIXED.size] + bytes(rest)
    return body + struct.pack("<I", zlib.crc32(body))


# ----------------------------------------------------------------------- 1. float16 range on decode


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_decode_never_returns_inf(backend: str) -> None:
    """±60000 (within float16) reconstructs above 65504 in many coordinates (codec noise): the float16
    result saturates at ±65504 with a warning that counts them, and dtype=float32 keeps the values."""
    x = (np.random.default_rng(0).choice([-1.0, 1.0], 4096) * 60000).astype(np.float16)
    buf = codec.encode(x, "eden-unbiased", 2, seed=1, backend=backend)
    wide = codec.decode(buf, backend=backend, dtype=np.float32)
    assert wide.dtype == np.float32 and np.all(np.isfinite(wide))
    over = int(np.count_nonzero(np.abs(wide) > codec.FLOAT16_MAX))
    assert over > 100  # the case is real: the reconstruction leaves the float16 range
    with pytest.warns(codec.QuantRangeWarning, match=f"{over} of 4096"):
        y = codec.decode(buf, backend=backend)
    assert y.dtype == np.float16 and y.shape == x.shape
    assert np.all(np.isfinite(y))
    assert np.array_equal(y, np.clip(wide, -codec.FLOAT16_MAX, codec.FLOAT16_MAX).astype(np.float16))


def test_float16_in_range_decodes_without_warning() -> None:
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float16)
    buf = codec.encode(x, "eden-unbiased", 4, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = codec.decode(buf)
    assert y.dtype == np.float16
    assert np.array_equal(codec.decode(buf, dtype=np.float32).astype(np.float16), y)


def test_decode_dtype_argument_is_checked() -> None:
    buf = codec.encode(np.ones(8, np.float32), "eden-biased", 2, seed=1)
    with pytest.raises(TypeError, match="dtype"):
        codec.decode(buf, dtype=np.int32)


# ------------------------------------------------------------------------ 2. tiny-magnitude inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("scheme", "bits"), [
    ("eden-unbiased", 2), ("eden-biased", 2), ("turboquant-mse", 2), ("turboquant-prod", 2),
    ("turboquant-prod", 1), ("eden-unbiased", 0.5), ("eden-biased", 2.5),
])
def test_tiny_inputs_round_trip_at_normal_error(backend: str, scheme: str, bits: float) -> None:
    """x * 1e-25 in float32 (its squares underflow float32) must give the error x itself gets: the
    encoder rescales by a power of two (exact) and carries the factor in the scales."""
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    ref = _vnmse(codec.decode(codec.encode(x, scheme, bits, seed=5, backend=backend), backend=backend), x)
    for mag in (1e-25, 1e-35):
        tiny = (x * np.float32(mag)).astype(np.float32)
        buf = codec.encode(tiny, scheme, bits, seed=5, backend=backend)
        est = codec.decode(buf, backend=backend)
        assert np.all(np.isfinite(est))
        assert _vnmse(est, tiny) == pytest.approx(ref, rel=0.05), (mag, ref)
        assert codec.parse(buf).rotations == codec.parse(codec.encode(x, scheme, bits, seed=5)).rotations


@pytest.mark.parametrize("backend", BACKENDS)
def test_tiny_float64_inputs_round_trip(backend: str) -> None:
    x = np.random.default_rng(4).standard_normal(2048)
    ref = _vnmse(codec.decode(codec.encode(x, "eden-unbiased", 2, seed=6, backend=backend)), x)
    tiny = x * 1e-200  # squares underflow float64
    est = codec.decode(codec.encode(tiny, "eden-unbiased", 2, seed=6, backend=backend), backend=backend)
    assert _vnmse(est * 1e200, x) == pytest.approx(ref, rel=0.05)


@pytest.mark.parametrize("backend", BACKENDS)
def test_subnormal_inputs_encode_at_normal_error(backend: str) -> None:
    """Subnormal float32 inputs (below 1.2e-38): the rotation's 1/sqrt(D) rounded them before the
    encoder's rescale of y could help (N(0,1) x 1e-43: vNMSE 0.19 on the numba path against 0.13). The
    input itself is scaled by a power of two first: the frame is x * 2^k's, its scales 2^-k apart.
    (An output this small is still the output dtype's: decode returns what float32 can hold.)"""
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32)
    ref = codec.encode(x, "eden-unbiased", 2, seed=5, backend=backend)
    for mag, k in ((2.0**-140, 140), (2.0**-130, 130)):
        tiny = (x.astype(np.float64) * mag).astype(np.float32)  # subnormal: x's top bits survive
        shifted = np.ldexp(tiny.astype(np.float64), k).astype(np.float32)
        buf = codec.encode(tiny, "eden-unbiased", 2, seed=5, backend=backend)
        same = codec.encode(shifted, "eden-unbiased", 2, seed=5, backend=backend)
        h, hs = codec.parse(buf), codec.parse(same)
        assert h.payload_length == hs.payload_length and buf[-h.payload_length - 4:-4] == \
            same[-hs.payload_length - 4:-4]  # the same indices as the normal-range input
        assert [math.ldexp(v, k) for v in h.scales] == list(hs.scales)
        est = codec.decode(buf, backend=backend).astype(np.float64) * 2.0**k
        assert _vnmse(est, shifted) < 1.2 * _vnmse(codec.decode(ref, backend=backend), x) + 0.01
    assert codec.parse(ref).rotations >= 1


def test_scaling_by_a_power_of_two_is_exact_at_any_magnitude() -> None:
    """x and x * 2^-k give the same indices and scales that differ by exactly 2^-k, down to magnitudes
    whose squares underflow float32 (the rescaling is a power of two too, so it changes no rounding):
    ordinary inputs encode to the same bytes as before the fix."""
    x = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    for backend in BACKENDS:
        a = codec.encode(x, "eden-unbiased", 2, seed=9, rotations=1, backend=backend)
        h_a = codec.parse(a)
        for k in (20, 90, 110):
            b = codec.encode(x * np.float32(2.0**-k), "eden-unbiased", 2, seed=9, rotations=1,
                             backend=backend)
            h_b = codec.parse(b)
            assert h_b.scales[0] == h_a.scales[0] * 2.0**-k, (backend, k)
            assert a[h_a.payload_offset : -4] == b[h_b.payload_offset : -4], (backend, k)


# ----------------------------------------------------------------------------- 3. argument checks


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"seed": 1.5}, TypeError, "seed"),
    ({"seed": "5"}, TypeError, "seed"),
    ({"seed": True}, TypeError, "seed"),
    ({"seed": -1}, ValueError, "seed"),
    ({"seed": 2**64}, ValueError, "seed"),
    ({"rotations": True}, TypeError, "rotations"),
    ({"rotations": 2.0}, TypeError, "rotations"),
    ({"rotations": "two"}, ValueError, "rotations"),
    ({"rotations": 0}, ValueError, "rotations"),
    ({"rotations": 4}, ValueError, "rotations"),
    ({"bits": "2"}, TypeError, "bit budget"),
    ({"bits": True}, TypeError, "bit budget"),
    ({"bits": 9}, ValueError, "bit budget"),
    ({"scheme": 3}, TypeError, "scheme"),
])
def test_encode_argument_errors_name_the_argument(kwargs: dict[str, Any], exc: type, match: str) -> None:
    args: dict[str, Any] = {"scheme": "eden-unbiased", "bits": 2, "seed": 1, **kwargs}
    with pytest.raises(exc, match=match) as e:
        codec.encode(np.ones(8, np.float32), args.pop("scheme"), args.pop("bits"), **args)
    assert isinstance(e.value, codec.CodecError)  # still the codec's error type (an MrcError)


def test_numpy_integer_arguments_are_accepted() -> None:
    x = np.ones(8, np.float32)
    a = codec.encode(x, "eden-unbiased", np.int64(2), seed=np.uint64(7),  # type: ignore[arg-type]
                     rotations=np.int8(2))  # type: ignore[arg-type]
    assert a == codec.encode(x, "eden-unbiased", 2, seed=7, rotations=2)


# ----------------------------------------------------- 4. frames whose scale cannot be finite output


@pytest.mark.parametrize(("scheme", "bits"), [("eden-unbiased", 2), ("eden-biased", 4), ("drive", 1),
                                              ("turboquant-mse", 3), ("turboquant-prod", 2)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_frame_with_huge_scale_is_refused(scheme: str, bits: int, backend: str) -> None:
    x = np.random.default_rng(6).standard_normal(1024).astype(np.float32)
    buf = codec.encode(x, scheme, bits, seed=3, backend=backend)
    h = codec.parse(buf)
    for s in (1e300, 1e39):
        scales = [s, *h.scales[1:]] if scheme != "turboquant-prod" else [h.scales[0], s, *h.scales[2:]]
        bad = _with_scales(buf, scales)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no overflow warning either: refused before computing
            with pytest.raises(codec.CodecError, match="scale") as e:
                codec.decode(bad, backend=backend)
        assert "finite" in e.value.reason


def test_frame_whose_output_overflows_is_refused() -> None:
    """Each table entry finite, the inverse rotation's sums not: refused after decoding, never returned."""
    x = np.random.default_rng(7).standard_normal(1 << 12).astype(np.float32)
    for backend in BACKENDS:
        buf = codec.encode(x, "eden-biased", 2, seed=3, backend=backend)
        bad = _with_scales(buf, [1e38])  # 2 bits: largest centroid 1.51, table entries 1.5e38 < 3.4e38
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(codec.CodecError, match="non-finite"):
                codec.decode(bad, backend=backend)


@pytest.mark.parametrize("d, outlier", [(1 << 16, 1e37), (1 << 20, 1e36), (1000, 3e38)])
def test_a_finite_outlier_near_float32s_maximum_decodes_on_both_paths(d: int, outlier: float) -> None:
    """A finite float32 gradient with one outlier above float32's maximum / sqrt(D): every frame encodes,
    but the compiled inverse rotation (1/sqrt(D) applied at its last stage) overflowed in its partial
    sums and refused its own frames ("decodes to non-finite values"); the reference, scaled at every
    step, decoded them. Such a frame is now decoded by the reference when the compiled path overflows:
    both backends give the same, finite, result at the usual error."""
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    x[-1] = np.float32(outlier)
    for enc in BACKENDS:
        buf = codec.encode(x, "eden-unbiased", 2, seed=3, backend=enc)
        ys = [codec.decode(buf, backend=dec) for dec in BACKENDS]
        for y in ys:
            assert np.all(np.isfinite(y)) and _vnmse(y / outlier, x / outlier) < 0.2
        assert np.allclose(ys[0] / outlier, ys[1] / outlier, atol=1e-5)


def test_a_ring_all_reduce_with_a_huge_finite_outlier_completes() -> None:
    """The same outlier in one rank's gradient failed the compressed all-reduce with CodecError."""
    from mrc.collective.ring import Config, allreduce
    from mrc.collective.transport import run_inproc

    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(1 << 18).astype(np.float32) for _ in range(4)]
    xs[0][5] = np.float32(1e36)
    res = run_inproc(4, lambda t: allreduce(t, xs[t.rank], Config("eden-unbiased", 2.0, "aware"), step=0),
                     timeout_s=60)
    exact = sum(x.astype(np.float64) for x in xs) / 4
    for r in res:
        assert np.all(np.isfinite(r.out)) and np.array_equal(r.out, res[0].out)
        assert _vnmse(r.out, exact) < 1.0


def test_negative_scale_is_refused() -> None:
    buf = codec.encode(np.linspace(-1, 1, 64), "eden-unbiased", 2, seed=3)
    with pytest.raises(codec.CodecError, match="negative scale"):
        codec.decode(_with_scales(buf, [-1.0]))


# -------------------------------------------------------------- 5. auto on exactly representable input


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("scheme", "bits"), [("eden-unbiased", 1), ("eden-unbiased", 2), ("drive", 1),
                                              ("eden-biased", 2), ("eden-biased", 4), ("eden-unbiased", 8)])
def test_auto_keeps_one_rotation_when_it_is_exact(backend: str, scheme: str, bits: float) -> None:
    """A one-hot input rotates into a flat ±1/sqrt(D) vector, which one rotation plus the optimised scale
    reproduces exactly (error 0, so no bias either): `auto` must not add a rotation that makes it lossy."""
    for d, j in ((4096, 5), (1000, 999), (1 << 15, 12345)):
        x = np.zeros(d, np.float32)
        x[j] = -3.0
        buf = codec.encode(x, scheme, bits, seed=11, backend=backend)
        assert codec.parse(buf).rotations == 1
        assert _vnmse(codec.decode(buf, backend=backend), x) < 1e-10


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_still_adds_a_rotation_when_one_is_lossy(backend: str) -> None:
    """Two equal spikes: not representable after one rotation (a two-level lattice), so rule (b) fires."""
    x = np.zeros(4096, np.float32)
    x[[5, 700]] = 1.0
    assert codec.parse(codec.encode(x, "eden-unbiased", 1, seed=11, backend=backend)).rotations == 2
    # TurboQuant_mse has a fixed scale, and a fractional budget quantizes its two groups with two
    # codebooks: the flat vector is not exact there, two rotations as before
    one = np.zeros(4096, np.float32)
    one[5] = 1.0
    for scheme, bits in (("turboquant-mse", 2), ("eden-unbiased", 2.5), ("turboquant-prod", 2)):
        assert codec.parse(codec.encode(one, scheme, bits, seed=11, backend=backend)).rotations == 2


def test_decoded_values_are_finite_for_legitimate_large_inputs() -> None:
    x = (np.random.default_rng(8).standard_normal(4096) * 1e15).astype(np.float32)
    for backend in BACKENDS:
        est = codec.decode(codec.encode(x, "eden-unbiased", 4, seed=1, backend=backend), backend=backend)
        assert np.all(np.isfinite(est)) and not math.isnan(_vnmse(est, x))


# ---------------------------------------------------------------- found by fuzzing (2026-12-04)


def _forged_frame(d: int, bits: float) -> bytes:
    """A version-1 EDEN frame of `d` float32 elements, one scale, an empty payload, a valid CRC."""
    fixed = struct.Struct("<4sBBBBBBHdQQQ")
    body = fixed.pack(b"MRCQ", 1, 1, 2, 1, 0, 1, 1, bits, 7, d, d) + struct.pack("<Q", d)
    body += struct.pack("<d", 1.0) + struct.pack("<Q", 0)
    return body + struct.pack("<I", zlib.crc32(body))


def test_a_tiny_budget_cannot_claim_a_huge_vector() -> None:
    """At b = 1e-300 the payload bound allowed an empty payload for any element count: a 76-byte frame
    decoded into 2^26 zeros (672 MB of masks and output). Budgets below MIN_BITS are refused, by encode
    and by parse, so a frame's size bounds what decoding it allocates."""
    frame = _forged_frame(1 << 26, 1e-300)
    with pytest.raises(codec.CodecValueError, match=r"bit budget must be in \[0.015625, 8\]"):
        codec.parse(frame)
    with pytest.raises(codec.CodecValueError):
        codec.encode(np.ones(8, np.float32), "eden-unbiased", 1e-3)
    with pytest.raises(codec.CodecError, match="payload of 0 bytes cannot hold"):
        codec.decode(_forged_frame(1 << 26, codec.MIN_BITS))  # the least budget needs its payload
    x = np.random.default_rng(0).standard_normal(1 << 12).astype(np.float32)
    assert np.isfinite(codec.decode(codec.encode(x, "eden-unbiased", codec.MIN_BITS, seed=1))).all()


def test_the_hop_checks_the_claimed_size_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame that claims more elements than the chunk is refused from its header on both paths: it
    used to be decoded whole first (the fused path handed it to the three passes, which decoded)."""
    big = codec.encode(np.ones(1 << 16, np.float32), "eden-unbiased", 2, seed=1)

    def no_decode(*_a: Any, **_k: Any) -> None:
        raise AssertionError("decoded before the size check")

    monkeypatch.setattr(codec, "decode", no_decode)
    for path in hop.PATHS:
        with pytest.raises(codec.CodecValueError, match="holds 65536 elements, own chunk 1000"):
            hop.hop(big, np.ones(1000, np.float32), "eden-unbiased", 2, 5, path=path)


@pytest.mark.parametrize("shape", [(1000, 1), (2, 3), ()])
def test_the_hop_takes_a_frame_of_any_shape_as_its_chunk(shape: tuple[int, ...]) -> None:
    """encode keeps the input's shape; a hop's chunk is flat. A frame of shape (1000, 1) met numpy's
    broadcast (a raw ValueError) in the three passes, which the fused path also falls back to."""
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1
    frame = codec.encode(x, "eden-unbiased", 2, seed=1)
    own = np.ones(x.size, np.float32)
    outs = {p: hop.hop(frame, own, "eden-unbiased", 2, 5, path=p) for p in hop.PATHS}
    assert outs["fused"] == outs["three-pass"]
    assert codec.parse(outs["fused"]).shape == (x.size,)


def test_what_is_not_a_contiguous_frame_is_a_codec_error_and_the_hop_wants_a_seed() -> None:
    f = codec.encode(np.ones(100, np.float32), "eden-unbiased", 2, seed=1)
    for bad in (None, "x", np.frombuffer(f, np.uint8)[::2], memoryview(f)[::2]):
        with pytest.raises(codec.CodecTypeError, match="contiguous bytes-like"):
            codec.decode(bad)  # type: ignore[arg-type]
    for path in hop.PATHS:  # None would draw a random seed on one path and be refused on the other
        with pytest.raises(codec.CodecTypeError, match="seed"):
            hop.hop(f, np.ones(100, np.float32), "eden-unbiased", 2, None, path=path)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- unknown backends


@pytest.mark.parametrize("backend", ["cuda", "CUDA", "gpu", "numbaa", ""])
def test_an_unknown_backend_is_a_codec_error_naming_the_available_ones(backend: str) -> None:
    """backend='cuda' was a plain ValueError from accel.kernels; now the codec's own error, before any
    work, naming the backend asked for, the ones there are and (for a GPU name) that there is none."""
    frame = codec.encode(np.ones(8, np.float32), "eden-unbiased", 2, seed=1)
    for call in (lambda: codec.encode(np.ones(8, np.float32), "eden-unbiased", 2, seed=1, backend=backend),
                 lambda: codec.decode(frame, backend=backend)):
        with pytest.raises(codec.CodecValueError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(f"quant codec: unknown backend {backend!r}: available are numba, numpy")
        assert ("no GPU backend" in msg) == (backend.lower() in ("cuda", "gpu"))


def test_a_backend_of_the_wrong_type_is_a_codec_type_error() -> None:
    with pytest.raises(codec.CodecTypeError, match="backend must be one of numba, numpy or None, got int 1"):
        codec.encode(np.ones(8, np.float32), "eden-unbiased", 2, seed=1, backend=1)  # type: ignore[arg-type]


def _forged_sub_bit_frame(d: int, short: int) -> bytes:
    """A CRC-valid eden-unbiased frame of d float32 elements at 1/64 bit whose payload is `short` bytes
    less than its mask needs: within the payload bound's slack, so only the mask can refuse it."""
    bits = 1 / 64
    plen = int(d * bits) // 8 - short
    body = (struct.pack("<4sBBBBBBHdQQQ", b"MRCQ", 1, 1, 2, 1, 0, 1, 1, bits, 1, d, d)
            + struct.pack("<QdQ", d, 1.0, plen) + bytes(plen))
    return body + struct.pack("<I", zlib.crc32(body))


def test_a_forged_sub_bit_frame_is_refused_with_the_mask_at_one_byte_per_coordinate() -> None:
    """Such a frame can only be refused once its coordinate mask is drawn; the mask was drawn as one
    D-sized uint64 array (8 bytes per coordinate: 4 GiB for a 1 MiB frame claiming 2^29 elements, a
    MemoryError rather than a codec.CodecError under a memory limit). It is now drawn in pieces (the same
    stream), and a caller that knows the size refuses the frame before decoding (max_elements)."""
    import tracemalloc

    from mrc.quant import eden, rht

    d = 1 << 24
    frame = _forged_sub_bit_frame(d, 40)
    tracemalloc.start()
    try:
        with pytest.raises(codec.CodecError, match="the header implies"):
            codec.decode(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # one byte per coordinate, the members' indices and a few pieces' raw words; was more than 8 d
    assert peak < d + 32 * eden.MASK_CHUNK, peak
    with pytest.raises(codec.CodecError, match=f"holds {d} elements, more than the 4096 expected"):
        codec.decode(frame, max_elements=4096)
    # the pieces draw the very stream one draw did (masks are part of the wire format)
    n = 3 * eden.MASK_CHUNK + 5
    bg = np.random.PCG64(np.random.SeedSequence((9, rht.STREAM_MASK, 0)))
    one = (bg.random_raw(n) >> np.uint64(11)) < np.uint64(round(0.3 * 2.0**53))
    assert np.array_equal(eden.coordinate_mask(9, n, 0.3), one)


def test_a_shape_numpy_cannot_build_is_a_codec_error() -> None:
    good = codec.encode(np.zeros((0, 1), np.float32), "eden-unbiased", 2, seed=1)
    body = bytearray(good[:-4])
    struct.pack_into("<Q", body, 52, 2**63)  # shape (0, 2^63): 0 elements, but no array has that shape
    bad = bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))
    with pytest.raises(codec.CodecError, match="dimension above"):
        codec.decode(bad)


def test_the_hop_says_it_needs_an_explicit_seed() -> None:
    """It refused None while its message said None was allowed."""
    f = codec.encode(np.ones(8, np.float32), "eden-unbiased", 2, seed=1)
    with pytest.raises(codec.CodecTypeError, match=r"needs an explicit seed") as e:
        hop.hop(f, np.ones(8, np.float32), "eden-unbiased", 2, None)  # type: ignore[arg-type]
    assert "or None" not in str(e.value)
