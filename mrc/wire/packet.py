"""Whole MRC packets as the UDP payload a socket sends: build into preallocated buffers, parse from
any bytes-like object.

Layouts (see bth.py, mxh.py, control.py for every field)::

    RDMA WRITE Only (0x0A)            BTH | RETH | MXH | payload | pad | ICRC      52 B + payload + 4
    RDMA WRITE Only w/ Immediate (0x0B) BTH | RETH | ImmDt | MXH | payload | pad | ICRC  56 B + ...
    control (0xC0-0xC4)               BTH | MXH | body | ICRC                      36 B + body + 4
    trimmed data packet               BTH | RETH | [ImmDt] | MXH (TRIMMED set)     nothing after MXH

`build_*` write headers with one `struct.pack_into` each, copy the payload once and append the ICRC;
they return the packet length. `parse` unpacks the fixed headers with one precompiled Struct per
opcode and returns one `MrcPacket` whose payload is a zero-copy memoryview into the input. Every
failure is a `WireError` with a reason from `errors.REASONS`; nothing else escapes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from . import control as ctl
from .bth import ACKREQ_BIT, BECN_BIT, FECN_BIT
from .consts import (
    BTH_LEN,
    DATA_OPCODES,
    DEFAULT_PKEY,
    EV_INDEX_MAX,
    EV_SPORT_BASE,
    ICRC_LEN,
    IPV6_LEN,
    MAX_PAYLOAD,
    MIN_PAYLOAD,
    MXH_LEN,
    MXH_VERSION,
    PKEY_PARTITION,
    PSN_MASK,
    QPN_MASK,
    SACK_MAX_WORDS,
    UDP_LEN,
    MxhFlag,
    Opcode,
)
from .control import ControlBody
from .crc import crc32
from .errors import WireError
from .icrc import _ICRC, CRC32_RESIDUE, IcrcContext, ev_sport
from .mxh import MXH_FLAGS_OFFSET

Buffer = bytes | bytearray | memoryview
WBuffer = bytearray | memoryview
IcrcStatus = Literal["ok", "bad", "ignored", "unchecked"]

# Fixed headers per packet shape, as single Structs (fewer calls on the hot path).
_WRITE: Final = struct.Struct("!BBHII" "QII" "BBHIIIQ")
_WRITE_IMM: Final = struct.Struct("!BBHII" "QII" "I" "BBHIIIQ")
_CTRL: Final = struct.Struct("!BBHII" "BBHIIIQ")
WRITE_HDR_LEN: Final = _WRITE.size  # 52
WRITE_IMM_HDR_LEN: Final = _WRITE_IMM.size  # 56
CTRL_HDR_LEN: Final = _CTRL.size  # 36
assert CTRL_HDR_LEN == BTH_LEN + MXH_LEN

#: What a link carries around one packet's payload, at most: the outer IPv6 header of the SRv6
#: encapsulation (H.Encaps.Red with the micro-SID carrier in the destination address, no SRH), the inner
#: IPv6 and UDP headers, the longest data header (WRITE with immediate) and the ICRC.
LINK_OVERHEAD: Final = IPV6_LEN + IPV6_LEN + UDP_LEN + WRITE_IMM_HDR_LEN + ICRC_LEN  # 148


def payload_for_mtu(link_mtu: int) -> int:
    """The largest payload per packet that a link of `link_mtu` bytes carries whole, encapsulation
    included: a power of two in MIN_PAYLOAD..MAX_PAYLOAD (1500 -> 1024, 9000 -> 8192; 4096 needs 4244).
    The QP's `mtu` on a fabric whose links all have this MTU; a link below 404 bytes carries no payload
    size of the format, which is a ValueError."""
    room = link_mtu - LINK_OVERHEAD
    if room < MIN_PAYLOAD:
        raise ValueError(f"an MTU of {link_mtu} bytes leaves {room} for the payload; the smallest "
                         f"payload is {MIN_PAYLOAD} (an MTU of at least {MIN_PAYLOAD + LINK_OVERHEAD})")
    return min(MAX_PAYLOAD, 1 << (room.bit_length() - 1))

_TRIM_FLAGS: Final = int(MxhFlag.TRIMMED | MxhFlag.PRIO)
_TRIMMED: Final = int(MxhFlag.TRIMMED)
_ZERO4: Final = b"\x00\x00\x00\x00"
_ZERO8: Final = bytes(8)
#: Plain ints for the hot paths: comparing with an IntEnum member costs a class attribute lookup.
_OP_WRITE: Final = int(Opcode.RDMA_WRITE_ONLY)
_OP_WRITE_IMM: Final = int(Opcode.RDMA_WRITE_ONLY_IMM)
#: Largest control body (a SACK with the most bitmap words). Checked before the ICRC so that a huge
#: buffer is rejected by length, not by the CRC (whose UDP length field could not even hold it).
_MAX_CTRL_BODY: Final = ctl.sack_len(SACK_MAX_WORDS)

OPCODE_NAMES: Final[dict[int, str]] = {
    Opcode.RDMA_WRITE_ONLY: "WRITE",
    Opcode.RDMA_WRITE_ONLY_IMM: "WRITE_IMM",
    Opcode.SACK: "SACK",
    Opcode.NACK: "NACK",
    Opcode.PROBE: "PROBE",
    Opcode.PROBE_REPLY: "PROBE_REPLY",
    Opcode.PORT_STATUS: "PORT_STATUS",
}

_BODY_PARSERS: Final[dict[int, Callable[[Buffer, int, int], ControlBody]]] = {
    Opcode.SACK: ctl.unpack_sack,
    Opcode.NACK: ctl.unpack_nack,
    Opcode.PROBE: ctl.unpack_probe,
    Opcode.PROBE_REPLY: ctl.unpack_probe_reply,
    Opcode.PORT_STATUS: ctl.unpack_port_status,
}


def header_len(opcode: int) -> int:
    """Bytes from BTH to the end of MXH for `opcode` (where the payload or body starts)."""
    if opcode == Opcode.RDMA_WRITE_ONLY:
        return WRITE_HDR_LEN
    if opcode == Opcode.RDMA_WRITE_ONLY_IMM:
        return WRITE_IMM_HDR_LEN
    if opcode in _BODY_PARSERS:
        return CTRL_HDR_LEN
    raise WireError("bad_opcode", f"opcode {opcode:#04x} is not an MRC opcode")


@dataclass(slots=True)
class MrcPacket:
    """One parsed MRC packet. RETH/ImmDt fields are 0/None on control packets; `body` is None on data."""

    opcode: int
    pad: int
    pkey: int
    fecn: bool
    becn: bool
    dqpn: int
    ackreq: bool
    psn: int
    va: int
    rkey: int
    dma_len: int
    imm: int | None
    flags: int
    ev_index: int
    msn: int
    msg_len: int
    msg_offset: int
    timestamp_ns: int
    payload: memoryview
    body: ControlBody | None
    icrc: IcrcStatus
    length: int

    @property
    def trimmed(self) -> bool:
        return bool(self.flags & _TRIMMED)

    @property
    def is_data(self) -> bool:
        return self.opcode in DATA_OPCODES

    @property
    def opcode_name(self) -> str:
        return OPCODE_NAMES.get(self.opcode) or f"{self.opcode:#04x}"


# --------------------------------------------------------------------------------------------- build


def build_write(
    buf: WBuffer,
    ctx: IcrcContext,
    *,
    dqpn: int,
    psn: int,
    ev_index: int,
    va: int,
    rkey: int,
    payload: Buffer,
    msn: int = 0,
    msg_len: int | None = None,
    msg_offset: int = 0,
    timestamp_ns: int = 0,
    flags: int = 0,
    ackreq: bool = False,
    imm: int | None = None,
    sport: int | None = None,
) -> int:
    """Write an RDMA WRITE Only (or, with `imm`, WRITE Only with Immediate) packet into `buf`.

    Returns the packet length. `buf` must hold header + payload + pad + 4 bytes. `sport` defaults to
    the fabric source port of `ev_index` (what the host egress program writes)."""
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise ValueError(f"payload of {n} bytes exceeds MAX_PAYLOAD {MAX_PAYLOAD}")
    pad = -n & 3
    if msg_len is None:
        msg_len = msg_offset + n
    w0 = (ACKREQ_BIT if ackreq else 0) | (psn & PSN_MASK)
    if imm is None:
        hl = WRITE_HDR_LEN
        _WRITE.pack_into(
            buf, 0, _OP_WRITE, pad << 4, DEFAULT_PKEY, dqpn & QPN_MASK, w0, va, rkey, n,
            MXH_VERSION, flags, ev_index, msn, msg_len, msg_offset, timestamp_ns,
        )
    else:
        hl = WRITE_IMM_HDR_LEN
        _WRITE_IMM.pack_into(
            buf, 0, _OP_WRITE_IMM, pad << 4, DEFAULT_PKEY, dqpn & QPN_MASK, w0, va, rkey, n,
            imm & 0xFFFFFFFF, MXH_VERSION, flags, ev_index, msn, msg_len, msg_offset, timestamp_ns,
        )
    end = hl + n
    buf[hl:end] = payload
    if pad:
        buf[end : end + pad] = _ZERO4[:pad]
        end += pad
    # ctx.write(), inlined, with the first BTH word as just packed (its CRC is cached with the envelope's)
    _ICRC.pack_into(
        buf, end, ctx.compute_w0(
            buf if isinstance(buf, memoryview) else memoryview(buf), end,
            EV_SPORT_BASE | (ev_index & EV_INDEX_MAX) if sport is None else sport,
            ((_OP_WRITE if imm is None else _OP_WRITE_IMM) << 24) | (pad << 20) | DEFAULT_PKEY,
        )
    )
    return end + ICRC_LEN


def write_packet(
    ctx: IcrcContext,
    dqpn: int,
    psn: int,
    ev_index: int,
    va: int,
    rkey: int,
    payload: Buffer,
    msn: int,
    msg_len: int,
    msg_offset: int,
    timestamp_ns: int,
    flags: int,
    ackreq: bool,
    imm: int | None,
) -> bytearray:
    """`build_write` into a new bytearray of exactly the packet's length, with positional arguments (the
    engine's transmit path): the same bytes, the ICRC with the EV's fabric source port. The buffer is
    assembled by one join of header, payload and pad + ICRC room (no zero-fill of the payload part)."""
    n = len(payload)
    if n > MAX_PAYLOAD:
        raise ValueError(f"payload of {n} bytes exceeds MAX_PAYLOAD {MAX_PAYLOAD}")
    pad = -n & 3
    w0 = (ACKREQ_BIT if ackreq else 0) | (psn & PSN_MASK)
    if imm is None:
        hdr = _WRITE.pack(
            _OP_WRITE, pad << 4, DEFAULT_PKEY, dqpn & QPN_MASK, w0, va, rkey, n,
            MXH_VERSION, flags, ev_index, msn, msg_len, msg_offset, timestamp_ns,
        )
    else:
        hdr = _WRITE_IMM.pack(
            _OP_WRITE_IMM, pad << 4, DEFAULT_PKEY, dqpn & QPN_MASK, w0, va, rkey, n,
            imm & 0xFFFFFFFF, MXH_VERSION, flags, ev_index, msn, msg_len, msg_offset, timestamp_ns,
        )
    end = len(hdr) + n + pad  # the ICRC's offset
    sport = EV_SPORT_BASE | (ev_index & EV_INDEX_MAX)
    # The ICRC: BTH byte 4 is zero (dqpn is masked to 24 bits), so it is a crc32 from the context's start
    # value over the header and payload as they are (ctx.start, inlined on a hit of its cache)
    v = ctx._start.get((sport << 32) | end)
    crc = crc32(payload, crc32(hdr, ctx.start(end, sport) if v is None else v))
    if pad:
        crc = crc32(_ZERO4[:pad], crc)
    buf = bytearray().join((hdr, payload, _ZERO8[: pad + ICRC_LEN]))
    _ICRC.pack_into(buf, end, crc)
    return buf


def _control(
    buf: WBuffer,
    ctx: IcrcContext,
    opcode: int,
    dqpn: int,
    psn: int,
    ev_index: int,
    timestamp_ns: int,
    body_len: int,
    sport: int | None,
) -> int:
    _CTRL.pack_into(
        buf, 0, opcode, 0, DEFAULT_PKEY, dqpn & QPN_MASK, psn & PSN_MASK,
        MXH_VERSION, 0, ev_index, 0, 0, 0, timestamp_ns,
    )
    return ctx.write(buf, CTRL_HDR_LEN + body_len, ev_sport(ev_index) if sport is None else sport)


def build_sack(
    buf: WBuffer,
    ctx: IcrcContext,
    *,
    dqpn: int,
    psn: int,
    ev_index: int,
    cum_psn: int,
    echo_ev_index: int,
    echo_timestamp_ns: int,
    bitmap: int = 0,
    words: int = 1,
    echo_flags: int = 0,
    service_time_ns: int = 0,
    timestamp_ns: int = 0,
    sport: int | None = None,
) -> int:
    """SACK: `psn` is the PSN that triggered it; bit i of `bitmap` <=> PSN cum_psn + 1 + i received."""
    blen = ctl.pack_sack(
        buf, CTRL_HDR_LEN, cum_psn, echo_ev_index, echo_flags, echo_timestamp_ns, service_time_ns,
        bitmap, words,
    )
    return _control(buf, ctx, Opcode.SACK, dqpn, psn, ev_index, timestamp_ns, blen, sport)


def build_nack(
    buf: WBuffer,
    ctx: IcrcContext,
    *,
    dqpn: int,
    psn: int,
    ev_index: int,
    code: int,
    echo_ev_index: int,
    cum_psn: int,
    echo_timestamp_ns: int = 0,
    timestamp_ns: int = 0,
    sport: int | None = None,
) -> int:
    """NACK of `psn` with `code` (NackCode)."""
    blen = ctl.pack_nack(buf, CTRL_HDR_LEN, code, echo_ev_index, cum_psn, echo_timestamp_ns)
    return _control(buf, ctx, Opcode.NACK, dqpn, psn, ev_index, timestamp_ns, blen, sport)


def build_probe(
    buf: WBuffer,
    ctx: IcrcContext,
    *,
    dqpn: int,
    ev_index: int,
    request_id: int,
    reply_qpn: int,
    timestamp_ns: int,
    sport: int | None = None,
) -> int:
    """PROBE sent on EV `ev_index` (the EV under test)."""
    blen = ctl.pack_probe(buf, CTRL_HDR_LEN, request_id, reply_qpn)
    return _control(buf, ctx, Opcode.PROBE, dqpn, 0, ev_index, timestamp_ns, blen, sport)


def build_probe_reply(
    buf: WBuffer,
    ctx: IcrcContext,
    *,
    dqpn: int,
    ev_index: int,
    request_id: int,
    echo_ev_index: int,
    echo_timestamp_ns: int,
    service_time_ns: int = 0,
    flags: int = 0,
    timestamp_ns: int = 0,
    sport: int | None = None,
) -> int:
    blen = ctl.pack_probe_reply(
        buf, CTRL_HDR_LEN, request_id, echo_ev_index, flags, echo_timestamp_ns, service_time_ns
    )
    return _control(buf, ctx, Opcode.PROBE_REPLY, dqpn, 0, ev_index, timestamp_ns, blen, sport)


def build_port_status(
    buf: WBuffer,
    ctx: IcrcContext,
    *,
    dqpn: int,
    ev_index: int,
    request_id: int,
    port: int,
    state: int,
    epoch: int,
    timestamp_ns: int = 0,
    sport: int | None = None,
) -> int:
    blen = ctl.pack_port_status(buf, CTRL_HDR_LEN, request_id, port, state, epoch)
    return _control(buf, ctx, Opcode.PORT_STATUS, dqpn, 0, ev_index, timestamp_ns, blen, sport)


def trim_in_place(buf: WBuffer, length: int) -> int:
    """What a trimming switch does to a data packet: keep the headers up to the end of MXH, set
    TRIMMED and PRIO. Returns the new length (the caller fixes the IP/UDP lengths around it)."""
    if length < BTH_LEN:
        raise WireError("truncated", "cannot trim: no BTH")
    hl = header_len(buf[0])
    if buf[0] not in DATA_OPCODES:
        raise WireError("bad_opcode", "only data packets are trimmed")
    if length < hl:
        raise WireError("truncated", "cannot trim: headers incomplete")
    buf[hl - MXH_LEN + MXH_FLAGS_OFFSET] |= _TRIM_FLAGS
    return hl


# --------------------------------------------------------------------------------------------- parse


def parse(
    data: Buffer,
    ctx: IcrcContext | None = None,
    sport: int | None = None,
    *,
    verify: bool = True,
) -> MrcPacket:
    """Parse one MRC packet (the UDP payload: BTH ... ICRC).

    With `ctx`, the ICRC is checked using `sport` (default: the EV's fabric port); a mismatch raises
    WireError("bad_icrc") when `verify`, else the result says icrc="bad". Without `ctx` the result
    says "unchecked". Trimmed packets: "ignored" (they must end right after MXH: their ICRC cannot
    vouch for them, so their length does)."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    n = len(mv)
    if n < BTH_LEN:
        raise WireError("truncated", f"{n} bytes, BTH needs {BTH_LEN}")
    op = mv[0]
    imm: int | None = None
    if op == _OP_WRITE:
        hl = WRITE_HDR_LEN
        if n < hl:
            raise WireError("truncated", f"{n} bytes, WRITE headers need {hl}")
        (_, b1, pkey, qw, pw, va, rkey, dma_len, ver, flags, ev, msn, mlen, moff, ts) = _WRITE.unpack_from(mv)
    elif op == _OP_WRITE_IMM:
        hl = WRITE_IMM_HDR_LEN
        if n < hl:
            raise WireError("truncated", f"{n} bytes, WRITE_IMM headers need {hl}")
        (_, b1, pkey, qw, pw, va, rkey, dma_len, imm, ver, flags, ev, msn, mlen, moff, ts) = (
            _WRITE_IMM.unpack_from(mv)
        )
    elif op in _BODY_PARSERS:
        hl = CTRL_HDR_LEN
        if n < hl:
            raise WireError("truncated", f"{n} bytes, control headers need {hl}")
        (_, b1, pkey, qw, pw, ver, flags, ev, msn, mlen, moff, ts) = _CTRL.unpack_from(mv)
        va = rkey = dma_len = 0
    else:
        raise WireError("bad_opcode", f"opcode {op:#04x} is not an MRC opcode")
    if b1 & 0x0F:
        raise WireError("bad_field", f"BTH TVer {b1 & 0x0F} != 0")
    if ver != MXH_VERSION:
        raise WireError("bad_version", f"MXH version {ver}, expected {MXH_VERSION}")
    if ev > EV_INDEX_MAX:  # 14 bits (the UDP source port 0xC000 | EV carries no more)
        raise WireError("bad_field", f"MXH EV index {ev:#06x} > {EV_INDEX_MAX:#06x}")
    pad = (b1 >> 4) & 3
    body: ControlBody | None = None
    status: IcrcStatus
    if flags & _TRIMMED:
        if hl == CTRL_HDR_LEN:
            raise WireError("bad_field", "TRIMMED set on a control packet")
        if n != hl:
            # A trimmed packet ends right after MXH. Anything else is a corrupted packet: its ICRC is
            # not checked, so without this a flipped TRIMMED bit would pass a damaged full packet.
            raise WireError("bad_length", f"trimmed packet of {n} bytes, headers end at {hl}")
        payload = mv[hl:hl]
        status = "ignored"
    else:
        if hl == CTRL_HDR_LEN:
            end = n - ICRC_LEN
            if end < hl:
                raise WireError("truncated", "control packet without ICRC")
            if end - hl > _MAX_CTRL_BODY:
                raise WireError("bad_length", f"control body of {end - hl} bytes > {_MAX_CTRL_BODY}")
            if pad:
                raise WireError("bad_field", "PadCnt set on a control packet")
        else:
            if dma_len > MAX_PAYLOAD:
                raise WireError("bad_length", f"DMA length {dma_len} > {MAX_PAYLOAD}")
            if (dma_len + pad) & 3:
                raise WireError("bad_length", f"DMA length {dma_len} + pad {pad} not a multiple of 4")
            end = hl + dma_len + pad
            if n != end + ICRC_LEN:
                raise WireError(
                    "truncated" if n < end + ICRC_LEN else "bad_length",
                    f"{n} bytes, headers and DMA length say {end + ICRC_LEN}",
                )
            if moff + dma_len > mlen:
                raise WireError("bad_length", f"offset {moff} + {dma_len} beyond message length {mlen}")
        if ctx is None:
            status = "unchecked"
        elif _ICRC.unpack_from(mv, end)[0] == ctx.compute_w0(
            mv, end, EV_SPORT_BASE | (ev & EV_INDEX_MAX) if sport is None else sport,
            (op << 24) | (b1 << 16) | pkey,
        ):
            status = "ok"
        elif verify:
            raise WireError("bad_icrc", "invariant CRC mismatch")
        else:
            status = "bad"
        if hl == CTRL_HDR_LEN:
            body = _BODY_PARSERS[op](mv, hl, end)
            payload = mv[hl:hl]
        else:
            payload = mv[hl : hl + dma_len]
    return MrcPacket(
        op, pad, pkey, (qw & FECN_BIT) != 0, (qw & BECN_BIT) != 0, qw & QPN_MASK, (pw & ACKREQ_BIT) != 0,
        pw & PSN_MASK, va, rkey, dma_len, imm, flags, ev, msn, mlen, moff, ts, payload, body, status, n,
    )


# parse_write's result: (psn, ackreq, va, rkey, dma_len, imm, flags, ev_index, msn, msg_len, timestamp_ns,
# payload), the MrcPacket fields of those names
WriteFields = tuple[int, bool, int, int, int, "int | None", int, int, int, int, int, memoryview]


def parse_write(data: bytes | bytearray, ctx: IcrcContext) -> WriteFields | None:
    """The receive hot path of `parse` for an RDMA WRITE Only / WRITE Only with Immediate packet that
    `parse(data, ctx)` accepts with icrc "ok" (the default source port of its EV, `verify` on):
    (psn, ackreq, va, rkey, dma_len, imm, flags, ev_index, msn, msg_len, timestamp_ns, payload), the
    same values as the `MrcPacket` fields of those names, without building one. `data` is bytes or a
    bytearray. None for everything else (other opcodes, trimmed packets, BTH byte 4 not zero as no
    endpoint sends it, any failed check): then `parse` gives the outcome, the packet or the `WireError`."""
    n = len(data)
    op = data[0]
    imm: int | None
    if op == _OP_WRITE:
        if n < WRITE_HDR_LEN:
            return None
        hl = WRITE_HDR_LEN
        (_, b1, pkey, qw, pw, va, rkey, dma_len, ver, flags, ev, msn, mlen, moff, ts) = (
            _WRITE.unpack_from(data)
        )
        imm = None
    elif op == _OP_WRITE_IMM:
        if n < WRITE_IMM_HDR_LEN:
            return None
        hl = WRITE_IMM_HDR_LEN
        (_, b1, pkey, qw, pw, va, rkey, dma_len, imm, ver, flags, ev, msn, mlen, moff, ts) = (
            _WRITE_IMM.unpack_from(data)
        )
    else:
        return None
    # qw > QPN_MASK: BTH byte 4 (FECN, BECN, Resv6) is not zero, as no endpoint sends it: left to `parse`;
    # a P_Key outside the default partition: left to the engine's check after `parse`
    if (
        pkey & PKEY_PARTITION != PKEY_PARTITION or b1 & 0x0F or qw > QPN_MASK or ver != MXH_VERSION
        or flags & _TRIMMED or dma_len > MAX_PAYLOAD or ev > EV_INDEX_MAX
    ):
        return None
    pad = (b1 >> 4) & 3
    end = hl + dma_len + pad
    if (dma_len + pad) & 3 or n != end + ICRC_LEN or moff + dma_len > mlen:
        return None
    sport = EV_SPORT_BASE | (ev & EV_INDEX_MAX)
    # the ICRC check in one crc32 over the whole packet, its ICRC included (see IcrcContext.start, inlined
    # on a hit of its cache): the residue comes out exactly when the ICRC is right
    v = ctx._start.get((sport << 32) | end)
    if crc32(data, ctx.start(end, sport) if v is None else v) != CRC32_RESIDUE:
        return None
    return (pw & PSN_MASK, (pw & ACKREQ_BIT) != 0, va, rkey, dma_len, imm, flags, ev, msn, mlen, ts,
            memoryview(data)[hl : hl + dma_len])
