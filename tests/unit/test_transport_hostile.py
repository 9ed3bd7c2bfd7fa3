"""Hostile, stray and extreme input against a live QP (issue 14): a packet the genuine peer did not send,
or one that names no transmission of ours, never fails, stalls or corrupts a transfer; receivers that
are not ready, responders flooded with messages that never complete, heavy loss and dead paths all end
in delivery or in a bounded, documented error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc.sim.loopback import (
    GID_A,
    GID_B,
    NEVER,
    Blackhole,
    FabricConfig,
    LoopbackConfig,
    LoopbackRun,
    build,
    run_transfer,
)
from mrc.transport import Context, Datagram, EvProfile, EvState, QpAttr, QpState, QueuePair, WcStatus
from mrc.wire import NackCode, PortState, SackFlag, build_write, parse
from mrc.wire.icrc import IcrcContext
from mrc.wire.packet import build_nack, build_port_status, build_probe, build_probe_reply, build_sack

GA = bytes.fromhex("fd000000000000000000000000000001")
GB = bytes.fromhex("fd000000000000000000000000000002")
GX = bytes.fromhex("fd0000000000000000000000000000ff")
FROM_B = IcrcContext(GB, GA)  # what B's packets to A carry (a forger with B's address)
FROM_A = IcrcContext(GA, GB)
LB_FROM_A = IcrcContext(GID_A, GID_B)  # the same for the loopback harness' two hosts
LB_FROM_B = IcrcContext(GID_B, GID_A)
FATAL = (NackCode.BAD_RKEY, NackCode.BAD_VA, NackCode.BAD_LENGTH, NackCode.BAD_QPN)


def pair(
    attr: QpAttr | None = None, attr_a: QpAttr | None = None, evs: int = 8, ports: int = 2
) -> tuple[Context, Context, QueuePair, QueuePair]:
    a = Context(GA, ports=ports, seed=1)
    b = Context(GB, ports=ports, seed=2)
    qps = []
    for ctx, at in ((a, attr_a or attr), (b, attr)):
        prof = ctx.create_ev_profile(EvProfile.even(1, evs, ports))
        qps.append(ctx.create_qp(ctx.create_cq(), ev_profile=prof, attr=at or QpAttr()))
    qa, qb = qps
    qa.connect(GB, qb.qpn)
    qb.connect(GA, qa.qpn, rq_psn=0)
    return a, b, qa, qb


def deliver(dst: Context, dgs: list[Datagram], now: int) -> None:
    for dg in dgs:
        dst.receive(dg.data, now, False, dg.port)


def nack(qpn: int, psn: int, code: int, ts: int = 0) -> bytes:
    buf = bytearray(64)
    n = build_nack(buf, FROM_B, dqpn=qpn, psn=psn, ev_index=1, code=code, echo_ev_index=1, cum_psn=0,
                   echo_timestamp_ns=ts)
    return bytes(buf[:n])


def port_status(qpn: int, port: int, up: bool, epoch: int, ctx: IcrcContext = FROM_B) -> bytes:
    buf = bytearray(64)
    n = build_port_status(buf, ctx, dqpn=qpn, ev_index=0, request_id=1, port=port,
                          state=int(PortState.UP if up else PortState.DOWN), epoch=epoch)
    return bytes(buf[:n])


def stray_write(qb: QueuePair, psn: int, rkey: int, va: int, *, imm: int | None = None, msn: int = 99,
                msg_len: int | None = None, offset: int = 0, n: int = 512) -> bytes:
    """A WRITE as if from A (spoofed address, right ICRC) that A never sent."""
    buf = bytearray(n + 200)
    k = build_write(buf, FROM_A, dqpn=qb.qpn, psn=psn, ev_index=3, va=va, rkey=rkey, payload=b"\xab" * n,
                    msn=msn, msg_len=msg_len, msg_offset=offset, timestamp_ns=123, imm=imm, ackreq=True)
    return bytes(buf[:k])


def loop(cfg: LoopbackConfig) -> LoopbackRun:
    return build(cfg)


def transfer(r: LoopbackRun) -> dict[str, Any]:
    return run_transfer(r)


# ------------------------------------------------------------------------------------ 1. fatal NACKs


@pytest.mark.parametrize("code", (*FATAL, NackCode.NO_RECV_BUFFER))
def test_a_fatal_nack_that_names_no_transmission_of_ours_changes_nothing(code: NackCode) -> None:
    a, b, qa, _ = pair()
    src = np.random.default_rng(1).integers(0, 256, 5 * 4096, dtype=np.uint8)
    dst = bytearray(src.nbytes)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qa.post_send(1, smr, 0, src.nbytes, dmr.addr, dmr.rkey)
    dgs = a.datagrams_to_send(1_000)
    assert len(dgs) == 5
    a.receive(nack(qa.qpn, 4000, code), 2_000)  # a PSN never sent
    a.receive(nack(qa.qpn, 2, code, ts=1_000), 2_000)  # one in flight, but not its timestamp
    a.receive(nack(qa.qpn, 2, code, ts=1_000 + qa.ts_off + 1), 2_000)
    a.receive(nack(qa.qpn, 2, code, ts=1_000 + qa.ts_off), 2_000, src=GX)  # right fields, other host
    assert qa.state == QpState.RTS and not qa.send_cq.poll() and not a.poll_async_events()
    assert a.drops == {"nack_unmatched": 3, "foreign_src": 1}
    # the transfer goes on and completes, bit-exact
    deliver(b, dgs, 3_000)
    deliver(a, b.datagrams_to_send(3_000), 4_000)
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.SUCCESS]
    assert dst == src.tobytes()


def test_a_genuine_fatal_nack_for_our_own_packet_still_ends_the_qp() -> None:
    a, b, qa, _ = pair()
    smr, dmr = a.reg_mr(bytearray(4096)), b.reg_mr(bytearray(4096))
    qa.post_send(1, smr, 0, 4096, dmr.addr, dmr.rkey ^ 0x55)  # our own wrong R_Key
    deliver(b, a.datagrams_to_send(10), 11)
    deliver(a, b.datagrams_to_send(11), 12)
    assert qa.state == QpState.ERROR and qa.error_status == WcStatus.REM_ACCESS_ERR
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.REM_ACCESS_ERR]


# ------------------------------------------------------------------------------------ 2. reflected kills


@pytest.mark.parametrize("kind", ["bad_rkey", "bad_va", "no_recv_buffer"])
def test_one_stray_write_at_the_responder_is_not_reflected_into_a_kill(kind: str) -> None:
    a, b, qa, qb = pair()
    src = np.random.default_rng(2).integers(0, 256, 4 * 4096, dtype=np.uint8)
    dst = bytearray(src.nbytes)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qa.post_send(1, smr, 0, src.nbytes, dmr.addr, dmr.rkey)
    dgs = a.datagrams_to_send(1_000)
    # one packet inside the responder's window, as if from A, that A never sent
    bad = {
        "bad_rkey": stray_write(qb, 2, dmr.rkey ^ 1, dmr.addr),
        "bad_va": stray_write(qb, 2, dmr.rkey, dmr.addr + src.nbytes),
        "no_recv_buffer": stray_write(qb, 2, dmr.rkey, dmr.addr, imm=2, msn=51, msg_len=512),
    }[kind]
    b.receive(bad, 2_000)
    back = b.datagrams_to_send(2_000)
    assert [parse(g.data).body.code for g in back] == [NackCode[kind.upper()]]  # type: ignore[union-attr]
    assert bytes(dst) == bytes(len(dst))  # nothing placed
    deliver(a, back, 3_000)  # the responder's NACK reaches the genuine requester ...
    assert qa.state == QpState.RTS and a.drops == {"nack_unmatched": 1}  # ... which ignores it
    deliver(b, dgs, 4_000)
    deliver(a, b.datagrams_to_send(4_000), 5_000)
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.SUCCESS]
    assert dst == src.tobytes()


# ------------------------------------------------------------------------------------ 3. PORT_STATUS


def test_port_status_epochs_compare_in_serial_number_arithmetic() -> None:
    a, _, qa, _ = pair(evs=8, ports=2)
    a.receive(port_status(qa.qpn, 1, False, 0xFFFFFFFF), 0)
    assert [qa.paths.state[i] for i in (1, 3, 5, 7)] == [EvState.DENIED] * 4
    a.receive(port_status(qa.qpn, 1, True, 3), 10)  # 3 is after 2^32 - 1 (it wrapped)
    assert all(s == EvState.GOOD for s in qa.paths.state)
    a.receive(port_status(qa.qpn, 1, False, 0xFFFFFFF0), 20)  # before 3: stale
    a.receive(port_status(qa.qpn, 1, False, 3), 20)  # a replay
    a.receive(port_status(qa.qpn, 9, False, 4), 20)  # a port the peer does not have
    assert all(s == EvState.GOOD for s in qa.paths.state)
    assert a.drops == {"port_status_stale": 2, "port_status_bad_port": 1}


def test_a_forged_port_status_on_every_port_does_not_stall_the_sender() -> None:
    r = loop(LoopbackConfig(size=4 << 20, seed=3))
    for p in range(4):
        r.a.receive(port_status(r.qa.qpn, p, False, 0xFFFFFFFF, LB_FROM_B), 0)
    assert r.qa.paths.good_count == 0
    doc = transfer(r)
    assert doc["completed"] and doc["bit_exact"], doc["status"]
    assert r.qa.paths.good_count == 128 and not r.qa.paths.peer_down
    assert doc["sim_time_s"] < 0.05  # the peer-port probes found the ports up within milliseconds


def test_a_peer_port_reported_down_is_probed_and_stays_down_while_it_is_silent() -> None:
    r = loop(LoopbackConfig(size=1 << 20, seed=4, fabric=FabricConfig(
        planes=4, blackholes=[Blackhole(1, 0, NEVER)])))
    r.a.receive(port_status(r.qa.qpn, 1, False, 7, LB_FROM_B), 0)
    doc = transfer(r)
    assert doc["completed"] and doc["bit_exact"]
    r.fabric.run(until_ns=r.fabric.now + 20_000_000)  # 20 ms more: ten probe rounds, all lost
    assert 1 in r.qa.paths.peer_down and r.qa.c["probe_tx"] >= 5
    assert all(r.qa.paths.state[i] == EvState.DENIED for i in range(1, 128, 4))


def test_a_qp_with_work_and_no_usable_ev_errors_after_its_retry_budget() -> None:
    attr = QpAttr(timeout=4, linear_cnt=2, exp_cnt=3)
    a, b, qa, _ = pair(attr)
    qa.paths.profile.deny(list(range(8)))  # the controller denied every EV
    smr, dmr = a.reg_mr(bytearray(4096)), b.reg_mr(bytearray(4096))
    qa.post_send(1, smr, 0, 4096, dmr.addr, dmr.rkey)
    assert a.datagrams_to_send(0) == []
    t = a.next_deadline()
    assert t is not None  # a timer is armed: no silent stall
    while qa.state == QpState.RTS and t is not None and t < 10**10:
        a.handle_timer(t)
        a.datagrams_to_send(t)
        t = a.next_deadline()
    assert qa.state == QpState.ERROR and [w.status for w in qa.send_cq.poll()] == [WcStatus.RETRY_EXC_ERR]
    ev = a.poll_async_events()
    assert ev[0].time_ns == attr.retry_budget_ns and qa.c["no_path_rto"] == 2 + 3 + 1


# ------------------------------------------------------------------------------------ 4. RNR, max_wimm


def test_an_immediate_without_a_posted_receive_is_retried_not_fatal() -> None:
    a, b, qa, qb = pair(QpAttr(rnr_timer_ns=50_000))
    src = bytes(range(256)) * 16
    smr, dmr = a.reg_mr(bytearray(src)), b.reg_mr(bytearray(4096))
    qa.post_send(1, smr, 0, 4096, dmr.addr, dmr.rkey, imm=0xBEEF)
    deliver(b, a.datagrams_to_send(0), 10)
    back = b.datagrams_to_send(10)
    assert parse(back[0].data).body.code == NackCode.NO_RECV_BUFFER  # type: ignore[union-attr]
    deliver(a, back, 20)
    assert qa.state == QpState.RTS and qa.c["rnr_rx"] == 1 and a.datagrams_to_send(20) == []
    assert a.next_deadline() == 20 + 50_000
    qb.post_recv(9)  # the application catches up
    a.handle_timer(50_020)
    deliver(b, a.datagrams_to_send(50_020), 50_030)
    assert [(w.wr_id, w.status, w.imm_data) for w in qb.recv_cq.poll()] == [(9, WcStatus.SUCCESS, 0xBEEF)]
    deliver(a, b.datagrams_to_send(50_030), 50_040)
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.SUCCESS]
    assert bytes(dmr.view) == src and qa.c["retx_rnr"] == 1


def test_a_receiver_that_never_posts_ends_in_rnr_retry_exceeded() -> None:
    attr = QpAttr(rnr_timer_ns=10_000, rnr_retry=3)
    a, b, qa, _ = pair(attr)
    smr, dmr = a.reg_mr(bytearray(4096)), b.reg_mr(bytearray(4096))
    qa.post_send(1, smr, 0, 4096, dmr.addr, dmr.rkey, imm=1)
    qa.post_send(2, smr, 0, 4096, dmr.addr, dmr.rkey)
    t = 0
    for _ in range(50):
        deliver(b, a.datagrams_to_send(t), t + 1)
        deliver(a, b.datagrams_to_send(t + 1), t + 2)
        if qa.state != QpState.RTS:
            break
        t = a.next_deadline() or t + 2
        a.handle_timer(t)
    assert qa.state == QpState.ERROR and qa.c["rnr_rx"] == 4 and qa.c["retx_rnr"] == 3
    assert t == 10_000 + 20_000 + 40_000 + 6  # the waits double per retry of the packet
    assert [(w.wr_id, w.status) for w in qa.send_cq.poll()] == [
        (1, WcStatus.RNR_RETRY_EXC_ERR), (2, WcStatus.WR_FLUSH_ERR)
    ]
    assert [(e.kind, e.detail) for e in a.poll_async_events()] == [("QP_FATAL", "RNR_RETRY_EXC_ERR")]


def test_max_wimm_holds_posts_at_the_sender_and_never_fails_the_qp() -> None:
    cfg = LoopbackConfig(size=1 << 20, seed=5, attr=QpAttr(max_wimm=2))
    r = loop(cfg)
    smr = r.a.reg_mr(r.src)
    dmr = r.b.reg_mr(r.dst)
    k = 8
    part = cfg.size // k
    for i in range(k):
        r.qb.post_recv(100 + i)
    for i in range(k):
        r.qa.post_send(i, smr, i * part, part, dmr.addr + i * part, dmr.rkey, imm=i)
    peak = 0
    r.fabric.kick(0)
    while r.fabric.heap and len(r.send_wc) < k:
        r.fabric.run(until_ns=r.fabric.now + 2_000)
        peak = max(peak, r.qa.wimm_out)
        r.send_wc.extend(r.qa.send_cq.poll())
    assert peak == 2 and r.qa.c["wimm_limited"] > 0
    assert [w.wr_id for w in r.send_wc] == list(range(k))
    assert all(w.status == WcStatus.SUCCESS for w in r.send_wc)
    assert sorted(w.imm_data for w in r.qb.recv_cq.poll()) == list(range(k))  # type: ignore[type-var]
    assert np.array_equal(r.src, r.dst)


# ------------------------------------------------------------------------------------ 5. responder state


def test_messages_that_never_complete_are_bounded_and_expire() -> None:
    n = 20_000
    attr_b = QpAttr()
    a, b, qa, qb = pair(attr_b, attr_a=QpAttr(initial_psn=n + 1))
    dst = bytearray(1 << 16)
    dmr = b.reg_mr(dst)
    qb.post_recv(1)
    peak = 0
    for i in range(n):  # first packets of messages whose rest never comes
        b.receive(stray_write(qb, i, dmr.rkey, dmr.addr, msn=1000 + i, msg_len=8192), 10 + i)
        peak = max(peak, len(qb.msgs))
        b.datagrams_to_send(10 + i)
    limit = attr_b.window  # max_rx_msgs 0: the MPR window
    assert qb.rcv_cum == n and peak == limit and qb.c["rx_msg_evicted"] == n - limit
    # the last packet of one more, with an immediate: it reserves the one posted receive
    b.receive(stray_write(qb, n, dmr.rkey, dmr.addr, imm=5, msn=999_999, msg_len=8192, offset=4096), 10 + n)
    b.datagrams_to_send(10 + n)
    assert qb.imm_reserved == 1 and len(qb.msgs) == limit
    # two sweeps without progress forget them all, with the reservation
    t = b.next_deadline()
    assert t == 10 + attr_b.rx_msg_timeout_ns
    b.handle_timer(t)
    assert len(qb.msgs) == limit  # the first sweep only notes where each message stands
    b.handle_timer(t + attr_b.rx_msg_timeout_ns)
    assert qb.msgs == {} and qb.imm_reserved == 0 and qb.c["rx_msg_expired"] == limit
    assert b.next_deadline() is None
    # the genuine requester (its PSNs start where the strays left off) is served, immediate and all
    src = bytes(range(256)) * 32
    smr = a.reg_mr(bytearray(src))
    now = 3 * attr_b.rx_msg_timeout_ns
    qa.post_send(7, smr, 0, len(src), dmr.addr, dmr.rkey, imm=0xF00D)
    deliver(b, a.datagrams_to_send(now), now + 1)
    deliver(a, b.datagrams_to_send(now + 1), now + 2)
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.SUCCESS]
    assert [(w.status, w.imm_data) for w in qb.recv_cq.poll()] == [(WcStatus.SUCCESS, 0xF00D)]
    assert bytes(dst[: len(src)]) == src


# ------------------------------------------------------------------------------------ 6. heavy loss


@pytest.mark.slow
@pytest.mark.parametrize("loss", [0.4, 0.5])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_heavy_random_loss_completes_bit_exact_within_a_second(loss: float, seed: int) -> None:
    doc = transfer(loop(LoopbackConfig(size=16 << 20, seed=seed, fabric=FabricConfig(planes=4, loss=loss))))
    assert doc["completed"] and doc["bit_exact"], (doc["status"], doc["sim_time_s"])
    assert doc["sim_time_s"] < 1.0
    assert doc["cc"]["min_cwnd_seen"] > 4096  # never stop-and-wait


def test_a_fully_blackholed_qp_errors_after_the_default_retry_budget() -> None:
    attr = QpAttr()
    holes = [Blackhole(p, 20_000, NEVER) for p in range(4)]
    r = loop(LoopbackConfig(size=4 << 20, seed=6, fabric=FabricConfig(planes=4, blackholes=holes)))
    doc = transfer(r)
    assert doc["status"] == ["RETRY_EXC_ERR"]
    ev = r.a.poll_async_events()
    budget = attr.retry_budget_ns
    assert budget is not None and budget < 100_000_000
    assert ev and ev[0].time_ns <= 20_000 + budget + attr.ack_timeout_ns


# ------------------------------------------------------------------------------------ 8. spurious


def test_spurious_retransmissions_are_the_copies_that_arrived_twice() -> None:
    # no loss anywhere, but an ACK timeout (4 us) shorter than the round trip: every retransmission
    # is one the sender did not need, and the responder receives each of those PSNs twice
    cfg = LoopbackConfig(size=8 << 20, seed=7, attr=QpAttr(timeout=2), fabric=FabricConfig(planes=4))
    r = loop(cfg)
    doc = transfer(r)
    assert doc["completed"] and doc["bit_exact"] and r.fabric.c["lost"] == 0
    r.fabric.run(until_ns=r.fabric.now + 100_000)  # the copies still in flight land, and their echoes
    resent = r.qa.serial - cfg.size // 4096
    twice = r.qb.c["dup_rx"] + r.qb.c["stale_rx"]
    assert resent > 50 and twice == resent
    assert r.qa.c["retx_spurious"] == resent  # the sender learns it from the DUPLICATE echoes
    assert not r.a.drops  # every one of those echoes named a transmission of ours


# ------------------------------------------------------------------------------------ fuzz


_CTRL = st.sampled_from(["sack", "nack", "probe", "probe_reply", "port_status"])


@st.composite
def _control(draw: st.DrawFn) -> tuple[str, dict[str, int]]:
    kind = draw(_CTRL)
    small = st.integers(0, (1 << 16) - 1)
    f = {
        "psn": draw(st.one_of(st.integers(0, 2048), st.integers(0, (1 << 24) - 1))),
        "ts": draw(st.one_of(st.integers(0, 20_000_000), st.integers(0, (1 << 64) - 1))),
        "code": draw(st.sampled_from([int(c) for c in NackCode])),
        "cum": draw(st.one_of(st.integers(0, 4096), st.integers(0, (1 << 24) - 1))),
        "bitmap": draw(st.integers(0, (1 << 64) - 1)),
        "flags": draw(st.sampled_from([0, int(SackFlag.ECN_CE), int(SackFlag.DUPLICATE), 7])),
        "rid": draw(small),
        "ev": draw(st.integers(0, 200)),
        "port": draw(st.integers(0, 5)),
        "up": draw(st.integers(0, 1)),
        "epoch": draw(st.one_of(st.integers(0, 10), st.integers(0, (1 << 32) - 1))),
        "at": draw(st.integers(0, 60_000)),
        "third": draw(st.booleans()),
        "to_b": draw(st.booleans()),
    }
    return kind, f


def _forge(kind: str, f: dict[str, int], qpn: int, ctx: IcrcContext) -> bytes:
    buf = bytearray(256)
    if kind == "sack":
        n = build_sack(buf, ctx, dqpn=qpn, psn=f["psn"], ev_index=1, cum_psn=f["cum"], echo_ev_index=f["ev"],
                       echo_timestamp_ns=f["ts"], bitmap=f["bitmap"], words=1, echo_flags=f["flags"])
    elif kind == "nack":
        n = build_nack(buf, ctx, dqpn=qpn, psn=f["psn"], ev_index=1, code=f["code"], echo_ev_index=f["ev"],
                       cum_psn=f["cum"], echo_timestamp_ns=f["ts"])
    elif kind == "probe":
        n = build_probe(buf, ctx, dqpn=qpn, ev_index=f["ev"], request_id=f["rid"], reply_qpn=f["rid"],
                        timestamp_ns=f["ts"])
    elif kind == "probe_reply":
        n = build_probe_reply(buf, ctx, dqpn=qpn, ev_index=1, request_id=f["rid"], echo_ev_index=f["ev"],
                              echo_timestamp_ns=f["ts"], flags=1)
    else:
        n = build_port_status(buf, ctx, dqpn=qpn, ev_index=1, request_id=f["rid"], port=f["port"],
                              state=f["up"], epoch=f["epoch"])
    return bytes(buf[:n])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_control(), min_size=1, max_size=30))
def test_injected_control_packets_never_break_a_running_transfer(
    pkts: list[tuple[str, dict[str, int]]],
) -> None:
    r = loop(LoopbackConfig(size=2 << 20, seed=11, fabric=FabricConfig(planes=4, loss=0.01, jitter_ns=1_000)))
    smr, dmr = r.a.reg_mr(r.src), r.b.reg_mr(r.dst)
    r.qb.post_recv(7)
    r.qa.post_send(1, smr, 0, r.cfg.size, dmr.addr, dmr.rkey, imm=0x1234ABCD)
    fab = r.fabric
    fab.kick(0)
    for kind, f in sorted(pkts, key=lambda p: p[1]["at"]):
        fab.run(until_ns=f["at"])
        to_b = bool(f["to_b"])
        eng, qp = (r.b, r.qb) if to_b else (r.a, r.qa)
        ctx = LB_FROM_A if to_b else LB_FROM_B
        src = GX if f["third"] else (GID_A if to_b else GID_B)
        eng.receive(_forge(kind, f, qp.qpn, ctx), fab.now, False, f["port"] % 4, src)
        fab.kick(fab.now)
    fab.run(until_ns=2_000_000_000, stop=lambda: bool(r.qa.send_cq._q) and bool(r.qb.recv_cq._q))
    assert r.qa.state == QpState.RTS and r.qb.state == QpState.RTS
    assert [w.status for w in r.qa.send_cq.poll()] == [WcStatus.SUCCESS]
    assert [(w.status, w.imm_data) for w in r.qb.recv_cq.poll()] == [(WcStatus.SUCCESS, 0x1234ABCD)]
    assert np.array_equal(r.src, r.dst)


def test_what_the_network_can_grow_at_the_requester_is_bounded() -> None:
    # every third data packet trimmed: ~5,000 trim recoveries in one transfer
    r = loop(LoopbackConfig(size=64 << 20, seed=9, fabric=FabricConfig(planes=4, trim=0.3)))
    doc = transfer(r)
    assert doc["completed"] and doc["bit_exact"] and doc["trims"] > 4096
    assert len(r.qa.trim_recoveries) == 4096 and len(r.qa.trim_pending) <= r.qa.W
    assert len(r.qa.tx_old) <= 2 * r.qa.W and len(r.qa.rnr) <= r.qa.W


# ------------------------------------------------- 5. forged packets that reset state (fuzzing, 2026-12)


def test_a_forged_stale_write_does_not_cancel_the_pending_acknowledgement() -> None:
    """A WRITE with a PSN below the cumulative point (anyone can send one: its R_Key is not checked
    first) is answered with a duplicate SACK echoing it, which the requester discards as naming none of
    its transmissions. That answer used to reset the responder's ACK policy (nothing pending, the
    delayed-ACK timer cancelled), so the genuine packets waiting for their acknowledgement lost it."""
    a, b, qa, qb = pair()
    src = np.arange(64 * 4096, dtype=np.uint32).view(np.uint8)[: 64 * 4096].copy()
    dst = np.zeros_like(src)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qa.post_send(1, smr, 0, src.nbytes, dmr.addr, dmr.rkey)
    deliver(b, a.datagrams_to_send(1_000)[:20], 2_000)  # the last few wait for the delayed ACK
    deliver(a, b.datagrams_to_send(2_000), 2_000)
    una = qa.snd_una
    assert qb.unacked > 0 and qb.ack_deadline != NEVER and una < 20
    b.receive(stray_write(qb, (qb.rcv_cum - 5) & 0xFFFFFF, rkey=0x1234, va=0), 2_100)
    answer = b.datagrams_to_send(2_100)
    assert len(answer) == 1 and b.drops.get("stale") == 1
    deliver(a, answer, 2_100)
    assert a.drops.get("sack_unmatched") == 1 and qa.snd_una == una  # discarded: it names nothing of A's
    assert qb.unacked > 0 and qb.ack_deadline != NEVER  # still owed
    t = qb.ack_deadline
    b.handle_timer(t)
    deliver(a, b.datagrams_to_send(t), t)
    assert qa.snd_una == 20


def test_a_stream_of_forged_port_down_does_not_end_the_qp() -> None:
    """PORT_STATUS DOWN for every peer port, newer epoch each time, every 1 ms (faster than the 2 ms
    peer-port probe): each repeat used to push the probe back and forget the one in flight, so no port
    was ever probed and the WRITE ended in RETRY_EXC_ERR. A repeat for a port already down changes
    nothing now: the probes find the ports up and the WRITE completes bit-exact."""
    r = loop(LoopbackConfig(size=4 << 20, seed=3))
    smr, dmr = r.a.reg_mr(r.src), r.b.reg_mr(r.dst)
    r.qa.post_send(1, smr, 0, r.src.nbytes, dmr.addr, dmr.rkey)
    r.fabric.kick(0)
    wc: list[Any] = []
    t, epoch = 0, 1
    while t < 200_000_000 and not wc:
        for p in range(r.cfg.fabric.planes):
            r.a.receive(port_status(r.qa.qpn, p, False, epoch, LB_FROM_B), r.fabric.now, False, p, GID_B)
        epoch += 1
        r.fabric.kick(r.fabric.now)
        t += 1_000_000
        r.fabric.run(until_ns=t)
        wc = r.qa.send_cq.poll()
    assert [w.status for w in wc] == [WcStatus.SUCCESS]
    assert np.array_equal(r.dst, r.src) and r.qa.state == QpState.RTS
    assert r.qa.c["probe_tx"] > 0


def test_a_timer_call_seconds_late_still_acknowledges() -> None:
    """A driver descheduled for more than 2^32 ns: the delayed ACK's service time (a 32-bit field) is
    the largest it can say instead of an error out of handle_timer."""
    a, b, qa, qb = pair()
    src = np.ones(64 * 4096, np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(np.zeros_like(src))
    qa.post_send(1, smr, 0, src.nbytes, dmr.addr, dmr.rkey)
    deliver(b, a.datagrams_to_send(1_000)[:20], 2_000)
    b.datagrams_to_send(2_000)
    assert qb.unacked > 0
    late = 2_000 + (1 << 32) + 1
    b.handle_timer(late)
    (sack,) = b.datagrams_to_send(late)
    body = parse(sack.data).body
    assert body is not None and getattr(body, "service_time_ns", None) == 0xFFFFFFFF


def _with_pkey(dg: Datagram, key: int, ctx: IcrcContext) -> bytes:
    """The datagram with its P_Key replaced and its ICRC made valid again (what a forger can send)."""
    pkt = bytearray(dg.data)
    pkt[2:4] = key.to_bytes(2, "big")
    ctx.write(pkt, len(pkt) - 4, 0xC000 | dg.ev_index)
    return bytes(pkt)


@pytest.mark.parametrize("fast", [False, True])
def test_a_packet_outside_the_qps_partition_is_dropped_as_bad_pkey(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IBA 10.9.3: every MRC QP holds the default P_Key (full member of partition 0x7FFF). A WRITE or
    a SACK with a valid ICRC but another partition's key places nothing, acknowledges nothing and is
    counted `bad_pkey`; a limited member's key of the same partition (0x7FFF) is admitted. On both
    paths: the fast one (and parse_write's hot path) used to ignore the key."""
    from mrc.transport import fastpath

    monkeypatch.setattr(fastpath, "ENABLED", fast)
    a, b, qa, qb = pair()
    src = np.arange(16 * 4096, dtype=np.uint32).view(np.uint8)[: 16 * 4096].copy()
    dst = np.zeros_like(src)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qa.post_send(1, smr, 0, src.nbytes, dmr.addr, dmr.rkey)
    writes = a.datagrams_to_send(1_000)
    assert len(writes) == 16
    for key in (0x1234, 0x0000, 0x8000, 0xFFFE):  # another partition, the invalid one twice, a near miss
        for dg in writes:
            b.receive(_with_pkey(dg, key, FROM_A), 2_000, False, dg.port, GA)
    assert b.drops == {"bad_pkey": 64}
    assert not dst.any() and qb.rx_packets == 0 and b.datagrams_to_send(2_000) == []
    for dg in writes:  # a limited member of the same partition is admitted
        b.receive(_with_pkey(dg, 0x7FFF, FROM_A), 3_000, False, dg.port, GA)
    assert np.array_equal(dst, src)
    sacks = b.datagrams_to_send(3_000)
    assert sacks
    una = qa.snd_una
    for dg in sacks:
        a.receive(_with_pkey(dg, 0x1234, FROM_B), 3_100, False, dg.port, GB)
    assert a.drops == {"bad_pkey": len(sacks)} and qa.snd_una == una
    deliver(a, sacks, 3_200)
    assert qa.snd_una == 16 and qa.send_cq.poll()[0].status == WcStatus.SUCCESS


@pytest.mark.parametrize("where", ["duplicate", "stale"])
def test_the_sack_answering_a_copy_echoes_its_retx_and_ce_with_duplicate(where: str) -> None:
    """Every SACK echoes the flags of the packet that triggered it (docs/wire.md): a retransmitted,
    CE-marked copy of a packet already placed (above the cumulative point: a duplicate; below: stale)
    is answered DUPLICATE | RETX | ECN_CE; the responder used to echo DUPLICATE alone."""
    from mrc.wire.consts import MxhFlag

    a, b, qa, _ = pair()
    src = np.arange(4 * 4096, dtype=np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(np.zeros_like(src))
    qa.post_send(1, smr, 0, src.nbytes, dmr.addr, dmr.rkey)
    dgs = a.datagrams_to_send(1_000)
    first = 0 if where == "stale" else 2  # 0 is below the cumulative point once 0 and 1 arrived
    deliver(b, [dgs[0], dgs[1], dgs[2]] if where == "stale" else [dgs[2]], 2_000)
    b.datagrams_to_send(2_000)
    pkt = bytearray(dgs[first].data)
    pkt[12 + 16 + 1] |= int(MxhFlag.RETX)  # MXH flags byte (WRITE: BTH 12 + RETH 16, then version)
    FROM_A.write(pkt, len(pkt) - 4, 0xC000 | dgs[first].ev_index)
    b.receive(bytes(pkt), 3_000, True, dgs[first].port, GA)
    (answer,) = b.datagrams_to_send(3_000)
    body = parse(answer.data).body
    assert b.drops == {where: 1}
    assert body.echo_flags == SackFlag.DUPLICATE | SackFlag.RETX | SackFlag.ECN_CE  # type: ignore[union-attr]


@pytest.mark.parametrize("fast", [False, True])
def test_the_clock_may_start_at_zero_and_may_not_go_negative(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Time is nanoseconds since any origin at or before the driver's start: a transfer whose packets
    leave at t = 0 completes (those transmissions give no RTT sample, docs/transport.md "Time", the
    next ones do); a negative time is the driver's error, named, on every entry point (it used to reach
    the MXH timestamp's unsigned pack as a struct.error, or pass unnoticed)."""
    from mrc.transport import fastpath

    monkeypatch.setattr(fastpath, "ENABLED", fast)
    a, b, qa, _ = pair()
    src = np.arange(4 * 4096, dtype=np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(np.zeros_like(src))
    qa.post_send(1, smr, 0, src.nbytes, dmr.addr, dmr.rkey)
    dgs = a.datagrams_to_send(0)
    deliver(b, dgs, 3_000)
    deliver(a, b.datagrams_to_send(3_000), 6_000)
    assert qa.snd_una == len(dgs) and qa.send_cq.poll()[0].status == WcStatus.SUCCESS
    for call in (lambda: a.datagrams_to_send(-1), lambda: a.handle_timer(-5),
                 lambda: b.receive(dgs[0].data, -10**12, False, 0, GA)):
        with pytest.raises(ValueError, match="negative"):
            call()


@pytest.mark.parametrize("fast", [False, True])
def test_an_ev_index_beyond_14_bits_is_a_bad_field(fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/wire.md: the MXH EV index is < 2^14 (the UDP source port 0xC000 | EV has no room for more).
    A WRITE or SACK with 0x4000 set, its ICRC valid for the source port the low bits give, is a
    `bad_field` drop, as the capture tools call it; it used to be placed, acknowledged and echoed."""
    from mrc.transport import fastpath

    monkeypatch.setattr(fastpath, "ENABLED", fast)
    a, b, qa, _ = pair()
    src = np.arange(4 * 4096, dtype=np.uint8)
    dst = np.zeros_like(src)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qa.post_send(1, smr, 0, src.nbytes, dmr.addr, dmr.rkey)
    dgs = a.datagrams_to_send(1_000)

    def high(dg: Datagram, mxh: int, ctx: IcrcContext) -> bytes:
        pkt = bytearray(dg.data)
        pkt[mxh + 2] |= 0x40  # EV index, big-endian, at MXH + 2
        ctx.write(pkt, len(pkt) - 4, 0xC000 | dg.ev_index)
        return bytes(pkt)

    for dg in dgs:
        b.receive(high(dg, 28 if dg.data[0] == 0x0A else 32, FROM_A), 2_000, False, dg.port, GA)
    assert b.drops == {"bad_field": len(dgs)} and not dst.any() and b.datagrams_to_send(2_000) == []
    deliver(b, dgs, 3_000)
    sacks = b.datagrams_to_send(3_000)
    for dg in sacks:
        a.receive(high(dg, 12, FROM_B), 3_100, False, dg.port, GB)
    assert a.drops == {"bad_field": len(sacks)} and qa.snd_una == 0
    deliver(a, sacks, 3_200)
    assert qa.snd_una == len(dgs) and np.array_equal(dst, src)


def test_a_service_time_longer_than_the_round_trip_is_no_rtt_sample() -> None:
    """A SACK's service time is the peer's word: one longer than the whole round trip (a broken clock, a
    forged field) was clamped to an RTT of 0, which pinned the QP's and the port's minimum RTT to 0 for
    good. It is no sample now; the next honest SACKs sample as before."""
    a, b, qa, _ = pair()
    smr = a.reg_mr(np.zeros(4 * 4096, dtype=np.uint8))
    dmr = b.reg_mr(np.zeros(4 * 4096, dtype=np.uint8))
    for i in range(4):
        qa.post_send(i, smr, i * 4096, 4096, dmr.addr + i * 4096, dmr.rkey)
    pk = [parse(dg.data, FROM_A) for dg in a.datagrams_to_send(1000)]
    assert len(pk) == 4

    def sack(p: Any, svc: int, now: int) -> None:
        buf = bytearray(128)
        n = build_sack(buf, FROM_B, dqpn=qa.qpn, psn=p.psn, ev_index=p.ev_index,
                       cum_psn=(p.psn + 1) & 0xFFFFFF, echo_ev_index=p.ev_index,
                       echo_timestamp_ns=p.timestamp_ns, service_time_ns=svc)
        a.receive(bytes(buf[:n]), now, False, qa.paths.ev_port[p.ev_index])

    sack(pk[0], 0, 6_000)
    port = qa.paths.ev_port[pk[1].ev_index]
    assert qa.stats()["min_rtt_ns"] == 5_000
    sack(pk[1], 0xFFFFFFFF, 7_000)
    assert qa.stats()["min_rtt_ns"] == 5_000 and qa.port_min_rtt[port] >= 5_000
    assert qa.stats()["snd_una"] == 2  # the acknowledgement itself still counts
    sack(pk[2], 0, 8_000)
    assert qa.stats()["min_rtt_ns"] == 5_000 and qa.stats()["srtt_ns"] > 5_000


@pytest.mark.parametrize("code", [NackCode.TRIMMED, NackCode.OUT_OF_WINDOW])
def test_a_psn_refused_on_every_send_ends_after_the_retry_budget(code: NackCode) -> None:
    """A responder (or a fabric) that trims, or refuses as out of window, every copy of a PSN: each NACK
    resends it at once, so no transmission is ever overdue at the timeout, which re-armed without
    counting. The PSN went out once per RTT for ever (250,000 times in 500 ms, the QP neither done nor
    failed). A timeout after such resends without progress is a retry: RETRY_EXC_ERR after the budget."""
    a, _, qa, _ = pair()
    smr = a.reg_mr(np.zeros(4096, dtype=np.uint8))
    qa.post_send(1, smr, 0, 4096, 0x1000, 0xABCD)
    now, sent = 0, 0
    pending = [(2_000, dg.data) for dg in a.datagrams_to_send(0)]
    while qa.state == QpState.RTS and now < 500_000_000:
        d = a.next_deadline()
        now = min(x for x in (d, pending[0][0] if pending else None) if x is not None)
        while pending and pending[0][0] <= now:
            _, data = pending.pop(0)
            p = parse(data, FROM_A)
            if p.opcode < 0x10:  # a data packet: refused
                sent += 1
                buf = bytearray(64)
                n = build_nack(buf, FROM_B, dqpn=qa.qpn, psn=p.psn, ev_index=p.ev_index, code=code,
                               echo_ev_index=p.ev_index, cum_psn=0, echo_timestamp_ns=p.timestamp_ns)
                a.receive(bytes(buf[:n]), now, False, qa.paths.ev_port[p.ev_index])
        if d is not None and d <= now:
            a.handle_timer(now)
        pending += [(now + 2_000, dg.data) for dg in a.datagrams_to_send(now)]
    assert qa.state == QpState.ERROR
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.RETRY_EXC_ERR]
    budget = qa.attr.retry_budget_ns
    assert budget is not None and now <= budget + 1_000_000 and sent > 1000
