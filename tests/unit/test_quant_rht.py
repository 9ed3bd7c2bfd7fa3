"""RHT (docs/design.md §8): the fast FWHT is the orthonormal Hadamard transform, exact to float precision, its
own inverse; rotations are seeded, version-stable and inverted exactly; the moment statistic."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mrc.quant import rht

# Relative round-off bounds: the FWHT sums D terms through log2(D) levels, so the error grows like
# eps * log2(D); 64 eps covers D up to 2^20 with a wide margin (float32 eps 1.2e-7, float64 2.2e-16).
TOL: dict[Any, float] = {
    np.float32: 64 * float(np.finfo(np.float32).eps), np.float64: 64 * float(np.finfo(np.float64).eps),
}


def sylvester(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    out: np.ndarray = h / np.sqrt(n)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64, 512, 2048])
def test_fwht_is_the_orthonormal_hadamard_matrix(n: int, dtype: Any) -> None:
    eye = np.eye(n, dtype=dtype)
    cols = np.stack([rht.fwht(eye[:, j].copy()) for j in range(n)], axis=1)
    h = sylvester(n)
    assert np.max(np.abs(cols - h)) <= TOL[dtype] / np.sqrt(n) * 4
    # orthonormal: H H^T = I
    assert np.max(np.abs(cols @ cols.T - np.eye(n))) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2**10, 2**16, 2**19])  # 2^19 takes the cache-blocked path
def test_fwht_self_inverse_and_matches_textbook(n: int, dtype: Any) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    y = rht.fwht(x.copy())
    ref = rht.fwht_textbook(x)
    scale = np.max(np.abs(ref))
    assert np.max(np.abs(y - ref)) <= TOL[dtype] * scale
    back = rht.fwht(y.copy())
    assert np.max(np.abs(back - x)) <= TOL[dtype] * np.max(np.abs(x))
    # norm preserved
    assert abs(np.linalg.norm(y.astype(np.float64)) / np.linalg.norm(x.astype(np.float64)) - 1) <= TOL[dtype]


def test_fwht_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        rht.fwht(np.zeros(12, np.float32))
    with pytest.raises(TypeError):
        rht.fwht(np.zeros(8, np.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rotations", [1, 2, 3])
def test_rotate_unrotate_exact(rotations: int, dtype: Any) -> None:
    x = np.random.default_rng(7).standard_normal(4096).astype(dtype)
    y = rht.rotate(x.copy(), seed=99, rotations=rotations)
    assert abs(np.linalg.norm(y) / np.linalg.norm(x) - 1) <= TOL[dtype]
    back = rht.unrotate(y.copy(), seed=99, rotations=rotations)
    assert np.max(np.abs(back - x)) <= TOL[dtype] * rotations * np.max(np.abs(x))
    other = rht.unrotate(y.copy(), seed=98, rotations=rotations)
    assert np.max(np.abs(other - x)) > 0.1  # the seed matters


def test_signs_are_pinned_and_independent_per_rotation() -> None:
    # Pinned: the decoder must regenerate exactly what any encoder produced (PCG64 raw stream).
    assert rht.sign_bits(123, 0, 32).tolist() == [
        1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    assert rht.sign_bits(123, 1, 32).tolist() == [
        1, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1]
    s = rht.signs(5, 0, 1 << 16, np.float32)
    assert set(np.unique(s).tolist()) == {-1.0, 1.0}
    # fair coin: mean of 65536 ±1 has sd 1/256; 6 sd bound
    assert abs(float(s.mean())) < 6 / 256


def test_next_pow2() -> None:
    got = [rht.next_pow2(n) for n in (0, 1, 2, 3, 4, 5, 1000, 1024, 1025)]
    assert got == [1, 1, 2, 4, 4, 8, 1024, 1024, 2048]


def test_participation_statistic() -> None:
    d = 1 << 14
    spike = np.zeros(d)
    spike[3] = -2.5
    assert rht.participation(spike) == pytest.approx(1.0)
    two = np.zeros(d)
    two[[1, 9]] = 1.0
    assert rht.participation(two) == pytest.approx(0.5)
    assert rht.participation(np.ones(d)) == pytest.approx(1 / d)
    g = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    # Gaussian: E ~ 3/d; relative sd of the sample 4th moment ~ sqrt(96/d) = 8%: 5 sd
    assert rht.participation(g) * d == pytest.approx(3.0, rel=0.4)
    assert rht.participation(np.zeros(5)) == 0.0
    assert rht.participation(np.full(4, 1e30, np.float32)) == pytest.approx(0.25)  # no overflow


def test_kurtosis_after_one_rotation_is_three_minus_two_rho() -> None:
    """The identity behind the adaptive rule: after one RHT, coordinates have kurtosis 3 - 2 rho(x)."""
    x = np.zeros(1024)
    x[:4] = [3.0, 1.0, 1.0, 0.5]
    rho = rht.participation(x)
    ys = np.concatenate([rht.rotate(x.copy(), seed=s, rotations=1) for s in range(200)])
    kurt = float(np.mean(ys**4) / np.mean(ys**2) ** 2)
    # 204800 samples of a bounded variable: the sample kurtosis is within ~1% here (checked to 3%)
    assert kurt == pytest.approx(3 - 2 * rho, rel=0.03)
