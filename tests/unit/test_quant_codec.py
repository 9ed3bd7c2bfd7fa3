"""The compressed-vector codec: round trips for every scheme, budget, shape and dtype; exact wire size;
malformed or inconsistent buffers raise CodecError with a reason; bit packing."""

from __future__ import annotations

import math
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrc.errors import MrcError
from mrc.quant import bitpack, codec
from mrc.quant.bench import theory

BUDGETS: dict[str, list[float]] = {
    "eden-unbiased": [0.25, 0.5, 1, 1.5, 2, 2.5, 3, 4, 5, 6.75, 7, 8],
    "eden-biased": [0.3, 1, 2, 3.25, 4, 8],
    "drive": [1],
    "turboquant-mse": [1, 2, 3, 4, 5, 8],
    "turboquant-prod": [1, 2, 3, 4, 8],
}
SHAPES = [(), (0,), (1,), (5,), (3, 7), (2, 3, 4), (1000,), (16, 64)]
DTYPES = [np.float16, np.float32, np.float64]


def _cases() -> list[tuple[str, float]]:
    return [(s, b) for s, bs in BUDGETS.items() for b in bs]


@pytest.mark.parametrize(("scheme", "bits"), _cases())
def test_round_trip_every_shape_and_dtype(scheme: str, bits: float) -> None:
    rng = np.random.default_rng(1)
    for shape in SHAPES:
        for dtype in DTYPES:
            x = rng.standard_normal(shape).astype(dtype)
            buf = codec.encode(x, scheme, bits, seed=42)
            y = codec.decode(buf)
            assert y.shape == x.shape and y.dtype == x.dtype
            assert np.all(np.isfinite(y))
            assert buf == codec.encode(x, scheme, bits, seed=42)  # deterministic given the seed
            assert np.array_equal(codec.decode(buf), y)
            h = codec.parse(buf)
            assert (h.scheme, h.bits, h.seed, h.shape) == (scheme, bits, 42, x.shape)
            assert h.dtype == np.dtype(dtype)
            if x.size >= 1000:
                # one 1000/1024-element vector: the vNMSE is within a few x of the asymptotic value
                err = np.sum((x.astype(np.float64) - y) ** 2) / np.sum(x.astype(np.float64) ** 2)
                th = theory(scheme, bits)
                assert th is not None and err < 2.0 * th + 0.02


def test_wire_size_is_header_plus_packed_indices() -> None:
    x = np.random.default_rng(0).standard_normal((30, 30)).astype(np.float32)  # d = 900, D = 1024
    fixed = 44 + 8 * 2 + 8 + 8 + 4  # fixed fields, shape (2 dims), one scale, payload length, CRC
    for bits in (1, 2, 3, 4, 5, 7, 8):
        buf = codec.encode(x, "eden-biased", bits, seed=1)
        assert len(buf) == fixed + math.ceil(1024 * bits / 8)
    # TurboQuant_prod: (b-1)-bit indices + 1024 sign bits + one norm per QJL block (one block here)
    buf = codec.encode(x, "turboquant-prod", 3, seed=1)
    assert len(buf) == fixed + 8 + 1024 * 2 // 8 + 1024 // 8


def test_rotations_recorded_and_auto_flag() -> None:
    x = np.random.default_rng(0).standard_normal(4096)
    for r in (1, 2, 3):
        h = codec.parse(codec.encode(x, "eden-unbiased", 2, rotations=r))
        assert h.rotations == r and not h.auto
    assert codec.parse(codec.encode(x, "eden-unbiased", 2)).auto
    s1 = codec.parse(codec.encode(x, "drive", 1)).seed
    s2 = codec.parse(codec.encode(x, "drive", 1)).seed
    assert s1 != s2  # fresh seeds when none is given


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"scheme": "nope", "bits": 2}, "unknown scheme"),
        ({"scheme": "eden-biased", "bits": 0}, "bit budget"),
        ({"scheme": "eden-biased", "bits": 8.5}, "bit budget"),
        ({"scheme": "eden-biased", "bits": math.nan}, "bit budget"),
        ({"scheme": "drive", "bits": 2}, "drive"),
        ({"scheme": "turboquant-mse", "bits": 2.5}, "integer"),
        ({"scheme": "eden-biased", "bits": 2, "rotations": 4}, "rotations"),
        ({"scheme": "eden-biased", "bits": 2, "seed": -1}, "seed"),
    ],
)
def test_encode_rejects_bad_arguments(kwargs: dict[str, Any], reason: str) -> None:
    with pytest.raises(codec.CodecError) as e:
        codec.encode(np.ones(8), **kwargs)
    assert reason in e.value.reason


def test_encode_rejects_bad_input() -> None:
    with pytest.raises(codec.CodecError, match="dtype"):
        codec.encode(np.arange(8), "eden-biased", 2)
    for scheme, bits in (("eden-unbiased", 2), ("turboquant-prod", 1), ("turboquant-prod", 2)):
        bad = np.ones(16)
        bad[3] = np.nan
        with pytest.raises(codec.CodecError, match="non-finite"):
            codec.encode(bad, scheme, bits)
    assert issubclass(codec.CodecError, MrcError)


def test_zero_vector() -> None:
    for scheme, bits in _cases():
        y = codec.decode(codec.encode(np.zeros(100, np.float32), scheme, bits, seed=3))
        assert np.all(y == 0)


# ------------------------------------------------------------------------------------ malformed buffers

_FIXED = struct.Struct("<4sBBBBBBHdQQQ")


def _fields(buf: bytes) -> list[Any]:
    return list(_FIXED.unpack_from(buf, 0))


def _rebuild(fields: list[Any], rest: bytes) -> bytes:
    """A buffer with edited fixed fields and a *valid* CRC, so the field checks themselves are tested."""
    body = _FIXED.pack(*fields) + rest
    return body + struct.pack("<I", zlib.crc32(body))


def _edit(buf: bytes, index: int, value: object) -> bytes:
    f = _fields(buf)
    f[index] = value
    return _rebuild(f, buf[_FIXED.size : -4])


@pytest.fixture(scope="module")
def good() -> bytes:
    return codec.encode(np.random.default_rng(0).standard_normal((10, 10)), "eden-unbiased", 2.5, seed=5)


def _reason(buf: bytes) -> str:
    with pytest.raises(codec.CodecError) as e:
        codec.decode(buf)
    return e.value.reason


def test_rejects_framing_errors(good: bytes) -> None:
    assert "too short" in _reason(good[:20])
    assert "too short" in _reason(b"")
    assert "magic" in _reason(b"XXXX" + good[4:])
    assert "version" in _reason(good[:4] + b"\x03" + good[5:])
    assert "CRC" in _reason(good[:-1] + bytes([good[-1] ^ 1]))
    assert "CRC" in _reason(good[:-5] + good[-4:])  # a payload byte lost


def test_rejects_inconsistent_fields(good: bytes) -> None:
    # field index in _FIXED: 0 magic, 1 version, 2 scheme, 3 dtype, 4 rotations, 5 flags, 6 ndim,
    # 7 nscales, 8 bits, 9 seed, 10 d, 11 D
    assert "scheme" in _reason(_edit(good, 2, 9))
    assert "dtype" in _reason(_edit(good, 3, 7))
    assert "rotation" in _reason(_edit(good, 4, 0))
    assert "rotation" in _reason(_edit(good, 4, 4))
    assert "flag" in _reason(_edit(good, 5, 0x80))
    assert "ndim" in _reason(_edit(good, 6, 40))
    assert "bit budget" in _reason(_edit(good, 8, 9.0))
    assert "bit budget" in _reason(_edit(good, 8, -1.0))
    assert "drive" in _reason(_edit(_edit(good, 2, 3), 8, 2.0))
    assert "padded" in _reason(_edit(good, 11, 256))
    assert "padded" in _reason(_edit(good, 10, 1000))
    assert "scales" in _reason(_edit(good, 7, 2))
    # shape product != d: shape (10, 10) -> (10, 11)
    f = _fields(good)
    rest = bytearray(good[_FIXED.size : -4])
    struct.pack_into("<Q", rest, 8, 11)
    assert "shape" in _reason(_rebuild(f, bytes(rest)))
    # a non-finite scale
    rest = bytearray(good[_FIXED.size : -4])
    struct.pack_into("<d", rest, 16, math.inf)
    assert "scale" in _reason(_rebuild(f, bytes(rest)))
    # changing the budget changes the implied payload size
    assert "payload" in _reason(_edit(good, 8, 3.0))
    # payload length field disagrees with the buffer
    rest = bytearray(good[_FIXED.size : -4])
    (plen,) = struct.unpack_from("<Q", rest, 24)
    struct.pack_into("<Q", rest, 24, plen + 1)
    assert "payload length" in _reason(_rebuild(f, bytes(rest)))


def test_huge_claimed_size_is_refused_before_allocating() -> None:
    """A header claiming D = 2^34 over a few bytes of payload (fractional and sparse budgets regenerate
    D-sized masks) must fail fast on the size bounds, not try to allocate."""
    for bits in (0.5, 2.5):
        buf = codec.encode(np.ones(16), "eden-unbiased", bits, seed=1)
        f = _fields(buf)
        f[10], f[11] = 2**34, 2**34  # d and D
        rest = bytearray(buf[_FIXED.size : -4])
        struct.pack_into("<Q", rest, 0, 2**34)  # the 1-D shape
        assert "cannot hold" in _reason(_rebuild(f, bytes(rest)))


def test_rejects_nonzero_padding_bits() -> None:
    buf = codec.encode(np.ones(8), "eden-biased", 3, seed=1)  # 8 coords x 3 bits = 3 bytes, no padding
    buf5 = codec.encode(np.ones(4), "eden-biased", 3, seed=1)  # 4 x 3 = 12 bits: 4 padding bits
    assert codec.decode(buf).shape == (8,)
    body = bytearray(buf5[:-4])
    body[-1] |= 0x80
    bad = bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))
    assert "padding" in _reason(bad)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=200))
def test_garbage_never_decodes(blob: bytes) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode(blob)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255))
def test_any_corrupted_byte_is_rejected(pos: int, flip: int) -> None:
    buf = bytearray(codec.encode(np.linspace(-1, 1, 300), "turboquant-prod", 2, seed=9))
    pos %= len(buf)
    buf[pos] ^= flip or 1
    with pytest.raises(codec.CodecError):
        codec.decode(bytes(buf))


# ---------------------------------------------------------------------------------------- bit packing


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8), st.integers(0, 100), st.integers(0, 2**32 - 1))
def test_bitpack_round_trip(bits: int, n: int, seed: int) -> None:
    idx = np.random.default_rng(seed).integers(0, 2**bits, n).astype(np.uint8)
    packed = bitpack.pack(idx, bits)
    assert packed.size == bitpack.packed_size(n, bits)
    assert np.array_equal(bitpack.unpack(packed, bits, n), idx)


def test_bitpack_layout_is_one_little_endian_stream() -> None:
    idx = np.random.default_rng(3).integers(0, 256, 1001).astype(np.uint8)
    for bits in range(1, 9):
        v = (idx & np.uint8((1 << bits) - 1)).astype(np.uint8)
        stream = np.unpackbits(v[:, None], axis=1, bitorder="little")[:, :bits].ravel()
        expect = np.packbits(stream, bitorder="little")
        assert np.array_equal(bitpack.pack(v, bits), expect), bits
    with pytest.raises(ValueError):
        bitpack.unpack(np.zeros(3, np.uint8), 3, 9)  # 9 x 3 bits need 4 bytes


# -- decode(out=): into the caller's buffer


@pytest.mark.parametrize(("scheme", "bits", "d", "dtype"), [
    ("eden-unbiased", 2, 1 << 16, np.float32),   # the direct path: the inverse rotation writes into out
    ("eden-unbiased", 4, 1 << 16, np.float32),
    ("eden-biased", 1.5, 1 << 16, np.float32),   # two sections: computed, then copied in
    ("eden-unbiased", 2, 1000, np.float32),      # padded
    ("turboquant-prod", 3, 4096, np.float32),
    ("eden-unbiased", 2, 4096, np.float64),
])
def test_decode_into_out_gives_the_same_values(scheme: str, bits: float, d: int, dtype: Any) -> None:
    x = np.random.default_rng(3).standard_normal(d).astype(dtype)
    f = codec.encode(x, scheme, bits, seed=11)
    want = codec.decode(f)
    buf = np.full(d, np.nan, dtype)
    got = codec.decode(f, out=buf)
    assert np.shares_memory(got, buf)
    assert buf.tobytes() == want.tobytes()
    view = np.full(2 * d, np.nan, dtype)[d:]  # a slice of a larger array, as the ring's result
    codec.decode(f, out=view)
    assert view.tobytes() == want.tobytes()


def test_decode_into_out_allocates_no_array_of_its_own() -> None:
    import tracemalloc

    d = 1 << 20
    x = np.random.default_rng(1).standard_normal(d).astype(np.float32)
    f = codec.encode(x, "eden-unbiased", 2, seed=5)
    buf = np.empty(d, np.float32)
    codec.decode(f, out=buf)  # compile / warm
    tracemalloc.start()
    try:
        codec.decode(f, out=buf)
        _, peak_into = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        codec.decode(f)
        _, peak_fresh = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_fresh >= 4 * d  # the fresh result
    assert peak_into < d // 2  # sign words and the like, no 4 MiB vector


@pytest.mark.parametrize(("out", "why"), [
    (np.empty(4095, np.float32), r"of the frame's 4096 elements \(not 4095\)$"),
    (np.empty(4096, np.float64), r"of dtype float32 \(not float64\)$"),
    (np.empty(8192, np.float32)[::2], "must be C-contiguous$"),
    ([0.0] * 4096, "a numpy array, got list"),
])
def test_decode_refuses_an_unfit_out(out: Any, why: str) -> None:
    f = codec.encode(np.ones(4096, np.float32), "eden-unbiased", 2, seed=1)
    with pytest.raises(codec.CodecValueError, match=why):
        codec.decode(f, out=out)
    ro = np.empty(4096, np.float32)
    ro.flags.writeable = False
    with pytest.raises(codec.CodecValueError, match="writable"):
        codec.decode(f, out=ro)
