"""`mrcctl allreduce`: compressed all-reduce between ranks (DESIGN.md §9, docs/collective.md).

    mrcctl allreduce --ranks N --size S [--bits B] [--scheme SCHEME] [--partial-sums naive|aware]
                     [--algorithm ring|oneshot] [--iters K] [--dist iid|correlated]
                     [--correlation RHO] [--seed S]
                     [--transport inproc] [-j]

Prints one row per iteration — time, algbw and busbw (nccl-tests definitions), bytes on the wire (all
ranks), vNMSE against the exact float64 mean — and a summary row. `--transport inproc` runs the ranks as
threads of this process (the only transport so far; ranks over the testbed through mrcd will be another
value of the same option, with the same output).
"""

from __future__ import annotations

import re
from typing import Any

import click

from mrc.collective import ALGORITHMS, COMPRESSIONS, PARTIAL_SUMS, Config
from mrc.collective import bench as cbench
from mrc.errors import UsageError

from .cmd_quant import json_option
from .output import Output, table

TRANSPORTS = ("inproc",)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes: 1048576, 4K, 64M, 1G, 64MiB (binary units); a whole number of float32 elements."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise UsageError(f"--size: {text!r} is not a size (e.g. 4096, 64K, 16M, 1G)")
    n = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if n != int(n) or int(n) % 4:
        raise UsageError(f"--size: {text} is not a whole number of float32 elements (multiple of 4 bytes)")
    if not 4 <= n <= 1 << 34:
        raise UsageError(f"--size: {text} outside 4 B .. 16 GiB")
    return int(n)


def _g(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render(doc: dict[str, Any]) -> str:
    c = doc["config"]
    head = (
        f"allreduce ranks={c['ranks']} size={c['size_bytes']} B scheme={c['scheme']}"
        + (f" bits={c['bits']:g} partial-sums={c['partial_sums']}" if c["scheme"] != "none" else "")
        + f" algorithm={c['algorithm']} transport={c['transport']} dist={c['dist']}"
    )
    if c.get("bits_per_hop"):
        head += "\nbits per hop: " + " ".join(f"{b:g}" for b in c["bits_per_hop"])
    rows = []
    for r in doc["iterations"]:
        rows.append({
            "iter": r["iter"],
            "time": _g(r["time_s"] and r["time_s"] * 1e3, ".2f"),
            "algbw": _g(r["algbw_gbps"], ".4g"),
            "busbw": _g(r["busbw_gbps"], ".4g"),
            "wire": r["wire_bytes"] if r["wire_bytes"] is not None else "-",
            "vnmse": _g(r["vnmse"], ".4g"),
            "down": r["failed_link_down"],
            "error": r.get("error", ""),
        })
    s = doc["summary"]
    rows.append({
        "iter": "median", "time": _g(s["median_time_s"] and s["median_time_s"] * 1e3, ".2f"),
        "algbw": "", "busbw": _g(s["median_busbw_gbps"], ".4g"),
        "wire": _g(s["mean_wire_bytes"], ".0f"), "vnmse": _g(s["mean_vnmse"], ".4g") + " (mean)",
        "down": "", "error": f"errors={s['errors']}",
    })
    cols = [("iter", "ITER"), ("time", "TIME_ms"), ("algbw", "ALGBW_GB/s"), ("busbw", "BUSBW_GB/s"),
            ("wire", "WIRE_B"), ("vnmse", "vNMSE"), ("down", "LINK_DOWN"), ("error", "")]
    return head + "\n" + table(rows, cols)


@click.command("allreduce")
@click.option("--ranks", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--size", "size_text", default="4M", show_default=True, help="Buffer bytes per rank (float32).")
@click.option("--bits", type=click.FloatRange(0, 8, min_open=True), default=2.0, show_default=True)
@click.option("--scheme", type=click.Choice(COMPRESSIONS), default="eden-unbiased", show_default=True)
@click.option("--partial-sums", type=click.Choice(PARTIAL_SUMS), default="aware", show_default=True)
@click.option("--algorithm", type=click.Choice(ALGORITHMS), default="ring", show_default=True,
              help="ring: reduce-scatter + all-gather; oneshot: all-gather of compressed buffers.")
@click.option("--iters", type=click.IntRange(1, 100_000), default=5, show_default=True)
@click.option("--dist", type=click.Choice(cbench.DISTS), default="iid", show_default=True,
              help="Per-rank input buffers: independent, or half of the energy shared.")
@click.option("--correlation", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="aware: assumed pairwise correlation of the ranks' buffers (sizes the per-hop budgets).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--transport", type=click.Choice(TRANSPORTS), default="inproc", show_default=True)
@json_option
@click.pass_obj
def allreduce(
    out: Output, ranks: int, size_text: str, bits: float, scheme: str, partial_sums: str, algorithm: str,
    iters: int, dist: str, correlation: float, seed: int, transport: str,
) -> None:
    """All-reduce of a float32 buffer across ranks with compressed chunks: time, bandwidth, wire bytes,
    error against the exact mean."""
    size = parse_size(size_text)
    cfg = Config(scheme, float(bits), partial_sums, algorithm, seed=seed, correlation=correlation)
    runner = cbench.InProcRunner()
    out.progress(f"allreduce: {ranks} ranks, {size} B, {scheme}, {iters} iterations ({transport})")
    doc = cbench.run(runner, ranks, size, cfg, iters, dist=dist, seed=seed, progress=out.progress)
    out.emit(doc, render)
    if doc["summary"]["errors"]:
        raise click.exceptions.Exit(1)
