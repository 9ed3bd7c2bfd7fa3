"""PNG plots of the experiments' documents (needs the optional `plot` extra: matplotlib)."""

from __future__ import annotations

from typing import Any

from mrc.errors import MrcError


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or MrcError saying which extra installs it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MrcError("plotting needs matplotlib: pip install 'mrc[plot]'") from None
    return plt


def plot(doc: dict[str, Any], path: str) -> str:
    """Write the experiment's figure to `path` (PNG) and return the path."""
    plt = pyplot()
    exp = doc["experiment"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    res = doc["results"]
    if exp == "permutation":
        for v, r in res.items():
            fr = r["flow_fractions"]
            ys = [(i + 1) / len(fr) for i in range(len(fr))]
            ax.step(fr, ys, where="post", label=f"{v}: {r['capacity_fraction']:.1%} of capacity")
        if "ecmp" in res and "derived_expected" in res["ecmp"]:
            ax.axvline(res["ecmp"]["derived_expected"], ls=":", c="gray",
                       label=f"ECMP derived mean {res['ecmp']['derived_expected']:.1%}")
        ax.set_xlabel("per-host throughput / host capacity")
        ax.set_ylabel("fraction of hosts (CDF)")
        ax.set_xlim(0, 1.05)
        cfg = doc["config"]["fabric"]
        ax.set_title(f"Permutation, {cfg['leaves'] * cfg['hosts_per_leaf']} hosts, {cfg['planes']} planes "
                     f"x {cfg['spines']} spines")
    elif exp == "failover":
        tl = doc["timeline"]
        b = tl["bin_s"] * 1e3
        for v, series in tl["goodput_fraction"].items():
            ax.plot([i * b for i in range(len(series))], series, label=v, lw=1.2)
        cfg = doc["config"]
        ax.axvline(cfg["fail_ns"] / 1e6, c="red", ls="--", lw=0.8, label=f"{'-'.join(cfg['link'])} down")
        if cfg.get("heal_ns"):
            ax.axvline(cfg["heal_ns"] / 1e6, c="green", ls="--", lw=0.8, label="link up")
        req = next(iter(res.values()))["required_fraction"]
        ax.axhline(req, c="gray", ls=":", lw=0.8, label=f"(1 - failed share) x 90% = {req:.2f}")
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("goodput / capacity")
        ax.set_ylim(0, 1.05)
        ax.set_title("Failover: leaf-spine link failure during a bulk transfer")
    elif exp == "incast":
        for v, done in doc["completion_s"].items():
            xs = [d * 1e6 for d in done]
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            r = res[v]
            ax.step(xs, ys, where="post", label=f"{v}: p99 {r['p99_s'] * 1e6:.0f} us, {r['rto_count']} RTOs")
        ax.set_xlabel("message completion time (us)")
        ax.set_ylabel("fraction of senders (CDF)")
        cfg = doc["config"]
        ax.set_title(f"Incast {cfg['senders']}->1, {cfg['size_bytes'] // 1024} KiB each")
    else:
        raise MrcError(f"no plot for experiment {exp!r}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
