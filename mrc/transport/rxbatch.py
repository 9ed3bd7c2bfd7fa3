"""`Context.receive_batch`: a batch of received datagrams, the common data packet in compiled code.

A driver that receives datagrams in batches (recvmmsg into fixed slots) hands the whole batch over as
arrays: `data` (one slot per row), `lens`, `ecn`, `ports` and the sources. The result is the one that
`Context.receive(bytes(data[j, :lens[j]]), now, ecn[j], ports[j], srcs[j])` for j = 0, 1, ... gives, in
that order: the same placements, state, counters, timers and datagrams to send (tests/unit/
test_rxbatch.py compares them packet by packet). What differs is the cost: the packets that
`fastpath.receive` handles inline (a well-formed WRITE with a good ICRC, in the window, new, inside a
message already under way that it does not complete, for a valid memory region, no immediate) are
parsed, checked and placed by a kernel that takes a run of them for one QP at a time: no Python object
is made for them, not even the datagram's `bytes`. The kernel is `_fastc.rx_run` (C, beside the fast
path's send and receive) where that is built, else `_rxnumba` (numba); both take the same arguments and
state row and give the same results (tests/unit/test_rxbatch.py runs every scenario through each). Why C
first: numba's import and compiler cost a process ~120 MB of memory (an mrcd 49 MB -> 170 MB) and a
fresh checkout ~5 s of compiling before the first batch.

The QP's state crosses into the kernel as plain numbers and a word array (the responder's bitmap, a
Python int, as uint64 words) and back when the kernel stops: after the run, before a packet it may not
take (which then goes to `Context.receive` whole, before any state has changed, as in the fast path),
and after a packet that must be acknowledged at once (the SACK is built by `fastpath.sack` from the
state copied back). So every rare case keeps its one implementation.

The switch: ``MRC_RX_KERNEL`` (read once, at import; `KERNEL`): ``0`` keeps `receive_batch` a loop over
`Context.receive`, ``numba`` takes the numba kernel, anything else (the default) the C one where it is
built. A context on the pure path (``MRC_FASTPATH=0``) takes its datagrams one by one too, and so does
every context where neither kernel can run (`AVAILABLE`: no _fastc build and a python-isal without
`crc32_gzip_refl`).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

import numpy as np
import numpy.typing as npt

from mrc.wire.consts import EV_INDEX_MAX, EV_SPORT_BASE, ICRC_LEN, MAX_PAYLOAD, MXH_VERSION, PSN_MASK, MxhFlag
from mrc.wire.crc import isal_crc32_address
from mrc.wire.icrc import CRC32_RESIDUE
from mrc.wire.packet import WRITE_HDR_LEN

from . import fastpath
from .qpcore import _CE, _HALF, _RETX, NEVER
from .verbs import QpState

if TYPE_CHECKING:
    from .engine import Context
    from .qp import QueuePair

ENV: Final = "MRC_RX_KERNEL"
ENABLED: bool = os.environ.get(ENV, "1").strip() != "0"


_CRC_T: Final = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64)


def _isal_crc() -> Any:
    """ISA-L's `crc32_gzip_refl(init, buf, len)` as a ctypes function taking the buffer's address as an
    integer, or None where python-isal does not export it (`isal_crc32_address`, which checks its values
    against zlib's)."""
    addr = isal_crc32_address()
    return _CRC_T(addr) if addr else None


def _address(f: Any) -> int:
    return int(ctypes.cast(f, ctypes.c_void_p).value or 0)


_CRC: Final = _isal_crc()
try:
    _MEMCPY_ADDR = _address(ctypes.CDLL(None).memcpy)
except (OSError, AttributeError):
    _MEMCPY_ADDR = 0
#: the numba kernel's callees are there (ISA-L's CRC, memcpy)
NUMBA_OK: Final = _CRC is not None and _MEMCPY_ADDR != 0
#: what the kernel calls, by address: a function pointer passed in, not a ctypes global, keeps the
#: kernel cacheable (numba does not cache code that holds a ctypes pointer; compiling costs ~2.5 s)
FNS: Final = np.array([_address(_CRC) if _CRC is not None else 0, _MEMCPY_ADDR], dtype=np.int64)


# what a kernel reports when it stops (the first of `rx_run`'s results)
DONE: Final = 0  # every packet of the range taken
SACK: Final = 1  # the packet before `j` must be acknowledged now (its fields in st[S_PSN:])
PURE: Final = 2  # packet `j` goes to Context.receive whole
CTX: Final = 3  # packet `j` needs context the kernel was not given (memory region, message, ICRC start)
OTHER_QP: Final = 4  # packet `j` is for another QP (or not a WRITE of one)
FULL: Final = 5  # packet `j` lies beyond the bitmap words given: copy the state back and go on

# st: the QP state the kernel reads and writes (int64)
S_CUM, S_OFF, S_WD, S_RXP, S_RXB, S_UNACK, S_COAL = 0, 1, 2, 3, 4, 5, 6
S_QPN, S_RKEY, S_MRADDR, S_MRLEN, S_MSN, S_MDONE, S_MLEN, S_END = 7, 8, 9, 10, 11, 12, 13, 14
S_ECN, S_LAST = 15, 16  # ECN-CE data packets taken; 1 once a packet was taken and left unacknowledged
#: the MXH timestamp is 64 bits; the state row holds it as int64, so one with bit 63 set (the peer's
#: clock is its own) reads back negative: masked to its unsigned value where it leaves the kernel
_U64: Final = (1 << 64) - 1
S_PSN, S_EV, S_TS, S_FLAGS, S_PORT = 17, 18, 19, 20, 21  # the packet to acknowledge now (SACK)
S_NEED_RKEY, S_NEED_MSN, S_NEED_EV = 22, 23, 24  # what CTX asks for
S_LPSN, S_LEV, S_LTS, S_LPORT = 25, 26, 27, 28  # the last packet left unacknowledged (last_rx)
ST_LEN: Final = 29

_OP_WRITE: Final = 0x0A
_TRIMMED: Final = int(MxhFlag.TRIMMED)
_ACK_NOW: Final = int(MxhFlag.ACK_REQ_NOW)
_RTS: Final = QpState.RTS
_RTR: Final = QpState.RTR
_MIN_LEN: Final = WRITE_HDR_LEN + ICRC_LEN
#: bitmap bits given to the kernel beyond the responder's window (a batch advances rcv_cum at most by
#: the packets it holds plus what they complete, which is inside the window)
_SLACK_BITS: Final = 1024

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]


assert _ACK_NOW | _RETX == 0x12 and _TRIMMED == 0x01 and MXH_VERSION == 1 and MAX_PAYLOAD == 8192
assert CRC32_RESIDUE == 0x2144DF1C and PSN_MASK == 0xFFFFFF and _HALF == 0x800000 and _OP_WRITE == 0x0A
assert EV_INDEX_MAX == 0x3FFF


_EMPTY: Final = np.zeros(0, dtype=np.uint8)


def _c_kernel_ok() -> bool:
    """`_fastc.rx_run` is built, of this file's numbering, and the C fast path is on."""
    c = fastpath._compiled() if fastpath.C_ENABLED else None
    return c is not None and hasattr(c, "rx_consts") and c.rx_consts() == {
        "S_CUM": S_CUM, "S_END": S_END, "S_ECN": S_ECN, "S_LAST": S_LAST, "S_PSN": S_PSN, "S_PORT": S_PORT,
        "S_NEED_EV": S_NEED_EV, "S_LPORT": S_LPORT, "ST_LEN": ST_LEN, "DONE": DONE, "SACK": SACK,
        "PURE": PURE, "CTX": CTX, "FULL": FULL}


def choose(setting: str) -> str:
    """The kernel `MRC_RX_KERNEL` asks for: "0" none (""); "numba" the numba kernel; anything else the C
    kernel, where _fastc is built (else the numba one). "" also where neither can run here."""
    v = setting.strip().lower()
    if v == "0":
        return ""
    if v != "numba" and _c_kernel_ok():
        return "c"
    return "numba" if NUMBA_OK else ""


#: a batch of fewer datagrams goes one by one: a kernel call costs ~10 us of Python per batch (the QP's
#: state and bitmap copied in and out), one datagram through the C receive ~3 us, so the kernel pays
#: from about 16 datagrams a batch (bench/rxbatch.py: 5.5-8.8 against 3.9-4.8 us a packet at 4, parity
#: at 16, 2.5-2.7 against 3.0-3.3 at 64). Tests set it to 1 to send every batch through the kernel.
MIN_BATCH: int = 16

#: the kernel in use: "c" (`_fastc.rx_run`), "numba" (`_rxnumba`), or "" (none: one by one)
KERNEL: str = choose(os.environ.get(ENV, "1"))
AVAILABLE: bool = KERNEL != ""


def warm() -> None:
    """Compile (or load from numba's cache) the numba kernel, when it is the one in use, so that the
    first batch does not wait for it. The C kernel needs nothing."""
    if KERNEL == "numba":
        from . import _rxnumba

        _rxnumba.warm()


def kernel(name: str) -> Callable[..., tuple[int, int]]:
    """The kernel `name` ("c" or "numba") as `run(data, lens, ecn, ports, srcs, peer, j, k, st, words, mr,
    starts) -> (why, j)`."""
    if name == "c":
        c = fastpath._compiled()
        assert c is not None
        return cast("Callable[..., tuple[int, int]]", c.rx_run)
    from . import _rxnumba

    return _rxnumba.run


class _QpView:
    """One QP's state as a kernel takes it, kept between batches: the ICRC start table for its full-size
    packet length, the memory region's array, the state vector and the bitmap words."""

    __slots__ = ("end", "ic", "m", "mr_arr", "mr_obj", "peer", "st", "starts", "words")

    def __init__(self) -> None:
        self.ic: Any = None
        self.end = -1
        self.starts = np.full(EV_INDEX_MAX + 1, -1, dtype=np.int64)
        self.mr_obj: Any = None
        self.mr_arr: U8 = _EMPTY
        self.m: list[Any] | None = None  # the message the last run ended in (its MSN and region in st)
        self.st = np.zeros(ST_LEN, dtype=np.int64)
        self.words = np.zeros(0, dtype=np.uint64)
        self.peer = np.zeros(16, dtype=np.uint8)


class BatchReceiver:
    """`Context.receive_batch` for one context (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        #: the kernel (module's KERNEL when this receiver was made), None: one by one
        self.kernel = KERNEL
        self._run = kernel(KERNEL) if KERNEL else None
        self.views: dict[int, _QpView] = {}
        #: packets taken by the kernel, and kernel calls (statistics for benchmarks)
        self.taken = 0
        self.calls = 0

    def receive_batch(self, data: U8, lens: I64, ecn: Any, ports: I64, srcs: U8 | None, now: int) -> None:
        ctx = self.ctx
        k = len(lens)
        if k < MIN_BATCH or not (ENABLED and self._run is not None and ctx.fastpath):
            self._one_by_one(data, lens, ecn, ports, srcs, now, 0, k)
            return
        no_src = np.zeros((0, 16), dtype=np.uint8)
        s = no_src if srcs is None else srcs
        qps = ctx.qps
        j = 0
        while j < k:
            n = int(lens[j])
            row = data[j]
            qp = qps.get((int(row[5]) << 16) | (int(row[6]) << 8) | int(row[7])) if n >= _MIN_LEN else None
            state = qp.state if qp is not None else None
            if qp is None or (state is not _RTS and state is not _RTR) or row[0] != _OP_WRITE:
                self._one_by_one(data, lens, ecn, ports, srcs, now, j, j + 1)
                j += 1
                continue
            j = self._qp_run(qp, data, lens, ecn, ports, s, now, j, k)

    def _one_by_one(self, data: U8, lens: I64, ecn: Any, ports: I64, srcs: U8 | None, now: int,
                    j0: int, j1: int) -> None:
        receive = self.ctx.receive
        for j in range(j0, j1):
            receive(data[j, : int(lens[j])].tobytes(), now, bool(ecn[j]), int(ports[j]),
                    None if srcs is None else srcs[j].tobytes())

    def _view(self, qp: QueuePair) -> _QpView:
        v = self.views.get(qp.qpn)
        if v is None:
            if len(self.views) > 4 * len(self.ctx.qps) + 64:  # destroyed QPs: forget their views
                live = self.ctx.qps
                for q in [q for q in self.views if q not in live]:
                    del self.views[q]
            v = self.views[qp.qpn] = _QpView()
        if v.ic is not qp.rx_icrc or v.peer.tobytes() != qp.peer_gid:
            v.ic = qp.rx_icrc
            v.end = -1
            v.starts.fill(-1)
            v.peer = np.frombuffer(qp.peer_gid.ljust(16, b"\0")[:16], dtype=np.uint8).copy()
        return v

    def _load(self, qp: QueuePair, v: _QpView) -> None:
        """The QP's receive state into `v.st` / `v.words` (the bitmap relative to rcv_cum)."""
        st = v.st
        st[S_CUM] = qp.rcv_cum
        st[S_OFF] = 0
        st[S_WD] = qp.Wd
        st[S_RXP] = qp.rx_packets
        st[S_RXB] = qp.rx_bytes
        st[S_UNACK] = qp.unacked
        st[S_COAL] = qp.ack_coalesce
        st[S_QPN] = qp.qpn
        st[S_ECN] = 0
        st[S_LAST] = 0
        nwords = (min(qp.Wd, _HALF) + _SLACK_BITS + 63) >> 6
        rbits = qp.rbits
        if rbits.bit_length() > 64 * nwords:  # never inside the window; keep the pure path's view
            nwords = (rbits.bit_length() + 63) >> 6
        if v.words.shape[0] != nwords:
            v.words = np.zeros(nwords, dtype=np.uint64)
        v.words[:] = np.frombuffer(rbits.to_bytes(8 * nwords, "little"), dtype=np.uint64)

    def _store(self, qp: QueuePair, v: _QpView, m: list[Any] | None, now: int) -> None:
        """`v.st` / `v.words` back into the QP, with fastpath.receive's side effects of the packets taken
        (their ECN count, the delayed-ACK timer of the last one when it was left unacknowledged)."""
        st = v.st
        qp.rbits = int.from_bytes(v.words.tobytes(), "little") >> int(st[S_OFF])
        qp.rcv_cum = int(st[S_CUM])
        qp.rx_packets = int(st[S_RXP])
        qp.rx_bytes = int(st[S_RXB])
        qp.unacked = int(st[S_UNACK])
        if m is not None:
            m[0] = int(st[S_MDONE])
        if st[S_ECN]:
            qp.c["ecn_rx"] += int(st[S_ECN])
            st[S_ECN] = 0
        if st[S_LAST]:
            qp.last_rx = (int(st[S_LPSN]), int(st[S_LEV]), int(st[S_LTS]) & _U64, 0, now, int(st[S_LPORT]))
            if qp.ack_deadline == NEVER:
                qp.ack_deadline = now + qp.attr.ack_delay_ns
            st[S_LAST] = 0

    def _context(self, qp: QueuePair, v: _QpView) -> list[Any] | None:
        """Resolve what CTX asked for; None when the packet must go to the pure path (no such memory
        region or message, or a region the peer may not write)."""
        st = v.st
        end = int(st[S_END])
        if end != v.end:
            v.end = end
            v.starts.fill(-1)
        ev = int(st[S_NEED_EV]) & EV_INDEX_MAX
        if v.starts[ev] < 0:
            ic = qp.rx_icrc
            sport = EV_SPORT_BASE | ev
            sv = ic._start.get((sport << 32) | end)
            v.starts[ev] = ic.start(end, sport) if sv is None else sv
        rkey = int(st[S_NEED_RKEY])
        mr = qp.mrs.get(rkey)
        if mr is None or not mr.remote_write:
            return None
        if mr is not v.mr_obj:
            v.mr_obj = mr
            v.mr_arr = np.frombuffer(mr.view, dtype=np.uint8)
        m = qp.msgs.get(int(st[S_NEED_MSN]))
        if m is None:
            return None
        st[S_RKEY] = rkey
        st[S_MRADDR] = mr.addr
        st[S_MRLEN] = mr.length
        st[S_MSN] = st[S_NEED_MSN]
        st[S_MDONE] = m[0]
        st[S_MLEN] = m[2]
        return m

    def _qp_run(self, qp: QueuePair, data: U8, lens: I64, ecn: Any, ports: I64, srcs: U8, now: int,
                j: int, k: int) -> int:
        """Packets from j on for `qp` through the kernel; returns where the next QP's (or the pure
        path's) packet begins."""
        v = self._view(qp)
        st = v.st
        self._load(qp, v)
        # the previous batch's message and region, when they are still the QP's (else the first packet
        # asks for its context)
        m: list[Any] | None = v.m
        mr = qp.mrs.get(int(st[S_RKEY])) if m is not None else None
        if (
            m is not None and mr is not None and qp.msgs.get(int(st[S_MSN])) is m and mr.remote_write
            and mr.addr == st[S_MRADDR] and mr.length == st[S_MRLEN]
        ):
            v.mr_obj = mr
            v.mr_arr = np.frombuffer(mr.view, dtype=np.uint8)
            st[S_MDONE] = m[0]
            st[S_MLEN] = m[2]
        else:
            m = None
            st[S_RKEY] = -1
            st[S_MSN] = -1
        try:
            return self._loop(qp, v, m, data, lens, ecn, ports, srcs, now, j, k)
        finally:  # no reference to the region's memory outlives the batch (dereg may close its mapping)
            v.mr_obj = None
            v.mr_arr = _EMPTY

    def _loop(self, qp: QueuePair, v: _QpView, m: list[Any] | None, data: U8, lens: I64, ecn: Any,
              ports: I64, srcs: U8, now: int, j: int, k: int) -> int:
        st = v.st
        run = self._run
        assert run is not None
        full_at = -1
        while True:
            self.calls += 1
            j0 = j
            why, j = run(data, lens, ecn, ports, srcs, v.peer, j, k, st, v.words, v.mr_arr, v.starts)
            self.taken += j - j0
            if why == CTX:
                if m is not None:  # the message so far, before the kernel is given another one
                    m[0] = int(st[S_MDONE])
                    m = None
                    st[S_MSN] = -1
                m2 = self._context(qp, v)
                if m2 is not None:
                    m = m2
                    continue
                why = PURE
            if why == SACK:
                self._store(qp, v, m, now)
                ef = (_CE if ecn[j - 1] else 0) | (fastpath._S_RETX if int(st[S_FLAGS]) & _RETX else 0)
                ts = int(st[S_TS]) & _U64
                fastpath.sack(qp, now, self.ctx._out, int(st[S_PSN]), int(st[S_EV]), ts, ef, 0,
                              int(st[S_PORT]))
                st[S_UNACK] = qp.unacked
                st[S_COAL] = qp.ack_coalesce
                continue
            if why == FULL:
                self._store(qp, v, m, now)
                if full_at == j:  # fresh words did not hold it either (cannot happen inside the window)
                    self._one_by_one(data, lens, ecn, ports, srcs if srcs.shape[0] else None, now, j, j + 1)
                    v.m = m
                    return j + 1
                full_at = j
                self._load(qp, v)
                continue
            self._store(qp, v, m, now)
            v.m = m
            if why == PURE:
                self._one_by_one(data, lens, ecn, ports, srcs if srcs.shape[0] else None, now, j, j + 1)
                return j + 1
            return j  # DONE, or OTHER_QP: the caller dispatches packet j
