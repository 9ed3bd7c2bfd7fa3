"""Two engines joined by their socket drivers over ::1, in one process, taking turns.

What an mrcd does per host (a `Context`, a UDP socket, a `SocketDriver`), without a testbed or root:
the drivers' send and receive paths (per-datagram calls, batch I/O, the send ring, pacing) carry a
real WRITE between two real engines through the kernel's UDP stack. One driver turn each, in order,
then, as mrcd's loop does, a wait for a datagram or the nearer deadline; a driver receives in its turn
only when its socket is readable then. Loopback has no fabric: what it
measures is the CPU's, and its only losses are a full receive buffer (`rcvbuf`).

Used by bench/tx_ring.py (the sender's time per packet, mode by mode) and by
tests/unit/test_driver_pair.py (every driver mode moves the bytes intact, with and without loss).
"""

from __future__ import annotations

import os
import select
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mrc.transport import Context, EvProfile, NsccConfig, QpAttr

from .driver import SocketDriver, wait

LO = socket.inet_pton(socket.AF_INET6, "::1")


@dataclass(frozen=True)
class PairConfig:
    """One WRITE of `size` bytes from A to B over `planes` ports; `rate_bps` paces each of A's ports
    (0: unpaced); `rtt_ns` is the path NSCC is configured for; `rcvbuf`: B's socket receive buffer
    (a small one drops bursts: loss without a fabric)."""

    size: int = 8 << 20
    mtu: int = 8192
    planes: int = 4
    rate_bps: int = 0
    rtt_ns: int = 200_000
    rcvbuf: int = 32 << 20
    # the drivers' switches (None: the driver's default, `driver.batch_io_default`, `tx_ring_default`)
    batch_io: bool | None = False  # A's driver
    tx_ring: bool | None = False  # A's driver
    peer_batch_io: bool | None = True  # B's driver (the engine's batch receive: a fast peer)
    peer_tx_ring: bool | None = False  # B's driver (its SACKs)
    seed: int = 1
    timeout_s: float = 120.0  # a run that has not finished by then fails (ok False); not a speed bound


def _sock(rcvbuf: int) -> socket.socket:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        s.bind(("::1", 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    except OSError:
        s.close()
        raise
    return s


def run(cfg: PairConfig) -> dict[str, Any]:
    """The WRITE from A to B (with an immediate, so B completes a receive), driven to its end or to
    `timeout_s`. Returns whether it completed with every byte intact, the time spent in A's and in B's
    driver turns per data packet A sent, the goodput, A's counters and both drivers' statistics."""
    a = Context(LO, ports=cfg.planes, seed=cfg.seed, name="A")
    b = Context(LO, ports=cfg.planes, seed=cfg.seed + 1, name="B")
    bdp = max(4 * cfg.mtu, int(cfg.rate_bps * cfg.planes / 8e9 * cfg.rtt_ns)) if cfg.rate_bps else 4 << 20
    nscc = NsccConfig.for_path(cfg.rtt_ns, bdp, cfg.mtu)
    qps = []
    for ctx in (a, b):
        prof = ctx.create_ev_profile(EvProfile.even(1, 128, cfg.planes))
        ccp = ctx.create_cc_profile(nscc)
        qps.append(ctx.create_qp(ctx.create_cq(), ev_profile=prof, cc_profile=ccp, attr=QpAttr(mtu=cfg.mtu)))
    qa, qb = qps
    qa.connect(LO, qb.qpn)
    qb.connect(LO, qa.qpn)
    src = np.frombuffer(os.urandom(cfg.size), np.uint8).copy()
    dst = np.zeros(cfg.size, np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qb.post_recv(7)
    rates = [cfg.rate_bps] * cfg.planes if cfg.rate_bps else None
    sa = _sock(32 << 20)
    try:
        sb = _sock(cfg.rcvbuf)
    except OSError:
        sa.close()
        raise
    try:
        d = SocketDriver(a, sa, batch_io=cfg.batch_io, tx_ring=cfg.tx_ring, port_rate_bps=rates)
        rd = SocketDriver(b, sb, batch_io=cfg.peer_batch_io, tx_ring=cfg.peer_tx_ring)
        d.dst_port, rd.dst_port = sb.getsockname()[1], sa.getsockname()[1]
        done: list[Any] = []
        got: list[Any] = []
        clock = time.perf_counter
        t0 = clock()
        deadline = t0 + cfg.timeout_s
        qa.post_send(1, smr, 0, cfg.size, dmr.addr, dmr.rkey, imm=0x1234)
        sel = selectors.DefaultSelector()
        sel.register(sa, selectors.EVENT_READ)
        sel.register(sb, selectors.EVENT_READ)
        spent = {d: 0.0, rd: 0.0}
        while not (done and got) and clock() < deadline:
            for drv, sk in ((d, sa), (rd, sb)):
                readable = bool(select.select([sk], [], [], 0)[0])  # as its mrcd's selector would say
                c = clock()
                drv.turn(readable)
                spent[drv] += clock() - c
            done.extend(qa.send_cq.poll())
            got.extend(qb.recv_cq.poll())
            # as mrcd's loop: wait for a datagram or the nearer driver's deadline (not timed)
            waits = [w for w in (d.timeout(), rd.timeout()) if w is not None]
            wait(0 if d.want_write or rd.want_write else min([*waits, 0.01]), sel.select)
        sender_s, receiver_s = spent[d], spent[rd]
        sel.close()
        wall = clock() - t0
        stats, peer_stats = d.stats(), rd.stats()
    finally:
        sa.close()
        sb.close()
    st = qa.stats()
    pkts = max(1, int(st["data_tx"]))
    ok = (bool(done and got) and done[0].status.name == "SUCCESS" and got[0].status.name == "SUCCESS"
          and bool(np.array_equal(src, dst)))
    return {"ok": ok, "sender_us_per_pkt": sender_s / pkts * 1e6,
            "receiver_us_per_pkt": receiver_s / pkts * 1e6, "goodput_gbps": cfg.size * 8 / wall / 1e9,
            "tx_packets": pkts, "retx": pkts - -(-cfg.size // cfg.mtu), "qp": st, "driver": stats,
            "peer_driver": peer_stats}
