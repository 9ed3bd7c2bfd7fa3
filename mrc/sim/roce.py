"""The single-path baseline: a RoCEv2-style reliable connection as a sans-I/O endpoint for the fabric.

* **One path per connection.** Every packet of a connection carries the same 5-tuple (its UDP source
  port is fixed when the connection is made), so the fabric's ECMP hash pins it to one spine of one plane
  (`EcmpRouting`). A host that wants its whole NIC opens one connection per plane port (as multi-rail
  RoCE deployments do with one QP per port); each still hashes onto one spine.
* **Go-back-N.** The responder accepts only the expected PSN. A gap draws one NAK (sequence error) per
  episode, and the requester rewinds to the NAKed PSN; an ACK timeout (the same `1.024 µs × 2^t` as MRC,
  linear then doubling retries) rewinds to the oldest unacknowledged PSN.
* **Congestion control: DCTCP-style window on ECN.** RoCEv2 NICs run DCQCN, a rate controller driven by
  ECN-CE (CNPs). We use its window-based sibling, which needs no rate timers: the responder echoes CE on
  every ACK; once per window the requester updates ``alpha ← (1−g)·alpha + g·F`` (F = marked fraction of
  the window's ACKs, g = 1/16) and, if anything was marked, cuts ``cwnd ← cwnd·(1 − alpha/2)``;
  otherwise the window grows by one MTU per window. A NAK or timeout halves the window (at most once per
  window). The window starts at `max_cwnd` (1.5 × the path BDP), line rate like a RoCE NIC.

Packet sizes match MRC's data and control packets (the same headers on the wire), so capacity fractions
compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from mrc.transport.qp import NEVER
from mrc.transport.verbs import ACK_TIMEOUT_UNIT_NS

DATA: Final = 0
ACK: Final = 1
NAK: Final = 2
DATA_HDR: Final = 56  # BTH + RETH + our MXH-sized extension + ICRC: as an MRC WRITE packet
CTRL_SIZE: Final = 64


class RocePacket:
    __slots__ = ("cid", "ecn", "kind", "psn", "size")

    def __init__(self, kind: int, cid: int, psn: int, size: int, ecn: bool = False) -> None:
        self.kind = kind
        self.cid = cid
        self.psn = psn
        self.size = size
        self.ecn = ecn

    def __len__(self) -> int:  # the fabric sizes packets by len()
        return self.size


@dataclass
class RoceParams:
    mtu: int = 4096
    timeout: int = 8  # 1.024 us x 2^timeout
    linear_cnt: int = 7
    max_cwnd: int = 1 << 20
    g: float = 1 / 16


class RoceConn:
    """The requester side of one connection (send `total` bytes, or forever when total is None)."""

    def __init__(self, cid: int, dst: int, plane: int, sport: int, total: int | None, p: RoceParams) -> None:
        self.cid = cid
        self.dst = dst
        self.plane = plane
        self.sport = sport
        self.mtu = p.mtu
        self.npkts = NEVER if total is None else max(1, -(-total // p.mtu))
        self.total = total
        self.una = 0
        self.nxt = 0
        self.high = 0  # highest PSN sent + 1
        self.cwnd = float(p.max_cwnd)
        self.max_cwnd = p.max_cwnd
        self.alpha = 0.0
        self.g = p.g
        self.win_end = 0
        self.win_acked = 0
        self.win_marked = 0
        self.cut_until = -1  # PSN: no second halving before una passes it
        self.rto_base = ACK_TIMEOUT_UNIT_NS << p.timeout
        self.linear_cnt = p.linear_cnt
        self.retries = 0
        self.rto_at = NEVER
        self.done_at = -1
        self._active = True
        self._wake: Any = None  # the host's wake-up list (set by RoceHost.connect)
        # counters
        self.tx_packets = 0
        self.retx_packets = 0
        self.retx_bytes = 0  # payload bytes sent again
        self.timeouts = 0
        self.naks = 0
        self.acked_bytes = 0

    @property
    def active(self) -> bool:
        """False holds the connection (it sends nothing) until set True again."""
        return self._active

    @active.setter
    def active(self, value: bool) -> None:
        self._active = value
        if self._wake is not None:
            self._wake(self)

    def rto(self) -> int:
        k = self.retries - self.linear_cnt
        return self.rto_base if k <= 0 else self.rto_base << min(k, 24)

    def pkt_size(self, psn: int) -> int:
        if self.total is None or psn < self.npkts - 1:
            return self.mtu
        return self.total - (self.npkts - 1) * self.mtu

    def on_ack(self, cum: int, ecn: bool, now: int) -> None:
        """Cumulative ACK: every PSN < cum received."""
        if cum <= self.una:
            return
        newly = cum - self.una
        nbytes = newly * self.mtu
        self.acked_bytes += nbytes
        self.una = cum
        self.retries = 0
        if cum > self.nxt:
            self.nxt = cum
        self.win_acked += newly
        if ecn:
            self.win_marked += newly
        if cum >= self.win_end:  # one window: DCTCP update
            f = self.win_marked / self.win_acked if self.win_acked else 0.0
            self.alpha = (1 - self.g) * self.alpha + self.g * f
            if self.win_marked:
                self.cwnd = max(float(self.mtu), self.cwnd * (1 - self.alpha / 2))
            else:
                self.cwnd = min(float(self.max_cwnd), self.cwnd + self.mtu)
            self.win_acked = self.win_marked = 0
            self.win_end = self.nxt
        if self.una >= self.npkts:
            self.rto_at = NEVER
            if self.done_at < 0:
                self.done_at = now
        else:
            # rto() with retries = 0: the base timeout (unless linear_cnt < 0)
            self.rto_at = now + (self.rto_base if self.linear_cnt >= 0 else self.rto())

    def rewind(self, psn: int) -> None:
        if psn < self.nxt:
            self.nxt = psn
        if self.una >= self.cut_until:
            self.cwnd = max(float(self.mtu), self.cwnd / 2)
            self.cut_until = self.nxt + max(1, int(self.cwnd // self.mtu))


def new_host(host: int, params: RoceParams, simc: Any = None) -> Any:
    """A host's baseline endpoint: `RoceHost`, or with `simc` (the simulator's C module, `_simc`, given
    where the fabric runs its C loop) the same host in C (mrc/sim/_roce.c), unless that build was written
    against other values of this module's constants."""
    if simc is not None and simc.roce_consts() == {
        "DATA": DATA, "ACK": ACK, "NAK": NAK, "DATA_HDR": DATA_HDR, "CTRL_SIZE": CTRL_SIZE, "NEVER": NEVER,
    }:
        return simc.RoceHost(host, params, ACK_TIMEOUT_UNIT_NS << params.timeout)
    return RoceHost(host, params)


class RoceHost:
    """All baseline connections of one host (requester and responder sides), sans-I/O like `Context`."""

    def __init__(self, host: int, params: RoceParams | None = None) -> None:
        self.host = host
        self.p = params or RoceParams()
        self.conns: list[RoceConn] = []
        self.by_cid: dict[int, RoceConn] = {}
        # responder: cid -> [expected psn, nak sent for this gap, bytes delivered, src host, plane, sport]
        self.rx: dict[int, list[Any]] = {}
        self._out: list[tuple[RocePacket, int, int, int]] = []
        # Connections that may send: a connection leaves this list when datagrams_to_send looks at it (it
        # then sends up to its window, or is held) and comes back only when something that can open it
        # changes (an ACK/NAK, a timeout's rewind, `active`). The others would be skipped anyway.
        self._woken: list[RoceConn] = []
        self._index: dict[RoceConn, int] = {}
        # The earliest rto_at of the connections (NEVER: none armed), valid while _deadline_ok: an ACK
        # that moves a connection's timer keeps it up to date where it can (`receive`), so that
        # next_deadline rescans the connections only when the earliest timer moved later.
        self._dmin = NEVER
        self._deadline_ok = False

    def connect(self, cid: int, dst: int, plane: int, sport: int, total: int | None) -> RoceConn:
        c = RoceConn(cid, dst, plane, sport, total, self.p)
        self._index[c] = len(self.conns)
        self.conns.append(c)
        self.by_cid[cid] = c
        c._wake = self._woken.append
        self._woken.append(c)
        return c

    def accept(self, cid: int, src: int, plane: int, sport: int) -> None:
        self.rx[cid] = [0, False, 0, src, plane, sport]

    def delivered(self, cid: int) -> int:
        return int(self.rx[cid][2])

    # ---------------------------------------------------------------- sans-I/O interface

    def receive(self, pkt: Any, now: int, ecn: bool = False, port: int = 0, src: bytes | None = None) -> None:
        k = pkt.kind
        if k == DATA:
            cid = pkt.cid
            r = self.rx.get(cid)
            if r is None:
                return
            psn = pkt.psn
            exp = r[0]
            if psn == exp:
                r[0] = exp = exp + 1
                r[1] = False
                r[2] += pkt.size - DATA_HDR
                # control packets go back on the same plane with the connection's 5-tuple (reversed)
                self._out.append((RocePacket(ACK, cid, exp, CTRL_SIZE, ecn), r[4], r[5], r[3]))
            elif psn > exp:
                if not r[1]:
                    r[1] = True
                    self._out.append((RocePacket(NAK, cid, exp, CTRL_SIZE, ecn), r[4], r[5], r[3]))
            else:
                self._out.append((RocePacket(ACK, cid, exp, CTRL_SIZE, ecn), r[4], r[5], r[3]))
            return
        c = self.by_cid.get(pkt.cid)
        if c is None:
            return
        self._woken.append(c)
        old = c.rto_at
        c.on_ack(pkt.psn, pkt.ecn, now)
        if k == NAK:
            c.naks += 1
            c.rewind(pkt.psn)
        if self._deadline_ok:
            new = c.rto_at
            if new != old:
                d = self._dmin
                if old > d:  # another connection's timer is the earliest: it stays, unless new is earlier
                    if new < d:
                        self._dmin = new
                elif new < old:  # c's was the earliest and moved earlier: still the earliest
                    self._dmin = new
                else:  # the earliest moved later: rescan
                    self._deadline_ok = False

    def handle_timer(self, now: int) -> None:
        for c in self.conns:
            if c.rto_at <= now:
                self._woken.append(c)
                self._deadline_ok = False
                c.timeouts += 1
                c.retries += 1
                c.rewind(c.una)
                c.rto_at = now + c.rto()

    def datagrams_to_send(self, now: int) -> list[Any]:
        out = self._out
        woken = self._woken
        if not woken:
            self._out = []
            return out
        # in connection order, each once: what a scan of every connection would send
        todo = sorted(set(woken), key=self._index.__getitem__) if len(woken) > 1 else (woken[0],)
        woken.clear()
        append = out.append
        for c in todo:
            nxt = c.nxt
            npkts = c.npkts
            if nxt >= npkts or not c._active:
                continue
            mtu = c.mtu
            limit = c.una + max(1, int(c.cwnd // mtu))
            if nxt >= limit:
                continue
            end = min(limit, npkts)
            cid, plane, sport, dst = c.cid, c.plane, c.sport, c.dst
            full = mtu + DATA_HDR
            # (`pkt_size`, inline: every packet but a finite connection's last is a full MTU)
            last = npkts - 1 if c.total is not None else NEVER
            for psn in range(nxt, end):
                size = full if psn < last else c.pkt_size(psn) + DATA_HDR
                append((RocePacket(DATA, cid, psn, size), plane, sport, dst))
            c.tx_packets += end - nxt
            if nxt < c.high:
                c.retx_packets += min(end, c.high) - nxt
                c.retx_bytes += sum(c.pkt_size(p) for p in range(nxt, min(end, c.high)))
            c.nxt = end
            if end > c.high:
                c.high = end
            if c.rto_at == NEVER:
                c.rto_at = t = now + c.rto()
                if t < self._dmin:  # (harmless while _deadline_ok is False: next_deadline rescans)
                    self._dmin = t
        self._out = []
        return out

    def next_deadline(self) -> int | None:
        if not self._deadline_ok:
            d = NEVER
            for c in self.conns:
                if c.rto_at < d:
                    d = c.rto_at
            self._dmin = d
            self._deadline_ok = True
        d = self._dmin
        return None if d >= NEVER else d
