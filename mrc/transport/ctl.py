"""The controller API of `mrc_ctl.h` in Python naming: device query, port admin, EV format profiles,
EV profiles (states, attribute masks, EV operations), CC profiles, the EV event CQ.

Ports are numbered from 1 here, as in the header (`port_num`, `mrc_ctl_ev.port`, `phy_port_mask` bit
N = port N); the engine inside numbers them from 0 (`Context.modify_port`, `EvEntry.port`), and every
function of this module converts at its boundary.

Profiles follow mrc_ctl.h's state machine INIT -> OFFLINE -> ONLINE -> OFFLINE -> INIT. An EV profile
becomes a `paths.EvProfile` of the context (QPs can use it) when it goes ONLINE and stops being one
when it goes OFFLINE (refused while a QP uses it); a profile made with `Context.create_ev_profile` is
ONLINE from the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any, Final

from .cc import NsccConfig
from .engine import Context, api_ver
from .paths import EV_STATE_BIT, EvEntry, EvEvent, EvEventCq, EvField, EvMode, EvProfile, EvState
from .verbs import CompletionChannel

CTL_API_CURRENT_VERSION: Final = api_ver(1, 0, 1)
CTL_API_LAST_SUPPORTED_VERSION: Final = api_ver(0, 0, 0)
CTL_VENDOR_API_CURRENT_VERSION: Final = api_ver(1, 0, 0)
CTL_VENDOR_API_LAST_SUPPORTED_VERSION: Final = api_ver(0, 0, 0)
#: MRC_CTL_EV_MAX_BYTES x 8: an EV value is at most 256 bits (SRv6: address + SRH address)
EV_MAX_WIDTH: Final = 256
EV_MAX_COUNT_PROFILE: Final = 1 << 14  # 14-bit EV index in MXH
EV_MAX_COUNT: Final = 1 << 20
EV_MAX_PROFILES: Final = 1 << 12
EV_MAX_FMT_PROFILES: Final = 64
CC_MAX_PROFILES: Final = 1 << 12
CC_ALGORITHMS: Final = ("uet-1.0-nscc",)


class CtlProtocolVersion(IntFlag):
    V0 = 0
    V1 = 1 << 0


class ProfileState(IntEnum):
    """`mrc_ctl_profile_state`."""

    INIT = 0
    OFFLINE = 1
    ONLINE = 2


class CtlOpt(IntFlag):
    """`mrc_ctl_attr_opt`: what `ctl_query_device` advertises (EV_EVENT, PRECISE_DROP_CNT); profiles
    are not modifiable ONLINE, EV arrays need not be contiguous, EV probes are the QPs' own."""

    EV_PROFILE_MODIFY_ONLINE = 1 << 0
    CC_PROFILE_MODIFY_ONLINE = 1 << 1
    EV_EVENT = 1 << 2
    EV_EXPLICIT_RANGE = 1 << 3
    EV_EVENT_PRECISE_DROP_CNT = 1 << 4
    EP_OP_EV_PROBE = 1 << 5


class PortAdminState(IntEnum):
    DISABLED = 0
    ENABLED = 1


class PortAttrMask(IntFlag):
    ADMIN_STATE = 1 << 0


class EvFmtMode(IntFlag):
    """`mrc_ctl_ev_fmt_mode`: where an EV's bits go in the packet, hence its widest value. STEV: IPv6
    flow label (20 bits) + UDP source port (16 bits) minus what the encapsulation fixes, at most the
    first 32 bits of mrc_ctl_ev_t; SRV6: a uSID address (128 bits) and an SRH address (128 bits); UDP:
    the UDP source port (16 bits). The engine treats EV values as opaque (it sends an EV index; the host
    egress program writes the path), so the mode bounds the values a profile may hold."""

    STEV = 1 << 0
    SRV6 = 1 << 1
    UDP = 1 << 2


FMT_MODE_WIDTH: Final = {EvFmtMode.STEV: 32, EvFmtMode.SRV6: 256, EvFmtMode.UDP: 16}


class EvFmtOp(IntEnum):
    MODIFY_FIELDS = 0
    QUERY_FIELDS = 1


class EvFmtMask(IntFlag):
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    MODE = 1 << 2
    OP = 1 << 3
    VENDOR_CFG = 1 << 31


class CtlEvState(IntFlag):
    """`mrc_ctl_ev_state` (bits; `paths.EvState` is the engine's 0..3)."""

    GOOD = 1 << 0
    ASSUMED_BAD = 1 << 1
    DENIED = 1 << 2
    UNKNOWN = 1 << 31


_TO_CTL: Final = {EvState(i): CtlEvState(b) for i, b in enumerate(EV_STATE_BIT)}
_FROM_CTL: Final = {v: k for k, v in _TO_CTL.items()}


class CtlEvMode(IntFlag):
    AUTO = 1 << 0
    EXP = 1 << 1
    GEN = 1 << 2


_MODE: Final = {CtlEvMode.AUTO: EvMode.AUTO, CtlEvMode.EXP: EvMode.EXP, CtlEvMode.GEN: EvMode.GEN}


class EvOp(IntEnum):
    REPLACE_EV = 0
    MODIFY_EV_STATE = 1
    QUERY_EV_STATE = 2
    QUERY_EV_ARRAY = 3


class EvFieldsOp(IntEnum):
    MODIFY_FIELDS = 0
    QUERY_FIELDS = 1


class EvProfileMask(IntFlag):
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    MODE = 1 << 2
    FMT_ID = 1 << 3
    COUNT = 1 << 4
    MIN_ACTIVE = 1 << 5
    EVENT_MASK = 1 << 6
    EV_OP = 1 << 7
    EV_FIELDS_OP = 1 << 8
    VENDOR_CFG = 1 << 31


class EvOpFlags(IntFlag):
    ALL_COPIES = 1 << 0


class CcProfileMask(IntFlag):
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    ALGORITHM = 1 << 2
    CONFIG = 1 << 3
    VENDOR_CFG = 1 << 31


class EpOpType(IntEnum):
    EV_PROBE = 0
    PORT_STATUS_UPDATE = 1


@dataclass(slots=True, frozen=True)
class CtlEv:
    """`mrc_ctl_ev`: an EV value and its port, numbered from 1 (port 0 = unpopulated)."""

    val: int
    port: int


UNPOPULATED: Final = CtlEv(0, 0)


@dataclass(slots=True)
class EvOpEntry:
    """`mrc_ctl_ev_op_entry` (which fields each operation reads or fills: mrc_ctl.h's table)."""

    ev: CtlEv = UNPOPULATED
    ev_new: CtlEv = UNPOPULATED
    state: CtlEvState = CtlEvState.UNKNOWN
    flags: EvOpFlags = EvOpFlags.ALL_COPIES & 0  # no flag


@dataclass(slots=True, frozen=True)
class CtlDeviceAttr:
    """`mrc_ctl_device_attr`."""

    mrc_ctl_protocol_version: int
    ev_max_fmt_profiles: int
    ev_max_profiles: int
    ev_max_count: int
    ev_free_count: int
    ev_max_count_profile: int
    ev_count_align: int
    ev_max_width: int
    ev_fmt_mode_mask: int
    ev_mode_mask: int
    ev_op_max_entries: int
    cc_max_profiles: int
    algorithms: tuple[str, ...]
    phy_port_mask: int
    opt_attr: CtlOpt


@dataclass(slots=True, frozen=True)
class CtlEvEvent:
    """`mrc_ctl_ev_event` (1-based port in `ev`; `state` only with a 1.0.1 controller API)."""

    profile_id: int
    ev: CtlEv
    drop_count: int
    state: CtlEvState


@dataclass(slots=True)
class EvFmtProfile:
    """An EV format profile: field widths whose sum bounds the EVs of the profiles that use it."""

    fmt_id: int
    state: ProfileState = ProfileState.INIT
    mode: EvFmtMode | None = None
    widths: list[int] = field(default_factory=list)

    @property
    def width(self) -> int:
        return sum(self.widths)


@dataclass(slots=True)
class CtlEvProfile:
    """An EV profile as the controller configures it; `profile` is the engine's while ONLINE."""

    profile_id: int
    state: ProfileState = ProfileState.INIT
    mode: CtlEvMode | None = None
    fmt_id: int = 0
    count: int = 0
    min_active: int | None = None
    event_mask: int | None = None
    fields: list[EvField] = field(default_factory=list)
    entries: list[CtlEv] = field(default_factory=list)
    profile: EvProfile | None = None


@dataclass(slots=True)
class CtlCcProfile:
    cc_id: int
    state: ProfileState = ProfileState.INIT
    algorithm: str | None = None
    config: NsccConfig | None = None
    configured: bool = False


def ctl_query_version() -> tuple[int, int, int, int]:
    """`mrc_ctl_query_version`: the control API versions (mrc_ctl_api_ver.h)."""
    return (CTL_API_CURRENT_VERSION, CTL_API_LAST_SUPPORTED_VERSION, CTL_VENDOR_API_CURRENT_VERSION,
            CTL_VENDOR_API_LAST_SUPPORTED_VERSION)


def ctl_query_device(ctx: Context) -> CtlDeviceAttr:
    """`mrc_ctl_query_device(_ex)`: the controller limits of this context (its ports, its EVs in use)."""
    used = sum(len(p.entries) for p in ctx.ev_profiles.values())
    return CtlDeviceAttr(
        mrc_ctl_protocol_version=int(CtlProtocolVersion.V1),
        ev_max_fmt_profiles=EV_MAX_FMT_PROFILES,
        ev_max_profiles=EV_MAX_PROFILES,
        ev_max_count=EV_MAX_COUNT,
        ev_free_count=max(0, EV_MAX_COUNT - used),
        ev_max_count_profile=EV_MAX_COUNT_PROFILE,
        ev_count_align=1,
        ev_max_width=EV_MAX_WIDTH,
        ev_fmt_mode_mask=int(EvFmtMode.STEV | EvFmtMode.SRV6 | EvFmtMode.UDP),
        ev_mode_mask=int(CtlEvMode.AUTO | CtlEvMode.EXP | CtlEvMode.GEN),
        ev_op_max_entries=0,
        cc_max_profiles=CC_MAX_PROFILES,
        algorithms=CC_ALGORITHMS,
        phy_port_mask=sum(1 << (p + 1) for p in range(ctx.ports)),
        opt_attr=CtlOpt.EV_EVENT | CtlOpt.EV_EVENT_PRECISE_DROP_CNT,
    )


def _port(ctx: Context, port_num: int) -> int:
    if not 1 <= port_num <= ctx.ports:
        raise ValueError(f"port {port_num}: ports are numbered 1..{ctx.ports}")
    return port_num - 1


def ctl_query_port(ctx: Context, port_num: int) -> PortAdminState:
    """`mrc_ctl_query_port` (MRC_CTL_PORT_ADMIN_STATE) of port `port_num` (1-based)."""
    return PortAdminState(int(ctx.port_enabled[_port(ctx, port_num)]))


def ctl_modify_port(ctx: Context, port_num: int, state: PortAdminState, now: int = 0) -> None:
    """`mrc_ctl_modify_port`: `Context.modify_port` of port `port_num` (1-based): a disabled port's
    EVs are DENIED for every QP and the peers are told (PORT_STATUS)."""
    ctx.modify_port(_port(ctx, port_num), PortAdminState(state) == PortAdminState.ENABLED, now)


# ---------------------------------------------------------------------------- EV format profiles

_FMT_STEPS: Final = (
    (ProfileState.INIT, ProfileState.OFFLINE), (ProfileState.OFFLINE, ProfileState.ONLINE),
    (ProfileState.ONLINE, ProfileState.OFFLINE), (ProfileState.OFFLINE, ProfileState.INIT),
)

def ctl_modify_ev_fmt_profile(
    ctx: Context, fmt_id: int, mask: EvFmtMask, *, state: ProfileState | None = None,
    mode: EvFmtMode | None = None, widths: list[int] | None = None,
) -> None:
    """`mrc_ctl_modify_ev_fmt_profile`: INIT -> OFFLINE needs MODE, OFFLINE -> ONLINE needs the
    fields (OP with widths); OFFLINE may change MODE and fields, ONLINE only go OFFLINE (refused,
    as EBUSY, while an ONLINE EV profile uses it); OFFLINE -> INIT forgets it."""
    mask = EvFmtMask(mask)
    if mask & EvFmtMask.VENDOR_CFG:
        raise ValueError("this provider defines no vendor EV format configuration")
    f = ctx.ev_fmt_profiles.get(fmt_id) or EvFmtProfile(fmt_id)
    if f.state == ProfileState.ONLINE and mask & (EvFmtMask.MODE | EvFmtMask.OP):
        raise ValueError(f"EV format profile {fmt_id} is ONLINE: only its state may change")
    new_mode = f.mode if not mask & EvFmtMask.MODE else mode
    if mask & EvFmtMask.MODE and new_mode not in FMT_MODE_WIDTH:
        raise ValueError(f"EV format mode {mode!r}: one of STEV, SRV6, UDP")
    new_widths = list(widths or []) if mask & EvFmtMask.OP else f.widths
    if new_mode is not None and sum(new_widths) > FMT_MODE_WIDTH[new_mode]:
        raise ValueError(f"fields of {sum(new_widths)} bits exceed {new_mode.name}'s "
                         f"{FMT_MODE_WIDTH[new_mode]}")
    if any(not 1 <= w <= 32 for w in new_widths):
        raise ValueError("a format field is 1..32 bits wide")
    target = f.state if not mask & EvFmtMask.STATE or state is None else ProfileState(state)
    if target != f.state:
        step = (f.state, target)
        if step == (ProfileState.INIT, ProfileState.OFFLINE) and new_mode is None:
            raise ValueError("INIT -> OFFLINE needs MODE")
        if step == (ProfileState.OFFLINE, ProfileState.ONLINE) and not new_widths:
            raise ValueError("OFFLINE -> ONLINE needs the format fields")
        if step == (ProfileState.ONLINE, ProfileState.OFFLINE):
            users = [p.profile_id for p in ctx.ctl_ev_profiles.values()
                     if p.fmt_id == fmt_id and p.state == ProfileState.ONLINE]
            if users:
                raise ValueError(f"EV format profile {fmt_id} is used by ONLINE EV profile {users}")
        if step not in _FMT_STEPS:
            raise ValueError(f"no EV format profile transition {f.state.name} -> {target.name}")
    elif f.state == ProfileState.INIT and mask & ~EvFmtMask.STATE:
        raise ValueError("an INIT EV format profile is configured on its way to OFFLINE")
    if target == ProfileState.INIT:
        ctx.ev_fmt_profiles.pop(fmt_id, None)
        return
    if fmt_id not in ctx.ev_fmt_profiles and len(ctx.ev_fmt_profiles) >= EV_MAX_FMT_PROFILES:
        raise ValueError(f"at most {EV_MAX_FMT_PROFILES} EV format profiles")
    f.mode, f.widths, f.state = new_mode, new_widths, target
    ctx.ev_fmt_profiles[fmt_id] = f


def ctl_query_ev_fmt_profile(ctx: Context, fmt_id: int) -> EvFmtProfile:
    """`mrc_ctl_query_ev_fmt_profile` (a copy: state, mode, field widths)."""
    f = ctx.ev_fmt_profiles.get(fmt_id)
    if f is None:
        raise ValueError(f"no EV format profile {fmt_id}")
    return EvFmtProfile(f.fmt_id, f.state, f.mode, list(f.widths))


# ---------------------------------------------------------------------------- EV profiles

def _ctl_profile(ctx: Context, pid: int) -> CtlEvProfile:
    c = ctx.ctl_ev_profiles.get(pid)
    if c is None and pid in ctx.ev_profiles:  # made by create_ev_profile: ONLINE already
        p = ctx.ev_profiles[pid]
        mode = {v: k for k, v in _MODE.items()}[p.mode]
        c = CtlEvProfile(pid, ProfileState.ONLINE, mode, p.fmt_profile_id, len(p.entries), p.ev_min_active,
                         p.event_mask, [], [CtlEv(e.ev, e.port + 1) for e in p.entries], p)
        ctx.ctl_ev_profiles[pid] = c
    if c is None:
        c = CtlEvProfile(pid)
    return c


def _check_value(ctx: Context, c: CtlEvProfile, ev: CtlEv) -> None:
    if not 1 <= ev.port <= ctx.ports:
        raise ValueError(f"EV {ev.val:#x}: port {ev.port} not in 1..{ctx.ports}")
    f = ctx.ev_fmt_profiles.get(c.fmt_id)
    width = f.width if f is not None else EV_MAX_WIDTH
    if not 0 <= ev.val < 1 << width:
        raise ValueError(f"EV {ev.val:#x} is wider than the format's {width} bits")


def _go_online(ctx: Context, c: CtlEvProfile) -> EvProfile:
    if c.min_active is None or c.event_mask is None:
        raise ValueError("OFFLINE -> ONLINE needs MIN_ACTIVE and EVENT_MASK")
    if c.mode == CtlEvMode.EXP:
        if any(e.port == 0 for e in c.entries):
            raise ValueError("an explicit EV array must be fully replaced (no EV unpopulated) to go ONLINE")
        prof = EvProfile(c.profile_id, [EvEntry(e.val, e.port - 1) for e in c.entries], mode=EvMode.EXP,
                         ev_min_active=c.min_active)
    elif c.mode == CtlEvMode.GEN:
        prof = EvProfile.generate(c.profile_id, c.fields, c.count, ctx.ports, ev_min_active=c.min_active)
    else:
        prof = EvProfile.even(c.profile_id, c.count, ctx.ports, ev_min_active=c.min_active)
        prof.mode = EvMode.AUTO
    prof.event_mask = c.event_mask
    prof.fmt_profile_id = c.fmt_id
    ctx.create_ev_profile(prof)
    c.entries = [CtlEv(e.ev, e.port + 1) for e in prof.entries]
    return prof


def ctl_modify_ev_profile(
    ctx: Context, pid: int, mask: EvProfileMask, now: int = 0, *, state: ProfileState | None = None,
    mode: CtlEvMode | None = None, fmt_id: int | None = None, count: int | None = None,
    min_active: int | None = None, event_mask: int | None = None, ev_op: EvOp | None = None,
    entries: list[EvOpEntry] | None = None, fields: list[EvField] | None = None,
) -> None:
    """`mrc_ctl_modify_ev_profile`. INIT -> OFFLINE needs MODE, FMT_ID (not for AUTO), COUNT and the
    fields (GEN); OFFLINE -> ONLINE needs MIN_ACTIVE, EVENT_MASK and, for EXP, every EV replaced; the
    profile then becomes an `EvProfile` of the context. ONLINE allows STATE(OFFLINE, refused while a
    QP uses it) and the EV operations MODIFY_EV_STATE (applied to every QP of the profile: DENIED is
    the controller's deny, GOOD / ASSUMED_BAD set the QPs' states, ASSUMED_BAD EVs being probed) and
    the queries. REPLACE_EV (OFFLINE) replaces the first occurrence of `ev` by `ev_new`, or every one
    with ALL_COPIES. Entries apply in order; the first failing one raises (those before it stay)."""
    mask = EvProfileMask(mask)
    if mask & EvProfileMask.VENDOR_CFG:
        raise ValueError("this provider defines no vendor EV profile configuration")
    if mask & EvProfileMask.EV_OP and mask & EvProfileMask.EV_FIELDS_OP:
        raise ValueError("EV_OP and EV_FIELDS_OP are mutually exclusive")
    c = _ctl_profile(ctx, pid)
    config = EvProfileMask.MODE | EvProfileMask.FMT_ID | EvProfileMask.COUNT | EvProfileMask.MIN_ACTIVE
    config |= EvProfileMask.EVENT_MASK | EvProfileMask.EV_FIELDS_OP
    if c.state == ProfileState.ONLINE and mask & config:
        raise ValueError(f"EV profile {pid} is ONLINE: only STATE and EV state operations apply")
    if c.state == ProfileState.INIT and mask & EvProfileMask.EV_OP:
        raise ValueError(f"EV profile {pid} is INIT: no EVs yet")
    if mask & EvProfileMask.MODE:
        if mode not in _MODE:
            raise ValueError(f"EV mode {mode!r}: one of AUTO, EXP, GEN")
        c.mode = mode
    if mask & EvProfileMask.FMT_ID:
        f = ctx.ev_fmt_profiles.get(fmt_id or 0)
        if f is None or f.state != ProfileState.ONLINE:
            raise ValueError(f"EV format profile {fmt_id} is not ONLINE")
        c.fmt_id = fmt_id or 0
    if mask & EvProfileMask.COUNT:
        if count is None or not 1 <= count <= EV_MAX_COUNT_PROFILE:
            raise ValueError(f"EV count must be 1..{EV_MAX_COUNT_PROFILE}")
        c.count = count
        c.entries = (c.entries + [UNPOPULATED] * count)[:count]
    if mask & EvProfileMask.MIN_ACTIVE:
        if min_active is None or not 1 <= min_active <= max(1, c.count):
            raise ValueError("ev_min_active must be 1..ev_count")
        c.min_active = min_active
    if mask & EvProfileMask.EVENT_MASK:
        if event_mask is None or event_mask & ~int(CtlEvState.GOOD | CtlEvState.ASSUMED_BAD):
            raise ValueError("an EV event mask holds GOOD and ASSUMED_BAD only")
        c.event_mask = event_mask
    if mask & EvProfileMask.EV_FIELDS_OP:
        f = ctx.ev_fmt_profiles.get(c.fmt_id)
        flds = list(fields or [])
        if f is not None and (len(flds) > len(f.widths) or sum(x.width for x in flds) > f.width):
            raise ValueError(f"fields exceed EV format profile {c.fmt_id}")
        for x in flds:
            if x.init_val >> x.width or x.mask >> x.width or x.max_val >> bin(x.mask).count("1"):
                raise ValueError(f"field {x}: a value or mask wider than the field")
        c.fields = flds
    if mask & EvProfileMask.EV_OP:
        _ev_op(ctx, c, ev_op, entries or [], now)
    if mask & EvProfileMask.STATE and state is not None and ProfileState(state) != c.state:
        _transition(ctx, c, ProfileState(state))
    if c.state != ProfileState.INIT:
        ctx.ctl_ev_profiles[pid] = c


def _transition(ctx: Context, c: CtlEvProfile, target: ProfileState) -> None:
    step = (c.state, target)
    if step == (ProfileState.INIT, ProfileState.OFFLINE):
        if c.mode is None or not c.count or (c.mode != CtlEvMode.AUTO and not c.fmt_id):
            raise ValueError("INIT -> OFFLINE needs MODE, COUNT and (but for AUTO) FMT_ID")
        if c.mode == CtlEvMode.GEN and not c.fields:
            raise ValueError("INIT -> OFFLINE of a generated profile needs its fields")
        if len(ctx.ctl_ev_profiles) >= EV_MAX_PROFILES:
            raise ValueError(f"at most {EV_MAX_PROFILES} EV profiles")
        if c.profile_id in ctx.ev_profiles:
            raise ValueError(f"EV profile id {c.profile_id} exists already")
    elif step == (ProfileState.OFFLINE, ProfileState.ONLINE):
        c.profile = _go_online(ctx, c)
    elif step == (ProfileState.ONLINE, ProfileState.OFFLINE):
        assert c.profile is not None
        ctx.destroy_ev_profile(c.profile)  # ValueError (EBUSY) while a QP uses it
        c.profile = None
    elif step == (ProfileState.OFFLINE, ProfileState.INIT):
        ctx.ctl_ev_profiles.pop(c.profile_id, None)
    else:
        raise ValueError(f"no EV profile transition {c.state.name} -> {target.name}")
    c.state = target


def _indices(c: CtlEvProfile, ev: CtlEv) -> list[int]:
    return [i for i, e in enumerate(c.entries) if e == ev]


def _ev_op(ctx: Context, c: CtlEvProfile, op: EvOp | None, entries: list[EvOpEntry], now: int) -> None:
    if op == EvOp.REPLACE_EV:
        if c.state != ProfileState.OFFLINE or c.mode != CtlEvMode.EXP:
            raise ValueError("REPLACE_EV applies to an OFFLINE explicit profile")
        for e in entries:
            _check_value(ctx, c, e.ev_new)
            idx = _indices(c, e.ev)
            if not idx:
                raise LookupError(f"EV {e.ev} not in profile {c.profile_id}")  # ENOENT
            for i in idx if e.flags & EvOpFlags.ALL_COPIES else idx[:1]:
                c.entries[i] = e.ev_new
    elif op == EvOp.MODIFY_EV_STATE:
        for e in entries:
            idx = _indices(c, e.ev)
            if not idx:
                raise LookupError(f"EV {e.ev} not in profile {c.profile_id}")
            st = _FROM_CTL.get(CtlEvState(e.state))
            if st is None or st == EvState.UNKNOWN:
                raise ValueError(f"EV state {e.state!r} cannot be set")
            if c.profile is None:
                raise ValueError("EV states exist once the profile is ONLINE")
            if st == EvState.DENIED:
                c.profile.deny(idx, now)
                continue
            c.profile.allow([i for i in idx if i in c.profile.denied], now)
            for ps in c.profile.paths:
                for i in idx:
                    ps.set_state(i, st, now)
    elif op in (EvOp.QUERY_EV_STATE, EvOp.QUERY_EV_ARRAY):
        raise ValueError(f"{op.name} is a query (ctl_query_ev_profile)")
    else:
        raise ValueError(f"EV operation {op!r}")


def profile_ev_state(c: CtlEvProfile, i: int) -> CtlEvState:
    """The state of EV i of a profile, over its QPs: DENIED when the controller denied it, ASSUMED_BAD
    when a QP holds it ASSUMED_BAD (the controller asks whether the path is suspect), GOOD when every QP
    holds it GOOD, UNKNOWN while no QP uses the profile."""
    p = c.profile
    if p is None or not p.paths:
        return CtlEvState.DENIED if p is not None and i in p.denied else CtlEvState.UNKNOWN
    if i in p.denied:
        return CtlEvState.DENIED
    states = {ps.state[i] for ps in p.paths}
    if EvState.ASSUMED_BAD in states:
        return CtlEvState.ASSUMED_BAD
    return CtlEvState.GOOD if states == {EvState.GOOD} else CtlEvState.DENIED


def ctl_query_ev_profile(
    ctx: Context, pid: int, ev_op: EvOp | None = None, entries: list[EvOpEntry] | None = None
) -> tuple[CtlEvProfile, list[EvOpEntry]]:
    """`mrc_ctl_query_ev_profile`: the profile's configuration (state, mode, format, count, min
    active, event mask, fields) and, with QUERY_EV_STATE, each given entry with its `state` filled, or,
    with QUERY_EV_ARRAY, the whole EV array (1-based ports) with states."""
    if pid not in ctx.ctl_ev_profiles and pid not in ctx.ev_profiles:
        raise LookupError(f"no EV profile {pid}")
    c = _ctl_profile(ctx, pid)
    out: list[EvOpEntry] = []
    if ev_op == EvOp.QUERY_EV_STATE:
        for e in entries or []:
            idx = _indices(c, e.ev)
            if not idx:
                raise LookupError(f"EV {e.ev} not in profile {pid}")
            out.append(EvOpEntry(e.ev, UNPOPULATED, profile_ev_state(c, idx[0]), EvOpFlags(0)))
    elif ev_op == EvOp.QUERY_EV_ARRAY:
        out = [EvOpEntry(e, UNPOPULATED, profile_ev_state(c, i)) for i, e in enumerate(c.entries)]
    elif ev_op is not None:
        raise ValueError(f"{EvOp(ev_op).name} is not a query")
    return c, out


def query_ev_array(ctx: Context, pid: int) -> list[EvOpEntry]:
    """QUERY_EV_ARRAY on its own: the profile's EVs (1-based ports) and their states."""
    return ctl_query_ev_profile(ctx, pid, EvOp.QUERY_EV_ARRAY)[1]


# ---------------------------------------------------------------------------- CC profiles

def ctl_modify_cc_profile(
    ctx: Context, cc_id: int, mask: CcProfileMask, *, state: ProfileState | None = None,
    algorithm: str | None = None, config: NsccConfig | None = None,
) -> None:
    """`mrc_ctl_modify_cc_profile`: INIT -> OFFLINE needs ALGORITHM ("uet-1.0-nscc", or None: no CC),
    OFFLINE -> ONLINE needs CONFIG (an `NsccConfig`; None with the null algorithm), after which the
    profile is a CC profile of the context (`Context.cc_profiles[cc_id]`, for `create_qp`). ONLINE ->
    OFFLINE is refused while a QP uses it."""
    mask = CcProfileMask(mask)
    if mask & CcProfileMask.VENDOR_CFG:
        raise ValueError("this provider defines no vendor CC configuration")
    c = ctx.ctl_cc_profiles.get(cc_id)
    if c is None:
        if cc_id in ctx.cc_profiles:
            c = CtlCcProfile(cc_id, ProfileState.ONLINE, "uet-1.0-nscc" if ctx.cc_profiles[cc_id] else None,
                             ctx.cc_profiles[cc_id], True)
        else:
            c = CtlCcProfile(cc_id)
    if c.state == ProfileState.ONLINE and mask & (CcProfileMask.ALGORITHM | CcProfileMask.CONFIG):
        raise ValueError(f"CC profile {cc_id} is ONLINE: only its state may change")
    if mask & CcProfileMask.ALGORITHM:
        if algorithm is not None and algorithm not in CC_ALGORITHMS:
            raise ValueError(f"CC algorithm {algorithm!r}: one of {CC_ALGORITHMS} or None")
        c.algorithm = algorithm
    if mask & CcProfileMask.CONFIG:
        if (config is None) != (c.algorithm is None):
            raise ValueError("NSCC needs an NsccConfig, the null algorithm none")
        c.config, c.configured = config, True
    target = c.state if not mask & CcProfileMask.STATE or state is None else ProfileState(state)
    step = (c.state, target)
    if step == (ProfileState.OFFLINE, ProfileState.ONLINE):
        if not c.configured:
            raise ValueError("OFFLINE -> ONLINE needs CONFIG")
        if cc_id in ctx.cc_profiles:
            raise ValueError(f"CC profile id {cc_id} exists already")
        ctx.cc_profiles[cc_id] = c.config
    elif step == (ProfileState.ONLINE, ProfileState.OFFLINE):
        users = [q.qpn for q in ctx.qps.values() if c.config is not None and q.cc_spec is c.config]
        if users:
            raise ValueError(f"CC profile {cc_id} is used by QP {[hex(u) for u in users]}")
        del ctx.cc_profiles[cc_id]
    elif step not in ((c.state, c.state), (ProfileState.INIT, ProfileState.OFFLINE),
                      (ProfileState.OFFLINE, ProfileState.INIT)):
        raise ValueError(f"no CC profile transition {c.state.name} -> {target.name}")
    if step == (ProfileState.INIT, ProfileState.OFFLINE) and not mask & CcProfileMask.ALGORITHM:
        raise ValueError("INIT -> OFFLINE needs ALGORITHM")
    c.state = target
    if target == ProfileState.INIT:
        ctx.ctl_cc_profiles.pop(cc_id, None)
    else:
        ctx.ctl_cc_profiles[cc_id] = c


def ctl_query_cc_profile(ctx: Context, cc_id: int) -> CtlCcProfile:
    """`mrc_ctl_query_cc_profile`: state, algorithm, configuration."""
    c = ctx.ctl_cc_profiles.get(cc_id)
    if c is None and cc_id in ctx.cc_profiles:
        cfg = ctx.cc_profiles[cc_id]
        return CtlCcProfile(cc_id, ProfileState.ONLINE, "uet-1.0-nscc" if cfg else None, cfg, True)
    if c is None:
        raise LookupError(f"no CC profile {cc_id}")
    return CtlCcProfile(c.cc_id, c.state, c.algorithm, c.config, c.configured)


# ---------------------------------------------------------------------------- EV events

def ctl_create_ev_event_cq(
    ctx: Context, cqe: int, channel: CompletionChannel | None = None, cq_context: Any = None
) -> EvEventCq:
    """`mrc_ctl_create_ev_event_cq` (`Context.create_ev_event_cq`). A completion channel is refused:
    the controller polls its EV events (mrcd's loop does, once per turn)."""
    if channel is not None:
        raise ValueError("EV event CQs raise no completion events here: poll them")
    return ctx.create_ev_event_cq(cqe, cq_context)


def to_ctl_event(e: EvEvent) -> CtlEvEvent:
    return CtlEvEvent(e.profile_id, CtlEv(e.ev, e.port + 1), e.drop_count, _TO_CTL[e.state])


def ctl_poll_ev_event(cq: EvEventCq, num_entries: int) -> list[CtlEvEvent]:
    """`mrc_ctl_poll_ev_event`: up to `num_entries` events as mrc_ctl_ev_event has them (1-based port,
    `drop_count` = events dropped from the full queue just before this one)."""
    return [to_ctl_event(e) for e in cq.poll(num_entries)]
