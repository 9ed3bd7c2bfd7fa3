"""The experiments of `mrcctl sim fluid` on the fluid model (`mrc.sim.fluid`; docs/sim.md, "Fluid model").

Each returns a JSON-ready document (``experiment``, ``config``, ``results`` by variant, ``wall_s``,
``peak_rss_mb``, and ``not_modelled``: what the fluid model leaves out of that experiment). Rates are
fractions of a host's capacity (planes × port rate), so 1.0 is a host at line rate on every plane; the
packet simulator's figures are fractions of payload capacity, the same quantity.

Variants: ``ecmp`` (one connection per plane, hashed per flow; after a failure rehashed over the
surviving spines: routing has reconverged) and ``mrc`` (one QP spraying over its EVs; EVs through a failed
link denied by the controller). The synchronous-step tail is the papers' headline argument: a
data-parallel step waits for its slowest flow, so at scale the worst hash collision or the worst failure
anywhere sets the step time.
"""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable
from typing import Any, Final

import numpy as np

from . import fluid as fl

VARIANTS: Final = ("ecmp", "mrc")
NOT_MODELLED: Final = (
    "queues, ECN and trimming",
    "reroute time (deny is instant; ECMP reconvergence is an input)",
    "retransmissions",
    "congestion-control dynamics (rates are exactly max-min fair)",
    "ACK traffic",
)
Progress = Callable[[str], None]


def clos(hosts: int, planes: int = 8) -> fl.FluidFabric:
    """The full two-tier Clos of radix k per plane for `hosts` = k²/2: k leaves of k/2 hosts and k/2
    spines (8,192 hosts: radix 128; 32,768: 256; 131,072: radix 512, the papers' cluster)."""
    k = math.isqrt(2 * hosts)
    if k * k != 2 * hosts or k % 2:
        raise ValueError(
            f"{hosts} hosts is not k*k/2 for an even radix k (8192, 32768, 131072, ...): "
            "give leaves, spines and hosts per leaf instead"
        )
    return fl.FluidFabric(planes, k, k // 2, k // 2)


def _rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _stats(frac: np.ndarray) -> dict[str, Any]:
    s = np.sort(frac)
    n = len(s)
    return {
        "capacity_fraction": round(float(s.mean()), 4),
        "flow_fraction_min": round(float(s[0]), 4),
        "flow_fraction_p01": round(float(s[min(n - 1, n // 100)]), 4),
        "flow_fraction_p50": round(float(s[n // 2]), 4),
        "flow_fraction_max": round(float(s[-1]), 4),
    }


def solve(
    fab: fl.FluidFabric,
    state: fl.LinkState,
    variant: str,
    src: np.ndarray,
    dst: np.ndarray,
    seed: int,
    evs: int = 128,
    view: fl.LinkState | None = None,
    hash_mode: str = "auto",
    steer_rounds: int = 0,
    finite: bool = False,
) -> np.ndarray:
    """Per-flow rates as fractions of a host's capacity for one variant. With `finite`, ECMP's rate of
    a finite transfer: its bytes are split evenly over its per-plane connections (`Traffic`), so it
    ends with its slowest connection: P × min over connections (0 if one has no path)."""
    if variant == "ecmp":
        inc = fl.ecmp_connections(fab, state, src, dst, seed, view=view, hash_mode=hash_mode)
        rc = fl.maxmin(inc, state.cap)
        if finite:
            return np.asarray(rc.reshape(len(src), fab.planes).min(axis=1), dtype=np.float64)
        return fl.flow_rates(inc, rc) / fab.planes
    if variant == "mrc":
        paths = fl.mrc_paths(fab, src, dst, evs, seed)
        rate, _ = fl.mrc_rates(fab, state, src, dst, paths, steer_rounds=steer_rounds)
        return rate / fab.planes
    raise ValueError(f"unknown variant {variant!r} (one of {', '.join(VARIANTS)})")


def _config(fab: fl.FluidFabric, **kw: Any) -> dict[str, Any]:
    return {
        "planes": fab.planes,
        "leaves": fab.leaves,
        "spines": fab.spines,
        "hosts_per_leaf": fab.hosts_per_leaf,
        "hosts": fab.hosts,
        "links": fab.links,
        **kw,
    }


def permutation(
    fab: fl.FluidFabric,
    variants: tuple[str, ...] = VARIANTS,
    seed: int = 1,
    evs: int = 128,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every host sends one long-lived flow to another (a random derangement)."""
    t0 = time.perf_counter()
    src = np.arange(fab.hosts, dtype=np.int64)
    dst = fl.derangement(fab.hosts, np.random.default_rng(seed))
    state = fl.LinkState(fab)
    results = {}
    for v in variants:
        t = time.perf_counter()
        if progress:
            progress(f"fluid permutation {v}: {fab.hosts} hosts x {fab.planes} planes ...")
        r = solve(fab, state, v, src, dst, seed, evs)
        results[v] = {**_stats(r), "wall_s": round(time.perf_counter() - t, 2)}
    return {
        "experiment": "permutation",
        "config": _config(fab, seed=seed, evs=evs),
        "results": results,
        "wall_s": round(time.perf_counter() - t0, 2),
        "peak_rss_mb": _rss_mb(),
        "not_modelled": list(NOT_MODELLED),
    }


def alltoall(
    fab: fl.FluidFabric,
    variants: tuple[str, ...] = VARIANTS,
    seed: int = 1,
    evs: int = 128,
    rounds: int = 8,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """An all-to-all as the pairwise exchange of collective libraries: N − 1 rounds, in round k host i
    sends to (i + k) mod N, each round waiting for its slowest flow. All N² flows at once cannot be
    enumerated at this scale (17 G flows at 131k hosts); `rounds` rounds with k drawn at random stand
    for the N − 1. Per variant: the mean capacity over the rounds and the round efficiency, the mean of
    each round's slowest flow (what the synchronous rounds deliver)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    ks = rng.choice(np.arange(1, fab.hosts), size=min(rounds, fab.hosts - 1), replace=False)
    src = np.arange(fab.hosts, dtype=np.int64)
    state = fl.LinkState(fab)
    results: dict[str, Any] = {}
    for v in variants:
        t = time.perf_counter()
        caps, mins = [], []
        for i, k in enumerate(ks.tolist()):
            if progress:
                progress(f"fluid all-to-all {v}: round {i + 1}/{len(ks)} (shift {k}) ...")
            r = solve(fab, state, v, src, (src + k) % fab.hosts, seed + i, evs)
            caps.append(float(r.mean()))
            mins.append(float(r.min()))
        results[v] = {
            "capacity_fraction": round(float(np.mean(caps)), 4),
            "round_efficiency": round(float(np.mean(mins)), 4),
            "worst_round_min": round(min(mins), 4),
            "wall_s": round(time.perf_counter() - t, 2),
        }
    return {
        "experiment": "alltoall",
        "config": _config(fab, seed=seed, evs=evs, rounds=[int(k) for k in ks]),
        "results": results,
        "wall_s": round(time.perf_counter() - t0, 2),
        "peak_rss_mb": _rss_mb(),
        "not_modelled": list(NOT_MODELLED),
    }


SCENARIOS: Final = ("links:0.001", "links:0.01", "links:0.05", "spine", "plane")


def apply_failure(state: fl.LinkState, scenario: str, rng: np.random.Generator) -> str:
    """Fail what `scenario` names: ``links:F`` (a fraction F of the leaf-spine links, uniformly),
    ``spine`` (one spine of one plane, drawn), ``plane`` (one plane, drawn). A description."""
    fab = state.fabric
    if scenario.startswith("links:"):
        try:
            frac = float(scenario.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"scenario {scenario!r}: links:F takes a fraction") from None
        if not 0 <= frac <= 1:
            raise ValueError(f"scenario {scenario!r}: the fraction must be in [0, 1]")
        k = state.fail_random(frac, rng)
        return f"{k} of {fab.planes * fab.leaves * fab.spines} leaf-spine links"
    if scenario == "spine":
        p, s = int(rng.integers(fab.planes)), int(rng.integers(fab.spines))
        state.fail_spine(p, s)
        return f"spine p{p}s{s}"
    if scenario == "plane":
        p = int(rng.integers(fab.planes))
        state.fail_plane(p)
        return f"plane {p}"
    raise ValueError(f"unknown scenario {scenario!r} (links:F, spine, plane)")


def failures(
    fab: fl.FluidFabric,
    scenarios: tuple[str, ...] = SCENARIOS,
    variants: tuple[str, ...] = VARIANTS,
    seed: int = 1,
    evs: int = 128,
    draws: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The permutation under failures, per scenario and variant, averaged over `draws` failure draws:
    MRC with the controller's deny (EVs through failed links carry nothing, the rest share the flow);
    ECMP after reconvergence (flows of failed links rehashed onto the surviving spines), and before it
    (``ecmp_before_reconvergence``: connections hashed onto a failed link, data or ACKs, stall). A
    connection on a plane that is down has no route in any view: it stalls for good."""
    t0 = time.perf_counter()
    src = np.arange(fab.hosts, dtype=np.int64)
    dst = fl.derangement(fab.hosts, np.random.default_rng(seed))
    healthy = fl.LinkState(fab)
    rows: list[dict[str, Any]] = []
    for sc in scenarios:
        acc: dict[str, list[np.ndarray]] = {}
        what = ""
        stalled: list[int] = []
        for d in range(draws):
            st = fl.LinkState(fab)
            what = apply_failure(st, sc, np.random.default_rng([seed, d]))
            if progress:
                progress(f"fluid failures {sc} draw {d + 1}/{draws}: {what} ...")
            for v in variants:
                acc.setdefault(v, []).append(solve(fab, st, v, src, dst, seed, evs))
            if "ecmp" in variants:
                r = solve(fab, st, "ecmp", src, dst, seed, evs, view=healthy)
                acc.setdefault("ecmp_before_reconvergence", []).append(r)
                stalled.append(int((r < 1.0 / fab.planes - 1e-9).sum()))
        res: dict[str, Any] = {}
        for v, rs in acc.items():
            res[v] = {
                "capacity_fraction": round(float(np.mean([r.mean() for r in rs])), 4),
                "flow_fraction_min": round(float(np.min([r.min() for r in rs])), 4),
                "flows_below_half": round(float(np.mean([(r < 0.5).sum() for r in rs])), 1),
            }
        rows.append({"scenario": sc, "failed": what if draws == 1 else f"{what} (last draw)", "results": res})
    return {
        "experiment": "failures",
        "config": _config(fab, seed=seed, evs=evs, draws=draws),
        "scenarios": rows,
        "wall_s": round(time.perf_counter() - t0, 2),
        "peak_rss_mb": _rss_mb(),
        "not_modelled": list(NOT_MODELLED),
    }


def step_tail(
    fab: fl.FluidFabric,
    variants: tuple[str, ...] = VARIANTS,
    seed: int = 1,
    evs: int = 128,
    draws: int = 100,
    scenario: str = "links:0.01",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """A data-parallel ring all-reduce over every host: ranks placed on hosts in a random order (a job
    spread over the cluster by its scheduler), each of the 2(N − 1) ring steps sends one chunk from every
    rank to the next, all at once, and waits for the slowest. Every step has the same flows, so the
    all-reduce time is 2(N − 1) × chunk / (the slowest flow's rate): its slowdown against line rate is
    1 / (slowest flow's fraction). Per draw a new failure draw (`scenario`; ``none`` for none) and a new
    ECMP hash key. Rates are those at the start of a step (a flow does not speed up when faster ones
    finish: an upper bound on the step, exact when the slowest flow's bottleneck carries only flows as
    slow as it). A draw in which some flow has no path at all (ECMP with a plane down) stalls: its
    slowdown is infinite (reported as null)."""
    t0 = time.perf_counter()
    order = np.random.default_rng(seed).permutation(fab.hosts).astype(np.int64)
    src = order
    dst = np.roll(order, -1)
    slow: dict[str, list[float]] = {v: [] for v in variants}
    for d in range(draws):
        st = fl.LinkState(fab)
        if scenario != "none":
            apply_failure(st, scenario, np.random.default_rng([seed, d, 7]))
        if progress and (d % 10 == 0 or d == draws - 1):
            progress(f"fluid step-tail draw {d + 1}/{draws} ...")
        for v in variants:
            r = solve(fab, st, v, src, dst, seed * 1_000_003 + d, evs, finite=True)
            m = float(r.min())
            slow[v].append(math.inf if m <= 0 else 1.0 / m)
    results = {}
    for v, xs in slow.items():
        a = np.array(xs)
        fin = a[np.isfinite(a)]

        def q(x: float, a: np.ndarray = a) -> float | None:
            y = float(np.quantile(a, x)) if len(a) else math.inf
            return round(y, 4) if math.isfinite(y) else None

        results[v] = {
            "slowdown_p50": q(0.5),
            "slowdown_p90": q(0.9),
            "slowdown_p99": q(0.99),
            "slowdown_max": q(1.0),
            "stalled_draws": int((~np.isfinite(a)).sum()),
            "slowdown_mean_finite": round(float(fin.mean()), 4) if len(fin) else None,
        }
    return {
        "experiment": "step-tail",
        "config": _config(fab, seed=seed, evs=evs, draws=draws, scenario=scenario, collective="ring"),
        "results": results,
        "slowdowns": {
            v: [None if not math.isfinite(x) else round(x, 4) for x in xs] for v, xs in slow.items()
        },
        "wall_s": round(time.perf_counter() - t0, 2),
        "peak_rss_mb": _rss_mb(),
        "not_modelled": [*NOT_MODELLED, "flows speeding up as others finish (the step is an upper bound)"],
    }


def plot_step_tail(doc: dict[str, Any], path: str) -> str:
    """The CDF of the step slowdown per variant (matplotlib, imported here: an optional extra)."""
    from .plot import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4))
    for v, xs in doc["slowdowns"].items():
        fin = sorted(x for x in xs if x is not None)
        if fin:
            ys = np.arange(1, len(fin) + 1) / len(xs)
            ax.step(fin, ys, where="post", label=f"{v} ({len(xs) - len(fin)} stalled)")
    c = doc["config"]
    ax.set_xlabel("ring all-reduce step time / line-rate step time")
    ax.set_ylabel("fraction of draws")
    ax.set_title(f"{c['hosts']:,} hosts x {c['planes']} planes, {c['scenario']}, {c['draws']} draws")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
