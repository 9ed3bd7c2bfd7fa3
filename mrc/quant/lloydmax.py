"""Lloyd–Max scalar quantizers for the standard normal N(0, 1), computed here (not typed in).

A b-bit quantizer has K = 2**b centroids c_1 < ... < c_K and boundaries t_k = (c_k + c_{k+1}) / 2.
Lloyd–Max optimality is the pair of conditions

* nearest neighbour: each boundary is the midpoint of its two centroids;
* centroid: c_k = E[Z | t_{k-1} < Z < t_k] = (phi(t_{k-1}) - phi(t_k)) / (Phi(t_k) - Phi(t_{k-1})).

Lloyd's algorithm alternates the two; for a log-concave density (the normal is one) the fixed point is
unique (Fleischer 1964), so iteration from any start converges to the optimum. The codebook is symmetric,
so only the positive half is iterated (t_0 = 0 for an even K). Cell probabilities use `math.erfc` from the
standard library (exact to double precision, also far in the tail); there is no scipy dependency.

The distortion is D_b = E[(Z - Q(Z))^2] = 1 - E[Q(Z)^2] (the centroid condition makes the error orthogonal
to Q(Z)). D_1 = 1 - 2/pi; D_b ~ (pi*sqrt(3)/2) 4^-b at high resolution (Panter–Dite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt

MAX_BITS = 8
_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@dataclass(frozen=True)
class Codebook:
    """A Lloyd–Max quantizer of N(0,1): `centroids` (K, ascending), `boundaries` (K-1 inner cell edges),
    `probabilities` (K cell masses) and `distortion` D_b = E[(Z - Q(Z))^2]."""

    bits: int
    centroids: npt.NDArray[np.float64]
    boundaries: npt.NDArray[np.float64]
    probabilities: npt.NDArray[np.float64]
    distortion: float
    iterations: int


def _upper_tail(t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """P(Z > t) for t >= 0 (inf allowed), accurate in the tail."""
    return np.array([0.5 * math.erfc(v / _SQRT2) for v in t.tolist()], dtype=np.float64)


def _phi(t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    with np.errstate(over="ignore"):
        return np.exp(-0.5 * t * t) * _INV_SQRT_2PI


def _half_cells(c: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Edges 0 = t_0 < ... < t_h = inf of the positive half, and the centroid update for them."""
    t = np.concatenate(([0.0], 0.5 * (c[:-1] + c[1:]), [math.inf]))
    tail = _upper_tail(t)
    p = tail[:-1] - tail[1:]
    phi = _phi(t)
    return t, (phi[:-1] - phi[1:]) / p


def _initial(h: int) -> npt.NDArray[np.float64]:
    """Panter–Dite start: levels uniform in the companded domain of density^(1/3), i.e. at quantiles of
    N(0, 3) — already close to the optimum, which shortens Lloyd's slow linear convergence."""
    u = (np.arange(h, dtype=np.float64) + 0.5) / h  # quantile levels of |N(0,3)|
    out = np.empty(h)
    for i, q in enumerate(u.tolist()):
        lo, hi = 0.0, 40.0
        for _ in range(200):  # bisection on erf(x / sqrt(2)) = q for the half-normal quantile
            mid = 0.5 * (lo + hi)
            if math.erf(mid / _SQRT2) < q:
                lo = mid
            else:
                hi = mid
        out[i] = math.sqrt(3.0) * 0.5 * (lo + hi)
    return out


@cache
def codebook(bits: int) -> Codebook:
    """The b-bit Lloyd–Max codebook of N(0,1), computed on first use and cached for the process.

    Iterates until the estimated distance to the fixed point, step * rate / (1 - rate) with the
    contraction rate measured from successive steps, is below 1e-12."""
    if not isinstance(bits, int) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"Lloyd–Max codebooks exist for 1..{MAX_BITS} bits, not {bits!r}")
    h = 1 << (bits - 1)
    c = _initial(h)
    prev_step = math.inf
    it = 0
    for it in range(1, 2_000_000):  # noqa: B007 - the count is reported
        _, new = _half_cells(c)
        step = float(np.max(np.abs(new - c)))
        c = new
        if step == 0.0:
            break
        rate = min(step / prev_step, 0.999999) if math.isfinite(prev_step) else 0.5
        prev_step = step
        if step * rate / (1.0 - rate) < 1e-12:
            break
    t, _ = _half_cells(c)
    tail = _upper_tail(t)
    p_half = tail[:-1] - tail[1:]
    centroids = np.concatenate((-c[::-1], c))
    inner = 0.5 * (centroids[:-1] + centroids[1:])
    probabilities = np.concatenate((p_half[::-1], p_half))
    distortion = 1.0 - float(np.sum(probabilities * centroids * centroids))
    for a in (centroids, inner, probabilities):
        a.setflags(write=False)
    return Codebook(bits, centroids, inner, probabilities, distortion, it)


def distortion(bits: float) -> float:
    """D_b of the Lloyd–Max quantizer; for a fractional budget the mixture EDEN uses (a fraction
    frac(b) of coordinates with ceil(b) bits, the rest with floor(b)); for b < 1, random sparsification
    keeping a fraction b with 1 bit: E[(Z - Q(Z))^2] over all coordinates = 1 - b (1 - D_1)."""
    if not 0 < bits <= MAX_BITS:
        raise ValueError(f"bit budget must be in (0, {MAX_BITS}], got {bits}")
    if bits < 1:
        return 1.0 - bits * (1.0 - codebook(1).distortion)
    lo = math.floor(bits)
    frac = bits - lo
    if frac == 0:
        return codebook(lo).distortion
    return (1 - frac) * codebook(lo).distortion + frac * codebook(lo + 1).distortion


CLIP_RANGE = 4.0


@cache
def error_clip(bits: int) -> float:
    """L_b = max of (z - Q_b(z))^2 over |z| <= CLIP_RANGE (b = 0: no quantizer, e = z): the level at
    which the adaptive check clips per-coordinate squared errors, so that the rare far-tail samples
    (P(|Z| > 4) = 6e-5) cannot dominate its mean — which makes it a bounded variable (Bernstein)."""
    if bits == 0:
        return CLIP_RANGE * CLIP_RANGE
    cb = codebook(bits)
    z = np.concatenate((cb.boundaries[np.abs(cb.boundaries) <= CLIP_RANGE], [-CLIP_RANGE, CLIP_RANGE]))
    q = cb.centroids[np.searchsorted(cb.boundaries, z)]
    # the error in a cell is largest at its edges: boundaries (ties go down) and the range ends
    return float(np.max((z - q) ** 2))
