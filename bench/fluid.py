"""Fluid model speed: the 8-plane permutation (ECMP and MRC) at 8,192 / 32,768 / 131,072 hosts.

    .venv/bin/python bench/fluid.py [--hosts 8192,32768,131072] [--evs 128] [-j]

Each scale runs in a fresh process (so its peak RSS is its own); prints a table of wall time, peak RSS
and the capacity fractions, then (with -j) one JSON document. The targets of issue 21: 8,192 hosts in
≤ 30 s, 131,072 hosts (both variants) in ≤ 10 min and ≤ 16 GB. Other jobs on the machine slow it: the
load average is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = """
import json, sys
from mrc.sim import fluid_exp
doc = fluid_exp.permutation(fluid_exp.clos(int(sys.argv[1])), seed=1, evs=int(sys.argv[2]))
print(json.dumps(doc))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="8192,32768,131072")
    ap.add_argument("--evs", type=int, default=128)
    ap.add_argument("-j", action="store_true", help="also print the JSON document")
    a = ap.parse_args()
    rows = []
    for h in (int(x) for x in a.hosts.split(",")):
        load = os.getloadavg()[0]
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(h), str(a.evs)], capture_output=True, text=True, check=True
        )
        doc = json.loads(out.stdout)
        r = doc["results"]
        rows.append(
            {
                "hosts": h,
                "links": doc["config"]["links"],
                "wall_s": doc["wall_s"],
                "peak_rss_mb": doc["peak_rss_mb"],
                "ecmp_s": r["ecmp"]["wall_s"],
                "mrc_s": r["mrc"]["wall_s"],
                "ecmp_capacity": r["ecmp"]["capacity_fraction"],
                "mrc_capacity": r["mrc"]["capacity_fraction"],
                "load_before": round(load, 2),
                "load_after": round(os.getloadavg()[0], 2),
            }
        )
        x = rows[-1]
        print(
            f"{h:>8,} hosts  {x['links']:>10,} links  wall {x['wall_s']:7.1f} s (ecmp {x['ecmp_s']:.1f}, mrc "
            f"{x['mrc_s']:.1f})  peak RSS {x['peak_rss_mb']:8.0f} MB  capacity ecmp {x['ecmp_capacity']:.4f} "
            f"mrc {x['mrc_capacity']:.4f}  load {x['load_before']}/{x['load_after']}",
            flush=True,
        )
    if a.j:
        print(json.dumps({"benchmark": "fluid-permutation", "evs": a.evs, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
