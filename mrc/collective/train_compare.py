"""Time-to-accuracy of DDP gradient compression on real data (`mrcctl ddp bench`, docs/collective.md).

Two tasks, both from data every machine already has (no downloads):

* ``digits``: scikit-learn's bundled 8x8 ``load_digits`` images (1,797 samples), a fixed stratified
  train/test split by seed, an MLP 64-H-H-10 trained with SGD + momentum; metric: test accuracy.
* ``text``: a byte-level transformer (causal self-attention, ~1 M parameters by default) on the Python
  standard library's own ``*.py`` files (``sysconfig.get_paths()["stdlib"]``, sorted by name, a fixed byte
  budget; the last tenth is the validation text), trained with AdamW; metric: validation loss (nats/byte).

Each is trained once per hook, every hook from the same seeds, initial weights and per-rank data order:
``fp32`` (torch's ``allreduce_hook``), ``fp16`` (torch's ``fp16_compress_hook``), ``powersgd-r1`` /
``powersgd-r4`` (torch's ``powerSGD_hook`` with its ``PowerSGDState``, error feedback and warm start on),
``mrc-fp32`` (mrc's ring uncompressed: the time baseline over the same transport as the mrc hooks) and
``eden<B>-<naive|aware>[-ef]`` (``mrc_hook`` at B bits, the partial-sum strategy, error feedback).

Wire bytes, one convention for every hook — what this rank sends per step: the bytes of every tensor a
torch hook hands to ``dist.all_reduce`` are counted while training (fp32 = 4·numel, fp16 = 2·numel,
PowerSGD = the uncompressed 1-D tensors plus 4·(P + Q) — exactly what the hook allreduces, counted rather
than re-derived) and multiplied by 2(n−1)/n, the share a rank sends in a ring all-reduce of n ranks; mrc's
hook reports the codec frames it actually posted (``MrcHookState.wire_bytes``), and its warm-up
iterations' uncompressed all_reduce is counted like fp32's.

torch and scikit-learn are imported lazily, inside the functions that need them: `mrc.collective` never
imports either (docs/design.md §2). Processes, the process group and the transports are the caller's
(ctl/ddp_rank.py): this module only trains one rank and summarises the ranks' answers.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from mrc.errors import UsageError

from .ring import COMPRESSIONS

if TYPE_CHECKING:
    import torch

TASKS: Final = ("digits", "text")
DEFAULT_HOOKS: Final = (
    "fp32", "fp16", "powersgd-r1", "powersgd-r4", "mrc-fp32",
    "eden4-naive", "eden4-aware", "eden4-aware-ef", "eden2-naive", "eden2-aware", "eden2-aware-ef",
)
# Every option of one training run, with its default. The digits defaults reach ~97% test accuracy in
# 300 steps of 32 samples per rank; the text defaults (~1.0 M parameters, 200 steps) run in minutes on
# two cores and show the loss curves separating, not a converged model.
DEFAULTS: Final[dict[str, Any]] = {
    "task": "digits", "hook": "fp32", "seed": 7, "warmup": 2, "scheme": "eden-unbiased",
    "eval_every": 10,
    "digits_steps": 300, "digits_batch": 32, "digits_lr": 0.05, "digits_hidden": 128,
    "digits_test_fraction": 0.2,
    "text_steps": 200, "text_batch": 16, "text_lr": 3e-3, "text_dim": 160, "text_layers": 3,
    "text_heads": 4, "text_context": 64, "text_bytes": 1_000_000, "text_val_batches": 8,
}
_HOOK_RE: Final = re.compile(
    r"^(?:(fp32|fp16|mrc-fp32)|powersgd-r(\d+)|eden(\d+(?:\.\d+)?)-(naive|aware)(-ef)?)\Z")


@dataclass(frozen=True)
class HookSpec:
    """One hook of the comparison, parsed from its name (see `parse_hook`)."""

    name: str
    kind: str  # "allreduce" | "fp16" | "powersgd" | "mrc"
    rank: int = 0  # PowerSGD's matrix approximation rank
    scheme: str = "none"  # mrc: the codec ("none": the uncompressed ring)
    bits: float = 32.0
    partial_sums: str = "aware"
    error_feedback: bool = False


def parse_hook(name: str, scheme: str = "eden-unbiased") -> HookSpec:
    """`fp32`, `fp16`, `powersgd-r<R>`, `mrc-fp32` or `eden<B>-<naive|aware>[-ef]` (B bits of `scheme`)."""
    m = _HOOK_RE.match(name)
    if m is None:
        raise UsageError(f"unknown hook {name!r}: fp32, fp16, powersgd-r<R>, mrc-fp32 or "
                         "eden<B>-<naive|aware>[-ef]")
    plain, rank, bits, partial, ef = m.groups()
    if plain == "fp32":
        return HookSpec(name, "allreduce")
    if plain == "fp16":
        return HookSpec(name, "fp16", bits=16.0)
    if plain == "mrc-fp32":
        return HookSpec(name, "mrc")
    if rank is not None:
        if int(rank) < 1:
            raise UsageError(f"hook {name!r}: PowerSGD's rank must be at least 1")
        return HookSpec(name, "powersgd", rank=int(rank))
    if scheme not in COMPRESSIONS or scheme == "none":
        raise UsageError(f"scheme {scheme!r}: one of {', '.join(c for c in COMPRESSIONS if c != 'none')}")
    from .ring import Config

    try:
        Config(scheme, float(bits), partial)  # the codec accepts this budget
    except (ValueError, TypeError) as e:  # the codec's CodecValueError / CodecTypeError
        raise UsageError(f"hook {name!r}: {e}") from e
    return HookSpec(name, "mrc", scheme=scheme, bits=float(bits), partial_sums=partial,
                    error_feedback=ef is not None)


def config(**overrides: Any) -> dict[str, Any]:
    """DEFAULTS with `overrides` (unknown keys are an error: a typo must not silently run the default)."""
    bad = set(overrides) - set(DEFAULTS)
    if bad:
        raise UsageError(f"unknown comparison options: {', '.join(sorted(bad))}")
    cfg = {**DEFAULTS, **overrides}
    if cfg["task"] not in TASKS:
        raise UsageError(f"task {cfg['task']!r}: one of {', '.join(TASKS)}")
    parse_hook(str(cfg["hook"]), str(cfg["scheme"]))
    if int(cfg["warmup"]) < 2:
        # PowerSGD with error feedback / warm start refuses fewer; every hook gets the same warm-up
        raise UsageError("warmup must be at least 2 iterations (PowerSGD's minimum with error feedback)")
    return cfg


# -- data
def digits_split(seed: int, test_fraction: float) -> tuple[Any, Any, Any, Any]:
    """scikit-learn's digits, pixels scaled to [0, 1], split stratified by `seed`: (xtr, ytr, xte, yte)."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:
        raise UsageError("the digits task needs scikit-learn: pip install 'mrc[torch]' (or scikit-learn; "
                         "make setup installs it)") from e
    import numpy as np

    x, y = load_digits(return_X_y=True)
    x = (np.asarray(x, dtype=np.float32) / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, np.asarray(y, dtype=np.int64), test_size=test_fraction,
                                          random_state=seed, stratify=y)
    return xtr, ytr, xte, yte


def stdlib_text(budget: int) -> bytes:
    """The first `budget` bytes of the standard library's top-level ``*.py`` files, sorted by name and
    concatenated: text on every machine with this Python (it differs between Python versions)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for f in sorted(root.glob("*.py"), key=lambda p: p.name):
        if len(out) >= budget:
            break
        try:
            out += f.read_bytes()
        except OSError:
            continue
    if len(out) < min(budget, 10_000):
        raise UsageError(f"only {len(out)} bytes of Python source under {root}")
    return bytes(out[:budget])


# -- models
def make_model(cfg: dict[str, Any]) -> torch.nn.Module:
    """The task's model, initialised from `cfg["seed"]`: the same weights on every rank and every hook."""
    import torch
    from torch import nn

    torch.manual_seed(int(cfg["seed"]))
    if cfg["task"] == "digits":
        h = int(cfg["digits_hidden"])
        return nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
    return CharTransformer(int(cfg["text_dim"]), int(cfg["text_layers"]), int(cfg["text_heads"]),
                           int(cfg["text_context"]))


def model_params(cfg: dict[str, Any]) -> int:
    return sum(p.numel() for p in make_model(cfg).parameters())


def _char_transformer_class() -> type:
    import torch
    from torch import nn

    class _CharTransformer(nn.Module):
        """Byte-level causal transformer: embeddings, pre-norm encoder layers under a causal mask, a head
        over the 256 byte values."""

        def __init__(self, dim: int, layers: int, heads: int, context: int) -> None:
            super().__init__()
            self.context = context
            self.tok = nn.Embedding(256, dim)
            self.pos = nn.Embedding(context, dim)
            layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, 256)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context),
                                 persistent=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            t = idx.shape[1]
            h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            mask = cast("torch.Tensor", self.mask)
            h = self.blocks(h, mask=mask[:t, :t], is_causal=True)
            out: torch.Tensor = self.head(self.norm(h))
            return out

    return _CharTransformer


def CharTransformer(dim: int, layers: int, heads: int, context: int) -> torch.nn.Module:
    """A byte-level causal transformer (the class is built on first use: torch is imported lazily)."""
    model: torch.nn.Module = _char_transformer_class()(dim, layers, heads, context)
    return model


# -- wire-byte accounting of torch's hooks
class AllReduceCounter:
    """Counts the bytes of every tensor handed to `torch.distributed.all_reduce` while active.

    torch's hooks (and mrc_hook's warm-up) call `dist.all_reduce` through the module attribute, also from
    their futures' callbacks on gloo's threads (PowerSGD allreduces Q there): replacing the attribute for
    the run counts exactly what each hook sends — no re-derivation of PowerSGD's compress/skip decisions.
    The training loop's own loss all_reduce goes through `original`, uncounted."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.original: Callable[..., Any] = dist.all_reduce
        self.bytes = 0
        self.calls = 0
        self._lock = threading.Lock()

    def _counting(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.bytes += tensor.numel() * tensor.element_size()
            self.calls += 1
        return self.original(tensor, *args, **kwargs)

    @contextmanager
    def active(self) -> Iterator[AllReduceCounter]:
        self._dist.all_reduce = self._counting
        try:
            yield self
        finally:
            self._dist.all_reduce = self.original


def ring_share(world: int) -> float:
    """The share of an all-reduce's buffer that each rank sends in a ring of `world` ranks."""
    return 2.0 * (world - 1) / world


def _register(ddp: Any, spec: HookSpec, cfg: dict[str, Any], transport: Any) -> Any:
    """Register the hook of `spec` on `ddp`; its state (None for torch's stateless hooks)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    from .ddp import MrcHookState, mrc_hook

    warmup, seed = int(cfg["warmup"]), int(cfg["seed"])
    if spec.kind == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        return None
    if spec.kind == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return None
    if spec.kind == "powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=spec.rank,
                                   start_powerSGD_iter=warmup, use_error_feedback=True, warm_start=True,
                                   random_seed=seed)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        return state
    mstate = MrcHookState(bits=spec.bits if spec.scheme != "none" else 4.0, scheme=spec.scheme, seed=seed,
                          start_iter=warmup, error_feedback=spec.error_feedback,
                          partial_sums=spec.partial_sums, transport=transport)
    ddp.register_comm_hook(mstate, mrc_hook)
    return mstate


# -- one rank's training
def train_rank(rank: int, world: int, cfg: dict[str, Any], transport: Any = None) -> dict[str, Any]:
    """Train `cfg["task"]` with `cfg["hook"]` on this rank of the initialised default process group.

    `transport`: where mrc's hooks run their ring (None: the process group, gloo p2p); torch's hooks
    always use the process group. Returns this rank's losses (the global mean of every step), the
    evaluations (rank 0 evaluates; others report none), its wire bytes, step times and a parameter
    digest (equal on every rank when all ranks applied the same averaged gradients)."""
    import numpy as np
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = config(**cfg)
    spec = parse_hook(str(cfg["hook"]), str(cfg["scheme"]))
    task, seed = str(cfg["task"]), int(cfg["seed"])
    steps = int(cfg[f"{task}_steps"])
    counter = AllReduceCounter()
    model = make_model(cfg)
    # One bucket holding the whole model, for every hook: the same bucketing for all, and no second bucket
    # whose all_reduce (issued from the autograd thread) can overtake PowerSGD's chained all_reduce of the
    # previous bucket (issued from a gloo callback thread) in a different order on another rank — measured
    # with the text model's default buckets: gloo aborts with "Received data size doesn't match expected
    # size" (a collective mismatch). An explicit bucket_cap_mb also caps DDP's first bucket.
    cap_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / (1 << 20) + 1.0
    ddp = DDP(model, bucket_cap_mb=cap_mb)
    state = _register(ddp, spec, cfg, transport)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)  # this rank's data order, every hook
    if task == "digits":
        xtr, ytr, xte, yte = digits_split(seed, float(cfg["digits_test_fraction"]))
        xs, ys = torch.from_numpy(xtr[rank::world]), torch.from_numpy(ytr[rank::world])
        xt, yt = torch.from_numpy(xte), torch.from_numpy(yte)
        batch = int(cfg["digits_batch"])
        opt: torch.optim.Optimizer = torch.optim.SGD(ddp.parameters(), lr=float(cfg["digits_lr"]),
                                                     momentum=0.9)
        order = torch.randperm(len(xs), generator=gen)
        pos = 0

        def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
            nonlocal order, pos
            if pos + batch > len(order):
                order, pos = torch.randperm(len(xs), generator=gen), 0
            idx = order[pos : pos + batch]
            pos += batch
            return xs[idx], ys[idx]

        def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(out, y)

        def evaluate() -> float:
            with torch.no_grad():
                return float((ddp.module(xt).argmax(1) == yt).float().mean())
    else:
        data = np.frombuffer(stdlib_text(int(cfg["text_bytes"])), dtype=np.uint8)
        split = len(data) * 9 // 10
        ctx, batch = int(cfg["text_context"]), int(cfg["text_batch"])
        train_ids = torch.from_numpy(data[:split].astype(np.int64))
        val_ids = torch.from_numpy(data[split:].astype(np.int64))
        opt = torch.optim.AdamW(ddp.parameters(), lr=float(cfg["text_lr"]), weight_decay=0.0)
        vgen = torch.Generator().manual_seed(seed)  # the same validation windows for every hook
        nval = int(cfg["text_val_batches"]) * batch
        vstarts = torch.randint(0, len(val_ids) - ctx - 1, (nval,), generator=vgen)
        vx = torch.stack([val_ids[s : s + ctx] for s in vstarts.tolist()])
        vy = torch.stack([val_ids[s + 1 : s + ctx + 1] for s in vstarts.tolist()])

        def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
            starts = torch.randint(0, len(train_ids) - ctx - 1, (batch,), generator=gen).tolist()
            return (torch.stack([train_ids[s : s + ctx] for s in starts]),
                    torch.stack([train_ids[s + 1 : s + ctx + 1] for s in starts]))

        def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(out.reshape(-1, 256), y.reshape(-1))

        def evaluate() -> float:
            with torch.no_grad():
                tot = 0.0
                for i in range(0, nval, batch):
                    xb, yb = vx[i : i + batch], vy[i : i + batch]
                    tot += float(loss_of(ddp.module(xb), yb)) * len(xb)
                return tot / nval

    every = max(1, int(cfg["eval_every"]))
    losses: list[float] = []
    step_s: list[float] = []
    bytes_cum: list[int] = []
    evals: list[dict[str, Any]] = []
    train_s = 0.0
    share = ring_share(world)

    def wire_now() -> int:
        mrc = int(getattr(state, "wire_bytes", 0)) if spec.kind == "mrc" else 0
        return round(counter.bytes * share) + mrc

    if rank == 0:
        evals.append({"step": 0, "time_s": 0.0, "wire_bytes": 0, "metric": evaluate()})
    with counter.active():
        for s in range(steps):
            xb, yb = next_batch()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = loss_of(ddp(xb), yb)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            dt = time.perf_counter() - t0
            train_s += dt
            step_s.append(dt)
            bytes_cum.append(wire_now())
            t = loss.detach().clone()
            counter.original(t)  # the global mean loss (uncounted: not the hook's traffic)
            losses.append(float(t) / world)
            if rank == 0 and ((s + 1) % every == 0 or s + 1 == steps):
                evals.append({"step": s + 1, "time_s": train_s, "wire_bytes": bytes_cum[-1],
                              "metric": evaluate()})
    h = hashlib.sha256()
    for p in ddp.module.parameters():
        h.update(p.detach().numpy().tobytes())
    return {
        "hook": spec.name, "task": task, "losses": losses, "evals": evals, "step_s": step_s,
        "wire_bytes": bytes_cum[-1] if bytes_cum else 0, "wire_bytes_cum": bytes_cum,
        "allreduce_bytes": counter.bytes, "allreduce_calls": counter.calls,
        "mrc_frame_bytes": int(getattr(state, "wire_bytes", 0)) if spec.kind == "mrc" else 0,
        "mrc_messages": int(getattr(state, "messages", 0)) if spec.kind == "mrc" else 0,
        "params": sum(p.numel() for p in ddp.module.parameters()), "params_sha256": h.hexdigest(),
        "time_s": train_s,
    }


# -- the report
def higher_is_better(task: str) -> bool:
    return task == "digits"


def summarize(task: str, cfg: dict[str, Any], runs: dict[str, list[dict[str, Any]]],
              target: float) -> dict[str, Any]:
    """One task's report from every hook's rank answers (rank order): a row per hook, first with fp32's
    ratios when fp32 ran. `target`: the test accuracy (digits) or validation loss (text) to reach."""
    up = higher_is_better(task)
    rows: list[dict[str, Any]] = []
    for hook, ranks in runs.items():
        r0 = ranks[0]
        steps = len(r0["losses"])
        wire = sum(a["wire_bytes"] for a in ranks) / len(ranks)
        warm = min(int(cfg["warmup"]), steps)
        cum = [sum(a["wire_bytes_cum"][i] for a in ranks) / len(ranks) for i in range(steps)]
        after = (cum[-1] - cum[warm - 1]) / (steps - warm) if steps > warm and warm > 0 else None
        hit = next((e for e in r0["evals"] if (e["metric"] >= target if up else e["metric"] <= target)), None)
        k = max(1, steps // 10)
        rows.append({
            "hook": hook, "final": r0["evals"][-1]["metric"],
            "best": (max if up else min)(e["metric"] for e in r0["evals"]),
            "steps_to_target": None if hit is None else hit["step"],
            "time_to_target_s": None if hit is None else hit["time_s"],
            "wire_bytes_per_step": wire / steps if steps else 0.0,
            "wire_bytes_per_step_compressed": after,
            "time_per_step_s": r0["time_s"] / steps if steps else 0.0,
            "loss_first": sum(r0["losses"][:k]) / k, "loss_last": sum(r0["losses"][-k:]) / k,
            "params_identical": len({a["params_sha256"] for a in ranks}) == 1,
            "params": r0["params"],
        })
    base = next((r for r in rows if r["hook"] == "fp32"), None)
    for r in rows:
        r["bytes_vs_fp32"] = (r["wire_bytes_per_step"] / base["wire_bytes_per_step"]
                              if base and base["wire_bytes_per_step"] else None)
        r["final_vs_fp32"] = r["final"] - base["final"] if base else None
    curves = {hook: ranks[0]["evals"] for hook, ranks in runs.items()}
    return {"task": task, "metric": "test_accuracy" if up else "val_loss", "target": target,
            "steps": int(cfg[f"{task}_steps"]), "rows": rows, "curves": curves}


def acceptance(digits: dict[str, Any]) -> list[dict[str, Any]] | None:
    """issue 19's digits targets, per hook as measured: every EDEN 4-bit hook within 1 point of fp32's
    final test accuracy at <= 1/6 of its wire bytes per step; every 2-bit hook with error feedback
    within 2 points. None when fp32 did not run."""
    rows = {r["hook"]: r for r in digits["rows"]}
    if "fp32" not in rows:
        return None
    out: list[dict[str, Any]] = []
    for name, r in rows.items():
        m = _HOOK_RE.match(name)
        if m is None or m.group(3) is None:
            continue
        bits, ef = float(m.group(3)), m.group(5) is not None
        if bits == 4:
            points, ratio = 1.0, 1 / 6
        elif bits == 2 and ef:
            points, ratio = 2.0, 1.0
        else:
            continue
        gap = 100 * (rows["fp32"]["final"] - r["final"])  # points below fp32 (negative: above)
        out.append({"hook": name, "gap_points": gap, "max_points": points,
                    "bytes_vs_fp32": r["bytes_vs_fp32"], "max_bytes_vs_fp32": ratio,
                    "met": gap <= points + 1e-9 and (r["bytes_vs_fp32"] or 0.0) <= ratio})
    return out


def _fmt_bytes(b: float | None) -> str:
    if b is None:
        return "-"
    for unit, k in (("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return f"{b / k:.1f} {unit}"
    return f"{b:.0f} B"


def render(doc: dict[str, Any]) -> str:
    """The text report: per task a table of every hook."""
    c = doc["config"]
    lines = [f"ddp bench ranks={c['ranks']} transport={c['transport']} seed={c['seed']} "
             f"warmup={c['warmup']} scheme={c['scheme']}"]
    for t in doc["tasks"]:
        up = higher_is_better(t["task"])
        fmt: Callable[[float], str] = (lambda v: f"{100 * v:.2f}%") if up else (lambda v: f"{v:.4f}")
        lines.append("")
        lines.append(f"{t['task']}: {t['steps']} steps, {t['rows'][0]['params']:,} parameters, target "
                     f"{t['metric']} {'>=' if up else '<='} {fmt(t['target'])}")
        head = ["HOOK", "FINAL", "BEST", "STEPS_TO_T", "TIME_TO_T", "B/STEP", "B/STEP_CMP", "VS_FP32",
                "MS/STEP", "LOSS_0", "LOSS_END", "SAME"]
        cells = [head]
        for r in t["rows"]:
            cells.append([
                r["hook"], fmt(r["final"]), fmt(r["best"]),
                "-" if r["steps_to_target"] is None else str(r["steps_to_target"]),
                "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}s",
                _fmt_bytes(r["wire_bytes_per_step"]), _fmt_bytes(r["wire_bytes_per_step_compressed"]),
                "-" if r["bytes_vs_fp32"] is None else f"{r['bytes_vs_fp32']:.4f}",
                f"{1000 * r['time_per_step_s']:.1f}", f"{r['loss_first']:.4f}", f"{r['loss_last']:.4f}",
                "yes" if r["params_identical"] else "NO",
            ])
        widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    acc = doc.get("acceptance")
    if acc:
        lines.append("")
        for a in acc:
            lines.append(f"acceptance (digits) {a['hook']}: fp32 - hook = {a['gap_points']:+.2f} points "
                         f"(at most {a['max_points']:g}), {a['bytes_vs_fp32']:.4f} of fp32's bytes (at most "
                         f"{a['max_bytes_vs_fp32']:.4f}): {'met' if a['met'] else 'NOT met'}")
    if doc.get("plot"):
        lines.append(f"plot: {doc['plot']}")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str) -> None:
    """A PNG: per task, the metric against cumulative wire bytes per rank and against training time."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise UsageError("--plot needs matplotlib: pip install 'mrc[plot]' (make setup installs it)") from e
    tasks = doc["tasks"]
    fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 4.2 * len(tasks)), squeeze=False)
    for row, t in zip(axes, tasks, strict=True):
        label = "test accuracy" if higher_is_better(t["task"]) else "validation loss (nats/byte)"
        for hook, curve in t["curves"].items():
            ls = "-" if hook.startswith(("eden", "mrc")) else "--"
            sent = [e for e in curve if e["wire_bytes"] > 0]  # the log axis has no place for step 0
            row[0].plot([e["wire_bytes"] for e in sent], [e["metric"] for e in sent], ls, label=hook,
                        linewidth=1.2)
            row[1].plot([e["time_s"] for e in curve], [e["metric"] for e in curve], ls, label=hook,
                        linewidth=1.2)
        row[0].set_xscale("log")
        row[0].set_xlabel("cumulative wire bytes per rank")
        row[1].set_xlabel("training time (s, rank 0)")
        for ax in row:
            ax.set_ylabel(label)
            ax.set_title(f"{t['task']}")
            ax.axhline(t["target"], color="grey", linewidth=0.6, linestyle=":")
            ax.grid(alpha=0.3)
        if higher_is_better(t["task"]):
            for ax in row:
                lo = min(e["metric"] for c in t["curves"].values() for e in c[len(c) // 3:])
                ax.set_ylim(max(0.0, lo - 0.02), 1.0)
        row[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_target(task: str) -> float:
    """The default target: 95% test accuracy (digits), a validation loss of 2.0 nats/byte (text): what
    fp32 reaches in the default runs' second half, so that the hooks' steps and times to it differ."""
    return 0.95 if task == "digits" else 2.0
