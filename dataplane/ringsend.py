"""Sending a send ring (`mrc.transport.txring.TxRing`) with sendmmsg, straight from its slots, paced per
plane port: the socket driver's send half (`dataplane.driver`; the default, ``MRC_TX_RING=0`` for the
list path).

The engine writes each datagram into a slot of the ring (`Context.datagrams_into`); this module points
the kernel at those slots. Per slot it keeps a `struct mmsghdr`, an iovec on the slot and a
`sockaddr_in6`, built once for the ring's memory (again when the ring grows: `TxRing.gen`). Unpaced, a
flush writes the lengths and destinations of each run of consecutive slots with numpy and sends the run
where its headers lie; paced, one scalar pass over the live entries applies the buckets, and the
released entries go where their headers lie when they are one run of slots, else from copies of their
headers gathered in order; one sendmmsg call per 1024 datagrams either way.
No copy of a datagram and no object kept per datagram (the pass's loop has its transient ints).

Pacing is the socket driver's (`SocketDriver._pace`, whose doc gives the reasons): a token bucket per
plane port at its rate, bytes counted as on the wire, a datagram short of tokens by at most what the port
earns in PACE_SLACK_NS goes at once, a port that was backlogged at its last fill may spend what it
earned since, up to PACE_CATCHUP_NS of its rate; a port that must wait holds its own datagrams only.
What the buckets release leaves in the engine's order. The one difference: a datagram released at an
earlier flush that the socket could not take (its buffer full) goes out in the engine's order with the
ones released after it, not before them. The older port-by-port release (``MRC_PACE_CATCHUP=0``) is the
list path's only.

Each slot's state: HELD (in the ring, not released by its port's bucket yet), RELEASED (to send), SENT
(sent, or lost to a send error and counted). The ring's head moves past the leading SENT entries.
"""

from __future__ import annotations

import ctypes
import errno
from typing import Any, Final

import numpy as np

from mrc.transport.txring import SLOT, TxRing

from . import mmsg

HELD: Final = 0
RELEASED: Final = 1
SENT: Final = 2
#: datagrams per sendmmsg call (the kernel's UIO_MAXIOV bounds vlen)
MAX_VLEN: Final = 1024
_NAME: Final = 32  # bytes per slot's sockaddr_in6 (28, rounded up)


def _addr(buf: bytearray) -> tuple[int, Any]:
    view = (ctypes.c_char * len(buf)).from_buffer(buf)
    return ctypes.addressof(view), view


class RingSender:
    """Send `ring`'s entries on a socket, each to its destination, paced per port at `rates_bps` (a port
    without a rate, or an empty list: not paced; the buckets full at `now`). `flush(fd, now, dst_port)`
    sends what the buckets allow; `pace_at` is when a held datagram may go (None: none held). The
    counters `blocked`, `errors` and `paced` are the socket driver's, which takes them."""

    def __init__(self, ring: TxRing, rates_bps: list[int], now: int, *, burst: int,
                 slack_ns: int, catchup_ns: int, overhead: int, debt: bool = True,
                 catchup: bool = True) -> None:
        if not mmsg.available():
            raise OSError(errno.ENOSYS, "sendmmsg is not usable here (Linux, 64-bit, a libc that has it)")
        self.ring = ring
        self.rate = [r / 8e9 for r in rates_bps]  # bytes per ns
        self.burst = float(burst)
        self.slack_ns = slack_ns
        self.catchup_ns = catchup_ns
        self.overhead = overhead
        self.debt = debt
        self.catchup = catchup
        self.tokens = [float(burst)] * len(self.rate)
        self.filled = [now] * len(self.rate)
        self.backlog = [False] * len(self.rate)
        self.pace_at: int | None = None
        self.blocked = 0
        self.errors = 0
        self.paced = 0
        self._sendmmsg = mmsg._lib().sendmmsg
        self._gen = -1
        self._cap = 0
        self._st = bytearray()  # per slot: HELD, RELEASED or SENT
        self._state: Any = np.zeros(0, np.int8)  # the same bytes, for numpy
        self._lens: Any = memoryview(bytearray(8)).cast("q")
        self._ports: Any = self._lens
        self._keep: list[Any] = []
        self._port = -1  # the UDP port the names' sin6_port holds
        #: RELEASED entries the socket has not taken yet (none: an unpaced flush sends runs in place)
        self._unsent = 0

    # -- the per-slot tables
    def _bind(self, old_head: int, old_cap: int, old_live: int) -> None:
        """Headers, iovecs and names for the ring's present memory; the states of the entries that were
        live before the ring grew follow them to their new slots (TxRing.reserve: slots 0.. in order)."""
        ring = self.ring
        cap = ring.cap
        st = bytearray(cap)
        state = np.frombuffer(st, np.int8)
        if self._state.size and old_live:
            state[:old_live] = self._state[(old_head + np.arange(old_live)) % old_cap]
        self._st, self._state = st, state
        self._lens = memoryview(ring.lens).cast("q")
        self._ports = memoryview(ring.ports).cast("q")
        # numpy views of the same, for the unpaced path's slices (made once per ring memory, not per flush)
        self._lens_np = np.frombuffer(ring.lens, np.int64)
        self._dst_np = np.frombuffer(ring.dst, np.uint8).reshape(cap, 16)
        data_addr, keep_d = _addr(ring.data)
        self._iov = bytearray(cap * mmsg.IOV)
        self._hdr = bytearray(cap * mmsg.HDR)
        self._names = bytearray(cap * _NAME)
        self._gather = bytearray(min(cap, MAX_VLEN) * mmsg.HDR)
        iov_addr, keep_i = _addr(self._iov)
        self._hdr_addr, keep_h = _addr(self._hdr)
        names_addr, keep_n = _addr(self._names)
        self._gather_addr, keep_g = _addr(self._gather)
        self._keep = [keep_d, keep_i, keep_h, keep_n, keep_g]
        slots = np.arange(cap, dtype=np.uint64)
        iov = np.frombuffer(self._iov, np.uint64).reshape(cap, 2)
        iov[:, 0] = np.uint64(data_addr) + slots * np.uint64(SLOT)
        hdr = np.frombuffer(self._hdr, np.uint64).reshape(cap, 8)
        hdr[:, 0] = np.uint64(names_addr) + slots * np.uint64(_NAME)  # msg_name
        hdr[:, 1] = mmsg.SIN6  # msg_namelen (the 4 bytes after it are padding)
        hdr[:, 2] = np.uint64(iov_addr) + slots * np.uint64(mmsg.IOV)  # msg_iov
        hdr[:, 3] = 1  # msg_iovlen
        names = np.frombuffer(self._names, np.uint8).reshape(cap, _NAME)
        self._iov_len = iov[:, 1]
        self._iov_q = memoryview(self._iov).cast("Q")  # the same, for the scalar path (`_send`)
        self._hdr_rows = hdr
        self._name_head = names[:, :4]  # sin6_family, sin6_port
        self._name_addr = names[:, 8:24]
        self._gen = ring.gen
        self._cap = cap
        self._port = -1

    def before_fill(self) -> tuple[int, int, int]:
        """What `after_fill` needs to follow the ring if the engine grows it: (head, cap, live)."""
        return self.ring.head, self._cap, len(self.ring)

    def after_fill(self, before: tuple[int, int, int]) -> None:
        if self.ring.gen != self._gen:
            self._bind(*before)

    # -- pacing
    def _fill(self, now: int) -> list[float]:
        """Each port's bucket filled for `now` (`SocketDriver._pace`'s rule); returns its slack."""
        slack = []
        for p, rate in enumerate(self.rate):
            earned = self.tokens[p] + (now - self.filled[p]) * rate
            cap = self.burst
            if self.backlog[p] and self.catchup:
                cap = max(cap, rate * self.catchup_ns)
            self.tokens[p] = earned if earned < cap else cap
            self.filled[p] = now
            slack.append(rate * self.slack_ns if self.debt else 0.0)
        return slack

    def _walk(self, now: int) -> list[int]:
        """One pass over the live entries, oldest first: each HELD one that its port's bucket allows
        becomes RELEASED (the buckets are filled once, at the first HELD entry, as `_pace` fills them
        when it holds any); returns the slots of every RELEASED entry, in order. A scalar loop: the
        entries of one turn are few, and numpy's cost per call is more than the loop's per entry."""
        ring = self.ring
        st = self._st
        lens, ports = self._lens, self._ports
        nports = len(self.rate)
        tokens, rates, burst, overhead = self.tokens, self.rate, self.burst, self.overhead
        mask = ring.cap - 1
        go: list[int] = []
        slack: list[float] | None = None
        blocked = [False] * nports
        self.pace_at = None
        for i in range(ring.head, ring.tail):
            s = i & mask
            x = st[s]
            if x == SENT:
                continue
            if x == HELD:
                p = ports[s]
                if 0 <= p < nports:  # (a port without a rate: not paced)
                    if slack is None:
                        slack = self._fill(now)
                    if blocked[p]:
                        continue
                    need = lens[s] + overhead
                    tok = tokens[p]
                    if tok < need - slack[p] and tok < burst:
                        blocked[p] = True
                        wait = now + int((need - slack[p] - tok) / rates[p]) + 1
                        if self.pace_at is None or wait < self.pace_at:
                            self.pace_at = wait
                        continue
                    tokens[p] = tok - need
                st[s] = RELEASED
            go.append(s)
        if slack is not None:
            for p in range(nports):
                self.backlog[p] = blocked[p]
                if blocked[p]:
                    self.paced += 1
                elif tokens[p] > burst:  # idle from now on: no more credit than an idle port keeps
                    tokens[p] = burst
        return go

    # -- sending
    def flush(self, fd: int, now: int, dst_port: int) -> int:
        """Release what the buckets allow and send every released entry to UDP port `dst_port` (until
        the socket's buffer is full); returns datagrams sent."""
        ring = self.ring
        n = len(ring)
        if n == 0:
            self.pace_at = None
            return 0
        if ring.gen != self._gen:
            self._bind(ring.head, self._cap, 0)
        if dst_port != self._port:
            self._name_head[:] = np.frombuffer(mmsg.sockaddr_in6(bytes(16), dst_port)[:4], np.uint8)
            self._port = dst_port
        if not self.rate and not self._unsent:
            return self._send_runs(fd)
        go = self._walk(now)
        done = 0
        self._unsent = 0
        if go:
            done = self._send(fd, go)
        # the head moves past the leading SENT entries, whose slots are free again
        st = self._st
        mask = ring.cap - 1
        lead = 0
        i = ring.head
        while i < ring.tail and st[i & mask] == SENT:
            st[i & mask] = HELD
            i += 1
            lead += 1
        if lead:
            ring.release(lead)
        return done

    def _send_runs(self, fd: int) -> int:
        """Unpaced, nothing left over: every live entry goes, oldest first, so each run of consecutive
        slots is sent where its headers lie (no gathering, no states); the head follows each call. What
        the socket refuses is marked RELEASED for the general path."""
        ring = self.ring
        lens, dst = self._lens_np, self._dst_np
        total = 0
        for s, k in ring.runs():
            self._iov_len[s : s + k] = lens[s : s + k]
            self._name_addr[s : s + k] = dst[s : s + k]
            pos = 0
            while pos < k:
                want = min(k - pos, MAX_VLEN)
                r = int(self._sendmmsg(fd, self._hdr_addr + (s + pos) * mmsg.HDR, want, 0))
                if r < 0:
                    e = ctypes.get_errno()
                    if e == errno.EINTR:
                        continue
                    if e in (errno.EAGAIN, errno.EWOULDBLOCK):
                        return self._refused(total)
                    self.errors += 1  # that datagram is lost (as below)
                    ring.release(1)
                    pos += 1
                    continue
                ring.release(r)
                pos += r
                total += r
                if r < want:
                    return self._refused(total)
        return total

    def _refused(self, total: int) -> int:
        """The socket's buffer is full: the live entries wait as RELEASED."""
        ring = self.ring
        self.blocked += 1
        n = len(ring)
        self._state[(ring.head + np.arange(n)) % ring.cap] = RELEASED
        self._unsent = n
        return total

    def _send(self, fd: int, go: list[int]) -> int:
        """Send the RELEASED entries in slots `go` (in order): each slot's length and destination into its
        iovec and name, then one sendmmsg per MAX_VLEN, where the headers lie when `go` is one run of
        consecutive slots, else from their copies gathered in order. Scalar copies, not numpy: a paced
        flush holds a few datagrams, and numpy's fancy indexing cost ~25 us a flush (bench/tx_ring.py,
        "ring / list" paced, 1.11 before). Sets `_unsent` to the entries the socket did not take."""
        ring = self.ring
        lens, dst, iov, names, st = self._lens, ring.dst, self._iov_q, self._names, self._st
        for s in go:
            iov[2 * s + 1] = lens[s]
            o = s * _NAME + 8
            names[o : o + 16] = dst[16 * s : 16 * s + 16]
        n = len(go)
        s0 = go[0]
        in_place = go[-1] - s0 == n - 1  # one run of consecutive slots (go is in ring order)
        hdr, gather = self._hdr, self._gather
        vmax = MAX_VLEN if in_place else len(gather) // mmsg.HDR
        total = 0
        pos = 0
        while pos < n:
            k = min(n - pos, vmax)
            if in_place:
                addr = self._hdr_addr + (s0 + pos) * mmsg.HDR
            else:
                for j in range(k):
                    s = go[pos + j]
                    gather[j * mmsg.HDR : (j + 1) * mmsg.HDR] = hdr[s * mmsg.HDR : (s + 1) * mmsg.HDR]
                addr = self._gather_addr
            r = int(self._sendmmsg(fd, addr, k, 0))
            if r < 0:
                e = ctypes.get_errno()
                if e == errno.EINTR:
                    continue
                if e in (errno.EAGAIN, errno.EWOULDBLOCK):
                    self.blocked += 1
                    break
                # e.g. ENOBUFS, no route: that datagram is lost, the engine recovers it as a fabric loss
                self.errors += 1
                st[go[pos]] = SENT
                pos += 1
                continue
            for j in range(pos, pos + r):
                st[go[j]] = SENT
            pos += r
            total += r
            if r < k:  # the socket took part of the batch: its buffer is full
                self.blocked += 1
                break
        self._unsent = n - pos
        return total

    @property
    def want_write(self) -> bool:
        """Released datagrams wait for room in the socket's buffer."""
        return self._unsent > 0

