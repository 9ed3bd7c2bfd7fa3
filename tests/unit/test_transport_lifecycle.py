"""The engine's object lifecycle as mrc.h defines it: the QP state machine of `modify_qp` (every legal and
illegal transition, reuse after ERROR through RESET), `destroy_qp`/`destroy_cq`/`destroy_ev_profile`, and
profile ids that cannot collide."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mrc.sim.loopback import GID_A, GID_B, LoopbackConfig, LoopbackFabric, LoopbackRun, build, run_transfer
from mrc.transport import (
    AsyncEventKind,
    Context,
    EvProfile,
    Nscc,
    NsccConfig,
    QpAttr,
    QpState,
    QueueFull,
    QueuePair,
    WcStatus,
)
from mrc.transport.engine import FIRST_QPN, MAX_QPN

GA = bytes.fromhex("fd000000000000000000000000000001")
GB = bytes.fromhex("fd000000000000000000000000000002")

LEGAL = {
    QpState.RESET: {QpState.RESET, QpState.INIT, QpState.ERROR},
    QpState.INIT: {QpState.RESET, QpState.INIT, QpState.RTR, QpState.ERROR},
    QpState.RTR: {QpState.RESET, QpState.RTS, QpState.ERROR},
    QpState.RTS: {QpState.RESET, QpState.RTS, QpState.ERROR},
    QpState.ERROR: {QpState.RESET, QpState.ERROR},
}
STATES = list(LEGAL)


def _ctx(gid: bytes = GA, ports: int = 2) -> tuple[Context, QueuePair]:
    ctx = Context(gid, ports=ports, seed=1)
    prof = ctx.create_ev_profile(count=8)
    qp = ctx.create_qp(ctx.create_cq(), ev_profile=prof)
    return ctx, qp


def _drive_to(ctx: Context, qp: QueuePair, state: QpState) -> None:
    """From a fresh QP (INIT) to `state` along legal steps only."""
    if state == QpState.RESET:
        ctx.modify_qp(qp, QpState.RESET)
    elif state == QpState.ERROR:
        ctx.modify_qp(qp, QpState.ERROR)
    elif state in (QpState.RTR, QpState.RTS):
        ctx.modify_qp(qp, QpState.RTR, remote_gid=GB, remote_qpn=0x100)
        if state == QpState.RTS:
            ctx.modify_qp(qp, QpState.RTS)
    assert qp.state == state


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(STATES, STATES)))
def test_every_modify_qp_transition(src: QpState, dst: QpState) -> None:
    ctx, qp = _ctx()
    _drive_to(ctx, qp, src)
    kw = {"remote_gid": GB, "remote_qpn": 0x100} if dst == QpState.RTR else {}
    if dst in LEGAL[src]:
        ctx.modify_qp(qp, dst, **kw)  # type: ignore[arg-type]
        assert qp.state == dst
    else:
        with pytest.raises(ValueError, match=f"{src.name} -> {dst.name}"):
            ctx.modify_qp(qp, dst, **kw)  # type: ignore[arg-type]
        assert qp.state == src  # nothing changed


def test_rtr_needs_a_peer() -> None:
    ctx, qp = _ctx()
    with pytest.raises(ValueError, match="remote_gid and remote_qpn"):
        ctx.modify_qp(qp, QpState.RTR)
    with pytest.raises(ValueError, match="16 bytes"):
        ctx.modify_qp(qp, QpState.RTR, remote_gid=b"\x01", remote_qpn=5)
    assert qp.state == QpState.INIT


def _pair() -> tuple[Context, Context, QueuePair, QueuePair]:
    a, qa = _ctx(GA)
    b, qb = _ctx(GB)
    return a, b, qa, qb


def _exchange(a: Context, b: Context, now: int, rounds: int = 64) -> int:
    """Deliver everything both ways (no loss) until quiet; returns the time reached."""
    for _ in range(rounds):
        out_a = a.datagrams_to_send(now)
        out_b = b.datagrams_to_send(now)
        if not out_a and not out_b:
            for ctx in (a, b):
                dl = ctx.next_deadline()
                if dl is not None and dl < now + 1_000_000:
                    now = max(now, dl)
                    ctx.handle_timer(now)
        for dst, dgs in ((b, out_a), (a, out_b)):
            for dg in dgs:
                dst.receive(dg.data, now, False, dg.port)
        now += 1_000
    return now


def _write(a: Context, b: Context, qa: QueuePair, qb: QueuePair, fill: int, now: int) -> tuple[bool, int]:
    src = np.full(64 << 10, fill, dtype=np.uint8)
    dst = np.zeros(64 << 10, dtype=np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qb.post_recv(9)
    qa.post_send(1, smr, 0, len(src), dmr.addr, dmr.rkey, imm=fill)
    now = _exchange(a, b, now)
    wc = qa.send_cq.poll()
    rwc = qb.recv_cq.poll()
    ok = (bool(wc) and wc[0].status == WcStatus.SUCCESS and bool(rwc) and rwc[0].imm_data == fill
          and bool((dst == fill).all()))
    return ok, now


def test_an_rtr_responder_receives_before_it_may_send() -> None:
    a, b, qa, qb = _pair()
    qa.connect(GB, qb.qpn)
    b.modify_qp(qb, QpState.RTR, remote_gid=GA, remote_qpn=qa.qpn)
    ok, _ = _write(a, b, qa, qb, 7, 0)
    assert ok and qb.state == QpState.RTR and b.drops.get("qp_state", 0) == 0


def test_a_qp_in_error_is_reused_through_reset() -> None:
    """ERR -> RESET -> INIT -> RTR -> RTS: the same QP (same QPN, CQs, profile) carries a new
    connection bit-exact; what was posted before the error completed WR_FLUSH_ERR."""
    a, b, qa, qb = _pair()
    qa.connect(GB, qb.qpn)
    qb.connect(GA, qa.qpn)
    ok, now = _write(a, b, qa, qb, 3, 0)
    assert ok
    src = np.ones(8192, dtype=np.uint8)
    smr = a.reg_mr(src)
    qa.post_send(2, smr, 0, 8192, 0, 0)  # never sent: flushed by the error
    a.modify_qp(qa, QpState.ERROR, now)
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.WR_FLUSH_ERR]
    qpn, cq, prof = qa.qpn, qa.send_cq, qa.paths.profile
    for st in (QpState.RESET, QpState.INIT):
        a.modify_qp(qa, st)
    assert qa.state == QpState.INIT and qa.snd_nxt == qa.snd_una and not qa.wrs_out
    assert qa.paths in prof.paths and len(prof.paths) == 1  # the old path set left the profile
    a.modify_qp(qa, QpState.RTR, remote_gid=GB, remote_qpn=qb.qpn)
    a.modify_qp(qa, QpState.RTS)
    # the peer resets too (its receive PSN must start where ours does again)
    b.modify_qp(qb, QpState.RESET)
    b.modify_qp(qb, QpState.INIT)
    qb.connect(GA, qa.qpn)
    ok, _ = _write(a, b, qa, qb, 5, now)
    assert ok and (qa.qpn, qa.send_cq, qa.paths.profile) == (qpn, cq, prof)


def test_destroy_qp_and_cq() -> None:
    a, _b, qa, qb = _pair()
    qa.connect(GB, qb.qpn)
    qb.connect(GA, qa.qpn)
    cq = qa.send_cq
    with pytest.raises(ValueError, match="used by QP"):
        a.destroy_cq(cq)
    prof = qa.paths.profile
    a.destroy_qp(qa)
    assert qa.qpn not in a.qps and qa.paths not in prof.paths and a.next_deadline() is None
    with pytest.raises(ValueError, match="not a QP"):
        a.destroy_qp(qa)
    # packets for it are now foreign: dropped by reason, nothing raised
    pkt = bytearray(64)
    pkt[5:8] = qa.qpn.to_bytes(3, "big")
    a.receive(bytes(pkt), 0)
    assert a.drops == {"unknown_qpn": 1}
    a.destroy_cq(cq)
    assert cq.cqn not in a.cqs
    with pytest.raises(ValueError, match="not a CQ"):
        a.destroy_cq(cq)
    assert a.create_cq().cqn != cq.cqn  # CQ numbers are not reused
    a.destroy_ev_profile(prof)
    assert prof.profile_id not in a.ev_profiles


def test_profile_ids_cannot_collide() -> None:
    """Reproduced on 455353a: even(2, ...) then create_ev_profile() gave two profiles with id 2, and
    modify_port missed the first one's QPs."""
    ctx = Context(GA, ports=2)
    first = ctx.create_ev_profile(EvProfile.even(2, 8, 2))
    second = ctx.create_ev_profile()
    assert first.profile_id != second.profile_id and len(ctx.ev_profiles) == 2
    with pytest.raises(ValueError, match="exists already"):
        ctx.create_ev_profile(EvProfile.even(2, 8, 2))
    qp = ctx.create_qp(ctx.create_cq(), ev_profile=first)
    ctx.modify_port(1, False, notify_peers=False)
    assert all(qp.paths.state[i] != 0 or e.port != 1 for i, e in enumerate(first.entries))
    assert qp.paths.counts()["DENIED"][1] == sum(e.port == 1 for e in first.entries)
    with pytest.raises(ValueError, match="used by QP"):
        ctx.destroy_ev_profile(first)
    assert ctx.next_ev_profile_id() not in ctx.ev_profiles


def test_async_events_are_typed() -> None:
    r = build(LoopbackConfig(size=1 << 20, seed=1))
    r.qa.set_error(WcStatus.RETRY_EXC_ERR, 0)
    ev = r.a.poll_async_events()
    assert [e.kind for e in ev] == [AsyncEventKind.QP_FATAL] and ev[0].kind == "QP_FATAL"
    assert run_transfer(build(LoopbackConfig(size=1 << 16, seed=2)))["bit_exact"]


def test_connect_takes_the_smaller_path_mtu_of_the_two_ends() -> None:
    # A's ports take 8 KiB payloads, B's 2 KiB (an MTU of 2200): exchanged with the QPNs, as RC QPs set
    # IBV_QP_PATH_MTU at RTR, both QPs send 2 KiB packets, whose bytes arrive intact; without it A's
    # 8 KiB packets would be dropped at B's ports
    cfg = LoopbackConfig(size=1 << 20, seed=2)
    fab = cfg.fabric
    a = Context(GID_A, ports=fab.planes, seed=5, name="A")
    b = Context(GID_B, ports=fab.planes, seed=6, name="B")
    nscc = NsccConfig.for_path(10_000, 1 << 20, 8192)
    qps = []
    for ctx, mtu in ((a, 8192), (b, 2048)):
        prof = ctx.create_ev_profile(EvProfile.even(1, cfg.evs, fab.planes))
        qps.append(ctx.create_qp(ctx.create_cq(), ev_profile=prof, cc_profile=ctx.create_cc_profile(nscc),
                                 attr=QpAttr(mtu=mtu)))
    qa, qb = qps
    with pytest.raises(ValueError, match=r"path_mtu must be 64\.\.8192"):
        qa.connect(GID_B, qb.qpn, path_mtu=16384)
    assert qa.state == QpState.INIT and qa.mtu == 8192
    qa.connect(GID_B, qb.qpn, path_mtu=qb.mtu)
    qb.connect(GID_A, qa.qpn, path_mtu=qa.mtu)
    assert (qa.mtu, qb.mtu, qa.attr.mtu) == (2048, 2048, 2048)
    cc = qa.cc
    assert isinstance(cc, Nscc) and cc.cfg.eta == pytest.approx(0.15 * 2048) and cc.min_cwnd == 2048
    src = np.frombuffer(np.random.default_rng(2).bytes(cfg.size), dtype=np.uint8).copy()
    run = LoopbackRun(cfg, a, b, qa, qb, LoopbackFabric(fab, a, b, cfg.seed), src, np.zeros_like(src))
    doc = run_transfer(run)
    assert doc["completed"] and doc["bit_exact"]
    assert doc["data_packets"] == (1 << 20) // 2048


def test_the_queues_are_bounded_by_max_send_wr_and_max_recv_wr() -> None:
    """ibv_qp_cap's limits: a post beyond them is refused (ENOMEM), nothing is queued, and the QP takes
    posts again once completions free the queue."""
    a, b = Context(GA, ports=2, seed=1), Context(GB, ports=2, seed=2)
    qs = []
    for ctx in (a, b):
        prof = ctx.create_ev_profile(count=8)
        qs.append(ctx.create_qp(ctx.create_cq(), ev_profile=prof, attr=QpAttr(max_send_wr=2, max_recv_wr=1)))
    qa, qb = qs
    qa.connect(GB, qb.qpn)
    qb.connect(GA, qa.qpn)
    src, dst = np.arange(3 * 4096, dtype=np.uint32).view(np.uint8)[: 3 * 4096], np.zeros(3 * 4096, np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qb.post_recv(1)
    with pytest.raises(QueueFull, match="receive queue full"):
        qb.post_recv(2)
    qa.post_send(1, smr, 0, 4096, dmr.addr, dmr.rkey)
    qa.post_send(2, smr, 4096, 4096, dmr.addr + 4096, dmr.rkey)
    with pytest.raises(QueueFull, match=r"send queue full .*max_send_wr"):
        qa.post_send(3, smr, 8192, 4096, dmr.addr + 8192, dmr.rkey)
    assert [w.wr_id for w in qa.wrs_out] == [1, 2]
    _exchange(a, b, 0)
    assert [w.wr_id for w in qa.send_cq.poll()] == [1, 2]
    qa.post_send(3, smr, 8192, 4096, dmr.addr + 8192, dmr.rkey)  # room again
    _exchange(a, b, 10_000_000)
    assert [w.status for w in qa.send_cq.poll()] == [WcStatus.SUCCESS] and bytes(dst) == bytes(src)
    for bad in (0, (1 << 16) + 1):
        with pytest.raises(ValueError, match=r"max_send_wr must be 1\.\.65536"):
            QpAttr(max_send_wr=bad).check()
        with pytest.raises(ValueError, match=r"max_recv_wr must be 1\.\.65536"):
            QpAttr(max_recv_wr=bad).check()


def test_qp_numbers_wrap_around_and_skip_those_in_use() -> None:
    """24-bit QPNs used to run out for good after 16.7 million create/destroy pairs (a client's loop
    could end mrcd's ability to make QPs); they wrap to the first number, skipping live QPs."""
    ctx, first = _ctx()
    assert first.qpn == FIRST_QPN
    prof = first.paths.profile
    cq = first.send_cq
    ctx._next_qpn = MAX_QPN
    last = ctx.create_qp(cq, ev_profile=prof)
    assert last.qpn == MAX_QPN
    wrapped = ctx.create_qp(cq, ev_profile=prof)
    assert wrapped.qpn == FIRST_QPN + 1  # FIRST_QPN is still in use
    ctx.destroy_qp(first)
    ctx._next_qpn = MAX_QPN
    assert ctx.create_qp(cq, ev_profile=prof).qpn == FIRST_QPN  # MAX_QPN in use: wraps, takes the free one
