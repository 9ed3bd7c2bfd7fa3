"""The transport the collectives run over, and the in-process implementation.

A rank sees a `Transport`: it posts a chunk (bytes) to a peer rank with a tag and waits for the chunk a
peer posted to it. That is all ring all-reduce needs, and every carrier can provide it: threads in one
process (`InProcHub`, here), the fabric simulator, torch.distributed point-to-point (`mrc.collective.ddp`),
and later MRC ranks writing WRITE-with-immediate into the peer's registered buffer (the immediate carries
the tag, the landing offset the chunk).

Ordering contract: chunks from one sender to one receiver are delivered in the order they were posted;
`recv` names the tag it expects and a transport raises `TransportError` if a different one arrives (a
protocol bug, never silently mixed up). `send` may return before the peer has received the chunk (the
caller must not reuse the buffer until `flush`); `recv` blocks, with a deadline.

Optional: a transport may say, as `send_window` (an int attribute), how many messages it lets one rank
have posted to one peer and not yet consumed there before `send` blocks (MRC ranks: the slots per peer).
The ring pipelines that many segments; a transport that does not say gets 1 (no pipelining, never a
deadlock).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from mrc.errors import MrcError

T = TypeVar("T")


class TransportError(MrcError):
    """A chunk did not arrive in time, arrived with the wrong tag, or a peer failed."""


@runtime_checkable
class Transport(Protocol):
    """What a collective needs from the carrier between ranks."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        """Post `data` (bytes, or a memoryview of format "B") to rank `dst`; may return before delivery,
        but keeps no reference to `data`: its bytes are copied (into a queue, a staging slot, a shared
        ring) before `send` returns, so the caller may reuse the memory behind a view."""

    def recv(self, src: int, tag: int) -> bytes:
        """The next chunk from rank `src`, which must carry `tag`."""
        ...

    def flush(self) -> None:
        """Wait until every chunk this rank posted has left (buffers reusable)."""


class InProcHub:
    """Queues between `n` ranks living in one process (threads). One FIFO per (src, dst)."""

    def __init__(self, n: int, timeout_s: float = 60.0) -> None:
        if n < 1:
            raise ValueError(f"need at least one rank, got {n}")
        self.n = n
        self.timeout_s = timeout_s
        self._q: dict[tuple[int, int], queue.SimpleQueue[tuple[int, bytes]]] = {
            (s, d): queue.SimpleQueue() for s in range(n) for d in range(n) if s != d
        }
        self.failed = threading.Event()

    def endpoint(self, rank: int) -> InProcTransport:
        return InProcTransport(self, rank)


class InProcTransport:
    """One rank's view of an `InProcHub`."""

    def __init__(self, hub: InProcHub, rank: int) -> None:
        if not 0 <= rank < hub.n:
            raise ValueError(f"rank {rank} outside 0..{hub.n - 1}")
        self._hub = hub
        self._rank = rank

    # queues are unbounded: send never blocks, any number of messages may be outstanding (ring.send_window)
    send_window = 1 << 30

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._hub.n

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        if dst == self._rank or not 0 <= dst < self._hub.n:
            raise TransportError(f"rank {self._rank}: bad destination {dst}")
        self._hub._q[(self._rank, dst)].put((tag, bytes(data)))

    def recv(self, src: int, tag: int) -> bytes:
        if src == self._rank or not 0 <= src < self._hub.n:
            raise TransportError(f"rank {self._rank}: bad source {src}")
        q = self._hub._q[(src, self._rank)]
        deadline = time.monotonic() + self._hub.timeout_s
        while True:
            try:
                got_tag, data = q.get(timeout=0.05)
                break
            except queue.Empty:
                if self._hub.failed.is_set():
                    raise TransportError(f"rank {self._rank}: a peer failed") from None
                if time.monotonic() > deadline:
                    raise TransportError(
                        f"rank {self._rank}: nothing from rank {src} (tag {tag})"
                        f" within {self._hub.timeout_s} s"
                    ) from None
        if got_tag != tag:
            raise TransportError(f"rank {self._rank}: expected tag {tag} from rank {src}, got {got_tag}")
        return data

    def flush(self) -> None:
        return None


class SubTransport:
    """Some ranks of a transport as a transport of their own: rank i here is rank `members[i]` of `base`
    (which must be one of them). The hierarchical all-reduce runs its host group and its leaders' ring
    over two of these on one rank's transport (hier.py); messages keep their tags and, between one pair
    of ranks, their order, so the collectives on two groups that share a pair must not interleave."""

    def __init__(self, base: Transport, members: Sequence[int]) -> None:
        self.base = base
        self.members = list(members)
        if len(set(self.members)) != len(self.members) or not all(
                0 <= m < base.world_size for m in self.members):
            raise ValueError(f"members {self.members} are not distinct ranks of 0..{base.world_size - 1}")
        if base.rank not in self.members:
            raise ValueError(f"rank {base.rank} is not among the members {self.members}")
        self._rank = self.members.index(base.rank)
        self.send_window = max(1, int(getattr(base, "send_window", 1)))

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self.members)

    def _peer(self, r: int) -> int:
        if r == self._rank or not 0 <= r < len(self.members):
            raise TransportError(f"rank {self._rank} of {self.members}: bad peer {r}")
        return self.members[r]

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        self.base.send(self._peer(dst), tag, data)

    def recv(self, src: int, tag: int) -> bytes:
        return self.base.recv(self._peer(src), tag)

    def flush(self) -> None:
        self.base.flush()


@dataclass
class RankOutcome(Generic[T]):
    value: T | None
    error: BaseException | None


def run_inproc(n: int, fn: Callable[[Transport], T], timeout_s: float = 60.0) -> list[T]:
    """Run fn(transport) for ranks 0..n-1 in n threads over one InProcHub; the per-rank return values in
    rank order. The first failure of any rank is re-raised (the others are told and stop waiting)."""
    hub = InProcHub(n, timeout_s)
    outcomes: list[RankOutcome[T]] = [RankOutcome(None, None) for _ in range(n)]

    def body(r: int) -> None:
        try:
            outcomes[r].value = fn(hub.endpoint(r))
        except BaseException as e:  # re-raised in the caller's thread below
            outcomes[r].error = e
            hub.failed.set()

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = _first_error(outcomes)
    if first is not None:
        raise first
    return [o.value for o in outcomes]  # type: ignore[misc]


def _first_error(outcomes: Sequence[RankOutcome[T]]) -> BaseException | None:
    errs = [o.error for o in outcomes if o.error is not None]
    # a rank that failed on its own beats the ranks that stopped because a peer failed
    for e in errs:
        if not (isinstance(e, TransportError) and "a peer failed" in str(e)):
            return e
    return errs[0] if errs else None
