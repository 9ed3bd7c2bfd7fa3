"""Verbs-like objects of the MRC application API (`mrc.h`): memory regions, completion queues, work
completions and QP attributes. Only RDMA WRITE and WRITE-with-immediate exist; receives are pre-posted
buffers-less slots consumed by immediates (DESIGN.md §4).
"""

from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Any, Final

from mrc.wire.consts import DEFAULT_PAYLOAD, MAX_PAYLOAD

#: MPR (maximum PSN range) is configured in units of 128 PSNs (mrc_qp_attr.mpr).
MPR_UNIT: Final = 128
#: ACK timeout unit: 1.024 us x 2^timeout (mrc_qp_attr.timeout), as in InfiniBand.
ACK_TIMEOUT_UNIT_NS: Final = 1024
#: exp_cnt value meaning "retry forever".
EXP_CNT_INFINITE: Final = 25


class Access(IntFlag):
    LOCAL_WRITE = 0x1
    REMOTE_WRITE = 0x2


class QpState(IntEnum):
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    ERROR = 6


class WcStatus(IntEnum):
    """Completion status (names of ibv_wc_status)."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    WR_FLUSH_ERR = 5


class WcOpcode(IntEnum):
    RDMA_WRITE = 1
    RDMA_WRITE_WITH_IMM = 2  # requester side of a WRITE-with-immediate
    RECV_RDMA_WITH_IMM = 129  # responder side: a posted receive consumed by an immediate


@dataclass(slots=True, frozen=True)
class WorkCompletion:
    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    qp_num: int
    byte_len: int = 0
    imm_data: int | None = None


class CompletionQueue:
    """A completion queue: the engine appends, the application polls (`mrc_poll_cq`)."""

    __slots__ = ("_q", "cqn", "depth")

    def __init__(self, cqn: int, depth: int = 1 << 16) -> None:
        self.cqn = cqn
        self.depth = depth
        self._q: deque[WorkCompletion] = deque()

    def push(self, wc: WorkCompletion) -> None:
        self._q.append(wc)

    def poll(self, max_entries: int = 1 << 30) -> list[WorkCompletion]:
        q = self._q
        n = min(max_entries, len(q))
        return [q.popleft() for _ in range(n)]

    def __len__(self) -> int:
        return len(self._q)


class MemoryRegion:
    """A registered writable buffer (bytearray, mmap, numpy array, any C-contiguous writable buffer).

    `addr` is the buffer's real virtual address (as `ibv_reg_mr` reports), `rkey`/`lkey` its keys.
    Remote writes are placed through `view`, a flat byte memoryview: never outside [addr, addr+length).
    The buffer stays exported (its size cannot change) until `deregister`."""

    __slots__ = ("_cbuf", "access", "addr", "length", "lkey", "obj", "remote_write", "rkey", "view")

    def __init__(self, obj: Any, rkey: int, access: Access) -> None:
        mv = memoryview(obj)
        if mv.readonly:
            raise ValueError("memory region buffer must be writable")
        if not mv.c_contiguous:
            raise ValueError("memory region buffer must be C-contiguous")
        self.view = mv.cast("B") if (mv.ndim != 1 or mv.format != "B") else mv
        self.length = self.view.nbytes
        self.obj = obj
        if self.length:
            self._cbuf: Any = (ctypes.c_char * self.length).from_buffer(self.view)
            self.addr = ctypes.addressof(self._cbuf)
        else:
            self._cbuf = None
            self.addr = 0
        self.rkey = rkey
        self.lkey = rkey
        self.access = access
        self.remote_write = bool(access & Access.REMOTE_WRITE)  # plain bool for the receive path

    def deregister(self) -> None:
        self._cbuf = None
        self.view.release()


@dataclass(slots=True)
class QpAttr:
    """QP attributes (`mrc_qp_attr` / `ibv_qp_attr` subset).

    timeout: ACK timeout exponent, 1.024 us x 2^timeout (0..24; 8 = 262 us as in the MRC example).
    linear_cnt: retries at the fixed timeout (<= 7); exp_cnt: further retries with doubling timeout
    (<= 25; 25 = forever). mpr: PSN window in units of 128 PSNs (requester and responder).
    """

    timeout: int = 8
    linear_cnt: int = 7
    exp_cnt: int = 25
    mpr: int = 8
    mtu: int = DEFAULT_PAYLOAD
    max_wimm: int = 128
    ack_coalesce: int = 16  # responder SACKs at least every this many data packets (64 KiB at 4 KiB)
    ack_delay_ns: int = 4_000  # ... or this long after an unacknowledged arrival
    reorder_ns: int = 2_000  # minimum reordering tolerance before a SACK hole is a loss
    probe_interval_ns: int = 20_000  # first probe of an ASSUMED_BAD EV after this long
    probe_max_interval_ns: int = 2_000_000  # probe backoff cap
    probe_timeout_ns: int = 200_000  # a probe without reply after this long failed
    probe_good: int = 2  # consecutive probe replies that return an EV to GOOD
    initial_psn: int = 0
    trim_nack: bool = True  # responder NACKs trimmed packets (MRC_QP_CAP_TRIM_NACK)

    def check(self) -> None:
        if not 0 <= self.timeout <= 24:
            raise ValueError("timeout must be 0..24")
        if not 0 <= self.linear_cnt <= 7:
            raise ValueError("linear_cnt must be 0..7")
        if not 0 <= self.exp_cnt <= EXP_CNT_INFINITE:
            raise ValueError("exp_cnt must be 0..25")
        if not 1 <= self.mpr <= 8:
            raise ValueError("mpr must be 1..8 (units of 128 PSNs; SACK bitmaps carry up to 1024)")
        if not 64 <= self.mtu <= MAX_PAYLOAD:
            raise ValueError(f"mtu must be 64..{MAX_PAYLOAD}")
        if self.ack_coalesce < 1:
            raise ValueError("ack_coalesce must be >= 1")

    @property
    def ack_timeout_ns(self) -> int:
        return ACK_TIMEOUT_UNIT_NS << self.timeout

    @property
    def window(self) -> int:
        return self.mpr * MPR_UNIT


@dataclass(slots=True)
class SendWr:
    """One posted WRITE / WRITE-with-immediate and its progress (internal)."""

    wr_id: int
    msn: int
    mr: MemoryRegion
    offset: int
    length: int
    remote_addr: int
    rkey: int
    imm: int | None
    sent: int = 0  # bytes handed to packets so far
    first_psn: int = -1  # absolute PSN of the first packet
    last_psn: int = 1 << 62  # absolute PSN of the last packet (known once fully sent)
    signaled: bool = True
