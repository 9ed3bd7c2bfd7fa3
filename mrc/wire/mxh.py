"""MXH, the MRC extension header (ours; 24 bytes, big-endian). It follows RETH/ImmDt on data packets
and BTH directly on control packets, so every MRC packet carries one and the host egress program
finds the EV index at a fixed offset per opcode::

    byte 0       Version        8 bits   MXH version, 1. Anything else: WireError("bad_version")
    byte 1       Flags          8 bits   MxhFlag: TRIMMED 0x01, RETX 0x02, FIRST 0x04, LAST 0x08,
                                         ACK_REQ_NOW 0x10, PRIO 0x20; 0xC0 reserved:
                                         sent as 0, ignored on receive
    bytes 2-3    EV index       16 bits  index of the entropy value in the sender's EV profile that this
                                         packet was sprayed on (< 2^14: it is also UDP sport & 0x3FFF)
    bytes 4-7    MSN            32 bits  message sequence number (per QP, wraps at 2^32)
    bytes 8-11   Message length 32 bits  bytes in the whole message this packet belongs to
    bytes 12-15  Message offset 32 bits  offset of this packet's payload in its message (bytes)
    bytes 16-23  Timestamp      64 bits  sender's clock when the packet was sent, in ns; echoed in
                                         SACK/NACK/PROBE_REPLY for RTT samples

On control packets MSN, message length and offset are 0, and EV index / timestamp describe the
control packet itself (the EV it travels on, its send time).

A switch that trims a data packet cuts it right after MXH and sets TRIMMED (and PRIO); the ICRC of a
trimmed packet is gone and is never checked. RETH's DMA length still says how much was lost.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from .consts import MXH_LEN, MXH_VERSION
from .errors import WireError

MXH_STRUCT: Final = struct.Struct("!BBHIIIQ")
assert MXH_STRUCT.size == MXH_LEN

#: Offset of the flags byte inside MXH, for in-place trimming (switches, tests).
MXH_FLAGS_OFFSET: Final = 1


class Mxh(NamedTuple):
    version: int
    flags: int
    ev_index: int
    msn: int
    msg_len: int
    msg_offset: int
    timestamp_ns: int


def pack_mxh(
    buf: bytearray | memoryview,
    offset: int,
    flags: int,
    ev_index: int,
    msn: int = 0,
    msg_len: int = 0,
    msg_offset: int = 0,
    timestamp_ns: int = 0,
) -> None:
    MXH_STRUCT.pack_into(
        buf, offset, MXH_VERSION, flags, ev_index, msn, msg_len, msg_offset, timestamp_ns
    )


def unpack_mxh(buf: bytes | bytearray | memoryview, offset: int = 0) -> Mxh:
    if len(buf) - offset < MXH_LEN:
        raise WireError("truncated", "MXH needs 24 bytes")
    m = Mxh(*MXH_STRUCT.unpack_from(buf, offset))
    check_version(m.version)
    return m


def check_version(version: int) -> None:
    if version != MXH_VERSION:
        raise WireError("bad_version", f"MXH version {version}, expected {MXH_VERSION}")
