"""The hot paths added for simulator speed compute exactly what the general code computes: the
positional packet builder gives `build_write`'s bytes, the WRITE receive parser accepts exactly the
packets `parse` accepts with a good ICRC (same fields) and declines everything else, the cached ICRC
head gives `compute`'s value, and the event loop pops events in (time, sequence) order."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mrc import topology
from mrc.sim.fabric import Fabric, FabricParams
from mrc.wire import IcrcContext, MxhFlag, WireError, build_write, parse, trim_in_place
from mrc.wire.crc import crc32
from mrc.wire.icrc import CRC32_RESIDUE
from mrc.wire.ip import addr16
from mrc.wire.packet import parse_write, write_packet

SRC = addr16("fd00:0:0:1::1")
DST = addr16("fd00:0:0:2::1")

_FIELDS = ("psn", "ackreq", "va", "rkey", "dma_len", "imm", "flags", "ev_index", "msn", "msg_len",
           "timestamp_ns")


def _packet(rng: random.Random, ctx: IcrcContext) -> tuple[bytearray, dict[str, Any]]:
    n = rng.choice([0, 1, 2, 3, 4, 5, 100, 1023, 4096, 8192])
    off = rng.randrange(0, 1 << 20)
    kw: dict[str, Any] = dict(
        dqpn=rng.randrange(1 << 24), psn=rng.randrange(1 << 24), ev_index=rng.randrange(1 << 14),
        va=rng.randrange(1 << 64), rkey=rng.randrange(1 << 32), payload=rng.randbytes(n),
        msn=rng.randrange(1 << 32), msg_len=off + n + rng.randrange(3), msg_offset=off,
        timestamp_ns=rng.randrange(1 << 64), flags=rng.choice([0, 0x01, 0x02, 0x04, 0x0C, 0x10, 0x21]),
        ackreq=rng.random() < 0.5, imm=rng.choice([None, rng.randrange(1 << 32)]),
    )
    return bytearray(write_packet(ctx, *kw.values())), kw


def test_write_packet_matches_build_write() -> None:
    rng = random.Random(5)
    ctx = IcrcContext(SRC, DST)
    for _ in range(300):
        pkt, kw = _packet(rng, ctx)
        n = len(kw["payload"])
        ref = bytearray(56 + n + (-n & 3) + 4)
        kw["psn"] &= 0xFFFFFF
        end = build_write(ref, IcrcContext(SRC, DST), **kw)
        assert pkt == ref[:end]


def _agree(data: bytearray, ctx: IcrcContext) -> None:
    fast = parse_write(bytes(data), ctx)
    assert parse_write(data, ctx) == fast  # bytes or bytearray alike
    try:
        p = parse(data, ctx)
    except WireError:
        assert fast is None
        return
    if p.opcode not in (0x0A, 0x0B) or p.trimmed or data[4]:  # FECN/BECN/Resv6 set: left to parse
        assert fast is None
        return
    assert fast is not None
    assert fast[:-1] == tuple(getattr(p, f) for f in _FIELDS)
    assert bytes(fast[-1]) == bytes(p.payload)


def test_parse_write_agrees_with_parse_on_good_and_damaged_packets() -> None:
    rng = random.Random(7)
    ctx = IcrcContext(SRC, DST)
    for _ in range(400):
        pkt, _ = _packet(rng, ctx)
        _agree(pkt, ctx)
        # one flipped byte, one flipped bit anywhere (header, payload, ICRC), a wrong length, a trim
        for _ in range(3):
            bad = bytearray(pkt)
            bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
            _agree(bad, ctx)
            bad = bytearray(pkt)
            bad[rng.randrange(len(bad))] = rng.randrange(256)
            _agree(bad, ctx)
        _agree(pkt[:-1], ctx)
        _agree(pkt + b"\x00\x00\x00\x00", ctx)
        t = bytearray(pkt)
        n = trim_in_place(t, len(t))
        _agree(t[:n], ctx)
    # another peer's packet (other addresses): the ICRC does not match
    other = IcrcContext(DST, SRC)
    pkt = write_packet(ctx, 1, 2, 3, 4, 5, bytes(64), 0, 64, 0, 9, 0, True, None)
    assert parse_write(pkt, ctx) is not None
    assert parse_write(pkt, other) is None
    with pytest.raises(WireError) as e:
        parse(pkt, other)
    assert e.value.reason == "bad_icrc"


def test_icrc_head_cache_matches_compute() -> None:
    rng = random.Random(3)
    ctx = IcrcContext(SRC, DST)
    for _ in range(200):
        data = bytearray(rng.randbytes(rng.randrange(12, 300)))
        end = len(data)
        sport = rng.randrange(1 << 16)
        w0 = int.from_bytes(data[:4], "big")
        assert ctx.compute_w0(memoryview(data), end, sport, w0) == ctx.compute(data, end, sport)
    # changing the envelope drops the cached heads
    data = bytearray(rng.randbytes(64))
    w0 = int.from_bytes(data[:4], "big")
    before = ctx.compute_w0(memoryview(data), 64, 0xC001, w0)
    ctx.dst = SRC
    assert ctx.compute_w0(memoryview(data), 64, 0xC001, w0) == ctx.compute(data, 64, 0xC001) != before


def test_icrc_start_value_matches_compute() -> None:
    rng = random.Random(4)
    ctx = IcrcContext(SRC, DST)
    for _ in range(300):
        data = bytearray(rng.randbytes(rng.randrange(12, 300)))
        data[4] = 0  # BTH byte 4 as an endpoint sends it
        end = len(data)
        sport = rng.randrange(1 << 16)
        v = ctx.start(end, sport)
        icrc = ctx.compute(data, end, sport)
        assert crc32(data, v) == icrc
        pkt = data + icrc.to_bytes(4, "little")
        assert crc32(pkt, v) == CRC32_RESIDUE
        pkt[rng.randrange(len(pkt))] ^= 1 << rng.randrange(8)
        assert crc32(pkt, v) != CRC32_RESIDUE
    # changing the envelope drops the cached start values
    before = ctx.start(64, 0xC001)
    ctx.dport = 4792
    data = bytearray(64)
    assert ctx.start(64, 0xC001) != before
    assert crc32(data, ctx.start(64, 0xC001)) == ctx.compute(data, 64, 0xC001)


def test_trimmed_flag_only_through_parse() -> None:
    ctx = IcrcContext(SRC, DST)
    pkt = write_packet(ctx, 1, 2, 3, 4, 5, bytes(64), 0, 64, 0, 9, int(MxhFlag.FIRST), False, None)
    n = trim_in_place(pkt, len(pkt))
    assert parse_write(pkt[:n], ctx) is None
    assert parse(pkt[:n], ctx).trimmed


def test_events_run_in_exactly_time_then_push_order() -> None:
    """The loop's order against the (time, push) sort: a bucket is sorted by time alone, stably, relying
    on its events being in push order; many ties, and pushes from inside the loop into every bucket."""
    fab = Fabric(topology.generate(1, 1, 1, 2), FabricParams(delay_ns=0))
    rng = random.Random(12)
    pushed: list[tuple[int, int]] = []
    ran: list[tuple[int, int]] = []

    def push(t: int) -> None:
        k = len(pushed)
        pushed.append((t, k))

        def f(now: int) -> None:
            ran.append((now, k))
            if k < 3000:
                for _ in range(rng.randrange(3)):
                    push(now + rng.choice([0, 1, 2, 31, 32, 40, 64, 65, 200]))

        fab.at(t, f)

    for _ in range(500):
        push(rng.randrange(0, 400))
    fab.run()
    assert len(ran) == len(pushed) > 3000
    assert ran == sorted(pushed)


def test_calls_run_in_time_then_push_order_including_same_bucket_insertions() -> None:
    topo = topology.generate(1, 1, 1, 2)
    fab = Fabric(topo, FabricParams(delay_ns=0))
    order: list[tuple[int, int]] = []
    rng = random.Random(11)

    def mk(i: int) -> Any:
        def f(t: int) -> None:
            order.append((t, i))
            if i < 200:  # events scheduled from inside the loop, some in the current 32 ns bucket
                fab.at(t + rng.choice([0, 1, 5, 31, 32, 33, 100, 1000]), mk(1000 + i))

        return f

    for i in range(200):
        fab.at(rng.randrange(0, 2000), mk(i))
    fab.run()
    times = [t for t, _ in order]
    assert times == sorted(times) and len(order) == 400
    # ties run in push order: a call pushed later at the same time runs later
    seen: dict[int, list[int]] = {}
    for t, i in order:
        seen.setdefault(t, []).append(i)
    for t, ids in seen.items():
        assert [i for i in ids if i < 1000] == sorted(i for i in ids if i < 1000), t
