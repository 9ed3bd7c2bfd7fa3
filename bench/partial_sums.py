#!/usr/bin/env python3
"""Partial-sum handling of the compressed ring, measured against today's `aware` on the same inputs and
seeds (docs/collective.md, "Partial sums: grouped scales, data-driven bits, hierarchy").

Usage: ``python bench/partial_sums.py [--ranks 4,16] [--bits 2,4] [--dists iid,correlated,digits]
[--dim D] [--trials T] [--only grouped,measured,hier] [-j]``

Inputs per trial t (the same for every option): `iid` N(0, I) per rank, `correlated` (pairwise
correlation 0.5; mrc.collective.bench.make_inputs), `digits`: the per-rank gradients of a 64-1024-10
ReLU MLP on scikit-learn's digits at a seeded initialisation, each rank on its own batch of 32 (numpy
backprop, no torch). Unbiased EDEN throughout. For each row: vNMSE of the all-reduced mean against the
exact float64 mean (mean ± standard error over trials), the paired ratio to the baseline, and the
bytes all ranks put on the wire.

  grouped   aware (one scale per segment) vs aware with one scale per 2^12 / 2^14 rotated coordinates
            (codec version-2 frames, 8 bytes per scale, counted).
  measured  aware at correlation 0 (the default), aware at the inputs' true correlation (an oracle),
            and `measured` (bits from the data, the same nominal budget).
  hier      hosts x ranks (16 = 4 x 4 and 2 x 8): the flat aware ring over all ranks vs the hierarchy
            (raw float32, or 8-bit EDEN, within a host; aware ring between hosts). Inter-host bytes of
            the flat ring: what the last rank of each host sends (the ring's host-crossing links).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from mrc.collective import Config, Result, Transport, allreduce, run_inproc, vnmse
from mrc.collective.bench import exact_mean, make_inputs
from mrc.collective.hier import simulate

F32 = npt.NDArray[np.float32]
SCHEME = "eden-unbiased"
RHO = {"iid": 0.0, "correlated": 0.5}
HIDDEN = 1024
Option = Callable[[list[F32], int, float], tuple[float, float, float]]


def digits_grads(n: int, trial: int) -> list[F32]:
    """Per-rank gradients (flattened W1, b1, W2, b2) of the cross-entropy of a 64-HIDDEN-10 MLP at a
    He initialisation seeded by `trial`, rank r on its own batch of 32 digits images."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    rng = np.random.default_rng((19, trial))
    w1 = rng.standard_normal((64, HIDDEN)) * math.sqrt(2 / 64)
    w2 = rng.standard_normal((HIDDEN, 10)) * math.sqrt(2 / HIDDEN)
    b1, b2 = np.zeros(HIDDEN), np.zeros(10)
    out = []
    for _ in range(n):
        idx = rng.choice(len(x), 32, replace=False)
        xb, yb = x[idx], y[idx]
        h = np.maximum(xb @ w1 + b1, 0.0)
        z = h @ w2 + b2
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(32), yb] -= 1.0
        dz = p / 32
        dh = (dz @ w2.T) * (h > 0)
        g = np.concatenate([(xb.T @ dh).ravel(), dh.sum(0), (h.T @ dz).ravel(), dz.sum(0)])
        out.append(g.astype(np.float32))
    return out


def inputs(dist: str, n: int, dim: int, trial: int) -> list[F32]:
    return digits_grads(n, trial) if dist == "digits" else make_inputs(n, dim, dist, trial, 0)


def correlation(xs: list[F32]) -> float:
    """The mean pairwise correlation <x_i, x_j> / mean ||x||^2 (the quantity aware's model assumes)."""
    s = np.sum(np.asarray(xs, np.float64), axis=0)
    e = float(sum(np.dot(v.astype(np.float64), v) for v in xs))
    n = len(xs)
    return max(0.0, (float(np.dot(s, s)) - e) / (e * (n - 1)))


def ring(xs: list[F32], cfg: Config) -> tuple[list[Result], float]:
    def body(t: Transport) -> Result:
        return allreduce(t, xs[t.rank], cfg, 0)

    res = run_inproc(len(xs), body, 600.0)
    return res, vnmse(res[0].out, exact_mean(xs))


def _stat(v: list[float]) -> tuple[float, float]:
    return statistics.fmean(v), (statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else math.nan)


def compare(dist: str, n: int, bits: float, dim: int, trials: int,
            options: dict[str, Option],
            ) -> list[dict[str, Any]]:
    """Run every option on the same trial inputs; the first option is the baseline of the ratios. An
    option returns (vNMSE, total wire bytes, inter-host bytes)."""
    acc: dict[str, dict[str, list[float]]] = {k: {"e": [], "b": [], "i": [], "r": []} for k in options}
    rhos = []
    for t in range(trials):
        xs = inputs(dist, n, dim, t)
        rho = correlation(xs)
        rhos.append(rho)
        base = None
        for name, fn in options.items():
            e, b, i = fn(xs, t, rho)
            base = e if base is None else base
            acc[name]["e"].append(e)
            acc[name]["b"].append(b)
            acc[name]["i"].append(i)
            acc[name]["r"].append(e / base if base > 0 else math.nan)
    rows = []
    for name, a in acc.items():
        m, se = _stat(a["e"])
        rm, rse = _stat(a["r"])
        rows.append({"dist": dist, "ranks": n, "bits": bits, "dim": len(xs[0]),
                     "trials": trials, "option": name, "vnmse": m, "stderr": se, "ratio": rm,
                     "ratio_stderr": rse, "wire_bytes": statistics.fmean(a["b"]),
                     "inter_host_bytes": statistics.fmean(a["i"]),
                     "measured_correlation": statistics.fmean(rhos)})
    return rows


def grouped_options(bits: float, dist: str) -> dict[str, Option]:
    def opt(group: int) -> Option:
        def run(xs: list[F32], t: int, rho: float) -> tuple[float, float, float]:
            cfg = Config(SCHEME, bits, "aware", seed=t, correlation=RHO.get(dist, 0.0), group=group)
            res, e = ring(xs, cfg)
            b = sum(r.wire_bytes for r in res)
            return e, b, b
        return run
    return {"aware": opt(0), "aware, group 2^12": opt(1 << 12), "aware, group 2^14": opt(1 << 14)}


def measured_options(bits: float, dist: str) -> dict[str, Option]:
    def opt(ps: str, oracle: bool) -> Option:
        def run(xs: list[F32], t: int, rho: float) -> tuple[float, float, float]:
            cfg = Config(SCHEME, bits, ps, seed=t, correlation=round(rho, 3) if oracle else 0.0)
            res, e = ring(xs, cfg)
            b = sum(r.wire_bytes for r in res)
            return e, b, b
        return run
    return {"aware (rho 0)": opt("aware", False), "aware (true rho)": opt("aware", True),
            "measured": opt("measured", False)}


def hier_options(bits: float, layout: tuple[int, int]) -> dict[str, Option]:
    hosts, per = layout

    def flat(xs: list[F32], t: int, rho: float) -> tuple[float, float, float]:
        res, e = ring(xs, Config(SCHEME, bits, "aware", seed=t, correlation=round(rho, 3)))
        inter = sum(res[h * per + per - 1].wire_bytes for h in range(hosts))
        return e, sum(r.wire_bytes for r in res), inter

    def hier(intra: str) -> Option:
        def run(xs: list[F32], t: int, rho: float) -> tuple[float, float, float]:
            cfg = Config(SCHEME, bits, "aware", seed=t, correlation=round(rho, 3))
            res = simulate(xs, hosts, cfg, intra=intra, intra_bits=8.0)
            inter = sum(r.inter_bytes for r in res)
            return vnmse(res[0].out, exact_mean(xs)), inter + sum(r.intra_bytes for r in res), inter
        return run
    return {f"flat ring {hosts}x{per}": flat, f"hier {hosts}x{per}, intra fp32": hier("none"),
            f"hier {hosts}x{per}, intra 8-bit": hier(SCHEME)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="4,16")
    ap.add_argument("--bits", default="2,4")
    ap.add_argument("--dists", default="iid,correlated,digits")
    ap.add_argument("--dim", type=int, default=1 << 18)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--only", default="grouped,measured,hier")
    ap.add_argument("-j", "--json", action="store_true")
    a = ap.parse_args(argv)
    parts = a.only.split(",")
    rows: list[dict[str, Any]] = []
    for dist in a.dists.split(","):
        for b in (float(v) for v in a.bits.split(",")):
            for n in (int(v) for v in a.ranks.split(",")):
                for part in ("grouped", "measured"):
                    if part in parts:
                        print(f"... {part} {dist} ranks={n} bits={b:g}", file=sys.stderr)
                        opts = (grouped_options if part == "grouped" else measured_options)(b, dist)
                        rows += [dict(r, part=part) for r in compare(dist, n, b, a.dim, a.trials, opts)]
            if "hier" in parts:
                for layout in ((4, 4), (2, 8)):
                    print(f"... hier {dist} {layout} bits={b:g}", file=sys.stderr)
                    got = compare(dist, layout[0] * layout[1], b, a.dim, a.trials, hier_options(b, layout))
                    rows += [dict(r, part="hier") for r in got]
    doc = {"config": {k: getattr(a, k) for k in ("ranks", "bits", "dists", "dim", "trials", "only")}
           | {"scheme": SCHEME, "digits_hidden": HIDDEN}, "rows": rows}
    if a.json:
        print(json.dumps(doc))
        return 0
    print("| part | dist (measured rho) | ranks | bits | option | vNMSE | / first option | wire bytes "
          "| inter-host bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['part']} | {r['dist']} ({r['measured_correlation']:.2f}) | {r['ranks']} | {r['bits']:g} "
              f"| {r['option']} | {r['vnmse']:.4f} ± {r['stderr']:.4f} "
              f"| {r['ratio']:.3f} ± {r['ratio_stderr']:.3f} "
              f"| {r['wire_bytes']:.0f} | {r['inter_host_bytes']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
