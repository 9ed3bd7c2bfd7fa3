#!/usr/bin/env python3
"""Loss recovery under heavy random loss: one WRITE-with-immediate over the loopback harness (the same
run as `mrcctl sim loopback`) for every loss rate and seed, in virtual time, so the figures do not
depend on the machine.

Usage: ``python bench/loss.py [--size 16M] [--planes 4] [--loss 0.1,0.3,0.4,0.5] [--seeds 1-8] [-j]``

Loss applies to every packet in both directions (data, SACKs, NACKs, probes). Columns per loss rate:
runs completed bit-exact; median and worst virtual time to completion (ms); median and worst number of
retransmissions (all causes: SACK hole, timeout, trim, NACK, RNR); median and worst ACK timeouts. The
table is what docs/transport.md quotes; `-j` prints every run as JSON instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from mrc.sim.loopback import FabricConfig, LoopbackConfig, loopback
from mrc.units import parse_size


def seeds(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def one(size: int, planes: int, loss: float, seed: int) -> dict[str, Any]:
    d = loopback(LoopbackConfig(size=size, seed=seed, fabric=FabricConfig(planes=planes, loss=loss)))
    retx = sum(v for k, v in d["retransmits"].items() if k != "spurious")
    return {"loss": loss, "seed": seed, "ok": bool(d["completed"] and d["bit_exact"]),
            "status": d["status"], "ms": round(d["sim_time_s"] * 1e3, 3), "retransmits": retx,
            "timeouts": d["retransmits"]["timeout"], "spurious": d["retransmits"]["spurious"],
            "min_cwnd": d["cc"].get("min_cwnd_seen")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="16M")
    ap.add_argument("--planes", type=int, default=4)
    ap.add_argument("--loss", default="0.1,0.3,0.4,0.5")
    ap.add_argument("--seeds", default="1-8")
    ap.add_argument("-j", "--json", action="store_true")
    a = ap.parse_args(argv)
    size = parse_size(a.size)
    runs = [one(size, a.planes, float(p), s) for p in a.loss.split(",") for s in seeds(a.seeds)]
    if a.json:
        print(json.dumps(runs, indent=1))
        return 0 if all(r["ok"] for r in runs) else 1
    print("| loss | bit-exact | median ms | worst ms | median retx | worst retx | median timeouts | worst |")
    print("|---|---|---|---|---|---|---|---|")
    for p in dict.fromkeys(r["loss"] for r in runs):
        rs = [r for r in runs if r["loss"] == p]
        ms, rx, to = ([r[k] for r in rs] for k in ("ms", "retransmits", "timeouts"))
        print(f"| {p} | {sum(r['ok'] for r in rs)}/{len(rs)} | {statistics.median(ms):.2f} | {max(ms):.2f} | "
              f"{statistics.median(rx):.0f} | {max(rx)} | {statistics.median(to):.0f} | {max(to)} |")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
