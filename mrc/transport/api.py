"""The application API of `mrc.h` that is not a method of `Context` / `QueuePair`, in Python naming:
versions and device attributes, QP query/modify with MRC attribute masks, QP hint query/modify.

docs/api.md maps every item of the header to its Python name here or elsewhere (and says what is
not implemented and why); tests/unit/test_api_coverage.py keeps that table true.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import IntFlag
from typing import TYPE_CHECKING, Final

from .engine import (
    API_CURRENT_VERSION,
    API_LAST_SUPPORTED_VERSION,
    MAX_CQE,
    MAX_QP_HINTS,
    MAX_QPN,
    VENDOR_API_CURRENT_VERSION,
    VENDOR_API_LAST_SUPPORTED_VERSION,
    Context,
)
from .verbs import EXP_CNT_INFINITE, QpHint, QpState

if TYPE_CHECKING:
    from .paths import EvProfile
    from .qp import QueuePair


class ProtocolVersion(IntFlag):
    """`mrc_protocol_version`: 0 asks for the provider's default; this engine speaks version 1."""

    V0 = 0
    V1 = 1 << 0


class DeviceCap(IntFlag):
    """`mrc_device_cap`. DYNAMIC_MPR is never set: see `QpCap.DYNAMIC_MPR`."""

    TRIM_NACK = 1 << 0
    DYNAMIC_MPR = 1 << 1
    SVC_TIME = 1 << 2


class QpAttrMask(IntFlag):
    """`mrc_qp_attr_mask`: which `MrcQpAttr` fields `modify_qp` / `query_qp` touch."""

    MAX_WIMM = 1 << 0
    MAX_WIMM_DEST = 1 << 1
    MPR = 1 << 2
    MPR_DEST = 1 << 3
    TIMEOUT = 1 << 4
    EV_PROFILE_ID = 1 << 5
    CC_PROFILE_ID = 1 << 6
    HINT = 1 << 7
    RETRY_CNT = 1 << 8
    CAP = 1 << 9
    VENDOR_CFG = 1 << 31


class QpCap(IntFlag):
    """`mrc_qp_cap`. DYNAMIC_MPR is refused: the headers name it but neither they nor anything else
    this prototype has says how a responder announces a changed window on the wire, and a requester
    that grew its window on a guess would be refused OUT_OF_WINDOW by a peer that did not."""

    TRIM_NACK_DEST_UNSUPPORTED = 1 << 0
    DYNAMIC_MPR = 1 << 1
    SVC_TIME_DEST_UNSUPPORTED = 1 << 2


class QpHintMask(IntFlag):
    """`mrc_qp_hint_attr_mask`."""

    NUM_QPS_PER_PEER = 1 << 0
    NUM_SEND_PEERS = 1 << 1
    NUM_REMOTE_RECV_PEERS = 1 << 2
    VENDOR_CFG = 1 << 31


#: mrc_qp_attr_mask's table: the attributes each target state may set
_SETTABLE: Final = {
    QpState.INIT: QpAttrMask.HINT | QpAttrMask.EV_PROFILE_ID | QpAttrMask.CC_PROFILE_ID,
    QpState.RTR: QpAttrMask.MAX_WIMM_DEST | QpAttrMask.MPR_DEST | QpAttrMask.CAP,
    QpState.RTS: QpAttrMask.MAX_WIMM | QpAttrMask.MPR | QpAttrMask.RETRY_CNT | QpAttrMask.TIMEOUT,
}
_HINT_FIELDS: Final = {
    QpHintMask.NUM_QPS_PER_PEER: "num_qps_per_peer",
    QpHintMask.NUM_SEND_PEERS: "num_send_peers",
    QpHintMask.NUM_REMOTE_RECV_PEERS: "num_remote_recv_peers",
}


@dataclass(slots=True, frozen=True)
class DeviceAttr:
    """`mrc_device_attr`, with this engine's other limits (what `create_*` enforce)."""

    mrc_protocol_version: int
    max_wimm: int
    max_wimm_dest: int
    max_mpr: int
    mpr_resolution: int
    max_qp_hint: int
    cap: DeviceCap
    max_qp: int
    max_cqe: int
    ports: int


@dataclass(slots=True, frozen=True)
class MrcQpAttr:
    """`mrc_qp_attr` (what `query_qp` returns and `modify_qp` takes, selected by a `QpAttrMask`)."""

    mpr: int = 0
    mpr_dest: int = 0
    max_wimm: int = 0
    max_wimm_dest: int = 0
    timeout: int = 0
    ev_profile_id: int = 0
    cc_profile_id: int = 0
    linear_cnt: int = 0
    exp_cnt: int = 0
    qp_hint: QpHint | None = None
    cap: QpCap = QpCap.TRIM_NACK_DEST_UNSUPPORTED & 0  # no capability bit


@dataclass(slots=True, frozen=True)
class QpInfo:
    """`mrc_query_qp`'s outputs: the state (IBV_QP_STATE), the MRC attributes, the init attributes."""

    state: QpState
    qpn: int
    attr: MrcQpAttr
    send_cqn: int
    recv_cqn: int
    protocol_version: ProtocolVersion
    remote_gid: bytes
    remote_qpn: int


def query_version() -> tuple[int, int, int, int]:
    """`mrc_query_version`: (current, last supported, vendor, last supported vendor) API versions."""
    return (API_CURRENT_VERSION, API_LAST_SUPPORTED_VERSION, VENDOR_API_CURRENT_VERSION,
            VENDOR_API_LAST_SUPPORTED_VERSION)


def query_device(ports: int = 1) -> DeviceAttr:
    """`mrc_query_device` (1.0.0 semantics: no context, so `ports` is the caller's)."""
    return DeviceAttr(
        mrc_protocol_version=int(ProtocolVersion.V1),
        max_wimm=0xFFFF,
        max_wimm_dest=0xFFFF,
        max_mpr=8,  # the responder's bitmap and the largest SACK bitmap (docs/transport.md)
        mpr_resolution=1,
        max_qp_hint=MAX_QP_HINTS,
        cap=DeviceCap.TRIM_NACK | DeviceCap.SVC_TIME,
        max_qp=MAX_QPN - 0x100 + 1,
        max_cqe=MAX_CQE,
        ports=ports,
    )


def query_device_ex(ctx: Context) -> DeviceAttr:
    """`mrc_query_device_ex`: the device attributes of this context (its ports)."""
    return query_device(ctx.ports)


def _cc_profile_id(ctx: Context, qp: QueuePair) -> int:
    for pid, cfg in ctx.cc_profiles.items():
        if cfg is qp.cc_spec:
            return pid
    return 0


def _qp_cap(qp: QueuePair) -> QpCap:
    cap = QpCap(0)
    if not qp.attr.trim_nack:
        cap |= QpCap.TRIM_NACK_DEST_UNSUPPORTED
    if not qp.attr.svc_time:
        cap |= QpCap.SVC_TIME_DEST_UNSUPPORTED
    return cap


def query_qp(ctx: Context, qp: QueuePair) -> QpInfo:
    """`mrc_query_qp`: every attribute at once (a mask only selects what C copies out)."""
    a = qp.attr
    mrc = MrcQpAttr(
        mpr=a.mpr, mpr_dest=a.mpr_dest or a.mpr, max_wimm=a.max_wimm, max_wimm_dest=a.max_wimm_dest,
        timeout=a.timeout, ev_profile_id=qp.paths.profile.profile_id, cc_profile_id=_cc_profile_id(ctx, qp),
        linear_cnt=a.linear_cnt, exp_cnt=a.exp_cnt, qp_hint=qp.hint, cap=_qp_cap(qp),
    )
    return QpInfo(qp.state, ctx.get_qpn(qp), mrc, qp.send_cq.cqn, qp.recv_cq.cqn, ProtocolVersion.V1,
                  qp.peer_gid, qp.peer_qpn)


def modify_qp(
    ctx: Context, qp: QueuePair, state: QpState, mrc_attr: MrcQpAttr, mask: QpAttrMask, now: int = 0, *,
    remote_gid: bytes | None = None, remote_qpn: int | None = None, rq_psn: int | None = None,
) -> None:
    """`mrc_modify_qp` with MRC attributes: the attributes in `mask` are set on the transition to
    `state`, as mrc_qp_attr_mask's table allows (INIT: HINT, EV_PROFILE_ID, CC_PROFILE_ID; RTR:
    MAX_WIMM_DEST, MPR_DEST, CAP; RTS: MAX_WIMM, MPR, RETRY_CNT, TIMEOUT). An attribute outside that
    row, VENDOR_CFG (this provider defines none) or the DYNAMIC_MPR cap is a ValueError and nothing
    changes."""
    mask = QpAttrMask(mask)
    allowed = _SETTABLE.get(state, QpAttrMask(0))
    if mask & ~allowed:
        raise ValueError(f"QP {qp.qpn:#x}: {(mask & ~allowed)!r} cannot be set on the way to {state.name}")
    if mask & QpAttrMask.CAP and mrc_attr.cap & QpCap.DYNAMIC_MPR:
        raise ValueError("dynamic MPR is not supported (the device does not advertise it)")
    a = qp.attr
    if mask & QpAttrMask.MAX_WIMM:
        a = replace(a, max_wimm=mrc_attr.max_wimm)
    if mask & QpAttrMask.MPR:
        a = replace(a, mpr=mrc_attr.mpr)
    if mask & QpAttrMask.TIMEOUT:
        a = replace(a, timeout=mrc_attr.timeout)
    if mask & QpAttrMask.RETRY_CNT:
        if not 0 <= mrc_attr.exp_cnt <= EXP_CNT_INFINITE:
            raise ValueError("exp_cnt must be 0..25")
        a = replace(a, linear_cnt=mrc_attr.linear_cnt, exp_cnt=mrc_attr.exp_cnt)
    if mask & QpAttrMask.MAX_WIMM_DEST:
        a = replace(a, max_wimm_dest=mrc_attr.max_wimm_dest)
    if mask & QpAttrMask.MPR_DEST:
        a = replace(a, mpr_dest=mrc_attr.mpr_dest)
    if mask & QpAttrMask.CAP:
        a = replace(a, trim_nack=not mrc_attr.cap & QpCap.TRIM_NACK_DEST_UNSUPPORTED,
                    svc_time=not mrc_attr.cap & QpCap.SVC_TIME_DEST_UNSUPPORTED)
    a.check()
    profile: EvProfile = qp.paths.profile
    if mask & QpAttrMask.EV_PROFILE_ID:
        if mrc_attr.ev_profile_id not in ctx.ev_profiles:
            raise ValueError(f"no EV profile {mrc_attr.ev_profile_id}")
        profile = ctx.ev_profiles[mrc_attr.ev_profile_id]
    cc = qp.cc_spec
    if mask & QpAttrMask.CC_PROFILE_ID:
        if mrc_attr.cc_profile_id not in ctx.cc_profiles:
            raise ValueError(f"no CC profile {mrc_attr.cc_profile_id}")
        cc = ctx.cc_profiles[mrc_attr.cc_profile_id]
    hint = qp.hint
    if mask & QpAttrMask.HINT:
        hint = mrc_attr.qp_hint
        if hint is not None and ctx.qp_hints.get(hint.hint_id) is not hint:
            raise ValueError(f"QP hint {hint.hint_id} is not a hint of this context")
    if state == QpState.RTS:
        if mask:
            if qp.state != QpState.RTR:
                raise ValueError(f"QP {qp.qpn:#x}: requester attributes change on RTR -> RTS only")
            qp.reconfigure_requester(a)
        ctx.modify_qp(qp, state, now)
        return
    if mask:
        if qp.state not in (QpState.RESET, QpState.INIT) or state not in (QpState.INIT, QpState.RTR):
            raise ValueError(f"QP {qp.qpn:#x}: attributes change on RESET/INIT -> INIT/RTR only")
        if qp.state == QpState.RESET:
            ctx.modify_qp(qp, QpState.INIT, now)
        qp.reconfigure(a, profile, cc, hint)
        if state == QpState.INIT:
            return
    ctx.modify_qp(qp, state, now, remote_gid=remote_gid, remote_qpn=remote_qpn, rq_psn=rq_psn)


def query_qp_hint(hint: QpHint, mask: QpHintMask) -> dict[str, int]:
    """`mrc_query_qp_hint`: the attributes `mask` names."""
    if mask & QpHintMask.VENDOR_CFG:
        raise ValueError("this provider defines no vendor hint configuration")
    return {name: getattr(hint, name) for bit, name in _HINT_FIELDS.items() if mask & bit}


def modify_qp_hint(ctx: Context, hint: QpHint, values: dict[str, int], mask: QpHintMask) -> None:
    """`mrc_modify_qp_hint`: new values for the attributes in `mask`. The QPs holding the hint start
    their next RESET -> INIT with it; a running QP's window is NSCC's by then, not the hint's."""
    if ctx.qp_hints.get(hint.hint_id) is not hint:
        raise ValueError(f"QP hint {hint.hint_id} is not a hint of this context")
    if mask & QpHintMask.VENDOR_CFG:
        raise ValueError("this provider defines no vendor hint configuration")
    new = replace(hint, **{name: values[name] for bit, name in _HINT_FIELDS.items() if mask & bit})
    new.check()
    for name in _HINT_FIELDS.values():
        setattr(hint, name, getattr(new, name))
