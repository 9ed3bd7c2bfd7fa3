"""The responder side of a queue pair: placement of incoming WRITEs, acknowledgement and control replies.

`on_write` (and `on_data` for a parsed packet) checks a data packet against the receive window, the
memory regions and the posted receives, places its payload, tracks the PSN bitmap and the messages
still incomplete (`_forget_msg`, `_evict_oldest_msg` and `_sweep_msgs` bound them), completes a
WRITE-with-immediate when its last byte is placed, and acknowledges under the coalescing policy
(`_sack`) or refuses (`_nack`). `on_probe` answers the peer's path probes; `push_port_status` and
`on_port_status` carry plane port state between the peers. A mixin over `qpcore.QpCore`'s state: it
shares nothing with the requester but the counters, the path set and the completion path.
"""

from __future__ import annotations

from typing import Final

from mrc.wire.consts import PSN_MASK, MxhFlag, NackCode, PortState, SackFlag
from mrc.wire.packet import (
    MrcPacket,
    WriteFields,
    build_nack,
    build_port_status,
    build_probe_reply,
    build_sack,
)

from .drops import EngineDrop
from .qpcore import (
    _CE,
    _HALF,
    _NACK_SIZE,
    _PORT_STATUS_SIZE,
    _PROBE_REPLY_SIZE,
    _RETX,
    _S_DUP,
    _SACK_BASE,
    _SVC_VALID,
    NEVER,
    Datagram,
    QpCore,
)
from .verbs import WcOpcode, WcStatus, WorkCompletion

_ACK_NOW: Final = int(MxhFlag.ACK_REQ_NOW)
_TRIMMED: Final = int(MxhFlag.TRIMMED)
_S_RETX: Final = int(SackFlag.RETX)


def _dup_flags(ecn: bool, flags: int) -> int:
    """The echo flags of the SACK that answers a duplicate or stale data packet: DUPLICATE, and like
    every SACK's echo, the triggering packet's own ECN-CE and RETX (docs/wire.md)."""
    return _S_DUP | (_CE if ecn else 0) | (_S_RETX if flags & _RETX else 0)


class Responder(QpCore):
    """Placement, acknowledgement, probe replies and port status (see the module docstring)."""

    __slots__ = ()

    # ================================================================== data packets

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
            self._sack(now, out, psn, ev, ts, _dup_flags(ecn, flags), 0, port)
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
            self._sack(now, out, psn, ev, ts, _dup_flags(ecn, flags), 0, port)
            return
        if flags & _TRIMMED:
            c["trim_rx"] += 1
            if self.attr.trim_nack:
                self._nack(out, psn, ev, ts, NackCode.TRIMMED, port)
            return
        mr = None
        off = 0
        if n:  # as in IB RC, a packet that places nothing has its R_Key and VA unchecked: a zero-length
            # WRITE-with-immediate (an "immediate only" post, R_Key and VA 0) is ordinary
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
        if mr is not None:
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
        if not eflags & _S_DUP:
            self.unacked = 0
            self.ack_coalesce = self.ack_coalesce_sum - self.ack_coalesce  # the next run: the other length
            self.ack_deadline = NEVER
        # else: the answer to a stale or duplicate packet echoes that packet, which anyone can send (its
        # R_Key is not checked first): a requester that never sent it discards the whole SACK, so the
        # packets waiting for an acknowledgement still get theirs from the ACK policy
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
