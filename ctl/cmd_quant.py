"""`mrcctl quant`: gradient compression for operators (docs/design.md §8, docs/quant.md).

    mrcctl quant [show] [-j]                    schemes, budgets, asymptotic vNMSE at b = 1..4
    mrcctl quant bench [--schemes S,...] [--bits 1,2,3,4] [--dim N] [--trials T]
                       [--dist gauss|lognormal|spike|two-spikes] [--rotations 1|2|3|auto]
                       [--clients N] [--seed S] [-j]
    mrcctl quant codebook [--bits B] [-j]      the Lloyd–Max codebook of N(0,1) the codec uses

`bench` prints, per (scheme, bits), the vNMSE (mean of ||x - x_hat||^2 / ||x||^2) with its standard
error next to the asymptotic theory, the wire bytes per vector, the bits per coordinate actually sent
(header included), and encode/decode MB/s of float32 input. Combinations a scheme does not take
(drive at b != 1, TurboQuant at fractional b) are left out. `--clients N` adds the error of the average
of N compressed vectors (independent seeds per client).
"""

from __future__ import annotations

from typing import Any

import click

from mrc.errors import UsageError
from mrc.quant import bench as qbench
from mrc.quant import codec as qcodec
from mrc.quant.codec import MIN_BITS
from mrc.quant.lloydmax import MAX_BITS, codebook

from .output import Output, json_option, table


def _csv(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"--{what} needs at least one value")
    return items


def parse_bits(text: str) -> list[float]:
    out = []
    for item in _csv(text, "bits"):
        try:
            b = float(item)
        except ValueError:
            raise UsageError(f"--bits: {item!r} is not a number") from None
        if not MIN_BITS <= b <= MAX_BITS:
            raise UsageError(f"--bits: {item} is outside [{MIN_BITS}, {MAX_BITS}]")
        out.append(int(b) if b == int(b) else b)
    return out


def parse_schemes(text: str) -> list[str]:
    if text == "all":
        return list(qbench.SCHEMES)
    names = _csv(text, "schemes")
    for n in names:
        if n not in qbench.SCHEMES:
            raise UsageError(f"--schemes: unknown scheme {n!r} (known: {', '.join(qbench.SCHEMES)})")
    return names


def parse_rotations(text: str) -> int | str:
    if text == "auto":
        return "auto"
    if text in ("1", "2", "3"):
        return int(text)
    raise UsageError(f"--rotations must be 1, 2, 3 or auto, got {text!r}")


_COLUMNS = [
    ("scheme", "SCHEME"),
    ("bits", "BITS"),
    ("rot", "ROT"),
    ("vnmse_pm", "vNMSE ± SE"),
    ("theory", "THEORY"),
    ("wire_bytes", "WIRE_B"),
    ("bits_per_coord", "BITS/COORD"),
    ("encode_mbps", "ENC_MB/s"),
    ("decode_mbps", "DEC_MB/s"),
]
_CLIENT_COLUMNS = [("mean_pm", "MEAN_NMSE ± SE"), ("mean_theory", "MEAN_THEORY")]


def _fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def render_bench(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    rows = []
    for r in doc["rows"]:
        rows.append({
            **r,
            "rot": f"{r['rotations']}" + (f"->{r['rotations_used']}" if r["rotations"] == "auto" else ""),
            "vnmse_pm": f"{_fmt(r['vnmse'])} ± {_fmt(r['vnmse_stderr'], 2)}",
            "theory": _fmt(r["theory"]),
            "bits_per_coord": f"{r['bits_per_coord']:.3f}",
            "encode_mbps": _fmt(r["encode_mbps"], 3),
            "decode_mbps": _fmt(r["decode_mbps"], 3),
            "mean_pm": f"{_fmt(r.get('mean_nmse'))} ± {_fmt(r.get('mean_nmse_stderr'), 2)}",
            "mean_theory": _fmt(r.get("mean_theory")),
        })
    columns = _COLUMNS + (_CLIENT_COLUMNS if cfg.get("clients") else [])
    head = (
        f"dim={cfg['dim']} dist={cfg['dist']} trials={cfg['trials']} rotations={cfg['rotations']}"
        + (f" clients={cfg['clients']}" if cfg.get("clients") else "")
    )
    notes = sorted({f"turboquant-prod sketch: {r['sketch']}" for r in doc["rows"] if "sketch" in r})
    return "\n".join([head, table(rows, columns), *notes])


@click.group(invoke_without_command=True)
def quant() -> None:
    """Gradient compression: RHT + EDEN, DRIVE, TurboQuant baselines."""


_BUDGETS = {
    "eden-unbiased": "0 < b <= 8",
    "eden-biased": "0 < b <= 8",
    "drive": "b = 1",
    "turboquant-mse": "integer 1..8",
    "turboquant-prod": "integer 1..8",
}


@quant.command("show")
@json_option
@click.pass_obj
def show(out: Output) -> None:
    """Schemes, the budgets they take and their asymptotic vNMSE at b = 1..4 (the default verb)."""
    rows = []
    for scheme in qbench.SCHEMES:
        row: dict[str, Any] = {"scheme": scheme, "budgets": _BUDGETS[scheme]}
        for b in (1, 2, 3, 4):
            row[f"theory_b{b}"] = qbench.theory(scheme, b)
        rows.append(row)
    doc = {"schemes": rows, "codec_version": qcodec.VERSION}

    def render(d: dict[str, Any]) -> str:
        cells = []
        for r in d["schemes"]:
            c = dict(r)
            for b in (1, 2, 3, 4):
                v = r[f"theory_b{b}"]
                c[f"t{b}"] = "-" if v is None else f"{v:.4g}"
            cells.append(c)
        cols = [("scheme", "SCHEME"), ("budgets", "BITS"), ("t1", "vNMSE@1"), ("t2", "vNMSE@2"),
                ("t3", "vNMSE@3"), ("t4", "vNMSE@4")]
        return f"codec v{d['codec_version']}; asymptotic vNMSE (docs/quant.md)\n" + table(cells, cols)

    out.emit(doc, render)


@quant.command("bench")
@click.option("--schemes", default="all", show_default=True, help="Comma list, or 'all'.")
@click.option("--bits", "bits_text", default="1,2,3,4", show_default=True, help="Comma list, b > 0.")
@click.option("--dim", type=click.IntRange(1, 1 << 28), default=1 << 16, show_default=True)
@click.option("--trials", type=click.IntRange(1, 1_000_000), default=10, show_default=True)
@click.option("--dist", type=click.Choice(qbench.DISTS), default="gauss", show_default=True)
@click.option("--rotations", "rot_text", default="auto", show_default=True, help="1, 2, 3 or auto.")
@click.option("--clients", type=click.IntRange(1, 100_000), default=None, help="Mean estimation, N clients.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@json_option
@click.pass_obj
def bench(
    out: Output, schemes: str, bits_text: str, dim: int, trials: int, dist: str, rot_text: str,
    clients: int | None, seed: int,
) -> None:
    """vNMSE, wire size and speed per (scheme, bits)."""
    names = parse_schemes(schemes)
    bits = parse_bits(bits_text)
    rotations = parse_rotations(rot_text)
    rows = qbench.run(
        names, bits, dim, trials, dist=dist, rotations=rotations, clients=clients, seed=seed,
        progress=out.progress,
    )
    if not rows:
        raise UsageError("no (scheme, bits) combination is valid: drive takes b=1, TurboQuant integer b")
    config = {
        "schemes": names, "bits": bits, "dim": dim, "trials": trials, "dist": dist,
        "rotations": rotations, "clients": clients, "seed": seed,
    }
    out.emit({"config": config, "rows": rows}, render_bench)


@quant.command("codebook")
@click.option("--bits", type=click.IntRange(1, MAX_BITS), default=2, show_default=True)
@json_option
@click.pass_obj
def codebook_cmd(out: Output, bits: int) -> None:
    """The b-bit Lloyd–Max codebook of N(0,1) (computed by Lloyd's algorithm)."""
    cb = codebook(bits)
    doc = {
        "bits": bits,
        "distortion": cb.distortion,
        "iterations": cb.iterations,
        "centroids": cb.centroids.tolist(),
        "boundaries": cb.boundaries.tolist(),
        "probabilities": cb.probabilities.tolist(),
    }

    def render(d: dict[str, Any]) -> str:
        rows = [
            {"k": k, "c": f"{c:.6f}", "p": f"{p:.6f}",
             "t": f"{d['boundaries'][k]:.6f}" if k < len(d["boundaries"]) else "inf"}
            for k, (c, p) in enumerate(zip(d["centroids"], d["probabilities"], strict=True))
        ]
        head = f"bits={d['bits']} D_b={d['distortion']:.6g} (Lloyd iterations: {d['iterations']})"
        return head + "\n" + table(rows, [("k", "K"), ("c", "CENTROID"), ("p", "PROB"), ("t", "UPPER_EDGE")])

    out.emit(doc, render)
