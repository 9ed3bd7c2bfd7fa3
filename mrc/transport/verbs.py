"""Verbs-like objects of the MRC application API (`mrc.h`): memory regions, completion queues, work
completions and QP attributes. Only RDMA WRITE and WRITE-with-immediate exist; receives are pre-posted
buffers-less slots consumed by immediates (docs/design.md §4).
"""

from __future__ import annotations

import ctypes
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, IntFlag, StrEnum
from typing import Any, Final

from mrc.wire.consts import DEFAULT_PAYLOAD, MAX_PAYLOAD

#: MPR (maximum PSN range) is configured in units of 128 PSNs (mrc_qp_attr.mpr).
MPR_UNIT: Final = 128
#: ACK timeout unit: 1.024 us x 2^timeout (mrc_qp_attr.timeout), as in InfiniBand.
ACK_TIMEOUT_UNIT_NS: Final = 1024
#: exp_cnt value meaning "retry forever".
EXP_CNT_INFINITE: Final = 25
#: The RNR wait doubles per retry of the same packet up to this many times its first value.
RNR_BACKOFF_MAX: Final = 32
#: The largest max_send_wr / max_recv_wr a QP takes (a ConnectX-class NIC's max_qp_wr is 32768).
MAX_QUEUE_WR: Final = 1 << 16


class QueueFull(ValueError):
    """A post beyond the QP's max_send_wr / max_recv_wr: ibv_post_send / ibv_post_recv's ENOMEM. Nothing
    was queued; post again once completions have been polled (sends) or messages consumed receives."""


class Access(IntFlag):
    LOCAL_WRITE = 0x1
    REMOTE_WRITE = 0x2


class QpState(IntEnum):
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    ERROR = 6


class AsyncEventKind(StrEnum):
    """What an `AsyncEvent` reports (the `mrc_async_event` types this engine raises). A str enum, so an
    event still compares equal to its name."""

    QP_FATAL = "QP_FATAL"  # the QP went to ERROR on its own (retry budget, a fatal NACK, RNR retries)
    CQ_ERR = "CQ_ERR"  # a CQ overran (its depth of completions waiting): the QP that completed is in ERROR


class WcStatus(IntEnum):
    """Completion status (names of ibv_wc_status)."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
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


class CompletionChannel:
    """`mrc_comp_channel`: where armed CQs report that a completion arrived (`mrc_get_cq_event`). It
    only queues the CQs; a driver makes it pollable (`mrc.dataplane.channel.FdCompletionChannel`, an
    eventfd for `selectors`) through `on_event`, called once per event."""

    __slots__ = ("_events", "on_event", "unacked")

    def __init__(self) -> None:
        self._events: deque[CompletionQueue] = deque()
        self.on_event: Callable[[], None] | None = None
        self.unacked: dict[int, int] = {}  # cqn -> events got but not acked (mrc_ack_cq_events)

    def _notify(self, cq: CompletionQueue) -> None:
        self._events.append(cq)
        if self.on_event is not None:
            self.on_event()

    def get_cq_event(self) -> CompletionQueue | None:
        """The CQ of the oldest pending event (None when there is none). Re-arm it with `req_notify`
        and poll it: completions that came before the re-arm raise no event (as ibv_get_cq_event)."""
        if not self._events:
            return None
        cq = self._events.popleft()
        self.unacked[cq.cqn] = self.unacked.get(cq.cqn, 0) + 1
        return cq

    def ack_cq_events(self, cq: CompletionQueue, n: int) -> None:
        got = self.unacked.get(cq.cqn, 0)
        if not 0 < n <= got:
            raise ValueError(f"ack of {n} events of CQ {cq.cqn}, {got} got and not acked")
        self.unacked[cq.cqn] = got - n

    def __len__(self) -> int:
        return len(self._events)


class CompletionQueue:
    """A completion queue: the engine appends, the application polls (`mrc_poll_cq`). At most `depth`
    completions wait; one more is an overrun (`push` returns False, `overruns` counts it: the QP that
    completed goes to ERROR with a CQ_ERR async event, as an RC QP cannot lose a completion). Armed with
    `req_notify`, the next completion raises one event on its `channel`."""

    __slots__ = ("_q", "armed", "channel", "cq_context", "cqn", "depth", "overruns")

    def __init__(self, cqn: int, depth: int = 1 << 16, channel: CompletionChannel | None = None) -> None:
        if not 1 <= depth <= 1 << 22:
            raise ValueError(f"CQ depth must be 1..{1 << 22}, got {depth}")
        self.cqn = cqn
        self.depth = depth
        self.channel = channel
        self.armed = False
        self.overruns = 0
        self.cq_context: Any = None  # the application's (mrc_create_cq's cq_context)
        self._q: deque[WorkCompletion] = deque()

    def push(self, wc: WorkCompletion) -> bool:
        q = self._q
        if len(q) >= self.depth:
            self.overruns += 1
            return False
        q.append(wc)
        if self.armed:
            self.armed = False
            assert self.channel is not None
            self.channel._notify(self)
        return True

    def req_notify(self) -> None:
        """`mrc_req_notify_cq`: the next completion raises an event on the channel."""
        if self.channel is None:
            raise ValueError(f"CQ {self.cqn} has no completion channel")
        self.armed = True

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
    """QP attributes (`mrc_qp_attr` / `ibv_qp_attr` subset), with the engine's own knobs.

    timeout: ACK timeout exponent, 1.024 us x 2^timeout (0..24; 8 = 262 us as in the MRC example).
    linear_cnt: retries at the fixed timeout (<= 7); exp_cnt: further retries with doubling timeout
    (<= 25; 25 = forever, the spec's value; the default is finite so that a QP whose every path is
    dead reports RETRY_EXC_ERR instead of retrying for ever); backoff_cap: the doubling stops at
    timeout x 2^backoff_cap. `retry_budget_ns` is the time from the last progress to ERROR when
    nothing gets through. mpr: PSN window in units of 128 PSNs (requester and responder).
    rnr_retry / rnr_timer_ns: a WRITE-with-immediate refused for want of a posted receive (an RNR
    NACK) is resent after rnr_timer_ns, doubling per retry of that packet (up to 32x), at most
    rnr_retry times, then the QP fails with RNR_RETRY_EXC_ERR. max_wimm: WRITE-with-immediates
    outstanding at the requester; a further one waits in the send queue until one completes.
    max_rx_msgs / rx_msg_timeout_ns: the responder tracks at most this many incomplete messages
    (0 = the MPR window, which bounds what a genuine requester can have open) and forgets one that
    placed no byte for a whole rx_msg_timeout_ns, releasing its receive reservation.
    max_send_wr / max_recv_wr: `ibv_qp_cap`'s, which mrc_qp_init_attr carries: the send WRs posted and
    not yet completed, and the receives posted and not yet consumed, that the QP holds; one more is
    refused (`SendQueueFull`, ibv_post_send's ENOMEM) instead of growing the queue without bound.
    """

    timeout: int = 8
    linear_cnt: int = 7
    exp_cnt: int = 7
    backoff_cap: int = 6
    mpr: int = 8
    mtu: int = DEFAULT_PAYLOAD
    max_wimm: int = 128
    rnr_retry: int = 7
    rnr_timer_ns: int = 1_000_000
    max_rx_msgs: int = 0
    rx_msg_timeout_ns: int = 1_000_000_000
    ack_coalesce: int = 16  # responder SACKs at least every this many data packets (64 KiB at 4 KiB)
    ack_delay_ns: int = 4_000  # ... or this long after an unacknowledged arrival
    ack_req_per_window: int = 4  # requester: AckReq at least every cwnd / this many bytes (0: off)
    # requester: AckReq on every packet sent while fewer than this many bytes are in flight, so that a
    # window too small for the responder's coalescing is answered at once rather than after its
    # ack_delay_ns (-1: ack_coalesce x mtu). 0: off, for an engine whose delayed ACK already answers
    # within one turn of a polling loop (mrcd): there, AckReq on every packet of a CPU-bound sender
    # (whose window is never full) turns one SACK per turn into one per packet (docs/daemon.md)
    ack_req_floor: int = -1
    reorder_ns: int = 2_000  # minimum reordering tolerance before a SACK hole is a loss
    # a SACK hole is also a loss once a packet sent later on the same port (one FIFO to the wire, one
    # plane) was acknowledged and the hole is older than the port's current RTT + its adaptive
    # reordering window (>= reorder_ns + ack_delay_ns): no variance margin, so a dead path is found
    # about one RTT after its first loss even when RTTs jitter (docs/transport.md). False: the
    # cross-port rule alone
    same_port_rack: bool = True
    # an ASSUMED_BAD EV is GOOD again as soon as an acknowledgement shows that the transmission whose
    # loss retired it (or one sent on it later) was delivered: the loss call was wrong, and probing the
    # EV back would keep a working path out of the spray for a probe round trip or more
    # (PathSet.refute, docs/transport.md). False: only probes bring an EV back
    ev_refute: bool = True
    # an EV whose RTT sample exceeds 2 x the QP's smoothed RTT + this is steered away from, as on ECN
    # (-1: off): a slow link's queue long before the switch's byte threshold marks it
    steer_delay_ns: int = 10_000
    probe_interval_ns: int = 20_000  # first probe of an ASSUMED_BAD EV after this long
    probe_max_interval_ns: int = 2_000_000  # probe backoff cap (also the cadence of peer-port probes)
    probe_timeout_ns: int = 200_000  # a probe without reply after this long failed
    probe_good: int = 2  # consecutive probe replies that return an EV to GOOD
    initial_psn: int = 0
    trim_nack: bool = True  # responder NACKs trimmed packets (MRC_QP_CAP_TRIM_NACK)
    # responder side (mrc_qp_attr mpr_dest / max_wimm_dest, MRC_QP_CAP_SVC_TIME_DEST_UNSUPPORTED):
    # the PSN window it accepts (units of 128; 0 = mpr), the WRITE-with-immediates it tracks at once
    # (one more is answered NO_RECV_BUFFER and resent after rnr_timer_ns), whether its probe replies
    # report their service time
    mpr_dest: int = 0
    max_wimm_dest: int = 0xFFFF
    svc_time: bool = True
    max_send_wr: int = 16384
    max_recv_wr: int = 16384

    def check(self) -> None:
        if not isinstance(self.same_port_rack, bool):
            raise ValueError("same_port_rack must be True or False")
        if not isinstance(self.ev_refute, bool):
            raise ValueError("ev_refute must be True or False")
        if not 0 <= self.timeout <= 24:
            raise ValueError("timeout must be 0..24")
        if not 0 <= self.linear_cnt <= 7:
            raise ValueError("linear_cnt must be 0..7")
        if not 0 <= self.exp_cnt <= EXP_CNT_INFINITE:
            raise ValueError("exp_cnt must be 0..25")
        if not 0 <= self.backoff_cap <= 24:
            raise ValueError("backoff_cap must be 0..24")
        if not 1 <= self.mpr <= 8:
            raise ValueError("mpr must be 1..8 (units of 128 PSNs; SACK bitmaps carry up to 1024)")
        if not 64 <= self.mtu <= MAX_PAYLOAD:
            raise ValueError(f"mtu must be 64..{MAX_PAYLOAD}")
        if not 1 <= self.max_wimm <= 0xFFFF:
            raise ValueError("max_wimm must be 1..65535")
        if not 0 <= self.mpr_dest <= 8:
            raise ValueError("mpr_dest must be 0..8 (units of 128 PSNs; 0 = mpr)")
        if not 1 <= self.max_wimm_dest <= 0xFFFF:
            raise ValueError("max_wimm_dest must be 1..65535")
        if not 0 <= self.rnr_retry <= 7:
            raise ValueError("rnr_retry must be 0..7")
        if not 1_000 <= self.rnr_timer_ns <= 1_000_000_000:
            raise ValueError("rnr_timer_ns must be 1 us .. 1 s")
        if not 0 <= self.max_rx_msgs <= 1 << 16:
            raise ValueError("max_rx_msgs must be 0..65536 (0 = the MPR window)")
        if not 1_000_000 <= self.rx_msg_timeout_ns <= 3_600_000_000_000:
            raise ValueError("rx_msg_timeout_ns must be 1 ms .. 1 h")
        if self.ack_coalesce < 1:
            raise ValueError("ack_coalesce must be >= 1")
        if not 0 <= self.ack_delay_ns <= 100_000_000:
            raise ValueError("ack_delay_ns must be 0 .. 100 ms")
        if not 0 <= self.ack_req_per_window <= 64:
            raise ValueError("ack_req_per_window must be 0..64")
        if not -1 <= self.ack_req_floor <= 1 << 30:
            raise ValueError("ack_req_floor must be -1 (ack_coalesce x mtu) .. 1 GiB")
        if not -1 <= self.steer_delay_ns <= 1_000_000_000:
            raise ValueError("steer_delay_ns must be -1 (off) .. 1 s")
        for name in ("max_send_wr", "max_recv_wr"):
            if not 1 <= getattr(self, name) <= MAX_QUEUE_WR:
                raise ValueError(f"{name} must be 1..{MAX_QUEUE_WR}")
        # the probe timers are deadlines after `now`: at 0 a timer stays due after it fires and the
        # driver's loop spins at one instant, a probe per turn (docs/transport.md, "Timers make
        # progress"); mrcd's own options allow 1 us .. 10 s. The reordering tolerance adds to an RTT.
        for name in ("probe_interval_ns", "probe_max_interval_ns", "probe_timeout_ns"):
            if not 1_000 <= getattr(self, name) <= 10_000_000_000:
                raise ValueError(f"{name} must be 1 us .. 10 s")
        if not 0 <= self.reorder_ns <= 10_000_000_000:
            raise ValueError("reorder_ns must be 0 .. 10 s")
        if not 1 <= self.probe_good <= 255:
            raise ValueError("probe_good must be 1..255")

    @property
    def ack_timeout_ns(self) -> int:
        return ACK_TIMEOUT_UNIT_NS << self.timeout

    @property
    def window(self) -> int:
        return self.mpr * MPR_UNIT

    @property
    def dest_window(self) -> int:
        """The responder's PSN window (mpr_dest, or mpr when 0)."""
        return (self.mpr_dest or self.mpr) * MPR_UNIT

    @property
    def rx_msgs_limit(self) -> int:
        return self.max_rx_msgs or self.dest_window

    def rto_interval_ns(self, retries: int) -> int:
        """The ACK timeout after `retries` consecutive timeouts without progress."""
        k = retries - self.linear_cnt
        return self.ack_timeout_ns << (min(k, self.backoff_cap) if k > 0 else 0)

    @property
    def retry_budget_ns(self) -> int | None:
        """Time from the last acknowledgement that made progress to RETRY_EXC_ERR when nothing gets
        through any more (None: exp_cnt = 25, forever)."""
        if self.exp_cnt >= EXP_CNT_INFINITE:
            return None
        return sum(self.rto_interval_ns(r) for r in range(self.linear_cnt + self.exp_cnt + 1))

    def rnr_wait_ns(self, tries: int) -> int:
        """How long the `tries`-th RNR retry of one packet waits (1-based)."""
        return self.rnr_timer_ns * min(1 << (tries - 1), RNR_BACKOFF_MAX)


@dataclass(slots=True, eq=False)
class QpHint:
    """`mrc_qp_hint`: how the QPs given this hint will be used (`mrc_qp_hint_attr`). This engine has no
    shared hardware to size from it; what it does use it for is the first congestion window. Without a
    hint every QP starts at the profile's full window (NSCC: max_cwnd), and N QPs that start together
    toward one bottleneck send N windows in their first round trip. With one, a QP starts at its share:
    the window divided by the larger of the QPs sharing this host's uplink (num_qps_per_peer x
    num_send_peers) and the QPs converging on the peer (num_remote_recv_peers, the incast degree),
    never below one MTU. The null CC has no window, so the hint changes nothing there."""

    hint_id: int
    num_qps_per_peer: int = 1
    num_send_peers: int = 1
    num_remote_recv_peers: int = 1

    def check(self) -> None:
        for name in ("num_qps_per_peer", "num_send_peers", "num_remote_recv_peers"):
            v = getattr(self, name)
            if not 1 <= v <= 1 << 20:
                raise ValueError(f"{name} must be 1..{1 << 20}, got {v}")

    @property
    def share(self) -> int:
        """How many QPs share the narrowest point this hint describes."""
        return max(self.num_qps_per_peer * self.num_send_peers, self.num_remote_recv_peers)

    def initial_cwnd(self, cwnd: int, mtu: int) -> int:
        return max(mtu, cwnd // self.share)


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
