"""NSCC window rules (docs/transport.md) and the null CC."""

from __future__ import annotations

import dataclasses

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


def test_null_cc_never_limits() -> None:
    cc = NullCC(MTU)
    w = cc.cwnd
    cc.on_ack(0, 1, 10**9, True)
    cc.on_loss(1)
    cc.on_trim(2)
    assert cc.cwnd == w >= 1 << 40 and cc.stats() == {"algorithm": "null"}
