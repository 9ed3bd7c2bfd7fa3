"""NSCC window rules (docs/transport.md) and the null CC."""

from __future__ import annotations

import dataclasses

import pytest

from mrc.transport import Nscc, NsccConfig, NullCC

MTU = 4096


def cfg(**kw: object) -> NsccConfig:
    base = NsccConfig.for_path(base_rtt_ns=10_000, bdp_bytes=400_000)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def test_the_13_fields_of_mrc_ctl_cc_nscc_cfg() -> None:
    assert [f.name for f in dataclasses.fields(NsccConfig)] == [
        "disable_qa", "adjust_bytes_threshold", "adjust_period_threshold", "base_rtt", "eta", "fi",
        "fi_scale", "gamma", "max_md_jump", "max_cwnd", "qa_gate", "qa_threshold", "target_delay",
    ]
    c = NsccConfig.for_path(10_000, 400_000)
    assert c.max_cwnd == 600_000 and c.target_delay == 7_500 and c.qa_threshold == 30_000


def test_ecn_with_low_delay_leaves_the_window_alone() -> None:
    cc = Nscc(cfg(), MTU)
    w = cc.cwnd
    for t in range(0, 200_000, 1_000):
        cc.on_ack(t, MTU, 10_000 + 1_000, True)  # 1 us of queueing < 7.5 us target
    assert cc.cwnd == w and cc.md_count == 0 and cc.ecn_low_delay == 200


def test_ecn_with_high_delay_decreases_at_most_once_per_base_rtt() -> None:
    c = cfg()
    cc = Nscc(c, MTU)
    w = cc.cwnd
    for t in range(0, 30_000, 1_000):  # 30 samples over 3 base RTTs, delay 20 us > target
        cc.on_ack(t, MTU, 30_000, True)
    assert cc.md_count == 3
    assert cc.cwnd < w
    # each step is capped by max_md_jump
    cc2 = Nscc(cfg(max_md_jump=0.1), MTU)
    cc2.on_ack(0, MTU, 1_000_000, True)
    assert cc2.cwnd == int(c.max_cwnd * 0.9)


def test_increase_rules_and_cap() -> None:
    c = cfg(max_cwnd=1 << 30)
    cc = Nscc(c, MTU)
    cc.cwnd = 100_000
    cc.on_ack(0, MTU, c.base_rtt, False)  # empty queue: proportional increase, applied per threshold
    for t in range(1, 20):
        cc.on_ack(t, MTU, c.base_rtt, False)
    prop = cc.cwnd - 100_000
    assert prop > 0
    cc2 = Nscc(c, MTU)
    cc2.cwnd = 100_000
    for t in range(20):
        cc2.on_ack(t, MTU, c.base_rtt + 2 * c.target_delay, False)  # queue above target: fair increase
    fair = cc2.cwnd - 100_000
    assert 0 < fair < prop
    cc3 = Nscc(cfg(), MTU)
    for t in range(100):
        cc3.on_ack(t * 1_000, MTU, 0, False)
    assert cc3.cwnd == cc3.cfg.max_cwnd  # never above max_cwnd


def test_quick_adapt_after_trims_when_little_gets_through() -> None:
    c = cfg()
    cc = Nscc(c, MTU)
    cc.on_ack(0, MTU, c.base_rtt, False)
    cc.on_trim(1_000)
    cc.on_ack(c.base_rtt + c.target_delay + 1, MTU, c.base_rtt, False)
    assert cc.qa_count == 1 and cc.cwnd == 2 * MTU
    # disabled by disable_qa
    cc2 = Nscc(cfg(disable_qa=1), MTU)
    cc2.on_ack(0, MTU, c.base_rtt, False)
    cc2.on_trim(1_000)
    cc2.on_ack(c.base_rtt + c.target_delay + 1, MTU, c.base_rtt, False)
    assert cc2.qa_count == 0


def test_a_window_of_trims_without_a_sack_ends_the_quick_adapt_period() -> None:
    """A sender all of whose packets are trimmed gets NACKs and no SACK: quick adapt must still act, or
    the window stays at max_cwnd for as long as the trims last (an incast of 128 such senders never
    completed: docs/sim.md). The period ends at a trim once a window's worth of trims, and at least
    TRIMS_WITHOUT_ACK, came with no SACK among them."""
    from mrc.transport.cc import TRIMS_WITHOUT_ACK

    c = cfg()
    cc = Nscc(c, MTU)
    period = c.base_rtt + c.target_delay
    window = -(-c.max_cwnd // MTU)  # trims that cover the window
    t = 5_000
    for _ in range(window - 1):
        cc.on_trim(t)
    assert cc.qa_end < 0  # not yet: the first period starts at the window's worth
    cc.on_trim(t)
    assert cc.qa_end == t + period and cc.qa_count == 0
    cc.on_trim(t + period)  # the period is over, and no SACK came
    assert cc.qa_count == 1 and cc.cwnd == cc.min_cwnd == MTU

    # a SACK starts the count again, and a small window still needs TRIMS_WITHOUT_ACK trims
    t += 3 * period
    cc.on_ack(t, MTU, c.base_rtt, False)
    assert cc.cwnd < 2 * MTU and cc.trimmed_since_ack == 0
    for _ in range(TRIMS_WITHOUT_ACK - 1):
        cc.on_trim(t + period)
    assert cc.qa_count == 1
    cc.on_trim(t + period)
    assert cc.qa_count == 2

    # trims among SACKs (random trimming with heavy loss): the period ends at the SACKs, as before
    cc2 = Nscc(c, MTU)
    for k in range(4 * window):
        now = k * 100
        cc2.on_trim(now)
        if k % 4 == 0:
            cc2.on_ack(now, 3 * MTU, c.base_rtt, False)
    assert cc2.trimmed_since_ack < TRIMS_WITHOUT_ACK * MTU
    # ... and losses keep their rule: the period ends at a SACK, the window no lower than the gate
    cc3 = Nscc(c, MTU)
    cc3.on_ack(0, MTU, c.base_rtt, False)
    cc3.on_loss(period + 1)
    assert cc3.qa_count == 0
    cc3.on_ack(period + 2, MTU, c.base_rtt, False)
    assert cc3.qa_count == 1 and cc3.cwnd == c.max_cwnd >> c.qa_gate
    # disable_qa: no cut
    cc4 = Nscc(cfg(disable_qa=1), MTU)
    for k in range(2 * window):
        cc4.on_trim(k * period)
    assert cc4.qa_count == 0 and cc4.cwnd == c.max_cwnd


def test_null_cc_never_limits() -> None:
    cc = NullCC(MTU)
    w = cc.cwnd
    cc.on_ack(0, 1, 10**9, True)
    cc.on_loss(1)
    cc.on_trim(2)
    assert cc.cwnd == w >= 1 << 40 and cc.stats() == {"algorithm": "null"}


# -- the testbed's profile: a target delay above the Python hosts' own latency (ctl/site.py)


def _host_latency_acks(cc: Nscc, seconds: float) -> None:
    """SACKs as a testbed QP gets them when its mrcds are slow to be scheduled: 16 KiB acknowledged
    every 1.2 ms (sparser than quick adapt's period at the default target), each RTT sample 0.5 ms of
    base RTT plus 2-8 ms of host latency; no ECN, no queue in the fabric."""
    delays = (2_000_000, 3_500_000, 5_500_000, 8_000_000)
    t, k = 0, 0
    while t < seconds * 1e9:
        cc.on_ack(t, 16384, 500_000 + delays[k % len(delays)], False)
        k += 1
        t += 1_200_000


def test_the_testbed_profile_does_not_read_host_latency_as_congestion() -> None:
    from mrc.ctl.site import TESTBED_BASE_RTT_NS, TESTBED_TARGET_DELAY_NS, testbed_nscc

    prof = testbed_nscc(4, 100_000_000, 128 << 10, 8192)
    assert prof.target_delay == TESTBED_TARGET_DELAY_NS
    assert prof.qa_threshold == 4 * TESTBED_TARGET_DELAY_NS
    assert prof.base_rtt == TESTBED_BASE_RTT_NS
    assert prof.max_cwnd == (4 * (128 << 10) // 3) * 3 // 2  # a third of the buffers, x 1.5
    fabric = NsccConfig.for_path(TESTBED_BASE_RTT_NS, prof.max_cwnd * 2 // 3, 8192)  # the engine's default
    old, new = Nscc(fabric, 8192), Nscc(prof, 8192)
    _host_latency_acks(old, 1.0)
    _host_latency_acks(new, 1.0)
    assert old.qa_count > 50 and old.min_cwnd_seen <= 2 * 8192  # quick adapt cuts to a packet or two
    assert new.qa_count == 0 and new.md_count == 0 and new.cwnd == prof.max_cwnd


def test_the_testbed_profile_still_answers_trims_and_high_delay_ecn() -> None:
    from mrc.ctl.site import testbed_nscc

    prof = testbed_nscc(4, 100_000_000, 128 << 10, 8192)
    cc = Nscc(prof, 8192)
    cc.on_ack(0, 8192, prof.base_rtt, False)
    cc.on_trim(1_000)  # trims, and one packet acknowledged in the whole quick-adapt period
    cc.on_ack(prof.base_rtt + prof.target_delay + 1, 8192, prof.base_rtt, False)
    assert cc.qa_count == 1 and cc.cwnd == 2 * 8192
    cc2 = Nscc(prof, 8192)
    w = cc2.cwnd
    cc2.on_ack(0, 8192, prof.base_rtt + 2 * prof.target_delay, True)  # marked, and queued beyond target
    assert cc2.md_count == 1 and cc2.cwnd < w


def test_the_testbed_target_can_be_set_back_for_side_by_side_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from mrc.ctl.site import TARGET_ENV, TESTBED_TARGET_DELAY_NS, testbed_target_delay_ns
    from mrc.errors import MrcError

    monkeypatch.delenv(TARGET_ENV, raising=False)
    assert testbed_target_delay_ns() == TESTBED_TARGET_DELAY_NS
    monkeypatch.setenv(TARGET_ENV, "0")
    assert testbed_target_delay_ns() is None  # the engine's default
    monkeypatch.setenv(TARGET_ENV, "2000")
    assert testbed_target_delay_ns() == 2_000_000
    for bad in ("2ms", "-1", "2000000"):
        monkeypatch.setenv(TARGET_ENV, bad)
        with pytest.raises(MrcError, match=TARGET_ENV):
            testbed_target_delay_ns()
