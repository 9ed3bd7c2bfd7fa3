#!/usr/bin/env python3
"""Compression hot path on one core, float32, d = 2^20 and 2^24: the RHT, EDEN 4-bit encode and decode,
next to the textbook radix-2 numpy FWHT and to `numpy.copy` bandwidth, all measured in the same run.

Usage: ``python bench/quant.py [--sizes 20,24] [--rounds R] [-j]``

One core: BLAS/OpenMP threads are limited to 1 before numpy is imported and the process pins itself to
one CPU when it may. Cases are interleaved round by round and each reports the median of its rounds,
so that frequency scaling or a noisy neighbour shifts all cases alike.

Rows: `copy` = numpy.copy of the input (memory bandwidth, read + write); `fwht-textbook` = log2(D)
vectorised radix-2 butterfly stages (mrc.quant.rht.fwht_textbook); `fwht` = our blocked Kronecker
formulation; `rht-textbook` / `rht` = one full rotation (seeded signs + transform) with either; `eden4
encode` = mrc.quant.codec.encode(x, "eden-unbiased", 4) with one rotation (and with `auto`, which adds
the O(d) moment statistic); `eden4 decode` = codec.decode. MB/s are of float32 input (4 d bytes), the
convention of the issue's targets; `x copy` = time / copy time.

Prints a table, then the same results as one JSON document (only the JSON with -j).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from mrc.quant import codec, rht  # noqa: E402

TARGET_EDEN_MBPS = 250.0
TARGET_RHT_SPEEDUP = 3.0


def _pin() -> str:
    try:
        cpu = sorted(os.sched_getaffinity(0))[-1]
        os.sched_setaffinity(0, {cpu})
        return f"cpu{cpu}"
    except (AttributeError, OSError):
        return "unpinned"


def _cases(d: int) -> dict[str, Callable[[], object]]:
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    buf4 = codec.encode(x, "eden-unbiased", 4, seed=7, rotations=1)

    def rht_textbook() -> object:
        y = x * rht.signs(7, 0, d, np.float32)
        return rht.fwht_textbook(y)

    def rht_fast() -> object:
        return rht.rotate(x.copy(), 7, 1)

    return {
        "copy": lambda: np.copy(x),
        "fwht-textbook": lambda: rht.fwht_textbook(x),
        "fwht": lambda: rht.fwht(x.copy()),
        "rht-textbook": rht_textbook,
        "rht": rht_fast,
        "eden4 encode rot=1": lambda: codec.encode(x, "eden-unbiased", 4, seed=7, rotations=1),
        "eden4 encode auto": lambda: codec.encode(x, "eden-unbiased", 4, seed=7, rotations="auto"),
        "eden4 decode": lambda: codec.decode(buf4),
    }


def measure(log2d: int, rounds: int) -> list[dict[str, Any]]:
    d = 1 << log2d
    cases = _cases(d)
    for f in cases.values():  # warm-up: caches, first-touch pages
        f()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, f in cases.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = []
    for name in cases:
        t = med[name]
        row: dict[str, Any] = {
            "case": name, "log2_d": log2d, "d": d, "ms": t * 1e3, "mbps": 4.0 * d / t / 1e6,
            "x_copy": t / med["copy"],
        }
        if name == "fwht":
            row["speedup_vs_textbook"] = med["fwht-textbook"] / t
        if name == "rht":
            row["speedup_vs_textbook"] = med["rht-textbook"] / t
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    head = f"{'case':<20} {'d':>9} {'ms':>9} {'MB/s':>8} {'x copy':>7} {'vs textbook':>11}"
    out = [head]
    for r in rows:
        sp = f"{r['speedup_vs_textbook']:.1f}x" if "speedup_vs_textbook" in r else ""
        out.append(
            f"{r['case']:<20} {'2^' + str(r['log2_d']):>9} {r['ms']:>9.2f} {r['mbps']:>8.0f} "
            f"{r['x_copy']:>7.1f} {sp:>11}".rstrip()
        )
    return "\n".join(out)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    res = []
    at20 = {r["case"]: r for r in rows if r["log2_d"] == 20}
    for case in ("eden4 encode rot=1", "eden4 decode"):
        if case in at20:
            v = at20[case]["mbps"]
            res.append({"target": f"{case} >= {TARGET_EDEN_MBPS:.0f} MB/s at d=2^20", "value": v,
                        "pass": v >= TARGET_EDEN_MBPS})
    for r in rows:
        if r["case"] == "rht":
            v = r["speedup_vs_textbook"]
            res.append({"target": f"rht >= {TARGET_RHT_SPEEDUP:.0f}x textbook at d=2^{r['log2_d']}",
                        "value": v, "pass": v >= TARGET_RHT_SPEEDUP})
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="20,24", help="comma list of log2(d)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-j", "--json", action="store_true", help="print only the JSON document")
    args = ap.parse_args()
    pinned = _pin()
    rows: list[dict[str, Any]] = []
    for s in (int(v) for v in args.sizes.split(",")):
        if not args.json:
            print(f"measuring d=2^{s} ...", file=sys.stderr)
        rows.extend(measure(s, args.rounds if s < 24 else max(3, args.rounds // 2)))
    doc: dict[str, Any] = {
        "bench": "quant",
        "machine": {"python": platform.python_version(), "numpy": np.__version__,
                    "processor": platform.processor() or platform.machine(), "pinned": pinned},
        "rows": rows,
        "targets": targets(rows),
    }
    if not args.json:
        print(render(rows))
        for t in doc["targets"]:
            print(f"target: {t['target']}: {'PASS' if t['pass'] else 'FAIL'} ({t['value']:.1f})")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
