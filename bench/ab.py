"""Side-by-side engine speed of two source trees: `mrcctl sim loopback` run alternately on this checkout's
`mrc/` and on `mrc/` of a git revision, in one window, so that the ratio survives a VM whose speed drifts
by 2x between sessions (a speed claim against an older tree is quoted from this, never from two runs on
different days).

    .venv/bin/python bench/ab.py --base 455353a --pairs 10 --size 256M [-j]

Each run is a fresh interpreter (`python -c` with PYTHONPATH set to the tree), so imports, caches and the
allocator start alike for both. Prints one row per pair and the medians of the per-pair ratios
(this tree / base) of `engine_pps` and `engine_vs_wire_floor`; `-j` prints the same as JSON.
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
from mrc.sim.loopback import LoopbackConfig, loopback
d = loopback(LoopbackConfig(size=int(sys.argv[1]), seed=int(sys.argv[2])))
print(json.dumps({k: d[k] for k in ("engine_pps", "engine_vs_wire_floor", "bit_exact", "wall_s")}))
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


def run_one(tree: Path, size: int, seed: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _RUN, str(size), str(seed)],
        check=True, capture_output=True, text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    ).stdout
    doc: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    if not doc["bit_exact"]:
        raise SystemExit(f"bench/ab.py: the run of {tree} was not bit-exact")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="git revision to compare this checkout's mrc/ with")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-j", "--json", action="store_true")
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
