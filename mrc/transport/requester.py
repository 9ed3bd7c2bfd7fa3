"""The requester side of a queue pair: transmission, and the feedback that acknowledges or refuses it.

`send` drains the retransmission queue and then the posted WRITEs within the congestion and MPR windows
(`_send_new` is the per-packet hot loop, `_retransmit` resends one PSN on another EV); `on_sack`
acknowledges, completes WRITEs, steers EVs from the echoed ECN and delay, and feeds the congestion
control and `recovery.Recovery`; `on_nack` handles trims, out-of-window, receiver-not-ready (`_rnr`) and
the fatal codes; `on_probe_reply` returns probe results to the path set. `_own_slot` is the check that
every piece of feedback names a transmission of ours. A mixin over `qpcore.QpCore`'s state, built on
`recovery.Recovery`, whose estimators and loss detection it drives.
"""

from __future__ import annotations

from typing import Final

from mrc.wire.consts import FATAL_NACK_CODES, PSN_MASK, PSN_MOD, MxhFlag, NackCode
from mrc.wire.control import Sack
from mrc.wire.packet import MrcPacket, write_packet

from .drops import EngineDrop
from .paths import ASSUMED_BAD as _ASSUMED_BAD
from .qpcore import _ACKED, _CE, _HALF, _INFLIGHT, _LOST, _RETX, _RTS, _S_DUP, _SVC_VALID, NEVER, Datagram
from .recovery import Recovery
from .verbs import MPR_UNIT, SendWr, WcStatus, WorkCompletion

_ACKED_RUNS: Final = [[_ACKED] * k for k in range(8 * 128 + 1)]
_FIRST: Final = int(MxhFlag.FIRST)
_LAST: Final = int(MxhFlag.LAST)
_new_tuple: Final = tuple.__new__


class Requester(Recovery):
    """Sending, and the requester's side of SACK, NACK and probe replies (see the module docstring)."""

    __slots__ = ()

    # ================================================================== transmit

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
            if sent and inflight and self.snd_nxt < self.snd_una + self.wlim:
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
        if self.oow_q:
            self._release_refused()
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
            if sent and self.inflight and self.snd_nxt < self.snd_una + self.wlim:
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
            fast = self.fast
            if not (fast(self, wr, now, out) if fast is not None else self._send_new(wr, now, out)):
                return

    def _send_new(self, wr: SendWr, now: int, out: list[Datagram]) -> bool:
        """First transmissions of `wr` (the hot path, one tight loop). False when a window is full."""
        W = self.W
        mtu = self.mtu
        psn = self.snd_nxt
        una = self.snd_una
        limit = una + self.wlim
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
        if ack_floor and every >= ack_floor:  # the responder's coalescing already acknowledges often enough
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
        prev_ev = self.tx_ev[slot]
        ev = paths.other_ev(prev_ev)
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
        old_ev = self.tx_old_ev
        times = old.get(psn)
        if times is None:
            if len(old) >= 2 * self.W:  # forget PSNs whose slots were reused
                floor = self.snd_nxt - self.W
                for p in [p for p in old if p < floor]:
                    del old[p]
                    old_ev.pop(p, None)
            times = old[psn] = []
            old_ev[psn] = []
        times.append(self.tx_time[slot])
        old_ev[psn].append(prev_ev)
        self.tx_time[slot] = now
        self.serial = s = self.serial + 1
        self.tx_serial[slot] = s
        self.tx_retx[slot] = True
        self.rtxq.append((psn, s))
        self.inflight += n
        port = paths.ev_port[ev]
        paths.port_bytes[port] += n
        self.tx_bytes += n
        self.retx_bytes += n
        if self.rto_deadline == NEVER:
            self.rto_deadline = now + self._rto_interval()
        out.append(Datagram(buf, port, ev, self.peer_gid))
        return True

    # ================================================================== validation

    def _abs_psn(self, wire_psn: int) -> int:
        """The PSN (not wrapped) that a 24-bit PSN from the wire names, within half the space of snd_una."""
        rel = (wire_psn - self.snd_una) & PSN_MASK
        return self.snd_una + (rel - PSN_MOD if rel >= _HALF else rel)

    def _sent_on(self, own: int, psn: int, ts: int) -> int:
        """The EV the transmission `_own_slot` found (`own`, of `psn` sent at `ts`) went on."""
        if own >= 0:
            return self.tx_ev[own]
        sent = self.tx_old.get(psn, [])
        return self.tx_old_ev[psn][sent.index(ts)] if ts in sent else -1

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

    # ================================================================== feedback

    def on_sack(self, pkt: MrcPacket, now: int) -> None:
        s = pkt.body
        assert isinstance(s, Sack)
        self.sack_rx(pkt.psn, s, now)

    def sack_rx(self, psn: int, s: Sack, now: int) -> None:
        """A SACK for PSN `psn` (BTH) with body `s`: all `on_sack` reads of the packet, so that the fast
        paths (fastpath.py, _fastc.c) give it what they parsed without building an `MrcPacket`."""
        self.parked = False
        c = self.c
        # A genuine SACK echoes the PSN and send timestamp of the packet that triggered it: one that
        # names no transmission of ours is stray or forged and acknowledges nothing.
        ts = s.echo_timestamp_ns - self.ts_off
        own = self._own_slot(psn, ts)
        if own == -1:
            self._unmatched(EngineDrop.SACK_UNMATCHED)
            return
        c["sack_rx"] += 1
        paths = self.paths
        # the transmission that triggered it was delivered: when its EV was retired by the loss of it
        # (or of one sent before it), that call was wrong (paths.refute)
        e = s.echo_ev_index
        if e < paths.n and paths.state[e] == _ASSUMED_BAD and self.ev_refute:
            p = self._abs_psn(psn)
            if self._sent_on(own, p, ts) == e:
                paths.refute(e, ts, p, now)
        # a second copy of that PSN arrived: when we had sent it more than once, one of those
        # transmissions was not needed
        if s.echo_flags & _S_DUP and self.tx_retx[own if own >= 0 else -2 - own]:
            c["retx_spurious"] += 1
            p = self._abs_psn(psn)
            if self.rack_lost:
                self._rack_refuted(p, now)
            if own >= 0 and self.ev_refute:  # this copy came second: the earlier one (if one) came first
                sent = self.tx_old.get(p)
                if sent is not None and len(sent) == 1:
                    paths.refute(self.tx_old_ev[p][0], sent[0], p, now)
        una = self.snd_una
        outstanding = self.snd_nxt - una
        rel = (s.cum_psn - una) & PSN_MASK
        if rel >= _HALF:
            rel -= PSN_MOD
        if rel > outstanding:
            self.ctx.drop(EngineDrop.SACK_AHEAD)
            return
        acked = 0
        if outstanding:
            bm = s.bitmap
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
                        if self.same_port_rack:
                            self._rack_run(s0, s1)
                        newly = 0
                rack_ser = self.rack_ser if newly and self.same_port_rack else None
                ev_port = self.paths.ev_port
                fast_acks = self.fast_acks
                while newly:
                    if fast_acks is not None:  # the C path: the same loop up to the next LOST slot
                        newly, inflight, acked, las = fast_acks(
                            self, newly, una, inflight, acked, las, rack_ser, ev_port
                        )
                        if not newly:
                            break
                    low = newly & -newly
                    slot = (una + low.bit_length() - 1) % W
                    newly ^= low
                    st = tx_state[slot]
                    n = tx_len[slot]
                    if st == _INFLIGHT:
                        inflight -= n
                    elif st == _LOST:
                        spurious += 1
                        q = una + low.bit_length() - 1
                        if self.rack_lost:
                            self._rack_refuted(q, now)
                        if not self.tx_retx[slot] and self.ev_refute:  # not sent again: the one copy arrived
                            self.paths.refute(self.tx_ev[slot], self.tx_time[slot], q, now)
                    tx_state[slot] = _ACKED
                    acked += n
                    ser = tx_serial[slot]
                    if ser > las:
                        las = ser
                    if rack_ser is not None:
                        port = ev_port[self.tx_ev[slot]]
                        if ser > rack_ser[port]:
                            rack_ser[port] = ser
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
                self.nack_retx_mark = c["retx_trim"] + c["retx_nack"]
                self.rto_deadline = now + self.ack_timeout if self.snd_nxt != una else NEVER
        # per-EV steering from the echo of the triggering packet
        ecn = bool(s.echo_flags & _CE)
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
        svc = s.service_time_ns
        # a send time of ours (_own_slot); one at exactly 0 is not sampled (docs: Time); a service time
        # longer than the whole round trip is a wrong one (a peer's clock or a forged field): no sample,
        # where a sample clamped to 0 pinned the QP's and the port's minimum RTT to 0 for good
        if 0 < ts <= now and svc <= now - ts:
            rtt = now - ts - svc
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
                fast_rtt = self.fast_rtt
                if fast_rtt is None or not fast_rtt(self, rtt, port, self.same_port_rack):
                    self._rtt_sample(rtt, port)
                    if self.same_port_rack:
                        self._rack_sample(rtt, port)
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
        else:  # OUT_OF_WINDOW: resend once it is inside the peer's window, no path blame
            c["retx_nack"] += 1
            self._refused(psn, slot, (pkt.psn - b.cum_psn) & PSN_MASK)  # type: ignore[union-attr]

    def _refused(self, psn: int, slot: int, ahead: int) -> None:
        """PSN `psn` was refused as out of the responder's window, `ahead` PSNs past the responder's
        cumulative point: its window is at most that, a multiple of MPR_UNIT (a peer whose mpr_dest is
        below our mpr). New transmissions keep to it from now on (`wlim`), and the PSN waits in
        `oow_q` until it is inside it. Resending at once, as before, was refused again and again: a
        responder window of 128 against 1,024 gave 3,530 NACKs and 101 EVs retired for one 4 MiB
        WRITE (the refusals ended as SACK holes, blamed on the paths)."""
        if MPR_UNIT <= ahead < self.wlim:
            self.wlim = ahead - ahead % MPR_UNIT
        self.tx_state[slot] = _LOST
        self.inflight -= self.tx_len[slot]
        self.oow_q.append(psn)

    def _release_refused(self) -> None:
        """Move the refused PSNs now inside the window (the responder's cumulative point moved) to the
        retransmission queue; those still outside wait."""
        limit = self.snd_una + self.wlim
        keep = [p for p in self.oow_q if p >= limit]
        if len(keep) < len(self.oow_q):
            self.retx_q.extend(sorted(p for p in self.oow_q if p < limit))
            self.oow_q.clear()
            self.oow_q.extend(keep)

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
        good = self.paths.good_count
        if not self.paths.probe_reply(b.request_id, b.echo_ev_index, ts, now - ts - svc, now):  # type: ignore[union-attr]
            self._unmatched(EngineDrop.PROBE_REPLY_UNMATCHED)
            return
        self.c["probe_reply_rx"] += 1
        if self.paths.good_count > good and self.state == _RTS:
            self._path_back(now)
