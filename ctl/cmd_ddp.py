"""`mrcctl ddp`: PyTorch DDP training whose gradients cross MRC (docs/collective.md §6).

    mrcctl ddp train [--ranks N] [--steps K] [--batch B] [--lr LR] [--bits B] [--scheme SCHEME]
                     [--partial-sums naive|aware] [--correlation RHO] [--start-iter I] [--error-feedback]
                     [--seed S] [--transport mrc|gloo] [--compare/--no-compare] [--timeout S]
                     [-n TESTBED] [-j]

One DDP rank process per testbed host (ctl/ddp_rank.py: a gloo process group on 127.0.0.1, the
compressed ring of `mrc_hook` over an MrcTransport through the host's mrcd) trains a small MLP on its own
data shard; with `--compare` (default) the same ranks first train it with plain DDP from the same initial
weights. Prints the global loss of every step, the gap to plain DDP, the wire bytes each rank posted and
whether the parameters ended bit-identical on every rank (exit status 1 when not).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import click

from mrc.collective import COMPRESSIONS, PARTIAL_SUMS
from mrc.errors import MrcError

from .cmd_testbed import name_option
from .output import Output, json_option, table


@click.group()
def ddp() -> None:
    """PyTorch DDP over MRC ranks: train."""


def _render(doc: dict[str, Any]) -> str:
    c, s = doc["config"], doc["summary"]
    head = (f"ddp train ranks={c['ranks']} hosts={','.join(c['hosts'])} steps={c['steps']} "
            f"scheme={c['scheme']} bits={c['bits']:g} partial-sums={c['partial_sums']} "
            f"start-iter={c['start_iter']} error-feedback={'yes' if c['error_feedback'] else 'no'} "
            f"transport={c['transport']}")
    rows = []
    for r in doc["steps"]:
        rows.append({"step": r["step"], "loss": f"{r['loss']:.6f}",
                     "base": "-" if r["loss_ddp"] is None else f"{r['loss_ddp']:.6f}",
                     "gap": "-" if r["gap"] is None else f"{r['gap'] * 100:+.3f}"})
    cols = [("step", "STEP"), ("loss", "LOSS_HOOK"), ("base", "LOSS_DDP"), ("gap", "GAP_%")]
    lines = [head, table(rows, cols), ""]
    h = doc["hooked"]
    lines.append(f"wire bytes per rank {h['wire_bytes']} ({h['messages']} MRC messages), train "
                 f"{h['time_s']:.2f} s; parameters identical on every rank: "
                 f"{'yes' if s['params_identical'] else 'NO'}")
    if s["max_gap"] is not None:
        lines.append(f"largest per-step gap {s['max_gap'] * 100:.3f} %, last-20 mean ratio "
                     f"{s['tail_ratio']:.4f} (plain DDP train {doc['baseline']['time_s']:.2f} s)")
    return "\n".join(lines)


def _run(name: str | None, ranks: int, timeout_s: float, compare: bool, cfg: dict[str, Any],
         progress: Any) -> dict[str, Any]:
    from mrc.dataplane import testbed as tbmod
    from mrc.dataplane.collective import torch_available

    if not torch_available():
        raise MrcError("mrcctl ddp needs torch (torch.distributed); make setup installs torch==2.13.0")
    from .ddp_rank import DdpRanks

    testbed = tbmod.resolve_name(name)
    progress(f"ddp train: {ranks} ranks on testbed {testbed}, {cfg['steps']} steps")
    with DdpRanks(testbed, ranks, timeout_s=timeout_s, progress=progress) as group:
        base = group.train(**{**cfg, "hook": False}) if compare else None
        hooked = group.train(**{**cfg, "hook": True})
    losses = hooked["ranks"][0]["losses"]
    ref = base["ranks"][0]["losses"] if base is not None else [None] * len(losses)
    steps = [{"step": i, "loss": y, "loss_ddp": x, "gap": None if x is None else (y - x) / x}
             for i, (x, y) in enumerate(zip(ref, losses, strict=True))]
    gaps = [abs(r["gap"]) for r in steps if r["gap"] is not None]
    tail = None if base is None else sum(losses[-20:]) / sum(ref[-20:])
    identical = hooked["params_identical"] and (base is None or base["params_identical"])
    return {
        "config": {"testbed": testbed, "hosts": group.hosts, "ranks": ranks, **hooked["config"]},
        "steps": steps,
        "hooked": {k: [a[k] for a in hooked["ranks"]] for k in ("wire_bytes", "messages")}
        | {"time_s": hooked["ranks"][0]["time_s"], "params_identical": hooked["params_identical"]},
        "baseline": None if base is None else {"time_s": base["ranks"][0]["time_s"],
                                               "params_identical": base["params_identical"]},
        "summary": {"max_gap": max(gaps) if gaps else None, "tail_ratio": tail,
                    "wire_bytes": sum(a["wire_bytes"] for a in hooked["ranks"]),
                    "params_identical": identical},
    }


@ddp.command("train")
@click.option("--ranks", type=click.IntRange(2, 1024), default=2, show_default=True,
              help="Rank processes, one per testbed host.")
@click.option("--steps", type=click.IntRange(1, 1_000_000), default=60, show_default=True)
@click.option("--batch", type=click.IntRange(1, 1 << 20), default=64, show_default=True,
              help="Samples per rank and step.")
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=0.1, show_default=True)
@click.option("--bits", type=click.FloatRange(0, 8, min_open=True), default=4.0, show_default=True)
@click.option("--scheme", type=click.Choice(COMPRESSIONS), default="eden-unbiased", show_default=True)
@click.option("--partial-sums", type=click.Choice(PARTIAL_SUMS), default="aware", show_default=True)
@click.option("--correlation", type=click.FloatRange(0, 1), default=0.0, show_default=True)
@click.option("--start-iter", type=click.IntRange(0), default=2, show_default=True,
              help="Warm-up iterations with the process group's uncompressed all_reduce.")
@click.option("--error-feedback", is_flag=True, help="Carry each rank's quantization residual forward.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=7, show_default=True)
@click.option("--transport", type=click.Choice(["mrc", "gloo"]), default="mrc", show_default=True,
              help="Where the compressed ring runs: MRC (the hosts' mrcds) or the gloo process group.")
@click.option("--compare/--no-compare", default=True, show_default=True,
              help="Also train with plain DDP (same ranks, same initial weights) and report the gap.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 3600), default=120.0, show_default=True,
              help="A rank gives up waiting for a peer after this many seconds.")
@name_option
@json_option
@click.pass_obj
def train(out: Output, ranks: int, steps: int, batch: int, lr: float, bits: float, scheme: str,
          partial_sums: str, correlation: float, start_iter: int, error_feedback: bool, seed: int,
          transport: str, compare: bool, timeout_s: float, name: str | None) -> None:
    """Train a small model with DDP on ranks over MRC: loss per step against plain DDP, wire bytes."""
    cfg = {"steps": steps, "batch": batch, "lr": lr, "bits": bits, "scheme": scheme,
           "partial_sums": partial_sums, "correlation": correlation, "start_iter": start_iter,
           "error_feedback": error_feedback, "seed": seed, "transport": transport}
    # SIGTERM (a script's trap) ends the run like Ctrl-C: the rank processes are ended by PID
    main_pid = os.getpid()

    def on_term(_sig: int, _frame: object) -> None:
        if os.getpid() != main_pid:  # a forked helper ends as by default
            os._exit(128 + signal.SIGTERM)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        doc = _run(name, ranks, timeout_s, compare, cfg, out.progress)
    finally:
        signal.signal(signal.SIGTERM, old)
    out.emit(doc, _render)
    if not doc["summary"]["params_identical"]:
        raise MrcError("the parameters differ between ranks after training")
