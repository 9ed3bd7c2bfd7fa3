"""Reading MRC packets out of real captures: either file format, several link types, snaplen cuts.

`read_capture` opens a classic pcap or a pcapng file (chosen by the magic number, whatever the file is
called). `split_captured` finds the IPv6 envelope behind the link layer of each record and
`parse_captured` the MRC packet inside it. What real captures add to the frames `mrcctl wire sample`
writes, and why each is handled here rather than rejected:

* Link types other than Ethernet: `tcpdump -i any` / `tshark -i any` write Linux cooked headers
  (LINKTYPE_LINUX_SLL 113, SLL2 276), tunnels and some NICs raw IP (LINKTYPE_RAW 101, LINKTYPE_IPV6
  229); fabrics with PFC often carry 802.1Q priority tags (one or two VLAN tags are skipped).
* Snaplen cuts (`editcap -s 200`, `tcpdump -s 200`, dumpcap's `-s`): a record keeps only the first
  bytes of a 4 KiB WRITE. The headers are all there and are decoded; lengths (IPv6, UDP, MRC payload)
  are checked against the packet's length on the wire, which the record keeps, not against the
  bytes captured; the ICRC cannot be checked and is reported as "truncated", not as bad. A cut
  inside the headers themselves is still a `truncated` rejection, naming how much was captured.

`mrc.wire.ip.split_ipv6` and `mrc.wire.parse` keep their strictness (they serve the data path, where a
short packet is a damaged one); the envelope walk below mirrors `split_ipv6`'s checks with the two
lengths kept apart.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

from . import control as ctl
from .bth import unpack_bth
from .consts import (
    BTH_LEN,
    DATA_OPCODES,
    ICRC_LEN,
    IPV6_LEN,
    ROCEV2_UDP_PORT,
    SACK_MAX_WORDS,
    UDP_LEN,
    MxhFlag,
)
from .errors import WireError
from .icrc import IcrcContext
from .ip import (
    ETH_LEN,
    ETH_P_IPV6,
    NH_IPV6,
    NH_ROUTING,
    NH_UDP,
    Frame,
    Ipv6Header,
    check_tunnel_length,
    split_ipv6,
    unpack_ipv6,
)
from .mxh import unpack_mxh
from .packet import MrcPacket, header_len, parse
from .pcap import MAGIC_NSEC, MAGIC_USEC, PCAPNG_MAGIC, PcapError, Record, StrPath, read_pcap_records
from .pcapng import read_pcapng

LINKTYPE_ETHERNET: Final = 1
LINKTYPE_RAW: Final = 101
LINKTYPE_LINUX_SLL: Final = 113
LINKTYPE_IPV6: Final = 229
LINKTYPE_LINUX_SLL2: Final = 276
#: Link types whose IPv6 packets `split_captured` finds.
LINKTYPES: Final[dict[int, str]] = {
    LINKTYPE_ETHERNET: "Ethernet",
    LINKTYPE_RAW: "raw IP",
    LINKTYPE_LINUX_SLL: "Linux cooked (SLL)",
    LINKTYPE_IPV6: "raw IPv6",
    LINKTYPE_LINUX_SLL2: "Linux cooked v2 (SLL2)",
}
ETH_P_8021Q: Final = 0x8100
ETH_P_8021AD: Final = 0x88A8
#: VLAN tags skipped in front of the IPv6 ethertype (802.1Q priority tag, or QinQ).
MAX_VLAN_TAGS: Final = 2
SLL_LEN: Final = 16
SLL2_LEN: Final = 20
#: Largest control body (a SACK with the most bitmap words), as `mrc.wire.parse` bounds it.
MAX_CTRL_BODY: Final = ctl.sack_len(SACK_MAX_WORDS)

#: ICRC outcome of a captured packet: `parse`'s, or "truncated" when the capture did not keep it.
CaptureIcrc = Literal["ok", "bad", "ignored", "unchecked", "truncated"]


def read_capture(path: StrPath) -> Iterator[Record]:
    """Every packet of a classic pcap or pcapng file, as `Record`s (time, bytes, on-the-wire length,
    link type, interface). Raises `PcapError` naming the file and offset for a file that is neither,
    or is broken; records before the damage are yielded first."""
    name = str(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 -- closed in the finally below; a generator owns it
    except OSError as e:
        raise PcapError(f"{name}: cannot open: {e.strerror or e}") from e
    try:
        try:
            head = f.read(4)
            f.seek(0)
        except OSError as e:
            raise PcapError(f"{name}: read error: {e.strerror or e}") from e
        if len(head) == 4 and struct.unpack("<I", head)[0] == PCAPNG_MAGIC:
            yield from read_pcapng(path, f)
        elif len(head) == 4 and (
            struct.unpack("<I", head)[0] in (MAGIC_USEC, MAGIC_NSEC)
            or struct.unpack(">I", head)[0] in (MAGIC_USEC, MAGIC_NSEC)
        ):
            yield from read_pcap_records(path, f)
        elif not head:
            raise PcapError(f"{name}: offset 0: empty file, not a pcap or pcapng file")
        else:
            raise PcapError(f"{name}: offset 0: not a pcap or pcapng file (magic {head.hex()})")
    finally:
        f.close()


@dataclass(frozen=True, slots=True)
class Captured:
    """The envelope of one captured MRC frame. `frame.mrc` holds the MRC bytes the capture kept;
    `mrc_len` is the MRC packet's length on the wire (UDP length - 8); `truncated` when they differ."""

    frame: Frame
    mrc_len: int
    wire_len: int
    captured_len: int

    @property
    def truncated(self) -> bool:
        return self.captured_len < self.wire_len


def _cut(captured: int, wire: int, end: int, what: str) -> WireError:
    return WireError("truncated", f"the capture kept {captured} of {wire} bytes, too few for {what} ({end})")


def network_offset(linktype: int, data: bytes | memoryview) -> int:
    """Offset of the IPv6 header behind the link-layer header of a record of `linktype`; WireError
    (bad_ip) for a link type or protocol that is not IPv6, (truncated) for a cut link header."""
    n = len(data)
    if linktype == LINKTYPE_ETHERNET:
        pos = ETH_LEN - 2
        for _ in range(MAX_VLAN_TAGS + 1):
            if n < pos + 2:
                raise WireError("truncated", f"Ethernet header needs {pos + 2} bytes, {n} captured")
            (etype,) = struct.unpack_from("!H", data, pos)
            if etype not in (ETH_P_8021Q, ETH_P_8021AD):
                break
            pos += 4
        else:
            raise WireError("bad_ip", f"more than {MAX_VLAN_TAGS} VLAN tags")
        if etype != ETH_P_IPV6:
            raise WireError("bad_ip", f"ethertype {etype:#06x}, expected 0x86dd")
        return pos + 2
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV6):
        return 0  # unpack_ipv6 rejects an IPv4 packet by its version nibble
    if linktype in (LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2):
        hlen, proto_at = (SLL_LEN, 14) if linktype == LINKTYPE_LINUX_SLL else (SLL2_LEN, 0)
        if n < hlen:
            raise WireError("truncated", f"Linux cooked header needs {hlen} bytes, {n} captured")
        (proto,) = struct.unpack_from("!H", data, proto_at)
        if proto != ETH_P_IPV6:
            raise WireError("bad_ip", f"protocol {proto:#06x}, expected 0x86dd")
        return hlen
    raise WireError("bad_ip", f"link type {linktype} is not decoded (decoded: "
                    + ", ".join(f"{v} {k}" for k, v in LINKTYPES.items()) + ")")


def split_captured(rec: Record) -> Captured:
    """The IPv6/UDP envelope of `rec` (outer IPv6 and SRH optional, as `split_ipv6`). Lengths are
    checked against the record's on-the-wire length; only the headers must have been captured."""
    data = memoryview(rec.data)
    cap = len(data)
    wire = max(rec.orig_len, cap)
    off = network_offset(rec.linktype, data)
    if wire == cap:  # the whole frame: exactly the data path's checks
        f = split_ipv6(data, off)
        return Captured(f, len(f.mrc), wire, cap)
    if cap < off + IPV6_LEN:
        raise _cut(cap, wire, off + IPV6_LEN, "the IPv6 header")
    first = unpack_ipv6(data, off)
    outer: Ipv6Header | None = None
    inner = first
    pos = off
    if first.next_header in (NH_IPV6, NH_ROUTING):
        outer = first
        if wire - off - IPV6_LEN < first.payload_len:
            raise WireError("truncated", "outer IPv6 payload length exceeds the frame")
        pos = off + IPV6_LEN
        nh = first.next_header
        if nh == NH_ROUTING:
            if cap < pos + 8:
                raise _cut(cap, wire, pos + 8, "the SRH")
            nh, ext_len = data[pos], data[pos + 1]
            pos += 8 + 8 * ext_len
            if nh != NH_IPV6:
                raise WireError("bad_ip", f"SRH next header {nh}, expected 41 (IPv6)")
        if cap < pos + IPV6_LEN:
            raise _cut(cap, wire, pos + IPV6_LEN, "the inner IPv6 header")
        inner = unpack_ipv6(data, pos)
        check_tunnel_length(first.payload_len, pos - off - IPV6_LEN, inner.payload_len)
    if inner.next_header != NH_UDP:
        raise WireError("bad_ip", f"inner next header {inner.next_header}, expected 17 (UDP)")
    udp_off = pos + IPV6_LEN
    if wire - udp_off < inner.payload_len:
        raise WireError("truncated", "inner IPv6 payload length exceeds the frame")
    if inner.payload_len < UDP_LEN:
        raise WireError("bad_length", "inner IPv6 payload shorter than UDP")
    if cap < udp_off + UDP_LEN:
        raise _cut(cap, wire, udp_off + UDP_LEN, "the UDP header")
    sport, dport, ulen, _ = struct.unpack_from("!HHHH", data, udp_off)
    if dport != ROCEV2_UDP_PORT:
        raise WireError("bad_ip", f"UDP destination port {dport}, expected {ROCEV2_UDP_PORT}")
    if ulen != inner.payload_len:
        raise WireError("bad_length", f"UDP length {ulen} != IPv6 payload length {inner.payload_len}")
    mrc_off = udp_off + UDP_LEN
    mrc = data[mrc_off : min(udp_off + ulen, cap)]
    # A cut after the end of the UDP payload (Ethernet padding, a trailer) leaves the packet whole.
    return Captured(Frame(outer, inner, sport, dport, pos, mrc), ulen - UDP_LEN, wire,
                    cap if cap < udp_off + ulen else wire)


def parse_captured(c: Captured, *, icrc: bool = True) -> tuple[MrcPacket, CaptureIcrc]:
    """Parse the MRC packet of `c`; returns it with its ICRC outcome (checked against the inner IPv6
    addresses and the UDP source port when `icrc`, never raising for a bad one).

    A whole packet goes through `mrc.wire.parse`. A cut one is parsed from its headers, every length
    check made against its on-the-wire length: a data packet as `parse` does (the missing bytes stand
    in as zeros for the checks only: the returned `payload` is the captured part of the payload, and
    `dma_len` its length on the wire); a control packet whose body was cut has `body` None. Its
    ICRC outcome is "truncated". WireError as `parse`, or (truncated) when the cut is in the headers."""
    f = c.frame
    mv = f.mrc
    ctx = IcrcContext(f.inner.src, f.inner.dst) if icrc else None
    if not c.truncated:
        pkt = parse(mv, ctx, sport=f.sport, verify=False)
        return pkt, pkt.icrc
    n_cap, n = len(mv), c.mrc_len
    if n_cap < BTH_LEN:
        raise _cut(n_cap, n, BTH_LEN, "BTH")
    op = mv[0]
    hl = header_len(op)  # bad_opcode for what is not MRC
    if n_cap < hl:
        raise _cut(n_cap, n, hl, "the MRC headers")
    if op in DATA_OPCODES or n_cap >= n - ICRC_LEN:
        # n < 2^16 (the UDP length field): the stand-in is small.
        pkt = parse(bytes(mv) + bytes(n - n_cap), None)
        if op in DATA_OPCODES:
            pkt.payload = mv[hl : hl + min(pkt.dma_len, max(0, n_cap - hl))]
        return pkt, "truncated"
    # A control packet cut inside its body: the headers, checked as `parse` checks them.
    bth = unpack_bth(mv)
    mxh = unpack_mxh(mv, BTH_LEN)
    if mxh.flags & MxhFlag.TRIMMED:
        raise WireError("bad_field", "TRIMMED set on a control packet")
    if bth.pad:
        raise WireError("bad_field", "PadCnt set on a control packet")
    body_len = n - hl - ICRC_LEN
    if body_len > MAX_CTRL_BODY:
        raise WireError("bad_length", f"control body of {body_len} bytes > {MAX_CTRL_BODY}")
    pkt = MrcPacket(
        op, bth.pad, bth.pkey, bth.fecn, bth.becn, bth.dqpn, bth.ackreq, bth.psn, 0, 0, 0, None,
        mxh.flags, mxh.ev_index, mxh.msn, mxh.msg_len, mxh.msg_offset, mxh.timestamp_ns, mv[hl:hl], None,
        "unchecked", n,
    )
    return pkt, "truncated"
