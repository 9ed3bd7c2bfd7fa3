"""Hierarchical all-reduce for several ranks per host (docs/collective.md, "Partial sums: grouped
scales, data-driven bits, hierarchy").

    1. intra-host reduce: every rank of a host sends its buffer to the host's leader (local rank 0) over
       the host's own transport (shared memory): raw float32 (`intra="none"`) or one codec frame
       (`intra=<scheme>`, `intra_bits`); the leader sums in float64, in local-rank order;
    2. inter-host ring: the leaders run the compressed ring all-reduce (ring.allreduce, cfg) over their
       own transport, one contribution per host;
    3. intra-host broadcast: the leader sends the result, raw float32, to its ranks.

The intra-host messages are cut into the ring's segments (frame.segments: at most 2^20 elements, one
codec frame each with `intra`), so no message is larger than the ring's own (a transport with fixed
slots, MRC ranks, carries both) and a rank's upload and the leader's summing overlap segment by segment.

Why: a flat ring over hosts x ranks quantizes each chunk's partial sum at every one of its n - 1 hops
(and every rank's contribution once more), most of them between ranks of the same host where bandwidth
is plentiful; the hierarchy quantizes only across hosts, H - 1 hops instead of H L - 1, so the error the
codec adds is that of an H-rank ring, at about the same inter-host bytes per host (2 (H-1)/H of the
buffer instead of 2 (HL-1)/(HL) on each host's one ring link out). The result is bit-identical on every
rank: each leader holds the ring's (bit-identical) result and broadcasts it unquantized.

Bytes are counted apart: `inter_bytes` (the ring, leaders only) and `intra_bytes` (shared memory).
`simulate` runs hosts x ranks in this process (threads over in-process transports), for measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mrc.errors import UsageError
from mrc.quant.codec import SCHEMES, check_bits, decode, encode, parse

from . import frame
from .ring import Config, _as_float32, allreduce, derive_seed
from .transport import SubTransport, Transport, run_inproc

F32 = npt.NDArray[np.float32]
INTRA = ("none", *SCHEMES)
#: how ranks that share hosts all-reduce: `hier` (this module), `flat` (one ring over every rank), `auto`
#: (hier with several ranks on a host: measured faster and more accurate, docs/collective.md)
LAYOUTS = ("auto", "flat", "hier")

_TAG_UP = 5 << 20
_TAG_DOWN = 6 << 20


@dataclass
class HierResult:
    out: F32
    inter_bytes: int = 0  # bytes this rank posted between hosts (the leaders' ring)
    intra_bytes: int = 0  # bytes this rank posted within its host (reduce to, broadcast from the leader)
    bits_per_hop: tuple[float, ...] = ()
    messages: int = 0  # messages this rank posted, both kinds


def intra_bits_for(scheme: str) -> float:
    """The bit budget of a host's intra-host messages with codec `scheme` (the CLI has no option for
    it): 8 bits, or DRIVE's one, the only budget it takes (`--intra drive` always failed at 8)."""
    return 1.0 if scheme == "drive" else 8.0


def _bounds(length: int) -> list[tuple[int, int]]:
    """The intra-host messages' element ranges: the buffer cut as the ring cuts a chunk."""
    out = []
    b = 0
    for s in frame.segments(length):
        out.append((b, b + s))
        b += s
    return out


def _shaped(out: F32, shape: tuple[int, ...]) -> F32:
    """The result in the caller's shape: `out` itself when it has it (a caller's buffer is returned as
    the same object), else a view."""
    return out if out.shape == shape else out.reshape(shape)


def allreduce_hier(local: Transport, inter: Transport | None, x: npt.ArrayLike, cfg: Config, step: int = 0,
                   intra: str = "none", intra_bits: float = 8.0, out: F32 | None = None,
                   work: F32 | None = None) -> HierResult:
    """Sum (or average, cfg.average, over all hosts x ranks) of every rank's 1-D float32 buffer. `local`:
    this host's transport (rank 0 the leader); `inter`: the transport between the hosts' leaders, given
    on the leader only (None elsewhere; a single host needs none). Every host must have the same number
    of ranks. `out` (the result) and, on a leader, `work` (the host's sum): float32 buffers of the
    input's length, not overlapping it or each other, that a caller all-reducing one size again and
    again keeps, instead of fresh pages each time (HierResult.out is then `out`, or a view of it in the
    input's shape). The input is validated and converted as the ring's (`ring._as_float32`): the same
    inputs are refused (complex, strings, float64 beyond float32's range: UsageError, where a bare cast
    here turned 1e300 into inf on this host only) and HierResult.out has the caller's shape (a 2-D
    buffer comes back 2-D, float32)."""
    if intra not in INTRA:
        raise UsageError(f"intra must be one of {', '.join(INTRA)}, got {intra!r}")
    if intra != "none":
        check_bits(intra, intra_bits)
    shape = np.shape(x)
    a = _as_float32(x)
    for name, buf in (("out", out), ("work", work)):
        if buf is not None and (buf.dtype != np.float32 or buf.shape != a.shape
                                or not buf.flags.c_contiguous or np.shares_memory(buf, a)):
            raise UsageError(f"{name} must be a contiguous float32 buffer of {a.size} elements apart from "
                             "the input")
    if out is not None and work is not None and np.shares_memory(out, work):
        raise UsageError("out and work must not overlap")
    lr, ln = local.rank, local.world_size
    leader = lr == 0
    if not leader and inter is not None:
        raise UsageError("the inter-host transport is for the host's leader (local rank 0) only")
    hosts = inter.world_size if inter is not None else 1
    parts = _bounds(a.size)
    intra_sent = 0
    if out is None:
        out = np.empty(a.size, np.float32)
    if not leader:
        for j, (b, e) in enumerate(parts):
            msg: bytes | memoryview = (a[b:e].data.cast("B") if intra == "none" else encode(
                a[b:e], intra, intra_bits, seed=derive_seed(cfg.seed, step, 5, lr, j)))
            local.send(0, _TAG_UP + j, msg)
            intra_sent += len(msg)
        for j, (b, e) in enumerate(parts):
            raw = local.recv(0, _TAG_DOWN + j)
            if len(raw) != 4 * (e - b):
                raise UsageError(f"broadcast segment {j} of {len(raw)} bytes where {4 * (e - b)} were "
                                 "expected")
            out[b:e] = np.frombuffer(raw, np.float32)
        local.flush()
        return HierResult(_shaped(out, shape), 0, intra_sent, messages=len(parts))
    # the host's sum, segment by segment as the uploads arrive: each in float64, in local-rank order,
    # then rounded once (a segment's accumulator is reused: no buffer twice the input's size)
    host_sum = work if work is not None else np.empty(a.size, np.float32)
    acc = np.empty(max((e - b for b, e in parts), default=0), np.float64)
    for j, (b, e) in enumerate(parts):
        seg = acc[: e - b]
        seg[:] = a[b:e]
        for src in range(1, ln):
            msg = local.recv(src, _TAG_UP + j)
            got = len(msg) // 4 if intra == "none" else parse(msg).d  # before decoding what it claims
            if got != e - b or (intra == "none" and len(msg) % 4):
                raise UsageError(f"local rank {src} sent {got} elements in segment {j} where {e - b} "
                                 "were expected")
            seg += np.frombuffer(msg, np.float32) if intra == "none" else np.asarray(decode(msg), np.float32)
        host_sum[b:e] = seg
    inter_sent = 0
    messages = 0
    bits: tuple[float, ...] = ()
    if inter is not None and hosts > 1:
        res = allreduce(inter, host_sum, dataclasses.replace(cfg, average=False), step, out=out)
        inter_sent, bits, messages = res.wire_bytes, res.bits_per_hop, res.messages
    else:
        out[:] = host_sum
    if cfg.average:
        out /= np.float32(hosts * ln)
    for j, (b, e) in enumerate(parts):
        view = out[b:e].data.cast("B")
        for dst in range(1, ln):
            local.send(dst, _TAG_DOWN + j, view)
            intra_sent += len(view)
            messages += 1
    local.flush()
    return HierResult(_shaped(out, shape), inter_sent, intra_sent, bits, messages)


def host_groups(t: Transport, hosts: Sequence[str]) -> tuple[SubTransport, SubTransport | None]:
    """Over one transport of all ranks (`hosts[r]`: rank r's host; every host's ranks in any order), this
    rank's host group (its co-located ranks in rank order, the first the leader) and, on a leader, the
    leaders' group (each host's first rank, in the order the hosts first appear)."""
    if len(hosts) != t.world_size:
        raise UsageError(f"{len(hosts)} hosts named for {t.world_size} ranks")
    mine = [r for r, h in enumerate(hosts) if h == hosts[t.rank]]
    leaders = [list(hosts).index(h) for h in dict.fromkeys(hosts)]
    return SubTransport(t, mine), (SubTransport(t, leaders) if t.rank == mine[0] else None)


def allreduce_hosts(t: Transport, hosts: Sequence[str], x: npt.ArrayLike, cfg: Config, step: int = 0,
                    intra: str = "none", intra_bits: float = 8.0, out: F32 | None = None,
                    work: F32 | None = None) -> HierResult:
    """`allreduce_hier` for a rank that sees every rank through one transport (the MRC ranks' own:
    shared memory to co-located ranks, MRC to the others), its groups made by `host_groups`. Every
    host must hold the same number of ranks."""
    counts = {hosts.count(h) for h in hosts}
    if len(counts) != 1:
        raise UsageError(f"the hosts hold different numbers of ranks ({sorted(counts)}): the average needs "
                         "equal groups")
    local, inter = host_groups(t, hosts)
    return allreduce_hier(local, inter, x, cfg, step, intra, intra_bits, out, work)


def simulate(buffers: Sequence[npt.ArrayLike], hosts: int, cfg: Config, step: int = 0, intra: str = "none",
             intra_bits: float = 8.0, timeout_s: float = 300.0) -> list[HierResult]:
    """`allreduce_hier` over hosts x ranks in this process: buffers[h * ranks + r] is rank r of host h;
    the results in the same order. Each host is a thread group with its own in-process transport, the
    leaders share another."""
    if hosts < 1 or len(buffers) % hosts:
        raise UsageError(f"{len(buffers)} buffers do not split into {hosts} hosts of equal size")
    per = len(buffers) // hosts

    def host_body(inter: Transport) -> list[HierResult]:
        h = inter.rank
        return run_inproc(per, lambda local: allreduce_hier(
            local, inter if local.rank == 0 else None, buffers[h * per + local.rank], cfg, step,
            intra, intra_bits), timeout_s)

    return [r for group in run_inproc(hosts, host_body, timeout_s) for r in group]
