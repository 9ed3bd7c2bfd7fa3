"""Shared by the ring all-reduce tests: per-rank inputs and an in-process run that checks that every
rank got the same result."""

from __future__ import annotations

import numpy as np

from mrc.collective import Config, Result, allreduce, run_inproc


def ring_inputs(n: int, length: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(length).astype(np.float32) for _ in range(n)]


def ring_run(xs: list[np.ndarray], cfg: Config, step: int = 0) -> list[Result]:
    res = run_inproc(len(xs), lambda t: allreduce(t, xs[t.rank], cfg, step))
    for r in res[1:]:
        assert np.array_equal(r.out, res[0].out), "ranks disagree"
    return res
