"""InfiniBand transport headers MRC keeps unchanged: BTH, RETH and ImmDt (big-endian, as in IBTA).

BTH, Base Transport Header (12 bytes)::

    byte 0      OpCode         8 bits   0x0A RDMA WRITE Only, 0x0B ... with Immediate, 0xC0-0xC4 MRC control
    byte 1      SE             1 bit    solicited event (0 in MRC)
                M              1 bit    migration request (0)
                PadCnt         2 bits   bytes of zero padding after the payload, to a 4-byte multiple
                TVer           4 bits   transport header version, 0
    bytes 2-3   P_Key          16 bits  partition key, 0xFFFF (default partition, full member)
    byte 4      FECN           1 bit    forward ECN (invariant-masked: switches may set it)
                BECN           1 bit    backward ECN (invariant-masked)
                Resv6          6 bits   0
    bytes 5-7   DestQP         24 bits  destination queue pair number
    byte 8      AckReq         1 bit    requester asks for an acknowledgement of this packet
                Resv7          7 bits   0
    bytes 9-11  PSN            24 bits  packet sequence number, wraps at 2^24

RETH, RDMA Extended Transport Header (16 bytes), on EVERY MRC data packet (not only the first, as in
RC): each packet carries its own placement, so packets that arrive out of order are placed directly::

    bytes 0-7   VA             64 bits  remote virtual address of THIS packet's first payload byte
    bytes 8-11  R_Key          32 bits  remote key of the target memory region
    bytes 12-15 DMA Length     32 bits  payload bytes in THIS packet (padding excluded)

ImmDt, Immediate Data (4 bytes), on a WRITE-with-immediate (opcode 0x0B) only, right after RETH, as
in InfiniBand. Its value is delivered in the responder's completion when the whole message is placed.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from .consts import BTH_LEN, DEFAULT_PKEY, IMMDT_LEN, PSN_MASK, QPN_MASK, RETH_LEN
from .errors import WireError

#: opcode, SE|M|PadCnt|TVer, P_Key, FECN|BECN|Resv6 + DestQP (as one u32), AckReq|Resv7 + PSN (one u32)
BTH_STRUCT: Final = struct.Struct("!BBHII")
RETH_STRUCT: Final = struct.Struct("!QII")
IMMDT_STRUCT: Final = struct.Struct("!I")
assert BTH_STRUCT.size == BTH_LEN and RETH_STRUCT.size == RETH_LEN and IMMDT_STRUCT.size == IMMDT_LEN

FECN_BIT: Final = 0x80000000
BECN_BIT: Final = 0x40000000
ACKREQ_BIT: Final = 0x80000000


class Bth(NamedTuple):
    opcode: int
    pad: int
    pkey: int
    fecn: bool
    becn: bool
    dqpn: int
    ackreq: bool
    psn: int


def pack_bth(
    buf: bytearray | memoryview,
    offset: int,
    opcode: int,
    dqpn: int,
    psn: int,
    *,
    ackreq: bool = False,
    pad: int = 0,
    pkey: int = DEFAULT_PKEY,
    fecn: bool = False,
    becn: bool = False,
) -> None:
    """Write a BTH at `offset`. PSN and QPN are masked to 24 bits (PSNs wrap by design)."""
    BTH_STRUCT.pack_into(
        buf,
        offset,
        opcode,
        (pad & 3) << 4,
        pkey,
        (FECN_BIT if fecn else 0) | (BECN_BIT if becn else 0) | (dqpn & QPN_MASK),
        (ACKREQ_BIT if ackreq else 0) | (psn & PSN_MASK),
    )


def unpack_bth(buf: bytes | bytearray | memoryview, offset: int = 0) -> Bth:
    """Read a BTH at `offset`; raises WireError(truncated / bad_field)."""
    if len(buf) - offset < BTH_LEN:
        raise WireError("truncated", "BTH needs 12 bytes")
    opcode, b1, pkey, qw, pw = BTH_STRUCT.unpack_from(buf, offset)
    if b1 & 0x0F:
        raise WireError("bad_field", f"BTH TVer {b1 & 0x0F} != 0")
    return Bth(
        opcode,
        (b1 >> 4) & 3,
        pkey,
        bool(qw & FECN_BIT),
        bool(qw & BECN_BIT),
        qw & QPN_MASK,
        bool(pw & ACKREQ_BIT),
        pw & PSN_MASK,
    )
