"""The intra-host carrier between rank processes of one host (docs/collective.md, "Ranks per host").

Two ranks on the same host do not go through MRC: NCCL carries such hops over shared memory / NVLink,
and so do we, over shared memory and a Unix-domain stream socket per co-located pair.

* Memory: every rank makes one memfd per co-located peer, `S` slots of `slot_bytes` — its receive area
  for messages from that peer — and hands the descriptor to the peer (SCM_RIGHTS) when the pair
  connects. The sender copies a message straight into the receiver's slot `seq % S`.
* Notices: 16-byte records on the pair's socket, `<kind, slot|count, tag, length>` (u32 each): a data
  notice says what landed in which slot; a credit notice that the receiver has copied `count` messages
  out of their slots. A sender holds `S` credits per peer and spends one per message, so a slot is never
  overwritten before it was consumed; `send` only blocks for a credit, exactly as over MRC, and the
  ring's deadlock argument holds (`send_window` = S).
* Connection: each rank with co-located peers listens on an abstract Unix socket (nothing on the file
  system, gone with the process), publishes its name in the rendezvous store under
  `<prefix>/local<rank>`, connects to every co-located rank below it and accepts every one above it.
  The rank processes share the root namespace (abstract sockets are per network namespace).

Delivery is in posting order (one stream per pair); `recv` checks the tag; a peer that went away (end of
stream, a reset) or a deadline is a `TransportError`. Everything a message needs is in the receiver's
memory when `send` returns, so `flush` has nothing to wait for.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import secrets
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Final

from mrc.collective.transport import TransportError
from mrc.errors import MrcError

from . import shm
from .rendezvous import Store

NOTICE: Final = struct.Struct("<IIII")  # kind, slot (data) or count (credit), tag, length
HELLO: Final = struct.Struct("<8sIII")  # magic, rank, slots, slot_bytes
MAGIC: Final = b"mrcintra"
KIND_DATA: Final = 0
KIND_CREDIT: Final = 1
#: how long one wait for a co-located rank's connection lasts before the rendezvous is asked whether a
#: peer gave up
ACCEPT_POLL_S: Final = 0.2


class _Peer:
    """One co-located peer: the pair's socket, its receive area in our memory, ours in its memory."""

    def __init__(self, rank: int, sock: socket.socket, rx: mmap.mmap, tx: mmap.mmap, slots: int) -> None:
        self.rank = rank
        self.sock = sock
        self.rx = rx  # messages from the peer land here (our memfd)
        self.tx = tx  # our messages to the peer go here (its memfd)
        self.rbuf = bytearray()
        self.credits = slots
        self.send_seq = 0
        self.recv_seq = 0
        self.arrived: dict[int, tuple[int, int]] = {}  # slot -> (tag, length)
        self.closed = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        for m in (self.rx, self.tx):
            with contextlib.suppress(BufferError, ValueError):
                m.close()


class IntraHost:
    """The messages of rank `rank` to and from the ranks on its own host (`hosts[i]`: rank i's host).
    A part of a rank's transport (`mrc.dataplane.collective.RankTransport`), not a whole `Transport`:
    it only knows the co-located peers (`peers`)."""

    def __init__(self, store: Store, rank: int, hosts: list[str], slot_bytes: int, *, slots: int = 2,
                 timeout_s: float = 120.0, prefix: str = "mrc-ar") -> None:
        n = len(hosts)
        if not 0 <= rank < n:
            raise MrcError(f"rank {rank} outside 0..{n - 1}")
        if not 1 <= slots <= 255:
            raise MrcError("slots must be 1..255")
        self.rank = rank
        self.slots = slots
        self.slot_bytes = max(8, -(-slot_bytes // 8) * 8)
        self.timeout_s = timeout_s
        self.peers = [p for p in range(n) if p != rank and hosts[p] == hosts[rank]]
        self.conns: dict[int, _Peer] = {}
        self.listener: socket.socket | None = None
        if not self.peers:
            return
        try:
            self._setup(store, hosts, prefix)
        except BaseException:
            self.close()
            raise

    # -- set-up
    def _area(self) -> tuple[int, mmap.mmap]:
        return shm.create(f"mrc-intra-{self.rank}", self.slots * self.slot_bytes)

    def _hello(self, sock: socket.socket, deadline: float) -> tuple[int, mmap.mmap]:
        """Read the peer's hello: (its rank, its receive area for our messages, mapped)."""
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, HELLO.size, 1)
        except (OSError, TimeoutError) as e:
            raise MrcError(f"rank {self.rank}: intra-host hello: {e}") from None
        try:
            if len(data) != HELLO.size or len(fds) != 1:
                raise MrcError(f"rank {self.rank}: intra-host hello: short or no descriptor")
            magic, rank, slots, sb = HELLO.unpack(data)
            if magic != MAGIC or (slots, sb) != (self.slots, self.slot_bytes):
                raise MrcError(f"rank {self.rank}: intra-host hello from rank {rank}: {slots} slots of "
                               f"{sb} B, expected {self.slots} of {self.slot_bytes}")
            return int(rank), shm.map_received(fds[0], self.slots * self.slot_bytes,
                                               f"rank {self.rank}: intra-host hello from rank {rank}")
        finally:
            for fd in fds:
                os.close(fd)

    def _say_hello(self, sock: socket.socket, fd: int) -> None:
        socket.send_fds(sock, [HELLO.pack(MAGIC, self.rank, self.slots, self.slot_bytes)], [fd])

    def _setup(self, store: Store, hosts: list[str], prefix: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        name = f"mrc-intra-{prefix}-{self.rank}-{os.getpid()}-{secrets.token_hex(4)}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind("\0" + name)
        self.listener.listen(len(self.peers))
        store.set(f"{prefix}/local{self.rank}", json.dumps({"host": hosts[self.rank], "name": name}))
        areas: dict[int, tuple[int, mmap.mmap]] = {}
        try:
            for p in self.peers:
                areas[p] = self._area()
            for p in (q for q in self.peers if q < self.rank):
                doc = json.loads(store.get(f"{prefix}/local{p}"))
                if doc["host"] != hosts[p]:
                    raise MrcError(f"rendezvous: rank {p} is on {doc['host']}, expected {hosts[p]}")
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.settimeout(max(0.01, deadline - time.monotonic()))
                    s.connect("\0" + str(doc["name"]))
                    self._say_hello(s, areas[p][0])
                    got, tx = self._hello(s, deadline)
                except OSError as e:  # its socket gone or refusing: the rank left, or never got here
                    s.close()
                    raise MrcError(f"rank {self.rank}: co-located rank {p} ({doc['name']}): "
                                   f"{e.strerror or e}") from None
                except BaseException:
                    s.close()
                    raise
                if got != p:
                    s.close()
                    tx.close()
                    raise MrcError(f"rank {self.rank}: rank {p}'s socket answered as rank {got}")
                self.conns[p] = _Peer(p, s, areas[p][1], tx, self.slots)
            above = {q for q in self.peers if q > self.rank}
            while above:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MrcError(f"rank {self.rank}: co-located ranks {sorted(above)} did not connect "
                                   f"within {self.timeout_s} s")
                # in short waits, between which the rendezvous says whether a peer gave up (waiting
                # out the whole timeout for a rank that had failed took up to the group's 30 minutes)
                self.listener.settimeout(min(left, ACCEPT_POLL_S))
                try:
                    s, _ = self.listener.accept()
                except TimeoutError:
                    store.check()
                    continue
                try:
                    got, tx = self._hello(s, deadline)
                    if got not in above:
                        raise MrcError(f"rank {self.rank}: unexpected intra-host hello from rank {got}")
                    self._say_hello(s, areas[got][0])
                except BaseException:
                    s.close()
                    raise
                above.discard(got)
                self.conns[got] = _Peer(got, s, areas[got][1], tx, self.slots)
        finally:
            for fd, _m in areas.values():
                os.close(fd)  # the mappings keep the memory; the peer holds its own descriptor's mapping
            for p, (_fd, m) in areas.items():
                if p not in self.conns:
                    m.close()
            self.listener.close()
            self.listener = None
        for c in self.conns.values():
            c.sock.settimeout(None)
            c.sock.setblocking(True)

    # -- messages
    def _fail(self, c: _Peer, what: str) -> TransportError:
        c.closed = True
        return TransportError(f"rank {self.rank}: co-located rank {c.rank}: {what}")

    def _notice(self, c: _Peer, kind: int, a: int, tag: int = 0, length: int = 0) -> None:
        if c.closed:
            raise self._fail(c, "connection lost")
        try:
            c.sock.sendall(NOTICE.pack(kind, a, tag, length))
        except OSError as e:
            # only our direction failed (the peer closed its end): what it sent before leaving is still
            # in the stream and must stay readable, so the connection is not marked closed here
            raise TransportError(f"rank {self.rank}: co-located rank {c.rank}: connection lost "
                                 f"({e})") from None

    def _pump(self, c: _Peer, timeout: float) -> None:
        """Read what the peer said (waiting up to `timeout` for something)."""
        if c.closed:
            raise self._fail(c, "connection lost")
        r, _, _ = select.select([c.sock], [], [], max(0.0, timeout))
        if not r:
            return
        try:
            chunk = c.sock.recv(1 << 16)
        except OSError as e:
            raise self._fail(c, f"connection lost ({e})") from None
        if not chunk:
            raise self._fail(c, "the peer closed the connection (process gone?)")
        c.rbuf += chunk
        while len(c.rbuf) >= NOTICE.size:
            kind, a, tag, length = NOTICE.unpack_from(c.rbuf)
            del c.rbuf[: NOTICE.size]
            if kind == KIND_CREDIT:
                c.credits += a
            elif kind == KIND_DATA:
                if a in c.arrived:
                    raise self._fail(c, f"slot {a} overwritten before it was consumed")
                c.arrived[a] = (tag, length)
            else:
                raise self._fail(c, f"unknown notice kind {kind}")

    def _wait(self, c: _Peer, cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError(f"rank {self.rank}: {what} (co-located rank {c.rank}) within "
                                     f"{self.timeout_s} s")
            self._pump(c, min(0.5, left))

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        c = self.conns.get(dst)
        if c is None:
            raise TransportError(f"rank {self.rank}: rank {dst} is not on this host")
        if len(data) > self.slot_bytes:
            raise TransportError(f"rank {self.rank}: message of {len(data)} B exceeds the slot "
                                 f"({self.slot_bytes} B)")
        self._wait(c, lambda: c.credits > 0, "no credit to send")
        slot = c.send_seq % self.slots
        off = slot * self.slot_bytes
        c.tx[off : off + len(data)] = data
        c.send_seq += 1
        c.credits -= 1
        self._notice(c, KIND_DATA, slot, tag, len(data))

    def recv(self, src: int, tag: int) -> bytes:
        c = self.conns.get(src)
        if c is None:
            raise TransportError(f"rank {self.rank}: rank {src} is not on this host")
        slot = c.recv_seq % self.slots
        self._wait(c, lambda: slot in c.arrived, f"nothing (tag {tag}) arrived")
        got_tag, length = c.arrived.pop(slot)
        if got_tag != tag:
            raise TransportError(f"rank {self.rank}: expected tag {tag} from rank {src}, got {got_tag}")
        off = slot * self.slot_bytes
        data = bytes(c.rx[off : off + length])
        c.recv_seq += 1
        # the slot is consumed: the sender gets its credit back. A sender that already left (its last
        # message was this one, and it closed) needs none: the next wait on it reports the lost connection
        with contextlib.suppress(TransportError):
            self._notice(c, KIND_CREDIT, 1)
        return data

    def close(self) -> None:
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.close()
            self.listener = None
        for c in self.conns.values():
            c.close()
        self.conns = {}


__all__ = ["IntraHost"]
