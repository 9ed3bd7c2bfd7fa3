"""SRv6 route messages for pyroute2 0.9.7, which lacks two things this project needs (docs/design.md §6):

* the seg6local ``SEG6_LOCAL_FLAVORS`` attribute (11; nested OPERATION bitmask, LCBLOCK_BITS,
  LCNODE_FN_BITS) that carries NEXT-C-SID (micro-SID), PSP, USP and USD, and ``SEG6_LOCAL_COUNTERS`` (10);
* the seg6 encap modes ``encap.red``, ``l2encap`` and ``l2encap.red`` (it silently turns them into ``encap``).

Rather than patching pyroute2's classes in place, this module subclasses them: ``SRv6RouteMsg`` is an
``rtmsg`` whose lwtunnel dispatch knows the extended seg6 and seg6local encodings. Requests are built
as ``SRv6RouteMsg`` and sent with ``nlm_request``; ``use_srv6_messages(ipr)`` makes one socket decode
route dumps with the same classes, so the flavors read back. Nothing global in pyroute2 changes.

The friendly forms, on encode and after decode::

    seg6local: {"action": "End", "flavors": {"operations": ["next-csid"], "lblen": 32, "nflen": 16}}
               {"action": "End.DT6", "table": 255}
    seg6:      {"mode": "encap.red", "segs": ["fcbb:bbbb:100:200::"]}     # travel order, first hop first

``segs`` here are in travel order; the kernel's SRH (and pyroute2's own API) lists them last first.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, nla
from pyroute2.netlink.rtnl import RTM_DELROUTE, RTM_NEWROUTE
from pyroute2.netlink.rtnl.rtmsg import (
    LWTUNNEL_ENCAP_SEG6,
    LWTUNNEL_ENCAP_SEG6_LOCAL,
    rtmsg,
)

SEG6_LOCAL_COUNTERS: Final = 10
SEG6_LOCAL_FLAVORS: Final = 11

# include/uapi/linux/seg6_local.h: enum { SEG6_LOCAL_FLV_OP_UNSPEC, END, PSP, USP, USD, NEXT_CSID }
FLAVOR_OPS: Final[dict[str, int]] = {"psp": 1, "usp": 2, "usd": 3, "next-csid": 4}
_FLAVOR_NAMES: Final = {v: k for k, v in FLAVOR_OPS.items()}

# include/uapi/linux/seg6_iptunnel.h
SEG6_ENCAP_MODES: Final[dict[str, int]] = {
    "inline": 0, "encap": 1, "l2encap": 2, "encap.red": 3, "l2encap.red": 4,
}
_MODE_NAMES: Final = {v: k for k, v in SEG6_ENCAP_MODES.items()}

RTPROT_STATIC: Final = 4
RT_TABLE_MAIN: Final = 254
RTN_UNICAST: Final = 1
RTN_LOCAL: Final = 2
RT_SCOPE_UNIVERSE: Final = 0


def flavors_to_attrs(flavors: Mapping[str, Any]) -> list[list[Any]]:
    """``{"operations": [...], "lblen": 32, "nflen": 16}`` -> the nested SEG6_LOCAL_FLAVORS attributes."""
    ops = flavors.get("operations", flavors.get("ops"))
    if not ops:
        raise ValueError("seg6local flavors need at least one operation")
    mask = 0
    for op in ops:
        if op not in FLAVOR_OPS:
            raise ValueError(f"unknown seg6local flavor {op!r} (known: {', '.join(FLAVOR_OPS)})")
        mask |= 1 << FLAVOR_OPS[op]
    attrs: list[list[Any]] = [["SEG6_LOCAL_FLV_OPERATION", mask]]
    for key, name in (("lblen", "SEG6_LOCAL_FLV_LCBLOCK_BITS"), ("nflen", "SEG6_LOCAL_FLV_LCNODE_FN_BITS")):
        if key in flavors:
            value = int(flavors[key])
            if not 0 < value < 128 or value % 8:
                raise ValueError(f"{key} must be a positive multiple of 8 below 128, got {value}")
            attrs.append([name, value])
    return attrs


class _Seg6LocalFlavors(nla):  # type: ignore[misc]
    """SEG6_LOCAL_FLAVORS: nested attributes (kernel: seg6_local_flavors_policy)."""

    __slots__ = ()
    nla_map = (
        ("SEG6_LOCAL_FLV_UNSPEC", "none"),
        ("SEG6_LOCAL_FLV_OPERATION", "uint32"),  # bitmask of 1 << SEG6_LOCAL_FLV_OP_*
        ("SEG6_LOCAL_FLV_LCBLOCK_BITS", "uint8"),
        ("SEG6_LOCAL_FLV_LCNODE_FN_BITS", "uint8"),
    )

    def friendly(self) -> dict[str, Any]:
        mask = self.get_attr("SEG6_LOCAL_FLV_OPERATION") or 0
        ops = [_FLAVOR_NAMES.get(b, str(b)) for b in range(32) if mask >> b & 1]
        out: dict[str, Any] = {"operations": ops}
        lb = self.get_attr("SEG6_LOCAL_FLV_LCBLOCK_BITS")
        nf = self.get_attr("SEG6_LOCAL_FLV_LCNODE_FN_BITS")
        if lb is not None:
            out["lblen"] = lb
        if nf is not None:
            out["nflen"] = nf
        return out


class _Seg6LocalCounters(nla):  # type: ignore[misc]
    """SEG6_LOCAL_COUNTERS: nested u64 packets / bytes / errors (present when the route counts)."""

    __slots__ = ()
    nla_map = (
        ("SEG6_LOCAL_CNT_UNSPEC", "none"),
        ("SEG6_LOCAL_CNT_PAD", "hex"),
        ("SEG6_LOCAL_CNT_PACKETS", "uint64"),
        ("SEG6_LOCAL_CNT_BYTES", "uint64"),
        ("SEG6_LOCAL_CNT_ERRORS", "uint64"),
    )


class Seg6LocalEncap(rtmsg.seg6local_encap_info):  # type: ignore[misc]
    """pyroute2's seg6local encap info plus COUNTERS (10) and FLAVORS (11)."""

    __slots__ = ()
    nla_map = (
        ("SEG6_LOCAL_UNSPEC", "none"),
        ("SEG6_LOCAL_ACTION", "action"),
        ("SEG6_LOCAL_SRH", "ipv6_sr_hdr"),
        ("SEG6_LOCAL_TABLE", "table"),
        ("SEG6_LOCAL_NH4", "nh4"),
        ("SEG6_LOCAL_NH6", "nh6"),
        ("SEG6_LOCAL_IIF", "iif"),
        ("SEG6_LOCAL_OIF", "oif"),
        ("SEG6_LOCAL_BPF", "bpf_obj"),
        ("SEG6_LOCAL_VRFTABLE", "vrf_table"),
        ("SEG6_LOCAL_COUNTERS", "counters"),
        ("SEG6_LOCAL_FLAVORS", "flavors"),
    )
    flavors = _Seg6LocalFlavors
    counters = _Seg6LocalCounters


class _SRHeader(rtmsg.seg6_encap_info.ipv6_sr_hdr):  # type: ignore[misc]
    """pyroute2's SEG6_IPTUNNEL_SRH with every kernel encap mode (encap.red, l2encap, l2encap.red)."""

    __slots__ = ()
    encapmodes = SEG6_ENCAP_MODES
    r_encapmodes = _MODE_NAMES

    def encode(self) -> None:
        mode = self["mode"]
        if mode not in SEG6_ENCAP_MODES:
            raise ValueError(f"unknown seg6 encap mode {mode!r} (known: {', '.join(SEG6_ENCAP_MODES)})")
        super().encode()


class Seg6Encap(rtmsg.seg6_encap_info):  # type: ignore[misc]
    __slots__ = ()
    nla_map = (
        ("SEG6_IPTUNNEL_UNSPEC", "none"),
        ("SEG6_IPTUNNEL_SRH", "ipv6_sr_hdr"),
    )
    ipv6_sr_hdr = _SRHeader


class SRv6RouteMsg(rtmsg):  # type: ignore[misc]
    """An rtmsg whose RTA_ENCAP decodes/encodes with the classes above."""

    __slots__ = ()
    encaps: ClassVar[dict[int, Any]] = {
        **rtmsg.encaps, LWTUNNEL_ENCAP_SEG6: Seg6Encap, LWTUNNEL_ENCAP_SEG6_LOCAL: Seg6LocalEncap,
    }


def use_srv6_messages(ipr: Any) -> None:
    """Make this pyroute2 socket parse route messages as SRv6RouteMsg (flavors and modes decoded)."""
    ipr.register_policy({RTM_NEWROUTE: SRv6RouteMsg, RTM_DELROUTE: SRv6RouteMsg})


# ------------------------------------------------------------------------------------ building

def _base(dst: str, dst_len: int, table: int, rtype: int = RTN_UNICAST) -> SRv6RouteMsg:
    msg = SRv6RouteMsg()
    msg["family"] = socket.AF_INET6
    msg["dst_len"] = dst_len
    msg["src_len"] = 0
    msg["tos"] = 0
    msg["table"] = table if table < 256 else 252
    msg["proto"] = RTPROT_STATIC
    msg["scope"] = RT_SCOPE_UNIVERSE
    msg["type"] = rtype
    msg["flags"] = 0
    msg["attrs"] = [["RTA_DST", dst], ["RTA_TABLE", table]]
    return msg


def seg6local_msg(
    dst: str, dst_len: int, oif: int, action: str, *, table: int | None = None,
    flavors: Mapping[str, Any] | None = None, route_table: int = RT_TABLE_MAIN, local: bool = False,
) -> SRv6RouteMsg:
    """``ip -6 route add [local] DST encap seg6local action ACTION [table T] [flavors ...] dev OIF``.

    ``local=True`` with the loopback as OIF gives a SID that no port failure removes (a *unicast* route
    via lo is turned into a reject route by the kernel, fib6_is_reject)."""
    if action not in Seg6LocalEncap.action.actions:
        raise ValueError(f"unknown seg6local action {action!r}")
    encap: list[list[Any]] = [["SEG6_LOCAL_ACTION", {"value": action}]]
    if table is not None:
        encap.append(["SEG6_LOCAL_TABLE", {"value": table}])
    if flavors is not None:
        encap.append(["SEG6_LOCAL_FLAVORS", {"attrs": flavors_to_attrs(flavors)}])
    msg = _base(dst, dst_len, route_table, RTN_LOCAL if local else RTN_UNICAST)
    msg["attrs"] += [
        ["RTA_OIF", oif], ["RTA_ENCAP_TYPE", LWTUNNEL_ENCAP_SEG6_LOCAL], ["RTA_ENCAP", {"attrs": encap}],
    ]
    return msg


def seg6_encap_msg(
    dst: str, dst_len: int, segs: Sequence[str], *, mode: str = "encap.red", oif: int,
    gateway: str | None = None, src: str | None = None, src_len: int = 128,
    route_table: int = RT_TABLE_MAIN,
) -> SRv6RouteMsg:
    """``ip -6 route add DST [from SRC] encap seg6 mode MODE segs S1,S2.. [via GW] dev OIF``.

    ``segs`` is in travel order (first hop first), as `ip route` writes it."""
    if not segs:
        raise ValueError("a seg6 encap route needs at least one segment")
    msg = _base(dst, dst_len, route_table)
    if src is not None:
        msg["src_len"] = src_len
        msg["attrs"].append(["RTA_SRC", src])
    msg["attrs"] += [["RTA_OIF", oif]]
    if gateway is not None:
        msg["attrs"].append(["RTA_GATEWAY", gateway])
    srh = {"mode": mode, "segs": list(reversed(list(segs)))}  # SRH order: last segment first
    msg["attrs"] += [
        ["RTA_ENCAP_TYPE", LWTUNNEL_ENCAP_SEG6], ["RTA_ENCAP", {"attrs": [["SEG6_IPTUNNEL_SRH", srh]]}],
    ]
    return msg


def route_request(ipr: Any, msg: SRv6RouteMsg, *, replace: bool = False) -> None:
    """Send one route message (create, or create-or-replace) and wait for the kernel's ACK."""
    msg["header"]["type"] = RTM_NEWROUTE
    mode = NLM_F_REPLACE if replace else NLM_F_EXCL
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | mode
    tuple(ipr.nlm_request_batch([msg]))


def encode(msg: SRv6RouteMsg) -> bytes:
    """The wire bytes of a route message (as the kernel would receive them)."""
    msg["header"]["type"] = RTM_NEWROUTE
    msg["header"]["flags"] = NLM_F_REQUEST
    msg.encode()
    return bytes(msg.data)


def decode(data: bytes) -> SRv6RouteMsg:
    msg = SRv6RouteMsg(data)
    msg.decode()
    return msg


def describe_encap(msg: Any) -> dict[str, Any] | None:
    """The friendly form of a decoded route's seg6 / seg6local encap (None when it has none)."""
    encap = msg.get_attr("RTA_ENCAP")
    etype = msg.get_attr("RTA_ENCAP_TYPE")
    if encap is None:
        return None
    if etype == LWTUNNEL_ENCAP_SEG6_LOCAL and isinstance(encap, Seg6LocalEncap):
        action_value = encap.get_attr("SEG6_LOCAL_ACTION")
        names = {v: k for k, v in Seg6LocalEncap.action.actions.items()}
        out: dict[str, Any] = {"type": "seg6local", "action": names.get(action_value, action_value)}
        table = encap.get_attr("SEG6_LOCAL_TABLE")
        if table is not None:
            out["table"] = table
        flv = encap.get_attr("SEG6_LOCAL_FLAVORS")
        if flv is not None:
            out["flavors"] = flv.friendly()
        return out
    if etype == LWTUNNEL_ENCAP_SEG6 and isinstance(encap, Seg6Encap):
        srh = encap.get_attr("SEG6_IPTUNNEL_SRH")
        return {"type": "seg6", "mode": srh["mode"], "segs": list(reversed(srh["segs"]))}
    return {"type": str(etype)}


def flavors_of(routes: Iterable[Any]) -> list[dict[str, Any] | None]:
    return [describe_encap(r) for r in routes]
