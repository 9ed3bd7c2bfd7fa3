"""Known-answer tests of the MRC wire format (docs/design.md §3, docs/wire.md): exact header bytes, the ICRC
recomputed independently from the RoCEv2 rules, PSN wrap, SACK bitmaps, and the rejection reason of
each kind of malformed packet."""

from __future__ import annotations

import struct
import zlib

import pytest

from mrc.wire import (
    MAX_PAYLOAD,
    REASONS,
    IcrcContext,
    MxhFlag,
    NackCode,
    Opcode,
    PortState,
    Sack,
    WireError,
    build_nack,
    build_port_status,
    build_probe,
    build_probe_reply,
    build_sack,
    build_write,
    ev_sport,
    header_len,
    parse,
    trim_in_place,
)
from mrc.wire.icrc import icrc_of_ipv6, read_icrc
from mrc.wire.ip import addr16, ipv6_udp

SRC = addr16("fd00:0:0:1::1")
DST = addr16("fd00:0:0:2::1")
CTX = IcrcContext(SRC, DST)


def _buf() -> bytearray:
    return bytearray(MAX_PAYLOAD + 128)


def _write(**kw: object) -> bytearray:
    args: dict[object, object] = dict(dqpn=0x123456, psn=0xABCDEF, ev_index=0x0102, va=0x1122334455667788,
                                      rkey=0xCAFEBABE, payload=b"\x01\x02\x03\x04\x05")
    args.update(kw)
    buf = _buf()
    n = build_write(buf, CTX, **args)  # type: ignore[arg-type]
    return buf[:n]


def _reference_icrc(mrc: bytes, sport: int, src: bytes = SRC, dst: bytes = DST) -> int:
    """The RoCEv2 ICRC written out from the rules (not from mrc.wire.icrc): 8 x 0xFF, IPv6 with TC, flow
    label and hop limit all ones, UDP with checksum 0xFFFF, BTH with byte 4 = 0xFF, the rest as is."""
    udp_len = 8 + len(mrc)
    ip = bytes([0x6F, 0xFF, 0xFF, 0xFF]) + struct.pack("!HBB", udp_len, 17, 0xFF) + src + dst
    udp = struct.pack("!HHHH", sport, 4791, udp_len, 0xFFFF)
    bth = bytearray(mrc[:12])
    bth[4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + ip + udp + bytes(bth) + bytes(mrc[12:-4]))


# ------------------------------------------------------------------------------------ exact bytes


def test_write_header_bytes_hand_checked() -> None:
    pkt = _write(ackreq=True, msn=0x0A0B0C0D, msg_len=0x1000, msg_offset=0x20,
                 timestamp_ns=0x0102030405060708, flags=MxhFlag.FIRST | MxhFlag.RETX)
    expected = bytes.fromhex(
        # BTH: opcode 0x0A | SE=0 M=0 PadCnt=3 TVer=0 | P_Key | FECN/BECN/Resv6 + DestQP | AckReq + PSN
        "0a" "30" "ffff" "00123456" "80abcdef"
        # RETH: VA | R_Key | DMA length 5
        "1122334455667788" "cafebabe" "00000005"
        # MXH: version 1 | flags RETX|FIRST | EV 0x0102 | MSN | msg length | msg offset | timestamp
        "01" "06" "0102" "0a0b0c0d" "00001000" "00000020" "0102030405060708"
        # payload, 3 pad bytes
        "0102030405" "000000"
    )
    assert len(pkt) == 52 + 5 + 3 + 4
    assert bytes(pkt[:-4]) == expected
    # ICRC: least significant byte first, computed with the EV's fabric source port 0xC000 | 0x0102
    crc = _reference_icrc(bytes(pkt), 0xC102)
    assert bytes(pkt[-4:]) == struct.pack("<I", crc)
    assert read_icrc(pkt) == struct.unpack(">I", struct.pack("<I", crc))[0]


def test_write_imm_layout() -> None:
    pkt = _write(imm=0xDEADBEEF, payload=b"abcd")
    assert pkt[0] == Opcode.RDMA_WRITE_ONLY_IMM and pkt[1] == 0  # 4-byte payload: no pad
    assert bytes(pkt[28:32]) == b"\xde\xad\xbe\xef"  # ImmDt right after RETH
    assert pkt[32] == 1  # then MXH version
    assert bytes(pkt[56:60]) == b"abcd" and len(pkt) == 64
    p = parse(pkt, CTX)
    assert p.imm == 0xDEADBEEF and p.icrc == "ok" and bytes(p.payload) == b"abcd"


def test_control_header_bytes() -> None:
    buf = _buf()
    n = build_nack(buf, CTX, dqpn=0x000102, psn=0x00FFFE, ev_index=9, code=NackCode.BAD_RKEY,
                   echo_ev_index=0x0203, cum_psn=0x123456, echo_timestamp_ns=0x1122334455667788,
                   timestamp_ns=7)
    assert n == 12 + 24 + 16 + 4
    assert bytes(buf[:n - 4]) == bytes.fromhex(
        "c1" "00" "ffff" "00000102" "0000fffe"  # BTH (no AckReq, no pad)
        "01" "00" "0009" "00000000" "00000000" "00000000" "0000000000000007"  # MXH
        "03" "00" "0203" "00123456" "1122334455667788"  # NACK body
    )
    assert bytes(buf[n - 4 : n]) == struct.pack("<I", _reference_icrc(bytes(buf[:n]), ev_sport(9)))


def test_icrc_matches_whole_packet_recomputation() -> None:
    pkt = bytes(_write(payload=bytes(range(256)) * 16))
    inner = ipv6_udp(SRC, DST, ev_sport(0x0102), pkt, traffic_class=0x03, flow_label=0xABCDE, hop_limit=3)
    # traffic class, flow label and hop limit are masked: the packet's own values do not matter
    assert icrc_of_ipv6(inner) == struct.unpack("<I", pkt[-4:])[0]


def test_header_len() -> None:
    assert header_len(Opcode.RDMA_WRITE_ONLY) == 52
    assert header_len(Opcode.RDMA_WRITE_ONLY_IMM) == 56
    assert {header_len(op) for op in (0xC0, 0xC1, 0xC2, 0xC3, 0xC4)} == {36}
    with pytest.raises(WireError) as e:
        header_len(0x04)
    assert e.value.reason == "bad_opcode"


# ------------------------------------------------------------------------------ PSN, SACK, sport


@pytest.mark.parametrize(
    ("psn", "wire"), [(0, 0), (0xFFFFFF, 0xFFFFFF), (0x1000000, 0), (0x1000001, 1), (-1, 0xFFFFFF)]
)
def test_psn_wraps_at_2_24(psn: int, wire: int) -> None:
    p = parse(_write(psn=psn), CTX)
    assert p.psn == wire and p.icrc == "ok"


def test_sack_acked_psns_across_the_wrap() -> None:
    buf = _buf()
    bitmap = 0b1011 | (1 << 63) | (1 << 64) | (1 << 1023)
    n = build_sack(buf, CTX, dqpn=1, psn=5, ev_index=2, cum_psn=0xFFFFFE, echo_ev_index=3,
                   echo_timestamp_ns=4, bitmap=bitmap, words=16, echo_flags=1, service_time_ns=6)
    p = parse(buf[:n], CTX)
    body = p.body
    assert isinstance(body, Sack)
    assert body.cum_psn == 0xFFFFFE and body.bitmap_bits == 1024 and body.bitmap == bitmap
    # bit i <=> PSN cum + 1 + i (mod 2^24): 0xFFFFFF, 0, 2, then 62, 63 and 1023 past the wrap
    assert body.acked_psns() == [0xFFFFFF, 0x000000, 0x000002, 62, 63, 1022]
    assert (body.echo_ev_index, body.echo_flags, body.echo_timestamp_ns, body.service_time_ns) == (3, 1, 4, 6)


def test_sack_bitmap_byte_order() -> None:
    buf = _buf()
    n = build_sack(buf, CTX, dqpn=1, psn=5, ev_index=2, cum_psn=10, echo_ev_index=3, echo_timestamp_ns=4,
                   bitmap=0x0102, words=1)
    # bit i is byte i//8, bit i%8, least significant first
    assert bytes(buf[36 + 20 : n - 4]) == bytes([0x02, 0x01, 0, 0, 0, 0, 0, 0])


def test_sack_bitmap_must_fit() -> None:
    with pytest.raises(ValueError):
        build_sack(_buf(), CTX, dqpn=1, psn=1, ev_index=1, cum_psn=1, echo_ev_index=1, echo_timestamp_ns=1,
                   bitmap=1 << 64, words=1)
    with pytest.raises(ValueError):
        build_sack(_buf(), CTX, dqpn=1, psn=1, ev_index=1, cum_psn=1, echo_ev_index=1, echo_timestamp_ns=1,
                   words=17)


def test_ev_sport() -> None:
    assert ev_sport(0) == 0xC000
    assert ev_sport(0x3FFF) == 0xFFFF
    assert ev_sport(0x4000) == 0xC000  # 14 bits
    assert ev_sport(77) == 0xC000 | 77


def test_icrc_covers_the_source_port() -> None:
    pkt = _write(ev_index=77)
    assert parse(pkt, CTX).icrc == "ok"  # default: the EV's fabric port
    assert parse(pkt, CTX, sport=ev_sport(77)).icrc == "ok"
    with pytest.raises(WireError) as e:
        parse(pkt, CTX, sport=ev_sport(78))
    assert e.value.reason == "bad_icrc"
    assert parse(pkt, CTX, sport=1234, verify=False).icrc == "bad"
    assert parse(pkt).icrc == "unchecked"
    # built for an explicit port, it checks with that port only
    other = _write(ev_index=77, sport=40000)
    assert parse(other, CTX, sport=40000).icrc == "ok"
    assert parse(other, CTX, verify=False).icrc == "bad"


def test_icrc_covers_the_addresses_and_context_changes_take_effect() -> None:
    pkt = _write()
    ctx = IcrcContext(SRC, DST)
    assert parse(pkt, ctx).icrc == "ok"
    ctx.src = DST  # the cached pseudo-header CRC must not survive a change of address
    assert parse(pkt, ctx, verify=False).icrc == "bad"
    ctx.src = SRC
    assert parse(pkt, ctx).icrc == "ok"
    ctx.dport = 4792
    assert parse(pkt, ctx, verify=False).icrc == "bad"
    with pytest.raises(ValueError):
        IcrcContext(SRC[:4], DST)


def test_masked_bth_byte_is_not_covered() -> None:
    pkt = _write()
    pkt[4] |= 0xC0  # FECN + BECN, as a switch may set them
    p = parse(pkt, CTX)
    assert p.icrc == "ok" and p.fecn and p.becn and p.dqpn == 0x123456


def test_parse_accepts_every_buffer_type_and_payload_is_zero_copy() -> None:
    pkt = _write(payload=b"payload!")
    for data in (bytes(pkt), pkt, memoryview(pkt), memoryview(bytes(pkt)).cast("B", (len(pkt),))):
        p = parse(data, CTX)
        assert bytes(p.payload) == b"payload!" and p.length == len(pkt)
    p = parse(pkt, CTX)
    pkt[52] = ord("P")
    assert bytes(p.payload) == b"Payload!"  # a view into the caller's buffer


def test_control_packets_round_trip() -> None:
    buf = _buf()
    n = build_probe(buf, CTX, dqpn=0x10, ev_index=5, request_id=0xBEEF, reply_qpn=0x1ABCDEF, timestamp_ns=9)
    p = parse(buf[:n], CTX)
    assert p.opcode_name == "PROBE" and p.body is not None and p.body.reply_qpn == 0xABCDEF  # type: ignore[union-attr]
    n = build_probe_reply(buf, CTX, dqpn=0x10, ev_index=5, request_id=0xBEEF, echo_ev_index=6,
                          echo_timestamp_ns=9, service_time_ns=10, flags=1)
    assert parse(buf[:n], CTX).opcode_name == "PROBE_REPLY"
    n = build_port_status(buf, CTX, dqpn=0x10, ev_index=5, request_id=1, port=3, state=PortState.DOWN,
                          epoch=7)
    p = parse(buf[:n], CTX)
    assert p.opcode_name == "PORT_STATUS" and not p.is_data and p.payload.nbytes == 0


# ----------------------------------------------------------------------------------- trimming


def test_trim_in_place_and_parse() -> None:
    pkt = _write(payload=bytes(4096), msg_len=8192)
    n = trim_in_place(pkt, len(pkt))
    assert n == 52
    p = parse(pkt[:n], CTX)
    assert p.trimmed and p.icrc == "ignored" and p.payload.nbytes == 0
    assert p.dma_len == 4096  # RETH still says what was lost
    assert p.flags & MxhFlag.PRIO


def test_trim_rejects_control_and_short_packets() -> None:
    buf = _buf()
    n = build_probe(buf, CTX, dqpn=1, ev_index=1, request_id=1, reply_qpn=1, timestamp_ns=1)
    with pytest.raises(WireError) as e:
        trim_in_place(buf, n)
    assert e.value.reason == "bad_opcode"
    with pytest.raises(WireError) as e:
        trim_in_place(_write(), 40)
    assert e.value.reason == "truncated"


# ------------------------------------------------------------------------------- rejections


def _reason(data: bytes | bytearray, ctx: IcrcContext | None = CTX) -> str:
    with pytest.raises(WireError) as e:
        parse(data, ctx)
    assert e.value.reason in REASONS
    return e.value.reason


def test_bad_opcode() -> None:
    pkt = _write()
    for op in (0x00, 0x04, 0x0C, 0x11, 0x81, 0xBF, 0xC5, 0xFF):
        pkt[0] = op
        assert _reason(pkt) == "bad_opcode"


def test_bad_mxh_version() -> None:
    for version in (0, 2, 0xFF):
        pkt = _write()
        pkt[52 - 24] = version
        assert _reason(pkt) == "bad_version"


def test_tver_nonzero() -> None:
    pkt = _write()
    pkt[1] |= 0x01
    assert _reason(pkt) == "bad_field"


def test_dma_length_mismatch() -> None:
    pkt = _write(payload=bytes(100))
    struct.pack_into("!I", pkt, 12 + 12, 104)  # says 4 bytes more than present
    assert _reason(pkt) == "truncated"
    struct.pack_into("!I", pkt, 12 + 12, 96)  # says 4 bytes fewer
    assert _reason(pkt) == "bad_length"
    struct.pack_into("!I", pkt, 12 + 12, 99)  # not a multiple of 4 with PadCnt 0
    assert _reason(pkt) == "bad_length"
    struct.pack_into("!I", pkt, 12 + 12, MAX_PAYLOAD + 4)
    assert _reason(pkt) == "bad_length"


def test_offset_beyond_message_length() -> None:
    assert _reason(_write(payload=bytes(8), msg_offset=100, msg_len=107)) == "bad_length"
    assert parse(_write(payload=bytes(8), msg_offset=100, msg_len=108), CTX).msg_len == 108


def test_control_packet_with_trimmed_flag() -> None:
    buf = _buf()
    n = build_probe(buf, CTX, dqpn=1, ev_index=1, request_id=1, reply_qpn=1, timestamp_ns=1)
    buf[12 + 1] |= MxhFlag.TRIMMED
    assert _reason(buf[:n]) == "bad_field"


def test_control_packet_with_padcnt() -> None:
    buf = _buf()
    n = build_probe(buf, CTX, dqpn=1, ev_index=1, request_id=1, reply_qpn=1, timestamp_ns=1)
    buf[1] |= 0x10
    assert _reason(buf[:n]) == "bad_field"


def test_unknown_nack_code() -> None:
    buf = _buf()
    for code in (0, 8, 0xFF):
        n = build_nack(buf, CTX, dqpn=1, psn=1, ev_index=1, code=code, echo_ev_index=1, cum_psn=1)
        assert _reason(buf[:n]) == "bad_field"  # the ICRC is good: the code itself is refused


def test_unknown_port_state() -> None:
    buf = _buf()
    n = build_port_status(buf, CTX, dqpn=1, ev_index=1, request_id=1, port=1, state=2, epoch=1)
    assert _reason(buf[:n]) == "bad_field"


def test_sack_bad_word_count() -> None:
    buf = _buf()
    n = build_sack(buf, CTX, dqpn=1, psn=1, ev_index=1, cum_psn=1, echo_ev_index=1, echo_timestamp_ns=1,
                   words=2)
    for words in (0, 1, 3, 17):
        buf[36 + 7] = words
        CTX.write(buf, n - 4, ev_sport(1))  # a well-formed ICRC over the bad count
        assert _reason(buf[:n]) == "bad_length"


def test_trimmed_packet_with_bytes_after_mxh() -> None:
    """A trimmed packet ends right after MXH; its ICRC is not checked, so one with more bytes (e.g. a
    full packet whose TRIMMED bit flipped in flight) must be refused by length."""
    pkt = _write(payload=bytes(64))
    pkt[52 - 24 + 1] |= MxhFlag.TRIMMED
    assert _reason(pkt) == "bad_length"
    assert _reason(pkt[:53]) == "bad_length"


def test_oversized_control_packet_is_refused_by_length() -> None:
    buf = bytearray(70_000)
    build_probe(buf, CTX, dqpn=1, ev_index=1, request_id=1, reply_qpn=1, timestamp_ns=1)
    assert _reason(buf) == "bad_length"  # not a struct.error from the ICRC's 16-bit UDP length
    assert _reason(buf[:200]) == "bad_length"


@pytest.mark.parametrize("n", [0, 1, 11, 12, 35, 51, 55])
def test_truncated(n: int) -> None:
    assert _reason(_write(imm=1)[:n]) == "truncated"


def test_control_without_icrc() -> None:
    buf = _buf()
    build_probe(buf, CTX, dqpn=1, ev_index=1, request_id=1, reply_qpn=1, timestamp_ns=1)
    assert _reason(buf[:38]) == "truncated"
    # body without ICRC: read as a 4-byte body + ICRC. The ICRC is checked first, so with a context
    # that is what fails; without one, the body length does.
    assert _reason(buf[:36 + 8]) == "bad_icrc"
    assert _reason(buf[:36 + 8], None) == "truncated"


def test_build_refuses_oversized_payload() -> None:
    with pytest.raises(ValueError):
        build_write(bytearray(MAX_PAYLOAD + 100), CTX, dqpn=1, psn=1, ev_index=1, va=0, rkey=0,
                    payload=bytes(MAX_PAYLOAD + 1))


def test_opcode_names() -> None:
    assert parse(_write(), CTX).opcode_name == "WRITE"
    assert parse(_write(imm=1), CTX).opcode_name == "WRITE_IMM"
