"""The state that every part of a queue pair shares, and the two paths that end a piece of work.

`QpCore` owns the one block of slots that is a queue pair and its constructor: requester, responder and
counters are built together, in one order (so the context's random draws come as they always did). It
also owns what every part calls: `_complete` (both sides complete work) and `set_error` (the verbs, the
requester, the ACK timeout and a CQ overrun all fail the QP), with the per-PSN requester states, the
flags and control-packet sizes used by more than one part, `Datagram` and `NEVER`.

The behaviour lives in mixin classes over this state, split where aioquic splits `quic/connection.py`
from `quic/recovery.py`: `recovery.Recovery` (RTT estimation, loss detection, the ACK timeout),
`requester.Requester` (transmission and the requester's side of SACK, NACK and probe replies) and
`responder.Responder` (placement, acknowledgement, probe and port-status handling), composed by
`qp.QueuePair` with the verbs and the timer entry point. Mixins and not objects owned by the QP: the hot
paths read and write dozens of fields of this one state, and CPython caches a method found through the
MRO per type, so the split costs nothing per call, where an owned recovery object would add an
attribute hop to every send and every SACK and a second set of fields to keep in step.

PSNs are kept as unbounded integers inside the engine (so wrap-around never reaches the arithmetic)
and masked to 24 bits on the wire; the receiver maps wire PSNs back relative to its cumulative point.
Per-PSN requester state lives in preallocated int64 arrays and lists indexed by PSN modulo the MPR
window (`QpCore._reset_tx`); received and acknowledged PSN sets are Python integers used as bitmaps
(bit i <=> PSN base + i).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from mrc.wire.consts import PSN_MOD, MxhFlag, ProbeReplyFlag, SackFlag
from mrc.wire.packet import CTRL_HDR_LEN

from .cc import NsccConfig, make_cc
from .drops import EngineDrop
from .paths import EvProfile, PathSet
from .verbs import (
    AsyncEventKind,
    CompletionQueue,
    QpAttr,
    QpHint,
    QpState,
    SendWr,
    WcOpcode,
    WcStatus,
    WorkCompletion,
)

if TYPE_CHECKING:
    from mrc.wire.icrc import IcrcContext

    from .engine import Context

NEVER: Final = 1 << 62
_HALF: Final = PSN_MOD >> 1

# per-PSN requester states
_FREE: Final = 0
_INFLIGHT: Final = 1
_LOST: Final = 2
_ACKED: Final = 3


def _i64(n: int) -> array[int]:
    """n zeroed int64 slots (array.array: the stdlib's flat buffer, indexable like a list)."""
    return array("q", bytes(8 * n))

_RETX: Final = int(MxhFlag.RETX)
_CE: Final = int(SackFlag.ECN_CE)
_S_DUP: Final = int(SackFlag.DUPLICATE)
_ICRC: Final = 4
_SACK_BASE: Final = CTRL_HDR_LEN + 20 + _ICRC
_NACK_SIZE: Final = CTRL_HDR_LEN + 16 + _ICRC
_PROBE_SIZE: Final = CTRL_HDR_LEN + 8 + _ICRC
_PROBE_REPLY_SIZE: Final = CTRL_HDR_LEN + 20 + _ICRC
_PORT_STATUS_SIZE: Final = CTRL_HDR_LEN + 8 + _ICRC
_SVC_VALID: Final = int(ProbeReplyFlag.SERVICE_TIME_VALID)

_RTS: Final = QpState.RTS


class Datagram(NamedTuple):
    """One packet for the driver to send: the UDP payload, the plane port and EV index to send it on
    (the host egress program maps the EV index to the path), and the destination host's address."""

    data: bytearray
    port: int
    ev_index: int
    dst: bytes


class QpCore:
    """A queue pair's state and its completion and error paths; `qp.QueuePair` is the class to use."""

    # Slots, the attributes of the per-event and per-packet paths first: an instance is one block of
    # memory (a 69-attribute instance dict would be ~3 KiB of scattered entries), which matters when
    # hundreds of QPs share the caches with the packets in flight (the simulator at scale).
    __slots__ = (  # noqa: RUF023 (in order of use, not sorted)
        "parked", "state", "cur", "retx_q", "send_q", "rto_deadline", "loss_deadline", "ack_deadline",
        "paths", "c", "rx_icrc", "rcv_cum", "W", "rbits", "mrs", "msgs", "rx_packets", "rx_bytes",
        "unacked", "ack_coalesce", "ack_coalesce_sum", "last_rx", "attr", "tx_icrc", "peer_qpn", "peer_gid",
        "inflight",
        "snd_nxt", "snd_una", "mtu", "cc", "serial", "tx_bytes", "retx_bytes", "max_outstanding", "ack_floor",
        "sacked",
        "latest_acked_serial", "tx_state", "tx_len", "tx_ev", "tx_time", "tx_serial", "tx_wr", "tx_off",
        "tx_retx", "rack_next", "rtxq", "port_thr", "ack_timeout", "retries", "wrs_out", "send_cq", "srtt",
        "rttvar", "min_rtt", "port_srtt", "port_rttvar", "port_min_rtt", "reo_extra", "ctx", "qpn", "recv_cq",
        "rack_ser", "rack_rtt", "rack_thr", "rack_reo", "rack_calm", "rack_bump", "rack_lost",
        "same_port_rack", "ev_refute",
        "error_status", "msn", "trim_pending", "next_rid", "recv_q", "imm_reserved",
        "max_trim_recovery_ns", "trim_recoveries", "aux_deadline", "tx_old", "tx_old_ev", "first_psn",
        "wimm_out",
        "rnr", "gc_at", "max_rx_msgs", "ts_off", "steer_delay", "cc_spec", "ackreq_since", "ackreq_div",
        "Wd", "hint", "fast", "fast_acks", "fast_losses", "fast_rtt", "nack_retx_mark", "wlim", "oow_q",
    )

    def _reset_rack(self, nports: int) -> None:
        """The same-port loss rule's state (recovery.py), per port: the highest serial acknowledged,
        the latest RTT sample and the rule's threshold, the reordering window (reo_extra, widened by
        the rule's refuted calls, halved back after RACK_CALM samples without one), the samples since
        it last changed and when it may widen next; and the PSNs this rule declared lost (-> port and
        when), where a refutation widens the window: the cross-port rule's mistakes say nothing about
        how a port reorders."""
        self.same_port_rack = self.attr.same_port_rack
        self.ev_refute = self.attr.ev_refute
        self.rack_ser = [0] * nports
        self.rack_rtt = [0] * nports
        self.rack_thr = [NEVER] * nports
        self.rack_reo = [self.reo_extra] * nports
        self.rack_calm = [0] * nports
        self.rack_bump = [0] * nports
        self.rack_lost: dict[int, tuple[int, int]] = {}

    def _reset_tx(self, W: int) -> None:
        """The requester's per-PSN slots (index: PSN mod W). The five numeric ones are flat int64
        arrays, not lists: a list slot holds an int object per packet (offset, length, serial and, past
        256, the EV: about 100 bytes a packet in flight), which the C send writes without making
        (`_fastc.c`, `i64_open`), and an int64 bounds what a slot can hold (times and serials stay
        far below 2^63). States and the retransmitted flag stay lists of small ints and bools, which
        CPython shares (no object per packet), so the pure path keeps its slice tricks on them."""
        self.tx_state = [_FREE] * W
        self.tx_len = _i64(W)
        self.tx_ev = _i64(W)
        self.tx_time = _i64(W)
        self.tx_serial = _i64(W)
        self.tx_wr: list[SendWr | None] = [None] * W
        self.tx_off = _i64(W)
        self.tx_retx = [False] * W  # this PSN has been retransmitted (watched through rtxq)

    # the ICRC contexts of the two directions: set by INIT -> RTR, when the peer is known
    tx_icrc: IcrcContext
    rx_icrc: IcrcContext

    def __init__(
        self,
        ctx: Context,
        qpn: int,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        profile: EvProfile,
        cc: NsccConfig | str | None,
        attr: QpAttr,
        hint: QpHint | None = None,
    ) -> None:
        attr.check()
        self.ctx = ctx
        #: the fast path's send function (fastpath.install: C or Python), None on the pure path
        self.fast: Callable[[Any, SendWr, int, list[Datagram]], bool] | None = getattr(ctx, "fast_send", None)
        #: the C path's loop over a SACK's newly acknowledged PSNs (fastpath.install), else None
        self.fast_acks: Callable[..., tuple[int, int, int, int]] | None = getattr(ctx, "fast_acks", None)
        #: the C path's walk of loss detection (`Recovery._detect_losses`) and its RTT estimators
        #: (`_rtt_sample`, `_rack_sample`), else None
        self.fast_losses: Callable[..., tuple[int, int, int, int, int]] | None = getattr(
            ctx, "fast_losses", None
        )
        self.fast_rtt: Callable[[Any, int, int, bool], bool] | None = getattr(ctx, "fast_rtt", None)
        self.qpn = qpn
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.attr = attr
        self.state = QpState.INIT
        self.paths = PathSet(
            profile,
            qpn,
            (attr.probe_interval_ns, attr.probe_max_interval_ns, attr.probe_timeout_ns, attr.probe_good),
        )
        self.cc_spec = cc
        self.cc = make_cc(cc, attr.mtu)
        self.hint = hint
        if hint is not None:
            self.cc.cwnd = hint.initial_cwnd(self.cc.cwnd, attr.mtu)
        self.paths.ev_cqs = ctx.ev_cqs
        self.mtu = attr.mtu
        # AckReq on every packet below this many bytes in flight (QpAttr.ack_req_floor; 0: never)
        self.ack_floor = attr.ack_coalesce * attr.mtu if attr.ack_req_floor < 0 else attr.ack_req_floor
        self.ackreq_div = attr.ack_req_per_window  # AckReq at least this often per congestion window
        self.ackreq_since = 0  # bytes sent since the last packet with AckReq
        # The responder's coalescing run alternates between ack_coalesce and one less. A SACK echoes the
        # EV of the packet that triggered it, and a requester sprays its EVs in a fixed cycle: with a
        # fixed run of 16 and 128 EVs only every 16th EV ever triggered one (23 of 128 were ever
        # echoed), so the others got no delay samples and a penalised one was never relieved. Runs of
        # 16, 15, 16, ... step through the cycle by 31, prime to any EV count that is not a multiple.
        self.ack_coalesce = attr.ack_coalesce
        self.ack_coalesce_sum = attr.ack_coalesce + max(1, attr.ack_coalesce - 1)
        self.ack_timeout = attr.ack_timeout_ns
        # a SACK may be held by the peer's delayed-ACK timer (same QpAttr defaults at both ends)
        self.reo_extra = attr.reorder_ns + attr.ack_delay_ns
        self.steer_delay = attr.steer_delay_ns if attr.steer_delay_ns >= 0 else NEVER
        self.mrs = ctx.mrs
        self.W = W = attr.window
        self.Wd = attr.dest_window  # the responder's window (mpr_dest)
        #: the PSN window new transmissions keep to: W, narrowed by OUT_OF_WINDOW NACKs to the peer's
        #: responder window where that is smaller (`Requester.on_nack`); W stays the slots' modulus
        self.wlim = W
        #: PSNs refused OUT_OF_WINDOW, resent once they are inside `wlim` again (`Requester.send`)
        self.oow_q: deque[int] = deque()
        self.peer_gid = b""
        self.peer_qpn = 0
        self.error_status: WcStatus | None = None
        # ---------------- requester
        self.snd_una = self.snd_nxt = attr.initial_psn
        self.sacked = 0  # bit i <=> PSN snd_una + i acknowledged
        self.inflight = 0
        self._reset_tx(W)
        self.serial = 0  # transmissions so far (first sends and retransmissions)
        self.tx_bytes = 0
        self.retx_bytes = 0  # payload bytes sent again (of tx_bytes)
        self.latest_acked_serial = 0
        # PSN -> times of its earlier transmissions, for PSNs sent more than once (feedback may echo any)
        self.tx_old: dict[int, list[int]] = {}
        self.tx_old_ev: dict[int, list[int]] = {}  # ... and the EVs they went on (Requester.on_sack)
        self.first_psn = attr.initial_psn
        # MXH timestamps go out as now + ts_off, a random per-QP offset (as TCP randomizes its
        # timestamps per connection): echoes are checked against our own transmissions, so feedback
        # that did not see our packet cannot name one, even on a driver clock that starts at 0 (one
        # guess in 2^29 per forged packet, PSN aside). 29 bits keep a simulator's timestamps within
        # CPython's one-digit ints (< 2^30) for its first half second, as they were before the offset
        self.ts_off = ctx.rng.getrandbits(29)
        self.wimm_out = 0  # WRITE-with-immediates started and not yet completed (<= attr.max_wimm)
        self.rnr: dict[int, list[int]] = {}  # PSN refused for want of a receive -> [resend at or -1, tries]
        self.rack_next = attr.initial_psn  # loss detection pointer over first transmissions
        self.rtxq: deque[tuple[int, int]] = deque()  # (psn, serial) of retransmissions, in send order
        self.retx_q: deque[int] = deque()
        self.send_q: deque[SendWr] = deque()
        self.cur: SendWr | None = None
        self.wrs_out: deque[SendWr] = deque()  # posted, not yet completed, in PSN order
        self.msn = 0
        self.trim_pending: dict[int, int] = {}
        self.srtt = 0
        self.rttvar = 0
        self.min_rtt = NEVER
        nports = self.paths.nports
        self.port_srtt = [0] * nports
        self.port_min_rtt = [NEVER] * nports  # the plane's base RTT (planes may differ in length)
        self.port_rttvar = [0] * nports
        self.port_thr = [attr.ack_timeout_ns] * nports  # reordering threshold; before any sample: RTO
        self._reset_rack(nports)
        self.retries = 0
        #: retx_trim + retx_nack at the last progress or timeout (`Recovery._on_rto`)
        self.nack_retx_mark = 0
        self.rto_deadline = NEVER
        self.loss_deadline = NEVER
        self.aux_deadline = NEVER  # the earlier of an RNR resend and the responder's message sweep
        self.next_rid = 1
        # ---------------- responder
        self.rcv_cum = 0  # 24-bit: lowest PSN not yet received
        self.rbits = 0  # bit i <=> PSN rcv_cum + i received (bit 0 is always clear)
        # msn -> [bytes placed, imm or None, msg_len, bytes placed at the previous sweep]; in arrival
        # order, bounded by max_rx_msgs (the oldest goes first) and swept every rx_msg_timeout_ns
        self.msgs: dict[int, list[Any]] = {}
        self.max_rx_msgs = attr.rx_msgs_limit
        self.gc_at = NEVER
        self.recv_q: deque[int] = deque()
        self.imm_reserved = 0
        self.unacked = 0
        self.ack_deadline = NEVER
        self.rx_packets = 0
        self.rx_bytes = 0
        self.last_rx: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)  # psn, ev, ts, flags, t, port
        # ---------------- counters
        self.c: dict[str, int] = dict.fromkeys(
            (
                "retx_sack", "retx_trim", "retx_timeout", "retx_nack", "retx_rnr",
                "retx_spurious", "lost_then_acked", "retx_same_port", "same_port_refuted",
                "sack_rx", "nack_rx", "nack_trim_rx", "rnr_rx",
                "ecn_echo_rx", "ecn_steered", "delay_steered", "probe_tx", "probe_reply_rx", "rto",
                "no_path_rto",
                "window_limited", "cwnd_limited", "wimm_limited", "unmatched_rx",
                "dup_rx", "stale_rx", "oow_rx", "trim_rx", "ecn_rx",
                "sack_tx", "nack_tx", "probe_rx", "bad_rkey_rx", "bad_va_rx", "bad_length_rx",
                "no_recv_buffer_rx", "imm_rx", "port_status_rx", "rx_msg_evicted", "rx_msg_expired",
            ),
            0,
        )
        self.max_outstanding = 0
        self.max_trim_recovery_ns = 0
        # True after `send` found the congestion window full (its fast exit) and nothing that can
        # change that outcome has happened since: SACK, NACK, timer, post, error all clear it. Context.
        # datagrams_to_send then counts the attempt (cwnd_limited) without the call.
        self.parked = False
        # the latest trim recovery times (ns from the trimmed send to its resend), for statistics: bounded,
        # as is everything the network's behaviour can grow
        self.trim_recoveries: deque[int] = deque(maxlen=4096)

    def _complete(self, cq: CompletionQueue, wc: WorkCompletion, now: int) -> None:
        """Queue a completion; on an overrun the QP goes to ERROR (a completion lost silently would
        leave the application waiting for a WRITE that is done) and the context reports CQ_ERR."""
        if not cq.push(wc):
            if self.state != QpState.ERROR:
                why = f"CQ {cq.cqn} overran (depth {cq.depth})"
                self.ctx.async_event(now, self.qpn, AsyncEventKind.CQ_ERR, why)
            self.set_error(WcStatus.WR_FLUSH_ERR, now)

    @staticmethod
    def _wc_op(imm: int | None) -> WcOpcode:
        return WcOpcode.RDMA_WRITE if imm is None else WcOpcode.RDMA_WRITE_WITH_IMM

    def _unmatched(self, reason: EngineDrop) -> None:
        self.c["unmatched_rx"] += 1
        self.ctx.drop(reason)

    def set_error(self, status: WcStatus, now: int) -> None:
        """Move to ERROR: the oldest outstanding WRITE completes with `status`, everything else posted is
        flushed (WR_FLUSH_ERR), timers stop, and the context reports an async event."""
        if self.state == QpState.ERROR:
            return
        self.parked = False
        self.state = QpState.ERROR
        self.error_status = status
        first = True
        for wr in self.wrs_out:
            st = status if first else WcStatus.WR_FLUSH_ERR
            first = False
            wc = WorkCompletion(wr.wr_id, st, self._wc_op(wr.imm), self.qpn, 0, None)
            self._complete(self.send_cq, wc, now)
        self.wrs_out.clear()
        self.send_q.clear()
        self.cur = None
        for wr_id in self.recv_q:
            wc = WorkCompletion(wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV_RDMA_WITH_IMM, self.qpn)
            self._complete(self.recv_cq, wc, now)
        self.recv_q.clear()
        self.retx_q.clear()
        self.oow_q.clear()
        self.rtxq.clear()
        self.rnr.clear()
        self.tx_old.clear()
        self.tx_old_ev.clear()
        self.wimm_out = 0
        self.rto_deadline = self.loss_deadline = self.ack_deadline = self.aux_deadline = NEVER
        self.gc_at = NEVER
        self.paths.stop_probes()
        self.ctx.async_event(now, self.qpn, AsyncEventKind.QP_FATAL, status.name)
