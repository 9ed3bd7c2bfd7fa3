"""`mrcctl ddp`: PyTorch DDP training whose gradients cross MRC (docs/collective.md §6).

    mrcctl ddp train [--ranks N] [--steps K] [--batch B] [--lr LR] [--bits B] [--scheme SCHEME]
                     [--partial-sums naive|aware] [--correlation RHO] [--start-iter I] [--error-feedback]
                     [--seed S] [--transport mrc|gloo] [--compare/--no-compare] [--timeout S]
                     [-n TESTBED] [-j]

    mrcctl ddp bench [--task digits|text|all] [--hooks H,H,...] [--ranks N] [--transport inproc|mrc]
                     [--digits-steps K] [--text-steps K] [--warmup I] [--seed S] [--scheme SCHEME]
                     [--target-acc A] [--target-loss L] [--plot PNG] [--timeout S] [-n TESTBED] [-j]

`train`: one DDP rank process per testbed host (ctl/ddp_rank.py: a gloo process group on 127.0.0.1, the
compressed ring of `mrc_hook` over an MrcTransport through the host's mrcd) trains a small MLP on its own
data shard; with `--compare` (default) the same ranks first train it with plain DDP from the same initial
weights. Prints the global loss of every step, the gap to plain DDP, the wire bytes each rank posted and
whether the parameters ended bit-identical on every rank (exit status 1 when not).

`bench`: time-to-accuracy on real data (mrc.collective.train_compare): scikit-learn's digits and a byte-level
transformer on the standard library's source, each trained once per hook (torch's fp32 / fp16 / PowerSGD,
mrc's EDEN) from the same seeds and weights, on local rank processes (`--transport inproc`) or one rank per
testbed host with mrc's ring over MRC (`--transport mrc`). Table, JSON (-j) and a PNG (--plot).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import click

from mrc.collective import COMPRESSIONS, PARTIAL_SUMS
from mrc.collective.train_compare import DEFAULT_HOOKS, DEFAULTS, default_target, plot, render
from mrc.errors import MrcError

from .cmd_testbed import name_option
from .output import PLOT_SUFFIXES, Output, json_option, output_file, table


@click.group()
def ddp() -> None:
    """PyTorch DDP over MRC ranks: train, bench (hooks on real data)."""


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
        raise MrcError("mrcctl ddp needs torch (torch.distributed): pip install 'mrc[torch]' (make setup "
                       "installs torch==2.13.0)")
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


def run_bench(transport: str, ranks: int, tasks: list[str], hooks: list[str], cfg: dict[str, Any],
              targets: dict[str, float], *, name: str | None = None, timeout_s: float = 120.0,
              progress: Any = lambda _m: None) -> dict[str, Any]:
    """Train every task with every hook on `ranks` rank processes (local, or one per testbed host with
    mrc's ring over MRC); the report of mrc.collective.train_compare (`summarize` per task)."""
    from mrc.collective import train_compare as tc
    from mrc.dataplane.collective import torch_available

    if not torch_available():
        raise MrcError("mrcctl ddp bench needs torch (torch.distributed): pip install 'mrc[torch]' (make "
                       "setup installs torch==2.13.0)")
    if transport not in ("inproc", "mrc"):
        raise MrcError(f"transport {transport!r}: inproc or mrc")
    for h in hooks:
        tc.config(**{**cfg, "hook": h})  # every hook name and option checked before any process starts
    from .ddp_rank import DdpRanks

    testbed = None
    if transport == "mrc":
        from mrc.dataplane import testbed as tbmod

        testbed = tbmod.resolve_name(name)
    slot = max(tc.model_params(tc.config(**{**cfg, "task": t})) for t in tasks)
    progress(f"ddp bench: {ranks} ranks ({'testbed ' + testbed if testbed else 'local'}), tasks "
             f"{', '.join(tasks)}, {len(hooks)} hooks")
    docs = []
    with DdpRanks(testbed, ranks, timeout_s=timeout_s, slot_params=slot, progress=progress) as group:
        for task in tasks:
            runs: dict[str, list[dict[str, Any]]] = {}
            for hook in hooks:
                run_cfg = tc.config(**{**cfg, "task": task, "hook": hook})
                steps = int(run_cfg[f"{task}_steps"])
                # a stall fails inside a rank within its timeout; the run itself scales with the steps
                limit = 2 * timeout_s + 10.0 * steps
                runs[hook] = group.compare(run_cfg, mrc=transport == "mrc", limit_s=limit)
                r0 = runs[hook][0]
                progress(f"  {task} {hook}: {r0['evals'][-1]['metric']:.4f} after {steps} steps, "
                         f"{r0['time_s']:.1f} s")
            docs.append(tc.summarize(task, {**cfg, "task": task}, runs, targets[task]))
        hosts = group.hosts
    digits = next((d for d in docs if d["task"] == "digits"), None)
    return {
        "config": {"transport": transport, "ranks": ranks, "hosts": hosts, "testbed": testbed,
                   "tasks": tasks, "hooks": hooks, **{k: cfg.get(k, v) for k, v in tc.DEFAULTS.items()
                                                       if k not in ("task", "hook")}},
        "tasks": docs,
        "acceptance": tc.acceptance(digits) if digits is not None else None,
    }


@ddp.command("bench")
@click.option("--task", "task", type=click.Choice(["digits", "text", "all"]), default="all",
              show_default=True)
@click.option("--hooks", default=",".join(DEFAULT_HOOKS), show_default=True,
              help="Comma-separated: fp32, fp16, powersgd-r<R>, mrc-fp32, eden<B>-<naive|aware>[-ef].")
@click.option("--ranks", type=click.IntRange(2, 64), default=2, show_default=True)
@click.option("--transport", type=click.Choice(["inproc", "mrc"]), default="inproc", show_default=True,
              help="inproc: rank processes on this machine (gloo on 127.0.0.1, mrc's ring over gloo p2p); "
                   "mrc: one rank per testbed host, mrc's ring over MRC (torch's hooks over gloo).")
@click.option("--digits-steps", type=click.IntRange(1), default=DEFAULTS["digits_steps"], show_default=True)
@click.option("--digits-batch", type=click.IntRange(1), default=DEFAULTS["digits_batch"], show_default=True,
              help="Images per rank and step.")
@click.option("--digits-lr", type=click.FloatRange(0, min_open=True), default=DEFAULTS["digits_lr"],
              show_default=True)
@click.option("--text-steps", type=click.IntRange(1), default=DEFAULTS["text_steps"], show_default=True)
@click.option("--text-batch", type=click.IntRange(1), default=DEFAULTS["text_batch"], show_default=True,
              help="Windows per rank and step.")
@click.option("--text-lr", type=click.FloatRange(0, min_open=True), default=DEFAULTS["text_lr"],
              show_default=True)
@click.option("--text-dim", type=click.IntRange(8), default=DEFAULTS["text_dim"], show_default=True)
@click.option("--text-layers", type=click.IntRange(1), default=DEFAULTS["text_layers"], show_default=True)
@click.option("--text-context", type=click.IntRange(2), default=DEFAULTS["text_context"], show_default=True)
@click.option("--text-bytes", type=click.IntRange(10_000), default=DEFAULTS["text_bytes"], show_default=True,
              help="Bytes of standard-library source (sorted by file name); the last tenth validates.")
@click.option("--warmup", type=click.IntRange(2), default=DEFAULTS["warmup"], show_default=True,
              help="Uncompressed iterations before PowerSGD and mrc's hooks compress.")
@click.option("--eval-every", type=click.IntRange(1), default=DEFAULTS["eval_every"], show_default=True)
@click.option("--scheme", type=click.Choice([c for c in COMPRESSIONS if c != "none"]),
              default=DEFAULTS["scheme"], show_default=True, help="The codec of the eden* hooks.")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=DEFAULTS["seed"], show_default=True)
@click.option("--target-acc", type=click.FloatRange(0, 1), default=default_target("digits"),
              show_default=True, help="digits: the test accuracy whose first step and time are reported.")
@click.option("--target-loss", type=click.FloatRange(0, min_open=True), default=default_target("text"),
              show_default=True, help="text: the validation loss whose first step and time are reported.")
@click.option("--plot", "plot_path", default=None, callback=output_file("plot", PLOT_SUFFIXES),
              help="Write a PNG: metric vs wire bytes and vs time, a line per hook.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 3600), default=120.0, show_default=True,
              help="A rank gives up waiting for a peer after this many seconds.")
@name_option
@json_option
@click.pass_obj
def bench(out: Output, task: str, hooks: str, ranks: int, transport: str, digits_steps: int,
          digits_batch: int, digits_lr: float, text_steps: int, text_batch: int, text_lr: float,
          text_dim: int, text_layers: int, text_context: int, text_bytes: int, warmup: int, eval_every: int,
          scheme: str, seed: int, target_acc: float, target_loss: float, plot_path: str | None,
          timeout_s: float, name: str | None) -> None:
    """Time-to-accuracy of gradient compression hooks on real data (digits images, stdlib text)."""
    hook_list = [h.strip() for h in hooks.split(",") if h.strip()]
    if not hook_list:
        raise MrcError("--hooks: at least one hook")
    cfg = {"digits_steps": digits_steps, "digits_batch": digits_batch, "digits_lr": digits_lr,
           "text_steps": text_steps, "text_batch": text_batch, "text_lr": text_lr, "text_dim": text_dim,
           "text_layers": text_layers, "text_context": text_context, "text_bytes": text_bytes,
           "warmup": warmup, "eval_every": eval_every, "scheme": scheme, "seed": seed}
    tasks = ["digits", "text"] if task == "all" else [task]
    main_pid = os.getpid()

    def on_term(_sig: int, _frame: object) -> None:
        if os.getpid() != main_pid:
            os._exit(128 + signal.SIGTERM)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        doc = run_bench(transport, ranks, tasks, hook_list, cfg, {"digits": target_acc, "text": target_loss},
                        name=name, timeout_s=timeout_s, progress=out.progress)
    finally:
        signal.signal(signal.SIGTERM, old)
    if plot_path:
        plot(doc, plot_path)
        doc["plot"] = plot_path
    out.emit(doc, render)
    bad = [f"{t['task']}/{r['hook']}" for t in doc["tasks"] for r in t["rows"] if not r["params_identical"]]
    if bad:
        raise MrcError(f"the parameters differ between ranks after training: {', '.join(bad)}")
