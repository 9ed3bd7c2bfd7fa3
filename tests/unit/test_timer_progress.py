"""Timers make progress: after `handle_timer(now)` no armed deadline is at or before `now`.

A driver sleeps until `next_deadline()` and then calls `handle_timer`; a deadline that stays due after
that call is due for ever, and mrcd's loop (and any driver like it) turns into a busy spin that burns a
core for as long as the QP lives. Two such deadlines existed: an RTR responder's sweep of an incomplete
message (`on_timer` returned before the sweep outside RTS) and a probe of a peer's port that the port's
return overtook (the EV, GOOD again, kept a due `probe_at` entry that `due_probes` never removed). The
scenarios below pin both; the random one drives a QP pair through losses, WRITEs, controller overrides
and peer port reports and checks the invariant after every timer."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc.transport import Context, EvState, QpState, QueuePair, WcStatus

GA = bytes.fromhex("fd000000000000000000000000000001")
GB = bytes.fromhex("fd000000000000000000000000000002")
EVS = 8


def _pair(b_state: QpState = QpState.RTS) -> tuple[Context, Context, QueuePair, QueuePair]:
    a = Context(GA, ports=2, seed=1)
    b = Context(GB, ports=2, seed=2)
    qa = a.create_qp(a.create_cq(), ev_profile=a.create_ev_profile(count=EVS))
    qb = b.create_qp(b.create_cq(), ev_profile=b.create_ev_profile(count=EVS))
    qa.connect(GB, qb.qpn)
    if b_state == QpState.RTS:
        qb.connect(GA, qa.qpn)
    else:
        b.modify_qp(qb, QpState.RTR, remote_gid=GA, remote_qpn=qa.qpn)
    return a, b, qa, qb


def _timers_progress(ctx: Context, now: int) -> bool:
    """Run the timers due at `now`; True when none is due any more."""
    ctx.handle_timer(now)
    ctx.datagrams_to_send(now)
    d = ctx.next_deadline()
    return d is None or d > now


def _run_timers(ctx: Context, now: int, rounds: int = 8) -> None:
    """Sleep to each deadline in turn and run the timers, as a driver does, checking the property."""
    for _ in range(rounds):
        d = ctx.next_deadline()
        if d is None:
            return
        now = max(now, d)
        assert _timers_progress(ctx, now), f"a deadline stays due at {now} ns"


def test_an_rtr_responder_sweeps_an_incomplete_message() -> None:
    """B is RTR only (it receives and acknowledges); A's WRITE loses every packet but the first. When
    the message's sweep is due, B forgets the message (counted) and nothing stays due."""
    a, b, qa, qb = _pair(QpState.RTR)
    src = np.full(64 << 10, 3, dtype=np.uint8)
    dst = np.zeros(64 << 10, dtype=np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qa.post_send(1, smr, 0, len(src), dmr.addr, dmr.rkey)
    out = a.datagrams_to_send(0)
    assert len(out) > 1
    b.receive(out[0].data, 1_000, False, out[0].port)
    _run_timers(b, 1_000)
    assert b.next_deadline() is None
    assert qb.c["rx_msg_expired"] == 1 and not qb.msgs
    assert qb.state == QpState.RTR


def test_a_controller_probe_of_an_rtr_qp_waits_for_rts() -> None:
    """A controller marks an EV of an RTR QP ASSUMED_BAD: nothing is due while the QP may not send;
    once it is RTS the probe goes out."""
    _, a, _, qa = _pair(QpState.RTR)  # `a` is the RTR end here
    qa.paths.set_state(2, EvState.ASSUMED_BAD, 1_000)
    d = a.next_deadline()
    assert d is None
    assert _timers_progress(a, 10_000_000)
    a.modify_qp(qa, QpState.RTS)
    d = a.next_deadline()
    assert d is not None and d <= 10_000_000  # the probe was due meanwhile
    a.handle_timer(10_000_000)
    probes = [dg for dg in a.datagrams_to_send(10_000_000) if dg.ev_index == 2]
    assert len(probes) == 1 and qa.c["probe_tx"] == 1
    assert a.next_deadline() is not None and a.next_deadline() > 10_000_000  # type: ignore[operator]


def test_a_peer_port_back_while_its_probe_is_out_leaves_nothing_due() -> None:
    """The peer reports its port 1 down; the engine probes an EV of that port; the port comes back
    before the probe is answered. The probe's timeout must not leave the (GOOD) EV a probe deadline."""
    a, _, qa, _ = _pair()
    p = qa.paths
    p.peer_port(1, False, 1_000)
    now = a.next_deadline()
    assert now is not None
    a.handle_timer(now)
    assert any(dg.port == 1 for dg in a.datagrams_to_send(now))  # the peer port's probe
    p.peer_port(1, True, now + 10)
    assert all(p.state[i] == int(EvState.GOOD) for i in range(p.n))
    _run_timers(a, now + 10)
    assert a.next_deadline() is None
    assert not p.probe_at and not p.probe_wait


def _drive(seed: int, steps: list[tuple[int, int]], b_rtr: bool) -> None:
    a, b, qa, qb = _pair(QpState.RTR if b_rtr else QpState.RTS)
    rng = random.Random(seed)
    src = np.arange(256 << 10, dtype=np.uint32).view(np.uint8)[: 256 << 10]
    dst = np.zeros(256 << 10, dtype=np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    now = 0
    wr = 0
    wire: list[tuple[Context, bytes, int]] = []
    for op, arg in steps:
        if op == 0:  # a WRITE of 1..64 KiB at a random offset
            n = 1 + arg % (64 << 10)
            off = rng.randrange(0, len(src) - n)
            wr += 1
            qa.post_send(wr, smr, off, n, dmr.addr + off, dmr.rkey)
        elif op == 1:  # the controller: an EV of A's QP to a state
            state = (EvState.GOOD, EvState.ASSUMED_BAD, EvState.DENIED)[arg % 3]
            qa.paths.set_state(arg % EVS, state, now)
        elif op == 2:  # the peer reports a port down or up
            qa.paths.peer_port(arg % 2, bool(arg & 2), now)
        elif op == 3:  # one of our ports disabled or enabled
            a.modify_port(arg % 2, bool(arg & 2), now)
        elif op == 4 and b_rtr and arg % 4 == 0:  # the RTR end may start sending
            b.modify_qp(qb, QpState.RTS, now)
            b_rtr = False
        # the wire: what both send, each datagram lost with probability arg/256 (up to ~1/4)
        loss = (arg % 64) / 256
        for ctx, peer in ((a, b), (b, a)):
            for dg in ctx.datagrams_to_send(now):
                if rng.random() >= loss:
                    wire.append((peer, bytes(dg.data), dg.port))
        rng.shuffle(wire)
        for peer, data, port in wire:
            peer.receive(data, now, False, port)
        wire.clear()
        # time: to the earliest deadline of either side (or a little), then every due timer
        ds = [d for d in (a.next_deadline(), b.next_deadline()) if d is not None]
        now = min(ds) if ds else now + 1_000
        now = max(now, 1)
        for ctx in (a, b):
            d = ctx.next_deadline()
            if d is not None and d <= now:
                assert _timers_progress(ctx, now), f"a deadline stays due at {now} ns"
        now += rng.randrange(0, 50_000)
    for wc in qa.send_cq.poll():
        assert wc.status in (WcStatus.SUCCESS, WcStatus.RETRY_EXC_ERR, WcStatus.WR_FLUSH_ERR)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    steps=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1 << 20)), min_size=1, max_size=40),
    b_rtr=st.booleans(),
)
def test_no_deadline_stays_due_after_its_timer(seed: int, steps: list[tuple[int, int]], b_rtr: bool) -> None:
    _drive(seed, steps, b_rtr)


def test_probe_timers_of_zero_are_refused() -> None:
    """Probe timings of 0 passed QpAttr.check, and then a bad EV's probe deadline stayed at `now` after
    every handle_timer(now): one more probe per call at one instant (1000 calls, 1000 probes), a lossy
    loopback that never ended at 1 ns. They are refused, naming the field; mrcd's own floor (1 us) holds."""
    import pytest

    from mrc.transport import QpAttr

    for name in ("probe_interval_ns", "probe_timeout_ns", "probe_max_interval_ns"):
        for value in (0, 1, -5, 1_000):
            attr = QpAttr()
            setattr(attr, name, value)
            if value == 1_000:
                attr.check()
                continue
            with pytest.raises(ValueError, match=name):
                attr.check()
    with pytest.raises(ValueError, match="probe_good"):
        QpAttr(probe_good=0).check()
    with pytest.raises(ValueError, match="reorder_ns"):
        QpAttr(reorder_ns=-1).check()
    QpAttr(reorder_ns=0).check()


def test_unpolled_probe_results_stay_bounded() -> None:
    """A plane that stays dead keeps its EVs probed; nobody polls the results here (as in the simulator,
    or an application that never asks): they used to pile up, ~15,000 per virtual second. At
    MAX_UNPOLLED the newer are dropped and counted (`probe_results_dropped`), and polling drains them."""
    from mrc.sim.loopback import Blackhole, FabricConfig, LoopbackConfig, build, run_transfer
    from mrc.transport.paths import MAX_UNPOLLED

    dead = FabricConfig(planes=4, blackholes=[Blackhole(0, 0)])
    r = build(LoopbackConfig(size=1 << 20, seed=1, fabric=dead))
    doc = run_transfer(r)
    assert doc["completed"] and doc["bit_exact"]
    r.fabric.run(until_ns=2_000_000_000)
    paths = r.qa.paths
    assert len(paths.probe_results) == MAX_UNPOLLED
    assert paths.probe_results_dropped > 0
    assert r.qa.stats()["probe_results_dropped"] == paths.probe_results_dropped
    assert len(r.a.poll_probe_results()) == MAX_UNPOLLED and not paths.probe_results
