"""Loss recovery of a queue pair: the RTT estimators, RACK-style loss detection and the ACK timeout.

The requester's clock-driven half, kept apart from transmission as aioquic keeps `quic/recovery.py`
apart from `quic/connection.py`: `_rtt_sample` folds a SACK's RTT into the QP-wide and per-plane
estimators (the per-plane ones set each port's reordering threshold), `_detect_losses` declares a
transmission lost once a later one is acknowledged and it has been out longer than its port's threshold
(the cross-port rule, or the sooner same-port rule fed by `_rack_sample` / `_rack_run`; it arms the loss
timer for the next candidate), `_lost` queues a PSN for retransmission, and
`_rto_interval` / `_on_rto` run the ACK timeout: linear then exponential backoff, and the retry budget
whose end is ERROR.
A mixin over `qpcore.QpCore`'s state: the requester calls these on every SACK, at no extra cost.
"""

from __future__ import annotations

from .qpcore import _INFLIGHT, _LOST, NEVER, QpCore
from .verbs import EXP_CNT_INFINITE, WcStatus

#: RTT samples of a port without a spurious loss after which its same-port reordering window halves
RACK_CALM = 256
#: holes not yet due that loss detection passes over per call looking for ones due sooner (same-port)
RACK_LOOKAHEAD = 64


class Recovery(QpCore):
    """RTT estimation, loss detection and the ACK timeout (see the module docstring)."""

    __slots__ = ()

    # ================================================================== RTT

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

    # ================================================================== loss detection

    def _rack_sample(self, rtt: int, port: int) -> None:
        """An RTT sample of `port` (the SACK's echo). Each port's same-port threshold is its own
        latest RTT or, when later, its base RTT + the excess over base this sample shows (a stalled
        host delays every port's acknowledgements alike, and a port's own latest sample may predate
        the stall), + its reordering window. RACK_CALM samples without a spurious loss halve the
        window back towards its base."""
        calm = self.rack_calm[port] + 1
        if calm >= RACK_CALM:
            calm = 0
            reo = self.rack_reo[port] >> 1
            self.rack_reo[port] = reo if reo > self.reo_extra else self.reo_extra
        self.rack_calm[port] = calm
        self.rack_rtt[port] = rtt
        pmin = self.port_min_rtt
        excess = rtt - pmin[port]
        rack_rtt, rack_reo, rack_thr = self.rack_rtt, self.rack_reo, self.rack_thr
        for p in range(len(rack_thr)):
            base = pmin[p]
            if base == NEVER:
                continue
            est = base + excess
            r = rack_rtt[p]
            rack_thr[p] = (r if r > est else est) + rack_reo[p]

    def _rack_run(self, s0: int, s1: int) -> None:
        """Slots s0..s1-1 were acknowledged in one run: raise each port's latest acknowledged serial.
        Scanned from the end, stopping once every port was seen: first transmissions are in serial
        order, and a retransmission's higher serial missed this way only leaves the evidence lower
        (the rule more patient), never higher than the truth."""
        rack_ser, ev_port, tx_ev, tx_serial = self.rack_ser, self.paths.ev_port, self.tx_ev, self.tx_serial
        every = (1 << len(rack_ser)) - 1
        seen = 0
        j = s1
        while j > s0 and seen != every:
            j -= 1
            port = ev_port[tx_ev[j]]
            bit = 1 << port
            if seen & bit:
                continue
            seen |= bit
            ser = tx_serial[j]
            if ser > rack_ser[port]:
                rack_ser[port] = ser

    def _rack_declared(self, psn: int, port: int, now: int) -> None:
        """The same-port rule declared `psn` (sent on `port`) lost at `now`: remembered until it is
        acknowledged, so that a spurious call widens that port's window (bounded by the window W:
        entries below snd_una are dropped when it is full)."""
        lost = self.rack_lost
        if len(lost) >= self.W:
            una = self.snd_una
            for q in [q for q in lost if q < una]:
                del lost[q]
        lost[psn] = (port, now)

    def _rack_refuted(self, psn: int, now: int) -> None:
        """`psn` turned out not lost (acknowledged while marked lost, or a second copy arrived): the
        packets of its port reorder more than the window allows. The window grows by how much later
        than the call the proof came (at least its base, reorder_ns + ack_delay_ns), at most once per
        smoothed RTT of the port, up to the ACK timeout: one episode of reordering yields a burst of
        such proofs, which is one piece of evidence (RACK's reo_wnd also grows per round trip with
        DSACKs, RFC 8985 6.2)."""
        entry = self.rack_lost.pop(psn, None)
        if entry is None:
            return
        self.c["same_port_refuted"] += 1
        port, called = entry
        if now < self.rack_bump[port]:
            return
        self.rack_bump[port] = now + self.port_srtt[port]
        old = self.rack_reo[port]
        late = now - called
        reo = old + (late if late > self.reo_extra else self.reo_extra)
        if reo > self.ack_timeout:
            reo = self.ack_timeout
        self.rack_reo[port] = reo
        self.rack_calm[port] = 0
        if self.rack_thr[port] != NEVER:
            self.rack_thr[port] += reo - old

    def _detect_losses(self, now: int) -> None:
        """RACK-style, two rules. Cross-port: a packet is lost when one sent after it (on any port) was
        acknowledged and it has been out longer than srtt + 4 rttvar + reorder_ns + ack_delay_ns of its
        port. Same-port (`same_port_rack`): once one sent after it on its own port was acknowledged,
        it is lost when it has been out longer than the port's current RTT (its latest sample, or its
        base RTT + the excess over base that the latest sample of any port shows: a stalled host
        delays every acknowledgement alike) + the port's reordering window, if that is sooner. A port
        is one FIFO from the engine to the wire and one plane of equal-length paths, so its packets
        reorder only by the spines' queue differences; the variance margin, which on a jittery host
        (a software engine sharing CPUs) is milliseconds, is not needed to tell a dead path from a
        late packet there. EVs being steered away from (penalised: ECN, trims or delay) are left to
        the cross-port rule: a slow path lags the rest of its port by design. The window adapts:
        widened by the same-port rule's refuted calls on the port (at most once per RTT), halved back
        after RACK_CALM RTT samples without one.

        First transmissions go out in PSN order, so a pointer walks them once (everything below snd_una
        is acknowledged and skipped in one step), passing over at most RACK_LOOKAHEAD holes not yet due
        per call with the same-port rule (a hole on another port, whose threshold is the cross-port
        one, would otherwise hold back one due sooner); retransmissions are examined in send order
        from their own queue. Either way the work per call is bounded."""
        W = self.W
        una = self.snd_una
        nxt = self.snd_nxt
        las = self.latest_acked_serial
        ev_port = self.paths.ev_port
        tx_serial, tx_state, tx_ev = self.tx_serial, self.tx_state, self.tx_ev
        tx_retx = self.tx_retx
        deadline = NEVER
        p = self.rack_next
        if p < una:
            p = una
        # holes not yet due are passed over, up to RACK_LOOKAHEAD of them with the same-port rule (the
        # pointer stays at the first): a hole behind one of another port may be due sooner by this
        # rule; past the first, only this rule declares (the cross-port one keeps its PSN order)
        stop = -1
        ahead = RACK_LOOKAHEAD if self.same_port_rack else 0
        scan = self.fast_losses
        while p < nxt:
            if scan is not None:  # the C path: this loop's walk up to the next PSN it declares lost
                p, stop, ahead, deadline, code = scan(self, p, las, stop, ahead, deadline, now)
                if code == 0:
                    break
                if code < 0:  # state the C walk does not read: this loop from p
                    scan = None
                    continue
                slot = p % W
                port = ev_port[tx_ev[slot]]
                rack = code == 2
            else:
                slot = p % W
                if tx_state[slot] != _INFLIGHT or tx_retx[slot]:
                    p += 1  # acknowledged, already lost, or watched by the retransmission queue
                    continue
                ser = tx_serial[slot]
                if ser > las:
                    break
                port, rack, t = self._due(slot, ser)
                if t > now or (stop >= 0 and not rack):
                    if now < t < deadline:
                        deadline = t
                    if stop < 0:
                        stop = p
                    if ahead == 0:
                        break
                    ahead -= 1
                    p += 1
                    continue
            self._declare(p, slot, port, rack, now)
            p += 1
        self.rack_next = stop if stop >= 0 else p
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
            port, rack, t = self._due(slot, ser)
            if t > now:
                if t < deadline:
                    deadline = t
                break
            rtxq.popleft()
            self._declare(psn, slot, port, rack, now)
        self.loss_deadline = deadline

    def _due(self, slot: int, ser: int) -> tuple[int, bool, int]:
        """The transmission in `slot` (serial `ser`, acknowledged after it): its port, whether the same-port
        rule applies (its port has acknowledged a later serial, its threshold is the lower, and its EV is
        not penalised; `rack_ser` is all 0 with the rule off, as no samples are taken), and the time it
        is lost at by the rule that applies."""
        ev = self.tx_ev[slot]
        port = self.paths.ev_port[ev]
        thr = self.port_thr[port]
        rack_thr = self.rack_thr[port]
        rack = ser < self.rack_ser[port] and rack_thr < thr and not self.paths.pen[ev]
        return port, rack, self.tx_time[slot] + (rack_thr if rack else thr)

    def _declare(self, psn: int, slot: int, port: int, rack: bool, now: int) -> None:
        """Loss detection found `psn` (in `slot`, sent on `port`) lost, by the same-port rule when `rack`."""
        self.c["retx_sack"] += 1
        if rack:
            self.c["retx_same_port"] += 1
            self._rack_declared(psn, port, now)
        self._lost(psn, slot, now, True)

    def _lost(self, psn: int, slot: int, now: int, blame_ev: bool) -> None:
        self.tx_state[slot] = _LOST
        self.inflight -= self.tx_len[slot]
        self.retx_q.append(psn)
        # a PSN past the responder's window as learnt since (`wlim` < W) was most likely refused, its
        # NACK late or lost, not lost on its path
        if blame_ev and psn - self.snd_una < self.wlim:
            self.paths.loss(self.tx_ev[slot], now, self.tx_time[slot], psn)
        self.cc.on_loss(now)

    def _path_back(self, now: int) -> None:
        """An EV came back GOOD (its probes were answered): what is overdue by the ACK timeout is lost,
        and goes again now on the usable EVs instead of at the retransmission timer, which after an
        outage is a long backoff away (with every EV down, all 4 planes black for 45 ms, the paths were
        back 6 ms before the last timer, which then ended the QP without a resend: RETRY_EXC_ERR).
        Not a retry and no blame: the outage that lost these packets is what the probes just saw end.
        If the resends are lost too, the timer still runs as it was."""
        base = self.attr.ack_timeout_ns
        W = self.W
        tx_state, tx_time = self.tx_state, self.tx_time
        for psn in range(self.snd_una, self.snd_nxt):
            slot = psn % W
            if tx_state[slot] == _INFLIGHT and tx_time[slot] + base <= now:
                self.c["retx_timeout"] += 1
                self._lost(psn, slot, now, False)

    # ================================================================== ACK timeout

    def _rto_interval(self) -> int:
        return self.attr.rto_interval_ns(self.retries)

    def _on_rto(self, now: int) -> None:
        """ACK timeout: linear stage (timeout x 1, linear_cnt times), then exponential backoff (x2 per
        retry up to x 2^backoff_cap, exp_cnt times; 25 = forever), then ERROR. A timeout counts as a
        retry when a transmission is overdue, when work waits for want of a usable EV (every EV
        denied: the probes run meanwhile), or when PSNs were resent on TRIMMED or OUT_OF_WINDOW NACKs
        since the last progress or timeout (a PSN trimmed or refused on every send was resent once per
        RTT for ever, never overdue: 250,000 times in 500 ms, the QP neither done nor failed); one that
        finds only RNR waits does not."""
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
        busy = self.snd_nxt != self.snd_una
        resent = c["retx_trim"] + c["retx_nack"]
        refused = busy and resent != self.nack_retx_mark
        self.nack_retx_mark = resent
        if not overdue and not no_path and not refused:
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
