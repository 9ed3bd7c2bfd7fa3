"""The send ring: where the engine writes the datagrams it sends, and the driver reads them from.

`Context.datagrams_to_send` returns a list of `Datagram`s, each a tuple holding its own bytearray: two
Python objects, an allocation of the packet's size and a copy per packet, and a driver with sendmmsg
copies each once more into its own buffers. `Context.datagrams_into(now, ring)` writes the same
datagrams, in the same order and with the same bytes, into one `TxRing` instead: fixed slots of SLOT
bytes in one bytearray, with the length, plane port, EV index and destination of each in flat arrays
beside it. The engine's compiled send path (`_fastc`) builds each data packet in its slot, with no
Python object per packet; the Python paths (control packets, retransmissions, a build without the C
module) append a `Datagram`, which is copied in. A driver reads whole runs of slots (`runs`, `arrays`)
and hands them to the kernel without copying them (`dataplane.driver`, `MRC_TX_RING`).

Layout (native byte order, what `arrays()` views with numpy):
  data   cap x SLOT bytes; slot s holds its datagram's lens[s] bytes from its start
  lens, ports, evs   cap int64 each
  dst    cap x 16 bytes: the destination's address (the peer's GID)

Entries are numbered from 0 for the ring's life; entry i lives in slot i % cap, and the live ones are
head <= i < tail. A full ring doubles (`reserve`): the live entries move to slots 0.. in order and `gen`
counts up, so a reader that cached addresses or views knows to take them again. One call of the engine
emits at most what its windows allow, but a driver whose socket stays full keeps calling, so the ring
stops growing at MAX_SLOTS: then the compiled send stops until the next call (nothing lost) and a
datagram appended by the Python paths is dropped and counted (`overflow`; the engine recovers it as a
fabric loss).
"""

from __future__ import annotations

import sys
from typing import Any, Final

from .qpcore import Datagram

#: bytes per slot: the largest datagram a driver sends (a WRITE with immediate data, an 8 KiB payload
#: and the ICRC fit; so does the largest SACK), as the socket driver's receive buffer
SLOT: Final = 9216
#: a new ring's slots
DEFAULT_CAP: Final = 256
#: the most slots a ring grows to (151 MB of slots)
MAX_SLOTS: Final = 1 << 14
#: the arrays' byte order (native: numpy and the C module read them in place)
_ORDER: Final = sys.byteorder


class TxRing:
    """Datagrams in fixed slots, oldest first (module doc). `append` and `reserve` are the producer's
    (the engine's); `release`, `runs`, `arrays`, `datagram` and `take` the consumer's."""

    __slots__ = ("_np", "cap", "data", "dst", "evs", "gen", "head", "lens", "overflow", "oversize", "ports",
                 "tail")

    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        if cap < 1 or cap & (cap - 1):
            raise ValueError(f"a ring's capacity is a power of two, got {cap}")
        self.head = 0
        self.tail = 0
        #: how many times the slots were reallocated (readers' cached addresses and views are stale)
        self.gen = 0
        #: datagrams longer than SLOT that were offered and dropped (no driver could send them: EMSGSIZE)
        self.oversize = 0
        #: datagrams appended to a ring full at MAX_SLOTS, dropped
        self.overflow = 0
        self._np: Any = None
        self._alloc(cap)

    def _alloc(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray(cap * SLOT)
        self.lens = bytearray(8 * cap)
        self.ports = bytearray(8 * cap)
        self.evs = bytearray(8 * cap)
        self.dst = bytearray(16 * cap)

    def __len__(self) -> int:
        return self.tail - self.head

    # -- producer
    def reserve(self) -> None:
        """Make room for one more entry: double the slots when they are all live, up to MAX_SLOTS."""
        n = self.tail - self.head
        if n < self.cap or self.cap >= MAX_SLOTS:
            return
        old = (self.data, self.lens, self.ports, self.evs, self.dst)
        cap, h = self.cap, self.head % self.cap
        self._alloc(2 * cap)
        for new, src, width in zip((self.data, self.lens, self.ports, self.evs, self.dst), old,
                                   (SLOT, 8, 8, 8, 16), strict=True):
            # the live entries are slots h..cap-1 then 0..h-1 of the old arrays
            new[: (cap - h) * width] = src[h * width :]
            new[(cap - h) * width : cap * width] = src[: h * width]
        self.head, self.tail = 0, n
        self.gen += 1
        self._np = None

    def shrink(self, cap: int) -> None:
        """Fewer slots (`cap`, a power of two, at most the present count), giving back the memory a burst
        made the ring grow to; only when no entry is live (readers rebind: `gen`)."""
        if self.tail != self.head:
            raise ValueError(f"a ring with {self.tail - self.head} live entries cannot shrink")
        if cap < 1 or cap & (cap - 1) or cap > self.cap:
            raise ValueError(f"a ring of {self.cap} slots cannot shrink to {cap}")
        if cap == self.cap:
            return
        self._alloc(cap)
        self.head = self.tail = 0
        self.gen += 1
        self._np = None

    def append(self, dg: Datagram) -> None:
        """Copy `dg` into the next slot (the engine's Python paths call this as they would a list's)."""
        data = dg.data
        n = len(data)
        if n > SLOT:
            self.oversize += 1
            return
        self.reserve()
        if self.tail - self.head >= self.cap:
            self.overflow += 1
            return
        s = self.tail % self.cap
        self.data[s * SLOT : s * SLOT + n] = data
        self.lens[8 * s : 8 * s + 8] = n.to_bytes(8, _ORDER, signed=True)
        self.ports[8 * s : 8 * s + 8] = int(dg.port).to_bytes(8, _ORDER, signed=True)
        self.evs[8 * s : 8 * s + 8] = int(dg.ev_index).to_bytes(8, _ORDER, signed=True)
        self.dst[16 * s : 16 * s + 16] = bytes(dg.dst).ljust(16, b"\0")[:16]
        self.tail += 1

    # -- consumer
    def release(self, k: int) -> None:
        """The oldest `k` entries are done with (sent, or lost to a send error)."""
        if not 0 <= k <= self.tail - self.head:
            raise ValueError(f"release of {k} entries, {self.tail - self.head} live")
        self.head += k

    def runs(self, k: int | None = None) -> list[tuple[int, int]]:
        """The oldest `k` (all) live entries as (first slot, count) runs of consecutive slots: one, or
        two where they wrap."""
        n = self.tail - self.head if k is None else min(k, self.tail - self.head)
        if n <= 0:
            return []
        s = self.head % self.cap
        first = min(n, self.cap - s)
        return [(s, first)] if first == n else [(s, first), (0, n - first)]

    def arrays(self) -> tuple[Any, Any, Any, Any, Any]:
        """numpy views of (data [cap, SLOT] uint8, lens, ports, evs [cap] int64, dst [cap, 16] uint8),
        taken again after the slots are reallocated."""
        if self._np is None:
            import numpy as np

            self._np = (np.frombuffer(self.data, np.uint8).reshape(self.cap, SLOT),
                        np.frombuffer(self.lens, np.int64), np.frombuffer(self.ports, np.int64),
                        np.frombuffer(self.evs, np.int64),
                        np.frombuffer(self.dst, np.uint8).reshape(self.cap, 16))
        views: tuple[Any, Any, Any, Any, Any] = self._np
        return views

    def datagram(self, i: int) -> Datagram:
        """Entry `i` (head <= i < tail) as the `Datagram` the list path would have given."""
        if not self.head <= i < self.tail:
            raise IndexError(f"entry {i} is not live ({self.head}..{self.tail - 1})")
        s = i % self.cap
        n = int.from_bytes(self.lens[8 * s : 8 * s + 8], _ORDER, signed=True)
        return Datagram(bytearray(self.data[s * SLOT : s * SLOT + n]),
                        int.from_bytes(self.ports[8 * s : 8 * s + 8], _ORDER, signed=True),
                        int.from_bytes(self.evs[8 * s : 8 * s + 8], _ORDER, signed=True),
                        bytes(self.dst[16 * s : 16 * s + 16]))

    def take(self, k: int | None = None) -> list[Datagram]:
        """The oldest `k` (all) entries as Datagrams, released: for tests, and for a consumer that needs
        an object per datagram anyway (it gives up what the ring saves)."""
        n = self.tail - self.head if k is None else min(k, self.tail - self.head)
        out = [self.datagram(self.head + j) for j in range(n)]
        self.head += n
        return out
