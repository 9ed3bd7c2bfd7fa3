"""The fused ring hop (mrc/quant/hop.py, kernels.hop_rotate) gives the bytes of decode + add + encode,
on every case it takes and on those it hands to the three-pass path; the ring's result does not depend
on MRC_HOP_KERNEL. (Speed is measured by bench/quant.py, never asserted here.)"""

from __future__ import annotations

import numpy as np
import pytest

from mrc.collective import Config, allreduce, run_inproc
from mrc.quant import accel, codec, hop

pytestmark = pytest.mark.skipif(accel.kernels() is None, reason="the fused hop needs the numba kernels")


def _pair(d: int, scale_own: float = 1.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(d).astype(np.float32),
            (rng.standard_normal(d) * scale_own).astype(np.float32))


# 100000 and 131071: a last block of 1,696 and 32,767 elements, whose float64 sum is vectorised (short
# tails are summed the same in any order of the few elements: they hid a scale that differed)
@pytest.mark.parametrize("d", [(1 << 15) + 1, 1 << 16, (1 << 16) + 3, 3 * (1 << 15) + 5, 100_000, 131_071,
                               1 << 17, 1 << 18])
@pytest.mark.parametrize(("scheme", "bits"), [("eden-unbiased", 2), ("eden-unbiased", 4), ("eden-biased", 1),
                                              ("eden-biased", 3), ("drive", 1), ("eden-unbiased", 8)])
def test_fused_hop_is_bit_identical(d: int, scheme: str, bits: int) -> None:
    a, own = _pair(d, seed=d + bits)
    f = codec.encode(a, scheme, bits, seed=3)
    fused = hop._fused(f, own, scheme, bits, 77)
    assert fused is not None  # the case is one the fused kernel takes
    assert fused == hop.three_pass(f, own, scheme, bits, 77)
    assert hop.hop(f, own, scheme, bits, 77, path="fused") == fused


def test_fused_hop_applies_rule_a_like_encode() -> None:
    """A sum dominated by a few large coordinates: rule (a) asks for two rotations of the sum."""
    d = 1 << 16
    a, own = _pair(d, scale_own=1e-3)
    own[[7, 4000, 30000]] = 300.0
    f = codec.encode(a, "eden-unbiased", 2, seed=3)
    fused = hop._fused(f, own, "eden-unbiased", 2, 5)
    assert fused is not None and codec.parse(fused).rotations == 2
    assert fused == hop.three_pass(f, own, "eden-unbiased", 2, 5)


@pytest.mark.parametrize("case", ["small", "fractional", "two-rotations", "turboquant", "spike"])
def test_cases_outside_the_kernel_fall_back_to_the_same_bytes(case: str) -> None:
    d = 1 << 16
    a, own = _pair(d)
    scheme, bits, rot = "eden-unbiased", 2.0, 1
    if case == "small":
        a, own = _pair(1000)
    elif case == "fractional":
        bits = 2.5
    elif case == "two-rotations":
        rot = 2
    elif case == "turboquant":
        scheme = "turboquant-mse"
    f = codec.encode(a, scheme, bits, seed=3, rotations=rot)
    if case == "spike":  # the sum has one non-zero: encode's single-spike probe, which the kernel skips
        f = codec.encode(np.zeros(d, np.float32), scheme, bits, seed=3, rotations=1)
        own = np.zeros(d, np.float32)
        own[9] = 2.0
    assert hop._fused(f, own, scheme, bits, 11) is None
    assert hop.hop(f, own, scheme, bits, 11, path="fused") == hop.three_pass(f, own, scheme, bits, 11)


def test_fused_hop_rejects_what_decode_rejects() -> None:
    a, own = _pair(1 << 16)
    f = bytearray(codec.encode(a, "eden-unbiased", 2, seed=3))
    f[-7] ^= 1  # payload byte: the CRC no longer matches
    with pytest.raises(codec.CodecError, match="CRC"):
        hop.hop(bytes(f), own, "eden-unbiased", 2, 1, path="fused")
    with pytest.raises(codec.CodecValueError, match="elements"):
        hop.hop(codec.encode(a, "eden-unbiased", 2, seed=3), own[:-1], "eden-unbiased", 2, 1)


def test_hop_path_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hop.ENV, "fast")
    with pytest.raises(ValueError, match=hop.ENV):
        hop.default_path()
    with pytest.raises(ValueError, match="path"):
        hop.hop(b"", np.zeros(1, np.float32), "eden-unbiased", 2, 1, path="one-pass")


@pytest.mark.parametrize("partial_sums", ["naive", "aware"])
def test_ring_result_does_not_depend_on_the_hop_path(
    monkeypatch: pytest.MonkeyPatch, partial_sums: str,
) -> None:
    n, d = 3, 3 * (1 << 16) + 17
    xs = [np.random.default_rng(r).standard_normal(d).astype(np.float32) for r in range(n)]
    cfg = Config("eden-unbiased", 2, partial_sums=partial_sums, seed=4)
    outs = {}
    for path in hop.PATHS:
        monkeypatch.setenv(hop.ENV, path)
        res = run_inproc(n, lambda t: allreduce(t, xs[t.rank], cfg, 1))
        outs[path] = res
        assert all(np.array_equal(r.out, res[0].out) for r in res)
    for a, b in zip(outs["fused"], outs["three-pass"], strict=True):
        assert np.array_equal(a.out, b.out) and a.wire_bytes == b.wire_bytes
