#!/usr/bin/env python3
"""Compression hot path on one core, float32, d = 2^20 and 2^22: the RHT, EDEN 2- and 4-bit encode and
decode on both implementations (numba kernels and numpy reference, mrc/quant/accel.py), next to the
textbook radix-2 numpy FWHT and to `numpy.copy` bandwidth, all measured in the same run.

Usage: ``python bench/quant.py [--sizes 20,22] [--rounds R] [-j]``

One core: BLAS/OpenMP threads are limited to 1 before numpy is imported and the process pins itself to
one CPU when it may. Cases are interleaved round by round and each reports the fastest of its rounds
(the machine this was written on is shared: a neighbour's burst lands in single rounds, which the
minimum drops and a median of a few rounds does not). The numba kernels are compiled
(or loaded from numba's cache) in the warm-up round, before any timing.

Rows, each for backend `numpy` and `numba`: `copy` = numpy.copy of the input (memory bandwidth, read +
write); `fwht-textbook` = log2(D) vectorised radix-2 butterfly stages (mrc.quant.rht.fwht_textbook);
`fwht` = the fast transform (numpy: blocked Kronecker matmuls; numba: blocked radix-8/4/2 kernels);
`rht-textbook` / `rht` = one full rotation (seeded signs + transform) with either, of a copy; `rht in place`
(numba) = the rotation of one vector in place, no copy, with its time per element and butterfly level
(`ns_per_element_level`: the FWHT's compute rate at that size); `edenB encode rot=1` =
mrc.quant.codec.encode(x, "eden-unbiased", B) with one rotation, `edenB encode auto` with the default
`auto` (which adds the O(d) moment statistic); `edenB decode` = codec.decode. MB/s are of float32 input
(4 d bytes), the convention of the issue's targets; `x copy` = time / copy time; `vs numpy` = the numpy
row's time / the numba row's time.

`hop eden{B} three-pass` / `hop eden{B} fused` (numba only): one reduce-scatter hop of the ring
(mrc/quant/hop.py): the incoming B-bit frame of a partial sum decoded, the local chunk added, the sum
encoded with a fresh seed — as three passes (decode, add, encode) and fused (kernels.hop_rotate); the
fused row's `vs 3-pass` is the three-pass time / fused time, and `identical` says the two frames were the
same bytes. MB/s are of the chunk's float32 elements. `hop eden{B} floor`: only the arithmetic that any
hop bit-identical to the three passes must run (two rotations and the codec's quantizer and packing,
`floor_fn`). Where the rotation runs at its compute-bound rate (2^20 here: its lowest time per element
and level) its `vs 3-pass` (`<=`) is the most a fused kernel built from these kernels can gain; a faster
rotation or quantizer would be the codec's own and speed up the three passes as much. Beyond the caches
(2^22) each rotation of the floor also pays memory passes that fusion saves, so the fused row can beat it.

Prints a table, then the same results as one JSON document (only the JSON with -j).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from mrc.quant import accel, codec, hop, rht  # noqa: E402

TARGET_EDEN_MBPS = 250.0
TARGET_RHT_SPEEDUP = 3.0
TARGET_NUMBA_SPEEDUP = 3.0
TARGET_HOP_SPEEDUP = 1.5
BACKENDS = ("numpy", "numba")


def _pin() -> str:
    try:
        cpu = sorted(os.sched_getaffinity(0))[-1]
        os.sched_setaffinity(0, {cpu})
        return f"cpu{cpu}"
    except (AttributeError, OSError):
        return "unpinned"


def _on_copy(f: Callable[[np.ndarray], object], x: np.ndarray) -> object:
    return f(x.copy())


def _rotate_copy(rotate: Callable[[np.ndarray, int, int], object], x: np.ndarray) -> object:
    return rotate(x.copy(), 7, 1)


def _cases(d: int, backends: tuple[str, ...]) -> dict[tuple[str, str], Callable[[], object]]:
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)

    def rht_textbook() -> object:
        y = x * rht.signs(7, 0, d, np.float32)
        return rht.fwht_textbook(y)

    cases: dict[tuple[str, str], Callable[[], object]] = {
        ("copy", "numpy"): lambda: np.copy(x),
        ("fwht-textbook", "numpy"): lambda: rht.fwht_textbook(x),
        ("rht-textbook", "numpy"): rht_textbook,
    }
    for be in backends:
        kern = accel.kernels(be)
        fwht: Callable[[np.ndarray], object] = rht.fwht if kern is None else kern.fwht
        rotate: Callable[[np.ndarray, int, int], object] = rht.rotate if kern is None else kern.rotate
        cases[("fwht", be)] = partial(_on_copy, fwht, x)
        cases[("rht", be)] = partial(_rotate_copy, rotate, x)
        if kern is not None:
            # one rotation of a vector in place (no copy, no allocation): the compute rate of the FWHT
            y = x.copy()
            cases[("rht in place", be)] = partial(kern._rotate_into, y, y, 7, 0)
        for bits in (2, 4):
            buf = codec.encode(x, "eden-unbiased", bits, seed=7, rotations=1, backend=be)
            cases[(f"eden{bits} encode rot=1", be)] = partial(
                codec.encode, x, "eden-unbiased", bits, seed=7, rotations=1, backend=be)
            cases[(f"eden{bits} encode auto", be)] = partial(codec.encode, x, "eden-unbiased", bits, seed=7,
                                                             backend=be)
            cases[(f"eden{bits} decode", be)] = partial(codec.decode, buf, backend=be)
    return cases


def measure(log2d: int, rounds: int, backends: tuple[str, ...] = BACKENDS) -> list[dict[str, Any]]:
    d = 1 << log2d
    cases = _cases(d, backends)
    for f in cases.values():  # warm-up: JIT compilation / cache load, caches, first-touch pages
        f()
    times: dict[tuple[str, str], list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for key, f in cases.items():
            t0 = time.perf_counter()
            f()
            times[key].append(time.perf_counter() - t0)
    med = {k: min(v) for k, v in times.items()}
    copy_t = med[("copy", "numpy")]
    rows = []
    order = list(dict.fromkeys(name for name, _ in cases))
    for name, be in sorted(cases, key=lambda k: (order.index(k[0]), BACKENDS.index(k[1]))):
        t = med[(name, be)]
        row: dict[str, Any] = {
            "case": name, "backend": be, "log2_d": log2d, "d": d, "ms": t * 1e3, "mbps": 4.0 * d / t / 1e6,
            "x_copy": t / copy_t,
        }
        if name in ("fwht", "rht"):
            row["speedup_vs_textbook"] = med[(f"{name}-textbook", "numpy")] / t
        if name == "rht in place":
            row["ns_per_element_level"] = t / (d * log2d) * 1e9
        if be != "numpy" and (name, "numpy") in med:
            row["speedup_vs_numpy"] = med[(name, "numpy")] / t
        rows.append(row)
    return rows


def measure_hop(log2d: int, rounds: int) -> list[dict[str, Any]]:
    """Three-pass vs fused ring hop at d = 2^log2d, 2 and 4 bits, interleaved round by round."""
    d = 1 << log2d
    rng = np.random.default_rng(1)
    partial = rng.standard_normal(d).astype(np.float32)
    own = rng.standard_normal(d).astype(np.float32)
    cases: dict[tuple[str, str], Callable[[], object]] = {}
    identical: dict[int, bool] = {}
    for bits in (2, 4):
        frame = codec.encode(partial, "eden-unbiased", bits, seed=3, rotations=1)
        identical[bits] = (hop.hop(frame, own, "eden-unbiased", bits, 9, path="fused")
                           == hop.hop(frame, own, "eden-unbiased", bits, 9, path="three-pass"))
        for path in hop.PATHS:
            cases[(f"hop eden{bits} {path}", "numba")] = partial_fn(frame, own, bits, path)
        cases[(f"hop eden{bits} floor", "numba")] = floor_fn(own, bits)
    for f in cases.values():
        f()
    times: dict[tuple[str, str], list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for key, f in cases.items():
            t0 = time.perf_counter()
            f()
            times[key].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    rows = []
    for (name, be), t in best.items():
        bits = int(name.split()[1][4:])
        row: dict[str, Any] = {"case": name, "backend": be, "log2_d": log2d, "d": d, "ms": t * 1e3,
                               "mbps": 4.0 * d / t / 1e6, "identical": identical[bits]}
        if name.endswith("fused"):
            row["speedup_vs_three_pass"] = best[(f"hop eden{bits} three-pass", be)] / t
        if name.endswith("floor"):
            # no frame comes out of the floor: nothing to compare; its ratio is the ceiling of any fused hop
            row["identical"] = None
            row["ceiling_vs_three_pass"] = best[(f"hop eden{bits} three-pass", be)] / t
        rows.append(row)
    return rows


def floor_fn(own: np.ndarray, bits: int) -> Callable[[], object]:
    """The arithmetic every hop that is bit-identical to decode + add + encode must run, and nothing else:
    the incoming frame's inverse rotation and the sum's forward rotation (signs, FWHT, scale: the same
    in-place kernel twice on a vector that is already in place) and the codec's quantizer and packing on
    the rotated sum (codec.finish, one rotation, no `auto` statistic). No unpacking, lookup, addition,
    copy, allocation of the input, moment pass or frame parsing: a lower bound on the hop's time."""
    kern = accel.kernels()
    assert kern is not None
    y = np.zeros(1 << (own.size - 1).bit_length(), np.float32)
    y[: own.size] = own

    def run() -> object:
        kern._rotate_into(y, y, 3, 0)
        ny2 = kern._rotate_into(y, y, 9, 0)
        # finish reads y and leaves it as it was (a normal-range vector is not rescaled)
        return codec.finish(y, ny2, 1, False, False, "eden-unbiased", float(bits), 9, kern,
                            np.dtype(np.float32), (own.size,))

    return run


def partial_fn(frame: bytes, own: np.ndarray, bits: int, path: str) -> Callable[[], object]:
    return partial(hop.hop, frame, own, "eden-unbiased", bits, 9, path=path)


def render_hop(rows: list[dict[str, Any]]) -> str:
    out = [f"{'case':<26} {'d':>5} {'ms':>8} {'MB/s':>7} {'vs 3-pass':>9} {'identical':>9}"]
    for r in rows:
        sp = f"{r['speedup_vs_three_pass']:.2f}x" if "speedup_vs_three_pass" in r else ""
        if "ceiling_vs_three_pass" in r:
            sp = f"<={r['ceiling_vs_three_pass']:.2f}x"
        same = "-" if r["identical"] is None else "yes" if r["identical"] else "NO"
        out.append(f"{r['case']:<26} {'2^' + str(r['log2_d']):>5} {r['ms']:>8.2f} {r['mbps']:>7.0f} {sp:>9} "
                   f"{same:>9}")
    return "\n".join(out)


def render(rows: list[dict[str, Any]]) -> str:
    head = (f"{'case':<20} {'backend':<7} {'d':>5} {'ms':>8} {'MB/s':>7} {'x copy':>7} {'vs textbook':>11} "
            f"{'vs numpy':>8}")
    out = [head]
    for r in rows:
        tb = f"{r['speedup_vs_textbook']:.1f}x" if "speedup_vs_textbook" in r else ""
        vn = f"{r['speedup_vs_numpy']:.1f}x" if "speedup_vs_numpy" in r else ""
        d = "2^" + str(r["log2_d"])
        out.append(
            f"{r['case']:<20} {r['backend']:<7} {d:>5} {r['ms']:>8.2f} {r['mbps']:>7.0f} "
            f"{r['x_copy']:>7.1f} {tb:>11} {vn:>8}".rstrip()
        )
    return "\n".join(out)


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    res = []
    at20 = {(r["case"], r["backend"]): r for r in rows if r["log2_d"] == 20}
    for (case, be), r in at20.items():
        if case in ("eden4 encode rot=1", "eden4 decode"):
            v = r["mbps"]
            res.append({"target": f"{case} [{be}] >= {TARGET_EDEN_MBPS:.0f} MB/s at d=2^20", "value": v,
                        "pass": v >= TARGET_EDEN_MBPS})
    for r in rows:
        if r["case"] == "rht":
            v = r["speedup_vs_textbook"]
            name = f"rht [{r['backend']}] >= {TARGET_RHT_SPEEDUP:.0f}x textbook at d=2^{r['log2_d']}"
            res.append({"target": name, "value": v, "pass": v >= TARGET_RHT_SPEEDUP})
        if "speedup_vs_three_pass" in r:
            v = r["speedup_vs_three_pass"]
            res.append({"target": f"{r['case']} >= {TARGET_HOP_SPEEDUP}x three-pass, bit-identical at "
                                  f"d=2^{r['log2_d']}", "value": v,
                        "pass": v >= TARGET_HOP_SPEEDUP and bool(r["identical"])})
        if ("speedup_vs_numpy" in r and r["case"].startswith("eden") and "rot=1" not in r["case"]
                and r["log2_d"] >= 20):
            v = r["speedup_vs_numpy"]
            res.append({"target": f"{r['case']} [{r['backend']}] >= {TARGET_NUMBA_SPEEDUP:.0f}x numpy at "
                                  f"d=2^{r['log2_d']}", "value": v, "pass": v >= TARGET_NUMBA_SPEEDUP})
    return res


def _numba_version() -> str | None:
    try:
        import numba
    except ImportError:
        return None
    return str(numba.__version__)


def _fwht_paths() -> dict[str, bool | None]:
    """The numba kernels' switches as this process compiled them (None without numba)."""
    try:
        from mrc.quant import kernels
    except ImportError:
        return {"fwht_simd": None, "fwht_vertical": None}
    return {"fwht_simd": bool(kernels.SIMD), "fwht_vertical": bool(kernels.VERTICAL)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="20,22", help="comma list of log2(d)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma list of numpy, numba")
    ap.add_argument("-j", "--json", action="store_true", help="print only the JSON document")
    ap.add_argument("--no-hop", action="store_true", help="skip the three-pass vs fused hop rows")
    args = ap.parse_args()
    pinned = _pin()
    backends = tuple(b for b in args.backends.split(",") if b)
    if "numba" in backends and accel.kernels("numba") is None:
        backends = tuple(b for b in backends if b != "numba")
    rows: list[dict[str, Any]] = []
    for s in (int(v) for v in args.sizes.split(",")):
        if not args.json:
            print(f"measuring d=2^{s} ...", file=sys.stderr)
        rows.extend(measure(s, args.rounds if s < 24 else max(3, args.rounds // 2), backends))
    hop_rows: list[dict[str, Any]] = []
    if "numba" in backends and not args.no_hop:
        for s in (int(v) for v in args.sizes.split(",")):
            if not args.json:
                print(f"measuring hop d=2^{s} ...", file=sys.stderr)
            hop_rows.extend(measure_hop(s, args.rounds if s < 24 else max(3, args.rounds // 2)))
    doc: dict[str, Any] = {
        "bench": "quant",
        "machine": {"python": platform.python_version(), "numpy": np.__version__,
                    "processor": platform.processor() or platform.machine(), "pinned": pinned,
                    "numba": _numba_version(), "blas_threads": os.environ["OPENBLAS_NUM_THREADS"],
                    # which FWHT kernels ran (side-by-side runs of MRC_FWHT_SIMD / MRC_FWHT_VERTICAL)
                    **_fwht_paths()},
        "rows": rows,
        "hop_rows": hop_rows,
        "targets": targets(rows + hop_rows),
    }
    if not args.json:
        print(render(rows))
        if hop_rows:
            print(render_hop(hop_rows))
        for t in doc["targets"]:
            print(f"target: {t['target']}: {'PASS' if t['pass'] else 'FAIL'} ({t['value']:.1f})")
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
