"""Congestion control: sender-based, window-based, per QP, pluggable (docs/design.md §4).

`Nscc` follows UET 1.0 NSCC with the 13 fields of `mrc_ctl_cc_nscc_cfg`; `NullCC` never limits the
window (the MPR window still does). Every algorithm exposes `cwnd` (bytes) and three callbacks the QP
calls: `on_ack` per SACK, `on_trim` per TRIMMED NACK, `on_loss` per loss that was not a trim.

How each signal moves the window (queuing delay d = RTT - service time - base_rtt):

* no ECN, d < target_delay: proportional increase, up to `fi_scale` x cwnd per RTT when the queue is empty
  (scaled by (target - d) / target);
* no ECN, d >= target_delay: fair increase, `fi` bytes per RTT;
* ECN, d >= target_delay: multiplicative decrease by gamma x (avg_d - target) / avg_d, capped at
  `max_md_jump`, at most once per base_rtt;
* ECN, d < target_delay: no change: one hot path, which EV steering handles (the QP lowers that EV's
  preference), not the window;
* increases accumulate and are applied every `adjust_bytes_threshold` acknowledged bytes or
  `adjust_period_threshold` ns, plus `eta` bytes;
* quick adapt (unless `disable_qa`): every base_rtt + target_delay (the period ends at the first SACK
  after it, or at a trim once a window's worth of trims, at least TRIMS_WITHOUT_ACK, came with no SACK),
  if a trim or loss was seen or d exceeded `qa_threshold`, and the bytes acknowledged in that period are
  below max_cwnd >> qa_gate, the window drops to what was achieved, and feedback is ignored for one
  period. When loss was the period's only signal the window drops no lower than max_cwnd >> qa_gate:
  losses retire paths in MRC, and under heavy random loss (SACKs lost too) cutting to the bytes
  acknowledged in one period would end in stop-and-wait.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

from mrc.wire.consts import DEFAULT_PAYLOAD

_NEVER = 1 << 62
#: trims with no SACK among them that end quick adapt's period even when the window is smaller
#: (`Nscc._qa_due`)
TRIMS_WITHOUT_ACK = 8


@dataclass(slots=True)
class NsccConfig:
    """`mrc_ctl_cc_nscc_cfg`: the 13 NSCC parameters (times in ns, sizes in bytes)."""

    disable_qa: int = 0
    adjust_bytes_threshold: int = 8 * DEFAULT_PAYLOAD
    adjust_period_threshold: int = 10_000
    base_rtt: int = 10_000
    eta: float = 0.15 * DEFAULT_PAYLOAD
    fi: float = 5.0 * DEFAULT_PAYLOAD
    fi_scale: float = 0.25
    gamma: float = 0.8
    max_md_jump: float = 0.5
    max_cwnd: int = 1 << 20
    qa_gate: int = 3
    qa_threshold: int = 30_000
    target_delay: int = 7_500

    @classmethod
    def for_path(cls, base_rtt_ns: int, bdp_bytes: int, mtu: int = DEFAULT_PAYLOAD,
                 target_delay_ns: int | None = None) -> NsccConfig:
        """Defaults scaled to a fabric: max_cwnd = 1.5 BDP, target = 0.75 base RTT (trimming on) unless
        `target_delay_ns` is given (end hosts whose own latency exceeds that: the testbed's), the quick
        adapt threshold 4 x the target."""
        target = max(1, base_rtt_ns * 3 // 4 if target_delay_ns is None else target_delay_ns)
        return cls(
            adjust_bytes_threshold=8 * mtu,
            adjust_period_threshold=base_rtt_ns,
            base_rtt=base_rtt_ns,
            eta=0.15 * mtu,
            fi=5.0 * mtu,
            max_cwnd=max(2 * mtu, bdp_bytes * 3 // 2),
            qa_threshold=4 * target,
            target_delay=target,
        )

    def with_mtu(self, old: int, new: int) -> NsccConfig:
        """This profile for packets of `new` payload bytes where it was made for `old` (a QP whose path
        MTU, agreed at connect, is smaller than its port's): the parameters that `for_path` sizes in
        packets (the increase batch, eta, fi, the smallest max_cwnd) scaled by new / old."""
        k = new / old
        return replace(self, adjust_bytes_threshold=max(1, round(self.adjust_bytes_threshold * k)),
                       eta=self.eta * k, fi=self.fi * k, max_cwnd=max(2 * new, self.max_cwnd))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CongestionControl(Protocol):
    name: str
    cwnd: int

    def on_ack(self, now: int, acked: int, rtt_ns: int, ecn: bool) -> None: ...

    def on_trim(self, now: int) -> None: ...

    def on_loss(self, now: int) -> None: ...

    def stats(self) -> dict[str, Any]: ...


class NullCC:
    """No congestion control: the window is effectively unlimited (the MPR window still applies)."""

    name = "null"

    def __init__(self, mtu: int = DEFAULT_PAYLOAD) -> None:
        self.cwnd = 1 << 40

    def on_ack(self, now: int, acked: int, rtt_ns: int, ecn: bool) -> None:
        return None

    def on_trim(self, now: int) -> None:
        return None

    def on_loss(self, now: int) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"algorithm": self.name}


class Nscc:
    """NSCC (UET 1.0 style) window control; see the module docstring for the rules."""

    name = "uet-1.0-nscc"

    def __init__(self, cfg: NsccConfig, mtu: int = DEFAULT_PAYLOAD) -> None:
        self.cfg = cfg
        self.mtu = mtu
        self.cwnd = cfg.max_cwnd
        self.min_cwnd = mtu
        self.inc_acc = 0.0
        self.acked_since_adjust = 0
        self.last_adjust = 0
        self.last_md = -_NEVER
        self.avg_delay = 0.0
        self.qa_period = cfg.base_rtt + cfg.target_delay
        self.qa_end = -1
        self.qa_bytes = 0
        self.qa_signal = False
        self.qa_loss_only = False
        self.hold_until = -1
        #: bytes trimmed (an MTU per TRIMMED NACK) since the last SACK (`on_trim`)
        self.trimmed_since_ack = 0
        # counters
        self.md_count = 0
        self.qa_count = 0
        self.min_cwnd_seen = self.cwnd
        self.ecn_low_delay = 0
        self.ecn_high_delay = 0

    def on_ack(self, now: int, acked: int, rtt_ns: int, ecn: bool) -> None:
        cfg = self.cfg
        if self.qa_end < 0:
            self.qa_end = now + self.qa_period
            self.last_adjust = now
        self.qa_bytes += acked
        self.trimmed_since_ack = 0
        if now >= self.qa_end:
            self._quick_adapt(now)
        if now < self.hold_until:
            return
        target = cfg.target_delay
        if rtt_ns >= 0:
            d = rtt_ns - cfg.base_rtt
            if d < 0:
                d = 0
            self.avg_delay += (d - self.avg_delay) * 0.125
            if d > cfg.qa_threshold:
                self.qa_signal = True
                self.qa_loss_only = False
        else:
            d = int(self.avg_delay)
        cwnd = self.cwnd
        if ecn:
            if d >= target:
                self.ecn_high_delay += 1
                if now - self.last_md >= cfg.base_rtt:
                    avg = max(self.avg_delay, float(d), 1.0)
                    frac = cfg.gamma * (avg - target) / avg
                    if frac > cfg.max_md_jump:
                        frac = cfg.max_md_jump
                    if frac > 0:
                        self.cwnd = max(self.min_cwnd, int(cwnd * (1.0 - frac)))
                        self.last_md = now
                        self.md_count += 1
                        self.inc_acc = 0.0
                        if self.cwnd < self.min_cwnd_seen:
                            self.min_cwnd_seen = self.cwnd
            else:
                self.ecn_low_delay += 1  # steering case: the window is left alone
            return
        if d < target:
            self.inc_acc += acked * cfg.fi_scale * (target - d) / target
        else:
            self.inc_acc += cfg.fi * acked / cwnd
        self.acked_since_adjust += acked
        if (
            self.acked_since_adjust >= cfg.adjust_bytes_threshold
            or now - self.last_adjust >= cfg.adjust_period_threshold
        ):
            new = cwnd + int(self.inc_acc + cfg.eta)
            self.cwnd = cfg.max_cwnd if new > cfg.max_cwnd else new
            self.inc_acc = 0.0
            self.acked_since_adjust = 0
            self.last_adjust = now

    def _quick_adapt(self, now: int) -> None:
        cfg = self.cfg
        if (
            not cfg.disable_qa
            and self.qa_signal
            and now >= self.hold_until
            and self.qa_bytes < (cfg.max_cwnd >> cfg.qa_gate)
        ):
            # a period whose only signal was loss cuts no deeper than the gate: in MRC a loss blames
            # its path (the EV is retired), and at high random loss the bytes acknowledged in one
            # period say little about the capacity; trims and queueing delay do
            floor = (cfg.max_cwnd >> cfg.qa_gate) if self.qa_loss_only else self.min_cwnd
            self.cwnd = max(floor, self.qa_bytes)
            self.qa_count += 1
            self.hold_until = now + self.qa_period
            self.inc_acc = 0.0
            if self.cwnd < self.min_cwnd_seen:
                self.min_cwnd_seen = self.cwnd
        self.qa_signal = False
        self.qa_loss_only = False
        self.qa_bytes = 0
        self.qa_end = now + self.qa_period

    def on_trim(self, now: int) -> None:
        self.qa_signal = True
        self.qa_loss_only = False
        self.trimmed_since_ack += self.mtu
        if self.trimmed_since_ack >= self.cwnd and self.trimmed_since_ack >= TRIMS_WITHOUT_ACK * self.mtu:
            self._qa_due(now)

    def on_loss(self, now: int) -> None:
        if not self.qa_signal:
            self.qa_loss_only = True
        self.qa_signal = True

    def _qa_due(self, now: int) -> None:
        """A window's worth of trims with no SACK among them ends quick adapt's period as a SACK does:
        a sender all of whose packets are trimmed gets no SACK, and its window would stay where it was
        for as long as that lasts. An incast of 128 senders onto one port, each keeping its whole
        window cycling through trim, NACK and an immediate retransmission, never completed
        (docs/sim.md, "Trimming under a deep incast"). Why not at every trim: under heavy random loss
        most SACKs are lost, a period often holds a trim and no SACK, and a cut to the bytes it
        acknowledged (nearly none; the next SACK would have acknowledged many at once) left the QP
        in stop-and-wait until its retries ran out. A trim before any SACK starts the first period."""
        if self.qa_end < 0:
            self.qa_end = now + self.qa_period
            self.last_adjust = now
        elif now >= self.qa_end:
            self._quick_adapt(now)

    def stats(self) -> dict[str, Any]:
        return {
            "algorithm": self.name,
            "cwnd": self.cwnd,
            "min_cwnd_seen": self.min_cwnd_seen,
            "md_count": self.md_count,
            "qa_count": self.qa_count,
            "ecn_low_delay": self.ecn_low_delay,
            "ecn_high_delay": self.ecn_high_delay,
            "avg_delay_ns": round(self.avg_delay),
        }


def make_cc(spec: NsccConfig | str | None, mtu: int) -> Nscc | NullCC:
    """A fresh controller for one QP from a CC profile's configuration (None/"null": NullCC)."""
    if spec is None or spec == "null":
        return NullCC(mtu)
    if isinstance(spec, NsccConfig):
        return Nscc(spec, mtu)
    raise ValueError(f"unknown congestion control {spec!r}")
