"""The IPv6 envelopes around an MRC packet (docs/design.md §3) and Ethernet framing, for captures, tools
and tests. The data path itself never builds these in Python: the socket adds the inner IPv6/UDP
and the host egress program the outer IPv6.

::

    Ethernet        dst, src, type 0x86DD
    outer IPv6      src = sender's plane-port address, dst = micro-SID container of the path,
                    flow label = EV, ECN = ECT(0), next header 41 (IPv6), no SRH (one container)
    inner IPv6      src/dst = the two hosts' MRC addresses, next header 17
    UDP             sport 0xC000 | EV index, dport 4791, checksum 0 (integrity from the ICRC)
    MRC             BTH ... ICRC (packet.py)

Parsing accepts frames with or without the outer header, and an outer SRH (next header 43) is skipped.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

from .consts import IPV6_LEN, ROCEV2_UDP_PORT, UDP_LEN
from .errors import WireError

ETH_LEN: Final = 14
ETH_P_IPV6: Final = 0x86DD
NH_UDP: Final = 17
NH_IPV6: Final = 41
NH_ROUTING: Final = 43
ECN_NOT_ECT: Final = 0
ECN_ECT1: Final = 1
ECN_ECT0: Final = 2
ECN_CE: Final = 3
FLOW_LABEL_MASK: Final = 0xFFFFF

_IP6: Final = struct.Struct("!IHBB16s16s")
_UDP: Final = struct.Struct("!HHHH")
_ETH: Final = struct.Struct("!6s6sH")


def addr16(addr: str | bytes | ipaddress.IPv6Address) -> bytes:
    """An IPv6 address as 16 bytes, from text, bytes or ipaddress."""
    if isinstance(addr, bytes):
        if len(addr) != 16:
            raise ValueError(f"IPv6 address must be 16 bytes, got {len(addr)}")
        return addr
    return ipaddress.IPv6Address(addr).packed


def mac6(mac: str | bytes) -> bytes:
    if isinstance(mac, bytes):
        return mac
    b = bytes(int(x, 16) for x in mac.split(":"))
    if len(b) != 6:
        raise ValueError(f"bad MAC address {mac!r}")
    return b


@dataclass(slots=True, frozen=True)
class Ipv6Header:
    src: bytes
    dst: bytes
    traffic_class: int
    flow_label: int
    payload_len: int
    next_header: int
    hop_limit: int

    @property
    def ecn(self) -> int:
        return self.traffic_class & 3

    @property
    def src_str(self) -> str:
        return str(ipaddress.IPv6Address(self.src))

    @property
    def dst_str(self) -> str:
        return str(ipaddress.IPv6Address(self.dst))


def pack_ipv6(
    src: bytes, dst: bytes, payload_len: int, next_header: int, *, traffic_class: int = 0,
    flow_label: int = 0, hop_limit: int = 64,
) -> bytes:
    vtf = (6 << 28) | ((traffic_class & 0xFF) << 20) | (flow_label & FLOW_LABEL_MASK)
    return _IP6.pack(vtf, payload_len, next_header, hop_limit, src, dst)


def unpack_ipv6(buf: bytes | bytearray | memoryview, offset: int = 0) -> Ipv6Header:
    if len(buf) - offset < IPV6_LEN:
        raise WireError("truncated", "IPv6 header needs 40 bytes")
    vtf, plen, nh, hlim, src, dst = _IP6.unpack_from(buf, offset)
    if vtf >> 28 != 6:
        raise WireError("bad_ip", f"IP version {vtf >> 28}, expected 6")
    return Ipv6Header(src, dst, (vtf >> 20) & 0xFF, vtf & FLOW_LABEL_MASK, plen, nh, hlim)


def ipv6_udp(
    src: bytes, dst: bytes, sport: int, mrc: bytes | bytearray | memoryview, *,
    dport: int = ROCEV2_UDP_PORT, traffic_class: int = 0, flow_label: int = 0, hop_limit: int = 64,
) -> bytes:
    """The inner packet: IPv6 / UDP (checksum 0, as RoCEv2 senders do) / MRC bytes."""
    ulen = UDP_LEN + len(mrc)
    return (
        pack_ipv6(src, dst, ulen, NH_UDP, traffic_class=traffic_class, flow_label=flow_label,
                  hop_limit=hop_limit)
        + _UDP.pack(sport, dport, ulen, 0)
        + bytes(mrc)
    )


def encap(
    inner: bytes, outer_src: bytes, container: bytes, ev_index: int, *, ecn: int = ECN_ECT0,
    hop_limit: int = 64,
) -> bytes:
    """Outer IPv6 as the host egress program pushes it: dst = uSID container, flow label = EV, ECT(0)."""
    return pack_ipv6(outer_src, container, len(inner), NH_IPV6, traffic_class=ecn,
                     flow_label=ev_index, hop_limit=hop_limit) + inner


def ether(dst: str | bytes, src: str | bytes, packet: bytes) -> bytes:
    return _ETH.pack(mac6(dst), mac6(src), ETH_P_IPV6) + packet


@dataclass(slots=True, frozen=True)
class Frame:
    """An Ethernet frame carrying MRC, split into its envelopes. `mrc` is the UDP payload."""

    outer: Ipv6Header | None
    inner: Ipv6Header
    sport: int
    dport: int
    inner_offset: int
    mrc: memoryview


def check_tunnel_length(outer_payload: int, srh: int, inner_payload: int) -> None:
    """The outer header's payload length must be what it carries: `srh` bytes of routing header, then
    the inner packet (40 + its payload length). The outer header is no part of the ICRC, so a wrong one
    would pass unseen (Wireshark calls such a frame malformed and shows no MRC packet in it)."""
    want = srh + IPV6_LEN + inner_payload
    if outer_payload != want:
        raise WireError("bad_length", f"outer IPv6 payload length {outer_payload} != the {want} bytes "
                                      f"it carries (routing header {srh}, inner IPv6 {IPV6_LEN} + "
                                      f"{inner_payload})")


def split_ipv6(buf: bytes | bytearray | memoryview, offset: int = 0) -> Frame:
    """Walk [outer IPv6 [SRH]] inner IPv6 / UDP 4791 from `offset`; lengths are checked, not trusted."""
    mv = memoryview(buf)
    first = unpack_ipv6(mv, offset)
    outer: Ipv6Header | None = None
    inner = first
    pos = offset
    if first.next_header in (NH_IPV6, NH_ROUTING):
        outer = first
        if len(mv) - offset - IPV6_LEN < first.payload_len:
            raise WireError("truncated", "outer IPv6 payload length exceeds the frame")
        pos = offset + IPV6_LEN
        nh = first.next_header
        if nh == NH_ROUTING:
            if len(mv) - pos < 8:
                raise WireError("truncated", "SRH needs 8 bytes")
            nh, ext_len = mv[pos], mv[pos + 1]
            pos += 8 + 8 * ext_len
            if nh != NH_IPV6:
                raise WireError("bad_ip", f"SRH next header {nh}, expected 41 (IPv6)")
        inner = unpack_ipv6(mv, pos)
        check_tunnel_length(first.payload_len, pos - offset - IPV6_LEN, inner.payload_len)
    if inner.next_header != NH_UDP:
        raise WireError("bad_ip", f"inner next header {inner.next_header}, expected 17 (UDP)")
    udp_off = pos + IPV6_LEN
    if len(mv) - udp_off < inner.payload_len:
        raise WireError("truncated", "inner IPv6 payload length exceeds the frame")
    if inner.payload_len < UDP_LEN:
        raise WireError("bad_length", "inner IPv6 payload shorter than UDP")
    sport, dport, ulen, _ = _UDP.unpack_from(mv, udp_off)
    if dport != ROCEV2_UDP_PORT:
        raise WireError("bad_ip", f"UDP destination port {dport}, expected {ROCEV2_UDP_PORT}")
    if ulen != inner.payload_len:
        raise WireError("bad_length", f"UDP length {ulen} != IPv6 payload length {inner.payload_len}")
    return Frame(outer, inner, sport, dport, pos, mv[udp_off + UDP_LEN : udp_off + ulen])


def split_ether(frame: bytes | bytearray | memoryview) -> Frame:
    if len(frame) < ETH_LEN:
        raise WireError("truncated", "Ethernet header needs 14 bytes")
    (etype,) = struct.unpack_from("!H", frame, 12)
    if etype != ETH_P_IPV6:
        raise WireError("bad_ip", f"ethertype {etype:#06x}, expected 0x86dd")
    return split_ipv6(frame, ETH_LEN)
