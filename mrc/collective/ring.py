"""Ring all-reduce (reduce-scatter + all-gather) of float32 buffers with compressed chunks, and the
one-shot all-gather baseline (docs/collective.md).

Every rank calls `allreduce(transport, x, cfg, step)` with its own buffer (same length and config on
every rank); each gets back the same result — bit-identical on every rank, which data-parallel training
needs: the owner of a chunk uses the decoded version of the frame it sends, never its exact sum.

Partial-sum strategies for the reduce-scatter hops:
  naive  decode the incoming partial sum (mrc.quant codec, its own rotation), add, encode again with the
         same budget and a fresh seed (fresh rotation) at every hop.
  aware  the same decode-add-encode per hop (fresh rotation per hop: independent, unbiased errors), but
         the budget of hop k grows with the k contributions its partial sum holds and the all-gather
         frame, paid n-1 times, gets fewer bits: the allocation that minimises the modelled error at the
         naive wire budget (schedule.py). A rotation shared by all hops, accumulating in the rotated
         domain, was measured biased (docs/collective.md §3) and is not used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from mrc.errors import UsageError
from mrc.quant.codec import SCHEMES, check_bits, decode, encode

from . import frame
from .schedule import aware_bits
from .transport import Transport

F32 = npt.NDArray[np.float32]
COMPRESSIONS = ("none", *SCHEMES)
PARTIAL_SUMS = ("naive", "aware")
ALGORITHMS = ("ring", "oneshot")

_TAG_RS = 1 << 20
_TAG_AG = 2 << 20
_TAG_ONESHOT = 3 << 20


@dataclass(frozen=True)
class Config:
    scheme: str = "none"
    bits: float = 4.0
    partial_sums: str = "naive"
    algorithm: str = "ring"
    seed: int = 0
    average: bool = True
    correlation: float = 0.0  # aware: assumed pairwise correlation of the ranks' buffers, in [0, 1]

    def __post_init__(self) -> None:
        if self.scheme not in COMPRESSIONS:
            raise UsageError(f"unknown scheme {self.scheme!r} (known: {', '.join(COMPRESSIONS)})")
        if self.partial_sums not in PARTIAL_SUMS:
            raise UsageError(f"partial sums must be one of {', '.join(PARTIAL_SUMS)}")
        if self.algorithm not in ALGORITHMS:
            raise UsageError(f"algorithm must be one of {', '.join(ALGORITHMS)}")
        if self.scheme != "none":
            check_bits(self.scheme, self.bits)
        if not 0.0 <= self.correlation <= 1.0:
            raise UsageError(f"correlation must be in [0, 1], got {self.correlation}")


@dataclass
class Result:
    out: F32
    wire_bytes: int = 0  # bytes this rank posted (message payloads, framing included)
    messages: int = 0
    bits_per_hop: tuple[float, ...] = field(default_factory=tuple)
    # with residual=True: what this rank's quantizations left out of the SUM, per coordinate (exact value
    # it encoded minus the value it sent); adding it to the next step's input is error feedback
    residual: F32 | None = None


def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """[start, end) of the n chunks of a buffer (sizes differ by at most one; empty chunks allowed)."""
    base, extra = divmod(length, n)
    out = []
    pos = 0
    for c in range(n):
        size = base + (1 if c < extra else 0)
        out.append((pos, pos + size))
        pos += size
    return out


def derive_seed(*parts: int) -> int:
    """A 64-bit seed from integers (SeedSequence hashing: independent streams for distinct tuples)."""
    ss = np.random.SeedSequence([p & 0xFFFFFFFFFFFFFFFF for p in parts])
    return int(ss.generate_state(1, np.uint64)[0])


class _Counter:
    def __init__(self, t: Transport) -> None:
        self.t = t
        self.bytes = 0
        self.messages = 0

    def send(self, dst: int, tag: int, data: bytes) -> None:
        self.bytes += len(data)
        self.messages += 1
        self.t.send(dst, tag, data)


def allreduce(t: Transport, x: npt.ArrayLike, cfg: Config, step: int = 0, residual: bool = False) -> Result:
    """Sum (or average, cfg.average) of every rank's 1-D float32 buffer. `step` must be the same on every
    rank (it seeds the rotations); `residual` also returns this rank's quantization residual."""
    a = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    n = t.world_size
    if n == 1:
        return Result(a.copy(), residual=np.zeros_like(a) if residual else None)
    if cfg.algorithm == "oneshot":
        res = _oneshot(t, a, cfg, step, residual)
    elif cfg.scheme == "none":
        res = _ring(t, a, cfg, step, _RawChunks(), residual)
    elif cfg.partial_sums == "naive":
        res = _ring(t, a, cfg, step, _CodecChunks(cfg, step), residual)
    else:
        res = _ring(t, a, cfg, step, _ScheduledChunks(cfg, step, n), residual)
    if cfg.average:
        res.out /= np.float32(n)
    return res


class _Chunks:
    """How one strategy represents chunk c: `start` (own data -> working form), `pack` (working form with k
    contributions -> message), `unpack` (message -> working form), `finish` (working form -> float32).
    `sizes[c]`: the segment sizes of chunk c (set by the ring before use; both ends know the layout)."""

    sizes: dict[int, list[int]]

    def start(self, c: int, data: F32) -> list[F32]:
        raise NotImplementedError

    def pack(self, c: int, work: list[F32], k: int) -> bytes:
        raise NotImplementedError

    def unpack(self, c: int, msg: bytes) -> list[F32]:
        raise NotImplementedError

    def finish(self, c: int, work: list[F32], length: int) -> F32:
        raise NotImplementedError

    def bits(self, n: int) -> tuple[float, ...]:
        return ()


class _RawChunks(_Chunks):
    def start(self, c: int, data: F32) -> list[F32]:
        return [data.copy()]

    def pack(self, c: int, work: list[F32], k: int) -> bytes:
        return work[0].tobytes()

    def unpack(self, c: int, msg: bytes) -> list[F32]:
        return [np.frombuffer(msg, np.float32).copy()]

    def finish(self, c: int, work: list[F32], length: int) -> F32:
        return work[0]


class _CodecChunks(_Chunks):
    """Naive: the chunk's segments in the original domain, each frame a mrc.quant codec buffer."""

    def __init__(self, cfg: Config, step: int) -> None:
        self.cfg = cfg
        self.step = step

    def start(self, c: int, data: F32) -> list[F32]:
        out, pos = [], 0
        for size in frame.segments(data.size):
            out.append(data[pos : pos + size].copy())
            pos += size
        return out

    def _bits(self, k: int) -> float:
        return float(self.cfg.bits)

    def pack(self, c: int, work: list[F32], k: int) -> bytes:
        frames = [
            encode(seg, self.cfg.scheme, self._bits(k),
                   seed=derive_seed(self.cfg.seed, self.step, 1, c, i, k))
            for i, seg in enumerate(work)
        ]
        return frame.join(frames)

    def unpack(self, c: int, msg: bytes) -> list[F32]:
        return [np.asarray(decode(f), np.float32) for f in frame.split(msg, len(self.sizes[c]))]

    def finish(self, c: int, work: list[F32], length: int) -> F32:
        return np.concatenate(work) if work else np.zeros(0, np.float32)

    def bits(self, n: int) -> tuple[float, ...]:
        return tuple([float(self.cfg.bits)] * n)



class _ScheduledChunks(_CodecChunks):
    """Aware: like naive (codec frames, a fresh rotation per hop, so hop errors are independent and the
    sum stays unbiased), but hop k quantizes with the schedule's k-th budget, which grows with the number
    of contributions the partial sum holds, at no more wire bits than naive (schedule.py)."""

    def __init__(self, cfg: Config, step: int, n: int) -> None:
        super().__init__(cfg, step)
        self.schedule = aware_bits(cfg.scheme, float(cfg.bits), n, cfg.correlation)

    def _bits(self, k: int) -> float:
        return self.schedule[k - 1]

    def bits(self, n: int) -> tuple[float, ...]:
        return self.schedule


def _accumulate(acc: list[F32], own: list[F32]) -> list[F32]:
    """Incoming (decoded into fresh arrays) += own, in place, segment by segment."""
    for a, o in zip(acc, own, strict=True):
        if a.shape != o.shape:
            raise UsageError(f"chunk segment of {a.size} elements received where {o.size} were expected")
        a += o
    return acc


def _residual(rep: _Chunks, c: int, exact: list[F32], msg: bytes) -> list[F32]:
    return [e - q for e, q in zip(exact, rep.unpack(c, msg), strict=True)]


def _ring(t: Transport, a: F32, cfg: Config, step: int, rep: _Chunks, want_residual: bool) -> Result:
    n, r = t.world_size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    bounds = chunk_bounds(a.size, n)
    sizes = {c: frame.segments(e - s) for c, (s, e) in enumerate(bounds)}
    rep.sizes = sizes
    io = _Counter(t)
    own = {c: rep.start(c, a[s:e]) for c, (s, e) in enumerate(bounds)}
    # reduce-scatter: at step s this rank sends chunk (r - s) holding s + 1 contributions
    work = own[r % n]
    resid: dict[int, list[F32]] = {}
    for s in range(n - 1):
        c_send = (r - s) % n
        msg = rep.pack(c_send, work, s + 1)
        if want_residual:
            resid[c_send] = _residual(rep, c_send, work, msg)
        io.send(right, _TAG_RS + s, msg)
        c_recv = (r - s - 1) % n
        work = _accumulate(rep.unpack(c_recv, t.recv(left, _TAG_RS + s)), own[c_recv])
    # this rank owns chunk (r + 1) % n: the frame of its full sum travels n - 1 hops
    mine = (r + 1) % n
    msg = rep.pack(mine, work, n)
    final: dict[int, list[F32]] = {mine: rep.unpack(mine, msg)}
    if want_residual:
        resid[mine] = [e - q for e, q in zip(work, final[mine], strict=True)]
    for s in range(n - 1):
        io.send(right, _TAG_AG + s, msg)
        c_recv = (r - s) % n
        msg = t.recv(left, _TAG_AG + s)
        final[c_recv] = rep.unpack(c_recv, msg)
    t.flush()
    out = np.concatenate([rep.finish(c, final[c], e - s) for c, (s, e) in enumerate(bounds)])
    rvec = None
    if want_residual:
        rvec = np.concatenate([rep.finish(c, resid[c], e - s) for c, (s, e) in enumerate(bounds)])
    return Result(out.astype(np.float32, copy=False), io.bytes, io.messages, rep.bits(n), rvec)


def _oneshot(t: Transport, a: F32, cfg: Config, step: int, want_residual: bool) -> Result:
    """Baseline: every rank compresses its whole buffer once (its own seed), the frames are all-gathered
    around the ring, every rank decodes all n and averages in float64. One quantization per contribution:
    error v / n of the average for unbiased schemes; wire (n - 1) whole buffers per rank."""
    n, r = t.world_size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    io = _Counter(t)
    sizes = frame.segments(a.size)

    def enc(rank: int) -> bytes:
        if cfg.scheme == "none":
            return a.tobytes()
        frames, pos = [], 0
        for i, size in enumerate(sizes):
            frames.append(encode(a[pos : pos + size], cfg.scheme, cfg.bits,
                                 seed=derive_seed(cfg.seed, step, 4, rank, i)))
            pos += size
        return frame.join(frames)

    def dec(msg: bytes) -> npt.NDArray[np.float64]:
        if cfg.scheme == "none":
            return np.frombuffer(msg, np.float32).astype(np.float64)
        parts = [np.asarray(decode(f), np.float64) for f in frame.split(msg, len(sizes))]
        return np.concatenate(parts) if parts else np.zeros(0)

    msg = enc(r)
    total = dec(msg)
    rvec = (a - total).astype(np.float32) if want_residual else None
    for s in range(n - 1):
        io.send(right, _TAG_ONESHOT + s, msg)
        msg = t.recv(left, _TAG_ONESHOT + s)
        total += dec(msg)
    t.flush()
    return Result(total.astype(np.float32), io.bytes, io.messages,
                  () if cfg.scheme == "none" else (float(cfg.bits),), rvec)


def vnmse(estimate: npt.ArrayLike, exact: npt.ArrayLike) -> float:
    """||estimate - exact||^2 / ||exact||^2 in float64 (0 when both are zero)."""
    e = np.asarray(estimate, np.float64)
    x = np.asarray(exact, np.float64)
    den = float(np.dot(x, x))
    num = float(np.dot(e - x, e - x))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)
