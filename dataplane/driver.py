"""The socket driver: runs the sans-I/O engine (`mrc.transport.Context`) on a real UDP socket.

One MRC socket per host (`udp.mrc_socket`: the host's MRC address, port 4791, UDP checksum 0 both ways,
ECT(0), large buffers). Per loop turn (`SocketDriver.turn`):

* receive: drain the socket without blocking (up to `batch` datagrams), each with its traffic class (ECN-CE
  -> `ecn=True`) and the interface it arrived on (IPV6_PKTINFO: the plane port after End.DT6), and hand
  it to `Context.receive`;
* timers: `handle_timer(now)` once `now >= next_deadline()`;
* send: `datagrams_to_send(now)` -> `sendto(MRC(dst), 4791)`; the host egress program picks the path from
  the EV index in MXH. A full socket buffer keeps the rest queued (sent when the socket is writable).
* pacing (`port_rate_bps`): a NIC serialises each port at its line rate and never drops its own
  packets; the egress program's `bpf_redirect` into a full port queue does drop them, and the engine
  would read those drops as path failures. So each plane port has a token bucket at its rate (bytes
  counted as on the wire: the datagram + UDP, both IPv6 headers and Ethernet) and what exceeds it
  waits in the driver, in order, until the port may send.

The caller waits with `selectors` on `fileno()` (and its own fds) for at most `timeout(now)` seconds:
sub-millisecond timers without a busy spin when idle (epoll's timeout has 1 ms granularity, so a
deadline closer than that is slept with `time.sleep`, which uses a high-resolution timer).

Batch I/O (on by default where the engine's batch receive is compiled C; ``MRC_BATCH_IO=0`` turns it
off): the standard library has no sendmmsg/recvmmsg, so `dataplane/mmsg.py` calls them through ctypes:
one recvmmsg per up to 64 datagrams (each with its IPV6_TCLASS and IPV6_PKTINFO control messages and
source address) and one sendmmsg per up to 64 datagrams; pacing is the same token buckets, refilled
once per flush. Both ways give the engine identical arguments and the wire identical bytes
(tests/unit/test_driver.py). A context with `receive_batch` (the engine's compiled batch receive,
``MRC_RX_KERNEL``) gets each recvmmsg batch whole: lengths, ECN and ports from `mmsg.parse_controls`,
the slots and sources as numpy views, no Python object per data packet.

The send ring (on by default; ``MRC_TX_RING=0`` turns it off): the engine writes into a `TxRing`
(`Context.datagrams_into`) and `dataplane/ringsend.py` sends the slots with sendmmsg in place, paced by
the same rules as `_pace` (docs/daemon.md, "The send ring").

Why both are on by default (docs/daemon.md, "Batch I/O and the send ring by default"): with them a data
packet of a bulk transfer crosses the driver and the engine without a Python object either way (the
C receive kernel takes batches of 16 and more from recvmmsg's slots; the C send writes each packet in
its ring slot), for the same CPU per packet as the per-datagram calls, measured side by side
(bench/tx_ring.py); the per-datagram calls stay for a context without the batch methods, and behind
the switches.
"""

from __future__ import annotations

import collections
import ipaddress
import itertools
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any, Final

from mrc.transport import Context, Datagram
from mrc.transport.txring import DEFAULT_CAP, TxRing
from mrc.wire import ROCEV2_UDP_PORT

from . import mmsg
from .ringsend import RingSender
from .udp import ECN_CE, ECN_MASK

IPV6_RECVPKTINFO: Final = 49
IPV6_PKTINFO: Final = 50
_ANC: Final = socket.CMSG_SPACE(4) + socket.CMSG_SPACE(20)
_BUF: Final = 9216
#: bytes a datagram occupies at the plane port besides its UDP payload: Ethernet 14, outer + inner
#: IPv6 80, UDP 8
WIRE_OVERHEAD: Final = 102
PACE_BURST: Final = 16 << 10
#: a datagram whose tokens are short by no more than the port earns in this long goes at once, the bucket
#: taken into that much debt (`SocketDriver._pace`): a wait shorter than a turn of mrcd's loop only
#: costs the turn. ``MRC_PACE_DEBT=0`` (read at import): the older rule, which waited for a whole
#: datagram's worth
PACE_SLACK_NS: Final = 20_000
PACE_DEBT: Final = os.environ.get("MRC_PACE_DEBT", "1").strip() != "0"
#: how much a backlogged port may catch up at once, in time at its rate (`SocketDriver._pace`);
#: ``MRC_PACE_CATCHUP=0`` (read at import): a backlogged port's credit stops at PACE_BURST too
PACE_CATCHUP_NS: Final = 1_000_000
PACE_CATCHUP: Final = os.environ.get("MRC_PACE_CATCHUP", "1").strip() != "0"
#: datagrams per sendmmsg / recvmmsg call
MMSG_BATCH: Final = 64
#: how long the loop waits when the engine's timers ran and a deadline is still due (an engine bug:
#: counted as `timer_stuck`); without it the loop would spin on that deadline for the QP's lifetime
STUCK_TIMER_WAIT_NS: Final = 1_000_000
#: the send ring grows for a burst (each slot 9 KiB, up to 16,384) and keeps its slots, where the list
#: path frees its datagrams as they go: a ring whose live entries stayed at a quarter of its slots or
#: fewer for this long, and is empty, shrinks to the smallest size that held them twice over
RING_SHRINK_NS: Final = 2_000_000_000


def _port(dg: Datagram) -> int:
    return dg.port


def _switch(name: str, default: bool) -> bool:
    """The switch `name` in the environment: on for 1, yes, on or true, off for 0, no, off or false,
    `default` when unset (or anything else); off wherever sendmmsg/recvmmsg are not usable."""
    v = os.environ.get(name, "").strip().lower()
    on = True if v in ("1", "yes", "on", "true") else False if v in ("0", "no", "off", "false") else default
    return on and mmsg.available()


def tx_ring_default() -> bool:
    """The send ring unless ``MRC_TX_RING=0`` (and where sendmmsg is usable)."""
    return _switch("MRC_TX_RING", True)


def batch_io_default() -> bool:
    """Batch I/O unless ``MRC_BATCH_IO=0``, where the engine's batch receive is the C kernel
    (`rxbatch.KERNEL`); where it would be numba's, only with ``MRC_BATCH_IO=1``: numba's import alone
    costs a process ~120 MB (docs/daemon.md, "Batch I/O and the send ring by default")."""
    from mrc.transport import rxbatch

    return _switch("MRC_BATCH_IO", rxbatch.KERNEL == "c")


class SocketDriver:
    """Drive `ctx` on `sock` (bound, non-blocking after construction). `port_of_ifindex` maps the
    interface a datagram arrived on to the engine's plane port (unknown interfaces: port 0)."""

    def __init__(self, ctx: Context, sock: socket.socket, port_of_ifindex: dict[int, int] | None = None, *,
                 batch: int = 256, clock: Callable[[], int] = time.monotonic_ns,
                 sndbuf: int = 8 << 20, port_rate_bps: list[int] | None = None,
                 batch_io: bool | None = None, tx_ring: bool | None = None) -> None:
        self.ctx = ctx
        self.sock = sock
        self.port_of_ifindex = dict(port_of_ifindex or {})
        self.batch = batch
        self.clock = clock
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self._pending: collections.deque[Datagram] = collections.deque()
        # pacing: bytes per ns per port, tokens (bytes) and when they were last filled
        self._rate = [r / 8e9 for r in (port_rate_bps or [])]
        self._tokens = [float(PACE_BURST)] * len(self._rate)
        self._filled = [clock()] * len(self._rate)
        #: datagrams the buckets hold, in the engine's order, and which ports held some at the last fill
        self._paceq: collections.deque[Datagram] = collections.deque()
        self._backlog = [False] * len(self._rate)
        self._pace_at: int | None = None
        #: after a stuck timer, engine deadlines before this wait until it (`turn`)
        self._timers_at = 0
        self.timer_stuck = 0
        self.pace_debt = PACE_DEBT
        self.pace_catchup = PACE_CATCHUP
        self.paced = 0
        self._dst: dict[bytes, tuple[str, int]] = {}
        self._buf = bytearray(_BUF)
        #: slices of this are views: `bytes(view[:n])` is the datagram's one copy (`bytes(buf[:n])` made two)
        self._bufv = memoryview(self._buf)
        self._src: dict[str, bytes] = {}  # textual source address -> 16 bytes (the peers' GIDs)
        self.rx_datagrams = 0
        self.tx_datagrams = 0
        self.rx_ce = 0
        self.send_blocked = 0
        self.send_errors = 0
        self.turns = 0
        #: the destination UDP port (RoCEv2's; tests on a shared loopback use another)
        self.dst_port = ROCEV2_UDP_PORT
        self.batch_io = batch_io_default() if batch_io is None else bool(batch_io and mmsg.available())
        self._rb: mmsg.RecvBatch | None = None
        self._kernel: bool | None = None  # batches to Context.receive_batch (decided with batch I/O)
        self._karrays: Any = None
        self._sb: mmsg.SendBatch | None = None
        self._names: dict[bytes, int] = {}
        #: the send ring (``MRC_TX_RING``, on by default): the engine writes datagrams into its slots and
        #: `RingSender` sends them from there with sendmmsg, paced as `_pace` paces (dataplane/ringsend.py)
        self._ring: TxRing | None = None
        self._rs: RingSender | None = None
        self._ring_peak = 0  # the most live entries since the last shrink check
        self._ring_check_at = clock() + RING_SHRINK_NS
        want_ring = tx_ring_default() if tx_ring is None else bool(tx_ring and mmsg.available())
        if want_ring and hasattr(ctx, "datagrams_into"):
            self._ring = TxRing()
            self._rs = RingSender(self._ring, list(port_rate_bps or []), clock(), burst=PACE_BURST,
                                  slack_ns=PACE_SLACK_NS, catchup_ns=PACE_CATCHUP_NS, overhead=WIRE_OVERHEAD,
                                  debt=self.pace_debt, catchup=self.pace_catchup)
        if self.batch_io:
            self._rb = mmsg.RecvBatch(min(MMSG_BATCH, max(1, batch)), _BUF)
            self._sb = mmsg.SendBatch(MMSG_BATCH, _BUF)
            self._kernel = self._batch_kernel()  # compiled (or loaded) now, not at the first datagram

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def want_write(self) -> bool:
        return bool(self._pending) or (self._rs is not None and self._rs.want_write)

    @property
    def queued(self) -> int:
        return len(self._pending) + len(self._paceq) + (len(self._ring) if self._ring is not None else 0)

    @property
    def tx_ring(self) -> bool:
        """Whether this driver sends from the send ring (``MRC_TX_RING``)."""
        return self._ring is not None

    # -- receive
    def receive(self, now: int | None = None) -> int:
        """Drain up to `batch` datagrams into the engine; returns how many."""
        if self._rb is not None:
            return self._receive_batch(now)
        sk = self.sock
        ctx = self.ctx
        buf = self._buf
        bufv = self._bufv
        ports = self.port_of_ifindex
        srcs = self._src
        n = 0
        t = self.clock() if now is None else now
        while n < self.batch:
            try:
                nbytes, anc, _flags, addr = sk.recvmsg_into([buf], _ANC)
            except (BlockingIOError, InterruptedError):
                break
            ecn = False
            port = 0
            for level, kind, value in anc:
                if level == socket.IPPROTO_IPV6:
                    if kind == socket.IPV6_TCLASS and len(value) >= 4:
                        ecn = (int.from_bytes(value[:4], "little") & ECN_MASK) == ECN_CE
                    elif kind == IPV6_PKTINFO and len(value) >= 20:
                        port = ports.get(struct.unpack_from("=I", value, 16)[0], 0)
            if ecn:
                self.rx_ce += 1
            # the source address is checked against the QP's peer (a stray or forged packet from another
            # host is dropped as foreign_src before it can act on the QP)
            src = srcs.get(addr[0])
            if src is None:
                if len(srcs) >= 4096:
                    srcs.clear()
                src = srcs[addr[0]] = socket.inet_pton(socket.AF_INET6, addr[0].partition("%")[0])
            ctx.receive(bytes(bufv[:nbytes]), t, ecn, port, src)
            n += 1
        self.rx_datagrams += n
        return n

    def _receive_batch(self, now: int | None) -> int:
        """`receive` with recvmmsg: the same arguments to `Context.receive`, per batch one system call;
        with the engine's batch receive (`Context.receive_batch`, MRC_RX_KERNEL) no Python call per
        datagram either."""
        rb = self._rb
        assert rb is not None
        if self._kernel is None:
            self._kernel = self._batch_kernel()
        if self._kernel:
            return self._receive_kernel(now)
        fd = self.sock.fileno()
        receive = self.ctx.receive
        ports = self.port_of_ifindex
        hdrs, ctl, data, names = rb.hdrs, rb.ctl, rb.dview, rb.nview
        size = rb.bufsize
        u32, u64, cmsg, i32 = mmsg._U32.unpack_from, mmsg._U64.unpack_from, mmsg._CMSG.unpack_from, \
            mmsg._I32.unpack_from
        tclass_kind, pktinfo_kind, v6 = socket.IPV6_TCLASS, IPV6_PKTINFO, socket.IPPROTO_IPV6
        ce = 0
        n = 0
        t = self.clock() if now is None else now
        while n < self.batch:
            want = min(rb.capacity, self.batch - n)
            k = rb.recv(fd, want)
            for j in range(k):
                h = j * mmsg.HDR
                nbytes = u32(hdrs, h + 56)[0]
                clen = u64(hdrs, h + 40)[0]
                ecn = False
                port = 0
                base = j * mmsg.CTL
                off = 0
                while off + 16 <= clen:
                    ln, level, kind = cmsg(ctl, base + off)
                    if ln < 16:
                        break
                    if level == v6:
                        if kind == tclass_kind and ln >= 20:
                            ecn = (i32(ctl, base + off + 16)[0] & ECN_MASK) == ECN_CE
                        elif kind == pktinfo_kind and ln >= 36:
                            port = ports.get(u32(ctl, base + off + 32)[0], 0)
                    off += (ln + 7) & ~7
                if ecn:
                    ce += 1
                d = j * size
                a = j * mmsg.SIN6 + 8
                receive(bytes(data[d:d + nbytes]), t, ecn, port, bytes(names[a:a + 16]))
            n += k
            if k < want:
                break
        self.rx_ce += ce
        self.rx_datagrams += n
        return n

    def _batch_kernel(self) -> bool:
        """Whether this driver hands whole batches to `Context.receive_batch` (and sets up its arrays)."""
        from mrc.transport import rxbatch

        rb = self._rb
        if rb is None or not (rxbatch.ENABLED and rxbatch.AVAILABLE and getattr(self.ctx, "fastpath", False)):
            return False
        import numpy as np

        top = max(self.port_of_ifindex, default=0)
        if top > 1 << 20:  # an interface index no table should hold: the per-datagram loop
            return False
        table = np.zeros(top + 1, dtype=np.int64)
        for ifindex, port in self.port_of_ifindex.items():
            table[ifindex] = port
        data, names, hdrs, ctl, csize = rb.arrays()
        cap = rb.capacity
        parse = mmsg.parse_controls()
        self._karrays = (data, names, hdrs, ctl, csize, table, np.zeros(cap, dtype=np.int64),
                         np.zeros(cap, dtype=np.bool_), np.zeros(cap, dtype=np.int64), parse)
        parse(hdrs, ctl, 0, csize, table, *self._karrays[6:9])
        rxbatch.warm()
        return True

    def _kernel_packets(self) -> int:
        """Data packets the engine's batch kernel took whole (rxbatch.BatchReceiver.taken)."""
        rx = getattr(self.ctx, "_batch_rx", None)
        return int(getattr(rx, "taken", 0)) if self._kernel else 0

    def _receive_kernel(self, now: int | None) -> int:
        rb = self._rb
        assert rb is not None
        data, names, hdrs, ctl, csize, table, lens, ecn, ports, parse = self._karrays
        fd = self.sock.fileno()
        receive_batch = self.ctx.receive_batch
        n = 0
        t = self.clock() if now is None else now
        while n < self.batch:
            want = min(rb.capacity, self.batch - n)
            k = rb.recv(fd, want)
            if k:
                self.rx_ce += parse(hdrs, ctl, k, csize, table, lens, ecn, ports)
                receive_batch(data[:k], lens[:k], ecn[:k], ports[:k], names[:k], t)
            n += k
            if k < want:
                break
        self.rx_datagrams += n
        return n

    # -- send
    def _addr(self, dst: bytes) -> tuple[str, int]:
        a = self._dst.get(dst)
        if a is None:
            a = self._dst[dst] = (str(ipaddress.IPv6Address(dst)), self.dst_port)
        return a

    def _name(self, dst: bytes) -> int:
        a = self._names.get(dst)
        if a is None:
            assert self._sb is not None
            a = self._names[dst] = self._sb.name(dst, self.dst_port)
        return a

    def _pace(self, t: int, new: list[Datagram]) -> None:
        """Move what each port's token bucket allows from the held datagrams to `_pending`. A datagram goes
        when its tokens are short by at most what the port earns in PACE_SLACK_NS, taking the bucket
        into that debt (the next one waits it out): the rate is the port's over any span, the burst at
        most PACE_BURST + PACE_SLACK_NS of the rate. Why not "wait for a datagram's worth": with 8 KiB
        datagrams a 16 KiB bucket then held one and a small deficit, so 95 % of them waited a fraction
        of a microsecond at 10 Gbit/s, each wait a turn of mrcd's loop (a sleep, an epoll call and the
        turn's work) for nothing. Why not any credit at all: at 100 Mbit/s that let a burst grow by a
        whole datagram (660 us of the port), more of the ECN threshold of the switch port behind it,
        and a slowed link was told from the healthy ones less clearly.

        A port whose queue was not empty when the bucket was last filled has been sending ever since
        (a NIC with a backlog serialises back to back), so what it earned since then is all spendable,
        up to PACE_CATCHUP_NS of its rate; only an idle port's credit stops at PACE_BURST. Why: mrcd's
        loop fills the buckets once per turn, and a turn of a busy sender takes about a millisecond;
        capping a backlogged port's credit at PACE_BURST let each port send about five 8 KiB
        datagrams per turn whatever the turn's length, 0.4 of a 10 Gbit/s link's share of the CPU's
        pace, and the datagrams held back were on the engine's clock already: their late departure
        read as loss and as delay (spurious retransmissions, EVs assumed bad, delay steering;
        docs/daemon.md, "Pacing that keeps up"). ``MRC_PACE_CATCHUP=0`` (read at import): the older
        rule.

        What the buckets let go leaves in the order the engine gave it, across ports, as it would
        unpaced: releasing port by port (all of port 0's, then port 1's ...) reordered a turn's
        datagrams by port, and the last port's left up to a turn later than their timestamps while
        acknowledgements for the first port's came back. A port that must wait holds the rest of its
        own datagrams only; the others go on. (The older rule, ``MRC_PACE_CATCHUP=0``, released port
        by port.)"""
        pend = self._pending
        nports = len(self._rate)
        rates = self._rate
        tokens = self._tokens
        filled = self._filled
        backlog = self._backlog
        paceq = self._paceq
        for dg in new:
            if dg.port < nports:
                paceq.append(dg)
            else:  # a port without a rate: not paced
                pend.append(dg)
        self._pace_at = None
        if not paceq:
            return
        # fill each port's bucket once, then release in the engine's order (below)
        slack = [0.0] * nports
        for p in range(nports):
            rate = rates[p]
            earned = tokens[p] + (t - filled[p]) * rate
            cap = float(PACE_BURST)
            if backlog[p] and self.pace_catchup:
                cap = max(cap, rate * PACE_CATCHUP_NS)
            tokens[p] = earned if earned < cap else cap
            filled[p] = t
            slack[p] = rate * PACE_SLACK_NS if self.pace_debt else 0.0
        blocked = [False] * nports
        nblocked = 0
        kept: collections.deque[Datagram] = collections.deque()
        order = iter(paceq if self.pace_catchup else sorted(paceq, key=_port))  # older rule: port by port
        for dg in order:
            p = dg.port
            if blocked[p]:
                kept.append(dg)
                continue
            need = len(dg.data) + WIRE_OVERHEAD
            tok = tokens[p]
            if tok < need - slack[p] and tok < PACE_BURST:
                blocked[p] = True
                kept.append(dg)
                wait_ns = t + int((need - slack[p] - tok) / rates[p]) + 1
                if self._pace_at is None or wait_ns < self._pace_at:
                    self._pace_at = wait_ns
                nblocked += 1
                if nblocked == nports:  # every port waits: the rest stays, in order, unlooked at
                    kept.extend(order)
                    break
                continue
            tokens[p] = tok - need
            pend.append(dg)
        self._paceq = kept
        for p in range(nports):
            backlog[p] = blocked[p]
            if blocked[p]:
                self.paced += 1
            elif tokens[p] > PACE_BURST:  # idle from now on: no more credit than an idle port keeps
                tokens[p] = float(PACE_BURST)

    def flush(self, now: int | None = None) -> int:
        """Send what is pending, then what the engine has to send now (paced per port); returns
        datagrams sent."""
        t = self.clock() if now is None else now
        if self._rs is not None:
            return self._flush_ring(t)
        pend = self._pending
        if self._rate:
            self._pace(t, self.ctx.datagrams_to_send(t))
        else:
            pend.extend(self.ctx.datagrams_to_send(t))
        if self._sb is not None:
            n = self._flush_batch(pend)
            self.tx_datagrams += n
            return n
        sk = self.sock
        n = 0
        while pend:
            dg = pend[0]
            try:
                sk.sendto(dg.data, self._addr(dg.dst))
            except (BlockingIOError, InterruptedError):
                self.send_blocked += 1
                break
            except OSError:
                # e.g. ENOBUFS / no route: the datagram is lost, the engine recovers it like a fabric loss
                self.send_errors += 1
            pend.popleft()
            n += 1
        self.tx_datagrams += n
        return n

    def _flush_ring(self, t: int) -> int:
        """`flush` with the send ring: the engine fills the ring, `RingSender` paces and sends from it."""
        rs, ring = self._rs, self._ring
        assert rs is not None and ring is not None
        before = rs.before_fill()
        lost = ring.oversize + ring.overflow
        self.ctx.datagrams_into(t, ring)
        rs.after_fill(before)
        if len(ring) > self._ring_peak:
            self._ring_peak = len(ring)
        # as the list path: larger than any MTU, lost; or appended to a ring at its bound, lost
        self.send_errors += ring.oversize + ring.overflow - lost
        rs.debt, rs.catchup = self.pace_debt, self.pace_catchup
        n = rs.flush(self.sock.fileno(), t, self.dst_port)
        self._pace_at = rs.pace_at
        self.send_blocked += rs.blocked
        self.send_errors += rs.errors
        self.paced += rs.paced
        rs.blocked = rs.errors = rs.paced = 0
        self.tx_datagrams += n
        if t >= self._ring_check_at:
            self._ring_check_at = t + RING_SHRINK_NS
            peak, self._ring_peak = self._ring_peak, len(ring)
            if not len(ring) and ring.cap > DEFAULT_CAP and 4 * peak <= ring.cap:
                ring.shrink(max(DEFAULT_CAP, 1 << (2 * peak - 1).bit_length() if peak else 1))
        return n

    def _flush_batch(self, pend: collections.deque[Datagram]) -> int:
        """Send `pend` with sendmmsg, up to MMSG_BATCH per call; as the per-datagram path: a full socket
        buffer keeps the rest queued, another error loses that one datagram (counted)."""
        sb = self._sb
        assert sb is not None
        fd = self.sock.fileno()
        load = sb.load
        name = self._name
        n = 0
        cap = sb.bufsize
        while pend:
            k = 0
            for dg in itertools.islice(pend, sb.capacity):
                if len(dg.data) > cap:  # larger than any MTU: the kernel would refuse it (EMSGSIZE)
                    break
                load(k, dg.data, name(dg.dst))
                k += 1
            if k == 0:
                pend.popleft()
                self.send_errors += 1
                continue
            done = 0
            blocked = False
            while done < k:
                try:
                    done += sb.send(fd, done, k - done)
                except InterruptedError:
                    continue
                except BlockingIOError:
                    self.send_blocked += 1
                    blocked = True
                    break
                except OSError:
                    self.send_errors += 1
                    done += 1  # that datagram is lost, as with sendto
            for _ in range(done):
                pend.popleft()
            n += done
            if blocked:
                break
        return n

    # -- timers
    def timeout(self, now: int | None = None) -> float | None:
        """Seconds until the engine's next deadline (0 when due), or None when no timer is armed."""
        d = self.ctx.next_deadline()
        if d is not None and d < self._timers_at:
            d = self._timers_at
        if self._pace_at is not None and (d is None or self._pace_at < d):
            d = self._pace_at
        if d is None:
            return None
        t = self.clock() if now is None else now
        return max(0.0, (d - t) / 1e9)

    def turn(self, readable: bool = True) -> None:
        """One loop turn: receive (when readable), expired timers, send."""
        self.turns += 1
        if readable:
            self.receive()
        now = self.clock()
        d = self.ctx.next_deadline()
        if d is not None and d <= now and now >= self._timers_at:
            self.ctx.handle_timer(now)
            d = self.ctx.next_deadline()
            if d is not None and d <= now:  # the timers ran and one is still due: do not spin on it
                self.timer_stuck += 1
                self._timers_at = now + STUCK_TIMER_WAIT_NS
        self.flush(now)

    def stats(self) -> dict[str, int]:
        return {"rx_datagrams": self.rx_datagrams, "tx_datagrams": self.tx_datagrams, "rx_ce": self.rx_ce,
                "send_blocked": self.send_blocked, "send_errors": self.send_errors, "turns": self.turns,
                "pending": self.queued, "paced": self.paced, "batch_io": int(self.batch_io),
                "timer_stuck": self.timer_stuck, "rx_kernel": int(bool(self._kernel)),
                "tx_ring": int(self._ring is not None),
                "rx_kernel_packets": self._kernel_packets()}


def wait(sel_timeout: float | None, select: Callable[[float | None], object]) -> object:
    """Wait with `select(timeout)`: below 1 ms (epoll's granularity) sleep precisely instead."""
    if sel_timeout is not None and 0 < sel_timeout < 0.001:
        time.sleep(sel_timeout)
        return select(0)
    return select(sel_timeout)
