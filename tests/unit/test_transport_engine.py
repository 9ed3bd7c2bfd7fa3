"""The engine driven by hand: placement checks, immediates, SACK/NACK bytes, counters by reason."""

from __future__ import annotations

import itertools
import mmap

import numpy as np
import pytest

from mrc.transport import (
    Context,
    Datagram,
    EvProfile,
    QpAttr,
    QpState,
    QueuePair,
    WcOpcode,
    WcStatus,
)
from mrc.wire import (
    MxhFlag,
    NackCode,
    Opcode,
    SackFlag,
    build_sack,
    build_write,
    parse,
)

GA = bytes.fromhex("fd000000000000000000000000000001")
GB = bytes.fromhex("fd000000000000000000000000000002")
GX = bytes.fromhex("fd0000000000000000000000000000ff")


def pair(
    attr: QpAttr | None = None, evs: int = 8, ports: int = 2
) -> tuple[Context, Context, QueuePair, QueuePair]:
    a = Context(GA, ports=ports, seed=1)
    b = Context(GB, ports=ports, seed=2)
    qps = []
    for ctx in (a, b):
        prof = ctx.create_ev_profile(EvProfile.even(1, evs, ports))
        cq = ctx.create_cq()
        qps.append(ctx.create_qp(cq, ev_profile=prof, attr=attr or QpAttr()))
    qa, qb = qps
    qa.connect(GB, qb.qpn)
    qb.connect(GA, qa.qpn)
    return a, b, qa, qb


def deliver(dst: Context, dgs: list[Datagram], now: int, ecn: bool = False) -> None:
    for dg in dgs:
        dst.receive(dg.data, now, ecn, dg.port)


def kinds(dgs: list[Datagram]) -> list[int]:
    return [dg.data[0] for dg in dgs]


# ------------------------------------------------------------------------------------ memory regions


def test_memory_regions_over_any_writable_buffer() -> None:
    ctx = Context(GA)
    arr = np.zeros((16, 8), dtype=np.float32)
    mr = ctx.reg_mr(arr)
    assert mr.length == arr.nbytes and mr.addr == arr.ctypes.data
    mm = mmap.mmap(-1, 8192)
    assert ctx.reg_mr(mm).length == 8192
    ba = bytearray(100)
    m3 = ctx.reg_mr(ba)
    assert len({mr.rkey, m3.rkey, ctx.reg_mr(bytearray(1)).rkey}) == 3 and all(ctx.mrs)
    with pytest.raises(ValueError, match="writable"):
        ctx.reg_mr(b"read only")
    with pytest.raises(ValueError, match="contiguous"):
        ctx.reg_mr(np.zeros((8, 8))[:, 1])
    ctx.dereg_mr(m3)
    assert m3.rkey not in ctx.mrs
    ba.append(1)  # the export is released on deregistration


def test_qp_attr_limits_and_timeout_stages() -> None:
    attr = QpAttr(timeout=8, linear_cnt=3, exp_cnt=4)
    assert attr.ack_timeout_ns == 262_144 and attr.window == 1024
    for bad in (QpAttr(timeout=25), QpAttr(linear_cnt=8), QpAttr(exp_cnt=26), QpAttr(mpr=9)):
        with pytest.raises(ValueError):
            bad.check()
    _, _, qa, _ = pair(attr)
    seq = []
    for r in range(9):
        qa.retries = r
        seq.append(qa._rto_interval() // attr.ack_timeout_ns)
    assert seq == [1, 1, 1, 1, 2, 4, 8, 16, 32]  # linear stage (<= linear_cnt), then doubling


# ------------------------------------------------------------------------------------ immediates


def test_write_with_immediate_completes_only_when_every_byte_is_placed() -> None:
    a, b, qa, qb = pair()
    src = np.arange(20_000, dtype=np.uint8)
    dst = bytearray(20_000)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qb.post_recv(77)
    qa.post_send(5, smr, 0, 20_000, dmr.addr, dmr.rkey, imm=0xCAFE)
    dgs = a.datagrams_to_send(0)
    assert kinds(dgs) == [Opcode.RDMA_WRITE_ONLY] * 4 + [Opcode.RDMA_WRITE_ONLY_IMM]
    last = parse(dgs[-1].data)
    assert last.imm == 0xCAFE and last.flags & MxhFlag.LAST and last.ackreq
    deliver(b, dgs[::-1][:4], 1000)  # the immediate first, then all but the first packet
    assert qb.recv_cq.poll() == []
    deliver(b, dgs[:1], 2000)
    wc = qb.recv_cq.poll()
    assert [(w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data) for w in wc] == [
        (77, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM, 20_000, 0xCAFE)
    ]
    assert dst == src.tobytes()
    # the requester completes when every PSN is acknowledged
    deliver(a, b.datagrams_to_send(2000), 3000)
    assert [(w.wr_id, w.status, w.opcode) for w in qa.send_cq.poll()] == [
        (5, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE_WITH_IMM)
    ]
    assert not qa.busy


def test_immediate_without_posted_receive_is_refused() -> None:
    a, b, qa, _ = pair()
    smr, dmr = a.reg_mr(bytearray(b"x" * 64)), b.reg_mr(bytearray(64))
    qa.post_send(1, smr, 0, 64, dmr.addr, dmr.rkey, imm=1)
    deliver(b, a.datagrams_to_send(0), 10)
    assert bytes(dmr.view) == bytes(64) and b.drops == {"no_recv_buffer": 1}
    back = b.datagrams_to_send(10)
    assert kinds(back) == [Opcode.NACK] and parse(back[0].data).body.code == NackCode.NO_RECV_BUFFER  # type: ignore[union-attr]
    deliver(a, back, 20)
    # receiver not ready: the requester holds the packet for an RNR retry (tests/unit/
    # test_transport_hostile.py follows it to completion and to RNR_RETRY_EXC_ERR)
    assert qa.state == QpState.RTS and qa.c["rnr_rx"] == 1 and qa.send_cq.poll() == []


# ------------------------------------------------------------------------------------ protection


def test_wrong_rkey_bad_address_and_foreign_packets_never_touch_memory() -> None:
    a, b, qa, qb = pair()
    dst = bytearray(8192)
    dmr = b.reg_mr(dst)
    ro = b.reg_mr(bytearray(8192), access=0)  # type: ignore[arg-type]
    payload = b"\xee" * 4096

    def pkt(rkey: int, va: int, dqpn: int = qb.qpn, psn: int = 0, src: bytes = GA) -> bytearray:
        buf = bytearray(4200)
        n = build_write(
            buf, a.icrc(src, GB), dqpn=dqpn, psn=psn, ev_index=1, va=va, rkey=rkey, payload=payload,
            timestamp_ns=5,
        )
        return buf[:n]

    b.receive(pkt(dmr.rkey ^ 1, dmr.addr), 1)  # unknown R_Key
    b.receive(pkt(ro.rkey, ro.addr), 2)  # region without remote write
    b.receive(pkt(dmr.rkey, dmr.addr + 8192 - 100), 3)  # runs past the end
    b.receive(pkt(dmr.rkey, dmr.addr - 1), 4)  # starts before it
    b.receive(pkt(dmr.rkey, dmr.addr, dqpn=0xABCDE), 5)  # foreign QPN
    b.receive(pkt(dmr.rkey, dmr.addr, src=GX), 6)  # another host's packet (ICRC covers addresses)
    b.receive(pkt(dmr.rkey, dmr.addr, psn=5000), 7)  # beyond the MPR window
    assert dst == bytes(8192)
    assert b.drops == {"bad_rkey": 2, "bad_va": 2, "unknown_qpn": 1, "bad_icrc": 1, "out_of_window": 1}
    nacks = [parse(dg.data) for dg in b.datagrams_to_send(8)]
    assert [(p.opcode, p.body.code) for p in nacks] == [  # type: ignore[union-attr]
        (Opcode.NACK, NackCode.BAD_RKEY), (Opcode.NACK, NackCode.BAD_RKEY),
        (Opcode.NACK, NackCode.BAD_VA), (Opcode.NACK, NackCode.BAD_VA),
        (Opcode.NACK, NackCode.OUT_OF_WINDOW),
    ]
    assert qb.rcv_cum == 0 and qb.rbits == 0
    # a requester told its R_Key is wrong fails the WRITE instead of retrying forever
    smr = a.reg_mr(bytearray(payload))
    qa.post_send(3, smr, 0, 4096, dmr.addr, 0x1234)
    deliver(b, a.datagrams_to_send(10), 11)
    deliver(a, b.datagrams_to_send(11), 12)
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.REM_ACCESS_ERR]
    assert [(e.kind, e.detail) for e in a.poll_async_events()] == [("QP_FATAL", "REM_ACCESS_ERR")]


def test_malformed_datagrams_are_counted_by_reason_and_never_raise() -> None:
    a, b, _, qb = pair()
    dmr = b.reg_mr(bytearray(4096))
    buf = bytearray(4200)
    n = build_write(buf, a.icrc(GA, GB), dqpn=qb.qpn, psn=0, ev_index=0, va=dmr.addr, rkey=dmr.rkey,
                    payload=b"z" * 100)
    good = bytes(buf[:n])
    b.receive(b"", 0)
    b.receive(good[:5], 0)
    b.receive(good[:30], 0)  # BTH present, headers cut
    b.receive(good[:-1], 0)  # one byte short
    flipped = bytearray(good)
    flipped[60] ^= 1
    b.receive(flipped, 0)  # payload corrupted
    bad_op = bytearray(good)
    bad_op[0] = 0x42
    b.receive(bad_op, 0)
    assert b.drops == {"truncated": 4, "bad_icrc": 1, "bad_opcode": 1}
    assert bytes(dmr.view) == bytes(4096) and not b.datagrams_to_send(0)


# ------------------------------------------------------------------------------------ acknowledgements


def test_sack_bytes_report_cumulative_point_bitmap_and_echo() -> None:
    a, b, qa, _ = pair(QpAttr(ack_coalesce=1))
    smr, dmr = a.reg_mr(bytearray(4 * 4096)), b.reg_mr(bytearray(4 * 4096))
    qa.post_send(1, smr, 0, 4 * 4096, dmr.addr, dmr.rkey)
    d = a.datagrams_to_send(1_000)
    deliver(b, [d[0]], 2_000)
    deliver(b, [d[2]], 3_000, ecn=True)
    sacks = b.datagrams_to_send(3_000)
    p = parse(sacks[-1].data, b.icrc(GB, GA))
    assert p.opcode == Opcode.SACK and p.dqpn == qa.qpn and p.psn == 2
    s = p.body
    assert (s.cum_psn, s.acked_psns(), s.echo_ev_index, s.echo_flags, s.echo_timestamp_ns) == (  # type: ignore[union-attr]
        1, [2], parse(d[2].data).ev_index, int(SackFlag.ECN_CE), 1_000 + qa.ts_off
    )  # the echo of the data packet's MXH timestamp: send time plus the QP's random offset
    # bit-exact: the same SACK built directly
    ref = bytearray(len(sacks[-1].data))
    build_sack(
        ref, b.icrc(GB, GA), dqpn=qa.qpn, psn=2, ev_index=p.ev_index, cum_psn=1, bitmap=0b1,
        echo_ev_index=s.echo_ev_index, echo_timestamp_ns=1_000 + qa.ts_off,  # type: ignore[union-attr]
        echo_flags=int(SackFlag.ECN_CE),
        timestamp_ns=3_000,
    )
    assert bytes(sacks[-1].data) == bytes(ref)
    # duplicates are counted, not placed twice, and answered with DUPLICATE
    deliver(b, [d[2]], 4_000)
    dup = parse(b.datagrams_to_send(4_000)[0].data).body
    assert dup.echo_flags == SackFlag.DUPLICATE and b.drops == {"duplicate": 1}  # type: ignore[union-attr]
    deliver(a, sacks, 5_000)
    assert qa.snd_una == 1 and qa.sacked == 0b10


def test_coalesced_acks_and_delayed_ack_timer() -> None:
    a, b, qa, _ = pair(QpAttr(ack_coalesce=4, ack_delay_ns=3_000))
    smr, dmr = a.reg_mr(bytearray(10 * 4096)), b.reg_mr(bytearray(10 * 4096))
    qa.post_send(1, smr, 0, 10 * 4096, dmr.addr, dmr.rkey)
    d = a.datagrams_to_send(0)
    # AckReq while less than ack_coalesce packets are in flight, and on the message's last packet
    assert [parse(g.data).ackreq for g in d] == [True] * 3 + [False] * 6 + [True]
    deliver(b, d[:3], 100)
    assert kinds(b.datagrams_to_send(100)) == [Opcode.SACK] * 3
    deliver(b, d[3:9], 200)
    assert kinds(b.datagrams_to_send(200)) == [Opcode.SACK]  # one SACK for four packets
    assert b.next_deadline() == 3_200  # the last two wait for the delayed-ACK timer
    b.handle_timer(3_200)
    late = b.datagrams_to_send(3_200)
    s = parse(late[0].data).body
    assert s.cum_psn == 9 and s.service_time_ns == 3_000  # type: ignore[union-attr]
    # no ACK timer left: only the sweep of the message whose last packet never came
    assert b.next_deadline() == 100 + QpAttr().rx_msg_timeout_ns


@pytest.mark.parametrize(("delay_ns", "sacks"), [(4_000, 8), (None, 2)])
def test_mrcds_delayed_ack_answers_a_busy_loop_every_few_turns_not_every_turn(
    delay_ns: int | None, sacks: int
) -> None:
    """A responder handed 4 data packets per loop turn, turns 20 us apart, each turn's receive taking
    10 us before the timers run (as in mrcd's loop): at the engine's 4 us delayed ACK every turn sends a
    SACK; at mrcd's (hostconfig.MRCD_ACK_DELAY_NS) the delay or the 16-packet coalescing run, whichever
    comes first, answers: fewer SACKs for the same packets, every packet acknowledged."""
    from mrc import hostconfig

    delay = hostconfig.MRCD_ACK_DELAY_NS if delay_ns is None else delay_ns
    a, b, qa, _ = pair(QpAttr(ack_req_floor=0, ack_delay_ns=delay))
    smr, dmr = a.reg_mr(bytearray(64 * 4096)), b.reg_mr(bytearray(64 * 4096))
    qa.post_send(1, smr, 0, 64 * 4096, dmr.addr, dmr.rkey)
    d = a.datagrams_to_send(0)[:32]
    assert not any(parse(g.data).ackreq for g in d[1:])
    sent = []
    for turn in range(8):
        now = 1_000 + 20_000 * turn
        deliver(b, d[4 * turn : 4 * turn + 4], now)
        now += 10_000
        dl = b.next_deadline()
        if dl is not None and dl <= now:
            b.handle_timer(now)
        sent += b.datagrams_to_send(now)
    assert kinds(sent).count(Opcode.SACK) == sacks
    dl = b.next_deadline()
    if dl is not None and dl - now <= delay:  # what the last turns left waits for the delayed ACK
        b.handle_timer(dl)
        sent += b.datagrams_to_send(dl)
    assert max(parse(g.data).body.cum_psn for g in sent) == 32  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------ loss and paths


def test_lost_packet_is_retransmitted_on_another_ev_and_its_ev_retired() -> None:
    a, b, qa, _ = pair(QpAttr(ack_coalesce=1, reorder_ns=0, ack_delay_ns=0), evs=16)
    smr, dmr = a.reg_mr(bytearray(range(256)) * 64), b.reg_mr(bytearray(16384))
    qa.post_send(1, smr, 0, 16384, dmr.addr, dmr.rkey)
    d = a.datagrams_to_send(0)
    lost_ev = parse(d[1].data).ev_index
    deliver(b, [d[0], d[2], d[3]], 5_000)
    deliver(a, b.datagrams_to_send(5_000), 10_000)
    a.handle_timer(a.next_deadline() or 0)
    t = 30_000
    a.handle_timer(t)
    retx = a.datagrams_to_send(t)
    p = next(parse(g.data) for g in retx if g.data[0] < 0x10)  # (a probe of the retired EV may come first)
    assert p.psn == 1 and p.flags & MxhFlag.RETX and p.ev_index != lost_ev
    assert qa.paths.state[lost_ev] == 1 and qa.c["retx_sack"] == 1
    ev = a.poll_ev_events()
    assert [(e.ev_index, e.state.name, e.lost, e.drop_count) for e in ev] == [(lost_ev, "ASSUMED_BAD", 1, 0)]
    deliver(b, retx, t + 1)
    deliver(a, b.datagrams_to_send(t + 1), t + 2)
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.SUCCESS]
    assert bytes(dmr.view) == bytes(smr.view)


def test_trimmed_packet_is_nacked_and_resent_at_once_without_retiring_the_ev() -> None:
    from mrc.wire import trim_in_place

    a, b, qa, _ = pair()
    smr, dmr = a.reg_mr(bytearray(b"t" * 8192)), b.reg_mr(bytearray(8192))
    qa.post_send(1, smr, 0, 8192, dmr.addr, dmr.rkey)
    d = a.datagrams_to_send(0)
    ev = parse(d[0].data).ev_index
    n = trim_in_place(d[0].data, len(d[0].data))
    b.receive(memoryview(d[0].data)[:n], 1_000, False, d[0].port)
    back = b.datagrams_to_send(1_000)
    assert [(p.opcode, p.body.code) for p in map(lambda g: parse(g.data), back)] == [  # type: ignore[union-attr]
        (Opcode.NACK, NackCode.TRIMMED)
    ]
    deliver(a, back, 2_000)
    retx = a.datagrams_to_send(2_000)
    assert len(retx) == 1 and parse(retx[0].data).psn == 0 and parse(retx[0].data).ev_index != ev
    assert qa.paths.state[ev] == 0 and qa.paths.pen[ev] > 0 and qa.c["retx_trim"] == 1
    assert list(qa.trim_recoveries) == [2_000]
    assert bytes(dmr.view) == bytes(8192)


def test_probes_back_off_and_restore_an_assumed_bad_ev() -> None:
    attr = QpAttr(
        probe_interval_ns=10_000, probe_timeout_ns=5_000, probe_max_interval_ns=40_000, probe_good=2
    )
    a, b, qa, _ = pair(attr, evs=16)
    qa.paths.loss(3, 0)
    assert qa.paths.state[3] == 1 and a.next_deadline() == 10_000
    sent_at = []
    t = 0
    for _ in range(4):  # every probe unanswered: 10 us, then timeouts double the interval up to 40 us
        t = a.next_deadline() or 0
        a.handle_timer(t)
        out = a.datagrams_to_send(t)
        if out:
            assert [(p.opcode, p.ev_index) for p in map(lambda g: parse(g.data), out)] == [(Opcode.PROBE, 3)]
            assert out[0].port == qa.paths.ev_port[3]
            sent_at.append(t)
    # probe at 10 us, timeout at 15 us, next after 20 us; its timeout at 40 us, next after 40 us (the cap)
    assert sent_at == [10_000, 35_000] and t == 40_000
    t = a.next_deadline() or 0
    assert t == 80_000
    for _ in range(2):  # two answered probes bring it back
        a.handle_timer(t)
        probe = a.datagrams_to_send(t)
        deliver(b, probe, t + 100)
        deliver(a, b.datagrams_to_send(t + 100), t + 200)
        t = a.next_deadline() or t
    assert qa.paths.state[3] == 0
    ev = a.poll_ev_events()
    assert [(e.ev_index, e.state.name) for e in ev] == [(3, "ASSUMED_BAD"), (3, "GOOD")]
    res = a.poll_probe_results()
    assert [r.ok for r in res] == [False, False, True, True] and all(r.rtt_ns == 200 for r in res if r.ok)
    assert a.next_deadline() is None


def test_spraying_balances_ports_and_respects_states() -> None:
    _, _, qa, _ = pair(evs=64, ports=4)
    paths = qa.paths
    picks = [paths.next_ev() for _ in range(640)]
    assert all(x != y for x, y in itertools.pairwise(picks))
    per_port = [sum(1 for i in picks if paths.ev_port[i] == p) for p in range(4)]
    assert per_port == [160] * 4 and set(picks) == set(range(64))
    # the floor: never fewer than ev_min_active GOOD EVs
    for i in range(64):
        paths.loss(i, 0)
    assert paths.good_count == paths.min_active == 16
    # DENIED EVs are never used nor probed, until the controller allows them again
    prof = paths.profile
    prof.deny([i for i in range(64) if paths.ev_port[i] == 0])
    assert all(paths.ev_port[paths.next_ev()] != 0 for _ in range(200))
    assert all(i not in paths.probe_at for i in range(0, 64, 4))
    prof.allow([0, 4])
    assert paths.state[0] == paths.state[4] == 0
    # steering: penalised EVs are used less, their port's share falls
    _, _, q2, _ = pair(evs=64, ports=4)
    for i in range(64):
        if q2.paths.ev_port[i] == 1:
            q2.paths.penalise(i)
            q2.paths.penalise(i)
    q2.paths._refresh()
    picks = [q2.paths.next_ev() for _ in range(1000)]
    share1 = sum(1 for i in picks if q2.paths.ev_port[i] == 1) / 1000
    assert share1 < 0.1


def test_port_admin_denies_the_port() -> None:
    a, _, qa, _ = pair(evs=8, ports=2)
    a.modify_port(1, False)
    assert [qa.paths.state[i] for i in range(8)] == [0, 2] * 4
    a.modify_port(1, True)
    assert qa.paths.state == [0] * 8


def test_port_status_tells_the_peer_to_stop_spraying_toward_a_port() -> None:
    a, b, _, qb = pair(evs=8, ports=2)
    a.modify_port(1, False, 0)
    out = a.datagrams_to_send(0)
    st = [parse(g.data) for g in out if g.data[0] == Opcode.PORT_STATUS]
    assert len(st) == 1 and out[0].port == 0  # sent over a port that is still up
    assert (st[0].body.port, st[0].body.state) == (1, 0)  # type: ignore[union-attr]
    deliver(b, out, 10)
    assert [qb.paths.state[i] for i in range(8)] == [0, 2] * 4  # B no longer sprays toward A's port 1
    assert all(qb.paths.ev_port[qb.paths.next_ev()] == 0 for _ in range(20))
    deliver(b, out, 20)  # a replay (same epoch) is stale
    assert b.drops == {"port_status_stale": 1}
    b_prof = qb.paths.profile
    b_prof.deny([3])  # the controller's own DENY survives the port coming back
    a.modify_port(1, True, 30)
    deliver(b, a.datagrams_to_send(30), 40)
    assert [qb.paths.state[i] for i in range(8)] == [0, 0, 0, 2, 0, 0, 0, 0]
    assert qb.c["port_status_rx"] == 2


def test_generated_ev_profile_from_field_descriptions() -> None:
    from mrc.transport import EvField, expand_ev

    # the STEV example of mrc_ctl.h: T0 8 bits (links 0..179 exist), T1 4 bits, T2 4 bits
    fields = [EvField(8, 0, 0, 179, 0xFF), EvField(4, 0, 0, 15, 0xF), EvField(4, 0, 0, 15, 0xF)]
    assert expand_ev(0x12345 & 0xFFFF, fields) == (0x2345, [0x23, 0x4, 0x5])
    prof = EvProfile.generate(1, fields, 128, 4)
    assert [e.ev for e in prof.entries[:3]] == [0x0000, 0x0001, 0x0002]
    assert [e.port for e in prof.entries[:5]] == [0, 1, 2, 3, 0] and prof.ev_min_active == 32
    # SRv6 example: a fixed 32-bit locator, then uSIDs whose high byte is the tier and low byte generated
    srv6 = [EvField(32, 0xDEADCAFE)] + [EvField(16, t << 8, t << 8, (t << 8) | 0xFF, 0xFF) for t in (1, 2)]
    p2 = EvProfile.generate(2, srv6, 8, 2)
    assert p2.entries[1].ev == (0xDEADCAFE << 32) | (0x0100 << 16) | 0x0201
    # T0 values above max_val are skipped
    only = EvProfile.generate(3, [EvField(8, 0, 0, 2, 0xFF)], 3, 1)
    assert [e.ev for e in only.entries] == [0, 1, 2]
    with pytest.raises(ValueError, match="allow 3 EVs"):
        EvProfile.generate(4, [EvField(8, 0, 0, 2, 0xFF)], 4, 1)


def test_stale_and_foreign_source_packets_are_counted() -> None:
    a, b, qa, qb = pair()
    smr, dmr = a.reg_mr(bytearray(b"s" * 8192)), b.reg_mr(bytearray(8192))
    qa.post_send(1, smr, 0, 8192, dmr.addr, dmr.rkey)
    d = a.datagrams_to_send(0)
    deliver(b, d, 10)
    assert qb.rcv_cum == 2
    deliver(b, d[:1], 20)  # PSN 0 again, now below the cumulative point
    assert b.drops == {"stale": 1} and qb.c["stale_rx"] == 1
    back = [parse(g.data).body for g in b.datagrams_to_send(20)]
    assert back[-1].echo_flags == SackFlag.DUPLICATE and back[-1].cum_psn == 2  # type: ignore[union-attr]
    b.receive(d[0].data, 30, src=GX)  # the driver saw another source address
    assert b.drops["foreign_src"] == 1
    assert bytes(dmr.view) == b"s" * 8192


def test_control_packets_follow_the_echo_spread_over_the_port_and_avoid_a_dead_port() -> None:
    """SACKs, NACKs and probe replies leave on the EV the triggering packet came on when it is GOOD here
    (same index, same plane and spine back); otherwise on the GOOD EVs of that port in turn (one fixed
    EV per port put every acknowledgement of a port on one spine's links: a failure of that link
    silenced the port); when the port has none (its access link or its fabric path is failed: every EV
    denied by the controller, or suspect), a GOOD EV of another port, not EV 0 whatever its state (a
    probe reply on a dead path is lost, and the path it answers for is never restored)."""
    from mrc.transport.paths import ASSUMED_BAD, DENIED, GOOD, PathSet

    prof = EvProfile.even(1, 8, 2)  # EV i on port i % 2
    ps = PathSet(prof, 7, (20_000, 2_000_000, 200_000, 2))
    assert ps.ctl_ev(0, 4) == 4 and ps.ctl_ev(1, 3) == 3  # the echo
    assert {ps.ctl_ev(0) for _ in range(8)} == {0, 2, 4, 6}  # no echo: every EV of the port in turn
    assert ps.ev_port[ps.ctl_ev(0, 3)] == 0  # an echo of another port is not followed
    ps.state[4] = ASSUMED_BAD
    ps._rebuild()
    assert ps.ctl_ev(0, 4) != 4 and ps.ev_port[ps.ctl_ev(0, 4)] == 0  # nor one that is suspect here
    ps.state[4] = GOOD
    ps._rebuild()
    prof.deny([0, 2, 4, 6])  # every EV of port 0
    assert [ps.state[i] for i in (0, 2, 4, 6)] == [DENIED] * 4
    ev = ps.ctl_ev(0, 2)
    assert ps.ev_port[ev] == 1 and ps.state[ev] == GOOD
    prof.allow([0, 2, 4, 6])
    assert ps.ev_port[ps.ctl_ev(0)] == 0
    for i in (0, 2, 4, 6):  # all of port 0 suspect: still a GOOD EV of port 1
        ps.state[i] = ASSUMED_BAD
    ps._rebuild()
    assert ps.ev_port[ps.ctl_ev(0)] == 1


def test_a_loss_call_is_refuted_only_by_the_lost_transmission_or_a_later_one() -> None:
    """`PathSet.refute`: the EV retired by the loss of PSN 10 sent at 1,000 ns comes back when that
    transmission, or one sent on it later, is shown delivered within a probe's timeout; not by a
    delivery sent earlier, nor by another packet of the same burst (one timestamp), nor by one
    answered later than a probe may be; and an EV that is not ASSUMED_BAD is left alone."""
    from mrc.transport import EvState
    from mrc.transport.paths import ASSUMED_BAD, DENIED, GOOD, PathSet

    EV_ASSUMED_BAD = EvState.ASSUMED_BAD
    prof = EvProfile.even(1, 8, 2)
    ps = PathSet(prof, 7, (20_000, 2_000_000, 200_000, 2))
    ps.loss(3, 50_000, 1_000, 10)
    assert ps.state[3] == ASSUMED_BAD and 3 in ps.probe_at and ps.next_probe_deadline == 70_000
    assert not ps.refute(3, 999, 9, 60_000)  # sent before the lost one: says nothing since
    assert not ps.refute(3, 1_000, 11, 60_000)  # the same burst, another packet
    assert not ps.refute(3, 1_000, 10, 1_000 + 200_001)  # later than a probe's timeout
    assert ps.state[3] == ASSUMED_BAD and ps.refuted == 0
    assert ps.refute(3, 1_000, 10, 60_000)  # the lost transmission itself arrived
    assert ps.state[3] == GOOD and ps.refuted == 1 and 3 not in ps.probe_at
    assert ps.next_probe_deadline == 1 << 62 and ps.good_count == 8
    ps.loss(5, 90_000, 2_000, 20)
    assert ps.refute(5, 2_500, 23, 95_000)  # a later transmission on it arrived
    assert not ps.refute(5, 3_000, 24, 96_000)  # GOOD already
    prof.deny([6])
    assert not ps.refute(6, 4_000, 30, 97_000) and ps.state[6] == DENIED
    ps.set_state(7, EV_ASSUMED_BAD, 98_000)  # the controller's mark: only probes undo it
    assert not ps.refute(7, 98_000, 31, 99_000) and ps.state[7] == ASSUMED_BAD
    assert ps.refuted == 2
    ev = [(e.ev_index, e.state.name) for e in ps.events]
    assert ev == [(3, "ASSUMED_BAD"), (3, "GOOD"), (5, "ASSUMED_BAD"), (5, "GOOD"), (7, "ASSUMED_BAD")]
