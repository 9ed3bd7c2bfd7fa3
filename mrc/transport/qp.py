"""The MRC queue pair: requester (spraying, SACK/NACK processing, loss detection, timers) and responder
(self-placing writes, SACK generation, immediates, probe replies) in one object, as in RC.

PSNs are kept as unbounded integers inside the engine (so wrap-around never reaches the arithmetic)
and masked to 24 bits on the wire; the receiver maps wire PSNs back relative to its cumulative point.
Per-PSN requester state lives in preallocated lists indexed by PSN modulo the MPR window; received and
acknowledged PSN sets are Python integers used as bitmaps (bit i <=> PSN base + i).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from mrc.wire.consts import (
    FATAL_NACK_CODES,
    PSN_MASK,
    PSN_MOD,
    MxhFlag,
    NackCode,
    PortState,
    ProbeReplyFlag,
    SackFlag,
)
from mrc.wire.packet import (
    CTRL_HDR_LEN,
    MrcPacket,
    WriteFields,
    build_nack,
    build_port_status,
    build_probe,
    build_probe_reply,
    build_sack,
    write_packet,
)

from .cc import NsccConfig, make_cc
from .drops import EngineDrop
from .paths import EvProfile, PathSet
from .verbs import (
    EXP_CNT_INFINITE,
    AsyncEventKind,
    CompletionQueue,
    MemoryRegion,
    QpAttr,
    QpHint,
    QpState,
    SendWr,
    WcOpcode,
    WcStatus,
    WorkCompletion,
)

if TYPE_CHECKING:
    from .engine import Context

NEVER: Final = 1 << 62
# modify_qp: the states each state may move to (RC QPs as ibv_modify_qp has them, without SQD/SQE)
_TRANSITIONS: Final = {
    QpState.RESET: (QpState.RESET, QpState.INIT, QpState.ERROR),
    QpState.INIT: (QpState.RESET, QpState.INIT, QpState.RTR, QpState.ERROR),
    QpState.RTR: (QpState.RESET, QpState.RTS, QpState.ERROR),
    QpState.RTS: (QpState.RESET, QpState.RTS, QpState.ERROR),
    QpState.ERROR: (QpState.RESET, QpState.ERROR),
}
_HALF: Final = PSN_MOD >> 1

# per-PSN requester states
_FREE: Final = 0
_INFLIGHT: Final = 1
_LOST: Final = 2
_ACKED: Final = 3
_ACKED_RUNS: Final = [[_ACKED] * k for k in range(8 * 128 + 1)]

_FIRST: Final = int(MxhFlag.FIRST)
_LAST: Final = int(MxhFlag.LAST)
_RETX: Final = int(MxhFlag.RETX)
_ACK_NOW: Final = int(MxhFlag.ACK_REQ_NOW)
_TRIMMED: Final = int(MxhFlag.TRIMMED)
_CE: Final = int(SackFlag.ECN_CE)
_S_RETX: Final = int(SackFlag.RETX)
_S_DUP: Final = int(SackFlag.DUPLICATE)
_ICRC: Final = 4
_SACK_BASE: Final = CTRL_HDR_LEN + 20 + _ICRC
_NACK_SIZE: Final = CTRL_HDR_LEN + 16 + _ICRC
_PROBE_SIZE: Final = CTRL_HDR_LEN + 8 + _ICRC
_PROBE_REPLY_SIZE: Final = CTRL_HDR_LEN + 20 + _ICRC
_PORT_STATUS_SIZE: Final = CTRL_HDR_LEN + 8 + _ICRC
_NACK_TRIMMED: Final = int(NackCode.TRIMMED)
_SVC_VALID: Final = int(ProbeReplyFlag.SERVICE_TIME_VALID)


_new_tuple: Final = tuple.__new__
_RTS: Final = QpState.RTS


class Datagram(NamedTuple):
    """One packet for the driver to send: the UDP payload, the plane port and EV index to send it on
    (the host egress program maps the EV index to the path), and the destination host's address."""

    data: bytearray
    port: int
    ev_index: int
    dst: bytes


class QueuePair:
    """A reliable, multipath queue pair. Create with `Context.create_qp`, then `connect`."""

    # Slots, the attributes of the per-event and per-packet paths first: an instance is one block of
    # memory (a 69-attribute instance dict would be ~3 KiB of scattered entries), which matters when
    # hundreds of QPs share the caches with the packets in flight (the simulator at scale).
    __slots__ = (  # noqa: RUF023 (in order of use, not sorted)
        "parked", "state", "cur", "retx_q", "send_q", "rto_deadline", "loss_deadline", "ack_deadline",
        "paths", "c", "rx_icrc", "rcv_cum", "W", "rbits", "mrs", "msgs", "rx_packets", "rx_bytes",
        "unacked", "ack_coalesce", "ack_coalesce_sum", "last_rx", "attr", "tx_icrc", "peer_qpn", "peer_gid",
        "inflight",
        "snd_nxt", "snd_una", "mtu", "cc", "serial", "tx_bytes", "max_outstanding", "ack_floor", "sacked",
        "latest_acked_serial", "tx_state", "tx_len", "tx_ev", "tx_time", "tx_serial", "tx_wr", "tx_off",
        "tx_retx", "rack_next", "rtxq", "port_thr", "ack_timeout", "retries", "wrs_out", "send_cq", "srtt",
        "rttvar", "min_rtt", "port_srtt", "port_rttvar", "port_min_rtt", "reo_extra", "ctx", "qpn", "recv_cq",
        "error_status", "msn", "trim_pending", "next_rid", "recv_q", "imm_reserved",
        "max_trim_recovery_ns", "trim_recoveries", "aux_deadline", "tx_old", "first_psn", "wimm_out",
        "rnr", "gc_at", "max_rx_msgs", "ts_off", "steer_delay", "cc_spec", "ackreq_since", "ackreq_div",
        "Wd", "hint",
    )

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
        self.ack_floor = attr.ack_coalesce * attr.mtu
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
        self.peer_gid = b""
        self.peer_qpn = 0
        self.error_status: WcStatus | None = None
        # ---------------- requester
        self.snd_una = self.snd_nxt = attr.initial_psn
        self.sacked = 0  # bit i <=> PSN snd_una + i acknowledged
        self.inflight = 0
        self.tx_state = [_FREE] * W
        self.tx_len = [0] * W
        self.tx_ev = [0] * W
        self.tx_time = [0] * W
        self.tx_serial = [0] * W
        self.tx_wr: list[SendWr | None] = [None] * W
        self.tx_off = [0] * W
        self.serial = 0  # transmissions so far (first sends and retransmissions)
        self.tx_bytes = 0
        self.latest_acked_serial = 0
        self.tx_retx = [False] * W  # this PSN has been retransmitted (watched through rtxq)
        # PSN -> times of its earlier transmissions, for PSNs sent more than once (feedback may echo any)
        self.tx_old: dict[int, list[int]] = {}
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
        self.retries = 0
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
                "retx_spurious", "lost_then_acked", "sack_rx", "nack_rx", "nack_trim_rx", "rnr_rx",
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
        # True after `send` found the congestion window full (the fast exit below) and nothing that can
        # change that outcome has happened since: SACK, NACK, timer, post, error all clear it. Context.
        # datagrams_to_send then counts the attempt (cwnd_limited) without the call.
        self.parked = False
        # the latest trim recovery times (ns from the trimmed send to its resend), for statistics: bounded,
        # as is everything the network's behaviour can grow
        self.trim_recoveries: deque[int] = deque(maxlen=4096)

    # ================================================================== verbs

    def connect(self, remote_gid: bytes, remote_qpn: int, rq_psn: int | None = None) -> None:
        """RESET/INIT -> RTR -> RTS in one call: bind the QP to its peer (GID, QPN) and the PSN the peer
        starts at (default: our own initial PSN, as the loopback harness configures both ends alike)."""
        if self.state not in (QpState.RESET, QpState.INIT):
            raise ValueError(f"connect in state {self.state.name}")
        if self.state == QpState.RESET:
            self.modify(QpState.INIT)
        self.modify(QpState.RTR, remote_gid=remote_gid, remote_qpn=remote_qpn, rq_psn=rq_psn)
        self.modify(QpState.RTS)

    def modify(
        self, state: QpState, now: int = 0, *, remote_gid: bytes | None = None,
        remote_qpn: int | None = None, rq_psn: int | None = None,
    ) -> None:
        """`mrc_modify_qp` state transitions, as RC QPs have them: RESET -> INIT -> RTR (bound to the
        peer: it receives and acknowledges) -> RTS (it sends); any state -> ERROR (everything posted is
        flushed with WR_FLUSH_ERR) and -> RESET (all state dropped without completions, the QP reusable
        from INIT with the same QPN); INIT -> INIT and RTS -> RTS keep the state. Anything else is a
        ValueError that names both states and changes nothing."""
        cur = self.state
        if state not in _TRANSITIONS.get(cur, ()):
            raise ValueError(f"QP {self.qpn:#x}: no transition {cur.name} -> {QpState(state).name}")
        if state == QpState.RESET:
            self._reset()
        elif state == QpState.ERROR:
            self.set_error(WcStatus.WR_FLUSH_ERR, now)
        elif state == QpState.RTR:
            if remote_gid is None or remote_qpn is None:
                raise ValueError(f"QP {self.qpn:#x}: INIT -> RTR needs remote_gid and remote_qpn")
            if len(remote_gid) != 16 or not 0 < remote_qpn <= 0xFFFFFF:
                raise ValueError(f"QP {self.qpn:#x}: remote_gid must be 16 bytes, remote_qpn 1..2^24-1")
            self.peer_gid = bytes(remote_gid)
            self.peer_qpn = remote_qpn
            self.tx_icrc = self.ctx.icrc(self.ctx.gid, self.peer_gid)
            self.rx_icrc = self.ctx.icrc(self.peer_gid, self.ctx.gid)
            self.rcv_cum = (self.attr.initial_psn if rq_psn is None else rq_psn) & PSN_MASK
            self.state = QpState.RTR
        else:
            self.state = state

    def _reset(self) -> None:
        """Back to a fresh QP of the same number, CQs, EV profile, CC profile and attributes (RESET): the
        constructor's state again, the old path set out of its profile."""
        self.paths.detach()
        QueuePair.__init__(
            self, self.ctx, self.qpn, self.send_cq, self.recv_cq, self.paths.profile, self.cc_spec,
            self.attr, self.hint,
        )
        self.state = QpState.RESET

    def reconfigure(
        self, attr: QpAttr, profile: EvProfile, cc: NsccConfig | str | None, hint: QpHint | None
    ) -> None:
        """New attributes, profiles or hint for a QP that has neither sent nor received (RESET or INIT,
        `api.modify_qp` to INIT or RTR): the constructor again, keeping the state and posted receives."""
        if self.state not in (QpState.RESET, QpState.INIT):
            raise ValueError(f"QP {self.qpn:#x}: reconfigured in {self.state.name}")
        attr.check()
        state, recv_q = self.state, self.recv_q
        self.paths.detach()
        QueuePair.__init__(self, self.ctx, self.qpn, self.send_cq, self.recv_cq, profile, cc, attr, hint)
        self.state, self.recv_q = state, recv_q

    def reconfigure_requester(self, attr: QpAttr) -> None:
        """New requester attributes (mpr, max_wimm, timeout, retry counts) on RTR -> RTS: the QP may
        have received already, so only the requester's state is rebuilt, which is still empty (an RTR
        QP sends nothing)."""
        if self.state != QpState.RTR or self.snd_nxt != self.snd_una or self.send_q:
            raise ValueError(f"QP {self.qpn:#x}: requester attributes change on RTR -> RTS only")
        attr.check()
        self.attr = attr
        self.W = W = attr.window
        self.tx_state = [_FREE] * W
        self.tx_len = [0] * W
        self.tx_ev = [0] * W
        self.tx_time = [0] * W
        self.tx_serial = [0] * W
        self.tx_wr = [None] * W
        self.tx_off = [0] * W
        self.tx_retx = [False] * W
        self.ack_timeout = attr.ack_timeout_ns
        self.port_thr = [attr.ack_timeout_ns] * self.paths.nports

    def post_send(
        self,
        wr_id: int,
        mr: MemoryRegion,
        offset: int,
        length: int,
        remote_addr: int,
        rkey: int,
        imm: int | None = None,
    ) -> None:
        """RDMA WRITE (or WRITE-with-immediate with `imm`) of mr[offset:offset+length] to
        (remote_addr, rkey). Completes on `send_cq` once every PSN is acknowledged."""
        if self.state == QpState.ERROR:
            wc = WorkCompletion(wr_id, WcStatus.WR_FLUSH_ERR, self._wc_op(imm), self.qpn, 0, None)
            self._complete(self.send_cq, wc, 0)
            return
        if self.state != QpState.RTS:
            raise ValueError(f"post_send in state {self.state.name}")
        if offset < 0 or length < 0 or offset + length > mr.length:
            raise ValueError("local range outside the memory region")
        if length >= 1 << 32:
            raise ValueError("message length must be < 2^32")
        wr = SendWr(wr_id, self.msn & 0xFFFFFFFF, mr, offset, length, remote_addr, rkey, imm)
        self.parked = False
        self.msn += 1
        self.send_q.append(wr)
        self.wrs_out.append(wr)

    def post_recv(self, wr_id: int) -> None:
        """Pre-post a receive that one incoming WRITE-with-immediate will consume."""
        if self.state == QpState.ERROR:
            wc = WorkCompletion(wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV_RDMA_WITH_IMM, self.qpn)
            self._complete(self.recv_cq, wc, 0)
            return
        self.recv_q.append(wr_id)

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

    @property
    def deadline(self) -> int:
        d = self.rto_deadline
        if self.loss_deadline < d:
            d = self.loss_deadline
        if self.ack_deadline < d:
            d = self.ack_deadline
        if self.aux_deadline < d:
            d = self.aux_deadline
        p = self.paths.next_probe_deadline
        return p if p < d else d

    @property
    def busy(self) -> bool:
        """True while sends are queued, in flight, or awaiting acknowledgement."""
        return self.state == QpState.RTS and (bool(self.wrs_out) or self.snd_nxt != self.snd_una)

    # ================================================================== requester: transmit

    def send(self, now: int, out: list[Datagram]) -> None:
        """Emit as many data packets as the congestion and MPR windows allow."""
        if self.state != _RTS:
            return
        retx_q = self.retx_q
        wr = self.cur
        if wr is not None and not retx_q:
            # The congestion window is full (the check of the loop below, done first): a driver calls
            # this after every event, so most calls of a busy QP end here.
            sent = wr.sent
            inflight = self.inflight
            if sent and inflight and self.snd_nxt < self.snd_una + self.W:
                n = wr.length - sent
                if n > self.mtu:
                    n = self.mtu
                if inflight + n > self.cc.cwnd:
                    self.c["cwnd_limited"] += 1
                    if self.rto_deadline == NEVER and self.snd_nxt != self.snd_una:
                        self.rto_deadline = now + self._rto_interval()
                    self.parked = True
                    return
        self.parked = False
        W = self.W
        cc = self.cc
        tx_state = self.tx_state
        while True:
            if retx_q:
                psn = retx_q[0]
                slot = psn % W
                if psn < self.snd_una or tx_state[slot] != _LOST:
                    retx_q.popleft()
                    continue
                if self.inflight and self.inflight + self.tx_len[slot] > cc.cwnd:
                    self.c["cwnd_limited"] += 1
                    return
                retx_q.popleft()
                if not self._retransmit(psn, slot, now, out):
                    retx_q.appendleft(psn)
                    return
                continue
            wr = self.cur
            if wr is None:
                send_q = self.send_q
                if not send_q:
                    return
                if send_q[0].imm is not None:
                    # max_wimm: the next WRITE-with-immediate (and what was posted after it) waits
                    # until an outstanding one completes
                    if self.wimm_out >= self.attr.max_wimm:
                        self.c["wimm_limited"] += 1
                        return
                    self.wimm_out += 1
                wr = self.cur = send_q.popleft()
            sent = wr.sent
            if sent and self.inflight and self.snd_nxt < self.snd_una + W:
                # The congestion window is full: exactly what _send_new would find first (same counter,
                # same timer), without its set-up. A driver calls this after every event, so most calls
                # of a busy QP end here.
                n = wr.length - sent
                if n > self.mtu:
                    n = self.mtu
                if self.inflight + n > cc.cwnd:
                    self.c["cwnd_limited"] += 1
                    if self.rto_deadline == NEVER and self.snd_nxt != self.snd_una:
                        self.rto_deadline = now + self._rto_interval()
                    return
            if not self._send_new(wr, now, out):
                return

    def _send_new(self, wr: SendWr, now: int, out: list[Datagram]) -> bool:
        """First transmissions of `wr` (the hot path, one tight loop). False when a window is full."""
        W = self.W
        mtu = self.mtu
        psn = self.snd_nxt
        una = self.snd_una
        limit = una + W
        cwnd = self.cc.cwnd
        inflight = self.inflight
        ack_floor = self.ack_floor
        paths = self.paths
        ev_port = paths.ev_port
        port_bytes = paths.port_bytes
        tx_state, tx_len, tx_ev, tx_time = self.tx_state, self.tx_len, self.tx_ev, self.tx_time
        tx_serial, tx_wr, tx_off = self.tx_serial, self.tx_wr, self.tx_off
        tx_retx = self.tx_retx
        out_append = out.append
        icrc = self.tx_icrc
        dqpn = self.peer_qpn
        gid = self.peer_gid
        serial = self.serial
        length = wr.length
        sent = wr.sent
        base = wr.offset
        view = wr.mr.view
        va0 = wr.remote_addr
        rkey, msn, imm = wr.rkey, wr.msn, wr.imm
        seq = paths.seq
        seq_len = len(seq)
        seq_pos = paths.seq_pos
        stamp = now + self.ts_off
        since = self.ackreq_since
        every = cwnd // self.ackreq_div if self.ackreq_div else 0
        if every >= ack_floor:  # the responder's coalescing already acknowledges often enough
            every = 0
        if sent == 0:
            wr.first_psn = psn
        ok = True
        while True:
            if psn >= limit:
                self.c["window_limited"] += 1
                ok = False
                break
            n = length - sent
            if n > mtu:
                n = mtu
            if inflight and inflight + n > cwnd:
                self.c["cwnd_limited"] += 1
                ok = False
                break
            if seq_len:
                ev = seq[seq_pos]
                seq_pos += 1
                if seq_pos == seq_len:
                    seq_pos = 0
            else:
                ev = paths.next_ev()
                if ev < 0:  # no usable EV: the ACK timer counts the wait against the retry budget
                    if self.rto_deadline == NEVER:
                        self.rto_deadline = now + self._rto_interval()
                    ok = False
                    break
            off = sent
            sent = off + n
            last = sent == length
            flags = _FIRST if off == 0 else 0
            if last:
                flags |= _LAST
                m_imm = imm
            else:
                m_imm = None
            lo = base + off
            # AckReq on a message's last packet, when so little is in flight that coalesced SACKs might
            # not come (the responder's delayed-ACK timer covers the rest), and every cwnd /
            # ack_req_per_window bytes: a window smaller than a few coalescing runs (one plane) must
            # still be acknowledged often enough to keep it full
            areq = last or inflight + n < ack_floor
            if every:
                since += n
                if areq or since >= every:
                    areq = True
                    since = 0
            buf = write_packet(
                icrc, dqpn, psn, ev, va0 + off, rkey, view[lo : lo + n], msn, length, off, stamp, flags,
                areq, m_imm,
            )
            slot = psn % W
            tx_wr[slot] = wr
            tx_off[slot] = off
            tx_len[slot] = n
            tx_state[slot] = _INFLIGHT
            tx_ev[slot] = ev
            tx_time[slot] = now
            serial += 1
            tx_serial[slot] = serial
            tx_retx[slot] = False
            inflight += n
            port = ev_port[ev]
            port_bytes[port] += n
            out_append(_new_tuple(Datagram, (buf, port, ev, gid)))  # Datagram(...) without its lambda
            psn += 1
            if last:
                wr.last_psn = psn - 1
                self.cur = None
                break
        if seq_len:
            paths.seq_pos = seq_pos
        self.ackreq_since = since
        wr.sent = sent
        self.snd_nxt = psn
        self.serial = serial
        self.tx_bytes += inflight - self.inflight
        self.inflight = inflight
        if psn - una > self.max_outstanding:
            self.max_outstanding = psn - una
        if self.rto_deadline == NEVER and psn != una:
            self.rto_deadline = now + self._rto_interval()
        return ok

    def _retransmit(self, psn: int, slot: int, now: int, out: list[Datagram]) -> bool:
        """Send PSN `psn` again (same PSN, RETX and AckReq set) on an EV other than its last one."""
        paths = self.paths
        ev = paths.other_ev(self.tx_ev[slot])
        if ev < 0:
            if self.rto_deadline == NEVER:
                self.rto_deadline = now + self._rto_interval()
            return False
        wr = self.tx_wr[slot]
        assert wr is not None
        off = self.tx_off[slot]
        n = self.tx_len[slot]
        last = off + n == wr.length
        flags = (_FIRST if off == 0 else 0) | (_LAST if last else 0) | _RETX
        imm = wr.imm if last else None
        lo = wr.offset + off
        buf = write_packet(
            self.tx_icrc, self.peer_qpn, psn, ev, wr.remote_addr + off, wr.rkey, wr.mr.view[lo : lo + n],
            wr.msn, wr.length, off, now + self.ts_off, flags, True, imm,
        )
        t0 = self.trim_pending.pop(psn, -1)
        if t0 >= 0:
            d = now - t0
            self.trim_recoveries.append(d)
            if d > self.max_trim_recovery_ns:
                self.max_trim_recovery_ns = d
        self.tx_state[slot] = _INFLIGHT
        self.tx_ev[slot] = ev
        old = self.tx_old
        times = old.get(psn)
        if times is None:
            if len(old) >= 2 * self.W:  # forget PSNs whose slots were reused
                floor = self.snd_nxt - self.W
                for p in [p for p in old if p < floor]:
                    del old[p]
            times = old[psn] = []
        times.append(self.tx_time[slot])
        self.tx_time[slot] = now
        self.serial = s = self.serial + 1
        self.tx_serial[slot] = s
        self.tx_retx[slot] = True
        self.rtxq.append((psn, s))
        self.inflight += n
        port = paths.ev_port[ev]
        paths.port_bytes[port] += n
        self.tx_bytes += n
        if self.rto_deadline == NEVER:
            self.rto_deadline = now + self._rto_interval()
        out.append(Datagram(buf, port, ev, self.peer_gid))
        return True

    def _rto_interval(self) -> int:
        return self.attr.rto_interval_ns(self.retries)

    # ================================================================== requester: validation

    def _own_slot(self, wire_psn: int, ts: int) -> int:
        """The slot of the transmission a control packet refers to: `wire_psn` names a PSN this QP has
        sent whose slot still holds it, and `ts` is the timestamp of its current transmission (>= 0
        returned) or of an earlier one (-2 - slot returned). -1: no transmission of ours (a stray or
        forged packet, or feedback a whole window late), which must not change anything."""
        una = self.snd_una
        nxt = self.snd_nxt
        r = (wire_psn - una) & PSN_MASK
        if r >= _HALF:
            r -= PSN_MOD
        p = una + r
        if p >= nxt or p < nxt - self.W or p < self.first_psn:
            return -1
        slot = p % self.W
        if self.tx_time[slot] == ts:
            return slot
        if self.tx_retx[slot] and ts in self.tx_old.get(p, ()):
            return -2 - slot
        return -1

    def _unmatched(self, reason: EngineDrop) -> None:
        self.c["unmatched_rx"] += 1
        self.ctx.drop(reason)

    # ================================================================== requester: feedback

    def on_sack(self, pkt: MrcPacket, now: int) -> None:
        self.parked = False
        s = pkt.body
        assert s is not None
        c = self.c
        # A genuine SACK echoes the PSN and send timestamp of the packet that triggered it: one that
        # names no transmission of ours is stray or forged and acknowledges nothing.
        ts = s.echo_timestamp_ns - self.ts_off  # type: ignore[union-attr]
        own = self._own_slot(pkt.psn, ts)
        if own == -1:
            self._unmatched(EngineDrop.SACK_UNMATCHED)
            return
        c["sack_rx"] += 1
        # a second copy of that PSN arrived: when we had sent it more than once, one of those
        # transmissions was not needed
        if s.echo_flags & _S_DUP and self.tx_retx[own if own >= 0 else -2 - own]:  # type: ignore[union-attr]
            c["retx_spurious"] += 1
        una = self.snd_una
        outstanding = self.snd_nxt - una
        rel = (s.cum_psn - una) & PSN_MASK  # type: ignore[union-attr]
        if rel >= _HALF:
            rel -= PSN_MOD
        if rel > outstanding:
            self.ctx.drop(EngineDrop.SACK_AHEAD)
            return
        acked = 0
        if outstanding:
            bm = s.bitmap  # type: ignore[union-attr]
            S = (((1 << rel) - 1) | (bm << (rel + 1))) if rel >= 0 else bm >> (-rel - 1)
            S &= (1 << outstanding) - 1
            newly = S & ~self.sacked
            if newly:
                W = self.W
                tx_state, tx_len, tx_serial = self.tx_state, self.tx_len, self.tx_serial
                las = self.latest_acked_serial
                self.sacked |= newly
                inflight = self.inflight
                spurious = 0
                low = newly & -newly
                if not (newly + low) & newly:  # one contiguous run: slices instead of a bit loop
                    i0 = low.bit_length() - 1
                    s0 = (una + i0) % W
                    s1 = s0 + newly.bit_length() - i0
                    if s1 <= W and _LOST not in tx_state[s0:s1]:
                        n = sum(tx_len[s0:s1])
                        inflight -= n
                        acked = n
                        tx_state[s0:s1] = _ACKED_RUNS[s1 - s0]
                        ser = max(tx_serial[s0:s1])
                        if ser > las:
                            las = ser
                        newly = 0
                while newly:
                    low = newly & -newly
                    slot = (una + low.bit_length() - 1) % W
                    newly ^= low
                    st = tx_state[slot]
                    n = tx_len[slot]
                    if st == _INFLIGHT:
                        inflight -= n
                    elif st == _LOST:
                        spurious += 1
                    tx_state[slot] = _ACKED
                    acked += n
                    ser = tx_serial[slot]
                    if ser > las:
                        las = ser
                self.inflight = inflight
                self.latest_acked_serial = las
                if spurious:
                    c["lost_then_acked"] += spurious
                sk = self.sacked
                if sk & 1:
                    t = (sk ^ (sk + 1)).bit_length() - 1
                    self.sacked = sk >> t
                    self.snd_una = una = una + t
                    wrs = self.wrs_out
                    while wrs and wrs[0].last_psn < una:
                        wr = wrs.popleft()
                        if wr.imm is not None:
                            self.wimm_out -= 1
                        self._complete(
                            self.send_cq,
                            WorkCompletion(
                                wr.wr_id, WcStatus.SUCCESS, self._wc_op(wr.imm), self.qpn, wr.length, None
                            ),
                            now,
                        )
                self.retries = 0
                self.rto_deadline = now + self.ack_timeout if self.snd_nxt != una else NEVER
        # per-EV steering from the echo of the triggering packet
        e = s.echo_ev_index  # type: ignore[union-attr]
        ecn = bool(s.echo_flags & _CE)  # type: ignore[union-attr]
        paths = self.paths
        hot = False
        if e < paths.n:
            if ecn:
                c["ecn_echo_rx"] += 1
                hot = paths.hot_spot(e)
                paths.penalise(e)
            elif paths.pen[e]:
                paths.relieve(e)
        # RTT sample (per transmission timestamps: no retransmission ambiguity)
        rtt = -1
        if 0 < ts <= now:
            rtt = now - ts - s.service_time_ns  # type: ignore[union-attr]
            if rtt < 0:
                rtt = 0
            if e < paths.n:
                port = paths.ev_port[e]
                base = self.port_min_rtt[port]
                if rtt < base:
                    self.port_min_rtt[port] = base = rtt
                srtt = self.srtt
                ref = srtt if srtt > base else base
                if not ecn and srtt and rtt > 2 * ref + self.steer_delay:
                    # this path waits far longer than the QP's paths do on average and than its own
                    # plane's base RTT: a slow or hot link, steered away from before its queue reaches
                    # the switch's ECN threshold (at a tenth of the line rate that threshold is a ten
                    # times longer wait); a plane that is merely longer is not penalised. The QP-wide
                    # smoothed RTT, not the best plane's: on a host whose RTTs jitter by milliseconds
                    # (the Python testbed) the best plane's would penalise healthy EVs of every plane.
                    # Like a hot spot's ECN it is steering's business, not the window's (one such
                    # sample would otherwise trigger quick adapt)
                    c["delay_steered"] += 1
                    paths.penalise(e)
                    hot = 4 * paths.npen <= paths.good_count
                self._rtt_sample(rtt, port)
            else:
                self._rtt_sample(rtt, -1)
        if hot:
            # the mark (or the delay) of a path the spraying already avoids, among clean ones (a slow
            # or hot link): steering answers it, not the window of every path; the bytes still count
            if ecn:
                c["ecn_steered"] += 1
            self.cc.on_ack(now, acked, -1, False)
        else:
            self.cc.on_ack(now, acked, rtt, ecn)
        if self.snd_nxt != self.snd_una:
            self._detect_losses(now)

    def _rtt_sample(self, rtt: int, port: int) -> None:
        """QP-wide smoothed RTT (statistics, CC) and one estimator per plane port: planes differ in
        delay and queueing, so the reordering threshold of a packet is that of its port."""
        if rtt < self.min_rtt:
            self.min_rtt = rtt
        if self.srtt == 0:
            self.srtt = rtt
            self.rttvar = rtt >> 1
        else:
            err = rtt - self.srtt
            self.srtt += err >> 3
            self.rttvar += ((err if err >= 0 else -err) - self.rttvar) >> 2
        if port < 0:
            return
        srtt = self.port_srtt[port]
        if srtt == 0:
            srtt = rtt
            var = rtt >> 1
        else:
            err = rtt - srtt
            srtt += err >> 3
            var = self.port_rttvar[port]
            var += ((err if err >= 0 else -err) - var) >> 2
        self.port_srtt[port] = srtt
        self.port_rttvar[port] = var
        self.port_thr[port] = srtt + 4 * var + self.reo_extra

    def _detect_losses(self, now: int) -> None:
        """RACK-style: a packet is lost when one sent after it was acknowledged and it has been out
        longer than srtt + 4 rttvar + reorder_ns + ack_delay_ns of its port.

        First transmissions go out in PSN order, so a pointer walks them once (everything below snd_una
        is acknowledged and skipped in one step); retransmissions are examined in send order from their
        own queue. Either way each transmission is looked at a bounded number of times."""
        W = self.W
        una = self.snd_una
        nxt = self.snd_nxt
        las = self.latest_acked_serial
        port_thr = self.port_thr
        ev_port = self.paths.ev_port
        tx_serial, tx_state, tx_time, tx_ev = self.tx_serial, self.tx_state, self.tx_time, self.tx_ev
        tx_retx = self.tx_retx
        deadline = NEVER
        p = self.rack_next
        if p < una:
            p = una
        while p < nxt:
            slot = p % W
            if tx_state[slot] != _INFLIGHT or tx_retx[slot]:
                p += 1  # acknowledged, already lost, or watched by the retransmission queue
                continue
            if tx_serial[slot] > las:
                break
            t = tx_time[slot] + port_thr[ev_port[tx_ev[slot]]]
            if t > now:
                deadline = t
                break
            self.c["retx_sack"] += 1
            self._lost(p, slot, now, True)
            p += 1
        self.rack_next = p
        rtxq = self.rtxq
        while rtxq:
            psn, ser = rtxq[0]
            if psn < una:
                rtxq.popleft()
                continue
            slot = psn % W
            if tx_serial[slot] != ser or tx_state[slot] != _INFLIGHT:
                rtxq.popleft()
                continue
            if ser > las:
                break
            t = tx_time[slot] + port_thr[ev_port[tx_ev[slot]]]
            if t > now:
                if t < deadline:
                    deadline = t
                break
            rtxq.popleft()
            self.c["retx_sack"] += 1
            self._lost(psn, slot, now, True)
        self.loss_deadline = deadline

    def _lost(self, psn: int, slot: int, now: int, blame_ev: bool) -> None:
        self.tx_state[slot] = _LOST
        self.inflight -= self.tx_len[slot]
        self.retx_q.append(psn)
        if blame_ev:
            self.paths.loss(self.tx_ev[slot], now)
        self.cc.on_loss(now)

    def on_nack(self, pkt: MrcPacket, now: int) -> None:
        """A NACK acts only on the current transmission of a PSN still outstanding (its echo timestamp
        names it): a stray packet at the responder, or a forged NACK, cannot fail or stall the QP.
        BAD_RKEY / BAD_VA / BAD_LENGTH / BAD_QPN for our own packet are fatal, as in RC; NO_RECV_BUFFER
        is receiver-not-ready (resent after a backoff); TRIMMED and OUT_OF_WINDOW resend the PSN."""
        self.parked = False
        b = pkt.body
        assert b is not None
        c = self.c
        own = self._own_slot(pkt.psn, b.echo_timestamp_ns - self.ts_off)  # type: ignore[union-attr]
        if own == -1:
            self._unmatched(EngineDrop.NACK_UNMATCHED)
            return
        if own < 0 or self.tx_state[own] != _INFLIGHT:
            self.ctx.drop(EngineDrop.NACK_STALE)  # an older transmission, or already acknowledged or resent
            return
        slot = own
        psn = self.snd_una + ((pkt.psn - self.snd_una) & PSN_MASK)
        c["nack_rx"] += 1
        code = b.code  # type: ignore[union-attr]
        if code in FATAL_NACK_CODES:
            self.set_error(WcStatus.REM_OP_ERR if code == NackCode.BAD_QPN else WcStatus.REM_ACCESS_ERR, now)
            return
        if code == NackCode.NO_RECV_BUFFER:
            self._rnr(psn, slot, now)
            return
        if code == NackCode.TRIMMED:
            c["nack_trim_rx"] += 1
            c["retx_trim"] += 1
            tp = self.trim_pending
            if len(tp) >= self.W:  # PSNs acknowledged before their resend left entries behind
                una = self.snd_una
                for p in [p for p in tp if p < una]:
                    del tp[p]
            tp[psn] = self.tx_time[slot]
            self.tx_state[slot] = _LOST
            self.inflight -= self.tx_len[slot]
            self.retx_q.appendleft(psn)  # selective retransmit now, on another EV; the EV stays GOOD
            e = b.echo_ev_index  # type: ignore[union-attr]
            if e < self.paths.n:
                self.paths.penalise(e)
            self.cc.on_trim(now)
        else:  # OUT_OF_WINDOW: resend later, no path blame
            c["retx_nack"] += 1
            self._lost(psn, slot, now, False)

    def _rnr(self, psn: int, slot: int, now: int) -> None:
        """Receiver not ready (no posted receive for an immediate): hold the PSN and resend it after
        rnr_wait_ns(tries); after rnr_retry resends of the same PSN the QP fails with
        RNR_RETRY_EXC_ERR. Not a path or congestion signal: no EV blame, no window change."""
        self.c["rnr_rx"] += 1
        rnr = self.rnr
        una = self.snd_una
        for p in [p for p in rnr if p < una]:
            del rnr[p]
        e = rnr.get(psn)
        tries = e[1] + 1 if e is not None else 1
        if tries > self.attr.rnr_retry:
            self.set_error(WcStatus.RNR_RETRY_EXC_ERR, now)
            return
        self.tx_state[slot] = _LOST
        self.inflight -= self.tx_len[slot]
        due = now + self.attr.rnr_wait_ns(tries)
        rnr[psn] = [due, tries]
        if due < self.aux_deadline:
            self.aux_deadline = due

    def on_probe_reply(self, pkt: MrcPacket, now: int) -> None:
        b = pkt.body
        assert b is not None
        svc = b.service_time_ns if b.flags & _SVC_VALID else 0  # type: ignore[union-attr]
        ts = b.echo_timestamp_ns - self.ts_off  # type: ignore[union-attr]
        if not self.paths.probe_reply(b.request_id, b.echo_ev_index, ts, now - ts - svc, now):  # type: ignore[union-attr]
            self._unmatched(EngineDrop.PROBE_REPLY_UNMATCHED)
            return
        self.c["probe_reply_rx"] += 1

    # ================================================================== timers

    def on_timer(self, now: int, out: list[Datagram]) -> None:
        self.parked = False
        if self.ack_deadline <= now:
            self.ack_deadline = NEVER
            if self.unacked:
                psn, ev, ts, flags, t, port = self.last_rx
                self._sack(now, out, psn, ev, ts, flags, now - t, port)
        if self.state != _RTS:
            return
        if self.loss_deadline <= now:
            self._detect_losses(now)
        if self.rto_deadline <= now:
            self._on_rto(now)
            if self.state != _RTS:
                return
        if self.aux_deadline <= now:
            self._on_aux(now)
        if self.paths.next_probe_deadline <= now:
            paths = self.paths
            for rid, i in paths.due_probes(now, self.next_rid):
                buf = bytearray(_PROBE_SIZE)
                build_probe(
                    buf, self.tx_icrc, dqpn=self.peer_qpn, ev_index=i, request_id=rid, reply_qpn=self.qpn,
                    timestamp_ns=now + self.ts_off,
                )
                self.next_rid = (rid + 1) & 0xFFFF or 1
                self.c["probe_tx"] += 1
                out.append(Datagram(buf, paths.ev_port[i], i, self.peer_gid))

    def _on_rto(self, now: int) -> None:
        """ACK timeout: linear stage (timeout x 1, linear_cnt times), then exponential backoff (x2 per
        retry up to x 2^backoff_cap, exp_cnt times; 25 = forever), then ERROR. A timeout counts as a
        retry when a transmission is overdue or when work waits for want of a usable EV (every EV
        denied: the probes run meanwhile); one that finds only RNR waits does not."""
        c = self.c
        c["rto"] += 1
        a = self.attr
        base = a.ack_timeout_ns
        W = self.W
        tx_state, tx_time = self.tx_state, self.tx_time
        overdue = [
            psn for psn in range(self.snd_una, self.snd_nxt)
            if tx_state[psn % W] == _INFLIGHT and tx_time[psn % W] + base <= now
        ]
        no_path = not self.paths.good_count and (
            self.retx_q or self.cur is not None or bool(self.send_q)
        )
        if not overdue and not no_path:
            busy = self.snd_nxt != self.snd_una
            self.rto_deadline = now + self._rto_interval() if busy else NEVER
            return
        if no_path:
            c["no_path_rto"] += 1
        self.retries += 1
        if a.exp_cnt < EXP_CNT_INFINITE and self.retries > a.linear_cnt + a.exp_cnt:
            self.set_error(WcStatus.RETRY_EXC_ERR, now)
            return
        for psn in overdue:
            c["retx_timeout"] += 1
            self._lost(psn, psn % W, now, True)
        self.rto_deadline = now + self._rto_interval()

    def _on_aux(self, now: int) -> None:
        """RNR resends that are due, and the responder's sweep of incomplete messages."""
        deadline = NEVER
        rnr = self.rnr
        if rnr:
            una = self.snd_una
            W = self.W
            for psn in list(rnr):
                e = rnr[psn]
                if psn < una:
                    del rnr[psn]
                elif e[0] >= 0:
                    if e[0] <= now:
                        e[0] = -1
                        if self.tx_state[psn % W] == _LOST:
                            self.c["retx_rnr"] += 1
                            self.retx_q.append(psn)
                    elif e[0] < deadline:
                        deadline = e[0]
        if self.gc_at <= now:
            self.gc_at = NEVER
            self._sweep_msgs(now)
        if self.gc_at < deadline:
            deadline = self.gc_at
        self.aux_deadline = deadline

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
        self.rtxq.clear()
        self.rnr.clear()
        self.tx_old.clear()
        self.wimm_out = 0
        self.rto_deadline = self.loss_deadline = self.ack_deadline = self.aux_deadline = NEVER
        self.gc_at = NEVER
        self.paths.stop_probes()
        self.ctx.async_event(now, self.qpn, AsyncEventKind.QP_FATAL, status.name)

    # ================================================================== responder

    def on_data(self, pkt: MrcPacket, now: int, ecn: bool, port: int, out: list[Datagram]) -> None:
        self.on_write(
            (pkt.psn, pkt.ackreq, pkt.va, pkt.rkey, pkt.dma_len, pkt.imm, pkt.flags, pkt.ev_index, pkt.msn,
             pkt.msg_len, pkt.timestamp_ns, pkt.payload), now, ecn, port, out,
        )

    def on_write(self, f: WriteFields, now: int, ecn: bool, port: int, out: list[Datagram]) -> None:
        """A data packet: `f` as `parse_write` gives it, the fields of `MrcPacket` of those names (`n` its
        dma_len). One tuple, not sixteen arguments: unpacking it costs less than binding a star-call."""
        psn, ackreq, va, rkey, n, imm, flags, ev, msn, mlen, ts, payload = f
        c = self.c
        d = (psn - self.rcv_cum) & PSN_MASK
        if d >= _HALF:  # below the cumulative point: an old duplicate
            c["stale_rx"] += 1
            self.ctx.drop(EngineDrop.STALE)
            self._sack(now, out, psn, ev, ts, _S_DUP, 0, port)
            return
        if d >= self.Wd:
            c["oow_rx"] += 1
            self.ctx.drop(EngineDrop.OUT_OF_WINDOW)
            self._nack(out, psn, ev, ts, NackCode.OUT_OF_WINDOW, port)
            return
        bit = 1 << d
        rbits = self.rbits
        if rbits & bit:
            c["dup_rx"] += 1
            self.ctx.drop(EngineDrop.DUPLICATE)
            self._sack(now, out, psn, ev, ts, _S_DUP, 0, port)
            return
        if flags & _TRIMMED:
            c["trim_rx"] += 1
            if self.attr.trim_nack:
                self._nack(out, psn, ev, ts, NackCode.TRIMMED, port)
            return
        mr = self.mrs.get(rkey)
        if mr is None or not mr.remote_write:
            c["bad_rkey_rx"] += 1
            self.ctx.drop(EngineDrop.BAD_RKEY)
            self._nack(out, psn, ev, ts, NackCode.BAD_RKEY, port)
            return
        off = va - mr.addr
        if off < 0 or off + n > mr.length:
            c["bad_va_rx"] += 1
            self.ctx.drop(EngineDrop.BAD_VA)
            self._nack(out, psn, ev, ts, NackCode.BAD_VA, port)
            return
        m = self.msgs.get(msn)
        if imm is not None and (m is None or m[1] is None):  # this message's immediate, first time
            if len(self.recv_q) <= self.imm_reserved or self.imm_reserved >= self.attr.max_wimm_dest:
                # no posted receive left, or max_wimm_dest immediates in progress: not ready (RNR)
                c["no_recv_buffer_rx"] += 1
                self.ctx.drop(EngineDrop.NO_RECV_BUFFER)
                self._nack(out, psn, ev, ts, NackCode.NO_RECV_BUFFER, port)
                return
            self.imm_reserved += 1
            c["imm_rx"] += 1
        mr.view[off : off + n] = payload
        # PSN accounting
        rbits |= bit
        if d == 0:
            t = (rbits ^ (rbits + 1)).bit_length() - 1
            rbits >>= t
            self.rcv_cum = (self.rcv_cum + t) & PSN_MASK
        self.rbits = rbits
        self.rx_packets += 1
        self.rx_bytes += n
        # message accounting (completion of WRITE-with-immediate when every byte is placed)
        if m is None:
            if n >= mlen and imm is None:
                pass  # single-packet plain WRITE: nothing to track
            else:
                msgs = self.msgs
                if len(msgs) >= self.max_rx_msgs:
                    self._evict_oldest_msg()
                m = msgs[msn] = [n, imm, mlen, -1]
                if self.gc_at == NEVER:
                    self.gc_at = now + self.attr.rx_msg_timeout_ns
                    if self.gc_at < self.aux_deadline:
                        self.aux_deadline = self.gc_at
        else:
            m[0] += n
            if imm is not None:
                m[1] = imm
        if m is not None and m[0] >= m[2]:
            del self.msgs[msn]
            if not self.msgs:  # nothing left to sweep
                self.gc_at = NEVER
                if not self.rnr:
                    self.aux_deadline = NEVER
            if m[1] is not None:
                self.imm_reserved -= 1
                wr_id = self.recv_q.popleft()
                wc = WorkCompletion(
                    wr_id, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, self.qpn, m[2], m[1]
                )
                self._complete(self.recv_cq, wc, now)
        # acknowledgement policy
        if ecn:
            c["ecn_rx"] += 1
        u = self.unacked + 1
        if ecn or ackreq or u >= self.ack_coalesce or flags & (_ACK_NOW | _RETX):
            ef = (_CE if ecn else 0) | (_S_RETX if flags & _RETX else 0)
            self._sack(now, out, psn, ev, ts, ef, 0, port)
        else:
            self.unacked = u
            self.last_rx = (psn, ev, ts, 0, now, port)
            if self.ack_deadline == NEVER:
                self.ack_deadline = now + self.attr.ack_delay_ns

    def _forget_msg(self, msn: int) -> None:
        m = self.msgs.pop(msn)
        if m[1] is not None:
            self.imm_reserved -= 1  # its immediate had reserved a posted receive

    def _evict_oldest_msg(self) -> None:
        """At max_rx_msgs incomplete messages, the oldest is forgotten (a genuine requester never has
        more open than its MPR window, so this happens only to abandoned or injected ones)."""
        self.c["rx_msg_evicted"] += 1
        self._forget_msg(next(iter(self.msgs)))

    def _sweep_msgs(self, now: int) -> None:
        """Forget incomplete messages that placed no byte since the previous sweep (a whole
        rx_msg_timeout_ns: their requester gave up or never existed), releasing their reservations."""
        for msn, m in list(self.msgs.items()):
            if m[3] == m[0]:
                self.c["rx_msg_expired"] += 1
                self._forget_msg(msn)
            else:
                m[3] = m[0]
        if self.msgs:
            self.gc_at = now + self.attr.rx_msg_timeout_ns

    def _sack(
        self, now: int, out: list[Datagram], psn: int, ev: int, ts: int, eflags: int, svc: int, port: int
    ) -> None:
        bm = self.rbits >> 1
        words = (bm.bit_length() + 63) >> 6 or 1
        buf = bytearray(_SACK_BASE + 8 * words)
        paths = self.paths
        # a duplicate says an earlier acknowledgement was lost: this one goes on the next path in turn
        cev = paths.ctl_ev(port, -1 if eflags & _S_DUP else ev)
        build_sack(
            buf, self.tx_icrc, dqpn=self.peer_qpn, psn=psn, ev_index=cev, cum_psn=self.rcv_cum,
            echo_ev_index=ev, echo_timestamp_ns=ts, bitmap=bm, words=words, echo_flags=eflags,
            service_time_ns=svc, timestamp_ns=now,
        )
        self.unacked = 0
        self.ack_coalesce = self.ack_coalesce_sum - self.ack_coalesce  # the next run: the other length
        self.ack_deadline = NEVER
        self.c["sack_tx"] += 1
        out.append(Datagram(buf, paths.ev_port[cev], cev, self.peer_gid))

    def _nack(self, out: list[Datagram], psn: int, ev: int, ts: int, code: int, port: int) -> None:
        buf = bytearray(_NACK_SIZE)
        cev = self.paths.ctl_ev(port, ev)
        build_nack(
            buf, self.tx_icrc, dqpn=self.peer_qpn, psn=psn, ev_index=cev, code=code,
            echo_ev_index=ev, cum_psn=self.rcv_cum, echo_timestamp_ns=ts,
        )
        self.c["nack_tx"] += 1
        out.append(Datagram(buf, self.paths.ev_port[cev], cev, self.peer_gid))

    def on_probe(self, pkt: MrcPacket, now: int, port: int, out: list[Datagram]) -> None:
        b = pkt.body
        assert b is not None
        enabled = self.ctx.port_enabled
        if port < len(enabled) and not enabled[port]:
            # an administratively disabled port answers nothing: the peer's probes of it must fail,
            # as they would on hardware, so that its view of the port agrees with our PORT_STATUS
            self.ctx.drop(EngineDrop.PORT_DISABLED)
            return
        self.c["probe_rx"] += 1
        buf = bytearray(_PROBE_REPLY_SIZE)
        cev = self.paths.ctl_ev(port, pkt.ev_index)  # the probed path back, when it is GOOD here
        build_probe_reply(
            buf, self.tx_icrc, dqpn=b.reply_qpn, ev_index=cev, request_id=b.request_id,  # type: ignore[union-attr]
            echo_ev_index=pkt.ev_index, echo_timestamp_ns=pkt.timestamp_ns, service_time_ns=0,
            flags=_SVC_VALID if self.attr.svc_time else 0, timestamp_ns=now,
        )
        out.append(Datagram(buf, self.paths.ev_port[cev], cev, self.peer_gid))

    # ================================================================== port status

    def push_port_status(self, port: int, up: bool, epoch: int, now: int, out: list[Datagram]) -> None:
        """Tell the peer that our plane `port` went down / came up (sent on a port that is up)."""
        paths = self.paths
        via = [p for p in range(paths.nports) if p != port and paths.port_evs[p]] or [port]
        ev = paths.ctl_ev(via[0])
        buf = bytearray(_PORT_STATUS_SIZE)
        build_port_status(
            buf, self.tx_icrc, dqpn=self.peer_qpn, ev_index=ev, request_id=epoch & 0xFFFF, port=port,
            state=int(PortState.UP if up else PortState.DOWN), epoch=epoch, timestamp_ns=now,
        )
        out.append(Datagram(buf, via[0], ev, self.peer_gid))

    def on_port_status(self, pkt: MrcPacket, now: int) -> None:
        """The peer's plane port changed state: stop (or resume) spraying toward it. Epochs compare in
        32-bit serial-number arithmetic (RFC 1982): one not newer than the last seen for that port is
        stale. EVs the controller DENIED stay DENIED when the port comes back. A port reported down is
        still probed now and then (`PathSet.peer_port`): a forged DOWN, or a lost UP, heals when the
        probes are answered."""
        b = pkt.body
        assert b is not None
        port, state, epoch = b.port, b.state, b.epoch  # type: ignore[union-attr]
        paths = self.paths
        if port >= paths.nports:
            self._unmatched(EngineDrop.PORT_STATUS_BAD_PORT)
            return
        last = paths.peer_epoch.get(port)
        if last is not None and not 0 < (epoch - last) & 0xFFFFFFFF < 1 << 31:
            self.ctx.drop(EngineDrop.PORT_STATUS_STALE)
            return
        paths.peer_epoch[port] = epoch
        self.c["port_status_rx"] += 1
        paths.peer_port(port, state == PortState.UP, now)

    # ================================================================== introspection

    def stats(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.c)
        d.update(
            data_tx=self.serial,
            data_tx_bytes=self.tx_bytes,
            data_rx=self.rx_packets,
            data_rx_bytes=self.rx_bytes,
            qpn=self.qpn,
            state=self.state.name,
            snd_una=self.snd_una & PSN_MASK,
            snd_nxt=self.snd_nxt & PSN_MASK,
            rcv_cum=self.rcv_cum,
            inflight=self.inflight,
            cwnd=self.cc.cwnd,
            srtt_ns=self.srtt,
            min_rtt_ns=self.min_rtt if self.min_rtt != NEVER else None,
            max_outstanding=self.max_outstanding,
            max_trim_recovery_ns=self.max_trim_recovery_ns,
            ev_marked_bad=self.paths.marked_bad,
            ev_losses=self.paths.losses,
            port_bytes=list(self.paths.port_bytes),
        )
        return d
