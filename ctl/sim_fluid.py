"""`mrcctl sim fluid`: the flow-level model at the papers' scale (mrc.sim.fluid; docs/sim.md "Fluid model").

    mrcctl sim fluid permutation [--hosts 8192] [--planes 8] [--evs 128] [--seed S] [-j]
    mrcctl sim fluid alltoall [--hosts 8192] [--rounds 8] ...
    mrcctl sim fluid failures [--hosts 8192] [--scenario links:0.001,links:0.01,links:0.05,spine,plane]
                              [--draws 1] ...
    mrcctl sim fluid step-tail [--hosts 8192] [--scenario links:0.01] [--draws 100] [--plot FILE] ...

The fabric is the full two-tier Clos of radix k per plane for --hosts = k*k/2 (8,192, 32,768, 131,072),
or --leaves/--spines/--hosts-per-leaf, or --cluster FILE (deploy/topologies/cluster/*.toml). Rates are
max-min fair; what the model leaves out is listed in every result (`not_modelled`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from mrc.errors import UsageError

from .output import PLOT_SUFFIXES, Output, json_option, output_file, table

_F = TypeVar("_F", bound=Callable[..., Any])


def _fabric(
    hosts: int, planes: int, leaves: int | None, spines: int | None, hpl: int | None, cluster: str | None
) -> Any:
    from mrc import topology
    from mrc.sim import fluid_exp
    from mrc.sim.cluster import load_cluster
    from mrc.sim.fluid import FluidFabric

    try:
        if cluster:
            return load_cluster(topology.example_path(cluster, "cluster"))[0]
        if leaves or spines or hpl:
            if not (leaves and spines and hpl):
                raise UsageError("give --leaves, --spines and --hosts-per-leaf together")
            return FluidFabric(planes, leaves, spines, hpl)
        return fluid_exp.clos(hosts, planes)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _common(f: _F) -> _F:
    opts = [
        click.option(
            "--hosts",
            default=8192,
            show_default=True,
            type=int,
            help="Hosts = k*k/2 for a radix-k two-tier Clos per plane (8192, 32768, 131072).",
        ),
        click.option("--planes", default=8, show_default=True, type=click.IntRange(1, 16)),
        click.option(
            "--leaves", default=None, type=int, help="Explicit shape (with --spines, --hosts-per-leaf)."
        ),
        click.option("--spines", default=None, type=int),
        click.option("--hosts-per-leaf", "hpl", default=None, type=int),
        click.option(
            "--cluster",
            default=None,
            type=click.Path(dir_okay=False),
            help="A cluster file; a bare name that is not a file here is the shipped example of that name "
            "(cluster-8k.toml, cluster-32k.toml, cluster-131k.toml: deploy/topologies/cluster/ of a "
            "checkout).",
        ),
        click.option("--variants", default="ecmp,mrc", show_default=True),
        click.option(
            "--evs",
            default=128,
            show_default=True,
            type=click.IntRange(1, 1 << 14),
            help="EVs per MRC QP (spread over planes, then spines).",
        ),
        click.option("--seed", default=1, show_default=True, type=click.IntRange(0, 2**32 - 1)),
    ]
    for o in reversed(opts):
        f = o(f)
    return json_option(f)  # -j / -p after the verb too, as every other verb takes them


def _variants(text: str) -> tuple[str, ...]:
    from mrc.sim.fluid_exp import VARIANTS

    vs = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in vs if v not in VARIANTS]
    if bad or not vs or len(set(vs)) != len(vs):
        raise UsageError(f"variants: each of {', '.join(VARIANTS)} at most once, got {text!r}")
    return vs


@click.group("fluid")
def fluid_cmd() -> None:
    """Flow-level (max-min fair) model of 8k-131k-host fabrics: ECMP vs MRC."""


def _head(doc: dict[str, Any]) -> str:
    c = doc["config"]
    return (
        f"fluid {doc['experiment']}: {c['hosts']:,} hosts, {c['planes']} planes x {c['leaves']} leaves x "
        f"{c['spines']} spines ({c['hosts_per_leaf']} hosts per leaf), MRC {c['evs']} EVs; seed {c['seed']}"
    )


def _foot(doc: dict[str, Any]) -> str:
    return f"wall {doc['wall_s']:.1f} s, peak RSS {doc['peak_rss_mb']:.0f} MB; not modelled: " + "; ".join(
        doc["not_modelled"]
    )


def _f4(x: Any) -> str:
    return "-" if x is None else f"{x:.4f}"


def _report(doc: dict[str, Any], rows: list[dict[str, Any]], columns: list[tuple[str, str]],
            head: str = "", note: str | None = None) -> str:
    """The text form every fluid experiment shares: its header line, an optional note, the table of
    `rows` under `columns` (key, heading), and the footer (wall time, memory, what is not modelled)."""
    lines = [_head(doc) + head, ""]
    if note:
        lines.append(note)
    return "\n".join([*lines, table(rows, columns), _foot(doc)])


def _per_variant(doc: dict[str, Any], fields: dict[str, str]) -> list[dict[str, Any]]:
    """One row per variant: `fields` maps a column key to the result key shown with 4 decimals, then
    the variant's wall time."""
    return [{"v": v, **{k: _f4(r[src]) for k, src in fields.items()}, "wall": f"{r['wall_s']:.1f}"}
            for v, r in doc["results"].items()]


def _render_perm(doc: dict[str, Any]) -> str:
    rows = _per_variant(doc, {"cap": "capacity_fraction", "min": "flow_fraction_min",
                              "p01": "flow_fraction_p01", "p50": "flow_fraction_p50",
                              "max": "flow_fraction_max"})
    return _report(doc, rows, [("v", "VARIANT"), ("cap", "OF CAPACITY"), ("min", "FLOW MIN"),
                               ("p01", "FLOW P1"), ("p50", "FLOW P50"), ("max", "FLOW MAX"),
                               ("wall", "WALL S")])


@fluid_cmd.command("permutation")
@_common
@click.pass_obj
def perm_cmd(
    out: Output,
    hosts: int,
    planes: int,
    leaves: int | None,
    spines: int | None,
    hpl: int | None,
    cluster: str | None,
    variants: str,
    evs: int,
    seed: int,
) -> None:
    """Every host sends to another (random derangement), long-lived: capacity and per-flow rates."""
    from mrc.sim import fluid_exp

    fab = _fabric(hosts, planes, leaves, spines, hpl, cluster)
    doc = fluid_exp.permutation(fab, _variants(variants), seed, evs, progress=out.progress)
    out.emit(doc, _render_perm)


@fluid_cmd.command("alltoall")
@_common
@click.option(
    "--rounds",
    default=8,
    show_default=True,
    type=click.IntRange(1, 1024),
    help="Pairwise-exchange rounds sampled (of N-1).",
)
@click.pass_obj
def a2a_cmd(
    out: Output,
    hosts: int,
    planes: int,
    leaves: int | None,
    spines: int | None,
    hpl: int | None,
    cluster: str | None,
    variants: str,
    evs: int,
    seed: int,
    rounds: int,
) -> None:
    """All-to-all as pairwise exchange (round k: host i -> i+k): capacity and round efficiency."""
    from mrc.sim import fluid_exp

    fab = _fabric(hosts, planes, leaves, spines, hpl, cluster)
    doc = fluid_exp.alltoall(fab, _variants(variants), seed, evs, rounds, progress=out.progress)

    def render(doc: dict[str, Any]) -> str:
        rows = _per_variant(doc, {"cap": "capacity_fraction", "eff": "round_efficiency",
                                  "worst": "worst_round_min"})
        return _report(doc, rows, [("v", "VARIANT"), ("cap", "OF CAPACITY"), ("eff", "ROUND EFFICIENCY"),
                                   ("worst", "WORST ROUND MIN"), ("wall", "WALL S")])

    out.emit(doc, render)


@fluid_cmd.command("failures")
@_common
@click.option(
    "--scenario",
    default="links:0.001,links:0.01,links:0.05,spine,plane",
    show_default=True,
    help="Comma-separated: links:F (fraction of leaf-spine links), spine, plane.",
)
@click.option("--draws", default=1, show_default=True, type=click.IntRange(1, 1000))
@click.pass_obj
def failures_cmd(
    out: Output,
    hosts: int,
    planes: int,
    leaves: int | None,
    spines: int | None,
    hpl: int | None,
    cluster: str | None,
    variants: str,
    evs: int,
    seed: int,
    scenario: str,
    draws: int,
) -> None:
    """The permutation under random link failures, a spine down, a plane down: MRC deny vs ECMP rehash."""
    from mrc.sim import fluid_exp

    fab = _fabric(hosts, planes, leaves, spines, hpl, cluster)
    scs = tuple(s.strip() for s in scenario.split(",") if s.strip())
    try:
        doc = fluid_exp.failures(fab, scs, _variants(variants), seed, evs, draws, progress=out.progress)
    except ValueError as e:
        raise UsageError(str(e)) from None

    def render(doc: dict[str, Any]) -> str:
        rows = [{"sc": sc["scenario"], "failed": sc["failed"], "v": v, "cap": _f4(r["capacity_fraction"]),
                 "min": _f4(r["flow_fraction_min"]), "half": f"{r['flows_below_half']:g}"}
                for sc in doc["scenarios"] for v, r in sc["results"].items()]
        return _report(doc, rows, [("sc", "SCENARIO"), ("failed", "FAILED"), ("v", "VARIANT"),
                                   ("cap", "OF CAPACITY"), ("min", "FLOW MIN"), ("half", "FLOWS < 1/2")])

    out.emit(doc, render)


@fluid_cmd.command("step-tail")
@_common
@click.option(
    "--scenario", default="links:0.01", show_default=True, help="Failures per draw (none for none)."
)
@click.option("--draws", default=100, show_default=True, type=click.IntRange(1, 10000))
@click.option("--plot", "plot_path", default=None, callback=output_file("plot", PLOT_SUFFIXES),
              help="Write the slowdown CDF as a PNG (.png, .pdf or .svg).")
@click.pass_obj
def tail_cmd(
    out: Output,
    hosts: int,
    planes: int,
    leaves: int | None,
    spines: int | None,
    hpl: int | None,
    cluster: str | None,
    variants: str,
    evs: int,
    seed: int,
    scenario: str,
    draws: int,
    plot_path: str | None,
) -> None:
    """Ring all-reduce step time (= slowest flow) over failure draws: ECMP vs MRC, with a CDF."""
    from mrc.sim import fluid_exp

    fab = _fabric(hosts, planes, leaves, spines, hpl, cluster)
    try:
        doc = fluid_exp.step_tail(fab, _variants(variants), seed, evs, draws, scenario, progress=out.progress)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if plot_path:
        doc["plot"] = fluid_exp.plot_step_tail(doc, plot_path)

    def render(doc: dict[str, Any]) -> str:
        rows = [{"v": v, "p50": _f4(r["slowdown_p50"]), "p90": _f4(r["slowdown_p90"]),
                 "p99": _f4(r["slowdown_p99"]), "max": _f4(r["slowdown_max"]), "stalled": r["stalled_draws"]}
                for v, r in doc["results"].items()]
        return _report(
            doc, rows, [("v", "VARIANT"), ("p50", "P50"), ("p90", "P90"), ("p99", "P99"), ("max", "MAX"),
                        ("stalled", "STALLED DRAWS")],
            head=f"; {doc['config']['scenario']}, {doc['config']['draws']} draws",
            note="step slowdown = line-rate step time / slowest flow's (ring all-reduce over all hosts)",
        )

    out.emit(doc, render)
