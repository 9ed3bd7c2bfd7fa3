"""TurboQuant baselines (Zandieh et al., 2025) and the QJL sign sketch (Zandieh et al., 2024).

* TurboQuant_mse: rotate, quantize each coordinate with the Lloyd–Max codebook of N(0,1) at the fixed
  scale ||x|| / sqrt(D) (the scale EDEN optimises instead): `eden.quantize(..., mode="fixed")`.
* TurboQuant_prod at b bits: (b-1)-bit TurboQuant_mse, then a 1-bit QJL sketch of the residual
  r = y - y_mse: signs q = sign(G r) with G an m x D matrix of i.i.d. N(0,1) (m = D), and the unbiased
  estimator r_hat = sqrt(pi/2) ||r|| / m * G^T q. Since E[g sign(<g, r>)] = sqrt(2/pi) r / ||r|| for
  g ~ N(0, I), E[r_hat] = r, so E[y_hat] = y_mse + r = y. Its error is
  E||r_hat - r||^2 = (pi/2 (D - 2/pi) / m) ||r||^2 ~= (pi/2) ||r||^2 at m = D.
  (b = 1: no TurboQuant_mse stage, the QJL sketches y itself.)

The sketch runs in the rotated domain: G R is again an i.i.d. Gaussian matrix for an orthogonal R, so
this is the same estimator as sketching x. The dense D x D Gaussian fits in memory only for small D, so
the sketch is **block-dense**: the residual is cut into blocks of B = min(D, QJL_BLOCK) coordinates and
every block is sketched by the same dense B x B Gaussian G (fully dense when D <= QJL_BLOCK), with one
norm ||r_block|| per block on the wire. Each block's estimate is exactly the QJL estimator, hence
unbiased with error (pi/2)(B - 2/pi)/B ||r_block||^2; by linearity of expectation the total error is the
dense sketch's (pi/2 - 1/B) ||r||^2 — only the correlation between blocks differs. G is generated from
the seed by Box–Muller over PCG64 raw words (version-stable), never sent.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from .rht import STREAM_QJL, FloatArray

QJL_BLOCK = 2048
_TWO_PI = 2.0 * math.pi


def qjl_block(n: int) -> int:
    return min(n, QJL_BLOCK)


def gaussian_matrix(seed: int, rows: int, cols: int, dtype: np.dtype[np.floating]) -> FloatArray:
    """rows x cols i.i.d. N(0,1) by Box–Muller from PCG64(SeedSequence((seed, STREAM_QJL, 0))).random_raw."""
    count = rows * cols
    half = (count + 1) // 2
    bg = np.random.PCG64(np.random.SeedSequence((int(seed), STREAM_QJL, 0)))
    raw = bg.random_raw(2 * half)
    u = (raw >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0**53)  # [0, 1)
    u1 = 1.0 - u[:half]  # (0, 1]
    radius = np.sqrt(-2.0 * np.log(u1))
    angle = u[half:] * _TWO_PI
    g = np.empty(2 * half, np.float64)
    g[:half] = radius * np.cos(angle)
    g[half:] = radius * np.sin(angle)
    return g[:count].reshape(rows, cols).astype(dtype, copy=False)


def qjl_encode(r: FloatArray, seed: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float64]]:
    """Sign bits (1 = non-negative projection) of the block sketch of r, and the block norms."""
    n = r.size
    b = qjl_block(n)
    g = gaussian_matrix(seed, b, b, r.dtype)
    blocks = r.reshape(n // b, b)
    proj = blocks @ g.T
    bits = (proj >= 0).ravel().view(np.uint8)
    norms = np.sqrt(np.einsum("ij,ij->i", blocks, blocks, dtype=np.float64))
    return bits, norms


def qjl_decode(
    bits: npt.NDArray[np.uint8], norms: npt.NDArray[np.float64], seed: int, n: int,
    dtype: np.dtype[np.floating],
) -> FloatArray:
    """r_hat = sqrt(pi/2) ||r_block|| / B * G^T sign, block by block."""
    b = qjl_block(n)
    g = gaussian_matrix(seed, b, b, dtype)
    q = np.array([-1.0, 1.0], dtype=dtype).take(bits).reshape(n // b, b)
    est = q @ g
    est *= (norms * (math.sqrt(math.pi / 2.0) / b)).astype(dtype)[:, None]
    return est.ravel()
