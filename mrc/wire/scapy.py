"""Scapy layers for MRC (docs/design.md §3), so that users can dissect and build MRC packets in scapy.

Import this module explicitly (``from mrc.wire.scapy import MXH, SACK``): it imports scapy, which is
slow, so nothing on the data path and nothing in ``mrc.wire.__init__`` imports it. Importing it binds the
layers into ``scapy.contrib.roce`` once (Python caches the module, so a later ``load_contrib("roce")`` or
``import scapy.contrib.roce`` elsewhere changes nothing)::

    UDP dport 4791 -> BTH  (scapy.contrib.roce; its FCSField ``icrc`` takes the last 4 bytes)
    BTH opcode 0x0A -> RETH -> MXH -> Raw (payload, then the PadCnt zero bytes)
    BTH opcode 0x0B -> RETH -> ImmDt -> MXH -> Raw
    BTH opcode 0xC0..0xC4 -> MXH -> SACK | NACK | PROBE | PROBE_REPLY | PORT_STATUS

MXH is dissected only where the bytes are one (``looks_like_mxh``: version 1, reserved bits clear, and
on data packets a length that adds up to MXH + DMA length + pad, which no plain RoCE WRITE has); an
ordinary RoCE RDMA WRITE Only (with or without Immediate) still dissects as RETH [/ ImmDt] / Raw with
these layers imported, and another vendor's packet on opcodes 0xC0-0xC4 as BTH / Raw.

``scapy.contrib.roce`` (2.5 to 2.8 at least) has no RETH or ImmDt layer, so this module defines them.
Should a later scapy bind its own after BTH, dissection finds those first (scapy tries bindings in the
order they were made); MXH is then bound after them as well, and ours remain usable for building.
Field names follow ``mrc.wire`` (``Mxh``, ``Sack``, ... and docs/wire.md): ``ev_index``, ``msn``,
``msg_len``, ``msg_offset``, ``timestamp_ns``, ``cum_psn``, ``bitmap``, ...

Building: scapy's BTH computes the ICRC itself (the same value as ``IcrcContext``: tested), over the
UDP ports it is given, so use ``mrc_udp(ev_index)`` (source port ``0xC000 | EV``, checksum 0) for a
packet that ``mrc.wire.parse`` accepts with its default source port. The BTH opcode follows from the
layers stacked on it (RETH -> 0x0A, RETH/ImmDt -> 0x0B, MXH/SACK -> 0xC0, ...) unless given explicitly;
RETH ``dma_len`` and MXH ``msg_len`` are computed when left unset. Padding is explicit: for a payload
that is not a multiple of 4 bytes set ``BTH(padcount=...)`` and append the zero bytes to the Raw layer,
or use ``write_packet``, which does both.

Trimmed packets have no ICRC, but scapy's BTH still takes their last 4 bytes as ``icrc``; MXH puts those
bytes back into itself when TRIMMED is set, so a trimmed packet dissects with a whole MXH (and BTH
``icrc`` shows the same 4 bytes). Rebuilding such a packet appends an ICRC: scapy's BTH always does.
"""

from __future__ import annotations

import struct
from typing import Any

import scapy.contrib.roce as _roce
from scapy.config import conf
from scapy.contrib.roce import BTH
from scapy.fields import (
    BitField,
    ByteEnumField,
    ByteField,
    Field,
    FlagsField,
    IntField,
    LongField,
    ShortField,
    XBitField,
    XIntField,
    XLongField,
    XShortField,
)
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet, Raw, bind_bottom_up, bind_layers

from .consts import (
    BTH_LEN,
    EV_INDEX_MAX,
    ICRC_LEN,
    IMMDT_LEN,
    MXH_LEN,
    MXH_VERSION,
    RETH_LEN,
    ROCEV2_UDP_PORT,
    SACK_MAX_WORDS,
    MxhFlag,
    NackCode,
    Opcode,
    PortState,
    ProbeReplyFlag,
    SackFlag,
)
from .icrc import ev_sport

__all__ = [
    "BTH",
    "MXH",
    "NACK",
    "PORT_STATUS",
    "PROBE",
    "PROBE_REPLY",
    "RETH",
    "SACK",
    "ImmDt",
    "looks_like_mxh",
    "mrc_udp",
    "write_packet",
]


def _flag_names(flags: type[MxhFlag] | type[SackFlag] | type[ProbeReplyFlag]) -> list[str]:
    """FlagsField names, least significant bit first, for the 8 bits of a flags byte."""
    names = [f"bit{i}" for i in range(8)]
    for f in flags:
        names[int(f).bit_length() - 1] = str(f.name)
    return names


def _bth_below(pkt: Packet) -> Packet | None:
    """The BTH under `pkt` (through RETH/ImmDt), or None. Works both while dissecting (scapy passes
    the underlayer to each new layer) and while building (``/`` links the layers)."""
    u = pkt.underlayer
    while u is not None and not isinstance(u, BTH):
        u = u.underlayer
    return u


class _SetsBthOpcode(Packet):
    """A layer whose presence decides the BTH opcode. scapy's ``bind_top_down`` can only overload the
    layer directly below, once per pair of layer classes, which cannot express "MXH/SACK -> 0xC0,
    MXH/NACK -> 0xC1" or "RETH/ImmDt -> 0x0B"; so these layers overload BTH's opcode themselves whenever
    their payload changes (``a / b``) or they are copied (scapy copies both operands of ``/``)."""

    def _implied_opcode(self) -> int | None:
        raise NotImplementedError

    def _sync_opcode(self) -> None:
        op = self._implied_opcode()
        if op is None:
            return
        self.overload_fields = {**self.overload_fields, BTH: {"opcode": op}}
        u = self.underlayer
        if isinstance(u, BTH):
            u.overloaded_fields = {**u.overloaded_fields, "opcode": op}

    def add_payload(self, payload: Packet | bytes) -> None:
        super().add_payload(payload)
        self._sync_opcode()

    def copy(self) -> Any:
        clone = super().copy()
        clone._sync_opcode()
        return clone


# ---------------------------------------------------------------------------------- RETH / ImmDt


class RETH(_SetsBthOpcode):
    """RDMA Extended Transport Header, on every MRC data packet: VA of this packet's payload, R_Key,
    DMA length = payload bytes in this packet (pad excluded). ``dma_len`` unset: computed at build."""

    name = "RETH"
    fields_desc = [  # noqa: RUF012 (scapy's class attribute)
        XLongField("va", 0),
        XIntField("rkey", 0),
        IntField("dma_len", None),
    ]

    def _implied_opcode(self) -> int | None:
        return int(Opcode.RDMA_WRITE_ONLY_IMM if isinstance(self.payload, ImmDt) else Opcode.RDMA_WRITE_ONLY)

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        bth = _bth_below(self)
        if bth is not None and bth.opcode == Opcode.RDMA_WRITE_ONLY_IMM:
            return ImmDt
        return MXH

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.dma_len is None:
            headers = MXH_LEN + (IMMDT_LEN if isinstance(self.payload, ImmDt) else 0)
            bth = _bth_below(self)
            pad = int(bth.padcount) if bth is not None else 0
            n = max(0, len(pay) - headers - pad)
            pkt = pkt[: RETH_LEN - 4] + struct.pack("!I", n) + pkt[RETH_LEN:]
        return pkt + pay


class ImmDt(Packet):
    """Immediate data of a WRITE-with-immediate (opcode 0x0B), between RETH and MXH as in InfiniBand."""

    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]  # noqa: RUF012


# ------------------------------------------------------------------------------------------ MXH


class MXH(_SetsBthOpcode):
    """MRC extension header (24 bytes), after RETH/ImmDt on data packets and right after BTH on
    control packets. ``msg_len`` unset: ``msg_offset`` + the payload length on data packets, else 0."""

    name = "MXH"
    fields_desc = [  # noqa: RUF012
        ByteField("version", MXH_VERSION),
        FlagsField("flags", 0, 8, _flag_names(MxhFlag)),
        ShortField("ev_index", 0),
        IntField("msn", 0),
        IntField("msg_len", None),
        IntField("msg_offset", 0),
        LongField("timestamp_ns", 0),
    ]

    def _implied_opcode(self) -> int | None:
        for op, body in _BODIES.items():
            if isinstance(self.payload, body):
                return op
        return None

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        """Dissect as MXH only what is one; anything else stays the plain payload (Raw).

        The bindings above put MXH after every RETH / ImmDt of a WRITE Only and after BTH on opcodes
        0xC0-0xC4 (manufacturer-specific in InfiniBand, so other vendors' packets may carry them):
        without this check, any RoCE RDMA WRITE seen after ``import mrc.wire.scapy`` dissected as
        RETH/MXH, its payload read as an MXH of version 104. `looks_like_mxh` decides."""
        if _pkt is None:
            return cls  # building, not dissecting
        if looks_like_mxh(bytes(_pkt), kargs.get("_underlayer")):
            return cls
        return conf.raw_layer

    def pre_dissect(self, s: bytes) -> bytes:
        # A trimmed packet ends after MXH, without ICRC, but BTH's FCSField took its last 4 bytes.
        if len(s) == MXH_LEN - ICRC_LEN and s[1] & MxhFlag.TRIMMED:
            bth = _bth_below(self)
            if bth is not None and bth.icrc is not None:
                return s + struct.pack("!I", bth.icrc)
        return s

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        bth = _bth_below(self)
        if bth is not None:
            body = _BODIES.get(int(bth.opcode))
            if body is not None:
                return body
        return conf.raw_layer

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.msg_len is None:
            mlen = 0
            u = self.underlayer
            while u is not None and not isinstance(u, BTH | RETH):
                u = u.underlayer
            if isinstance(u, RETH):
                if u.dma_len is not None:
                    n = int(u.dma_len)
                else:
                    bth = _bth_below(self)
                    n = max(0, len(pay) - (int(bth.padcount) if bth is not None else 0))
                mlen = (int(self.msg_offset) + n) & 0xFFFFFFFF
            pkt = pkt[:8] + struct.pack("!I", mlen) + pkt[12:]
        return pkt + pay


def looks_like_mxh(s: bytes, underlayer: Packet | None) -> bool:
    """Whether `s`, the bytes after RETH/ImmDt (data) or BTH (control), less the 4 bytes BTH's FCSField
    took as ICRC, are an MXH as MRC sends it (not a plain RoCE payload):

    * version 1, reserved flag bits (0xC0) clear, EV index below 2^14;
    * on a data packet, the length adds up, which a plain RDMA WRITE cannot satisfy: MXH + RETH's DMA
      length + BTH's PadCnt bytes exactly (a plain WRITE Only carries DMA length + pad bytes), or, with
      TRIMMED set, the 20 bytes of an MXH whose last 4 BTH took (a trimmed packet ends after MXH);
    * on a control packet, at least a whole MXH.

    A RETH without a ``dma_len`` field (another scapy's own layer) leaves only the first checks."""
    if len(s) < MXH_LEN - ICRC_LEN or s[0] != MXH_VERSION or s[1] & 0xC0:
        return False
    if int.from_bytes(s[2:4], "big") > EV_INDEX_MAX:
        return False
    u = underlayer
    while u is not None and not isinstance(u, BTH) and "dma_len" not in u.fields:
        u = u.underlayer
    if u is None or isinstance(u, BTH):
        return len(s) >= MXH_LEN  # control packet (or an unknown stack: the plain header check)
    bth = _bth_below(u)
    pad = int(bth.padcount) if bth is not None else 0
    if s[1] & MxhFlag.TRIMMED:
        return len(s) == MXH_LEN - ICRC_LEN
    return len(s) == MXH_LEN + int(u.dma_len or 0) + pad


# -------------------------------------------------------------------------------- control bodies


class _Body(Packet):
    """A control body is the last layer before the ICRC (which BTH's FCSField already took); anything
    left over is padding, not a payload."""

    def extract_padding(self, s: bytes) -> tuple[bytes, bytes]:
        return b"", s


def _sack_words(pkt: Packet | None) -> int:
    """Bitmap words of a SACK whose ``words`` is unset: the fewest that hold ``bitmap`` (1..16)."""
    bits = int(pkt.getfieldval("bitmap") or 0).bit_length() if pkt is not None else 0
    return max(1, min(SACK_MAX_WORDS, -(-bits // 64)))


class _SackWordsField(ByteField):
    """Bitmap words (1..16); unset: computed from ``bitmap``."""

    def i2m(self, pkt: Packet | None, x: int | None) -> int:
        return _sack_words(pkt) if x is None else int(x)


class _SackBitmapField(Field[int, bytes]):
    """The SACK bitmap as one integer, bit i <=> PSN cum_psn + 1 + i (as ``Sack.bitmap``); on the wire
    ``words`` x 8 bytes, least significant byte first."""

    def __init__(self, name: str, default: int) -> None:
        super().__init__(name, default, fmt="s")

    def _nbytes(self, pkt: Packet) -> int:
        words = pkt.getfieldval("words")
        return 8 * (_sack_words(pkt) if words is None else int(words))

    def i2len(self, pkt: Packet, x: Any) -> int:
        return self._nbytes(pkt)

    def addfield(self, pkt: Packet, s: bytes, val: int | None) -> bytes:
        return s + int(val or 0).to_bytes(self._nbytes(pkt), "little")

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, int]:
        n = self._nbytes(pkt)
        return s[n:], int.from_bytes(s[:n], "little")

    def i2repr(self, pkt: Packet | None, x: int | None) -> str:
        return hex(x or 0)


class SACK(_Body):
    """SACK body (opcode 0xC0): cumulative PSN, echoes of the triggering packet, bitmap of PSNs above
    the cumulative point. ``acked_psns()`` lists the PSNs the bitmap reports, as ``Sack.acked_psns``."""

    name = "MRC SACK"
    fields_desc = [  # noqa: RUF012
        XBitField("reserved", 0, 8),
        BitField("cum_psn", 0, 24),
        ShortField("echo_ev_index", 0),
        FlagsField("echo_flags", 0, 8, _flag_names(SackFlag)),
        _SackWordsField("words", None),
        LongField("echo_timestamp_ns", 0),
        IntField("service_time_ns", 0),
        _SackBitmapField("bitmap", 0),
    ]

    def acked_psns(self) -> list[int]:
        bm, base = int(self.bitmap or 0), int(self.cum_psn) + 1
        return [(base + i) & 0xFFFFFF for i in range(bm.bit_length()) if bm >> i & 1]


class NACK(_Body):
    """NACK body (opcode 0xC1): code, echoed EV index, cumulative PSN, echoed timestamp."""

    name = "MRC NACK"
    fields_desc = [  # noqa: RUF012
        ByteEnumField("code", int(NackCode.TRIMMED), {int(c): str(c.name) for c in NackCode}),
        ByteField("reserved", 0),
        ShortField("echo_ev_index", 0),
        XBitField("reserved2", 0, 8),
        BitField("cum_psn", 0, 24),
        LongField("echo_timestamp_ns", 0),
    ]


class PROBE(_Body):
    """PROBE body (opcode 0xC2): request ID and the QPN the reply is addressed to."""

    name = "MRC PROBE"
    fields_desc = [  # noqa: RUF012
        ShortField("request_id", 0),
        XShortField("reserved", 0),
        XBitField("reserved2", 0, 8),
        BitField("reply_qpn", 0, 24),
    ]


class PROBE_REPLY(_Body):
    """PROBE_REPLY body (opcode 0xC3): echoes of the probe and the replier's service time."""

    name = "MRC PROBE_REPLY"
    fields_desc = [  # noqa: RUF012
        ShortField("request_id", 0),
        ShortField("echo_ev_index", 0),
        FlagsField("flags", 0, 8, _flag_names(ProbeReplyFlag)),
        XBitField("reserved", 0, 24),
        LongField("echo_timestamp_ns", 0),
        IntField("service_time_ns", 0),
    ]


class PORT_STATUS(_Body):
    """PORT_STATUS body (opcode 0xC4): a host's plane port, its state and the change epoch."""

    name = "MRC PORT_STATUS"
    fields_desc = [  # noqa: RUF012
        ShortField("request_id", 0),
        ByteField("port", 0),
        ByteEnumField("state", int(PortState.UP), {int(s): str(s.name) for s in PortState}),
        IntField("epoch", 0),
    ]


_BODIES: dict[int, type[Packet]] = {
    Opcode.SACK: SACK,
    Opcode.NACK: NACK,
    Opcode.PROBE: PROBE,
    Opcode.PROBE_REPLY: PROBE_REPLY,
    Opcode.PORT_STATUS: PORT_STATUS,
}


# ------------------------------------------------------------------------------------------ binding


def _bind() -> None:
    """Bind the layers (once: the module body runs once per process). bind_bottom_up entries decide
    dissection; bind_top_down sets BTH's opcode when a RETH is stacked on it (0x0A; the ImmDt and
    control-body cases are handled by `_SetsBthOpcode`)."""
    bind_bottom_up(BTH, RETH, opcode=int(Opcode.RDMA_WRITE_ONLY_IMM))
    bind_layers(BTH, RETH, opcode=int(Opcode.RDMA_WRITE_ONLY))
    bind_layers(ImmDt, MXH)
    for op in _BODIES:
        bind_bottom_up(BTH, MXH, opcode=op)
    for name in ("RETH", "ImmDt"):
        # A scapy whose roce module has its own RETH/ImmDt bound after BTH dissects with those (they
        # were bound first); MXH must follow them too.
        foreign = getattr(_roce, name, None)
        if isinstance(foreign, type) and issubclass(foreign, Packet) and foreign not in (RETH, ImmDt):
            bind_layers(foreign, MXH)
    # Name the control opcodes in BTH's display (0xC0-0xFF is manufacturer-specific: no clash).
    enum = BTH.fields_desc[0]
    if isinstance(enum, ByteEnumField) and enum.i2s is not None and enum.s2i is not None:
        for op in _BODIES:
            name = f"MRC_{Opcode(op).name}"
            if op not in enum.i2s:
                enum.i2s[op] = name
                enum.s2i[name] = op


_bind()


# ------------------------------------------------------------------------------------------ helpers


def mrc_udp(ev_index: int, sport: int | None = None) -> Packet:
    """The UDP header of an MRC packet as it is on the fabric: source port ``0xC000 | EV``, destination
    4791, checksum 0 (RoCEv2 practice). The ICRC covers the ports, so they must be the final ones."""
    return UDP(sport=ev_sport(ev_index) if sport is None else sport, dport=ROCEV2_UDP_PORT, chksum=0)


def write_packet(
    src: str,
    dst: str,
    *,
    dqpn: int,
    psn: int,
    ev_index: int,
    va: int,
    rkey: int,
    payload: bytes,
    imm: int | None = None,
    msn: int = 0,
    msg_len: int | None = None,
    msg_offset: int = 0,
    timestamp_ns: int = 0,
    flags: int = 0,
    ackreq: bool = False,
) -> Packet:
    """IPv6/UDP/BTH/RETH/[ImmDt]/MXH/Raw for one data packet, with PadCnt and the pad bytes set, as
    ``mrc.wire.build_write`` lays it out (``bytes()`` of it parses with ``mrc.wire.parse``)."""
    pad = -len(payload) & 3
    bth = BTH(dqpn=dqpn, psn=psn, ackreq=int(ackreq), padcount=pad)
    reth = RETH(va=va, rkey=rkey, dma_len=len(payload))
    mxh = MXH(flags=flags, ev_index=ev_index, msn=msn, msg_len=msg_len, msg_offset=msg_offset,
              timestamp_ns=timestamp_ns)
    ip = IPv6(src=src, dst=dst, nh=17) / mrc_udp(ev_index)
    body = reth / mxh if imm is None else reth / ImmDt(imm=imm) / mxh
    return ip / bth / body / Raw(payload + bytes(pad))


assert BTH_LEN == 12 and RETH_LEN == 16  # layouts the layers above hard-code
