"""Sending a send ring (`mrc.transport.txring.TxRing`) with sendmmsg, straight from its slots, paced per
plane port: the socket driver's send half when ``MRC_TX_RING=1`` (`dataplane.driver`).

The engine writes each datagram into a slot of the ring (`Context.datagrams_into`); this module points
the kernel at those slots. Per slot it keeps a `struct mmsghdr`, an iovec on the slot and a
`sockaddr_in6`, built once for the ring's memory (again when the ring grows: `TxRing.gen`); per flush it
writes the lengths and destinations of the entries to send with numpy, gathers their headers into one
array and makes one sendmmsg call per 1024 datagrams. No Python object and no copy per datagram.

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
    counters `sent`, `blocked`, `errors` and `paced` are the socket driver's, which takes them."""

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
        self.sent = 0
        self.blocked = 0
        self.errors = 0
        self.paced = 0
        self._sendmmsg = mmsg._lib().sendmmsg
        self._gen = -1
        self._cap = 0
        self._state: Any = np.zeros(0, np.int8)
        self._keep: list[Any] = []

    # -- the per-slot tables
    def _bind(self, old_head: int, old_cap: int, old_live: int) -> None:
        """Headers, iovecs and names for the ring's present memory; the states of the entries that were
        live before the ring grew follow them to their new slots (TxRing.reserve: slots 0.. in order)."""
        ring = self.ring
        cap = ring.cap
        state = np.zeros(cap, np.int8)
        if self._state.size and old_live:
            state[:old_live] = self._state[(old_head + np.arange(old_live)) % old_cap]
        self._state = state
        data_addr, keep_d = _addr(ring.data)
        self._iov = bytearray(cap * mmsg.IOV)
        self._hdr = bytearray(cap * mmsg.HDR)
        self._names = bytearray(cap * _NAME)
        self._gather = bytearray(min(cap, MAX_VLEN) * mmsg.HDR)
        iov_addr, keep_i = _addr(self._iov)
        _, keep_h = _addr(self._hdr)
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
        self._hdr_rows = hdr
        self._name_head = names[:, :4]  # sin6_family, sin6_port
        self._name_addr = names[:, 8:24]
        self._gather_rows = np.frombuffer(self._gather, np.uint64).reshape(-1, 8)
        self._gen = ring.gen
        self._cap = cap

    def before_fill(self) -> tuple[int, int, int]:
        """What `after_fill` needs to follow the ring if the engine grows it: (head, cap, live)."""
        return self.ring.head, self._cap, len(self.ring)

    def after_fill(self, before: tuple[int, int, int]) -> None:
        if self.ring.gen != self._gen:
            self._bind(*before)

    # -- pacing
    def _release(self, now: int, idx: Any, st: Any) -> None:
        """Mark what each port's bucket allows of the HELD entries `idx` (ring order) RELEASED."""
        self.pace_at = None
        held = st == HELD
        if not held.any():
            return
        _, lens, ports, _, _ = self.ring.arrays()
        nports = len(self.rate)
        p_of = ports[idx]
        if not nports:
            st[held] = RELEASED
            return
        st[held & ((p_of >= nports) | (p_of < 0))] = RELEASED  # a port without a rate: not paced
        for p in range(nports):
            mine = np.flatnonzero(held & (p_of == p))
            rate = self.rate[p]
            earned = self.tokens[p] + (now - self.filled[p]) * rate
            cap = self.burst
            if self.backlog[p] and self.catchup:
                cap = max(cap, rate * self.catchup_ns)
            tok = earned if earned < cap else cap
            self.filled[p] = now
            blocked = False
            if mine.size:
                need = lens[idx[mine]].astype(np.float64) + self.overhead
                before = tok - (np.cumsum(need) - need)  # the bucket as each datagram comes to it
                slack = rate * self.slack_ns if self.debt else 0.0
                ok = (before >= need - slack) | (before >= self.burst)
                k = int(ok.size if ok.all() else np.argmin(ok))
                if k:
                    st[mine[:k]] = RELEASED
                    tok = float(before[k - 1] - need[k - 1])
                if k < ok.size:
                    blocked = True
                    self.paced += 1
                    wait = now + int((need[k] - slack - before[k]) / rate) + 1
                    if self.pace_at is None or wait < self.pace_at:
                        self.pace_at = wait
            if not blocked and tok > self.burst:  # idle from now on: no more credit than an idle port keeps
                tok = self.burst
            self.tokens[p] = tok
            self.backlog[p] = blocked

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
        cap = ring.cap
        idx = (ring.head + np.arange(n)) % cap
        st = self._state[idx]
        self._release(now, idx, st)
        self._state[idx] = st
        go = idx[st == RELEASED]
        done = self._send(fd, go, dst_port) if go.size else 0
        # the head moves past the leading SENT entries, whose slots are free again
        sent = self._state[idx] == SENT
        lead = int(n if sent.all() else np.argmin(sent))
        if lead:
            self._state[idx[:lead]] = HELD
            ring.release(lead)
        return done

    def _send(self, fd: int, go: Any, dst_port: int) -> int:
        _, lens, _, _, dst = self.ring.arrays()
        self._iov_len[go] = lens[go]
        self._name_head[go] = np.frombuffer(mmsg.sockaddr_in6(bytes(16), dst_port)[:4], np.uint8)
        self._name_addr[go] = dst[go]
        state = self._state
        total = 0
        pos = 0
        while pos < go.size:
            k = min(go.size - pos, self._gather_rows.shape[0])
            self._gather_rows[:k] = self._hdr_rows[go[pos : pos + k]]
            r = int(self._sendmmsg(fd, self._gather_addr, k, 0))
            if r < 0:
                e = ctypes.get_errno()
                if e == errno.EINTR:
                    continue
                if e in (errno.EAGAIN, errno.EWOULDBLOCK):
                    self.blocked += 1
                    break
                # e.g. ENOBUFS, no route: that datagram is lost, the engine recovers it as a fabric loss
                self.errors += 1
                state[go[pos]] = SENT
                pos += 1
                continue
            state[go[pos : pos + r]] = SENT
            pos += r
            total += r
            if r < k:  # the socket took part of the batch: its buffer is full
                self.blocked += 1
                break
        self.sent += total
        return total

    @property
    def want_write(self) -> bool:
        """Released datagrams wait for room in the socket's buffer."""
        n = len(self.ring)
        if n == 0 or not self._state.size:
            return False
        idx = (self.ring.head + np.arange(n)) % self.ring.cap
        return bool((self._state[idx] == RELEASED).any())

