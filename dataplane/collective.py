"""The collective's `Transport` over MRC: ranks exchange chunks by WRITE-with-immediate into the peer's
registered buffer through their host's mrcd (client library, docs/daemon.md), and the rendezvous that
tells each rank who its peers are (docs/collective.md, "Ranks over MRC").

Memory: each rank registers one shared-memory region laid out as

    [staging: S slots]  [receive area of peer 0: S slots] ... [receive area of peer n-1: S slots]  [scratch]

with `slot_bytes` per slot (the largest message the collective will send). A message to peer p is copied
into a staging slot and written into slot `seq % S` of this rank's area in p's region, with a
WRITE-with-immediate. The immediate (32 bits) says what landed:

    data    bit 31 = 0 | slot (8 bits, 30..23) | tag (23 bits)   -> the ring's step (reduce-scatter or
                                                                    all-gather + hop), checked by recv
    credit  bit 31 = 1 | count (31 bits)                          -> the peer consumed `count` slots

Flow control is credit-based: a sender starts with S credits per peer and spends one per message; the
receiver returns one (an 8-byte WRITE-with-immediate into the sender's scratch) as soon as it has copied
a message out of its slot, so a slot is never overwritten before it was consumed. Messages are delivered
in the order they were posted (the receiver expects slot seq % S next, whatever order the completions
came in). Receives are pre-posted (2 S + 4 per QP, re-posted as they are consumed). A staging slot is
reused only after the WRITE that used it completed at the requester (every PSN acknowledged).

Rendezvous (who is rank i, its QPN toward each peer, its region's address and R_Key): a key-value store
with blocking get — the torch.distributed TCPStore protocol when torch is importable, else a directory of
JSON files written atomically (`FileStore`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Final

from mrc.collective.transport import TransportError
from mrc.errors import MrcError

from .client import ClientQp, MrcClient, RemoteMr
from .intrahost import IntraHost
from .rendezvous import Store

IMM_CREDIT: Final = 1 << 31
SLOT_SHIFT: Final = 23
TAG_MASK: Final = (1 << SLOT_SHIFT) - 1
MAX_SLOTS: Final = 255
SCRATCH: Final = 64
CREDIT_BYTES: Final = 8
#: MRC_POST_NOWAIT=0: post every send and receive as a round trip to mrcd (the client waits for each
#: answer), the path before posts were pipelined; read when a transport is constructed.
POST_NOWAIT_ENV: Final = "MRC_POST_NOWAIT"


def post_nowait() -> bool:
    return os.environ.get(POST_NOWAIT_ENV, "1").strip() != "0"


class FileStore:
    """Keys as files of one directory, each written atomically (temporary file + rename)."""

    def __init__(self, path: str | Path, timeout_s: float = 120.0) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s

    def _file(self, key: str) -> Path:
        return self.path / (key.replace("/", "__") + ".json")

    def set(self, key: str, value: str) -> None:
        f = self._file(key)
        tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
        tmp.write_text(value)
        tmp.replace(f)

    def get(self, key: str) -> str:
        f = self._file(key)
        deadline = time.monotonic() + self.timeout_s
        while True:
            with contextlib.suppress(FileNotFoundError):
                return f.read_text()
            if time.monotonic() > deadline:
                raise MrcError(f"rendezvous: {key!r} not published in {self.path} within {self.timeout_s} s")
            time.sleep(0.02)

    def check(self) -> None:
        """Nothing to watch: the ranks mrcctl launches have no failure key (the launcher sees a rank exit)."""


class TorchStore:
    """torch.distributed's TCPStore (client side; the server is started by whoever launches the ranks)."""

    def __init__(self, host: str, port: int, timeout_s: float = 120.0) -> None:
        import datetime

        import torch.distributed as dist

        self.store = dist.TCPStore(  # type: ignore[attr-defined]
            host, port, is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s))

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def get(self, key: str) -> str:
        try:
            return bytes(self.store.get(key)).decode()
        except RuntimeError as e:  # torch's timeout / connection errors
            raise MrcError(f"rendezvous: {key!r}: {str(e).splitlines()[0]}") from None

    def check(self) -> None:
        """Nothing to watch: the ranks mrcctl launches have no failure key (the launcher sees a rank exit)."""


def open_store(url: str, timeout_s: float = 120.0) -> Store:
    """`tcp://HOST:PORT` (torch TCPStore) or `file:DIR`."""
    if url.startswith("tcp://"):
        host, _, port = url[len("tcp://"):].rpartition(":")
        return TorchStore(host, int(port), timeout_s)
    if url.startswith("file:"):
        return FileStore(url[len("file:"):], timeout_s)
    raise MrcError(f"rendezvous {url!r}: expected tcp://HOST:PORT or file:DIR")


def torch_available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available())


class MrcTransport:
    """One rank's `Transport` over its host's mrcd. `hosts[i]` is rank i's testbed host (peer name for
    create_qp); `ns` is this rank's host namespace (its mrcd's control socket, `client.socket_path(ns)`;
    `socket` names the control socket itself instead, e.g. on a real host). It carries the messages to
    and from the ranks on other hosts (one QP each); ranks on the same host are `RankTransport`'s."""

    def __init__(self, store: Store, rank: int, hosts: list[str], ns: str, slot_bytes: int, *,
                 slots: int = 2, timeout_s: float = 120.0, prefix: str = "mrc-ar",
                 socket: str | Path | None = None) -> None:
        n = len(hosts)
        if not 0 <= rank < n:
            raise MrcError(f"rank {rank} outside 0..{n - 1}")
        if not 1 <= slots <= MAX_SLOTS:
            raise MrcError(f"slots must be 1..{MAX_SLOTS}")
        self._rank, self._n = rank, n
        self.slots = slots
        self.slot_bytes = max(8, -(-slot_bytes // 8) * 8)
        self.timeout_s = timeout_s
        # posts as one socket write each, their answers read later (MrcClient.call_nowait): on a loaded
        # host each round trip waits for mrcd to be scheduled, and a ring message costs three posts
        self.wait_posts = not post_nowait()
        # the ranks on other hosts (co-located ranks go through `RankTransport`'s intra-host carrier)
        self.peers = [p for p in range(n) if p != rank and hosts[p] != hosts[rank]]
        self.client = (MrcClient(socket, timeout=timeout_s) if socket is not None
                       else MrcClient.for_host(ns, timeout=timeout_s))
        try:
            self._setup(store, hosts, prefix)
        except BaseException:
            self.close()
            raise

    # -- set-up
    def _recv_off(self, src: int) -> int:
        """Offset of the receive area for messages from rank `src` (in every rank's region)."""
        return (1 + src) * self.slots * self.slot_bytes

    def _setup(self, store: Store, hosts: list[str], prefix: str) -> None:
        n, s, sb = self._n, self.slots, self.slot_bytes
        self.scratch_off = (1 + n) * s * sb
        self.mr: RemoteMr = self.client.reg_mr(self.scratch_off + SCRATCH)
        self.qps: dict[int, ClientQp] = {p: self.client.create_qp(hosts[p]) for p in self.peers}
        me = {"host": hosts[self._rank], "addr": self.mr.addr, "rkey": self.mr.rkey,
              "qpn": {str(p): q.qpn for p, q in self.qps.items()},
              "mtu": {str(p): q.mtu for p, q in self.qps.items()}}
        store.set(f"{prefix}/rank{self._rank}", json.dumps(me))
        self.remote: dict[int, dict[str, Any]] = {}
        for p in self.peers:
            doc = json.loads(store.get(f"{prefix}/rank{p}"))
            if doc["host"] != hosts[p]:
                raise MrcError(f"rendezvous: rank {p} is on {doc['host']}, expected {hosts[p]}")
            self.remote[p] = doc
            mtu = doc.get("mtu", {}).get(str(self._rank))  # that QP's payload: ours is capped by it
            self.client.connect(self.qps[p], int(doc["qpn"][str(self._rank)]),
                                None if mtu is None else int(mtu))
        self._wr = 0
        self.send_seq = dict.fromkeys(self.peers, 0)
        self.credits = dict.fromkeys(self.peers, s)
        self.recv_seq = dict.fromkeys(self.peers, 0)
        self.arrived: dict[int, dict[int, tuple[int, int]]] = {p: {} for p in self.peers}
        self.owed: dict[int, int] = dict.fromkeys(self.peers, 0)
        self.pending: dict[int, set[int]] = {p: set() for p in self.peers}  # our WRs not yet completed
        self.stage_busy: dict[int, tuple[int, int]] = {}  # staging slot -> (peer, wr_id)
        self.stage_next = 0
        self.posted = dict.fromkeys(self.peers, 0)
        for p in self.peers:
            for _ in range(2 * s + 4):
                self._post_recv(p)
        self.client.sync()  # mrcd has taken every receive (not merely been sent them)
        # every rank has connected and posted its receives before anyone writes
        store.set(f"{prefix}/ready{self._rank}", "1")
        for p in self.peers:
            store.get(f"{prefix}/ready{p}")

    def _next_wr(self) -> int:
        self._wr += 1
        return self._wr

    def _post_recv(self, p: int) -> None:
        self.client.post_recv(self.qps[p], self._next_wr(), wait=self.wait_posts)
        self.posted[p] += 1

    # -- Transport
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._n

    @property
    def send_window(self) -> int:
        """Messages that may be outstanding toward one peer before `send` waits for a credit (the ring
        pipelines this many segments: mrc.collective.ring.send_window)."""
        return self.slots

    def _pump(self, p: int, timeout: float) -> None:
        """Handle the completions of the QP toward `p` (waiting up to `timeout` for the first)."""
        for wc in self.client.poll_wc(self.qps[p], timeout=timeout):
            if wc["status"] != "SUCCESS":
                raise TransportError(f"rank {self._rank}: QP to rank {p} ({self.qps[p].peer}): "
                                     f"{wc['opcode']} failed: {wc['status']}")
            if wc["opcode"] == "RECV_RDMA_WITH_IMM":
                self.posted[p] -= 1
                self._post_recv(p)
                imm = int(wc["imm"])
                if imm & IMM_CREDIT:
                    self.credits[p] += imm & ~IMM_CREDIT
                else:
                    slot = (imm >> SLOT_SHIFT) & 0xFF
                    if slot in self.arrived[p]:
                        raise TransportError(f"rank {self._rank}: slot {slot} from rank {p} overwritten "
                                             "before it was consumed")
                    self.arrived[p][slot] = (imm & TAG_MASK, int(wc["byte_len"]))
            else:
                self.pending[p].discard(int(wc["wr_id"]))

    def _wait(self, p: int, cond: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportError(f"rank {self._rank}: {what} (rank {p}, {self.qps[p].peer}) "
                                     f"within {self.timeout_s} s")
            self._pump(p, min(0.5, left))

    def _write(self, p: int, offset: int, length: int, remote_off: int, imm: int) -> int:
        wr = self._next_wr()
        r = self.remote[p]
        self.client.post_send(self.qps[p], wr_id=wr, mr=self.mr, offset=offset, length=length,
                              remote_addr=int(r["addr"]) + remote_off, rkey=int(r["rkey"]), imm=imm,
                              wait=self.wait_posts)
        self.pending[p].add(wr)
        return wr

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        if dst not in self.remote:
            raise TransportError(f"rank {self._rank}: bad destination {dst}")
        if not 0 <= tag <= TAG_MASK:
            raise TransportError(f"rank {self._rank}: tag {tag} does not fit the immediate "
                                 f"({SLOT_SHIFT} bits)")
        if len(data) > self.slot_bytes:
            raise TransportError(f"rank {self._rank}: message of {len(data)} B exceeds the slot "
                                 f"({self.slot_bytes} B)")
        self._wait(dst, lambda: self.credits[dst] > 0, "no credit to send")
        k = self.stage_next
        self.stage_next = (k + 1) % self.slots
        busy = self.stage_busy.pop(k, None)
        if busy is not None:
            bp, bwr = busy
            self._wait(bp, lambda: bwr not in self.pending[bp], "staging slot's WRITE not acknowledged")
        off = k * self.slot_bytes
        self.mr.buf[off : off + len(data)] = data
        slot = self.send_seq[dst] % self.slots
        self.send_seq[dst] += 1
        self.credits[dst] -= 1
        wr = self._write(dst, off, len(data), self._recv_off(self._rank) + slot * self.slot_bytes,
                         (slot << SLOT_SHIFT) | tag)
        self.stage_busy[k] = (dst, wr)

    def recv(self, src: int, tag: int) -> bytes:
        if src not in self.remote:
            raise TransportError(f"rank {self._rank}: bad source {src}")
        slot = self.recv_seq[src] % self.slots
        self._wait(src, lambda: slot in self.arrived[src], f"nothing (tag {tag}) arrived")
        got_tag, length = self.arrived[src].pop(slot)
        if got_tag != tag:
            raise TransportError(f"rank {self._rank}: expected tag {tag} from rank {src}, got {got_tag}")
        off = self._recv_off(src) + slot * self.slot_bytes
        data = bytes(self.mr.buf[off : off + length])
        self.recv_seq[src] += 1
        # the slot is consumed: give the sender its credit back
        self._write(src, self.scratch_off, CREDIT_BYTES, self.scratch_off + CREDIT_BYTES, IMM_CREDIT | 1)
        return data

    def flush(self) -> None:
        for p in self.peers:
            self._wait(p, lambda p=p: not self.pending[p], "WRITEs not acknowledged")
        self.client.sync()

    def close(self) -> None:
        for q in getattr(self, "qps", {}).values():
            with contextlib.suppress(Exception):
                self.client.destroy_qp(q)
        self.client.close()


class RankTransport:
    """A rank's `Transport` when several ranks share a host (docs/collective.md, "Ranks per host"): a
    message to a rank on another host goes through MRC (`MrcTransport`, WRITE-with-immediate through this
    host's mrcd), one to a co-located rank through shared memory (`IntraHost`). Both carriers use credits
    over `slots` slots per peer, so `send` blocks only until the peer consumed a message, and
    `send_window` is `slots` either way. `mrc_bytes` / `local_bytes` count the message bytes this rank
    posted over each (the ring's wire bytes, split by carrier)."""

    def __init__(self, store: Store, rank: int, hosts: list[str], ns: str, slot_bytes: int, *,
                 slots: int = 2, timeout_s: float = 120.0, prefix: str = "mrc-ar",
                 socket: str | Path | None = None) -> None:
        self._rank, self._n = rank, len(hosts)
        self.slots = slots
        self.mrc_bytes = 0
        self.local_bytes = 0
        # the intra-host listener is up and published before anything below waits on a peer
        self.local = IntraHost(store, rank, hosts, slot_bytes, slots=slots, timeout_s=timeout_s,
                               prefix=prefix)
        self.mrc: MrcTransport | None = None
        try:
            if any(h != hosts[rank] for h in hosts):
                self.mrc = MrcTransport(store, rank, hosts, ns, slot_bytes, slots=slots, timeout_s=timeout_s,
                                        prefix=prefix, socket=socket)
        except BaseException:
            self.local.close()
            raise
        self.slot_bytes = self.mrc.slot_bytes if self.mrc is not None else self.local.slot_bytes
        self._local = set(self.local.peers)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._n

    @property
    def send_window(self) -> int:
        return self.slots

    @property
    def qps(self) -> dict[int, ClientQp]:
        return self.mrc.qps if self.mrc is not None else {}

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        if dst in self._local:
            self.local.send(dst, tag, data)
            self.local_bytes += len(data)
        elif self.mrc is not None:
            self.mrc.send(dst, tag, data)
            self.mrc_bytes += len(data)
        else:
            raise TransportError(f"rank {self._rank}: bad destination {dst}")

    def recv(self, src: int, tag: int) -> bytes:
        if src in self._local:
            return self.local.recv(src, tag)
        if self.mrc is None:
            raise TransportError(f"rank {self._rank}: bad source {src}")
        return self.mrc.recv(src, tag)

    def flush(self) -> None:
        if self.mrc is not None:
            self.mrc.flush()

    def close(self) -> None:
        try:
            if self.mrc is not None:
                self.mrc.close()
        finally:
            self.local.close()


__all__ = ["FileStore", "MrcTransport", "RankTransport", "Store", "TorchStore", "open_store",
           "torch_available"]
