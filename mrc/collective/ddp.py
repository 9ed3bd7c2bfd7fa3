"""PyTorch DDP communication hook running mrc's compressed ring all-reduce (docs/design.md §9).

    import torch.distributed as dist
    from mrc.collective.ddp import MrcHookState, mrc_hook
    state = MrcHookState(process_group=None, bits=4, scheme="eden-unbiased", seed=1234, start_iter=10)
    ddp_model.register_comm_hook(state, mrc_hook)     # the same call shape as PowerSGD

`mrc_hook(state, bucket) -> torch.futures.Future[Tensor]` returns the averaged bucket, bit-identical on
every rank. For the first `start_iter` iterations (DDP rebuilds its buckets after the first one, and early
gradients are the most sensitive) it runs the process group's uncompressed all_reduce; afterwards the
bucket goes through `mrc.collective.allreduce` over a `Transport`: by default the process group itself
(`TorchTransport`: tagged point-to-point send/recv of byte chunks — gloo or any backend with p2p), or the
one given as `MrcHookState(transport=...)` — e.g. `mrc.dataplane.collective.MrcTransport`, chunks as
WRITE-with-immediate through the host's mrcd (ctl/ddp_rank.py), or an in-process transport in tests —
whose rank and world size must be the process group's. With `error_feedback`, each rank adds to its next
gradient the residual its own quantizations left out of the sum (per bucket index), so the errors do not
accumulate over iterations.

torch is imported here only, and lazily: `mrc.collective` itself never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .ring import Config, allreduce
from .transport import Transport

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

    GradBucket = Any  # torch.distributed.GradBucket (a C++ class without type information)


class TorchTransport:
    """mrc.collective.Transport over a torch.distributed process group: each chunk is an int64 length and
    a uint8 tensor, sent with isend (completed by `flush`) and received with a blocking recv, both tagged."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self._group = group
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)
        self._pending: list[tuple[Any, Any]] = []

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._size

    def _global(self, r: int) -> int:
        return r if self._group is None else int(self._dist.get_global_rank(self._group, r))

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        import torch

        head = torch.tensor([len(data)], dtype=torch.int64)
        peer = self._global(dst)
        self._pending.append((self._dist.isend(head, peer, group=self._group, tag=2 * tag), head))
        if data:
            body = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            self._pending.append((self._dist.isend(body, peer, group=self._group, tag=2 * tag + 1), body))

    def recv(self, src: int, tag: int) -> bytes:
        import torch

        peer = self._global(src)
        head = torch.empty(1, dtype=torch.int64)
        self._dist.recv(head, peer, group=self._group, tag=2 * tag)
        n = int(head.item())
        if n == 0:
            return b""
        body = torch.empty(n, dtype=torch.uint8)
        self._dist.recv(body, peer, group=self._group, tag=2 * tag + 1)
        return bytes(body.numpy().tobytes())

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        for work, _tensor in pending:
            work.wait()


class MrcHookState:
    """State of `mrc_hook`, in the style of PowerSGDState. `iter` counts optimizer steps (it advances when
    DDP hands over the last bucket of an iteration).

    `transport`: where the compressed ring runs (None: the process group itself, `TorchTransport`). Any
    `mrc.collective.Transport` whose `rank` and `world_size` are this rank's in the process group (checked
    here when the group is already initialised, and at every compressed bucket); the warm-up iterations
    still use the group's own all_reduce. Its messages must fit it: for `MrcTransport`, slots of
    `mrc.collective.ring.max_message_bytes(largest bucket elements, world size)` bytes."""

    __slots__ = (
        "bits", "correlation", "error_feedback", "iter", "messages", "partial_sums", "process_group",
        "residuals", "scheme", "seed", "start_iter", "transport", "wire_bytes",
    )

    def __init__(
        self, process_group: dist.ProcessGroup | None = None, bits: float = 4.0,
        scheme: str = "eden-unbiased", seed: int = 0, start_iter: int = 1, error_feedback: bool = False,
        partial_sums: str = "aware", correlation: float = 0.0, transport: Transport | None = None,
    ) -> None:
        Config(scheme, float(bits), partial_sums, correlation=correlation)  # validate early
        self.process_group = process_group
        self.transport = transport
        self.bits = float(bits)
        self.scheme = scheme
        self.seed = seed
        self.start_iter = start_iter
        self.error_feedback = error_feedback
        self.partial_sums = partial_sums
        self.correlation = correlation
        self.iter = 0
        self.residuals: dict[int, np.ndarray[Any, np.dtype[np.float32]]] = {}
        self.wire_bytes = 0  # bytes this rank posted through the compressed path so far
        self.messages = 0  # messages (codec frames) it posted there: each carries its own headers

        if transport is not None:
            import torch.distributed as dist

            if dist.is_initialized():
                self.check_transport()

    def check_transport(self) -> None:
        """The given transport must be this rank's place in the process group (same rank, same size)."""
        t = self.transport
        if t is None:
            return
        import torch.distributed as dist

        rank, world = dist.get_rank(self.process_group), dist.get_world_size(self.process_group)
        if (t.rank, t.world_size) != (rank, world):
            raise ValueError(f"MrcHookState: the transport is rank {t.rank} of {t.world_size}, the process "
                             f"group's rank is {rank} of {world}: they must match")

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        if bucket.is_last():
            self.iter += 1


def mrc_hook(state: MrcHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket across the process group with mrc's compressed ring all-reduce."""
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    world = dist.get_world_size(state.process_group)
    if state.iter < state.start_iter:
        state.maybe_increase_iter(bucket)
        fut = dist.all_reduce(buf, group=state.process_group, async_op=True).get_future()

        def _avg(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            return f.value()[0].div_(world)

        return cast("torch.futures.Future[torch.Tensor]", fut.then(_avg))
    x = buf.detach().to(device="cpu", dtype=torch.float32).numpy().copy()
    idx = bucket.index()
    if state.error_feedback:
        r = state.residuals.get(idx)
        if r is not None and r.shape == x.shape:
            x += r
    cfg = Config(state.scheme, state.bits, state.partial_sums, seed=state.seed, correlation=state.correlation)
    # the same step on every rank: iterations and bucket indices advance in lockstep under DDP
    if state.transport is None:
        transport: Transport = TorchTransport(state.process_group)
    else:
        state.check_transport()
        transport = state.transport
    res = allreduce(transport, x, cfg, step=(state.iter << 16) | idx, residual=state.error_feedback)
    if state.error_feedback and res.residual is not None:
        state.residuals[idx] = res.residual
    state.wire_bytes += res.wire_bytes
    state.messages += res.messages
    buf.copy_(_to_bucket_dtype(res.out, buf))
    state.maybe_increase_iter(bucket)
    out: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    out.set_result(buf)
    return out


def _to_bucket_dtype(out: np.ndarray[Any, np.dtype[np.float32]], buf: torch.Tensor) -> torch.Tensor:
    """The float32 result as a tensor of the bucket's dtype and device, finite values saturated to that
    dtype's finite range (docs/quant.md §6, "float16 frames saturate"): finite fp16 gradients whose
    average lands past 65504 -- the codec's noise, or bf16/fp16's range narrower than the float32 the
    ring computes in -- would otherwise cast to inf, which a GradScaler reads as the model's own
    overflow and skips the step for. Non-finite values (a rank's inf, NaN from the ring's NONFINITE
    marker) are kept: those are real overflows the scaler must see."""
    import torch

    if buf.dtype.is_floating_point and buf.dtype != torch.float32 and buf.dtype.itemsize <= 4:
        fmax = float(torch.finfo(buf.dtype).max)
        if out.size and float(np.max(np.abs(out), initial=0.0, where=np.isfinite(out))) > fmax:
            out = np.where(np.isfinite(out), np.clip(out, -fmax, fmax), out).astype(np.float32)
    return torch.from_numpy(out).to(device=buf.device, dtype=buf.dtype)


# DDP compares the hook's runtime annotations with dist.GradBucket and Future[Tensor] and refuses anything
# else; with postponed evaluation (and torch imported lazily) they are strings, so drop them at runtime —
# an absent annotation is accepted. Type checkers still see the annotated definition above.
mrc_hook.__annotations__ = {}
