"""The Lloyd–Max codebooks of N(0,1) are computed, not typed in: check them against the optimality
conditions with an independent quadrature (no erf), against Max (1960), and against Panter–Dite."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mrc.quant.lloydmax import MAX_BITS, codebook, distortion


def _cell_moments(lo: float, hi: float) -> tuple[float, float, float]:
    """(P, E[Z; cell], E[Z^2; cell]) for the cell (lo, hi) by Simpson on a grid inside the cell."""
    a, b = max(lo, -10.0), min(hi, 10.0)
    z = np.linspace(a, b, 20_001)
    phi = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    h = (b - a) / 20_000

    def simpson(f: np.ndarray) -> float:
        return float(h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))

    return simpson(phi), simpson(z * phi), simpson(z * z * phi)


@pytest.mark.parametrize("bits", range(1, MAX_BITS + 1))
def test_codebook_satisfies_lloyd_max_conditions(bits: int) -> None:
    cb = codebook(bits)
    c, t = cb.centroids, cb.boundaries
    assert c.size == 2**bits and t.size == 2**bits - 1
    assert np.all(np.diff(c) > 0)
    np.testing.assert_allclose(c, -c[::-1], atol=1e-14)  # symmetric
    np.testing.assert_allclose(t, (c[:-1] + c[1:]) / 2, atol=1e-14)  # nearest-neighbour condition
    edges = np.concatenate(([-np.inf], t, [np.inf]))
    # centroid condition, checked on the positive half (symmetry) by quadrature; the distortion is
    # integrated cell by cell (the integrand jumps at the boundaries)
    dist = 0.0
    for k in range(2 ** (bits - 1), 2**bits):
        p, m1, m2 = _cell_moments(edges[k], edges[k + 1])
        assert p == pytest.approx(cb.probabilities[k], rel=1e-8, abs=1e-14)
        assert m1 / p == pytest.approx(c[k], rel=1e-7)
        dist += 2 * (m2 - 2 * c[k] * m1 + c[k] ** 2 * p)
    assert cb.probabilities.sum() == pytest.approx(1.0, abs=1e-12)
    assert dist == pytest.approx(cb.distortion, rel=1e-7)


def test_known_values() -> None:
    # b = 1 in closed form: centroids ±sqrt(2/pi), D_1 = 1 - 2/pi
    assert codebook(1).centroids[1] == pytest.approx(math.sqrt(2 / math.pi), rel=1e-14)
    assert codebook(1).distortion == pytest.approx(1 - 2 / math.pi, rel=1e-12)
    # Max (1960), Table I (mean squared error of the optimum 2/4/8/16-level Gaussian quantizers),
    # published to 4 digits; Max's 16-level figure 0.009497 is low by 4e-4 relative (hand-era
    # computation) — the quadrature test above is the exact check.
    for bits, published, rel in ((2, 0.1175, 2e-4), (3, 0.03455, 2e-4), (4, 0.009497, 6e-4)):
        assert codebook(bits).distortion == pytest.approx(published, rel=rel)
    assert codebook(2).centroids[2:] == pytest.approx([0.4528, 1.510], abs=1e-3)


def test_high_resolution_limit() -> None:
    # Panter–Dite: D_b 4^b -> pi sqrt(3) / 2 = 2.7207; within 1% at b = 8, and approaching monotonically
    ratios = [codebook(b).distortion * 4**b for b in range(3, MAX_BITS + 1)]
    assert all(np.diff(ratios) > 0)
    assert ratios[-1] == pytest.approx(math.pi * math.sqrt(3) / 2, rel=0.01)


def _distortion_of(c: np.ndarray) -> float:
    """E[(Z - Q(Z))^2] for centroids c with nearest-neighbour cells, by cell-wise quadrature."""
    edges = np.concatenate(([-np.inf], (c[:-1] + c[1:]) / 2, [np.inf]))
    total = 0.0
    for k in range(c.size):
        p, m1, m2 = _cell_moments(edges[k], edges[k + 1])
        total += m2 - 2 * c[k] * m1 + c[k] ** 2 * p
    return total


def test_local_optimality() -> None:
    """Moving any centroid of the 3-bit codebook (cells follow, nearest neighbour) raises D; the
    increase is second order (~p_k eps^2 = 1e-7 here), far above the quadrature error (~1e-12)."""
    cb = codebook(3)
    base = _distortion_of(cb.centroids)
    assert base == pytest.approx(cb.distortion, rel=1e-9)
    for k in range(8):
        for eps in (-1e-3, 1e-3):
            c = cb.centroids.copy()
            c[k] += eps
            assert _distortion_of(c) - base > 1e-9


def test_fractional_and_sparse_distortion() -> None:
    assert distortion(2.5) == pytest.approx((codebook(2).distortion + codebook(3).distortion) / 2)
    assert distortion(0.5) == pytest.approx(1 - 0.5 * (1 - codebook(1).distortion))
    with pytest.raises(ValueError):
        distortion(0)
    with pytest.raises(ValueError):
        codebook(9)
