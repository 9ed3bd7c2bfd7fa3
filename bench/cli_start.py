#!/usr/bin/env python3
"""Start-up time of mrcctl: `python -c pass`, `mrcctl --version`, `mrcctl wire show` and `mrcctl help`
(which loads every object), each run N times, interleaved, in one process.

Usage: ``python bench/cli_start.py [--runs N] [-j]``

Why this shape: an operator feels the start-up of every call, and most of it is imports. The bare
interpreter start (`python -c pass`) is the floor no command can go below, so it is measured beside
the commands, round by round (each round runs every case once), so that a busy neighbour on the shared
cores slows all cases alike instead of skewing one. Each case reports the median and the spread of its
runs; `over_python_ms` is the median minus the bare interpreter's, i.e. what mrcctl itself costs.
`mrcctl help` is the opposite bound: it imports every command module (numpy, pyroute2, ...), which is
what every call paid before objects were loaded lazily. The target (issue 20) is ≤ 0.3 s for a simple
command on this machine.

The commands run the installed console script next to this interpreter (`.venv/bin/mrcctl`), as a
user would, or `python -m mrc.ctl.cli` when there is none.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _mrcctl() -> list[str]:
    script = Path(sys.executable).with_name("mrcctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mrc.ctl.cli"]


def cases() -> dict[str, list[str]]:
    """Case name -> argv; the name is the command as a user types it."""
    m = _mrcctl()
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "mrcctl --version": [*m, "--version"],
        "mrcctl wire show": [*m, "wire", "show"],
        "mrcctl help": [*m, "help"],
    }


def _once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def run(runs: int) -> dict[str, Any]:
    todo = cases()
    for argv in todo.values():  # one warm-up each: page cache and .pyc files, not measured
        _once(argv)
    samples: dict[str, list[float]] = {name: [] for name in todo}
    for _ in range(runs):
        for name, argv in todo.items():
            samples[name].append(_once(argv))
    floor = statistics.median(samples["python -c pass"])
    rows = []
    for name, s in samples.items():
        med = statistics.median(s)
        rows.append({
            "case": name, "runs": len(s), "median_ms": round(med * 1e3, 1),
            "min_ms": round(min(s) * 1e3, 1), "max_ms": round(max(s) * 1e3, 1),
            "over_python_ms": round((med - floor) * 1e3, 1),
        })
    return {
        "bench": "cli_start", "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2), "rows": rows,
    }


def _table(result: dict[str, Any]) -> str:
    cols = ("case", "runs", "median_ms", "min_ms", "max_ms", "over_python_ms")
    cells = [list(cols)] + [[str(r[c]) for c in cols] for r in result["rows"]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.append(f"(python {result['python']}, {result['cpus']} CPUs, load {result['load_1m']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=20, help="interleaved runs per case (default 20)")
    ap.add_argument("-j", "--json", action="store_true", help="print only the JSON document")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    result = run(args.runs)
    if not args.json:
        print(_table(result))
        print()
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
