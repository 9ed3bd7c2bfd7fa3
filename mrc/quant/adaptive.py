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
first rotation, in O(D) from numbers the quantizer computes anyway: the realized mean of the clipped
squared errors min((z_i - c_i)^2, L_b) (L_b = the largest error over |z| <= 4) must be within a
Bernstein bound at DELTA = 1e-6 (and at least EPSILON relative) of its Gaussian expectation; otherwise
one more rotation is applied and the vector quantized again. Clipping makes the statistic bounded:
unclipped, rare far-tail samples give it a heavy right tail at high b (z-scores of 8 in 300 trials).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from .eden import split
from .lloydmax import codebook, error_clip
from .rht import FloatArray, participation

EPSILON = 0.01
DELTA = 1e-6


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


def choose_rotations(
    x: FloatArray, bits: float, scheme: str, padded: int, rho: float | None = None,
) -> tuple[int, float]:
    """(rotations, rho): 2 if rho(x) > max(min_b rho*_b, 6 / D), else 1 (`rho`: rho(x) if the caller
    computed it, e.g. with the numba kernel)."""
    if rho is None:
        rho = participation(x)
    limit = max(min(rho_threshold(w) for w in widths(bits, scheme)), 6.0 / max(padded, 1))
    return (2 if rho > limit else 1), rho


@cache
def clipped_moments(bits: int) -> tuple[float, float]:
    """(mu, m2) = (E[min(e^2, L_b)], E[min(e^2, L_b)^2]) for e = Z - Q_b(Z), Z ~ N(0,1) (b = 0: e = Z),
    by trapezoid quadrature on [-12, 12]."""
    z = np.linspace(-12.0, 12.0, 480_001)
    phi = np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)
    if bits == 0:
        e2 = z * z
    else:
        cb = codebook(bits)
        e2 = (z - cb.centroids[np.searchsorted(cb.boundaries, z)]) ** 2
    v = np.minimum(e2, error_clip(bits))
    return float(np.trapezoid(v * phi, z)), float(np.trapezoid(v * v * phi, z))


def check_tolerance(bits: float, n: int) -> tuple[float, float]:
    """(expected check value, allowed deviation) for rule (b) on n coordinates.

    Per coordinate the clipped error lies in [0, L] with variance s^2 (group mixture for fractional and
    sparse budgets). Bernstein: P(|mean - mu| >= t) <= 2 exp(-n t^2 / (2 s^2 + 2 L t / 3)); t solves
    that at DELTA. Coordinates after one rotation are not independent, so this is a calibrated
    heuristic, not a proof; measured false alarms on Gaussian inputs: none in 10^4 (docs/quant.md)."""
    sp = split(bits)
    w = sp.p if sp.masked else 0.0
    groups = [(1.0 - w, sp.lo), (w, sp.hi)] if sp.masked else [(1.0, sp.lo)]
    mu = sum(p * clipped_moments(b)[0] for p, b in groups)
    m2 = sum(p * clipped_moments(b)[1] for p, b in groups)
    var = max(m2 - mu * mu, 0.0)
    lim = max(error_clip(b) for _, b in groups)
    lg = float(np.log(2.0 / DELTA))
    n = max(n, 1)
    a = 2.0 * lim * lg / 3.0
    t = (a + float(np.sqrt(a * a + 8.0 * n * var * lg))) / (2.0 * n)
    return mu, max(t, EPSILON * mu)


def fits_theory(check: float, bits: float, n: int) -> bool:
    """Rule (b): is the realized clipped error after one rotation what Gaussian coordinates give?"""
    mu, tol = check_tolerance(bits, n)
    return abs(check - mu) <= tol
