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
  measured  aware's allocation, but each hop chooses its bit width from the data instead of an assumed
         correlation: it decodes the incoming partial sum, measures the energy of the sum it is about to
         quantize and the correlation of its own chunk with what came in, and allocates what is left of
         the naive budget (carried in a 16-byte prefix of the message, frame.join_stats) over itself and
         the later hops (schedule.measured_bits). It needs the decoded sum before the bits are fixed, so
         its hops are decode + add + encode (not the fused kernel, which takes the bits up front).

Every codec strategy encodes a segment as the codec frames of its pieces (frame.pieces: powers of two,
so that little of the codec's zero-padding to a power of two travels), joined in the segment's one
message; piece 0 is seeded as the segment's single frame was, so a segment of one piece is the same bytes.

`group` (any codec strategy, EDEN/DRIVE): one scale per block of that many rotated coordinates (codec
version-2 frames, 8 bytes per scale on the wire) instead of one per segment. Measured against one scale
in docs/collective.md, "Partial sums: grouped scales, data-driven bits, hierarchy".
"""

from __future__ import annotations

import math
import operator
import os
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from mrc.errors import UsageError
from mrc.quant import hop as qhop
from mrc.quant.codec import (
    SCHEMES,
    CodecError,
    DecodeOverflow,
    check_bits,
    check_group,
    decode,
    encode,
    parse,
    peek_magnitude,
)

from . import frame
from .schedule import STEP as BUDGET_STEP
from .schedule import aware_bits, measured_bits
from .transport import Transport

F32 = npt.NDArray[np.float32]
#: A message: what `Transport.send` takes (every transport copies it before `send` returns).
Message = bytes | memoryview
#: Uncompressed messages as views of the arrays they come from, and the result assembled into a buffer
#: the caller may keep across calls, instead of a copy of each 4 MiB segment per step and a fresh result
#: per call (fresh memory is zeroed page by page by the kernel: 51,000 page faults and 0.1-0.3 s of
#: system time per 64 MiB all-reduce and rank, measured in docs/collective.md, "Rank memory").
#: MRC_RING_ZERO_COPY=0 restores the copies (read once, at import: side-by-side runs use two processes).
ZERO_COPY: bool = os.environ.get("MRC_RING_ZERO_COPY", "1").strip() != "0"
COMPRESSIONS = ("none", *SCHEMES)
PARTIAL_SUMS = ("naive", "aware", "measured")
ALGORITHMS = ("ring", "oneshot")

#: What a codec hop sends instead of frames when the segment it would encode holds a NaN or an infinity
#: (which the codec refuses): every later hop forwards it, and every rank's result for that segment is NaN.
#: A non-finite gradient so reaches every rank, as an uncompressed ring's sum carries it -- torch's
#: GradScaler looks for exactly that to skip the step -- instead of one rank raising while the others wait
#: for it. Never a valid message: frame.join's first word would claim a frame of ~760 MB in 16 bytes.
NONFINITE: bytes = b"MRC-NONFINITE\x00\x00\x00"

#: `measured` pays a 16-byte statistics prefix on each of the n - 1 reduce-scatter messages of a segment
#: from the segment's bit budget. Where that costs more than this share of the budget (the smallest
#: segment of a small buffer: 4 ranks x 64 elements at 2 bits left its hops a quarter bit and gave a
#: vNMSE of 80 against aware's 0.3, for more bytes), the call uses aware's schedule instead: the decision
#: depends only on the length, the world size and the budget, so every rank takes the same one.
MEASURED_MAX_PREFIX = 1 / 16


def _ieee_sum() -> np.errstate:
    """An uncompressed sum is IEEE's, as NCCL's and Gloo's: inf + -inf is NaN and a sum past float32's
    range is inf, which reach every rank (GradScaler looks for them); numpy's RuntimeWarning for each
    is no news to anyone."""
    return np.errstate(invalid="ignore", over="ignore")


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
    #                           (measured: the prior for the first hop only, which has no data yet)
    group: int = 0  # coordinates per codec scale (a power of two >= 256); 0: one scale per segment

    def __post_init__(self) -> None:
        for name in ("seed", "group"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise UsageError(f"{name} must be an integer, got {type(v).__name__} {v!r}")
        if not 0 <= int(self.seed) < 1 << 64:
            raise UsageError(f"seed must be in [0, 2^64), got {self.seed}")
        for name in ("bits", "correlation"):
            v = getattr(self, name)
            if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, bool):
                raise UsageError(f"{name} must be a number, got {type(v).__name__} {v!r}")
        if not isinstance(self.average, (bool, np.bool_)):
            raise UsageError(f"average must be True or False, got {self.average!r}")
        if self.scheme not in COMPRESSIONS:
            raise UsageError(f"unknown scheme {self.scheme!r} (known: {', '.join(COMPRESSIONS)})")
        if self.partial_sums not in PARTIAL_SUMS:
            raise UsageError(f"partial sums must be one of {', '.join(PARTIAL_SUMS)}")
        if self.algorithm not in ALGORITHMS:
            raise UsageError(f"algorithm must be one of {', '.join(ALGORITHMS)}")
        if self.scheme != "none":
            check_bits(self.scheme, self.bits)
            if self.bits < BUDGET_STEP:
                raise UsageError(f"a collective's bit budget is at least {BUDGET_STEP} (one step of the "
                                 f"per-hop schedules), got {self.bits}")
        if not 0.0 <= self.correlation <= 1.0:
            raise UsageError(f"correlation must be in [0, 1], got {self.correlation}")
        if self.group:
            if self.scheme == "none":
                raise UsageError("group (scales per block) needs a codec scheme")
            try:
                check_group(self.scheme, self.group)
            except CodecError as e:
                raise UsageError(str(e)) from e


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


def max_message_bytes(length: int, n: int, algorithm: str = "ring") -> int:
    """An upper bound on the largest message a rank posts for a buffer of `length` float32 elements:
    one segment (ring: messages are pipelined segment by segment) or the whole buffer (one-shot), raw
    float32 — a codec frame at <= 8 bits is never larger than that plus its header — plus framing and
    codec headers, 256 bytes per frame (one per piece, frame.pieces) and 4096 for TurboQuant_prod's
    per-block norms."""
    if algorithm == "oneshot":
        return 4 * length + 4096 + 256 * sum(len(frame.pieces(s)) for s in frame.segments(length))
    biggest = max((4 * s + 256 * len(frame.pieces(s)) for b, e in chunk_bounds(length, n)
                   for s in frame.segments(e - b)), default=256)
    return biggest + 4096


def derive_seed(*parts: int | np.integer) -> int:
    """A 64-bit seed from integers (SeedSequence hashing: independent streams for distinct tuples). Each
    part is taken as a Python int first (operator.index): a numpy integer (a seed or step read from an
    array, np.int64) ANDed with the 64-bit mask raised OverflowError; the same value as a Python int or a
    numpy integer gives the same seed."""
    ss = np.random.SeedSequence([operator.index(p) & 0xFFFFFFFFFFFFFFFF for p in parts])
    return int(ss.generate_state(1, np.uint64)[0])


class _Counter:
    def __init__(self, t: Transport) -> None:
        self.t = t
        self.bytes = 0
        self.messages = 0

    def send(self, dst: int, tag: int, data: Message) -> None:
        self.bytes += len(data)
        self.messages += 1
        self.t.send(dst, tag, data)


def allreduce(t: Transport, x: npt.ArrayLike, cfg: Config, step: int = 0, residual: bool = False,
              out: F32 | None = None) -> Result:
    """Sum (or average, cfg.average) of every rank's 1-D float32 buffer. `step` must be the same on every
    rank (it seeds the rotations); `residual` also returns this rank's quantization residual. Real
    numbers only: complex, bool, object and string buffers, and float64 values beyond float32's range,
    are refused (UsageError) rather than cast (the imaginary part dropped, None to NaN, 1e300 to inf).
    `out`: a contiguous float32 buffer of the input's length, not overlapping it, that the ring writes
    its result into (Result.out is then `out`): a caller that all-reduces buffers of one size again and
    again keeps one, instead of the fresh pages of a new result each time."""
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
        raise UsageError(f"step must be an integer, got {type(step).__name__} {step!r}")
    step = operator.index(step)  # numpy integers as Python ints (derive_seed's 64-bit arithmetic)
    if not 0 <= step < 1 << 64:
        raise UsageError(f"step must be in [0, 2^64) (it seeds the rotations), got {step}")
    a = _as_float32(x)
    if out is not None:
        _check_out(out, a)
    n = t.world_size
    if n == 1:
        if out is None:
            out = a.copy()
        else:
            out[:] = a
        return Result(out, residual=np.zeros_like(a) if residual else None)
    if cfg.algorithm == "oneshot":
        res = _oneshot(t, a, cfg, step, residual)
        if out is not None:
            out[:] = res.out
            res.out = out
    elif cfg.scheme == "none":
        res = _ring(t, a, cfg, step, _RawChunks(), residual, out)
    elif cfg.partial_sums == "naive":
        res = _ring(t, a, cfg, step, _FiniteGuard(_CodecChunks(cfg, step)), residual, out)
    elif cfg.partial_sums == "aware":
        res = _ring(t, a, cfg, step, _FiniteGuard(_ScheduledChunks(cfg, step, n)), residual, out)
    elif measured_prefix_bits(a.size, n) > MEASURED_MAX_PREFIX * cfg.bits:
        # segments too small for measured's statistics prefix: aware's schedule (module constant's doc)
        res = _ring(t, a, cfg, step, _FiniteGuard(_ScheduledChunks(cfg, step, n)), residual, out)
    else:
        res = _ring(t, a, cfg, step, _FiniteGuard(_MeasuredChunks(cfg, step, n)), residual, out)
    if cfg.average:
        res.out /= np.float32(n)
    return res


_F32_MAX = float(np.finfo(np.float32).max)


def _as_float32(x: npt.ArrayLike) -> F32:
    """The buffer as contiguous 1-D float32 (a float32 input is not copied); UsageError for what float32
    cannot hold without changing it silently."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise UsageError(f"all-reduce takes real numbers (float or integer arrays), got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and arr.dtype.itemsize > 4 and arr.size:
        big = np.abs(arr[np.isfinite(arr)])
        if big.size and float(big.max()) > _F32_MAX:
            raise UsageError(f"a {arr.dtype} value of {float(big.max()):g} is beyond float32's range "
                             f"({_F32_MAX:.4g}), which the all-reduce computes in")
    return np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)


def measured_prefix_bits(length: int, n: int) -> float:
    """Bits per coordinate that measured's statistics prefixes take from the smallest segment's budget
    (0 for an empty buffer or one rank)."""
    segs = [s for b, e in chunk_bounds(length, n) for s in frame.segments(e - b) if s]
    if n < 2 or not segs:
        return 0.0
    return (n - 1) * 8.0 * frame.STATS.size / min(segs)


def _check_out(out: F32, a: F32) -> None:
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.ndim != 1 \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise UsageError("out must be a writable contiguous 1-D float32 array")
    if out.size != a.size:
        raise UsageError(f"out holds {out.size} elements, the input {a.size}")
    if np.shares_memory(out, a):
        raise UsageError("out must not overlap the input (the ring reads the input until its last step)")


class _Chunks:
    """How one strategy represents a segment of chunk c: `pack` (segment i of chunk c, holding k
    contributions -> message), `unpack` (message holding k contributions -> float32 segment), `advance`
    (one reduce-scatter hop: incoming message + own segment -> outgoing message, and the exact sum it
    quantized when asked). Segment i of every message about chunk c has the size `sizes[c][i]` (set by
    the ring before use; both ends know the layout)."""

    sizes: dict[int, list[int]]

    def pack(self, c: int, i: int, seg: F32, k: int) -> Message:
        raise NotImplementedError

    def unpack(self, c: int, i: int, msg: Message, k: int) -> F32:
        raise NotImplementedError

    def unpack_into(self, c: int, i: int, msg: Message, k: int, into: F32) -> F32:
        """unpack(c, i, msg, k) written into `into` (the segment's place in the result; returned)."""
        into[...] = self.unpack(c, i, msg, k)
        return into

    def advance(self, c: int, i: int, msg: bytes, own: F32, k: int,
                want_sum: bool) -> tuple[Message, F32 | None]:
        work = self.unpack(c, i, msg, k - 1)
        with _ieee_sum():
            work += own
        return self.pack(c, i, work, k), work

    def bits(self, n: int) -> tuple[float, ...]:
        return ()


class _RawChunks(_Chunks):
    """Uncompressed: a segment's float32 bytes. With ZERO_COPY a message is a view of the array it comes
    from (the caller's input for the first hop, a hop's fresh sum after that; neither changes while the
    message waits) and an incoming segment is read in place; otherwise both are copies."""

    def pack(self, c: int, i: int, seg: F32, k: int) -> Message:
        return seg.data.cast("B") if ZERO_COPY else seg.tobytes()

    def unpack(self, c: int, i: int, msg: Message, k: int) -> F32:
        """The segment (read-only with ZERO_COPY: a view of `msg`); UsageError unless `msg` holds the
        segment's float32 values exactly."""
        if len(msg) != 4 * self.sizes[c][i]:
            raise UsageError(f"chunk segment of {len(msg)} bytes received where {self.sizes[c][i]} "
                             f"float32 values were expected")
        seg = np.frombuffer(msg, np.float32)
        return seg if ZERO_COPY else seg.copy()

    def advance(self, c: int, i: int, msg: bytes, own: F32, k: int,
                want_sum: bool) -> tuple[Message, F32 | None]:
        if not ZERO_COPY:
            return super().advance(c, i, msg, own, k, want_sum)
        with _ieee_sum():
            work = np.add(self.unpack(c, i, msg, k - 1), own)  # the one new array of the hop
        return self.pack(c, i, work, k), work


class _CodecChunks(_Chunks):
    """Naive: each segment in the original domain, the mrc.quant codec frames of its pieces (frame.pieces)
    joined in one message."""

    def __init__(self, cfg: Config, step: int) -> None:
        self.cfg = cfg
        self.step = step
        self.group = cfg.group or None
        self._layouts: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def _bits(self, k: int) -> float:
        return float(self.cfg.bits)

    def _pieces(self, c: int, i: int) -> list[tuple[int, int]]:
        """(offset, size) of each codec frame of segment i of chunk c: frame.pieces of its size."""
        lay = self._layouts.get((c, i))
        if lay is None:
            lay, pos = [], 0
            for size in frame.pieces(self.sizes[c][i]):
                lay.append((pos, size))
                pos += size
            self._layouts[(c, i)] = lay
        return lay

    def _seed(self, c: int, i: int, k: int, j: int) -> int:
        """Piece j of segment i of chunk c at hop k. Piece 0 keeps the seed the segment's single frame had
        before segments were cut into pieces (a one-piece segment is the same bytes); the others add j."""
        if j == 0:
            return derive_seed(self.cfg.seed, self.step, 1, c, i, k)
        return derive_seed(self.cfg.seed, self.step, 1, c, i, k, j)

    def _encode(self, c: int, i: int, seg: F32, k: int, bits: float) -> list[bytes]:
        return [_encode_finite(seg[o : o + size], self.cfg.scheme, bits, self._seed(c, i, k, j), self.group)
                for j, (o, size) in enumerate(self._pieces(c, i))]

    def pack(self, c: int, i: int, seg: F32, k: int) -> bytes:
        return frame.join(self._encode(c, i, seg, k, self._bits(k)))

    def _check(self, c: int, i: int, j: int, got: int, want: int) -> None:
        if got != want:
            raise UsageError(f"frame {j} of chunk {c} segment {i} holds {got} elements where {want} "
                             f"were expected")

    def _decode(self, c: int, i: int, frames: list[memoryview], into: F32 | None = None) -> F32:
        """The segment from the frames of its pieces (frame.split checked their count), in `into` when
        given (each piece decoded in its place: codec.decode's `out`); UsageError if a frame's element
        count is not its piece's."""
        lay = self._pieces(c, i)
        if into is None and len(lay) == 1:
            self._check(c, i, 0, parse(frames[0]).d, lay[0][1])  # before decoding what it claims
            return np.asarray(decode(frames[0], dtype=np.float32), np.float32).reshape(-1)
        out = np.empty(self.sizes[c][i], np.float32) if into is None else into
        for j, ((o, size), f) in enumerate(zip(lay, frames, strict=True)):
            got = parse(f).d
            self._check(c, i, j, got, size)
            decode(f, dtype=np.float32, out=out[o : o + size])
        return out

    def _split(self, c: int, i: int, msg: Message) -> list[memoryview]:
        """frame.split of segment i of chunk c, a framing that does not add up raised as the UsageError
        it almost always is: a peer whose buffer has another length cuts its chunks, segments and
        pieces differently (the CodecError about trailing bytes named neither length)."""
        count = len(self._pieces(c, i))
        try:
            return frame.split(msg, count)
        except CodecError as e:
            raise _size_mismatch(f"chunk {c} segment {i}", self.sizes[c][i], count, msg, e) from e

    def _split_stats(self, c: int, i: int,
                     msg: Message) -> tuple[tuple[float, float, float, float], list[memoryview]]:
        """frame.split_stats of a measured message, its framing errors raised as `_split`'s."""
        count = len(self._pieces(c, i))
        try:
            return frame.split_stats(msg, count)
        except CodecError as e:
            raise _size_mismatch(f"chunk {c} segment {i}", self.sizes[c][i], count, msg, e) from e

    def unpack(self, c: int, i: int, msg: Message, k: int) -> F32:
        return self._decode(c, i, self._split(c, i, msg))

    def unpack_into(self, c: int, i: int, msg: Message, k: int, into: F32) -> F32:
        return self._decode(c, i, self._split(c, i, msg), into)

    def advance(self, c: int, i: int, msg: bytes, own: F32, k: int,
                want_sum: bool) -> tuple[Message, F32 | None]:
        if want_sum or self._huge(c, i, msg, own):
            # decode + add + encode, whose `_encode_finite` sends a float64 frame where the fused
            # kernel (or hop.three_pass) would send a float32 one past its range
            msg_out, work = super().advance(c, i, msg, own, k, True)
            return msg_out, (work if want_sum else None)
        return self.hop(c, i, msg, own, k), None  # decode + add + encode in one call

    def bits(self, n: int) -> tuple[float, ...]:
        return tuple([float(self.cfg.bits)] * n)

    def _huge(self, c: int, i: int, msg: Message, own: F32) -> bool:
        """Whether the own segment or the incoming partial sum (its frames' scales, read from their
        headers without a CRC pass) may be near float32's maximum (`_HUGE`)."""
        if own.size and max(float(own.max()), -float(own.min())) >= _HUGE:
            return True
        try:
            frames = frame.split(msg, len(self._pieces(c, i)))
        except CodecError:
            return False  # the hop raises it, with the sizes
        return any(peek_magnitude(f) >= _HUGE / 4 for f in frames)

    def hop(self, c: int, i: int, msg: bytes, own: F32, k: int) -> bytes:
        """pack(c, i, unpack(c, i, msg) + own, k), the same bytes, through mrc.quant.hop piece by piece:
        the fused one-sweep kernel by default, the three passes with MRC_HOP_KERNEL=three-pass
        (docs/collective.md)."""
        lay = self._pieces(c, i)
        bits = self._bits(k)
        out = []
        for j, ((o, size), f) in enumerate(zip(lay, self._split(c, i, msg), strict=True)):
            self._check(c, i, j, parse(f).d, size)
            out.append(qhop.hop(f, own[o : o + size], self.cfg.scheme, bits, self._seed(c, i, k, j),
                                group=self.group))
        return frame.join(out)


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


class _MeasuredChunks(_CodecChunks):
    """Measured (module doc): hop k's bits from the data. A reduce-scatter message (k < n contributions)
    carries (spent, C, Q, A): the nominal bits of the frames so far, C = sum_j <P^_{j-1}, x_j> (the
    decoded incoming partial sum against the hop's own chunk), Q = sum_j (j-1) ||x_j||^2 and
    A = sum_j ||x_j||^2. For contributions of equal energy and pairwise correlation rho,
    E <P_{j-1}, x_j> = (j-1) rho ||x||^2 (quantization errors are unbiased and independent of x_j), so
    C / Q estimates rho from every hop so far; the partial sum about to be quantized has measured
    weight ||P^_{k-1} + x_k||^2 / (A / k). The all-gather frame (k = n) takes what is left of the budget
    (the prefixes' bytes deducted from it); its message has no prefix. The first hop has no data and
    uses aware's schedule for the prior `correlation`."""

    def __init__(self, cfg: Config, step: int, n: int) -> None:
        super().__init__(cfg, step)
        self.n = n
        self.first = aware_bits(cfg.scheme, float(cfg.bits), n, cfg.correlation)[0]
        self.used: dict[int, list[float]] = {}  # k -> bits this rank chose for its hop-k frames

    def pack(self, c: int, i: int, seg: F32, k: int) -> bytes:
        if k != 1:
            raise AssertionError("measured: only the first hop packs without an incoming message")
        e = float(np.dot(seg.astype(np.float64), seg.astype(np.float64)))
        self.used.setdefault(1, []).append(self.first)
        return frame.join_stats((self.first, 0.0, 0.0, e), self._encode(c, i, seg, 1, self.first))

    def unpack(self, c: int, i: int, msg: Message, k: int) -> F32:
        if k >= self.n:
            return super().unpack(c, i, msg, k)
        return self._decode(c, i, self._split_stats(c, i, msg)[1])

    def unpack_into(self, c: int, i: int, msg: Message, k: int, into: F32) -> F32:
        if k >= self.n:
            return super().unpack_into(c, i, msg, k, into)
        return self._decode(c, i, self._split_stats(c, i, msg)[1], into)

    def advance(self, c: int, i: int, msg: bytes, own: F32, k: int,
                want_sum: bool) -> tuple[bytes, F32 | None]:
        (spent, cross, q, a), frames = self._split_stats(c, i, msg)
        if spent < 0 or a < 0 or q < 0:
            raise UsageError("measured: inconsistent partial-sum statistics")
        work = self._decode(c, i, frames)
        own64 = own.astype(np.float64)
        e_own = float(np.dot(own64, own64))
        cross += float(np.dot(work.astype(np.float64), own64))
        q += (k - 1) * e_own
        a += e_own
        work += own
        w64 = work.astype(np.float64)
        mean = a / k
        w_now = float(np.dot(w64, w64)) / mean if mean > 0 else float(k)
        rho = min(max(cross / q, 0.0), 1.0) if q > 0 else self.cfg.correlation
        # the prefixes of the n - 1 reduce-scatter messages are paid from the same budget (bits per
        # coordinate), so that measured sends the bytes aware does, not 16 (n - 1) more per segment
        overhead = (self.n - 1) * 8.0 * frame.STATS.size / max(work.size, 1)
        bits = measured_bits(self.cfg.scheme, float(self.cfg.bits), self.n, k, spent + overhead, w_now,
                             rho)
        self.used.setdefault(k, []).append(bits)
        out = self._encode(c, i, work, k, bits)
        if k == self.n:
            return frame.join(out), work
        return frame.join_stats((spent + bits, cross, q, a), out), work

    def bits(self, n: int) -> tuple[float, ...]:
        """The mean bits this rank chose per hop it quantized (0 where it quantized none)."""
        return tuple(float(np.mean(self.used[k])) if k in self.used else 0.0 for k in range(1, n + 1))


def _encode_finite(x: F32, scheme: str, bits: float, seed: int, group: int | None) -> bytes:
    """codec.encode of a finite float32 piece; one whose rotated values pass float32's range (a piece
    of values near its maximum: constant 1e38) is encoded as a float64 frame, which the codec computes
    in float64: the same bits per coordinate, the same relative error. Receivers decode every frame
    with dtype=float32, which saturates a reconstruction past 3.4e38 (the codec's noise) to the largest
    finite value, as the codec does for float16 (docs/quant.md, "Finite output, always"); before, such
    a piece was refused as non-finite and its rank failed alone."""
    if x.size and x.dtype == np.float32 and max(float(x.max()), -float(x.min())) >= _HUGE \
            and _finite(x):  # (non-finite: encode refuses it below, as before)
        return encode(x.astype(np.float64), scheme, bits, seed=seed, group=group)
    return encode(x, scheme, bits, seed=seed, group=group)


#: A float32 piece with a value of this magnitude or more is encoded as a float64 frame
#: (`_encode_finite`): its rotated values (spread up to ~max |x|, tails 4-5 times that) and the codec's
#: noise on its reconstruction can pass float32's maximum, which the float32 frame cannot describe.
_HUGE = float(np.finfo(np.float32).max) / 16


class SizeMismatch(UsageError, CodecError):
    """A message whose framing does not add up to this rank's layout: a UsageError (almost always the
    ranks' buffers differ in length: the message names the sizes) and still the CodecError it was
    (a malformed message), so that callers catching either see it."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)
        self.reason = message


def _size_mismatch(what: str, size: int, count: int, msg: Message, err: CodecError) -> UsageError:
    """The UsageError for a message whose frames do not add up to this rank's layout, naming this
    rank's element count and, where the first frame parses, the element count the peer encoded."""
    theirs = ""
    try:
        first = frame.split(msg[: 4 + int.from_bytes(bytes(msg[:4]), "little")], 1)[0]
        theirs = f"; the peer's first frame holds {parse(first).d} elements"
    except (CodecError, ValueError):
        pass
    return SizeMismatch(f"{what}: a message of {len(msg)} bytes does not hold this rank's {size} elements "
                      f"in {count} frame(s) ({err}){theirs}: "
                      "do all ranks pass buffers of the same length?")


def _is_nonfinite(msg: Message) -> bool:
    return len(msg) == len(NONFINITE) and bytes(msg) == NONFINITE


def _finite(a: F32) -> bool:
    return bool(np.isfinite(a).all())


class _FiniteGuard(_Chunks):
    """A codec strategy with non-finite segments carried as NONFINITE (module constant's doc) rather than
    refused: a hop whose incoming message is NONFINITE or whose own segment is not finite sends NONFINITE;
    NONFINITE decodes to NaN. Finite segments go through the wrapped strategy unchanged (same bytes)."""

    def __init__(self, inner: _Chunks) -> None:
        self.inner = inner

    @property
    def sizes(self) -> dict[int, list[int]]:
        return self.inner.sizes

    @sizes.setter
    def sizes(self, value: dict[int, list[int]]) -> None:
        self.inner.sizes = value

    def pack(self, c: int, i: int, seg: F32, k: int) -> Message:
        if not _finite(seg):
            return NONFINITE
        try:
            return self.inner.pack(c, i, seg, k)
        except CodecError:  # finite but beyond the codec's range (`advance`): the same marker
            return NONFINITE

    def unpack(self, c: int, i: int, msg: Message, k: int) -> F32:
        if _is_nonfinite(msg):
            return np.full(self.inner.sizes[c][i], np.nan, np.float32)
        return self.inner.unpack(c, i, msg, k)

    def unpack_into(self, c: int, i: int, msg: Message, k: int, into: F32) -> F32:
        if _is_nonfinite(msg):
            into[...] = np.nan
            return into
        return self.inner.unpack_into(c, i, msg, k, into)

    def advance(self, c: int, i: int, msg: bytes, own: F32, k: int,
                want_sum: bool) -> tuple[Message, F32 | None]:
        """A finite incoming partial sum plus a finite own segment can still overflow float32 (4 ranks
        of 3e38): the wrapped strategy then fails to encode it (CodecError) -- which used to fail this
        rank alone while every other rank waited for its message until its deadline. Such a sum is
        carried as NONFINITE, as an IEEE sum carries it as inf: every rank gets NaN there, promptly.
        Only on the wrapped strategy's failure is the sum formed again here (decode + add: no cost on
        the normal path); if it is finite the failure was the fused kernel's, and the plain
        decode-add-encode path (the same frames' reference) encodes it; a malformed incoming message
        still raises, from the decode."""
        if _is_nonfinite(msg) or not _finite(own):
            return NONFINITE, (np.full(own.size, np.nan, np.float32) if want_sum else None)
        try:
            with _ieee_sum():  # an overflowing sum is handled below, not warned about
                return self.inner.advance(c, i, msg, own, k, want_sum)
        except CodecError:
            try:
                with _ieee_sum():
                    total = np.add(self.inner.unpack(c, i, msg, k - 1), own)
            except DecodeOverflow:  # a well-formed frame of values past float32: they overflowed
                total = np.full(1, np.inf, np.float32)
            if not _finite(total):
                return NONFINITE, (np.full(own.size, np.nan, np.float32) if want_sum else None)
        # finite: the fused kernel's failure (its rotation of a sum near float32's maximum overflows);
        # the decode-add-encode path (want_sum) encodes it. The incoming message decoded above, so a
        # failure there is the encoder's: a finite sum beyond what a float32 frame represents
        # (codec._check_representable), carried as NONFINITE too, so that no rank is left waiting
        try:
            msg_out, work = self.inner.advance(c, i, msg, own, k, True)
        except CodecError:
            return NONFINITE, (np.full(own.size, np.nan, np.float32) if want_sum else None)
        return msg_out, (work if want_sum else None)

    def bits(self, n: int) -> tuple[float, ...]:
        return self.inner.bits(n)


def send_window(t: Transport) -> int:
    """How many messages a rank may have posted to one peer, not yet consumed there, without `send`
    blocking (a transport's `send_window` attribute; 1 when it does not say: the safe assumption)."""
    return max(1, int(getattr(t, "send_window", 1)))


def _ring(t: Transport, a: F32, cfg: Config, step: int, rep: _Chunks, want_residual: bool,
          out: F32 | None = None) -> Result:
    """Ring reduce-scatter + all-gather, pipelined by segment.

    Message g (g = 0 .. 2 (n-1) m - 1, m segments per chunk) is segment g % m of ring step g // m:
    steps 0..n-2 reduce-scatter (step s carries chunk (r - s) with s + 1 contributions), steps
    n-1..2n-3 all-gather (the frame of each chunk's full sum, forwarded as is). Message g + m can only
    be built once message g came in from the left (it holds that partial sum, or is that frame), so
    each rank sends messages 0 .. L-1, then for every g receives message g, processes it and sends
    message g + L (L = min(m, send window)). Encoding segment i + 1 then overlaps with segment i on the
    wire and at the next ranks, instead of a whole chunk waiting for the previous hop. Deadlock-free: a
    rank waiting for message g has L messages outstanding toward its right, which the window allows.
    The seeds, bits and bytes of every frame are those of the unpipelined ring (piece j of segment i of
    chunk c at hop k is seeded by (seed, step, c, i, k[, j])), so the result does not depend on L."""
    n, r = t.world_size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    bounds = chunk_bounds(a.size, n)
    sizes = {c: frame.segments(e - s) for c, (s, e) in enumerate(bounds)}
    rep.sizes = sizes
    io = _Counter(t)

    offs = {c: [bounds[c][0] + sum(sizes[c][:i]) for i in range(len(sizes[c]))] for c in range(n)}

    def own(c: int, i: int) -> F32:
        return a[offs[c][i] : offs[c][i] + sizes[c][i]]

    if out is None:  # the result, each decoded segment copied to its place once
        out = np.empty(a.size, np.float32)

    def place(c: int, i: int, msg: Message) -> F32:
        """Message `msg` holding all n contributions to segment i of chunk c, decoded into its place
        (with ZERO_COPY=0: decoded, then copied there)."""
        dst = out[offs[c][i] : offs[c][i] + sizes[c][i]]
        if not ZERO_COPY:
            dst[...] = rep.unpack(c, i, msg, n)
            return dst
        return rep.unpack_into(c, i, msg, n, dst)

    # chunks differ by at most one element, but their segment lists may differ in length (2^21 elements
    # are two segments, 2^21 - 1 are many): m is the longest; a step's message i is skipped (neither sent
    # nor expected) when its chunk has no segment i
    m = max(len(v) for v in sizes.values())
    total = 2 * (n - 1) * m
    resid: dict[int, dict[int, F32]] = {c: {} for c in range(n)}
    out_msgs: dict[int, Message] = {}

    def build_first(g: int) -> None:
        c, i = r % n, g
        if i < len(sizes[c]):
            msg = rep.pack(c, i, own(c, i), 1)
            out_msgs[g] = msg
            if want_residual:
                resid[c][i] = own(c, i) - rep.unpack(c, i, msg, 1)

    def receive(g: int) -> None:
        s, i = divmod(g, m)
        if s < n - 1:  # reduce-scatter: the left's partial sum of chunk (r - s - 1) with s + 1 parts
            c = (r - s - 1) % n
            if i >= len(sizes[c]):
                return
            incoming = t.recv(left, _TAG_RS + _tag(s, i))
            msg, work = rep.advance(c, i, incoming, own(c, i), s + 2, want_residual)
            out_msgs[g + m] = msg
            dec = None
            if s == n - 2:  # c == (r + 1) % n, owned here: this frame is the chunk's result everywhere
                try:
                    dec = place(c, i, msg)
                except DecodeOverflow:
                    # the frame of a finite sum whose reconstruction overflows float32 (its noise on
                    # values near the maximum): NONFINITE instead, before it is sent, so every rank
                    # gets NaN here rather than this one raising while the others wait for the frame
                    if not isinstance(rep, _FiniteGuard):
                        raise
                    msg = out_msgs[g + m] = NONFINITE
                    dec = place(c, i, msg)
            if want_residual:
                assert work is not None
                resid[c][i] = work - (dec if dec is not None else rep.unpack(c, i, msg, s + 2))
        else:  # all-gather: the frame of chunk (r - t) (t = s - (n - 1)), forwarded unchanged
            c = (r - (s - (n - 1))) % n
            if i >= len(sizes[c]):
                return
            msg = t.recv(left, _TAG_AG + _tag(s - (n - 1), i))
            place(c, i, msg)
            if g + m < total:
                out_msgs[g + m] = msg

    def send(g: int) -> None:
        msg = out_msgs.pop(g, None)
        if msg is None:
            return  # a segment the (shorter) chunk does not have
        s, i = divmod(g, m)
        tag = _TAG_RS + _tag(s, i) if s < n - 1 else _TAG_AG + _tag(s - (n - 1), i)
        io.send(right, tag, msg)

    lead = min(m, send_window(t))
    for g in range(lead):
        build_first(g)
        send(g)
    for g in range(total):
        receive(g)
        nxt = g + lead
        if nxt < total:
            if nxt < m:
                build_first(nxt)
            send(nxt)
    t.flush()
    rvec = None
    if want_residual:
        rvec = np.concatenate([_join(resid[c], len(sizes[c])) for c in range(n)])
        # a NONFINITE segment leaves nothing meaningful out: error feedback must not carry NaN onward
        np.nan_to_num(rvec, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    return Result(out.astype(np.float32, copy=False), io.bytes, io.messages, rep.bits(n), rvec)


def _tag(step: int, seg: int) -> int:
    """A message's tag within its phase: the ring step and the segment (checked by the receiver)."""
    return ((step & 0xFFF) << 8) | (seg & 0xFF)


def _join(parts: dict[int, F32], count: int) -> F32:
    return np.concatenate([parts[i] for i in range(count)]) if count else np.zeros(0, np.float32)


def _oneshot(t: Transport, a: F32, cfg: Config, step: int, want_residual: bool) -> Result:
    """Baseline: every rank compresses its whole buffer once (its own seed), the frames are all-gathered
    around the ring, every rank decodes all n and averages in float64. One quantization per contribution:
    error v / n of the average for unbiased schemes; wire (n - 1) whole buffers per rank."""
    n, r = t.world_size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    io = _Counter(t)
    # (offset, size, segment, piece) of every codec frame of the buffer: the segments' pieces in order
    layout: list[tuple[int, int, int, int]] = []
    pos = 0
    for i, seg in enumerate(frame.segments(a.size)):
        for j, size in enumerate(frame.pieces(seg)):
            layout.append((pos, size, i, j))
            pos += size

    def enc(rank: int) -> bytes:
        if cfg.scheme == "none":
            return a.tobytes()
        if not _finite(a):
            return NONFINITE
        return frame.join([_encode_finite(a[o : o + size], cfg.scheme, cfg.bits,
                                          derive_seed(cfg.seed, step, 4, rank, i, *((j,) if j else ())),
                                          None) for o, size, i, j in layout])

    def dec(msg: bytes) -> npt.NDArray[np.float64]:
        if cfg.scheme == "none":
            # the size first: frombuffer's own ValueError for a length that is not a multiple of 4
            # named neither size
            if len(msg) != 4 * a.size:
                raise UsageError(f"one-shot buffer of {len(msg)} bytes received where {4 * a.size} "
                                 f"({a.size} float32 values) were expected")
            return np.frombuffer(msg, np.float32).astype(np.float64)
        if _is_nonfinite(msg):
            return np.full(a.size, np.nan)
        out = np.empty(a.size, np.float64)
        try:
            frames = frame.split(msg, len(layout))
        except CodecError as e:
            raise _size_mismatch("one-shot buffer", a.size, len(layout), msg, e) from e
        for (o, size, i, j), f in zip(layout, frames, strict=True):
            part = np.asarray(decode(f), np.float64).reshape(-1)
            if part.size != size:
                raise UsageError(f"frame {j} of segment {i} holds {part.size} elements where {size} "
                                 f"were expected")
            out[o : o + size] = part
        return out

    msg = enc(r)
    try:
        total = dec(msg)
    except DecodeOverflow:  # its reconstruction overflows float32 (ring.py, receive): NaN on every rank
        msg = NONFINITE
        total = dec(msg)
    rvec = None
    if want_residual:
        with _ieee_sum():  # a decoded value past float32 (noise on an input near its maximum): inf, zeroed
            rvec = (a - total).astype(np.float32)
        np.nan_to_num(rvec, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
    for s in range(n - 1):
        io.send(right, _TAG_ONESHOT + s, msg)
        msg = t.recv(left, _TAG_ONESHOT + s)
        total += dec(msg)
    t.flush()
    with _ieee_sum():  # a float64 sum past float32's range rounds to inf, as the ring's IEEE sums do
        result = total.astype(np.float32)
    return Result(result, io.bytes, io.messages,
                  () if cfg.scheme == "none" else (float(cfg.bits),), rvec)


def vnmse(estimate: npt.ArrayLike, exact: npt.ArrayLike) -> float:
    """||estimate - exact||^2 / ||exact||^2 in float64 (0 when both are zero)."""
    x = np.asarray(exact, np.float64)
    den = float(np.dot(x, x))
    d = np.subtract(estimate, x, dtype=np.float64)  # the one temporary: float64(estimate) - exact
    num = float(np.dot(d, d))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)
