"""A small `mrcctl ddp bench` (mrc.collective.train_compare, ctl/ddp_rank.py local ranks): both tasks,
every default hook, a few steps on 2 local rank processes (gloo on 127.0.0.1).

Asserted: every hook's training loss decreases (last step below the first), the parameters end identical
on both ranks, and each hook's wire bytes are what it sends, derived here independently of the counter:
fp32 = 4 B per parameter per step (a ring of 2 ranks sends the whole buffer once per rank), fp16 exactly
half of it, PowerSGD the uncompressed tensors plus 4 B per element of P and Q after the warm-up
(re-derived from its compress rule: (n + m)·k·2 < n·m), mrc's uncompressed ring equal to fp32, and each
EDEN hook per compressed step two messages (reduce-scatter, all-gather) of its chunk's frames as the codec
encodes them — 4 bits at most 1/6 of fp32 on the digits model. The full run is a benchmark
(docs/collective.md); no assertion here depends on timing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (make setup installs torch==2.13.0)")
pytest.importorskip("sklearn", reason="scikit-learn is not importable (make setup installs it)")

from mrc.collective import frame, train_compare  # noqa: E402
from mrc.collective.ring import chunk_bounds  # noqa: E402
from mrc.ctl.cmd_ddp import run_bench  # noqa: E402
from mrc.errors import UsageError  # noqa: E402
from mrc.quant import codec  # noqa: E402

STEPS = 12
WARMUP = 2
CFG: dict[str, Any] = {
    "digits_steps": STEPS, "text_steps": STEPS, "text_dim": 32, "text_layers": 1, "text_context": 16,
    "text_bytes": 40_000, "text_batch": 8, "text_val_batches": 2, "eval_every": 6, "warmup": WARMUP,
}


def _powersgd_elements(model: Any, rank: int) -> int:
    """Elements PowerSGD allreduces per compressed step: torch's rule, re-derived."""
    total = 0
    for p in model.parameters():
        n = p.shape[0]
        m = p.numel() // n
        k = min(n, m, rank)
        total += (n + m) * k if (n + m) * k * 2 < n * m else n * m
    return total


def _eden_step_bytes(params: int, scheme: str, bits: float) -> int:
    """Bytes a rank of 2 posts per compressed step: in each phase its chunk's frames (one per piece of
    every segment, frame.pieces), with their length prefixes."""
    sizes = []
    for start, end in chunk_bounds(params, 2):
        x = np.random.default_rng(start).standard_normal(end - start).astype(np.float32)
        frames, pos = [], 0
        for piece in (p for seg in frame.segments(end - start) for p in frame.pieces(seg)):
            frames.append(codec.encode(x[pos : pos + piece], scheme, bits, seed=1))
            pos += piece
        sizes.append(len(frame.join(frames)))
    # at 2 ranks each rank sends one chunk in the reduce-scatter and the other, reduced, in the all-gather
    return sum(sizes)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_bench("inproc", 2, ["digits", "text"], list(train_compare.DEFAULT_HOOKS), CFG,
                     {"digits": 0.5, "text": 5.0}, timeout_s=60)


def test_every_hook_trains_and_ranks_agree(report: dict[str, Any]) -> None:
    for task in report["tasks"]:
        assert [r["hook"] for r in task["rows"]] == list(train_compare.DEFAULT_HOOKS)
        for r in task["rows"]:
            assert r["params_identical"], (task["task"], r["hook"])
            assert r["loss_last"] < r["loss_first"], (task["task"], r["hook"], r)
            curve = task["curves"][r["hook"]]
            assert [e["step"] for e in curve] == [0, 6, 12]
            assert curve[-1]["metric"] == r["final"]
        # every hook from the same weights and data: the untrained model evaluates identically
        assert len({c[0]["metric"] for c in task["curves"].values()}) == 1


def test_wire_bytes_are_as_accounted(report: dict[str, Any]) -> None:
    for task in report["tasks"]:
        cfg = train_compare.config(**{**CFG, "task": task["task"]})
        model = train_compare.make_model(cfg)
        params = sum(p.numel() for p in model.parameters())
        rows = {r["hook"]: r for r in task["rows"]}
        fp32 = 4 * params  # ring share 2(n-1)/n = 1 at 2 ranks
        assert rows["fp32"]["wire_bytes_per_step"] == fp32
        assert rows["fp16"]["wire_bytes_per_step"] == fp32 / 2
        assert rows["mrc-fp32"]["wire_bytes_per_step"] == fp32
        for rank in (1, 4):
            r = rows[f"powersgd-r{rank}"]
            assert r["wire_bytes_per_step_compressed"] == 4 * _powersgd_elements(model, rank)
            assert r["wire_bytes_per_step"] * STEPS == WARMUP * fp32 + (STEPS - WARMUP) * 4 * \
                _powersgd_elements(model, rank)
        for name in ("eden4-naive", "eden4-aware", "eden4-aware-ef", "eden2-naive", "eden2-aware",
                     "eden2-aware-ef"):
            bits = 4.0 if name.startswith("eden4") else 2.0
            want = _eden_step_bytes(params, "eden-unbiased", bits)
            assert rows[name]["wire_bytes_per_step_compressed"] == want, name
            assert want > params * bits / 8  # the frames' headers and padding count too
        if task["task"] == "digits":
            assert rows["eden4-aware"]["wire_bytes_per_step_compressed"] <= fp32 / 6
    acc = report["acceptance"]
    assert acc is not None and {a["hook"] for a in acc} == {"eden4-naive", "eden4-aware", "eden4-aware-ef",
                                                            "eden2-aware-ef"}


def test_hook_names_and_options_are_checked() -> None:
    assert train_compare.parse_hook("eden2-aware-ef") == train_compare.HookSpec(
        "eden2-aware-ef", "mrc", scheme="eden-unbiased", bits=2.0, partial_sums="aware", error_feedback=True)
    assert train_compare.parse_hook("powersgd-r4").rank == 4
    for bad in ("fp8", "powersgd-r0", "eden4-sideways", "eden99-aware"):
        with pytest.raises(UsageError):
            train_compare.parse_hook(bad)
    with pytest.raises(UsageError, match="unknown comparison options"):
        train_compare.config(digit_steps=3)
    with pytest.raises(UsageError, match="warmup"):
        train_compare.config(warmup=1)


def test_text_is_the_standard_library_source() -> None:
    text = train_compare.stdlib_text(20_000)
    assert len(text) == 20_000
    assert b"import " in text and b"def " in text
    assert train_compare.stdlib_text(20_000) == text  # sorted by name: the same bytes every time
