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
used only when it at least halves the deviation: two rotations iff rho(x) > max(rho*_b, 6/D).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .lloydmax import codebook
from .rht import FloatArray, participation

EPSILON = 0.01


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
