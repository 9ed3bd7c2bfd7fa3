"""Bodies of the MRC control packets (BTH opcodes 0xC0-0xC4; big-endian). Each body follows MXH and
is followed by the ICRC. Reserved fields are sent as 0 and ignored on receive.

SACK (0xC0), selective acknowledgement. BTH.PSN = the PSN of the packet that triggered it::

    bytes 0-3    Cumulative PSN 24 bits (bits 31-24 reserved) lowest PSN not yet received: every PSN
                                before it (mod 2^24, within the window) has been placed
    bytes 4-5    Echo EV index  16 bits   EV index of the triggering packet
    byte 6       Echo flags     8 bits    SackFlag: ECN_CE 0x01, RETX 0x02, DUPLICATE 0x04
    byte 7       Bitmap words   8 bits    number of 64-bit bitmap words that follow, 1..16
    bytes 8-15   Echo timestamp 64 bits   MXH timestamp of the triggering packet (sender clock, ns)
    bytes 16-19  Service time   32 bits   ns the receiver held the triggering packet before this SACK
    bytes 20-    Bitmap         64*N bits bit i (byte i//8, bit i%8, least significant first) set when
                                          PSN (cumulative + 1 + i) mod 2^24 has been received

NACK (0xC1), negative acknowledgement. BTH.PSN = the PSN refused or trimmed::

    byte 0       Code           8 bits    NackCode: TRIMMED 1, OUT_OF_WINDOW 2, BAD_RKEY 3, BAD_VA 4,
                                          BAD_LENGTH 5, NO_RECV_BUFFER 6, BAD_QPN 7
    byte 1       Reserved       8 bits
    bytes 2-3    Echo EV index  16 bits   EV index the refused packet arrived on
    bytes 4-7    Cumulative PSN 24 bits   as in SACK (bits 31-24 reserved)
    bytes 8-15   Echo timestamp 64 bits   MXH timestamp of the refused packet

PROBE (0xC2), connectionless EV probe (sent on the probed EV: MXH EV index = the EV under test)::

    bytes 0-1    Request ID     16 bits   not reused while an earlier reply may still be in flight
    bytes 2-3    Reserved       16 bits
    bytes 4-7    Reply QPN      32 bits   QPN (24 bits used) the reply is addressed to (BTH.DestQP)

PROBE_REPLY (0xC3)::

    bytes 0-1    Request ID     16 bits   copied from the probe
    bytes 2-3    Echo EV index  16 bits   MXH EV index of the probe
    byte 4       Flags          8 bits    ProbeReplyFlag: SERVICE_TIME_VALID 0x01
    bytes 5-7    Reserved       24 bits
    bytes 8-15   Echo timestamp 64 bits   MXH timestamp of the probe
    bytes 16-19  Service time   32 bits   ns between probe arrival and reply

PORT_STATUS (0xC4), a host tells peers the state of one of its own plane ports::

    bytes 0-1    Request ID     16 bits
    byte 2       Port           8 bits    the sender's plane port (plane index)
    byte 3       State          8 bits    PortState: DOWN 0, UP 1
    bytes 4-7    Epoch          32 bits   increases with every change; older epochs are ignored
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from .consts import (
    NACK_LEN,
    PORT_STATUS_LEN,
    PROBE_LEN,
    PROBE_REPLY_LEN,
    PSN_MASK,
    QPN_MASK,
    SACK_FIXED_LEN,
    SACK_MAX_WORDS,
    NackCode,
    PortState,
)
from .errors import WireError

SACK_STRUCT: Final = struct.Struct("!IHBBQI")
NACK_STRUCT: Final = struct.Struct("!BxHIQ")
PROBE_STRUCT: Final = struct.Struct("!HxxI")
PROBE_REPLY_STRUCT: Final = struct.Struct("!HHBxxxQI")
PORT_STATUS_STRUCT: Final = struct.Struct("!HBBI")
assert SACK_STRUCT.size == SACK_FIXED_LEN
assert NACK_STRUCT.size == NACK_LEN
assert PROBE_STRUCT.size == PROBE_LEN
assert PROBE_REPLY_STRUCT.size == PROBE_REPLY_LEN
assert PORT_STATUS_STRUCT.size == PORT_STATUS_LEN

_NACK_CODES: Final = frozenset(int(c) for c in NackCode)
_PORT_STATES: Final = frozenset(int(s) for s in PortState)


@dataclass(slots=True, frozen=True)
class Sack:
    cum_psn: int
    echo_ev_index: int
    echo_flags: int
    echo_timestamp_ns: int
    service_time_ns: int
    #: received-bits as an integer: bit i <=> PSN (cum_psn + 1 + i) mod 2^24
    bitmap: int
    bitmap_bits: int

    def acked_psns(self) -> list[int]:
        """PSNs above the cumulative point that the bitmap reports received (for tests and tools)."""
        out = []
        bm, base = self.bitmap, self.cum_psn + 1
        while bm:
            low = bm & -bm
            out.append((base + low.bit_length() - 1) & PSN_MASK)
            bm ^= low
        return out


@dataclass(slots=True, frozen=True)
class Nack:
    code: int
    echo_ev_index: int
    cum_psn: int
    echo_timestamp_ns: int


@dataclass(slots=True, frozen=True)
class Probe:
    request_id: int
    reply_qpn: int


@dataclass(slots=True, frozen=True)
class ProbeReply:
    request_id: int
    echo_ev_index: int
    flags: int
    echo_timestamp_ns: int
    service_time_ns: int


@dataclass(slots=True, frozen=True)
class PortStatus:
    request_id: int
    port: int
    state: int
    epoch: int


ControlBody = Sack | Nack | Probe | ProbeReply | PortStatus


def sack_len(words: int) -> int:
    return SACK_FIXED_LEN + 8 * words


def pack_sack(
    buf: bytearray | memoryview,
    offset: int,
    cum_psn: int,
    echo_ev_index: int,
    echo_flags: int,
    echo_timestamp_ns: int,
    service_time_ns: int,
    bitmap: int,
    words: int,
) -> int:
    """Write a SACK body; returns its length. `bitmap` must fit in `words` x 64 bits."""
    if not 1 <= words <= SACK_MAX_WORDS:
        raise ValueError(f"SACK bitmap words must be 1..{SACK_MAX_WORDS}, got {words}")
    nbytes = 8 * words
    if bitmap < 0 or bitmap.bit_length() > 8 * nbytes:
        raise ValueError(f"SACK bitmap does not fit in {words} words")
    SACK_STRUCT.pack_into(
        buf, offset, cum_psn & PSN_MASK, echo_ev_index, echo_flags, words, echo_timestamp_ns,
        service_time_ns,
    )
    start = offset + SACK_FIXED_LEN
    buf[start : start + nbytes] = bitmap.to_bytes(nbytes, "little")
    return SACK_FIXED_LEN + nbytes


def unpack_sack(buf: bytes | bytearray | memoryview, offset: int, end: int) -> Sack:
    if end - offset < SACK_FIXED_LEN:
        raise WireError("truncated", "SACK body needs 20 bytes")
    cum, ev, flags, words, ts, svc = SACK_STRUCT.unpack_from(buf, offset)
    if not 1 <= words <= SACK_MAX_WORDS:
        raise WireError("bad_length", f"SACK bitmap words {words} not in 1..{SACK_MAX_WORDS}")
    if end - offset != sack_len(words):
        raise WireError("bad_length", f"SACK body is {end - offset} bytes, {sack_len(words)} expected")
    start = offset + SACK_FIXED_LEN
    bitmap = int.from_bytes(buf[start : start + 8 * words], "little")
    return Sack(cum & PSN_MASK, ev, flags, ts, svc, bitmap, 64 * words)


def pack_nack(
    buf: bytearray | memoryview, offset: int, code: int, echo_ev_index: int, cum_psn: int,
    echo_timestamp_ns: int,
) -> int:
    NACK_STRUCT.pack_into(buf, offset, code, echo_ev_index, cum_psn & PSN_MASK, echo_timestamp_ns)
    return NACK_LEN


def unpack_nack(buf: bytes | bytearray | memoryview, offset: int, end: int) -> Nack:
    if end - offset != NACK_LEN:
        raise WireError("truncated" if end - offset < NACK_LEN else "bad_length", "NACK body is 16 bytes")
    code, ev, cum, ts = NACK_STRUCT.unpack_from(buf, offset)
    if code not in _NACK_CODES:
        raise WireError("bad_field", f"unknown NACK code {code}")
    return Nack(code, ev, cum & PSN_MASK, ts)


def pack_probe(buf: bytearray | memoryview, offset: int, request_id: int, reply_qpn: int) -> int:
    PROBE_STRUCT.pack_into(buf, offset, request_id, reply_qpn & QPN_MASK)
    return PROBE_LEN


def unpack_probe(buf: bytes | bytearray | memoryview, offset: int, end: int) -> Probe:
    if end - offset != PROBE_LEN:
        raise WireError("truncated" if end - offset < PROBE_LEN else "bad_length", "PROBE body is 8 bytes")
    rid, qpn = PROBE_STRUCT.unpack_from(buf, offset)
    return Probe(rid, qpn & QPN_MASK)


def pack_probe_reply(
    buf: bytearray | memoryview, offset: int, request_id: int, echo_ev_index: int, flags: int,
    echo_timestamp_ns: int, service_time_ns: int,
) -> int:
    PROBE_REPLY_STRUCT.pack_into(
        buf, offset, request_id, echo_ev_index, flags, echo_timestamp_ns, service_time_ns
    )
    return PROBE_REPLY_LEN


def unpack_probe_reply(buf: bytes | bytearray | memoryview, offset: int, end: int) -> ProbeReply:
    if end - offset != PROBE_REPLY_LEN:
        raise WireError(
            "truncated" if end - offset < PROBE_REPLY_LEN else "bad_length", "PROBE_REPLY body is 20 bytes"
        )
    return ProbeReply(*PROBE_REPLY_STRUCT.unpack_from(buf, offset))


def pack_port_status(
    buf: bytearray | memoryview, offset: int, request_id: int, port: int, state: int, epoch: int
) -> int:
    PORT_STATUS_STRUCT.pack_into(buf, offset, request_id, port, state, epoch)
    return PORT_STATUS_LEN


def unpack_port_status(buf: bytes | bytearray | memoryview, offset: int, end: int) -> PortStatus:
    if end - offset != PORT_STATUS_LEN:
        raise WireError(
            "truncated" if end - offset < PORT_STATUS_LEN else "bad_length", "PORT_STATUS body is 8 bytes"
        )
    rid, port, state, epoch = PORT_STATUS_STRUCT.unpack_from(buf, offset)
    if state not in _PORT_STATES:
        raise WireError("bad_field", f"unknown port state {state}")
    return PortStatus(rid, port, state, epoch)
