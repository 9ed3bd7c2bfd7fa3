"""mrc.wire.samples: every frame is enveloped exactly as docs/design.md §3 says (outer uSID container, flow
label = EV, ECT(0), UDP sport from the EV, lengths that match the bytes, trimmed ones included) and
carries a correct ICRC, checked both with the parser's context and from the captured header bytes."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from mrc.wire import IcrcContext, MrcPacket, Nack, Opcode, Sack, parse
from mrc.wire.consts import DEFAULT_PAYLOAD, IPV6_LEN, PSN_MASK, ROCEV2_UDP_PORT, UDP_LEN, MxhFlag, NackCode
from mrc.wire.icrc import ev_sport, icrc_of_ipv6
from mrc.wire.ip import ECN_ECT0, ETH_LEN, Frame, split_ether
from mrc.wire.samples import HOST_A, HOST_B, ROUND, SPINES, container, sample_frames

USID_BLOCK = ipaddress.IPv6Network("fcbb:bbbb::/32")


def _decoded(count: int, seed: int = 0) -> list[tuple[bytes, Frame, MrcPacket]]:
    out = []
    for raw in sample_frames(count, seed):
        f = split_ether(raw)
        out.append((raw, f, parse(f.mrc, IcrcContext(f.inner.src, f.inner.dst), sport=f.sport)))
    return out


def _kind(p: MrcPacket) -> str:
    return f"{p.opcode_name}_TRIMMED" if p.trimmed else p.opcode_name


def test_rounds_hold_every_kind_in_order() -> None:
    rows = _decoded(3)
    assert len(rows) == 3 * len(ROUND)
    assert [_kind(p) for _, _, p in rows] == list(ROUND) * 3
    assert {p.opcode for _, _, p in rows} == set(Opcode)


def test_envelope_matches_design() -> None:
    for raw, f, p in _decoded(4):
        assert f.outer is not None
        # Outer: uSID container in F3216 (block fcbb:bbbb, 16-bit IDs), flow label = EV, ECT(0).
        dst = ipaddress.IPv6Address(f.outer.dst)
        assert dst in USID_BLOCK
        assert f.outer.flow_label == p.ev_index
        assert f.outer.ecn == ECN_ECT0
        assert f.outer.next_header == 41
        # Direction decides addresses and the container's node IDs.
        src_host, dst_host = (HOST_A, HOST_B) if f.inner.src == HOST_A.mrc_addr else (HOST_B, HOST_A)
        assert f.inner.dst == dst_host.mrc_addr and f.outer.src == src_host.port_addr
        assert f.outer.dst == container(src_host, SPINES[p.ev_index % len(SPINES)], dst_host)
        spine = SPINES[p.ev_index % len(SPINES)]
        ids = struct.unpack("!8H", f.outer.dst)
        assert ids == (0xFCBB, 0xBBBB, src_host.leaf, spine, dst_host.leaf, dst_host.node, 0, 0)
        # UDP: sport from the EV, 4791; every length agrees with the bytes present.
        assert f.sport == ev_sport(p.ev_index) and f.dport == ROCEV2_UDP_PORT
        assert f.inner.payload_len == UDP_LEN + len(f.mrc) == UDP_LEN + p.length
        assert f.outer.payload_len == IPV6_LEN + f.inner.payload_len
        assert len(raw) == ETH_LEN + IPV6_LEN + f.outer.payload_len


def test_icrc_ok_everywhere_but_trimmed_and_matches_header_bytes() -> None:
    for raw, _, p in _decoded(4, seed=7):
        if p.trimmed:
            assert p.icrc == "ignored"
            continue
        assert p.icrc == "ok"
        # Independent check: ICRC over the captured inner IPv6 bytes, masked as RoCEv2 says.
        inner = raw[ETH_LEN + IPV6_LEN :]
        assert struct.unpack("<I", inner[-4:])[0] == icrc_of_ipv6(inner)


def test_trimmed_write_keeps_headers_and_lengths() -> None:
    trimmed = [(f, p) for _, f, p in _decoded(3) if p.trimmed]
    assert len(trimmed) == 3
    for f, p in trimmed:
        assert p.opcode == Opcode.RDMA_WRITE_ONLY
        assert p.flags & MxhFlag.TRIMMED and p.flags & MxhFlag.PRIO
        assert len(f.mrc) == 52 and len(p.payload) == 0
        assert p.dma_len > 0  # RETH still says how much was lost


def test_first_round_psn_wrap_full_and_padded_payloads() -> None:
    rows = _decoded(1)
    data = [p for _, _, p in rows if p.is_data]
    assert [p.psn for p in data] == [PSN_MASK - 1, PSN_MASK, 0]
    write, _, write_imm = data
    assert write.dma_len == DEFAULT_PAYLOAD and write.pad == 0
    assert write_imm.dma_len % 4 != 0 and write_imm.pad == -write_imm.dma_len & 3
    assert write_imm.imm is not None and write_imm.flags & MxhFlag.LAST
    # One message: offsets add up, the last packet closes it.
    assert [p.msg_offset for p in data] == [0, data[0].dma_len, data[0].dma_len + data[1].dma_len]
    assert write_imm.msg_offset + write_imm.dma_len == write_imm.msg_len


def test_sack_and_nack_describe_the_trim() -> None:
    all_rows = _decoded(3)
    for r in range(3):
        rows = all_rows[r * len(ROUND) : (r + 1) * len(ROUND)]
        by = {_kind(p): p for _, _, p in rows}
        trimmed, nack, sack, write_imm = by["WRITE_TRIMMED"], by["NACK"], by["SACK"], by["WRITE_IMM"]
        assert isinstance(nack.body, Nack) and nack.body.code == NackCode.TRIMMED
        assert nack.psn == trimmed.psn and nack.body.echo_ev_index == trimmed.ev_index
        assert isinstance(sack.body, Sack) and sack.body.bitmap != 0
        assert sack.body.cum_psn == trimmed.psn
        assert sack.body.acked_psns() == [write_imm.psn]
        assert sack.body.echo_ev_index == write_imm.ev_index
        assert sack.body.bitmap_bits == 64 * (1 + r % 2)


def test_varied_and_deterministic() -> None:
    a = sample_frames(5, seed=1)
    assert a == sample_frames(5, seed=1)
    assert a != sample_frames(5, seed=2)
    rows = _decoded(5, seed=1)
    assert len({p.ev_index for _, _, p in rows}) > 10
    assert len({p.dma_len for _, _, p in rows if p.is_data}) > 3
    assert len({f.outer.dst for _, f, _ in rows if f.outer}) > 2


def test_count_bounds() -> None:
    assert sample_frames(0) == []
    with pytest.raises(ValueError):
        sample_frames(-1)
