"""Run-time choice of the number of RHT rotations from an O(d) moment statistic (docs/quant.md §3).

After one RHT with random signs, y_i = sum_j H_ij s_j x_j / sqrt(D) is a Rademacher sum whose
kurtosis is exactly 3 - 2 rho(x), rho(x) = sum x^4 / (sum x^2)^2. A first-order Edgeworth expansion of
the coordinate density, f = phi (1 + kappa/24 He4), with excess kurtosis kappa = -2 rho, moves the
vNMSE of a Lloyd–Max quantizer by

    delta vNMSE / vNMSE_theory = -rho * gamma_b / (12 D_b),   gamma_b = E_phi[(Z - Q_b(Z))^2 He4(Z)]

(the same relative shift for the biased and the unbiased scale). So one rotation is within a relative
`EPSILON` of theory when rho <= rho*_b = 12 EPSILON D_b / gamma_b. gamma_b / D_b is computed by
quadrature; it rises from 3.5 (b = 1) to 12 (high resolution), so rho*_b is between 0.034 and 0.0101 at
EPSILON = 1%. A second rotation cannot do better than the rho of a rotated vector, about 3/D, so it is
used only when it at least halves the deviation: rule (a), two rotations iff rho(x) > max(rho*_b, 6/D).

The expansion assumes a smooth coordinate density. Inputs whose non-zero entries have equal magnitudes
(K equal spikes, sign vectors) rotate into a *lattice* of spacing 2/sqrt(K) in z units, which aliases
with the quantizer cells at small rho too (measured in docs/quant.md). Rule (b) catches those after the
first rotation, in O(D) from numbers the quantizer computes anyway: the realized error of the indices,
fit = 1 - <y,c>^2 / (||y||^2 ||c||^2), must be within max(EPSILON D_b, Z_SIGMA sd) of D_b, where sd is
the standard deviation of the mean of D i.i.d. (Z - Q(Z))^2 (so a Gaussian input fails it with
probability ~1e-6); otherwise one more rotation is applied and the vector quantized again.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .eden import split
from .lloydmax import codebook, distortion
from .rht import FloatArray, participation

EPSILON = 0.01
Z_SIGMA = 5.0


@cache
def gamma_ratio(bits: int) -> float:
    """gamma_b / D_b by trapezoid quadrature of the N(0,1) density on [-12, 12]."""
    cb = codebook(bits)
    z = np.linspace(-12.0, 12.0, 240_001)
    phi = np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)
    q = cb.centroids[np.searchsorted(cb.boundaries, z)]
    err = (z - q) ** 2 * phi
    he4 = z**4 - 6.0 * z**2 + 3.0
    return float(np.trapezoid(err * he4, z) / np.trapezoid(err, z))


def rho_threshold(bits: int) -> float:
    """rho*_b: the largest rho(x) for which one rotation stays within EPSILON of theory."""
    return 12.0 * EPSILON / gamma_ratio(bits)


def widths(bits: float, scheme: str) -> list[int]:
    """Bit widths a scheme uses at a budget (those whose threshold matters)."""
    if bits < 1:
        return [1]
    lo = int(np.floor(bits))
    out = [lo] if bits == lo else [lo, lo + 1]
    if scheme == "turboquant-prod":
        out = [max(1, lo - 1), 1]
    return sorted({min(max(w, 1), 8) for w in out})


def choose_rotations(x: FloatArray, bits: float, scheme: str, padded: int) -> tuple[int, float]:
    """(rotations, rho): 2 if rho(x) > max(min_b rho*_b, 6 / D), else 1."""
    rho = participation(x)
    limit = max(min(rho_threshold(w) for w in widths(bits, scheme)), 6.0 / max(padded, 1))
    return (2 if rho > limit else 1), rho


@cache
def error_moments(bits: int) -> tuple[float, float]:
    """(E[e^2], E[e^4]) of the quantization error e = Z - Q_b(Z), Z ~ N(0,1); b = 0 means e = Z."""
    if bits == 0:
        return 1.0, 3.0
    cb = codebook(bits)
    z = np.linspace(-12.0, 12.0, 240_001)
    phi = np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)
    e2 = (z - cb.centroids[np.searchsorted(cb.boundaries, z)]) ** 2
    return float(np.trapezoid(e2 * phi, z)), float(np.trapezoid(e2 * e2 * phi, z))


def fit_tolerance(bits: float, n: int) -> float:
    """Allowed |fit - D_b| after one rotation of an n-coordinate vector (rule (b))."""
    sp = split(bits)
    lo2, lo4 = error_moments(sp.lo)
    hi2, hi4 = error_moments(sp.hi)
    w = sp.p
    m2 = (1 - w) * lo2 + w * hi2
    m4 = (1 - w) * lo4 + w * hi4
    sd = float(np.sqrt(max(m4 - m2 * m2, 0.0) / max(n, 1)))
    return max(EPSILON * distortion(bits), Z_SIGMA * sd)


def fits_theory(fit: float, bits: float, n: int) -> bool:
    """Rule (b): does the realized error after one rotation match the Gaussian theory?"""
    return abs(fit - distortion(bits)) <= fit_tolerance(bits, n)
