#!/usr/bin/env python3
"""Accuracy of compressed all-reduce: naive vs partial-sum-aware ring vs one-shot, at the same bit budget,
next to the error model (docs/collective.md §5).

Usage: ``python bench/collective.py [--ranks 4,16] [--bits 2,4] [--dists iid,correlated] [--dim D]
[--trials T] [-j]``

For each (dist, ranks, bits): T trials, each a fresh set of per-rank buffers (mrc.collective.bench
.make_inputs: `iid` N(0, I), or `correlated`: pairwise correlation 0.5) all-reduced in-process by the
three algorithms with unbiased EDEN. Naive and aware run with the same inputs and seeds (paired), aware's
schedule sized for the dist's correlation. Reported: vNMSE of the result against the exact float64
mean (mean ± standard error over trials), the model's prediction, wire bytes of all ranks, and
aware / naive (mean of the paired ratios).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from typing import Any

from mrc.collective import Config, Result, Transport, allreduce, run_inproc, vnmse
from mrc.collective.bench import exact_mean, make_inputs
from mrc.collective.schedule import aware_bits, model_error
from mrc.quant.bench import theory

RHO = {"iid": 0.0, "correlated": 0.5}


def _mse(values: list[float]) -> tuple[float, float]:
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return m, se


def measure(dist: str, n: int, bits: float, dim: int, trials: int) -> dict[str, Any]:
    rho = RHO[dist]
    errs: dict[str, list[float]] = {"naive": [], "aware": [], "oneshot": []}
    wire: dict[str, list[int]] = {k: [] for k in errs}
    ratios = []
    for t in range(trials):
        xs = make_inputs(n, dim, dist, t, 0)
        exact = exact_mean(xs)
        for name in errs:
            cfg = Config("eden-unbiased", bits, "naive" if name == "oneshot" else name,
                         "oneshot" if name == "oneshot" else "ring", seed=t, correlation=rho)
            def body(tr: Transport, cfg: Config = cfg, xs: list[Any] = xs) -> Result:
                return allreduce(tr, xs[tr.rank], cfg, 0)

            res = run_inproc(n, body)
            errs[name].append(vnmse(res[0].out, exact))
            wire[name].append(sum(r.wire_bytes for r in res))
        ratios.append(errs["aware"][-1] / errs["naive"][-1])
    # model, in units of ||mean||^2: E||mean||^2 = ||x||^2 (1 + rho (n - 1)) / n
    norm = n * n * (1 + rho * (n - 1)) / n
    v = theory("eden-unbiased", bits) or math.nan
    sched = aware_bits("eden-unbiased", float(bits), n, rho)
    row: dict[str, Any] = {"dist": dist, "ranks": n, "bits": bits, "dim": dim, "trials": trials,
                           "aware_bits_per_hop": list(sched)}
    for name in errs:
        m, se = _mse(errs[name])
        row[f"{name}_vnmse"], row[f"{name}_stderr"] = m, se
        row[f"{name}_wire_bytes"] = statistics.fmean(wire[name])
    row["naive_model"] = model_error("eden-unbiased", (float(bits),) * n, rho) / norm
    row["aware_model"] = model_error("eden-unbiased", sched, rho) / norm
    row["oneshot_model"] = v * n / norm  # n independent quantizations of energy ||x||^2 each
    row["aware_over_naive"], row["ratio_stderr"] = _mse(ratios)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="4,16")
    ap.add_argument("--bits", default="2,4")
    ap.add_argument("--dists", default="iid,correlated")
    ap.add_argument("--dim", type=int, default=1 << 16)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("-j", "--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for dist in a.dists.split(","):
        for n in (int(v) for v in a.ranks.split(",")):
            for b in (float(v) for v in a.bits.split(",")):
                if not a.json:
                    print(f"... {dist} ranks={n} bits={b:g}", file=sys.stderr)
                rows.append(measure(dist, n, b, a.dim, a.trials))
    doc = {"config": {"ranks": a.ranks, "bits": a.bits, "dists": a.dists, "dim": a.dim, "trials": a.trials,
                      "scheme": "eden-unbiased"}, "rows": rows}
    if a.json:
        print(json.dumps(doc))
        return 0
    print("| dist | ranks | bits | one-shot vNMSE (model) | naive vNMSE (model) | aware vNMSE (model) "
          "| aware / naive | wire B naive / aware / one-shot | aware bits per hop |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        hops = " ".join(f"{x:g}" for x in r["aware_bits_per_hop"])
        print(
            f"| {r['dist']} | {r['ranks']} | {r['bits']:g} "
            f"| {r['oneshot_vnmse']:.4f} ± {r['oneshot_stderr']:.4f} ({r['oneshot_model']:.4f}) "
            f"| {r['naive_vnmse']:.4f} ± {r['naive_stderr']:.4f} ({r['naive_model']:.4f}) "
            f"| {r['aware_vnmse']:.4f} ± {r['aware_stderr']:.4f} ({r['aware_model']:.4f}) "
            f"| {r['aware_over_naive']:.3f} ± {r['ratio_stderr']:.3f} "
            f"| {r['naive_wire_bytes']:.0f} / {r['aware_wire_bytes']:.0f} / {r['oneshot_wire_bytes']:.0f} "
            f"| {hops} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
