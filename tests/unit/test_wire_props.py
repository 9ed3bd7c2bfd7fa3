"""Property and fuzz tests of the MRC wire format (docs/design.md §3: "a parser never trusts a length").

* build -> parse round trips for every packet type over the full field ranges (PSN and QPN 24 bits with
  the wrap neighbourhoods, EV index 14 bits, 32-bit message fields consistent with each other, 64-bit
  timestamps, payloads up to MAX_PAYLOAD, SACK bitmaps of 1..16 words, every NACK code and port state);
* random byte strings, mutations and every prefix of valid packets raise nothing but WireError, with a
  reason from REASONS;
* every single-bit flip of the ICRC-covered bytes (other than the masked BTH byte 4) is refused, and a
  flipped payload bit by the ICRC itself;
* trimmed packets parse as trimmed, empty, ICRC ignored;
* the IPv6/Ethernet envelope splitter refuses random and truncated frames with WireError only.

Sized to run in a few seconds on two cores: hypothesis example counts are set per test, deadlines off
(the first call of a payload size pays for allocations)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc.wire import (
    MAX_PAYLOAD,
    PSN_MASK,
    REASONS,
    IcrcContext,
    MrcPacket,
    MxhFlag,
    NackCode,
    PortState,
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
from mrc.wire.consts import EV_INDEX_MAX, QPN_MASK, SACK_MAX_WORDS
from mrc.wire.icrc import icrc_of_ipv6
from mrc.wire.ip import addr16, encap, ether, ipv6_udp, split_ether, split_ipv6

SRC = addr16("fd00:0:0:1::1")
DST = addr16("fd00:0:0:2::1")
CTX = IcrcContext(SRC, DST)
U32 = 2**32 - 1
U64 = 2**64 - 1

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_WRAP = [0, 1, 2, PSN_MASK - 2, PSN_MASK - 1, PSN_MASK]
psns = st.one_of(st.sampled_from(_WRAP), st.integers(0, PSN_MASK))
qpns = st.one_of(st.sampled_from([0, 1, QPN_MASK]), st.integers(0, QPN_MASK))
evs = st.one_of(st.sampled_from([0, 1, EV_INDEX_MAX]), st.integers(0, EV_INDEX_MAX))
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, U32)
u64 = st.integers(0, U64)
payload_sizes = st.one_of(
    st.integers(0, 16),
    st.sampled_from([4095, 4096, 4097, MAX_PAYLOAD - 3, MAX_PAYLOAD - 1, MAX_PAYLOAD]),
    st.integers(0, MAX_PAYLOAD),
)
#: MXH flags a sender may set on a full data packet (everything but TRIMMED; reserved bits included,
#: since they are carried and ignored).
data_flags = st.integers(0, 0xFF).map(lambda f: f & ~int(MxhFlag.TRIMMED))


def _reason_ok(e: WireError) -> None:
    assert e.reason in REASONS, e.reason
    assert isinstance(e, ValueError)


def _fresh() -> bytearray:
    return bytearray(MAX_PAYLOAD + 128)


# ---------------------------------------------------------------------------------- data packets


@st.composite
def data_args(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(payload_sizes)
    offset = draw(st.one_of(st.just(0), st.integers(0, U32 - n), st.just(U32 - n)))
    msg_len = draw(st.one_of(st.just(offset + n), st.integers(offset + n, U32), st.just(U32)))
    seed = draw(st.integers(0, 2**32))
    return dict(
        dqpn=draw(qpns), psn=draw(psns), ev_index=draw(evs), va=draw(u64), rkey=draw(u32),
        payload=random.Random(seed).randbytes(n), msn=draw(u32), msg_len=msg_len, msg_offset=offset,
        timestamp_ns=draw(u64), flags=draw(data_flags), ackreq=draw(st.booleans()),
        imm=draw(st.one_of(st.none(), u32)),
    )


def _build_data(args: dict[str, Any]) -> bytes:
    buf = _fresh()
    return bytes(buf[: build_write(buf, CTX, **args)])


@FAST
@given(data_args())
def test_data_round_trip(args: dict[str, Any]) -> None:
    pkt = _build_data(args)
    n = len(args["payload"])
    p = parse(pkt, CTX)
    assert p.icrc == "ok" and not p.trimmed and p.is_data
    assert p.opcode == (0x0A if args["imm"] is None else 0x0B)
    assert p.length == len(pkt) == header_len(p.opcode) + n + p.pad + 4
    assert (n + p.pad) % 4 == 0 and p.pad < 4
    assert bytes(p.payload) == args["payload"] and p.dma_len == n
    for field in ("dqpn", "psn", "ev_index", "va", "rkey", "msn", "msg_len", "msg_offset", "timestamp_ns",
                  "flags", "ackreq", "imm"):
        assert getattr(p, field) == args[field], field
    assert (p.pkey, p.fecn, p.becn, p.body) == (0xFFFF, False, False, None)
    # the ICRC is the RoCEv2 one over the enveloped packet (an independent path)
    inner = ipv6_udp(SRC, DST, ev_sport(args["ev_index"]), pkt)
    assert icrc_of_ipv6(inner) == int.from_bytes(pkt[-4:], "little")


@FAST
@given(data_args())
def test_trimmed_data_packets(args: dict[str, Any]) -> None:
    buf = bytearray(_build_data(args))
    n = trim_in_place(buf, len(buf))
    p = parse(buf[:n], CTX)
    assert p.trimmed and p.icrc == "ignored" and p.payload.nbytes == 0 and p.length == n
    assert p.flags == args["flags"] | MxhFlag.TRIMMED | MxhFlag.PRIO
    assert (p.psn, p.dqpn, p.dma_len, p.ev_index) == (args["psn"], args["dqpn"], len(args["payload"]),
                                                     args["ev_index"])
    assert parse(buf[:n]).icrc == "ignored"


# ------------------------------------------------------------------------------- control packets


@dataclass(frozen=True)
class Ctrl:
    name: str
    build: Callable[[bytearray], int]
    expect: dict[str, int]


def _sack(draw: st.DrawFn) -> Ctrl:
    words = draw(st.integers(1, SACK_MAX_WORDS))
    bits = 64 * words
    bitmap = draw(st.one_of(st.just(0), st.just((1 << bits) - 1), st.integers(0, (1 << bits) - 1)))
    kw = dict(cum_psn=draw(psns), echo_ev_index=draw(evs), echo_flags=draw(st.integers(0, 0xFF)),
              echo_timestamp_ns=draw(u64), service_time_ns=draw(u32), bitmap=bitmap)
    hdr = dict(dqpn=draw(qpns), psn=draw(psns), ev_index=draw(evs), timestamp_ns=draw(u64))
    return Ctrl("SACK", lambda b: build_sack(b, CTX, words=words, **hdr, **kw),
                {**hdr, **kw, "bitmap_bits": bits})


def _nack(draw: st.DrawFn) -> Ctrl:
    kw = dict(code=int(draw(st.sampled_from(NackCode))), echo_ev_index=draw(evs), cum_psn=draw(psns),
              echo_timestamp_ns=draw(u64))
    hdr = dict(dqpn=draw(qpns), psn=draw(psns), ev_index=draw(evs), timestamp_ns=draw(u64))
    return Ctrl("NACK", lambda b: build_nack(b, CTX, **hdr, **kw), {**hdr, **kw})


def _probe(draw: st.DrawFn) -> Ctrl:
    kw = dict(request_id=draw(u16), reply_qpn=draw(qpns))
    hdr = dict(dqpn=draw(qpns), ev_index=draw(evs), timestamp_ns=draw(u64))
    return Ctrl("PROBE", lambda b: build_probe(b, CTX, **hdr, **kw), {**hdr, **kw, "psn": 0})


def _probe_reply(draw: st.DrawFn) -> Ctrl:
    kw = dict(request_id=draw(u16), echo_ev_index=draw(evs), echo_timestamp_ns=draw(u64),
              service_time_ns=draw(u32), flags=draw(st.integers(0, 0xFF)))
    hdr = dict(dqpn=draw(qpns), ev_index=draw(evs), timestamp_ns=draw(u64))
    # MXH flags of a control packet are 0; the body's flags are the PROBE_REPLY flags
    return Ctrl("PROBE_REPLY", lambda b: build_probe_reply(b, CTX, **hdr, **kw), {**hdr, **kw, "psn": 0})


def _port_status(draw: st.DrawFn) -> Ctrl:
    kw = dict(request_id=draw(u16), port=draw(st.integers(0, 0xFF)),
              state=int(draw(st.sampled_from(PortState))), epoch=draw(u32))
    hdr = dict(dqpn=draw(qpns), ev_index=draw(evs), timestamp_ns=draw(u64))
    return Ctrl("PORT_STATUS", lambda b: build_port_status(b, CTX, **hdr, **kw), {**hdr, **kw, "psn": 0})


@st.composite
def controls(draw: st.DrawFn) -> Ctrl:
    make = draw(st.sampled_from([_sack, _nack, _probe, _probe_reply, _port_status]))
    return make(draw)


def _build_ctrl(c: Ctrl) -> bytes:
    buf = _fresh()
    return bytes(buf[: c.build(buf)])


_PACKET_FIELDS = {"dqpn", "psn", "ev_index", "timestamp_ns"}


def _check_control(p: MrcPacket, c: Ctrl) -> None:
    assert p.opcode_name == c.name and p.icrc == "ok" and not p.is_data and not p.trimmed
    assert (p.msn, p.msg_len, p.msg_offset, p.va, p.rkey, p.dma_len, p.pad) == (0, 0, 0, 0, 0, 0, 0)
    assert p.imm is None
    assert p.flags == 0 and p.payload.nbytes == 0
    for k, v in c.expect.items():
        assert getattr(p if k in _PACKET_FIELDS else p.body, k) == v, k


@FAST
@given(controls())
def test_control_round_trip(c: Ctrl) -> None:
    _check_control(parse(_build_ctrl(c), CTX), c)


def test_every_nack_code_and_port_state() -> None:
    buf = _fresh()
    for code in NackCode:
        n = build_nack(buf, CTX, dqpn=1, psn=2, ev_index=3, code=code, echo_ev_index=4, cum_psn=5)
        body = parse(buf[:n], CTX).body
        assert body is not None and body.code == code  # type: ignore[union-attr]
    for state in PortState:
        n = build_port_status(buf, CTX, dqpn=1, ev_index=3, request_id=1, port=2, state=state, epoch=9)
        body = parse(buf[:n], CTX).body
        assert body is not None and body.state == state  # type: ignore[union-attr]


def test_sack_every_word_count_all_ones() -> None:
    buf = _fresh()
    for words in range(1, SACK_MAX_WORDS + 1):
        bitmap = (1 << (64 * words)) - 1
        n = build_sack(buf, CTX, dqpn=1, psn=2, ev_index=3, cum_psn=PSN_MASK, echo_ev_index=4,
                       echo_timestamp_ns=U64, bitmap=bitmap, words=words)
        body = parse(buf[:n], CTX).body
        assert body is not None
        acked = body.acked_psns()  # type: ignore[union-attr]
        assert acked == [i & PSN_MASK for i in range(PSN_MASK + 1, PSN_MASK + 1 + 64 * words)]


# ------------------------------------------------------------------------ fuzz: only WireError


def _only_wire_errors(data: bytes | bytearray | memoryview, ctx: IcrcContext | None = CTX) -> object:
    try:
        return parse(data, ctx)
    except WireError as e:
        _reason_ok(e)
        return None


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=256))
def test_random_bytes_raise_only_wire_error(data: bytes) -> None:
    for ctx in (None, CTX):
        _only_wire_errors(data, ctx)
    _only_wire_errors(memoryview(bytearray(data)))


@st.composite
def plausible_garbage(draw: st.DrawFn) -> bytes:
    """Random bytes behind a real opcode and MXH version, so the fuzzing gets past the first checks."""
    op = draw(st.sampled_from([0x0A, 0x0B, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4]))
    size = draw(st.integers(0, 400))
    b = bytearray(random.Random(draw(st.integers(0, 2**32))).randbytes(size))
    if size:
        b[0] = op
    if size > 1 and draw(st.booleans()):
        b[1] &= 0xF0  # TVer 0
    mxh = {0x0A: 28, 0x0B: 32}.get(op, 12)
    if size > mxh and draw(st.booleans()):
        b[mxh] = 1  # MXH version
    return bytes(b)


@settings(max_examples=600, deadline=None)
@given(plausible_garbage())
def test_plausible_garbage_raises_only_wire_error(data: bytes) -> None:
    for ctx in (None, CTX):
        _only_wire_errors(data, ctx)


@st.composite
def any_packet(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        args = draw(data_args())
        args["payload"] = args["payload"][:300]
        args["msg_len"] = max(args["msg_len"], args["msg_offset"] + len(args["payload"]))
        args["msg_len"] = min(args["msg_len"], U32)
        if args["msg_offset"] + len(args["payload"]) > U32:
            args["msg_offset"] = 0
        return _build_data(args)
    return _build_ctrl(draw(controls()))


@SLOW
@given(any_packet(), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6))
def test_mutated_packets_raise_only_wire_error(pkt: bytes, edits: list[tuple[int, int]]) -> None:
    b = bytearray(pkt)
    for pos, val in edits:
        b[pos % len(b)] = val
    for ctx in (None, CTX):
        _only_wire_errors(b, ctx)


@SLOW
@given(any_packet())
def test_every_prefix_and_extension_is_refused(pkt: bytes) -> None:
    """A proper prefix of a (non-trimmed) packet never parses: the lengths in the headers disagree with
    the bytes present (with or without the ICRC check); nor does the packet with bytes appended."""
    for n in range(len(pkt)):
        for ctx in (None, CTX):
            try:
                parse(pkt[:n], ctx)
            except WireError as e:
                _reason_ok(e)
            else:
                raise AssertionError(f"prefix of {n}/{len(pkt)} bytes parsed")
    for extra in (b"\x00", b"\x00" * 4, b"\xff" * 8):
        try:
            parse(pkt + extra, CTX)
        except WireError as e:
            _reason_ok(e)
        else:
            raise AssertionError(f"packet + {len(extra)} bytes parsed")


def test_every_prefix_of_large_packets() -> None:
    for size in (4096, MAX_PAYLOAD):
        pkt = _build_data(dict(dqpn=1, psn=2, ev_index=3, va=4, rkey=5, payload=bytes(size), imm=7))
        for n in range(len(pkt)):
            try:
                parse(memoryview(pkt)[:n], CTX)
            except WireError as e:
                _reason_ok(e)
            else:
                raise AssertionError(f"prefix of {n} bytes parsed")


# --------------------------------------------------------------------------------- bit flips


def _flip_all_header_bits(pkt: bytes, covered_end: int) -> None:
    for byte in range(covered_end):
        if byte == 4:
            continue  # FECN/BECN/Resv6: masked out of the ICRC on purpose (tested below)
        for bit in range(8):
            b = bytearray(pkt)
            b[byte] ^= 1 << bit
            try:
                got = parse(b, CTX)
            except WireError as e:
                _reason_ok(e)
            else:
                # A flip can turn a data packet into a structurally valid *trimmed* one (e.g. opcode
                # 0x0A -> 0x0B shifts MXH by 4 bytes onto bytes whose flags have TRIMMED set). Trimmed
                # packets carry no ICRC by design, so the parser never claims them intact: receivers
                # only NACK them and the sender retransmits. What must never happen is "ok".
                assert got.trimmed and got.icrc == "ignored" and len(got.payload) == 0, (
                    f"flip of byte {byte} bit {bit} parsed as an intact packet"
                )


@SLOW
@given(controls())
def test_every_bit_flip_of_a_control_packet_is_refused(c: Ctrl) -> None:
    pkt = _build_ctrl(c)
    _flip_all_header_bits(pkt, len(pkt))  # ICRC bytes included


@SLOW
@given(data_args())
def test_every_header_bit_flip_of_a_data_packet_is_refused(args: dict[str, Any]) -> None:
    pkt = _build_data(args)
    _flip_all_header_bits(pkt, header_len(pkt[0]))
    # and each ICRC bit
    for bit in range(32):
        b = bytearray(pkt)
        b[len(b) - 4 + bit // 8] ^= 1 << (bit % 8)
        try:
            parse(b, CTX)
        except WireError as e:
            assert e.reason == "bad_icrc"
        else:
            raise AssertionError("ICRC bit flip parsed")


@FAST
@given(data_args().filter(lambda a: len(a["payload"]) > 0), st.data())
def test_flipped_payload_bit_fails_the_icrc(args: dict[str, Any], data: st.DataObject) -> None:
    pkt = bytearray(_build_data(args))
    start = header_len(pkt[0])
    byte = data.draw(st.integers(start, start + len(args["payload"]) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    pkt[byte] ^= 1 << bit
    try:
        parse(pkt, CTX)
    except WireError as e:
        assert e.reason == "bad_icrc"
    else:
        raise AssertionError("payload bit flip parsed")
    assert parse(pkt, CTX, verify=False).icrc == "bad"
    assert parse(pkt).icrc == "unchecked"  # without a context nothing can tell


@FAST
@given(st.one_of(data_args().map(_build_data), controls().map(_build_ctrl)), st.integers(0, 0xFF))
def test_masked_bth_byte_4_is_not_covered(pkt: bytes, value: int) -> None:
    b = bytearray(pkt)
    b[4] = value
    p = parse(b, CTX)
    assert p.icrc == "ok" and p.fecn == bool(value & 0x80) and p.becn == bool(value & 0x40)


# ------------------------------------------------------------------------------- envelopes


def _frame(mrc: bytes, ev: int, outer: bool) -> bytes:
    inner = ipv6_udp(SRC, DST, ev_sport(ev), mrc)
    pkt = encap(inner, addr16("fc00::1"), addr16("fcbb:bbbb:1:2:3:4::"), ev) if outer else inner
    return ether("02:00:00:00:00:02", "02:00:00:00:00:01", pkt)


@FAST
@given(any_packet(), evs, st.booleans(), st.binary(max_size=8))
def test_envelope_round_trip(mrc: bytes, ev: int, outer: bool, trailer: bytes) -> None:
    frame = _frame(mrc, ev, outer) + trailer  # Ethernet padding after the IP packet is ignored
    f = split_ether(frame)
    assert bytes(f.mrc) == mrc and f.sport == ev_sport(ev) and f.dport == 4791
    assert (f.inner.src, f.inner.dst) == (SRC, DST)
    assert (f.outer is not None) == outer
    if f.outer is not None:
        assert f.outer.flow_label == ev and f.outer.ecn == 2  # ECT(0)
    assert f.inner_offset == (54 if outer else 14)
    assert split_ipv6(frame, 14).mrc.tobytes() == mrc


@SLOW
@given(any_packet(), evs, st.booleans())
def test_truncated_frames_raise_only_wire_error(mrc: bytes, ev: int, outer: bool) -> None:
    frame = _frame(mrc, ev, outer)
    for n in range(len(frame)):
        try:
            split_ether(frame[:n])
        except WireError as e:
            _reason_ok(e)
        else:
            raise AssertionError(f"frame prefix of {n}/{len(frame)} bytes split")


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=200))
def test_random_frames_raise_only_wire_error(data: bytes) -> None:
    for fn in (split_ether, split_ipv6):
        try:
            fn(data)
        except WireError as e:
            _reason_ok(e)


@st.composite
def plausible_frames(draw: st.DrawFn) -> bytes:
    """Random frames with an IPv6 ethertype/version and a chosen next header, to get past the first
    checks into the outer/SRH/inner/UDP walk."""
    body = bytearray(random.Random(draw(st.integers(0, 2**32))).randbytes(draw(st.integers(0, 200))))
    if len(body) > 0:
        body[0] = 0x60 | (body[0] & 0x0F)
    if len(body) > 6:
        body[6] = draw(st.sampled_from([17, 41, 43, 6]))
    if len(body) > 4 and draw(st.booleans()):
        body[4:6] = (len(body) - 40).to_bytes(2, "big", signed=True)[-2:] if len(body) >= 40 else b"\x00\x08"
    return b"\x02" * 12 + b"\x86\xdd" + bytes(body)


@settings(max_examples=600, deadline=None)
@given(plausible_frames(), st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=4))
def test_plausible_frames_raise_only_wire_error(frame: bytes, edits: list[tuple[int, int]]) -> None:
    b = bytearray(frame)
    for pos, val in edits:
        if pos < len(b):
            b[pos] = val
    try:
        f = split_ether(b)
    except WireError as e:
        _reason_ok(e)
    else:
        assert f.dport == 4791 and len(f.mrc) == f.inner.payload_len - 8
