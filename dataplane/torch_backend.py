"""The `mrc` backend of torch.distributed: CPU collectives between ranks through their host's mrcd
(docs/collective.md, "torch.distributed backend").

    import torch.distributed as dist
    dist.init_process_group("mrc")              # under torchrun: rank, world size and store from the env

The backend registers itself when this module is imported (`register`), and at `import torch` through
the installed package's entry point (group `torch.backends`: mrc.dataplane.torch_plugin), so an
unmodified training script launched by torchrun can say `init_process_group("mrc")`.

A rank finds its host's mrcd by its control socket (`control_socket`): `MRC_SOCKET` (a path), else
`MRC_HOST` (`$MRC_RUN_DIR/<MRC_HOST>.sock`, on a testbed the host's namespace name), else the one socket in
`$MRC_RUN_DIR` (default /run/mrc). mrcd's greeting names the host; the ranks publish their hosts in the
process group's store (torch's TCPStore, from torchrun's rendezvous), and each opens a
`mrc.dataplane.collective.RankTransport` over the same store: WRITE-with-immediate through mrcd toward
ranks on other hosts, shared memory toward co-located ranks (several ranks per host share its mrcd).

Collectives (synchronous: the returned Work is complete; `async_op=True` works, without overlap):
  all_reduce     float32 SUM / AVG: mrc's ring (mrc.collective.ring, uncompressed), the buffer cut into
                 pieces whose ring messages fit one slot; every rank gets the same bits. Any other dtype,
                 or MIN / MAX / PRODUCT / BAND / BOR / BXOR: all-gather, then each rank reduces the n
                 contributions in rank order (exact and identical everywhere; (n - 1) x the tensor on
                 the wire per rank: meant for small tensors). PREMUL_SUM: an error.
  broadcast      a chain from the root around the ring, pipelined by slot.
  all_gather, all_gather_into_tensor   ring all-gather, pipelined by slot.
  barrier        a one-byte all-gather.
  reduce, reduce_scatter, reduce_scatter_tensor   through all_reduce (every rank computes the whole sum).
Not here: send/recv, scatter/gather, all_to_all, monitored_barrier, GPU tensors.

Tunables (environment): `MRC_PG_SLOT_BYTES` (largest message, default 256 KiB), `MRC_PG_SLOTS` (slots per
peer: credits and the pipelining window, default 4), `MRC_PG_TIMEOUT` (seconds one wait may take; default
the process group's timeout).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

from mrc.errors import MrcError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .collective import RankTransport

BACKEND: Final = "mrc"
ENV_SOCKET: Final = "MRC_SOCKET"
ENV_HOST: Final = "MRC_HOST"
ENV_SLOT_BYTES: Final = "MRC_PG_SLOT_BYTES"
ENV_SLOTS: Final = "MRC_PG_SLOTS"
ENV_TIMEOUT: Final = "MRC_PG_TIMEOUT"
DEFAULT_SLOT_BYTES: Final = 256 << 10
DEFAULT_SLOTS: Final = 4
PREFIX: Final = "mrc"
#: how long the greeting of the rank's mrcd may take
HELLO_TIMEOUT_S: Final = 30.0
#: how long shutdown waits for the ranks on other hosts to shut down too (MrcProcessGroup.shutdown)
FAREWELL_S: Final = 60.0
#: a rank waiting on the store polls it at most this far apart (and checks whether a peer failed)
POLL_S: Final = 0.2

# tags of this module's messages (the ring's are 1 << 20 .. 3 << 20, mrc.collective.ring)
_TAG_GATHER: Final = 4 << 20
_TAG_BCAST: Final = 5 << 20

_START_HINT: Final = ("start mrcd on this host (`mrcd --config FILE`, `systemctl start mrcd`; on a testbed "
                      "`mrcctl testbed up --with-daemons`) or point MRC_SOCKET at its control socket")


class MrcBackendError(MrcError, RuntimeError):
    """The mrc process group could not start or a collective failed (a RuntimeError, as torch's own)."""


class MrcBackendRefused(MrcBackendError):
    """A collective refused before any message (an op, dtype or device this backend does not do, sizes
    that do not add up), so the group stays usable when every rank made the same call. A rank that alone
    passes, say, an output of the wrong size is refused alone: the others go on into the collective and
    fail at their next exchange with it (a broken group), as with NCCL and Gloo, which check no more."""


def _env_int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw, 0)
    except ValueError:
        raise MrcBackendError(f"{name}={raw!r}: not an integer") from None
    if not low <= v <= high:
        raise MrcBackendError(f"{name}={v}: outside {low}..{high}")
    return v


def control_socket(env: Mapping[str, str] | None = None) -> Path:
    """The control socket of this rank's mrcd: `MRC_SOCKET`, else `$MRC_RUN_DIR/$MRC_HOST.sock`, else the
    only `*.sock` in `$MRC_RUN_DIR` (/run/mrc). An error says which variable to set."""
    e = os.environ if env is None else env
    if e.get(ENV_SOCKET):
        return Path(e[ENV_SOCKET])
    run_dir = Path(e.get("MRC_RUN_DIR") or "/run/mrc")
    if e.get(ENV_HOST):
        return run_dir / f"{e[ENV_HOST]}.sock"
    found = sorted(run_dir.glob("*.sock")) if run_dir.is_dir() else []
    if len(found) == 1:
        return found[0]
    if not found:
        raise MrcBackendError(f"mrc backend: no mrcd control socket in {run_dir} (MRC_SOCKET and MRC_HOST "
                              f"unset): {_START_HINT}")
    names = ", ".join(p.name for p in found[:8]) + (", ..." if len(found) > 8 else "")
    raise MrcBackendError(f"mrc backend: {len(found)} mrcd control sockets in {run_dir} ({names}): set "
                          f"MRC_SOCKET to this rank's host's socket, or MRC_HOST to its name")


class _GroupStore:
    """The process group's c10d store behind `mrc.dataplane.rendezvous.Store`. A blocking `get` (and
    `check`) also watches `<prefix>/failed`, which a rank sets when it cannot start: the others fail with
    its reason at once instead of waiting out the timeout.

    Every key of one incarnation of the group lies under `prefix` = mrc/<N>, N counting this rank's
    creations of a group on this store: torch gives a group made again after `destroy_process_group`
    the same name and so the same store prefix, and torchrun's store outlives the group, so the keys of
    the first incarnation (hosts, a closed co-located socket's name, `failed`) would answer the second."""

    def __init__(self, store: Any, rank: int, timeout_s: float) -> None:
        self.store = store
        self.rank = rank
        self.timeout_s = timeout_s
        try:
            n = int(store.add(f"{PREFIX}/incarnation{rank}", 1))
        except RuntimeError as e:  # the store went away (the launcher ended)
            raise MrcBackendError(f"mrc backend, rank {rank}: rendezvous store: {str(e).splitlines()[0]}") \
                from None
        self.prefix = f"{PREFIX}/{n}"
        self.failed_key = f"{self.prefix}/failed"

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def fail(self, why: str) -> None:
        """Tell the peers (the first reason stays: a rank failing because a peer did says nothing new)."""
        with contextlib.suppress(Exception):
            if not self.store.check([self.failed_key]):
                self.store.set(self.failed_key, why)

    def check(self) -> None:
        """MrcBackendError when a peer could not start."""
        try:
            failed = self.store.check([self.failed_key])
            why = bytes(self.store.get(self.failed_key)).decode(errors="replace") if failed else ""
        except RuntimeError as e:  # the store went away (the launcher ended)
            raise MrcBackendError(f"mrc backend, rank {self.rank}: rendezvous store: "
                                  f"{str(e).splitlines()[0]}") from None
        if failed:
            raise MrcBackendError(f"mrc backend, rank {self.rank}: a peer could not start ({why})")

    def get(self, key: str) -> str:
        # polled with `check` (a blocking `wait` with a short timeout makes TCPStore log each expiry)
        deadline = time.monotonic() + self.timeout_s
        pause = 0.01
        while True:
            try:
                if self.store.check([key]):
                    return bytes(self.store.get(key)).decode()
            except RuntimeError as e:  # the store went away (the launcher ended)
                raise MrcBackendError(f"mrc backend, rank {self.rank}: rendezvous store: "
                                      f"{str(e).splitlines()[0]}") from None
            self.check()
            if time.monotonic() > deadline:
                raise MrcBackendError(f"mrc backend, rank {self.rank}: rendezvous: {key!r} not published "
                                      f"within {self.timeout_s:.0f} s")
            time.sleep(pause)
            pause = min(POLL_S, pause * 2)


def _hello(path: Path, rank: int) -> str:
    """This rank's host, as its mrcd names itself."""
    from .client import MrcClient

    try:
        with MrcClient(path, timeout=HELLO_TIMEOUT_S) as c:
            return str(c.host)
    except MrcError as e:
        detail = str(e).removeprefix(f"{path}: ")
        raise MrcBackendError(f"mrc backend, rank {rank}: cannot reach mrcd at {path}: {detail}. "
                              f"{_START_HINT[0].upper()}{_START_HINT[1:]}") from None


def _contig(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The tensor's data as a contiguous tensor (detached), and whether that is a copy to write back."""
    d = t.detach()
    return (d, False) if d.is_contiguous() else (d.contiguous(), True)


def _np(t: torch.Tensor) -> npt.NDArray[Any]:
    """A numpy view of a contiguous CPU tensor, flat (writing it writes the tensor). Through DLPack, not
    `Tensor.numpy()`: that marks the tensor's storage non-resizable for good, and FSDP frees each
    unsharded parameter after its collectives by resizing the storage to 0 ("Trying to resize storage
    that is not resizable" in its first backward)."""
    import numpy as np

    return np.from_dlpack(t.detach().reshape(-1))


def _u8(t: torch.Tensor) -> npt.NDArray[np.uint8]:
    """The bytes of a contiguous CPU tensor (a view: writing it writes the tensor)."""
    flat = t.detach().reshape(-1)
    return _np(flat if flat.dtype == torch.uint8 else flat.view(torch.uint8))


def _pieces(length: int, size: int) -> list[tuple[int, int]]:
    return [(o, min(o + size, length)) for o in range(0, length, size)]


def _op_name(op: Any) -> str:
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if op == getattr(dist.ReduceOp, name):
            return name
    return str(op)


_COMBINE: Final[dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
    "SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum,
    "BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor,
}


def _done(result: Any) -> dist.Work:
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(result)
    work: dist.Work = _create_work_from_future(fut)
    return work


class MrcProcessGroup(dist.ProcessGroup):
    """One rank's `mrc` process group (see the module doc). Built by torch through `register`'s creator
    with the group's store, rank, size and timeout; `env` replaces os.environ (tests)."""

    def __init__(self, store: Any, rank: int, world_size: int, timeout: timedelta, *,
                 env: Mapping[str, str] | None = None) -> None:
        super().__init__(rank, world_size)  # type: ignore[call-arg]  # (rank, size): the Python-group form
        e = os.environ if env is None else env
        self._rank, self._n = rank, world_size
        self._lock = threading.RLock()
        self._broken: str | None = None
        self.transport: RankTransport | None = None
        self.host = ""
        self.hosts: list[str] = []
        t_s = timeout.total_seconds() if timeout is not None else 1800.0
        self.timeout_s = float(_env_int(e, ENV_TIMEOUT, max(1, round(t_s)), 1, 10**7))
        self.slot_bytes = _env_int(e, ENV_SLOT_BYTES, DEFAULT_SLOT_BYTES, 4096, 1 << 30)
        self.slot_bytes -= self.slot_bytes % 8
        self.slots = _env_int(e, ENV_SLOTS, DEFAULT_SLOTS, 1, 255)
        self.store = _GroupStore(store, rank, self.timeout_s)
        try:
            try:
                self.socket = control_socket(e)
                self.host = _hello(self.socket, rank)
                self._rendezvous()
            except MrcBackendError:
                raise
            except MrcError as exc:  # the transport's set-up (QPs, regions, co-located ranks)
                raise MrcBackendError(f"mrc backend, rank {rank} ({self.host}): {exc}") from None
        except BaseException as exc:
            self.store.fail(str(exc) if isinstance(exc, MrcBackendError) else f"rank {rank}: {exc!r}")
            self.shutdown()
            raise

    def _rendezvous(self) -> None:
        from .collective import RankTransport

        st = self.store
        st.set(f"{st.prefix}/host{self._rank}", json.dumps({"host": self.host, "pid": os.getpid()}))
        self.hosts = [str(json.loads(st.get(f"{st.prefix}/host{r}"))["host"]) for r in range(self._n)]
        if self._n > 1:
            # ns is unused: the control socket is named
            self.transport = RankTransport(st, self._rank, self.hosts, "", self.slot_bytes, slots=self.slots,
                                           timeout_s=self.timeout_s, prefix=st.prefix, socket=self.socket)

    # -- identity
    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"MrcProcessGroup(rank {self._rank} of {self._n}, host {self.host or '?'})"

    # torch names every group after creating it (`_set_group_name`, `_set_group_desc`) and the C++
    # ProcessGroup keeps the name on its backends, which a group written in Python has none of: reading
    # `group_name` then raised "ProcessGroup name not set", and with it everything keyed by the name
    # (destroy_process_group of a subgroup, functional collectives, DeviceMesh). Kept here instead.
    _group_name: Any = None
    _group_desc = ""

    def _set_group_name(self, name: Any) -> None:
        self._group_name = name

    @property
    def group_name(self) -> Any:
        if self._group_name is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def stats(self) -> dict[str, int]:
        """Message bytes this rank posted through MRC and to co-located ranks."""
        t = self.transport
        return {"mrc_bytes": t.mrc_bytes if t is not None else 0,
                "local_bytes": t.local_bytes if t is not None else 0}

    def shutdown(self) -> None:
        """Close the transport (destroy_process_group). A healthy group first waits, up to
        `FAREWELL_S`, until the ranks on other hosts got here too: a rank that closed its QPs while a peer
        still waited for the acknowledgement of the credit it returned for our last message would fail
        that peer's last collective (RETRY_EXC_ERR)."""
        with self._lock:
            t, self.transport = self.transport, None
            if t is not None:
                if self._broken is None:
                    self._farewell()
                with contextlib.suppress(Exception):
                    t.close()
            if self._broken is None:
                self._broken = "the process group was shut down"

    def _farewell(self) -> None:
        remote = [r for r in range(self._n) if self.hosts[r] != self.host]
        if not remote:
            return
        st, prefix = self.store.store, self.store.prefix
        deadline = time.monotonic() + min(self.timeout_s, FAREWELL_S)
        with contextlib.suppress(Exception):  # the store gone (the launcher ended): nobody to wait for
            st.set(f"{prefix}/bye{self._rank}", "1")
            while not st.check([f"{prefix}/bye{r}" for r in remote]) and time.monotonic() < deadline:
                time.sleep(0.02)

    def abort(self) -> None:
        """Close at once (no waiting for the peers)."""
        with self._lock:
            self._broken = self._broken or "the process group was aborted"
        self.shutdown()

    # -- plumbing
    def _run(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run a collective under the lock; a failure breaks the group (the ranks' message streams no
        longer line up), and every later collective says why."""
        with self._lock:
            if self._broken is not None:
                raise MrcBackendError(f"mrc backend, rank {self._rank}: {what}: {self._broken}")
            try:
                return fn()
            except MrcBackendRefused:
                raise
            except MrcBackendError as e:
                self._broken = f"an earlier collective failed ({e})"
                raise
            except MrcError as e:
                self._broken = f"an earlier collective failed ({e})"
                raise MrcBackendError(f"mrc backend, rank {self._rank}: {what}: {e}") from None

    def _t(self) -> RankTransport:
        assert self.transport is not None
        return self.transport

    @staticmethod
    def _check(tensors: Sequence[torch.Tensor], what: str) -> None:
        for t in tensors:
            if t.device.type != "cpu":
                raise MrcBackendRefused(f"mrc backend: {what}: CPU tensors only, got one on {t.device}")
            if t.is_sparse:
                raise MrcBackendRefused(f"mrc backend: {what}: sparse tensors are not supported")

    def _tag(self, base: int, step: int, i: int) -> int:
        return base + ((step & 0xFF) << 12) + (i & 0xFFF)

    # -- the carriers' patterns
    def _ring_gather(self, blocks: list[npt.NDArray[np.uint8]]) -> None:
        """Ring all-gather: `blocks[j]` (rank j's bytes) filled on every rank from its own block. Step s
        forwards block (r - s) to the right and takes block (r - s - 1) from the left, slot by slot, up
        to `slots` messages ahead (the transport's credits: never a deadlock)."""
        t, n, r, m = self._t(), self._n, self._rank, self.slot_bytes
        right, left = (r + 1) % n, (r - 1) % n
        window = max(1, int(getattr(t, "send_window", 1)))
        for s in range(n - 1):
            out_b, in_b = blocks[(r - s) % n], blocks[(r - s - 1) % n]
            outs, ins = _pieces(out_b.size, m), _pieces(in_b.size, m)

            def send(i: int, out_b: npt.NDArray[np.uint8] = out_b, outs: list[tuple[int, int]] = outs,
                     s: int = s) -> None:
                a, b = outs[i]
                t.send(right, self._tag(_TAG_GATHER, s, i), out_b[a:b].tobytes())

            lead = min(len(outs), window)
            for i in range(lead):
                send(i)
            for i, (a, b) in enumerate(ins):
                data = t.recv(left, self._tag(_TAG_GATHER, s, i))
                if len(data) != b - a:
                    raise MrcBackendError(f"mrc backend, rank {r}: all-gather: {len(data)} B from rank "
                                          f"{left} where {b - a} were expected (tensor sizes differ between "
                                          "ranks?)")
                in_b[a:b] = memoryview(data)
                if i + lead < len(outs):
                    send(i + lead)
            for i in range(len(ins) + lead, len(outs)):
                send(i)
        t.flush()

    def _chain_broadcast(self, buf: npt.NDArray[np.uint8], root: int) -> None:
        t, n, r = self._t(), self._n, self._rank
        pos = (r - root) % n
        right, left = (r + 1) % n, (r - 1) % n
        for i, (a, b) in enumerate(_pieces(buf.size, self.slot_bytes)):
            tag = self._tag(_TAG_BCAST, 0, i)
            if pos == 0:
                t.send(right, tag, buf[a:b].tobytes())
                continue
            data = t.recv(left, tag)
            if len(data) != b - a:
                raise MrcBackendError(f"mrc backend, rank {r}: broadcast: {len(data)} B from rank {left} "
                                      f"where {b - a} were expected (tensor sizes differ between ranks?)")
            buf[a:b] = memoryview(data)
            if pos < n - 1:
                t.send(right, tag, data)
        t.flush()

    def _gather_flat(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's copy of the (same-shaped) tensor `t`, in rank order."""
        src = t.detach().contiguous().reshape(-1)
        parts = [src if j == self._rank else torch.empty_like(src) for j in range(self._n)]
        self._ring_gather([_u8(p) for p in parts])
        return parts

    def _reduce_one(self, t: torch.Tensor, op: str) -> None:
        import numpy as np

        from mrc.collective.ring import Config, allreduce

        if self._n == 1 or t.numel() == 0:
            if op == "AVG" and not (t.is_floating_point() or t.is_complex()):
                raise MrcBackendRefused(f"mrc backend: all_reduce AVG of {t.dtype}: floating point only")
            return
        if op not in _COMBINE:
            raise MrcBackendRefused(f"mrc backend: all_reduce with ReduceOp.{op} is not supported (SUM, "
                                    "AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR are)")
        if op == "AVG" and not (t.is_floating_point() or t.is_complex()):
            raise MrcBackendRefused(f"mrc backend: all_reduce AVG of {t.dtype}: floating point only")
        if op.startswith("B") and (t.is_floating_point() or t.is_complex()):
            raise MrcBackendRefused(f"mrc backend: all_reduce {op} of {t.dtype}: integer or bool tensors "
                                    "only")
        if op in ("MIN", "MAX") and t.is_complex():  # before any message: torch has no order on complex
            raise MrcBackendRefused(f"mrc backend: all_reduce {op} of {t.dtype}: complex numbers have no "
                                    "order")
        work, copied = _contig(t)
        if t.dtype == torch.float32 and op in ("SUM", "AVG"):
            a = _np(work)
            cfg = Config("none", average=False)
            # every ring message (a chunk segment, 4 B per element) within one slot
            piece = self._n * (self.slot_bytes // 4)
            for lo, hi in _pieces(a.size, piece):
                a[lo:hi] = allreduce(self._t(), a[lo:hi], cfg).out
            if op == "AVG":
                a /= np.float32(self._n)
        else:
            parts = self._gather_flat(work)
            acc = parts[0].clone()
            for p in parts[1:]:
                acc = _COMBINE[op](acc, p)
            if op == "AVG":
                acc = acc / self._n
            work.reshape(-1).copy_(acc)
        if copied:
            t.detach().copy_(work)

    # -- collectives (c10d's Python ProcessGroup interface)
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        self._check(tensors, "all_reduce")

        def go() -> list[torch.Tensor]:
            for t in tensors:
                self._reduce_one(t, op)
            return tensors

        return _done(self._run(f"all_reduce {op}", go))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        self._check(tensors, "reduce")

        def go() -> list[torch.Tensor]:
            for t in tensors:
                self._reduce_one(t, op)
            return tensors

        return _done(self._run(f"reduce {op}", go))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]
        root = int(opts.rootRank) if opts is not None else 0
        self._check(tensors, "broadcast")
        if not 0 <= root < self._n:
            raise MrcBackendRefused(f"mrc backend: broadcast from rank {root}: outside 0..{self._n - 1}")

        def go() -> list[torch.Tensor]:
            if self._n == 1:
                return tensors
            for t in tensors:
                work, copied = _contig(t)
                self._chain_broadcast(_u8(work), root)
                if copied:
                    t.detach().copy_(work)
            return tensors

        return _done(self._run("broadcast", go))

    def allgather(self, output_tensors: list[list[torch.Tensor]],  # type: ignore[override]
                  input_tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        self._check(input_tensors, "all_gather")
        for outs in output_tensors:
            self._check(outs, "all_gather")
            if len(outs) != self._n:
                raise MrcBackendRefused(f"mrc backend: all_gather: {len(outs)} output tensors for "
                                        f"{self._n} ranks")

        def go() -> list[list[torch.Tensor]]:
            for outs, inp in zip(output_tensors, input_tensors, strict=True):
                if outs[self._rank].numel() != inp.numel():
                    raise MrcBackendRefused(f"mrc backend: all_gather: output {self._rank} has "
                                            f"{outs[self._rank].numel()} elements, the input {inp.numel()}")
                outs[self._rank].detach().copy_(inp.detach().reshape(outs[self._rank].shape))
                if self._n == 1:
                    continue
                work = [_contig(o) for o in outs]
                self._ring_gather([_u8(w) for w, _ in work])
                for o, (w, copied) in zip(outs, work, strict=True):
                    if copied:
                        o.detach().copy_(w)
            return output_tensors

        return _done(self._run("all_gather", go))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        if output.numel() != self._n * input.numel():
            raise MrcBackendRefused(f"mrc backend: all_gather_into_tensor: output of {output.numel()} "
                                    f"elements for {self._n} x {input.numel()}")
        self._check([output, input], "all_gather_into_tensor")

        def go() -> torch.Tensor:
            work, copied = _contig(output)
            parts = list(work.reshape(-1).chunk(self._n))
            parts[self._rank].copy_(input.detach().reshape(-1))
            if self._n > 1:
                self._ring_gather([_u8(p) for p in parts])
            if copied:
                output.detach().copy_(work)
            return output

        return _done(self._run("all_gather_into_tensor", go))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self.all_gather_single(output, input, opts)

    def reduce_scatter(self, output_tensors: list[torch.Tensor],  # type: ignore[override]
                       input_tensors: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        self._check(output_tensors, "reduce_scatter")

        def go() -> list[torch.Tensor]:
            for out, ins in zip(output_tensors, input_tensors, strict=True):
                if len(ins) != self._n:
                    raise MrcBackendRefused(f"mrc backend: reduce_scatter: {len(ins)} inputs for "
                                            f"{self._n} ranks")
                if ins[self._rank].numel() != out.numel():  # before any message (was after the ring)
                    raise MrcBackendRefused(f"mrc backend: reduce_scatter: output of {out.numel()} "
                                            f"elements for input {self._rank} of {ins[self._rank].numel()}")
                sizes = [x.numel() for x in ins]
                flat = torch.cat([x.detach().reshape(-1) for x in ins])
                self._reduce_one(flat, op)
                lo = sum(sizes[: self._rank])
                out.detach().copy_(flat[lo : lo + sizes[self._rank]].reshape(out.shape))
            return output_tensors

        return _done(self._run(f"reduce_scatter {op}", go))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        op = _op_name(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        self._check([output, input], "reduce_scatter_tensor")
        if input.numel() != self._n * output.numel():
            raise MrcBackendRefused(f"mrc backend: reduce_scatter_tensor: input of {input.numel()} "
                                    f"elements for {self._n} x {output.numel()}")

        def go() -> torch.Tensor:
            flat = input.detach().reshape(-1).clone()
            self._reduce_one(flat, op)
            k = output.numel()
            output.detach().copy_(flat[self._rank * k : (self._rank + 1) * k].reshape(output.shape))
            return output

        return _done(self._run(f"reduce_scatter_tensor {op}", go))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self.reduce_scatter_single(output, input, opts)

    # -- what this backend does not do: refused on every rank alike, before any message (the group stays
    # usable), naming the op; without these torch's base class answered "No backend type associated with
    # device type cpu", which names neither mrc nor the op
    def _refuse(self, what: str) -> dist.Work:
        raise MrcBackendRefused(f"mrc backend: {what} is not supported (all_reduce, broadcast, all_gather, "
                                "reduce, reduce_scatter and barrier are; docs/collective.md)")

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> dist.Work:
        return self._refuse("send")

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> dist.Work:
        return self._refuse("recv")

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        return self._refuse("recv from any source")

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:  # type: ignore[override]
        return self._refuse("scatter")

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:  # type: ignore[override]
        return self._refuse("gather")

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> dist.Work:
        return self._refuse("all_to_all")

    def alltoall_base(self, output: Any, input: Any, output_split_sizes: Any,
                      input_split_sizes: Any, opts: Any = None) -> dist.Work:
        return self._refuse("all_to_all_single")

    def barrier(self, opts: Any = None) -> dist.Work:
        def go() -> None:
            if self._n > 1:
                blocks = [torch.zeros(1, dtype=torch.uint8).numpy() for _ in range(self._n)]
                self._ring_gather(blocks)

        self._run("barrier", go)
        return _done(None)


def _create(store: Any, rank: int, world_size: int, timeout: timedelta) -> MrcProcessGroup:
    return MrcProcessGroup(store, rank, world_size, timeout)


def register() -> None:
    """Make "mrc" a torch.distributed backend (CPU). Idempotent."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


register()

__all__ = ["BACKEND", "MrcBackendError", "MrcBackendRefused", "MrcProcessGroup", "control_socket", "register"]
