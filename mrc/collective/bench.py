"""Measurement behind `mrcctl allreduce`: per-iteration time, algbw/busbw, wire bytes and vNMSE of an
all-reduce, independent of the carrier. A `Runner` runs one all-reduce of given per-rank buffers and
reports the per-rank results and the elapsed time; `InProcRunner` runs the ranks as threads of this
process. A runner for ranks on the testbed (through mrcd) plugs in here without changing the report.

nccl-tests definitions: algbw = S / t (S = buffer bytes per rank), busbw = algbw * 2 (n - 1) / n.
vNMSE = ||result - exact||^2 / ||exact||^2 with the exact float64 mean of the ranks' buffers.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from mrc.errors import MrcError

from .ring import Config, Result, allreduce, vnmse
from .transport import run_inproc

DISTS = ("iid", "correlated")
F32 = npt.NDArray[np.float32]


class Runner(Protocol):
    name: str

    def run(self, buffers: list[F32], cfg: Config, step: int) -> tuple[list[Result], float, bool]:
        """(per-rank results, seconds, whether a link was down during it)."""
        ...


class InProcRunner:
    name = "inproc"

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s

    def run(self, buffers: list[F32], cfg: Config, step: int) -> tuple[list[Result], float, bool]:
        t0 = time.perf_counter()
        res = run_inproc(len(buffers), lambda t: allreduce(t, buffers[t.rank], cfg, step), self.timeout_s)
        return res, time.perf_counter() - t0, False


class HierInProcRunner:
    """The ranks as `hosts` groups of threads (host-major: rank h * L + r is local rank r of host h) running
    the hierarchical all-reduce (`hier.allreduce_hier`: reduce to each host's leader, compressed ring
    between the leaders, broadcast). A rank's `wire_bytes` are its inter-host bytes (what crosses the
    network); `intra_bytes` what it moved within its host."""

    name = "inproc-hier"

    def __init__(
        self, hosts: int, intra: str = "none", intra_bits: float = 8.0, timeout_s: float = 300.0
    ) -> None:
        self.hier_hosts = hosts
        self.intra = intra
        self.intra_bits = intra_bits
        self.timeout_s = timeout_s

    def run(self, buffers: list[F32], cfg: Config, step: int) -> tuple[list[Result], float, bool]:
        from .hier import simulate

        t0 = time.perf_counter()
        res = simulate(buffers, self.hier_hosts, cfg, step, self.intra, self.intra_bits, self.timeout_s)
        secs = time.perf_counter() - t0
        out = [Result(r.out, r.inter_bytes, bits_per_hop=r.bits_per_hop) for r in res]
        self.intra_bytes = sum(r.intra_bytes for r in res)
        return out, secs, False


def make_inputs(n: int, elements: int, dist: str, seed: int, step: int,
                out: list[F32] | None = None) -> list[F32]:
    """n per-rank gradient buffers: `iid` N(0, I) each; `correlated`: (g + e_i) / sqrt(2) with g shared —
    half of each rank's energy common to all ranks, as data-parallel gradients are. `out`: n float32
    buffers of `elements` to fill instead of new ones (the same values: `run` keeps one set across its
    iterations, rather than fresh memory the kernel zeroes page by page each time)."""
    rng = np.random.default_rng((seed, step & 0xFFFFFFFFFFFFFFFF))
    if dist not in DISTS:
        raise MrcError(f"unknown input distribution {dist!r} (known: {', '.join(DISTS)})")
    if out is None:
        out = [np.empty(elements, np.float32) for _ in range(n)]
    elif len(out) != n or any(b.dtype != np.float32 or b.shape != (elements,) for b in out):
        raise MrcError(f"make_inputs: out must be {n} float32 buffers of {elements} elements")
    if dist == "iid":
        for b in out:
            rng.standard_normal(dtype=np.float32, out=b)
        return out
    g = rng.standard_normal(elements, dtype=np.float32)
    for b in out:
        rng.standard_normal(dtype=np.float32, out=b)
        b += g
        b *= np.float32(1 / math.sqrt(2))
    return out


def exact_mean(buffers: list[F32], out: npt.NDArray[np.float64] | None = None) -> npt.NDArray[np.float64]:
    """The float64 mean of the buffers (into `out` when given: a float64 buffer of their length)."""
    acc = np.zeros(buffers[0].size if buffers else 0) if out is None else out
    acc.fill(0.0)
    for b in buffers:
        acc += b
    acc /= max(len(buffers), 1)
    return acc


def run(
    runner: Runner, ranks: int, size_bytes: int, cfg: Config, iters: int, dist: str = "iid", seed: int = 0,
    progress: Callable[[str], None] | None = None, warmup: int = 1,
) -> dict[str, Any]:
    """The `mrcctl allreduce` document: config, iterations, summary. `warmup` iterations run first, at
    the full size, and are not reported (compiled kernels, caches, threads, and the first touch of every
    page of the ranks' buffers and the shared regions: a 64 MiB warm-up of 2^16 elements left the first
    measured iteration over MRC 1.3-1.5x the others, 4.0 against 2.7 s uncompressed), as in nccl-tests."""
    elements = size_bytes // 4
    for w in range(warmup):
        # steps from the top of the 64-bit range down: rotations and inputs no measured iteration uses
        step = (1 << 64) - 1 - w
        runner.run(make_inputs(ranks, elements, dist, seed, step), cfg, step)
    rows: list[dict[str, Any]] = []
    errors = 0
    buffers: list[F32] | None = None
    exact: npt.NDArray[np.float64] | None = None
    for it in range(iters):
        buffers = make_inputs(ranks, elements, dist, seed, it, out=buffers)
        exact = exact_mean(buffers, out=exact)
        try:
            res, secs, down = runner.run(buffers, cfg, it)
        except MrcError as e:
            errors += 1
            rows.append({"iter": it, "time_s": None, "algbw_gbps": None, "busbw_gbps": None,
                         "wire_bytes": None, "vnmse": None, "failed_link_down": False, "error": str(e)})
            if progress:
                progress(f"iter {it}: error: {e}")
            continue
        out = res[0].out if cfg.average else res[0].out / ranks
        algbw = size_bytes / secs / 1e9 if secs > 0 else math.inf
        row = {
            "iter": it,
            "time_s": secs,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (ranks - 1) / ranks,
            "wire_bytes": sum(r.wire_bytes for r in res),
            "vnmse": vnmse(out, exact),
            "failed_link_down": down,
        }
        intra = getattr(runner, "intra_bytes", None)
        if intra is not None:  # a hierarchical run: what stayed within the hosts, apart
            row["intra_host_bytes"] = intra
        rows.append(row)
        if progress:
            progress(f"iter {it}: {secs * 1e3:.1f} ms  vNMSE {row['vnmse']:.4g}")
    ok = [r for r in rows if r["time_s"] is not None]
    summary = {
        "median_time_s": statistics.median(r["time_s"] for r in ok) if ok else None,
        "median_busbw_gbps": statistics.median(r["busbw_gbps"] for r in ok) if ok else None,
        "mean_vnmse": statistics.fmean(r["vnmse"] for r in ok) if ok else None,
        "mean_wire_bytes": statistics.fmean(r["wire_bytes"] for r in ok) if ok else None,
        "errors": errors,
    }
    config = {
        "transport": runner.name, "ranks": ranks, "size_bytes": size_bytes, "elements": elements,
        "iters": iters, "warmup": warmup, "dist": dist, "seed": seed, **asdict(cfg),
    }
    # (a runner over testbed hosts has a `hosts` list: the hierarchy's attribute has its own name)
    hosts: int | None = getattr(runner, "hier_hosts", None)
    if hosts is not None:
        config["hier_hosts"] = hosts  # wire_bytes: between hosts; intra_host_bytes: within them
    if cfg.scheme != "none" and cfg.algorithm == "ring":
        from .schedule import aware_bits

        config["bits_per_hop"] = (
            list(aware_bits(cfg.scheme, float(cfg.bits), hosts or ranks, cfg.correlation))
            if cfg.partial_sums == "aware"
            else [float(cfg.bits)] * (hosts or ranks)
        )
    return {"config": config, "iterations": rows, "summary": summary}
