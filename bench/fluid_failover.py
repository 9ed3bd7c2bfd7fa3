#!/usr/bin/env python3
"""The fluid model's failover row (docs/sim.md, "Fluid model"): the packet simulator's failover set-up
(`mrcctl sim run failover`: the hosts of leaf 0 send to those of leaf 1, 4 planes x 4 spines, p0l0-p0s3
down) solved as max-min flows on the healthy and on the failed fabric. ECMP before its reconvergence is
hashed on the healthy routes (a connection through the dead link has rate 0), after it on the failed
ones; the fluid "during" weights them as the packet run does (1 ms before reconvergence, 0.5 ms after).
MRC spreads over the EVs that avoid the dead link.

    .venv/bin/python bench/fluid_failover.py [--planes 4] [--spines 4] [-j]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from mrc.sim import experiments as exps
from mrc.sim import fluid as fl
from mrc.sim import fluid_exp

BEFORE_RECONVERGENCE_MS = 1.0
AFTER_RECONVERGENCE_MS = 0.5


def run(planes: int, spines: int, seed: int = 1) -> dict[str, dict[str, float]]:
    fs = exps.FabricSpec(planes=planes, spines=spines, hosts_per_leaf=spines, leaves=2)
    fab = fl.FluidFabric.from_topology(fs.topology())
    src = np.arange(0, fs.hosts_per_leaf, dtype=np.int64)
    dst = src + fs.hosts_per_leaf
    healthy = fl.LinkState(fab)
    failed = fl.LinkState(fab)
    failed.fail_leaf_spine(0, 0, spines - 1)
    out: dict[str, dict[str, float]] = {}
    for v in ("ecmp", "mrc"):
        before = float(fluid_exp.solve(fab, healthy, v, src, dst, seed).mean())
        if v == "ecmp":
            pre = float(fluid_exp.solve(fab, failed, v, src, dst, seed, view=healthy).mean())
            post = float(fluid_exp.solve(fab, failed, v, src, dst, seed).mean())
            during = ((BEFORE_RECONVERGENCE_MS * pre + AFTER_RECONVERGENCE_MS * post)
                      / (BEFORE_RECONVERGENCE_MS + AFTER_RECONVERGENCE_MS))
            out[v] = {"before": before, "before_reconvergence": pre, "after_reconvergence": post,
                      "during": during}
        else:
            d = float(fluid_exp.solve(fab, failed, v, src, dst, seed).mean())
            out[v] = {"before": before, "during": d}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--planes", type=int, default=4)
    ap.add_argument("--spines", type=int, default=4)
    ap.add_argument("-j", "--json", action="store_true")
    args = ap.parse_args(argv)
    res = run(args.planes, args.spines)
    if args.json:
        print(json.dumps({"planes": args.planes, "spines": args.spines, "results": res}, indent=1))
        return 0
    print(f"fluid failover: {args.planes} planes x {args.spines} spines, p0l0-p0s{args.spines - 1} down")
    print(f"{'VARIANT':<8} {'BEFORE':>8} {'DURING':>8}")
    for v, r in res.items():
        print(f"{v:<8} {r['before']:>8.4f} {r['during']:>8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
