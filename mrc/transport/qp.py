"""The MRC queue pair: requester (spraying, SACK/NACK processing, loss detection, timers) and responder
(self-placing writes, SACK generation, immediates, probe replies) in one object, as in RC.

Module layout: `QueuePair` here is the public class, and holds the verbs (`connect`, `modify`,
`post_send`, `post_recv`, reconfiguration), the timer entry point (`deadline`, `on_timer`, the aux timer
that serves both sides) and `stats`. The rest is composed into it as mixins over one state:
`qpcore.QpCore` (the slots, the constructor, completions and the move to ERROR), `requester.Requester`
(transmission and the requester's feedback), `recovery.Recovery` (RTT, loss detection, ACK timeout) and
`responder.Responder` (placement, acknowledgement, probes, port status). `NEVER` and `Datagram` are
importable from here as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from mrc.wire.consts import MAX_PAYLOAD, PSN_MASK
from mrc.wire.packet import build_probe

from .cc import NsccConfig
from .paths import EvProfile
from .qpcore import _LOST, _PROBE_SIZE, _RTS, NEVER, Datagram
from .requester import Requester
from .responder import Responder
from .verbs import (
    MemoryRegion,
    QpAttr,
    QpHint,
    QpState,
    QueueFull,
    SendWr,
    WcOpcode,
    WcStatus,
    WorkCompletion,
)

_SVC_MAX: Final = 0xFFFFFFFF  # the SACK's 32-bit service time field

__all__ = ["NEVER", "Datagram", "QueuePair"]

# modify_qp: the states each state may move to (RC QPs as ibv_modify_qp has them, without SQD/SQE)
_TRANSITIONS: Final = {
    QpState.RESET: (QpState.RESET, QpState.INIT, QpState.ERROR),
    QpState.INIT: (QpState.RESET, QpState.INIT, QpState.RTR, QpState.ERROR),
    QpState.RTR: (QpState.RESET, QpState.RTS, QpState.ERROR),
    QpState.RTS: (QpState.RESET, QpState.RTS, QpState.ERROR),
    QpState.ERROR: (QpState.RESET, QpState.ERROR),
}


class QueuePair(Requester, Responder):
    """A reliable, multipath queue pair. Create with `Context.create_qp`, then `connect`."""

    __slots__ = ()  # the state's slots are `QpCore`'s: no instance dict

    # ================================================================== verbs

    def connect(self, remote_gid: bytes, remote_qpn: int, rq_psn: int | None = None,
                path_mtu: int | None = None) -> None:
        """RESET/INIT -> RTR -> RTS in one call: bind the QP to its peer (GID, QPN) and the PSN the peer
        starts at (default: our own initial PSN, as the loopback harness configures both ends alike).
        `path_mtu`, the peer's payload per packet (its QP's `mtu`, exchanged with the QPN, as RC QPs
        set IBV_QP_PATH_MTU at RTR): when smaller than ours, ours becomes it, so that packets sized
        for our ports are not dropped at a peer whose ports take less."""
        if self.state not in (QpState.RESET, QpState.INIT):
            raise ValueError(f"connect in state {self.state.name}")
        if path_mtu is not None:
            bad = isinstance(path_mtu, bool) or not isinstance(path_mtu, int)
            if bad or not 64 <= path_mtu <= MAX_PAYLOAD:
                raise ValueError(f"QP {self.qpn:#x}: path_mtu must be 64..{MAX_PAYLOAD}, got {path_mtu!r}")
            if path_mtu < self.mtu:
                cc = self.cc_spec
                if isinstance(cc, NsccConfig):
                    cc = cc.with_mtu(self.mtu, path_mtu)
                self.reconfigure(dataclasses.replace(self.attr, mtu=path_mtu), self.paths.profile, cc,
                                 self.hint)
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
        self._reset_tx(W)
        self.ack_timeout = attr.ack_timeout_ns
        self.port_thr = [attr.ack_timeout_ns] * self.paths.nports
        self.reo_extra = attr.reorder_ns + attr.ack_delay_ns
        self._reset_rack(self.paths.nports)

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
        if len(self.wrs_out) >= self.attr.max_send_wr:
            raise QueueFull(f"QP {self.qpn:#x}: send queue full ({self.attr.max_send_wr} WRs posted and not "
                            f"completed, max_send_wr)")
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
        if len(self.recv_q) >= self.attr.max_recv_wr:
            raise QueueFull(f"QP {self.qpn:#x}: receive queue full ({self.attr.max_recv_wr} receives posted "
                            f"and not consumed, max_recv_wr)")
        self.recv_q.append(wr_id)

    @property
    def deadline(self) -> int:
        """The earliest timer `on_timer` acts on in this state. Outside RTS that is the responder's
        two (the delayed ACK, the sweep of incomplete messages): the requester's (loss, RTO, probes)
        wait for RTS, since a deadline that is due but not acted on would be due forever and turn a
        driver's loop into a busy spin (an RTR responder's sweep, a controller's probe of an RTR QP)."""
        d = self.ack_deadline
        if self.aux_deadline < d:
            d = self.aux_deadline
        if self.state is not _RTS:
            return d
        if self.rto_deadline < d:
            d = self.rto_deadline
        if self.loss_deadline < d:
            d = self.loss_deadline
        p = self.paths.next_probe_deadline
        return p if p < d else d

    @property
    def busy(self) -> bool:
        """True while sends are queued, in flight, or awaiting acknowledgement."""
        return self.state == QpState.RTS and (bool(self.wrs_out) or self.snd_nxt != self.snd_una)

    # ================================================================== timers

    def on_timer(self, now: int, out: list[Datagram]) -> None:
        self.parked = False
        if self.ack_deadline <= now:
            self.ack_deadline = NEVER
            if self.unacked:
                psn, ev, ts, flags, t, port = self.last_rx
                # the SACK's service time is 32 bits: a driver that calls late (> 4.3 s) gets the most
                self._sack(now, out, psn, ev, ts, flags, min(now - t, _SVC_MAX), port)
        if self.state is not _RTS:
            if self.aux_deadline <= now:
                self._on_aux(now)  # an RTR responder sweeps its incomplete messages too
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

    # ================================================================== introspection

    def stats(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.c)
        d.update(
            data_tx=self.serial,
            data_tx_bytes=self.tx_bytes,
            data_retx_bytes=self.retx_bytes,
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
            ev_refuted=self.paths.refuted,
            ev_events_dropped=self.paths.events_dropped,
            probe_results_dropped=self.paths.probe_results_dropped,
            port_bytes=list(self.paths.port_bytes),
        )
        return d
