"""Interop with scapy (docs/design.md §3): our ICRC equals scapy.contrib.roce's for every packet type, scapy
dissects our packets into the mrc.wire.scapy layers with our field values, and packets built in scapy
with those layers parse with mrc.wire.parse.

scapy shows BTH.icrc as the last 4 bytes read big-endian while the CRC is stored least significant byte
first (as the kernel's rxe does), so ICRCs are compared as bytes."""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Callable

import pytest

pytest.importorskip("scapy.contrib.roce")

from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from mrc.wire import (
    MAX_PAYLOAD,
    IcrcContext,
    MxhFlag,
    NackCode,
    Opcode,
    PortState,
    WireError,
    build_nack,
    build_port_status,
    build_probe,
    build_probe_reply,
    build_sack,
    build_write,
    ev_sport,
    parse,
    trim_in_place,
)
from mrc.wire.icrc import read_icrc
from mrc.wire.ip import addr16, encap, ether, ipv6_udp
from mrc.wire.scapy import (
    BTH,
    MXH,
    NACK,
    PORT_STATUS,
    PROBE,
    PROBE_REPLY,
    RETH,
    SACK,
    ImmDt,
    mrc_udp,
    write_packet,
)

SRC_S, DST_S = "fd00:0:0:1::1", "fd00:0:0:2::1"
SRC, DST = addr16(SRC_S), addr16(DST_S)
CTX = IcrcContext(SRC, DST)
SIZES = [0, 1, 2, 3, 4, 5, 7, 64, 1023, 4095, 4096, MAX_PAYLOAD - 1, MAX_PAYLOAD]

Builder = Callable[[bytearray], int]


def _payload(n: int) -> bytes:
    return bytes((i * 7 + 3) & 0xFF for i in range(n))


def _data(n: int, imm: int | None = None, **kw: int) -> Builder:
    def build(buf: bytearray) -> int:
        return build_write(buf, CTX, dqpn=0xABCDEF, psn=0xFFFFFE, ev_index=0x1234, va=0x7F00_1234_5678,
                           rkey=0xCAFE, payload=_payload(n), msn=9, msg_len=n + 4096, msg_offset=4096,
                           timestamp_ns=0x1122334455667788, flags=MxhFlag.LAST, ackreq=True, imm=imm, **kw)
    return build


CONTROL: dict[str, Builder] = {
    "SACK": lambda b: build_sack(b, CTX, dqpn=0x10203, psn=77, ev_index=12, cum_psn=0xFFFFF0,
                                 echo_ev_index=13, echo_timestamp_ns=2**64 - 1, bitmap=(1 << 128) - 1 - 6,
                                 words=3, echo_flags=5, service_time_ns=1500, timestamp_ns=99),
    "NACK": lambda b: build_nack(b, CTX, dqpn=0x10203, psn=78, ev_index=14, code=NackCode.OUT_OF_WINDOW,
                                 echo_ev_index=15, cum_psn=0x123, echo_timestamp_ns=42, timestamp_ns=43),
    "PROBE": lambda b: build_probe(b, CTX, dqpn=0x10203, ev_index=16383, request_id=0xBEEF,
                                   reply_qpn=0x445566, timestamp_ns=44),
    "PROBE_REPLY": lambda b: build_probe_reply(b, CTX, dqpn=0x445566, ev_index=3, request_id=0xBEEF,
                                               echo_ev_index=16383, echo_timestamp_ns=44, service_time_ns=800,
                                               flags=1, timestamp_ns=45),
    "PORT_STATUS": lambda b: build_port_status(b, CTX, dqpn=0x10203, ev_index=4, request_id=7, port=2,
                                               state=PortState.DOWN, epoch=0xFFFFFFFF, timestamp_ns=46),
}


def _mrc(build: Builder) -> bytes:
    buf = bytearray(MAX_PAYLOAD + 128)
    return bytes(buf[: build(buf)])


def _inner(mrc: bytes, **kw: int) -> bytes:
    ev = int.from_bytes(mrc[_mxh_offset(mrc) + 2 : _mxh_offset(mrc) + 4], "big")
    return ipv6_udp(SRC, DST, ev_sport(ev), mrc, **kw)


def _mxh_offset(mrc: bytes) -> int:
    offsets: dict[int, int] = {Opcode.RDMA_WRITE_ONLY: 28, Opcode.RDMA_WRITE_ONLY_IMM: 32}
    return offsets.get(mrc[0], 12)


def _scapy_icrc(inner: bytes) -> bytes:
    """What scapy.contrib.roce computes for this packet: dissect, drop the ICRC, rebuild."""
    pkt = IPv6(inner)
    pkt[BTH].icrc = None
    return bytes(pkt)[-4:]


def _all_packets() -> list[tuple[str, bytes]]:
    out = [(f"WRITE/{n}", _mrc(_data(n))) for n in SIZES]
    out += [(f"WRITE_IMM/{n}", _mrc(_data(n, imm=0xFEEDF00D))) for n in SIZES]
    out += [(name, _mrc(b)) for name, b in CONTROL.items()]
    return out


PACKETS = _all_packets()


# ------------------------------------------------------------------------------------------ ICRC


@pytest.mark.parametrize(("name", "mrc"), PACKETS, ids=[p[0] for p in PACKETS])
def test_icrc_equals_scapy(name: str, mrc: bytes) -> None:
    inner = _inner(mrc)
    assert _scapy_icrc(inner) == mrc[-4:]
    # scapy displays the trailer read in network order, which is what read_icrc returns
    assert IPv6(inner)[BTH].icrc == read_icrc(mrc)


@pytest.mark.parametrize("name", ["WRITE/5", "WRITE_IMM/4096", "SACK", "NACK"])
def test_icrc_masks_agree_with_scapy(name: str) -> None:
    """Traffic class, flow label, hop limit and BTH byte 4 are masked by both: rewriting them (as a
    switch may) changes neither ICRC."""
    mrc = bytearray(dict(PACKETS)[name])
    mrc[4] = 0xC0  # FECN + BECN
    inner = _inner(bytes(mrc), traffic_class=0xFF, flow_label=0xFFFFF, hop_limit=1)
    assert _scapy_icrc(inner) == mrc[-4:]
    assert parse(mrc, CTX).icrc == "ok"


# ------------------------------------------------------------------------------------ dissection


def test_dissect_write() -> None:
    mrc = _mrc(_data(5))
    pkt = IPv6(_inner(mrc))
    assert [type(layer) for layer in _layers(pkt)] == [IPv6, UDP, BTH, RETH, MXH, Raw]
    bth, reth, mxh = pkt[BTH], pkt[RETH], pkt[MXH]
    assert (bth.opcode, bth.padcount, bth.dqpn, bth.psn, bth.ackreq) == (0x0A, 3, 0xABCDEF, 0xFFFFFE, 1)
    assert (reth.va, reth.rkey, reth.dma_len) == (0x7F00_1234_5678, 0xCAFE, 5)
    assert (mxh.version, int(mxh.flags), mxh.ev_index, mxh.msn) == (1, MxhFlag.LAST, 0x1234, 9)
    assert (mxh.msg_len, mxh.msg_offset, mxh.timestamp_ns) == (4101, 4096, 0x1122334455667788)
    assert mxh.flags.LAST and not mxh.flags.TRIMMED
    assert pkt[Raw].load == _payload(5) + b"\x00\x00\x00"  # payload, then PadCnt zero bytes
    assert pkt[UDP].sport == ev_sport(0x1234)


def test_dissect_write_imm() -> None:
    pkt = IPv6(_inner(_mrc(_data(4096, imm=0xFEEDF00D))))
    assert [type(layer) for layer in _layers(pkt)] == [IPv6, UDP, BTH, RETH, ImmDt, MXH, Raw]
    assert pkt[ImmDt].imm == 0xFEEDF00D
    assert pkt[RETH].dma_len == 4096 and pkt[Raw].load == _payload(4096)
    assert pkt[MXH].ev_index == 0x1234


def test_dissect_sack() -> None:
    pkt = IPv6(_inner(dict(PACKETS)["SACK"]))
    assert [type(layer) for layer in _layers(pkt)] == [IPv6, UDP, BTH, MXH, SACK]
    assert pkt[BTH].opcode == Opcode.SACK and pkt[BTH].psn == 77 and pkt[BTH].dqpn == 0x10203
    assert pkt[MXH].ev_index == 12 and pkt[MXH].timestamp_ns == 99 and pkt[MXH].msg_len == 0
    s = pkt[SACK]
    assert (s.cum_psn, s.echo_ev_index, int(s.echo_flags), s.words) == (0xFFFFF0, 13, 5, 3)
    assert (s.echo_timestamp_ns, s.service_time_ns) == (2**64 - 1, 1500)
    assert s.bitmap == (1 << 128) - 1 - 6
    ours = parse(dict(PACKETS)["SACK"], CTX).body
    assert ours is not None and s.acked_psns() == ours.acked_psns()  # type: ignore[union-attr]
    assert s.echo_flags.ECN_CE and s.echo_flags.DUPLICATE and not s.echo_flags.RETX


def test_dissect_nack() -> None:
    n = IPv6(_inner(dict(PACKETS)["NACK"]))[NACK]
    assert (n.code, n.echo_ev_index, n.cum_psn) == (NackCode.OUT_OF_WINDOW, 15, 0x123)
    assert n.echo_timestamp_ns == 42
    assert n.sprintf("%code%") == "OUT_OF_WINDOW"


def test_dissect_probe_and_reply() -> None:
    pkt = IPv6(_inner(dict(PACKETS)["PROBE"]))
    assert pkt[MXH].ev_index == 16383 and pkt[UDP].sport == 0xFFFF
    assert (pkt[PROBE].request_id, pkt[PROBE].reply_qpn) == (0xBEEF, 0x445566)
    r = IPv6(_inner(dict(PACKETS)["PROBE_REPLY"]))[PROBE_REPLY]
    assert (r.request_id, r.echo_ev_index, int(r.flags)) == (0xBEEF, 16383, 1)
    assert (r.echo_timestamp_ns, r.service_time_ns) == (44, 800)
    assert r.flags.SERVICE_TIME_VALID


def test_dissect_port_status() -> None:
    p = IPv6(_inner(dict(PACKETS)["PORT_STATUS"]))[PORT_STATUS]
    assert (p.request_id, p.port, p.state, p.epoch) == (7, 2, PortState.DOWN, 0xFFFFFFFF)
    assert p.sprintf("%state%") == "DOWN"


def test_dissect_full_frame() -> None:
    """Ethernet / outer IPv6 (micro-SID container, flow label = EV) / inner IPv6 / UDP / BTH ..."""
    mrc = _mrc(_data(64))
    frame = ether("02:00:00:00:00:02", "02:00:00:00:00:01",
                  encap(_inner(mrc), addr16("fc00::1"), addr16("fcbb:bbbb:1:2:3:4::"), 0x1234))
    pkt = Ether(frame)
    assert pkt[IPv6].fl == 0x1234 and pkt[IPv6].nh == 41
    assert pkt[MXH].ev_index == 0x1234 and pkt[RETH].dma_len == 64
    assert pkt[BTH].icrc == read_icrc(mrc)


def test_bth_shows_mrc_control_opcode_names() -> None:
    assert IPv6(_inner(dict(PACKETS)["PROBE"]))[BTH].sprintf("%opcode%") == "MRC_PROBE"


def test_dissect_trimmed_packet_has_whole_mxh() -> None:
    buf = bytearray(MAX_PAYLOAD + 128)
    n = trim_in_place(buf, _data(4096)(buf))
    pkt = IPv6(_inner(bytes(buf[:n])))
    mxh = pkt[MXH]
    assert mxh.flags.TRIMMED and mxh.flags.PRIO
    assert mxh.timestamp_ns == 0x1122334455667788  # the 4 bytes scapy's BTH took as ICRC, put back
    assert pkt[RETH].dma_len == 4096 and Raw not in pkt


def _layers(pkt: Packet) -> list[Packet]:
    out = []
    while pkt:
        out.append(pkt)
        pkt = pkt.payload
    return out


# -------------------------------------------------------------------------------------- building


def _parse_scapy(pkt: Packet, sport: int | None = None) -> object:
    raw = bytes(pkt)
    return parse(raw[48:], CTX, sport=sport)


@pytest.mark.parametrize("n", [0, 4, 8, 4096, MAX_PAYLOAD])
def test_scapy_built_write_parses(n: int) -> None:
    pl = _payload(n)
    pkt = (IPv6(src=SRC_S, dst=DST_S) / mrc_udp(77) / BTH(dqpn=0x42, psn=0xFFFFFF, ackreq=1)
           / RETH(va=0x1000, rkey=0x99) / MXH(ev_index=77, msn=5, msg_offset=0x100, timestamp_ns=2**63)
           / Raw(pl))
    p = parse(bytes(pkt)[48:], CTX)
    assert p.icrc == "ok" and p.opcode == Opcode.RDMA_WRITE_ONLY  # opcode implied by RETH
    assert (p.dqpn, p.psn, p.ackreq, p.va, p.rkey) == (0x42, 0xFFFFFF, True, 0x1000, 0x99)
    assert (p.ev_index, p.msn) == (77, 5)
    assert p.dma_len == n and p.msg_len == 0x100 + n and p.timestamp_ns == 2**63  # computed by the layers
    assert bytes(p.payload) == pl
    # and it is byte for byte what build_write makes
    buf = bytearray(MAX_PAYLOAD + 128)
    length = build_write(buf, CTX, dqpn=0x42, psn=0xFFFFFF, ackreq=True, ev_index=77, va=0x1000, rkey=0x99,
                         payload=pl, msn=5, msg_offset=0x100, timestamp_ns=2**63)
    assert bytes(pkt)[48:] == bytes(buf[:length])


def test_scapy_built_write_with_explicit_padding_parses() -> None:
    pkt = (IPv6(src=SRC_S, dst=DST_S) / mrc_udp(3) / BTH(dqpn=1, psn=2, padcount=1)
           / RETH(va=5, rkey=6) / MXH(ev_index=3) / Raw(b"abc\x00"))
    p = parse(bytes(pkt)[48:], CTX)
    assert p.icrc == "ok" and p.dma_len == 3 and bytes(p.payload) == b"abc" and p.pad == 1


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 4095])
def test_write_packet_helper_matches_build_write(n: int) -> None:
    for imm in (None, 0x01020304):
        pkt = write_packet(SRC_S, DST_S, dqpn=0xABCDEF, psn=0xFFFFFE, ev_index=0x1234, va=0x7F00_1234_5678,
                           rkey=0xCAFE, payload=_payload(n), msn=9, msg_len=n + 4096, msg_offset=4096,
                           timestamp_ns=0x1122334455667788, flags=MxhFlag.LAST, ackreq=True, imm=imm)
        assert bytes(pkt)[48:] == _mrc(_data(n, imm=imm))


def test_scapy_built_write_imm_parses_either_association() -> None:
    ip = IPv6(src=SRC_S, dst=DST_S) / mrc_udp(9)
    left = ip / BTH(dqpn=1, psn=2) / RETH(va=1, rkey=2) / ImmDt(imm=77) / MXH(ev_index=9) / Raw(b"wxyz")
    right = ip / (BTH(dqpn=1, psn=2) / (RETH(va=1, rkey=2) / ImmDt(imm=77)
                                         / (MXH(ev_index=9) / Raw(b"wxyz"))))
    for pkt in (left, right):
        p = parse(bytes(pkt)[48:], CTX)
        assert p.opcode == Opcode.RDMA_WRITE_ONLY_IMM and p.imm == 77 and p.icrc == "ok"


@pytest.mark.parametrize(
    ("body", "opcode"),
    [
        (SACK(cum_psn=0xFFFFFF, echo_ev_index=4, echo_flags=1, bitmap=(1 << 1024) - 1, echo_timestamp_ns=8,
              service_time_ns=9), Opcode.SACK),
        (SACK(cum_psn=3, bitmap=0), Opcode.SACK),
        (NACK(code=NackCode.BAD_QPN, echo_ev_index=5, cum_psn=6, echo_timestamp_ns=7), Opcode.NACK),
        (PROBE(request_id=1, reply_qpn=0xFFFFFF), Opcode.PROBE),
        (PROBE_REPLY(request_id=1, echo_ev_index=2, flags=1, echo_timestamp_ns=3, service_time_ns=4),
         Opcode.PROBE_REPLY),
        (PORT_STATUS(request_id=1, port=7, state=PortState.UP, epoch=9), Opcode.PORT_STATUS),
    ],
    ids=["SACK-full", "SACK-min", "NACK", "PROBE", "PROBE_REPLY", "PORT_STATUS"],
)
def test_scapy_built_control_parses(body: Packet, opcode: int) -> None:
    ip = IPv6(src=SRC_S, dst=DST_S) / mrc_udp(21)
    for pkt in (
        ip / BTH(dqpn=0x77, psn=5) / MXH(ev_index=21, timestamp_ns=11) / body,
        ip / (BTH(dqpn=0x77, psn=5) / (MXH(ev_index=21, timestamp_ns=11) / body)),  # opcode set either way
    ):
        p = parse(bytes(pkt)[48:], CTX)
        assert p.opcode == opcode and p.icrc == "ok" and p.timestamp_ns == 11 and p.dqpn == 0x77
        assert p.body is not None
        for name in ("cum_psn", "echo_ev_index", "echo_flags", "echo_timestamp_ns", "service_time_ns",
                     "bitmap", "code", "request_id", "reply_qpn", "flags", "port", "state", "epoch"):
            if name in body.fields:
                assert getattr(p.body, name) == int(body.fields[name]), name


def test_explicit_opcode_wins() -> None:
    pkt = IPv6(src=SRC_S, dst=DST_S) / mrc_udp(1) / BTH(opcode=0xC3, dqpn=1) / MXH(ev_index=1) / PROBE()
    assert bytes(pkt)[48] == 0xC3
    with pytest.raises(WireError) as e:  # an 8-byte PROBE body is too short for a PROBE_REPLY
        parse(bytes(pkt)[48:], CTX)
    assert e.value.reason == "truncated"


def test_icrc_needs_the_fabric_source_port() -> None:
    pkt = IPv6(src=SRC_S, dst=DST_S) / UDP(sport=1234, dport=4791) / BTH(dqpn=1) / MXH(ev_index=1) / PROBE()
    assert parse(bytes(pkt)[48:], CTX, sport=1234).icrc == "ok"
    assert parse(bytes(pkt)[48:], CTX, verify=False).icrc == "bad"


# ---------------------------------------------------------------------------------- import hygiene


def test_roce_loaded_again_keeps_bindings() -> None:
    from scapy.main import load_contrib

    load_contrib("roce")
    import scapy.contrib.roce  # noqa: F401

    pkt = IPv6(_inner(dict(PACKETS)["NACK"]))
    assert NACK in pkt and pkt[NACK].code == NackCode.OUT_OF_WINDOW


def test_mrc_wire_does_not_import_scapy() -> None:
    code = "import sys, mrc.wire, mrc.wire.packet; assert 'scapy' not in sys.modules, 'scapy imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_scapy_module_imports_standalone() -> None:
    """Imported first thing in a fresh interpreter (before anyone imported scapy.contrib.roce)."""
    code = ("from mrc.wire.scapy import MXH, SACK; from scapy.layers.inet6 import IPv6; "
            "from scapy.contrib.roce import BTH; "
            "from scapy.layers.inet import UDP; "
            "p = IPv6(bytes(IPv6(src='::1', dst='::2') / UDP(dport=4791) / BTH(dqpn=1) / MXH() / SACK())); "
            "assert SACK in p")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------- plain RoCE stays plain


def _plain_roce(opcode: int, payload: bytes, imm: int | None = None) -> bytes:
    """An ordinary RoCEv2 RDMA WRITE Only [with Immediate] (no MXH), bytes as any RoCE NIC sends it."""
    pad = -len(payload) & 3
    reth = struct.pack("!QII", 0x7F00_0000_1000, 0x1234, len(payload))
    imm_b = b"" if imm is None else struct.pack("!I", imm)
    pkt = (IPv6(src=SRC_S, dst=DST_S) / UDP(sport=49152, dport=4791, chksum=0)
           / BTH(opcode=opcode, dqpn=0x11, psn=3, padcount=pad) / Raw(reth + imm_b + payload + bytes(pad)))
    return bytes(pkt)


# Payloads that an unguarded binding misreads as MXH: text ("hello" -> version 104), a first byte of 1
# (the MXH version) with clear reserved flag bits, exactly 24 bytes shaped like a real MXH.
PLAIN_PAYLOADS = [
    b"hello, plain RoCE" * 100,
    b"\x01\x04\x00\x05" + bytes(500),
    bytes(MXH(ev_index=5, msn=1, msg_len=24, msg_offset=0)),
    b"",
    b"x",
]


@pytest.mark.parametrize("payload", PLAIN_PAYLOADS, ids=["text", "version-1", "mxh-shaped", "empty", "one"])
def test_plain_roce_write_dissects_as_reth_only(payload: bytes) -> None:
    pkt = IPv6(_plain_roce(Opcode.RDMA_WRITE_ONLY, payload))
    assert pkt.layers()[:4] == [IPv6, UDP, BTH, RETH]
    assert MXH not in pkt
    assert pkt[RETH].dma_len == len(payload)
    tail = pkt[RETH].payload
    assert bytes(tail) == payload + bytes(-len(payload) & 3)
    if payload:
        assert isinstance(tail, Raw)


@pytest.mark.parametrize("payload", PLAIN_PAYLOADS[:3], ids=["text", "version-1", "mxh-shaped"])
def test_plain_roce_write_imm_dissects_as_reth_immdt_only(payload: bytes) -> None:
    pkt = IPv6(_plain_roce(Opcode.RDMA_WRITE_ONLY_IMM, payload, imm=0xABCD))
    assert RETH in pkt and ImmDt in pkt and MXH not in pkt
    assert pkt[ImmDt].imm == 0xABCD
    tail = pkt[ImmDt].payload
    assert isinstance(tail, Raw) and bytes(tail) == payload + bytes(-len(payload) & 3)


def test_foreign_vendor_opcode_is_not_mxh() -> None:
    """0xC0-0xC4 are manufacturer-specific InfiniBand opcodes: another vendor's packet whose bytes are
    not an MXH (version 0x68 here) stays Raw after BTH."""
    pkt = IPv6(bytes(IPv6(src=SRC_S, dst=DST_S) / UDP(sport=1, dport=4791, chksum=0)
                     / BTH(opcode=0xC2) / Raw(b"hello vendor, 28 bytes long!")))
    assert MXH not in pkt and PROBE not in pkt
    assert isinstance(pkt[BTH].payload, Raw)


def test_mrc_packets_still_dissect_with_the_guard() -> None:
    """The guard's length rule holds for every MRC packet (trimmed ones included)."""
    trimmed = bytearray(_mrc(_data(4096)))
    trimmed = trimmed[: trim_in_place(trimmed, len(trimmed))]
    for name, mrc in [*PACKETS, ("trimmed", bytes(trimmed))]:
        pkt = IPv6(_inner(mrc))
        assert MXH in pkt, name
        assert pkt[MXH].version == 1 and pkt[MXH].ev_index == int.from_bytes(
            mrc[_mxh_offset(mrc) + 2 : _mxh_offset(mrc) + 4], "big")
