"""Loss recovery of a queue pair: the RTT estimators, RACK-style loss detection and the ACK timeout.

The requester's clock-driven half, kept apart from transmission as aioquic keeps `quic/recovery.py`
apart from `quic/connection.py`: `_rtt_sample` folds a SACK's RTT into the QP-wide and per-plane
estimators (the per-plane ones set each port's reordering threshold), `_detect_losses` declares a
transmission lost once a later one is acknowledged and it has been out longer than its port's threshold
(and arms the loss timer for the next candidate), `_lost` queues a PSN for retransmission, and
`_rto_interval` / `_on_rto` run the ACK timeout: linear then exponential backoff, and the retry budget
whose end is ERROR.
A mixin over `qpcore.QpCore`'s state: the requester calls these on every SACK, at no extra cost.
"""

from __future__ import annotations

from .qpcore import _INFLIGHT, _LOST, NEVER, QpCore
from .verbs import EXP_CNT_INFINITE, WcStatus


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

    # ================================================================== ACK timeout

    def _rto_interval(self) -> int:
        return self.attr.rto_interval_ns(self.retries)

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
