"""Hierarchical all-reduce for several ranks per host (docs/collective.md, "Partial sums: grouped
scales, data-driven bits, hierarchy").

    1. intra-host reduce: every rank of a host sends its buffer to the host's leader (local rank 0) over
       the host's own transport (shared memory): raw float32 (`intra="none"`) or one codec frame
       (`intra=<scheme>`, `intra_bits`); the leader sums in float64, in local-rank order;
    2. inter-host ring: the leaders run the compressed ring all-reduce (ring.allreduce, cfg) over their
       own transport, one contribution per host;
    3. intra-host broadcast: the leader sends the result, raw float32, to its ranks.

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
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from mrc.errors import UsageError
from mrc.quant.codec import SCHEMES, check_bits, decode, encode

from .ring import Config, allreduce, derive_seed
from .transport import Transport, run_inproc

F32 = npt.NDArray[np.float32]
INTRA = ("none", *SCHEMES)

_TAG_UP = 5 << 20
_TAG_DOWN = 6 << 20


@dataclass
class HierResult:
    out: F32
    inter_bytes: int = 0  # bytes this rank posted between hosts (the leaders' ring)
    intra_bytes: int = 0  # bytes this rank posted within its host (reduce to, broadcast from the leader)
    bits_per_hop: tuple[float, ...] = ()


def allreduce_hier(local: Transport, inter: Transport | None, x: npt.ArrayLike, cfg: Config, step: int = 0,
                   intra: str = "none", intra_bits: float = 8.0) -> HierResult:
    """Sum (or average, cfg.average, over all hosts x ranks) of every rank's 1-D float32 buffer. `local`:
    this host's transport (rank 0 the leader); `inter`: the transport between the hosts' leaders, given
    on the leader only (None elsewhere; a single host needs none). Every host must have the same number
    of ranks (the average divides by hosts x ranks)."""
    if intra not in INTRA:
        raise UsageError(f"intra must be one of {', '.join(INTRA)}, got {intra!r}")
    if intra != "none":
        check_bits(intra, intra_bits)
    a = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    lr, ln = local.rank, local.world_size
    leader = lr == 0
    if not leader and inter is not None:
        raise UsageError("the inter-host transport is for the host's leader (local rank 0) only")
    hosts = inter.world_size if inter is not None else 1
    intra_sent = 0
    if not leader:
        msg = a.tobytes() if intra == "none" else encode(
            a, intra, intra_bits, seed=derive_seed(cfg.seed, step, 5, lr))
        local.send(0, _TAG_UP + lr, msg)
        intra_sent += len(msg)
        local.flush()
        raw = local.recv(0, _TAG_DOWN + lr)
        out = np.frombuffer(raw, np.float32).copy()
        if out.size != a.size:
            raise UsageError(f"broadcast of {out.size} elements where {a.size} were expected")
        return HierResult(out, 0, intra_sent)
    total = a.astype(np.float64)
    for src in range(1, ln):
        msg = local.recv(src, _TAG_UP + src)
        part = (np.frombuffer(msg, np.float32) if intra == "none" else np.asarray(decode(msg), np.float32))
        if part.size != a.size:
            raise UsageError(f"local rank {src} sent {part.size} elements where {a.size} were expected")
        total += part
    host_sum = total.astype(np.float32)
    inter_sent = 0
    bits: tuple[float, ...] = ()
    if inter is not None and hosts > 1:
        res = allreduce(inter, host_sum, dataclasses.replace(cfg, average=False), step)
        out, inter_sent, bits = res.out, res.wire_bytes, res.bits_per_hop
    else:
        out = host_sum
    if cfg.average:
        out = (out / np.float32(hosts * ln)).astype(np.float32)
    raw = out.tobytes()
    for dst in range(1, ln):
        local.send(dst, _TAG_DOWN + dst, raw)
        intra_sent += len(raw)
    local.flush()
    return HierResult(out, inter_sent, intra_sent, bits)


def simulate(buffers: list[F32], hosts: int, cfg: Config, step: int = 0, intra: str = "none",
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
