"""The engine's fast path against its pure-Python path, side by side: `mrcctl sim loopback` (and, with
`--sim`, `mrcctl sim run permutation`) run alternately with MRC_FASTPATH=0 and MRC_FASTPATH=1 (the C
fast path where mrc/transport/_fastc.c is built, else the Python one), each in a fresh interpreter
(of this checkout, which the virtual environment's editable install points at), so that
the ratio survives a machine whose speed drifts.

    .venv/bin/python bench/fastpath_ab.py --pairs 6 --size 256M [--sim] [-j]

Prints one row per pair and the median of the per-pair ratios (fast / pure) of `engine_pps` (loopback)
and of `hops_per_loop_s` (permutation, `--sim`: --hosts 64 --planes 4 --spines 4 --jobs 1 unless
`--sim-args` says otherwise). Both paths must give the same result: a loopback that is not bit-exact,
or whose packet counts differ between the two paths, stops the bench.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from mrc.units import parse_size

ROOT = Path(__file__).resolve().parents[1]

_LOOPBACK = """
import json, sys
from mrc.sim.loopback import LoopbackConfig, loopback
d = loopback(LoopbackConfig(size=int(sys.argv[1]), seed=int(sys.argv[2])))
print(json.dumps({k: d[k] for k in ("engine_pps", "engine_vs_wire_floor", "bit_exact", "wall_s",
                                    "data_packets", "sacks")}))
"""


def _env(fast: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MRC_FASTPATH"}
    env["MRC_FASTPATH"] = "1" if fast else "0"
    return env


def loopback_once(fast: bool, size: int, seed: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _LOOPBACK, str(size), str(seed)], check=True, capture_output=True, text=True,
        env=_env(fast), cwd=ROOT,
    ).stdout
    doc: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if not doc["bit_exact"]:
        raise SystemExit(f"bench/fastpath_ab.py: MRC_FASTPATH={int(fast)}: the loopback was not bit-exact")
    return doc


def sim_once(fast: bool, args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "mrc.ctl.cli", "sim", "run", "permutation", *args, "-j"], check=True,
        capture_output=True, text=True, env=_env(fast), cwd=ROOT,
    ).stdout
    doc: dict[str, Any] = json.loads(out)
    return {"hops_per_loop_s": doc["hops_per_loop_s"], "packet_hops": doc["packet_hops"],
            "mrc_hops_per_s": doc["results"]["mrc"]["hops_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim", action="store_true", help="also the permutation experiment's hops_per_loop_s")
    ap.add_argument("--sim-args", default="--hosts 64 --planes 4 --spines 4 --jobs 1")
    ap.add_argument("-j", "--json", action="store_true")
    a = ap.parse_args()
    size = parse_size(a.size)
    rows: list[dict[str, Any]] = []
    for i in range(a.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)  # alternate who goes first
        got = {fast: loopback_once(fast, size, a.seed) for fast in order}
        pure, fast = got[False], got[True]
        if (pure["data_packets"], pure["sacks"]) != (fast["data_packets"], fast["sacks"]):
            raise SystemExit(f"bench/fastpath_ab.py: the paths differ: pure {pure}, fast {fast}")
        row: dict[str, Any] = {
            "pure_engine_pps": pure["engine_pps"], "fast_engine_pps": fast["engine_pps"],
            "ratio_engine_pps": round(fast["engine_pps"] / pure["engine_pps"], 3),
        }
        if a.sim:
            sim = {f: sim_once(f, a.sim_args.split()) for f in order}
            if sim[False]["packet_hops"] != sim[True]["packet_hops"]:
                raise SystemExit(f"bench/fastpath_ab.py: the simulations differ: {sim}")
            p, f = sim[False], sim[True]
            row.update(
                pure_hops_per_loop_s=p["hops_per_loop_s"], fast_hops_per_loop_s=f["hops_per_loop_s"],
                ratio_hops_per_loop_s=round(f["hops_per_loop_s"] / p["hops_per_loop_s"], 3),
                ratio_mrc_hops_per_s=round(f["mrc_hops_per_s"] / p["mrc_hops_per_s"], 3),
            )
        rows.append(row)
        if not a.json:
            r = row
            line = (f"pair {i + 1:2d}  engine_pps pure {r['pure_engine_pps']:>9,}"
                    f" fast {r['fast_engine_pps']:>9,} ({r['ratio_engine_pps']:.3f})")
            if a.sim:
                line += (f"  hops_per_loop_s {r['pure_hops_per_loop_s']:>9,}"
                         f" -> {r['fast_hops_per_loop_s']:>9,}"
                         f" ({r['ratio_hops_per_loop_s']:.3f}; mrc variant {r['ratio_mrc_hops_per_s']:.3f})")
            print(line, flush=True)
    keys = [k for k in rows[0] if k.startswith("ratio_")]
    summary = {"size_bytes": size, "pairs": a.pairs,
               **{f"median_{k}": round(statistics.median(r[k] for r in rows), 3) for k in keys}}
    if a.json:
        print(json.dumps({"summary": summary, "pairs": rows}, indent=2))
    else:
        print("median ratio (fast / pure): " + ", ".join(f"{k[7:]} {summary[k]:.3f}" for k in summary
                                                          if k.startswith("median_")))


if __name__ == "__main__":
    main()
