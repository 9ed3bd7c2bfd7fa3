"""Bit budgets per hop for the partial-sum-aware strategy (docs/collective.md §3).

In a ring of n ranks a chunk is quantized n times: at reduce-scatter hop k = 1..n-1 it holds the partial
sum of k contributions and is sent once; after the last hop its owner quantizes the full sum (n
contributions) once more and that frame is forwarded n-1 times in the all-gather. With independent
unbiased errors, hop k adds E||e_k||^2 = v(b_k) E||P_k||^2 and E||P_k||^2 = w_k ||x||^2 (w_k = k for
uncorrelated contributions of equal energy). The naive strategy spends b bits at every hop:

    error = v(b) * (1 + 2 + ... + (n-1) + n),      wire = 2 (n-1) b   (per coordinate of a chunk)

The aware strategy spends the same wire bits, sum_k m_k b_k = 2 (n-1) b with m_k = 1 (k < n) and
m_n = n - 1, where they buy the most error: it minimises sum_k w_k v(b_k) (w_k = k + rho k (k - 1) when
the ranks' buffers have pairwise correlation rho, a parameter of the strategy), v from mrc.quant's theory
(convex in b), greedily in steps of `STEP` bits (optimal for a separable convex objective). Budgets grow
with the number of summed contributions (about b_k = beta + log2(k) / 2); the all-gather frame, which is
paid n-1 times, gets about as many bits as the first hop.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from mrc.quant.bench import theory

STEP = 1.0 / 16.0
MIN_BITS = 0.25
MAX_BITS = 8.0


def _v(scheme: str, b: float) -> float:
    t = theory(scheme, b)
    if t is None:
        raise ValueError(f"{scheme} does not take {b} bits")
    return t


def weights(n: int, correlation: float = 0.0) -> list[float]:
    """E||P_k||^2 / ||x||^2 for k = 1..n contributions of equal energy with pairwise correlation rho:
    k + rho k (k - 1) (k for independent gradients, k^2 for identical ones)."""
    return [k + correlation * k * (k - 1) for k in range(1, n + 1)]


@lru_cache(maxsize=256)
def aware_bits(scheme: str, bits: float, n: int, correlation: float = 0.0) -> tuple[float, ...]:
    """(b_1, ..., b_{n-1}, b_n): reduce-scatter hops then the all-gather frame. Never spends more nominal
    wire bits than the naive schedule (a fractional budget sends a seeded-random count of high-bit
    coordinates, so the bytes actually sent differ by a few per frame either way). Schemes with an
    integer budget (TurboQuant) move in whole bits; drive stays at 1 bit. `correlation`: the assumed
    pairwise correlation of the ranks' buffers (0: independent)."""
    if n < 2:
        return (bits,)
    w = weights(n, correlation)
    costs = [1.0] * (n - 1) + [float(n - 1)]
    total = 2.0 * (n - 1) * bits
    if scheme == "drive":
        return tuple([1.0] * n)
    b = allocate(scheme, w, costs, total, min(MIN_BITS, bits))
    return tuple(round(x, 6) for x in b)


def allocate(scheme: str, w: list[float], costs: list[float], total: float, floor: float) -> list[float]:
    """Bits b_i (multiples of STEP, or whole bits for TurboQuant, each >= `floor` and <= MAX_BITS) that
    minimise sum_i w_i v(b_i) subject to sum_i costs_i b_i <= total: greedy marginal gain per wire bit,
    optimal for a separable convex objective. If even the floor costs more than `total`, the floor."""
    integer = scheme.startswith("turboquant")
    step = 1.0 if integer else STEP
    lo = 1.0 if integer else floor
    b = [lo] * len(w)
    spent = sum(c * lo for c in costs)

    def gain(i: int) -> float:
        nb = b[i] + step
        if nb > MAX_BITS + 1e-12:
            return -1.0
        return w[i] * (_v(scheme, b[i]) - _v(scheme, nb)) / (costs[i] * step)

    heap = [(-gain(i), i) for i in range(len(w))]
    heapq.heapify(heap)
    while heap:
        g, i = heapq.heappop(heap)
        if -g <= 0.0:
            break
        if spent + costs[i] * step > total + 1e-9:
            continue  # cannot afford this hop any more; cheaper hops may still fit
        b[i] += step
        spent += costs[i] * step
        heapq.heappush(heap, (-gain(i), i))
    return b


def measured_bits(scheme: str, bits: float, n: int, k: int, spent: float, w_now: float,
                  correlation: float) -> float:
    """The bit width of hop k (k = 2..n contributions; k = n is the all-gather frame) of the `measured`
    strategy: what is left of the naive budget 2 (n-1) bits after the `spent` nominal bits of hops
    1..k-1, allocated as `allocate` does over hops k..n, with hop k's weight `w_now` the measured energy
    of the partial sum it quantizes (in units of the mean contribution's energy) and the later hops'
    weights the model's for the correlation estimated so far. Because every hop spends from the same
    remainder and the last takes what is left, the chain's nominal bits equal naive's (to a STEP)."""
    if scheme == "drive":
        return 1.0
    w = [w_now, *weights(n, correlation)[k:]]
    costs = [1.0] * (n - k) + [float(n - 1)]
    left = 2.0 * (n - 1) * bits - spent
    return round(allocate(scheme, w, costs, left, min(MIN_BITS, bits))[0], 6)


def model_error(scheme: str, bits_per_hop: tuple[float, ...], correlation: float = 0.0) -> float:
    """Modelled E||sum_hat - sum||^2 / ||x||^2 for n contributions of equal energy and pairwise
    correlation rho. Hop k quantizes the partial sum plus the error carried so far (independent of it,
    unbiased scheme), so E_k = E_{k-1} + v(b_k) (w_k + E_{k-1})."""
    err = 0.0
    for wk, bk in zip(weights(len(bits_per_hop), correlation), bits_per_hop, strict=True):
        err += _v(scheme, bk) * (wk + err)
    return err
