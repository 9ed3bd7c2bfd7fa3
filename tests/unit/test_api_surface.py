"""The mrc.h / mrc_ctl.h surface of mrc.transport (api.py, ctl.py and the Context methods): each test
checks what the call does, not only that it runs (docs/api.md names the test of every item)."""

from __future__ import annotations

from typing import Any

import pytest

from mrc.transport import AsyncEventKind, Context, QpAttr, QpState, WcStatus, api, ctl
from mrc.transport.cc import NsccConfig
from mrc.transport.paths import EvEvent, EvEventCq, EvField, EvState

GA = bytes(15) + b"\x01"
GB = bytes(15) + b"\x02"


def _pair(ports: int = 2) -> tuple[Context, Context]:
    return Context(GA, ports=ports, seed=1), Context(GB, ports=ports, seed=2)


def test_versions_are_the_headers() -> None:
    assert api.query_version() == (0x01000001, 0, 0x01000000, 0)
    assert ctl.ctl_query_version() == (0x01000001, 0, 0x01000000, 0)
    assert Context(GA, api_version=0x01000000).api_version == 0x01000000
    with pytest.raises(ValueError, match="outside"):
        Context(GA, api_version=0x01000002)
    with pytest.raises(ValueError, match="vendor"):
        Context(GA, vendor_api_version=0x02000000)


def test_query_device_reports_the_limits_that_are_enforced() -> None:
    ctx = Context(GA, ports=4)
    d = api.query_device_ex(ctx)
    assert d.ports == 4 and d.max_mpr == 8 and d.mrc_protocol_version == 1
    assert d.cap == api.DeviceCap.TRIM_NACK | api.DeviceCap.SVC_TIME and not d.cap & api.DeviceCap.DYNAMIC_MPR
    with pytest.raises(ValueError):
        QpAttr(mpr=d.max_mpr + 1).check()
    with pytest.raises(ValueError):
        ctx.create_cq(d.max_cqe + 1)
    assert api.query_device().ports == 1
    cq = ctx.create_cq()
    with pytest.raises(ValueError, match="version 1"):
        ctx.create_qp(cq, ev_profile=ctx.create_ev_profile(count=8), protocol_version=2)


def test_ctl_query_device_ports_from_one_and_free_evs() -> None:
    ctx = Context(GA, ports=4)
    a = ctl.ctl_query_device(ctx)
    assert a.phy_port_mask == 0b11110  # ports 1..4
    free = a.ev_free_count
    ctx.create_ev_profile(count=64)
    assert ctl.ctl_query_device(ctx).ev_free_count == free - 64
    assert a.opt_attr == ctl.CtlOpt.EV_EVENT | ctl.CtlOpt.EV_EVENT_PRECISE_DROP_CNT
    assert a.algorithms == ("uet-1.0-nscc",) and a.ev_max_width == 256


def test_ctl_port_admin_is_one_based() -> None:
    ctx = Context(GA, ports=2)
    prof = ctx.create_ev_profile(count=8)
    ctl.ctl_modify_port(ctx, 2, ctl.PortAdminState.DISABLED)
    assert ctx.port_enabled == [True, False]
    assert ctl.ctl_query_port(ctx, 2) == ctl.PortAdminState.DISABLED
    assert ctl.ctl_query_port(ctx, 1) == ctl.PortAdminState.ENABLED
    assert prof.denied == {i for i, e in enumerate(prof.entries) if e.port == 1}
    for bad in (0, 3):
        with pytest.raises(ValueError, match=r"1\.\.2"):
            ctl.ctl_query_port(ctx, bad)


def test_async_events_must_be_acked_before_destroy_qp() -> None:
    a = Context(GA)
    cq = a.create_cq()
    qp = a.create_qp(cq, ev_profile=a.create_ev_profile(count=4))
    assert a.get_async_event() is None
    a.async_event(5, qp.qpn, AsyncEventKind.QP_FATAL, "x")
    ev = a.get_async_event()
    assert ev is not None and ev.qpn == qp.qpn
    with pytest.raises(ValueError, match="not acknowledged"):
        a.destroy_qp(qp)
    a.ack_async_event(ev)
    with pytest.raises(ValueError, match="not got"):
        a.ack_async_event(ev)
    a.destroy_qp(qp)
    with pytest.raises(ValueError):
        a.get_qpn(qp)


def test_get_qpn_and_query_qp() -> None:
    a, _ = _pair()
    cq = a.create_cq()
    prof = a.create_ev_profile(count=8)
    ccid = a.create_cc_profile(NsccConfig())
    qp = a.create_qp(cq, ev_profile=prof, cc_profile=ccid, attr=QpAttr(mpr=4, timeout=10, max_wimm=7))
    assert a.get_qpn(qp) == qp.qpn
    info = api.query_qp(a, qp)
    assert info.state == QpState.INIT and info.qpn == qp.qpn and info.send_cqn == cq.cqn
    m = info.attr
    got = (m.mpr, m.mpr_dest, m.timeout, m.max_wimm, m.ev_profile_id, m.cc_profile_id)
    assert got == (4, 4, 10, 7, prof.profile_id, ccid)


def test_modify_qp_attribute_masks_follow_the_transition_table() -> None:
    a, _ = _pair()
    cq = a.create_cq()
    p1 = a.create_ev_profile(count=8)
    p2 = a.create_ev_profile(count=16)
    qp = a.create_qp(cq, ev_profile=p1)
    M = api.QpAttrMask
    with pytest.raises(ValueError, match="cannot be set"):
        api.modify_qp(a, qp, QpState.INIT, api.MrcQpAttr(mpr=2), M.MPR)
    api.modify_qp(a, qp, QpState.INIT, api.MrcQpAttr(ev_profile_id=p2.profile_id), M.EV_PROFILE_ID)
    assert qp.paths.profile is p2 and qp.paths not in p1.paths and qp.paths.n == 16
    cap = api.QpCap.TRIM_NACK_DEST_UNSUPPORTED | api.QpCap.SVC_TIME_DEST_UNSUPPORTED
    api.modify_qp(a, qp, QpState.RTR, api.MrcQpAttr(mpr_dest=2, max_wimm_dest=3, cap=cap),
                  M.MPR_DEST | M.MAX_WIMM_DEST | M.CAP, remote_gid=GB, remote_qpn=0x100)
    assert qp.Wd == 256 and qp.attr.max_wimm_dest == 3
    assert qp.state == QpState.RTR
    assert not qp.attr.trim_nack and not qp.attr.svc_time
    api.modify_qp(a, qp, QpState.RTS, api.MrcQpAttr(mpr=2, timeout=12, linear_cnt=1, exp_cnt=2, max_wimm=5),
                  M.MPR | M.TIMEOUT | M.RETRY_CNT | M.MAX_WIMM)
    assert qp.state is QpState.RTS  # type: ignore[comparison-overlap]  # changed by modify_qp
    assert qp.W == 256 and len(qp.tx_state) == 256
    assert qp.ack_timeout == 1024 << 12 and qp.attr.max_wimm == 5
    assert api.query_qp(a, qp).attr.cap == cap
    with pytest.raises(ValueError, match="dynamic MPR"):
        q2 = a.create_qp(cq, ev_profile=p1)
        api.modify_qp(a, q2, QpState.RTR, api.MrcQpAttr(cap=api.QpCap.DYNAMIC_MPR), M.CAP,
                      remote_gid=GB, remote_qpn=0x100)
    with pytest.raises(ValueError, match="cannot be set"):
        api.modify_qp(a, q2, QpState.INIT, api.MrcQpAttr(), M.VENDOR_CFG)


def test_mpr_dest_bounds_the_responder_window() -> None:
    """A responder with mpr_dest 1 refuses a PSN 128 ahead of its cumulative point (OUT_OF_WINDOW)
    that one with the requester's mpr 8 accepts."""
    for mpr_dest, oow in ((1, 1), (0, 0)):
        _, b = _pair()
        cq = b.create_cq()
        qb = b.create_qp(cq, ev_profile=b.create_ev_profile(count=4), attr=QpAttr(mpr=8, mpr_dest=mpr_dest))
        qb.connect(GA, 0x100)
        out: list[Any] = []
        f = (200, False, 0, 1, 8, None, 0, 0, 0, 8, 0, b"x" * 8)  # PSN 200, an unknown R_Key
        qb.on_write(f, 0, False, 0, out)  # type: ignore[arg-type]
        assert qb.c["oow_rx"] == oow and qb.c["bad_rkey_rx"] == 1 - oow


def test_qp_hint_lifecycle_and_first_window() -> None:
    a, _ = _pair()
    cq = a.create_cq()
    prof = a.create_ev_profile(count=8)
    cfg = NsccConfig()
    ccid = a.create_cc_profile(cfg)
    h = a.create_qp_hint(num_qps_per_peer=2, num_send_peers=4, num_remote_recv_peers=3)
    H = api.QpHintMask
    assert api.query_qp_hint(h, H.NUM_QPS_PER_PEER | H.NUM_REMOTE_RECV_PEERS) == {
        "num_qps_per_peer": 2, "num_remote_recv_peers": 3}
    plain = a.create_qp(cq, ev_profile=prof, cc_profile=ccid)
    hinted = a.create_qp(cq, ev_profile=prof, cc_profile=ccid, hint=h)
    assert hinted.cc.cwnd == plain.cc.cwnd // 8  # 2 QPs x 4 peers share the uplink
    api.modify_qp_hint(a, h, {"num_remote_recv_peers": 16}, H.NUM_REMOTE_RECV_PEERS)
    assert h.num_remote_recv_peers == 16 and h.num_send_peers == 4
    hinted.modify(QpState.RESET)
    hinted.modify(QpState.INIT)
    assert hinted.cc.cwnd == plain.cc.cwnd // 16  # the incast now dominates
    with pytest.raises(ValueError, match=r"1\.\."):
        api.modify_qp_hint(a, h, {"num_send_peers": 0}, H.NUM_SEND_PEERS)
    with pytest.raises(ValueError, match="vendor"):
        api.query_qp_hint(h, H.VENDOR_CFG)
    with pytest.raises(ValueError, match="used by"):
        a.destroy_qp_hint(h)
    api.modify_qp(a, hinted, QpState.INIT, api.MrcQpAttr(qp_hint=None), api.QpAttrMask.HINT)
    assert hinted.cc.cwnd == plain.cc.cwnd
    a.destroy_qp_hint(h)
    assert h.hint_id not in a.qp_hints


def test_comp_channel_create_destroy_and_cq_context() -> None:
    a = Context(GA)
    ch = a.create_comp_channel()
    cq = a.create_cq(8, channel=ch, cq_context="mine")
    assert cq.cq_context == "mine"
    with pytest.raises(ValueError, match="used by CQ"):
        a.destroy_comp_channel(ch)
    cq.req_notify()
    from mrc.transport import WcOpcode, WorkCompletion

    cq.push(WorkCompletion(1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 0x100))
    assert ch.get_cq_event() is cq
    with pytest.raises(ValueError, match="not acknowledged"):
        a.destroy_cq(cq)
    ch.ack_cq_events(cq, 1)
    a.destroy_cq(cq)
    a.destroy_comp_channel(ch)
    assert ch not in a.channels


def test_destroy_context_removes_everything() -> None:
    a = Context(GA)
    cq = a.create_cq()
    a.create_qp(cq, ev_profile=a.create_ev_profile(count=4))
    a.reg_mr(bytearray(64))
    a.create_ev_event_cq(4)
    a.destroy()
    assert a.destroyed and not (a.qps or a.cqs or a.ev_cqs or a.mrs or a.ev_profiles)


def _event(i: int, state: EvState = EvState.ASSUMED_BAD) -> EvEvent:
    return EvEvent(i, 1, 0x100, i, 100 + i, 1, state, 3)


def test_ev_event_cq_is_bounded_and_drop_count_counts_dropped_events() -> None:
    cq = EvEventCq(0, 2)
    for i in range(5):
        cq.push(_event(i))
    assert cq.dropped_total == 3
    got = ctl.ctl_poll_ev_event(cq, 8)
    assert [e.ev.val for e in got] == [100, 101] and [e.drop_count for e in got] == [0, 0]
    cq.push(_event(9, EvState.GOOD))
    (e,) = ctl.ctl_poll_ev_event(cq, 8)
    # 3 dropped before it; the port numbered from 1
    assert (e.drop_count, e.ev.port, e.state) == (3, 2, ctl.CtlEvState.GOOD)


def test_ev_events_reach_the_ev_event_cq_and_the_event_mask_filters() -> None:
    a = Context(GA, ports=2)
    cq = a.create_cq()
    ecq = ctl.ctl_create_ev_event_cq(a, 16)
    prof = a.create_ev_profile(count=8)
    qp = a.create_qp(cq, ev_profile=prof)
    qp.paths.set_state(3, EvState.ASSUMED_BAD, 10)
    qp.paths.set_state(3, EvState.GOOD, 20)
    got = [e.state for e in ctl.ctl_poll_ev_event(ecq, 8)]
    assert got == [ctl.CtlEvState.ASSUMED_BAD, ctl.CtlEvState.GOOD]
    assert a.poll_ev_events() == []
    prof.event_mask = int(ctl.CtlEvState.GOOD)
    qp.paths.set_state(3, EvState.ASSUMED_BAD, 30)
    qp.paths.set_state(3, EvState.GOOD, 40)
    assert [e.state for e in ctl.ctl_poll_ev_event(ecq, 8)] == [ctl.CtlEvState.GOOD]
    with pytest.raises(ValueError, match="poll"):
        ctl.ctl_create_ev_event_cq(a, 4, channel=a.create_comp_channel())
    a.destroy_cq(ecq)
    qp.paths.set_state(3, EvState.ASSUMED_BAD, 50)
    assert len(a.poll_ev_events()) == 0  # GOOD only in the mask
    assert not a.ev_cqs


def _fmt(ctx: Context, fid: int, mode: ctl.EvFmtMode, widths: list[int]) -> None:
    F = ctl.EvFmtMask
    ctl.ctl_modify_ev_fmt_profile(ctx, fid, F.STATE | F.MODE, state=ctl.ProfileState.OFFLINE, mode=mode)
    ctl.ctl_modify_ev_fmt_profile(ctx, fid, F.STATE | F.OP, state=ctl.ProfileState.ONLINE, widths=widths)


def test_ev_fmt_profile_state_machine_and_mode_widths() -> None:
    ctx = Context(GA, ports=2)
    F = ctl.EvFmtMask
    with pytest.raises(ValueError, match="needs MODE"):
        ctl.ctl_modify_ev_fmt_profile(ctx, 1, F.STATE, state=ctl.ProfileState.OFFLINE)
    with pytest.raises(ValueError, match="exceed UDP"):
        ctl.ctl_modify_ev_fmt_profile(ctx, 1, F.STATE | F.MODE | F.OP, state=ctl.ProfileState.OFFLINE,
                                      mode=ctl.EvFmtMode.UDP, widths=[16, 4])
    _fmt(ctx, 1, ctl.EvFmtMode.STEV, [20, 12])
    q = ctl.ctl_query_ev_fmt_profile(ctx, 1)
    assert (q.state, q.mode, q.widths, q.width) == (ctl.ProfileState.ONLINE, ctl.EvFmtMode.STEV, [20, 12], 32)
    with pytest.raises(ValueError, match="ONLINE"):
        ctl.ctl_modify_ev_fmt_profile(ctx, 1, F.MODE, mode=ctl.EvFmtMode.SRV6)
    _fmt(ctx, 2, ctl.EvFmtMode.SRV6, [32] * 8)
    assert ctl.ctl_query_ev_fmt_profile(ctx, 2).width == 256
    ctl.ctl_modify_ev_fmt_profile(ctx, 2, F.STATE, state=ctl.ProfileState.OFFLINE)
    ctl.ctl_modify_ev_fmt_profile(ctx, 2, F.STATE, state=ctl.ProfileState.INIT)
    with pytest.raises(ValueError, match="no EV format"):
        ctl.ctl_query_ev_fmt_profile(ctx, 2)
    with pytest.raises(ValueError, match="vendor"):
        ctl.ctl_modify_ev_fmt_profile(ctx, 3, F.VENDOR_CFG)


def test_explicit_ev_profile_replace_all_copies_online_and_query_array() -> None:
    ctx = Context(GA, ports=2)
    _fmt(ctx, 1, ctl.EvFmtMode.STEV, [32])
    P, E = ctl.EvProfileMask, ctl.EvOpEntry
    ctl.ctl_modify_ev_profile(ctx, 7, P.STATE | P.MODE | P.FMT_ID | P.COUNT, state=ctl.ProfileState.OFFLINE,
                              mode=ctl.CtlEvMode.EXP, fmt_id=1, count=4)
    arr = ctl.query_ev_array(ctx, 7)
    assert [x.ev for x in arr] == [ctl.UNPOPULATED] * 4 and arr[0].state == ctl.CtlEvState.UNKNOWN
    ctl.ctl_modify_ev_profile(ctx, 7, P.EV_OP, ev_op=ctl.EvOp.REPLACE_EV, entries=[
        E(ctl.UNPOPULATED, ctl.CtlEv(0x11, 1), flags=ctl.EvOpFlags.ALL_COPIES)])
    ctl.ctl_modify_ev_profile(ctx, 7, P.EV_OP, ev_op=ctl.EvOp.REPLACE_EV, entries=[
        E(ctl.CtlEv(0x11, 1), ctl.CtlEv(0x22, 2))])  # one copy only
    assert [x.ev for x in ctl.query_ev_array(ctx, 7)] == [ctl.CtlEv(0x22, 2)] + [ctl.CtlEv(0x11, 1)] * 3
    with pytest.raises(ValueError, match="wider"):
        ctl.ctl_modify_ev_profile(ctx, 7, P.EV_OP, ev_op=ctl.EvOp.REPLACE_EV, entries=[
            E(ctl.CtlEv(0x11, 1), ctl.CtlEv(1 << 32, 1))])
    with pytest.raises(ValueError, match="MIN_ACTIVE"):
        ctl.ctl_modify_ev_profile(ctx, 7, P.STATE, state=ctl.ProfileState.ONLINE)
    ctl.ctl_modify_ev_profile(ctx, 7, P.STATE | P.MIN_ACTIVE | P.EVENT_MASK, state=ctl.ProfileState.ONLINE,
                              min_active=1, event_mask=int(ctl.CtlEvState.GOOD | ctl.CtlEvState.ASSUMED_BAD))
    prof = ctx.ev_profiles[7]
    assert [(e.ev, e.port) for e in prof.entries] == [(0x22, 1), (0x11, 0), (0x11, 0), (0x11, 0)]
    cq = ctx.create_cq()
    qp = ctx.create_qp(cq, ev_profile=prof)
    c, _ = ctl.ctl_query_ev_profile(ctx, 7)
    assert (c.state, c.mode, c.fmt_id, c.count, c.min_active) == (ctl.ProfileState.ONLINE, ctl.CtlEvMode.EXP,
                                                                  1, 4, 1)
    ctl.ctl_modify_ev_profile(ctx, 7, P.EV_OP, ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=[
        E(ctl.CtlEv(0x22, 2), state=ctl.CtlEvState.DENIED),
        E(ctl.CtlEv(0x11, 1), state=ctl.CtlEvState.ASSUMED_BAD)])
    assert qp.paths.state == [EvState.DENIED] + [EvState.ASSUMED_BAD] * 3  # every copy of 0x11
    _, st = ctl.ctl_query_ev_profile(ctx, 7, ctl.EvOp.QUERY_EV_STATE, [E(ctl.CtlEv(0x22, 2)),
                                                                         E(ctl.CtlEv(0x11, 1))])
    assert [x.state for x in st] == [ctl.CtlEvState.DENIED, ctl.CtlEvState.ASSUMED_BAD]
    with pytest.raises(ValueError, match="ONLINE"):
        ctl.ctl_modify_ev_profile(ctx, 7, P.COUNT, count=8)
    with pytest.raises(ValueError, match="used by"):
        ctl.ctl_modify_ev_profile(ctx, 7, P.STATE, state=ctl.ProfileState.OFFLINE)
    with pytest.raises(LookupError):
        ctl.ctl_modify_ev_profile(ctx, 7, P.EV_OP, ev_op=ctl.EvOp.MODIFY_EV_STATE, entries=[
            E(ctl.CtlEv(0x99, 1), state=ctl.CtlEvState.GOOD)])
    with pytest.raises(ValueError, match="exclusive"):
        ctl.ctl_modify_ev_profile(ctx, 7, P.EV_OP | P.EV_FIELDS_OP)
    ctx.destroy_qp(qp)
    ctl.ctl_modify_ev_profile(ctx, 7, P.STATE, state=ctl.ProfileState.OFFLINE)
    assert 7 not in ctx.ev_profiles
    ctl.ctl_modify_ev_profile(ctx, 7, P.STATE, state=ctl.ProfileState.INIT)
    with pytest.raises(LookupError):
        ctl.ctl_query_ev_profile(ctx, 7)


def test_generated_and_auto_ev_profiles_go_online() -> None:
    ctx = Context(GA, ports=2)
    _fmt(ctx, 1, ctl.EvFmtMode.STEV, [16, 16])
    P = ctl.EvProfileMask
    fields = [EvField(16, mask=0x00FF, min_val=0, max_val=0xFF), EvField(16, init_val=7)]
    ctl.ctl_modify_ev_profile(ctx, 3, P.STATE | P.MODE | P.FMT_ID | P.COUNT | P.EV_FIELDS_OP,
                              state=ctl.ProfileState.OFFLINE, mode=ctl.CtlEvMode.GEN, fmt_id=1, count=4,
                              fields=fields)
    ctl.ctl_modify_ev_profile(ctx, 3, P.STATE | P.MIN_ACTIVE | P.EVENT_MASK, state=ctl.ProfileState.ONLINE,
                              min_active=2, event_mask=0)
    prof = ctx.ev_profiles[3]
    assert [e.ev for e in prof.entries] == [i << 16 | 7 for i in range(4)]
    assert prof.event_mask == 0 and prof.ev_min_active == 2
    with pytest.raises(ValueError, match="wider"):
        ctl.ctl_modify_ev_profile(ctx, 4, P.EV_FIELDS_OP, fields=[EvField(4, init_val=0x1F)])
    ctl.ctl_modify_ev_profile(ctx, 5, P.STATE | P.MODE | P.COUNT, state=ctl.ProfileState.OFFLINE,
                              mode=ctl.CtlEvMode.AUTO, count=8)
    ctl.ctl_modify_ev_profile(ctx, 5, P.STATE | P.MIN_ACTIVE | P.EVENT_MASK, state=ctl.ProfileState.ONLINE,
                              min_active=2, event_mask=int(ctl.CtlEvState.ASSUMED_BAD))
    assert len(ctx.ev_profiles[5].entries) == 8
    with pytest.raises(ValueError, match="GOOD and ASSUMED_BAD"):
        ctl.ctl_modify_ev_profile(ctx, 6, P.EVENT_MASK, event_mask=int(ctl.CtlEvState.DENIED))
    c, _ = ctl.ctl_query_ev_profile(ctx, 3)
    assert c.fields == fields


def test_cc_profile_state_machine() -> None:
    ctx = Context(GA)
    C = ctl.CcProfileMask
    with pytest.raises(ValueError, match="ALGORITHM"):
        ctl.ctl_modify_cc_profile(ctx, 4, C.STATE, state=ctl.ProfileState.OFFLINE)
    with pytest.raises(ValueError, match="algorithm"):
        ctl.ctl_modify_cc_profile(ctx, 4, C.ALGORITHM, algorithm="dcqcn")
    ctl.ctl_modify_cc_profile(ctx, 4, C.STATE | C.ALGORITHM, state=ctl.ProfileState.OFFLINE,
                              algorithm="uet-1.0-nscc")
    with pytest.raises(ValueError, match="CONFIG"):
        ctl.ctl_modify_cc_profile(ctx, 4, C.STATE, state=ctl.ProfileState.ONLINE)
    cfg = NsccConfig(max_cwnd=1 << 18)
    ctl.ctl_modify_cc_profile(ctx, 4, C.STATE | C.CONFIG, state=ctl.ProfileState.ONLINE, config=cfg)
    assert ctx.cc_profiles[4] is cfg
    q = ctl.ctl_query_cc_profile(ctx, 4)
    assert (q.state, q.algorithm, q.config) == (ctl.ProfileState.ONLINE, "uet-1.0-nscc", cfg)
    cq = ctx.create_cq()
    qp = ctx.create_qp(cq, ev_profile=ctx.create_ev_profile(count=4), cc_profile=4)
    assert qp.cc.cwnd == 1 << 18
    with pytest.raises(ValueError, match="used by"):
        ctl.ctl_modify_cc_profile(ctx, 4, C.STATE, state=ctl.ProfileState.OFFLINE)
    with pytest.raises(ValueError, match="ONLINE"):
        ctl.ctl_modify_cc_profile(ctx, 4, C.CONFIG, config=cfg)
    ctx.destroy_qp(qp)
    ctl.ctl_modify_cc_profile(ctx, 4, C.STATE, state=ctl.ProfileState.OFFLINE)
    assert 4 not in ctx.cc_profiles
    with pytest.raises(ValueError, match="vendor"):
        ctl.ctl_modify_cc_profile(ctx, 4, C.VENDOR_CFG)
