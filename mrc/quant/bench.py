"""Measurement helpers behind `mrcctl quant bench`: input distributions, asymptotic theory, vNMSE with its
standard error, wire size, encode/decode throughput, and distributed mean estimation (n clients)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from . import codec
from .lloydmax import distortion
from .rht import next_pow2
from .turboquant import qjl_block

DISTS = ("gauss", "lognormal", "spike", "two-spikes")
SCHEMES = tuple(codec.SCHEMES)


def sample(dist: str, d: int, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """One float32 test vector: i.i.d. N(0,1); i.i.d. LogNormal(0,1) (heavy right tail, non-zero mean);
    one unit spike at a random position; two unit spikes at two random positions."""
    if dist == "gauss":
        return rng.standard_normal(d, dtype=np.float32)
    if dist == "lognormal":
        return np.exp(rng.standard_normal(d)).astype(np.float32)
    if dist in ("spike", "two-spikes"):
        x = np.zeros(d, np.float32)
        k = 1 if dist == "spike" or d < 2 else 2
        x[rng.choice(d, size=k, replace=False)] = 1.0
        return x
    raise ValueError(f"unknown distribution {dist!r} (known: {', '.join(DISTS)})")


def theory(scheme: str, bits: float) -> float | None:
    """Asymptotic vNMSE (D -> inf, coordinates ~ N(0,1) after rotation), from the Lloyd–Max distortion:
    biased/TurboQuant_mse -> D_b; unbiased/DRIVE -> D_b / (1 - D_b); TurboQuant_prod -> (pi/2) D_{b-1}
    (D_0 = 1: the QJL sketches the whole vector). None where the scheme does not take this budget, or
    where the bound is unbounded (an unbiased scheme at a budget so small that D_b rounds to 1)."""
    try:
        codec.check_bits(scheme, bits)
    except codec.CodecError:
        return None
    if scheme in ("eden-biased", "turboquant-mse"):
        return distortion(bits)
    if scheme in ("eden-unbiased", "drive"):
        db = distortion(bits)
        # below ~1e-16 bits D_b rounds to 1: the unbiased bound is unbounded, no number to compare with
        return db / (1.0 - db) if db < 1.0 else None
    prev = distortion(bits - 1) if bits > 1 else 1.0
    return math.pi / 2.0 * prev


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    se = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan
    return float(a.mean()), se


def _nan_to_none(v: float) -> float | None:
    return None if not math.isfinite(v) else v


def _mbps(dim: int, seconds: list[float]) -> float | None:
    """MB/s of float32 input (4 bytes per coordinate) at the median time of one call — robust to the
    odd slow call on a shared machine."""
    t = float(np.median(seconds))
    return 4.0 * dim / t / 1e6 if t > 0 else None


def run(
    schemes: Sequence[str], bits: Sequence[float], dim: int, trials: int, dist: str = "gauss",
    rotations: int | str = "auto", clients: int | None = None, seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per valid (scheme, bits); trials draw fresh inputs and fresh codec seeds (deterministic
    from `seed`). With `clients`, each trial is a mean-estimation round of that many independent
    vectors and codec seeds, reporting NMSE = ||mean(x_hat) - mean(x)||^2 / mean(||x_i||^2).
    Encode/decode MB/s: float32 input bytes over the median time of one call."""
    if dim < 1 or trials < 1:
        raise ValueError("dim and trials must be >= 1")
    if dist not in DISTS:
        raise ValueError(f"unknown distribution {dist!r} (known: {', '.join(DISTS)})")
    combos = [(s, b) for s in schemes for b in bits if theory(s, b) is not None]
    rows: list[dict[str, Any]] = []
    n_clients = clients or 1
    started = time.monotonic()
    for k, (scheme, b) in enumerate(combos):
        if progress is not None:
            elapsed = time.monotonic() - started
            progress(f"quant bench: {scheme} b={b:g} ({k + 1}/{len(combos)}, {elapsed:.0f}s)")
        rng = np.random.default_rng((seed, k))
        # warm-up (codebook/threshold caches, first-touch allocations): not timed, not counted
        codec.decode(codec.encode(sample(dist, dim, rng), scheme, b, seed=0, rotations=rotations))
        vn: list[float] = []
        mean_err: list[float] = []
        t_enc: list[float] = []
        t_dec: list[float] = []
        wire = 0
        used: set[int] = set()
        for _ in range(trials):
            # client by client: the memory of one vector and two float64 sums, whatever `clients` is
            # (keeping every client's vector took clients x dim x 12 bytes: 26 GB at the CLI's limits)
            acc = np.zeros(dim, np.float64)
            sum_x = np.zeros(dim, np.float64) if clients else None
            energy = 0.0
            for _c in range(n_clients):
                x = sample(dist, dim, rng)
                s = int(rng.integers(0, 2**63))
                t0 = time.perf_counter()
                buf = codec.encode(x, scheme, b, seed=s, rotations=rotations)
                t1 = time.perf_counter()
                xh = codec.decode(buf)
                t2 = time.perf_counter()
                t_enc.append(t1 - t0)
                t_dec.append(t2 - t1)
                wire = len(buf)
                used.add(codec.parse(buf).rotations)
                x64 = x.astype(np.float64)
                nx = float(np.dot(x64, x64))
                err = float(np.sum((x64 - xh) ** 2))
                vn.append(err / nx if nx > 0 else 0.0)
                acc += xh
                energy += nx
                if sum_x is not None:
                    sum_x += x64
            if sum_x is not None:
                denom = energy / n_clients
                mean_err.append(float(np.sum(((acc - sum_x) / n_clients) ** 2)) / denom)
        vnmse, se = _mean_se(vn)
        th = theory(scheme, b)
        row: dict[str, Any] = {
            "scheme": scheme,
            "bits": b,
            "dim": dim,
            "dist": dist,
            "rotations": rotations,
            "rotations_used": sorted(used)[0] if len(used) == 1 else sorted(used),
            "vnmse": vnmse,
            "vnmse_stderr": _nan_to_none(se),
            "theory": th,
            "wire_bytes": wire,
            "bits_per_coord": 8.0 * wire / dim,
            "encode_mbps": _mbps(dim, t_enc),
            "decode_mbps": _mbps(dim, t_dec),
        }
        if scheme == "turboquant-prod":
            padded = next_pow2(dim)
            block = qjl_block(padded)
            row["sketch"] = "dense" if block == padded else f"block-dense B={block}"
        if clients:
            m, mse = _mean_se(mean_err)
            row["clients"] = clients
            row["mean_nmse"] = m
            row["mean_nmse_stderr"] = _nan_to_none(mse)
            unbiased = scheme in ("eden-unbiased", "drive", "turboquant-prod")
            row["mean_theory"] = th / clients if unbiased and th is not None else None
        rows.append(row)
    return rows
