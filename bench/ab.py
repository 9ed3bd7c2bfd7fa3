"""Side-by-side engine speed of two source trees: `mrcctl sim loopback` run alternately on this checkout's
`mrc/` and on `mrc/` of a git revision, in one window, so that the ratio survives a VM whose speed drifts
by 2x between sessions (a speed claim against an older tree is quoted from this, never from two runs on
different days).

    .venv/bin/python bench/ab.py --base 455353a --pairs 10 --size 256M [-j]
    .venv/bin/python bench/ab.py --base 455353a --pairs 2 --permutation 256 [-j]

Each run is a fresh interpreter (`python -c` with PYTHONPATH set to the tree), so imports, caches and the
allocator start alike for both. Prints one row per pair and the medians of the per-pair ratios
(this tree / base) of `engine_pps` and `engine_vs_wire_floor`; `-j` prints the same as JSON.

``--permutation HOSTS``: instead, the simulator's scale run (`mrcctl sim run permutation --hosts HOSTS
--planes 8 --spines 8 --jobs 1`: ECMP and MRC variants one after the other in one process) and its
`hops_per_loop_s` (packet-hops per second of event-loop wall time), with each variant's own `hops_per_s`
and `capacity_fraction` (the trees may differ in behaviour, so the speed is compared, not the results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import json, sys
import mrc
assert mrc.__file__.startswith(sys.argv[3]), (mrc.__file__, sys.argv[3])  # the tree asked for
from mrc.sim.loopback import LoopbackConfig, loopback
d = loopback(LoopbackConfig(size=int(sys.argv[1]), seed=int(sys.argv[2])))
print(json.dumps({k: d[k] for k in ("engine_pps", "engine_vs_wire_floor", "bit_exact", "wall_s")}))
"""

_PERMUTATION = """
import json, sys
import mrc
assert mrc.__file__.startswith(sys.argv[3]), (mrc.__file__, sys.argv[3])  # the tree asked for
from mrc.sim import experiments as E
n = int(sys.argv[1])
fabric = E.FabricSpec(planes=8, spines=8, leaves=n // 8, hosts_per_leaf=8)
spec = E.RunSpec(fabric=fabric, seed=int(sys.argv[2]))
d = E.permutation(spec)
doc = {"hops_per_loop_s": d["hops_per_loop_s"]}
for v, r in d["results"].items():
    doc[v + "_hops_per_s"] = r["hops_per_s"]
    doc[v + "_capacity_fraction"] = r["capacity_fraction"]
print(json.dumps(doc))
"""


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    if t and t[-1] in mult:
        return int(t[:-1]) * mult[t[-1]]
    return int(t)


def extract(rev: str, into: Path) -> Path:
    """`mrc/` of revision `rev` under `into` (git archive: the committed tree, not the work tree)."""
    try:
        blob = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "mrc"], check=True, capture_output=True
        ).stdout
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"bench/ab.py: git archive {rev} failed: {e.stderr.decode().strip()}") from None
    with tarfile.open(fileobj=BytesIO(blob)) as tf:
        tf.extractall(into)  # our own repository's tree
    return into


def run_one(tree: Path, size: int, seed: int, script: str = _RUN) -> dict[str, float]:
    # cwd=tree: `python -c` puts the working directory first on sys.path, so run from the checkout it
    # would import this checkout's mrc/ for the base as well
    out = subprocess.run(
        [sys.executable, "-c", script, str(size), str(seed), str(tree.resolve()) + "/"], cwd=tree,
        check=True, capture_output=True, text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    ).stdout
    doc: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    if not doc.get("bit_exact", True):  # the loopback's check (the permutation has no one payload to check)
        raise SystemExit(f"bench/ab.py: the run of {tree} was not bit-exact")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="git revision to compare this checkout's mrc/ with")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--permutation", type=int, metavar="HOSTS",
                    help="compare the simulator's permutation run on HOSTS hosts (a multiple of 8) instead")
    ap.add_argument("-j", "--json", action="store_true")
    a = ap.parse_args()
    if a.pairs < 1:
        raise SystemExit(f"bench/ab.py: --pairs must be at least 1, got {a.pairs}")
    if a.permutation is not None:
        if a.permutation < 16 or a.permutation % 8:
            raise SystemExit("bench/ab.py: --permutation needs a multiple of 8 hosts, at least 16")
        permutation_ab(a)
        return
    size = parse_size(a.size)
    keys = ("engine_pps", "engine_vs_wire_floor")
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="mrc-ab-") as tmp:
        base = extract(a.base, Path(tmp))
        for i in range(a.pairs):
            # alternate which tree goes first so that a drift within a pair does not favour one side
            order = (("base", base), ("this", ROOT)) if i % 2 == 0 else (("this", ROOT), ("base", base))
            got = {name: run_one(tree, size, a.seed) for name, tree in order}
            row = {f"{side}_{k}": got[side][k] for side in ("base", "this") for k in keys}
            for k in keys:
                row[f"ratio_{k}"] = round(got["this"][k] / got["base"][k], 3)
            rows.append(row)
            if not a.json:
                r = row
                print(
                    f"pair {i + 1:2d}  engine_pps {r['base_engine_pps']:>9,.0f}"
                    f" -> {r['this_engine_pps']:>9,.0f}"
                    f" ({r['ratio_engine_pps']:.3f})  vs_wire_floor {r['base_engine_vs_wire_floor']:.3f}"
                    f" -> {r['this_engine_vs_wire_floor']:.3f} ({r['ratio_engine_vs_wire_floor']:.3f})",
                    flush=True,
                )
    summary = {
        "base": a.base, "size_bytes": size, "pairs": a.pairs,
        **{f"median_ratio_{k}": round(statistics.median(r[f"ratio_{k}"] for r in rows), 3) for k in keys},
        **{f"min_ratio_{k}": min(r[f"ratio_{k}"] for r in rows) for k in keys},
    }
    if a.json:
        print(json.dumps({"summary": summary, "pairs": rows}, indent=2))
    else:
        print(
            f"median ratio (this / {a.base}): engine_pps {summary['median_ratio_engine_pps']:.3f}, "
            f"engine_vs_wire_floor {summary['median_ratio_engine_vs_wire_floor']:.3f}"
        )


def permutation_ab(a: argparse.Namespace) -> None:
    """The --permutation comparison: pairs in alternating order, per-pair ratios of the loop speed and of
    each variant's speed."""
    keys = ("hops_per_loop_s", "ecmp_hops_per_s", "mrc_hops_per_s")
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="mrc-ab-") as tmp:
        base = extract(a.base, Path(tmp))
        for i in range(a.pairs):
            order = (("base", base), ("this", ROOT)) if i % 2 == 0 else (("this", ROOT), ("base", base))
            got = {name: run_one(tree, a.permutation, a.seed, _PERMUTATION) for name, tree in order}
            row: dict[str, float] = {
                f"{side}_{k}": got[side][k] for side in ("base", "this") for k in got["this"]
            }
            for k in keys:
                row[f"ratio_{k}"] = round(got["this"][k] / got["base"][k], 3)
            rows.append(row)
            if not a.json:
                print(
                    f"pair {i + 1:2d}  hops_per_loop_s {row['base_hops_per_loop_s']:>9,.0f} -> "
                    f"{row['this_hops_per_loop_s']:>9,.0f} ({row['ratio_hops_per_loop_s']:.3f});  ecmp "
                    f"{row['ratio_ecmp_hops_per_s']:.3f}, mrc {row['ratio_mrc_hops_per_s']:.3f};  capacity "
                    f"fraction ecmp {row['base_ecmp_capacity_fraction']} / "
                    f"{row['this_ecmp_capacity_fraction']}, "
                    f"mrc {row['base_mrc_capacity_fraction']} / {row['this_mrc_capacity_fraction']}",
                    flush=True,
                )
    medians = {f"median_ratio_{k}": round(statistics.median(r[f"ratio_{k}"] for r in rows), 3) for k in keys}
    summary = {"base": a.base, "hosts": a.permutation, "pairs": a.pairs, **medians}
    if a.json:
        print(json.dumps({"summary": summary, "pairs": rows}, indent=2))
    else:
        m = [medians[f"median_ratio_{k}"] for k in keys]
        print(f"median ratio (this / {a.base}): hops_per_loop_s {m[0]:.3f}, ecmp {m[1]:.3f}, mrc {m[2]:.3f}")


if __name__ == "__main__":
    main()
