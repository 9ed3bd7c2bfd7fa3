"""The packet simulator's fast event loop against its reference loop (MRC_SIM_FAST, mrc/sim/fabric.py),
side by side, two ways:

* ``--mode interleave`` (the default): one process builds the permutation experiment twice, on a
  fabric with each loop, and advances the two in turns of ``--chunk`` simulated nanoseconds, summing each
  loop's CPU time. What else runs on the machine slows both alike, so the ratio is steady on a shared
  machine where separate runs vary by tens of percent. The two fabrics' final state (hops, events,
  drops, trims, marks, per-flow bytes, per-port bytes and peak backlog) must agree.
* ``--mode processes``: `mrcctl sim run permutation` alternately with MRC_SIM_FAST=0 and 1, each in a
  fresh interpreter (who goes first alternates); the two documents must agree but for wall-clock
  figures. This is the experiment's own hops_per_loop_s, but noisy on a busy machine.

    .venv/bin/python bench/sim_loop_ab.py [--mode interleave] [--hosts 64 --planes 4] [--variants ecmp,mrc]
    .venv/bin/python bench/sim_loop_ab.py --mode processes --pairs 3 \
        [--sim-args "--hosts 64 --planes 4 --spines 4 --jobs 1"]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mrc.sim.experiments import without_machine_figures

ROOT = Path(__file__).resolve().parents[1]


def sim_once(fast: bool, args: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "MRC_SIM_FAST"}
    env["MRC_SIM_FAST"] = "1" if fast else "0"
    out = subprocess.run(
        [sys.executable, "-m", "mrc.ctl.cli", "sim", "run", "permutation", *args, "-j"], check=True,
        capture_output=True, text=True, env=env, cwd=ROOT,
    ).stdout
    doc: dict[str, Any] = json.loads(out)
    return doc


def interleave(hosts: int, planes: int, variant: str, chunk_ns: int, duration_ns: int, warmup_ns: int,
               seed: int) -> dict[str, Any]:
    """One variant of the permutation on a fabric of each loop, advanced in alternating turns (who goes
    first alternates too): each loop's hops per CPU second, and whether the two ended in the same state."""
    from mrc.sim import experiments as ex
    from mrc.sim.derive import derangement
    from mrc.sim.fabric import Fabric
    from mrc.sim.hosts import Flow, Traffic

    fs = ex.FabricSpec(planes=planes, spines=planes, hosts_per_leaf=planes, leaves=hosts // planes)
    spec = ex.RunSpec(fabric=fs, variants=(variant,), seed=seed)
    perm = derangement(fs.hosts, random.Random(seed))
    flows = [Flow(i, perm[i], None) for i in range(fs.hosts)]
    sides: dict[bool, tuple[Any, Any, dict[int, list[int]]]] = {}
    for fast in (False, True):
        fab = Fabric(fs.topology(), fs.params(trimming=variant != "mrc-notrim"), fast=fast)
        tr = Traffic(fab, variant, flows, ex._host_params(spec), duration_ns)
        marks: dict[int, list[int]] = {}
        ex._mark(fab, tr, warmup_ns, marks)
        sides[fast] = (fab, tr, marks)
    cpu = {False: 0.0, True: 0.0}
    t, turn = 0, 0
    while t < duration_ns:
        t = min(duration_ns, t + chunk_ns)
        for fast in ((False, True) if turn % 2 == 0 else (True, False)):
            c0 = time.process_time()
            sides[fast][0].run(until_ns=t)
            cpu[fast] += time.process_time() - c0
        turn += 1

    def state(fast: bool) -> tuple[Any, ...]:
        fab, tr, marks = sides[fast]
        return (fab.hops, fab.events, fab.drops, fab.trims, fab.ecn_marks, marks.get(0), tr.delivered(),
                fab.port_max_backlog, fab.port_tx_bytes)

    hops = sides[True][0].hops
    return {"variant": variant, "packet_hops": hops, "identical": state(False) == state(True),
            "ref_hops_per_cpu_s": round(hops / cpu[False]), "fast_hops_per_cpu_s": round(hops / cpu[True]),
            "ratio": round(cpu[False] / cpu[True], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("interleave", "processes"), default="interleave")
    ap.add_argument("--hosts", type=int, default=64, help="interleave: hosts")
    ap.add_argument("--planes", type=int, default=4, help="interleave: planes (= spines = hosts per leaf)")
    ap.add_argument("--variants", default="ecmp,mrc", help="interleave: variants")
    ap.add_argument("--chunk", type=int, default=5_000, help="interleave: simulated ns per turn")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=3, help="processes: runs of each loop")
    ap.add_argument("--sim-args", default="--hosts 64 --planes 4 --spines 4 --jobs 1", help="processes")
    ap.add_argument("-j", "--json", action="store_true")
    a = ap.parse_args()
    if a.mode == "interleave":
        docs = []
        for v in a.variants.split(","):
            d = interleave(a.hosts, a.planes, v, a.chunk, 200_000, 50_000, a.seed)
            if not d["identical"]:
                raise SystemExit(f"bench/sim_loop_ab.py: {v}: the two loops ended in different states")
            docs.append(d)
            if not a.json:
                print(f"{v}: {d['packet_hops']:,} hops, hops per CPU second ref {d['ref_hops_per_cpu_s']:,} "
                      f"fast {d['fast_hops_per_cpu_s']:,} (ratio {d['ratio']:.3f}; same final state)",
                      flush=True)
        if a.json:
            print(json.dumps({"hosts": a.hosts, "planes": a.planes, "chunk_ns": a.chunk, "variants": docs},
                             indent=2))
        return
    rows: list[dict[str, Any]] = []
    for i in range(a.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {fast: sim_once(fast, a.sim_args.split()) for fast in order}
        ref, fast = got[False], got[True]
        if without_machine_figures(ref) != without_machine_figures(fast):
            raise SystemExit("bench/sim_loop_ab.py: the two loops' results differ")
        row: dict[str, Any] = {
            "ref_hops_per_loop_s": ref["hops_per_loop_s"], "fast_hops_per_loop_s": fast["hops_per_loop_s"],
            "ratio_hops_per_loop_s": round(fast["hops_per_loop_s"] / ref["hops_per_loop_s"], 3),
            "ref_hops_per_cpu_s": ref["hops_per_cpu_s"], "fast_hops_per_cpu_s": fast["hops_per_cpu_s"],
            "ratio_hops_per_cpu_s": round(fast["hops_per_cpu_s"] / ref["hops_per_cpu_s"], 3),
            "packet_hops": ref["packet_hops"],
        }
        for v, r in ref["results"].items():
            f = fast["results"][v]
            if r.get("hops_per_cpu_s") and f.get("hops_per_cpu_s"):
                row[f"ratio_{v}_hops_per_cpu_s"] = round(f["hops_per_cpu_s"] / r["hops_per_cpu_s"], 3)
        rows.append(row)
        if not a.json:
            r = row
            per = ", ".join(f"{k[6:-15]} {x:.3f}" for k, x in r.items()
                            if k.startswith("ratio_") and k.endswith("_hops_per_cpu_s") and k.count("_") > 4)
            print(f"pair {i + 1:2d} ({'ref first' if not order[0] else 'fast first'})  hops_per_loop_s "
                  f"{r['ref_hops_per_loop_s']:>9,} -> {r['fast_hops_per_loop_s']:>9,} "
                  f"({r['ratio_hops_per_loop_s']:.3f})  hops_per_cpu_s {r['ref_hops_per_cpu_s']:>9,} -> "
                  f"{r['fast_hops_per_cpu_s']:>9,} ({r['ratio_hops_per_cpu_s']:.3f}); "
                  f"per variant (CPU): {per}",
                  flush=True)
    keys = [k for k in rows[0] if k.startswith("ratio_")]
    summary = {"pairs": a.pairs, "sim_args": a.sim_args, "identical_results": True,
               **{f"median_{k}": round(statistics.median(r[k] for r in rows), 3) for k in keys}}
    if a.json:
        print(json.dumps({"summary": summary, "pairs": rows}, indent=2))
    else:
        print("median ratio (fast / ref): " + ", ".join(f"{k[13:]} {summary[k]:.3f}" for k in summary
                                                         if k.startswith("median_")))


if __name__ == "__main__":
    main()
