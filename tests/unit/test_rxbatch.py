"""`Context.receive_batch` (mrc/transport/rxbatch.py) against `Context.receive` one datagram at a time.

Two runs of the same seeded scenario, identical but for how the responder B takes its datagrams: one by
one, or in batches through the compiled kernel. A sends WRITEs (with and without immediate, several
messages in flight); the channel toward B loses, reorders, duplicates and corrupts packets and mixes in
stray ones (unknown QPN, truncated, a foreign source, ECN-CE marks); B's SACKs go back to A. After every
batch the two runs must agree on every datagram B sends, on B's QP state and counters, and at the end
on every byte placed. The kernel must also have taken most of the data packets (else the comparison
says nothing about it)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from mrc.transport import Context, QpAttr, QueuePair, rxbatch

GA = bytes.fromhex("fd000000000000000000000000000001")
GB = bytes.fromhex("fd000000000000000000000000000002")
GX = bytes.fromhex("fd0000000000000000000000000000ee")
SLOT = 9216

pytestmark = pytest.mark.skipif(not rxbatch.AVAILABLE, reason="python-isal without crc32_gzip_refl")

#: the kernels this machine can run: every scenario goes through each (they must agree with one-by-one,
#: and so with each other)
KERNELS = [k for k, ok in (("c", rxbatch._c_kernel_ok()), ("numba", rxbatch.NUMBA_OK)) if ok]


@pytest.fixture(autouse=True, params=KERNELS)
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The batch receivers made in the test take this kernel, for every batch, however small."""
    monkeypatch.setattr(rxbatch, "KERNEL", request.param)
    monkeypatch.setattr(rxbatch, "MIN_BATCH", 1)
    return str(request.param)


def _state(qp: QueuePair, ctx: Context) -> dict[str, Any]:
    return {
        "rcv_cum": qp.rcv_cum, "rbits": qp.rbits, "rx_packets": qp.rx_packets, "rx_bytes": qp.rx_bytes,
        "unacked": qp.unacked, "ack_coalesce": qp.ack_coalesce, "ack_deadline": qp.ack_deadline,
        "last_rx": qp.last_rx if qp.unacked else None, "msgs": {k: list(v) for k, v in qp.msgs.items()},
        "c": dict(qp.c), "drops": dict(ctx.drops), "recv_cq": len(qp.recv_cq),
    }


def _scenario(batched: bool, seed: int, mtu: int) -> tuple[list[Any], np.ndarray, Any]:
    rng = random.Random(seed)
    attr = QpAttr(mtu=mtu)
    a = Context(GA, ports=4, seed=1)
    b = Context(GB, ports=4, seed=2)
    qa = a.create_qp(a.create_cq(), ev_profile=a.create_ev_profile(count=32), attr=attr)
    qb = b.create_qp(b.create_cq(), ev_profile=b.create_ev_profile(count=32), attr=attr)
    qa.connect(GB, qb.qpn)
    qb.connect(GA, qa.qpn)
    src = np.frombuffer(np.random.default_rng(seed).bytes(2 << 20), dtype=np.uint8).copy()
    dst = np.zeros(2 << 20, dtype=np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    for i in range(24):
        qb.post_recv(100 + i)
    off = 0
    wr = 0
    while off < len(src):
        n = min(len(src) - off, rng.choice((mtu * 40 + 17, mtu * 7, 3 * mtu + 5, 96 << 10)))
        wr += 1
        qa.post_send(wr, smr, off, n, dmr.addr + off, dmr.rkey, imm=wr if wr % 3 == 0 else None)
        off += n
    trace: list[Any] = []
    data = np.zeros((64, SLOT), dtype=np.uint8)
    now = 1_000
    held: list[tuple[bytes, int, bool, bytes]] = []
    for _ in range(4000):
        for dg in a.datagrams_to_send(now):
            pkt = bytes(dg.data)
            r = rng.random()
            if r < 0.02:
                continue  # lost
            if r < 0.03:  # corrupted: bad ICRC, in an EV bit (a header check refuses it first) or the payload
                i = 30 if r < 0.025 else len(pkt) - 9
                pkt = pkt[:i] + bytes([pkt[i] ^ 0x40]) + pkt[i + 1 :]
            held.append((pkt, dg.port, rng.random() < 0.03, GA))
            if r > 0.99:
                held.append((pkt, dg.port, False, GA))  # duplicated
        if rng.random() < 0.05:
            held.append((bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80))), 0, False, GA))
        if held and rng.random() < 0.05:
            p0 = held[rng.randrange(len(held))][0]
            held.append((p0, 1, False, GX))  # a foreign source
        # deliver a reordered prefix of what is held, in batches of up to 64
        rng.shuffle(held) if rng.random() < 0.3 else None
        take, held = held[: rng.randrange(0, 80)], held[80:] if len(held) > 80 else []
        for i in range(0, len(take), 64):
            chunk = take[i : i + 64]
            if batched:
                k = len(chunk)
                lens = np.zeros(k, dtype=np.int64)
                ecn = np.zeros(k, dtype=np.bool_)
                ports = np.zeros(k, dtype=np.int64)
                srcs = np.zeros((k, 16), dtype=np.uint8)
                for j, (pkt, port, ce, s) in enumerate(chunk):
                    data[j, : len(pkt)] = np.frombuffer(pkt, dtype=np.uint8)
                    lens[j], ecn[j], ports[j] = len(pkt), ce, port
                    srcs[j] = np.frombuffer(s, dtype=np.uint8)
                b.receive_batch(data[:k], lens, ecn, ports, srcs, now)
            else:
                for pkt, port, ce, s in chunk:
                    b.receive(pkt, now, ce, port, s)
            out = [bytes(dg.data) for dg in b.datagrams_to_send(now)]
            trace.append((now, out, _state(qb, b)))
            for pkt in out:
                if rng.random() > 0.02:
                    a.receive(pkt, now, False, 0, GB)
        for ctx in (a, b):
            d = ctx.next_deadline()
            if d is not None and d <= now:
                ctx.handle_timer(now)
        for pkt in [bytes(dg.data) for dg in b.datagrams_to_send(now)]:
            a.receive(pkt, now, False, 0, GB)
        now += rng.randrange(1_000, 30_000)
        if not a.qps[qa.qpn].busy and not held:
            break
    return trace, dst, b._batch_rx


@pytest.mark.parametrize(("seed", "mtu"), [(1, 4096), (2, 8192), (3, 1024)])
def test_batches_give_what_one_by_one_gives(seed: int, mtu: int, kernel: str) -> None:
    one, dst_one, _ = _scenario(False, seed, mtu)
    bat, dst_bat, rx = _scenario(True, seed, mtu)
    assert len(one) == len(bat)
    for i, (x, y) in enumerate(zip(one, bat, strict=True)):
        assert x[0] == y[0]
        assert x[1] == y[1], f"batch {i}: the datagrams B sent differ"
        assert x[2] == y[2], f"batch {i}: B's state differs"
    assert np.array_equal(dst_one, dst_bat)
    final = one[-1][2]
    assert final["c"]["imm_rx"] > 0 and final["drops"]  # messages completed; strays counted
    assert rx is not None and rx.taken > final["rx_packets"] // 2  # the kernel took most data packets
    assert rx.kernel == kernel


def test_the_switch_keeps_the_one_by_one_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rxbatch, "ENABLED", False)
    one, dst_one, _ = _scenario(False, 4, 4096)
    bat, dst_bat, rx = _scenario(True, 4, 4096)
    assert [t[1:] for t in one] == [t[1:] for t in bat] and np.array_equal(dst_one, dst_bat)
    assert rx is not None and rx.taken == 0 and rx.calls == 0


def test_a_batch_below_the_threshold_goes_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below `MIN_BATCH` datagrams the kernel costs more than it saves: the batch goes one by one (the
    same results), from `MIN_BATCH` on through the kernel."""
    monkeypatch.setattr(rxbatch, "MIN_BATCH", 8)
    b, qb, dst, mr = _responder()
    pkts = _render([(0, None, i) for i in range(7 + 8)], qb, mr, mr.rkey)
    slots = np.zeros((len(pkts), SLOT), dtype=np.uint8)
    for j, (pkt, _ce, _src) in enumerate(pkts):
        slots[j, : len(pkt)] = np.frombuffer(pkt, dtype=np.uint8)
    lens = np.array([len(x[0]) for x in pkts], dtype=np.int64)
    z, ones = np.zeros(len(pkts), np.bool_), np.ones(len(pkts), dtype=np.int64)
    b.receive_batch(slots[:7], lens[:7], z[:7], ones[:7], None, 5_000)
    rx = b._batch_rx
    assert rx is not None and rx.calls == 0 and qb.rx_packets == 7
    b.receive_batch(slots[7:], lens[7:], z[7:], ones[7:], None, 5_000)
    assert rx.calls > 0 and rx.taken > 0 and qb.rx_packets == 15
    assert qb.rcv_cum == 15
    assert np.array_equal(dst[: 15 * 4096], np.repeat(np.arange(15, dtype=np.uint8), 4096))


def test_isal_crc_through_ctypes_is_zlibs() -> None:
    import ctypes
    import zlib

    buf = (ctypes.c_char * 9000).from_buffer_copy(np.random.default_rng(5).bytes(9000))
    for init in (0, 1, 0x2144DF1C, 0xFFFFFFFF):
        for off, n in ((0, 9000), (7, 4100), (52, 8192)):
            want = zlib.crc32(bytes(buf)[off : off + n], init)
            assert rxbatch._CRC(init, ctypes.addressof(buf) + off, n) == want


# ---------------------------------------------------------------- hostile headers with a valid ICRC

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mrc.wire.consts import MxhFlag  # noqa: E402
from mrc.wire.packet import build_write  # noqa: E402

#: at most one fault per packet, the rest of it valid and in sequence: each of the kernel's checks is then
#: the only one a packet fails (several faults at once would hide all but the first)
_FAULTS = [None] * 8 + [
    "psn_far", "psn_beyond_window", "psn_dup", "va_below", "va_past_end", "len_odd", "len_zero",
    "len_max", "mlen_small", "moff_past", "trimmed", "ack_now", "retx", "last", "rkey", "pad_bits",
    "tver", "mxh_version", "qpn_reserved_byte", "short", "long", "foreign_src", "ecn", "ackreq", "ts_high",
    "pkey_other", "pkey_limited", "ev_high", "payload_flip",
]
_PACKET = st.tuples(st.integers(0, 3), st.sampled_from(_FAULTS), st.integers(0, 40))


def _render(specs: list[tuple[int, str | None, int]], qb: QueuePair, mr: Any,
            rkey: int) -> list[tuple[bytes, bool, bytes]]:
    """The packets of `specs` (message, fault, EV) toward `qb`: 4 KiB pieces of messages of 64 KiB, each
    message 2 MiB apart in the region, the ICRC valid (rewritten after a header fault)."""
    out = []
    nxt = {m: 0 for m in range(4)}
    base = qb.rcv_cum
    for i, (m, fault, ev) in enumerate(specs):
        k = nxt[m]
        nxt[m] += 1
        psn = base + 40 * m + k
        dlen = 4096
        moff = 4096 * k
        va = mr.addr + (2 << 20) * m + moff
        mlen = 1 << 16
        flags = 0
        if fault == "psn_far":
            psn += 1 << 22
        elif fault == "psn_beyond_window":
            psn += qb.Wd
        elif fault == "psn_dup":
            psn -= 1
        elif fault == "va_below":
            va = mr.addr - 4096
        elif fault == "va_past_end":
            va = mr.addr + mr.length - 2048
        elif fault == "len_odd":
            dlen = 4093
        elif fault == "len_zero":
            dlen = 0
        elif fault == "len_max":
            dlen = 8192
        elif fault == "mlen_small":
            mlen = moff + dlen
        elif fault == "moff_past":
            moff = mlen
        elif fault in ("trimmed", "ack_now", "retx", "last"):
            flags = {"trimmed": MxhFlag.TRIMMED, "ack_now": MxhFlag.ACK_REQ_NOW, "retx": MxhFlag.RETX,
                     "last": MxhFlag.LAST}[fault]
        buf = bytearray(64 + dlen + 8)
        n = build_write(buf, qb.rx_icrc, dqpn=qb.qpn, psn=psn & 0xFFFFFF, ev_index=ev, va=va,
                        rkey=rkey ^ 0x5A5A if fault == "rkey" else rkey, payload=bytes([i & 0xFF]) * dlen,
                        msn=m, msg_len=mlen, msg_offset=moff, flags=int(flags),
                        timestamp_ns=(1 << 63 if fault == "ts_high" else 0) + 1000 + i,
                        ackreq=fault == "ackreq")
        pkt = bytearray(buf[:n])
        header = {"pad_bits": (1, 0x30), "tver": (1, 0x01), "mxh_version": (28, 0x02),
                  "qpn_reserved_byte": (4, 0x01), "pkey_other": (2, 0x6D), "pkey_limited": (2, 0x80),
                  "ev_high": (30, 0x40)}.get(
                      fault or "")
        if header is not None:
            pkt[header[0]] ^= header[1]
            qb.rx_icrc.write(pkt, n - 4, 0xC000 | ev)
        if fault == "payload_flip":  # after the ICRC was written: only the ICRC tells
            pkt[n - 9] ^= 0x01
        if fault == "short":
            pkt = pkt[:-5]
        elif fault == "long":
            pkt += b"\0\0\0\0"
        out.append((bytes(pkt), fault == "ecn", GX if fault == "foreign_src" else GA))
    return out


def _responder() -> tuple[Context, QueuePair, np.ndarray, Any]:
    b = Context(GB, ports=4, seed=2)
    qb = b.create_qp(b.create_cq(), ev_profile=b.create_ev_profile(count=32), attr=QpAttr(mtu=4096))
    qb.connect(GA, 0x77)
    dst = np.zeros(8 << 20, dtype=np.uint8)
    mr = b.reg_mr(dst)
    for i in range(8):
        qb.post_recv(i)
    return b, qb, dst, mr


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(specs=st.lists(_PACKET, min_size=1, max_size=48),
       cuts=st.lists(st.integers(1, 16), min_size=1, max_size=8))
def test_hostile_headers_with_a_valid_icrc_give_what_one_by_one_gives(
    specs: list[tuple[int, str | None, int]], cuts: list[int]
) -> None:
    """Every header field the kernel reads, pushed out of range (window, region bounds, R_Key, lengths,
    pad, MXH version, flags, the QPN's reserved byte, a foreign source, ECN) in packets whose ICRC is
    valid, so that only the kernel's own checks stand between them and the region, and a payload bit
    flipped after the ICRC (only the ICRC refuses it): the same state, datagrams and bytes as one
    `receive` per packet."""
    b1, q1, d1, m1 = _responder()
    b2, q2, d2, m2 = _responder()
    p1 = _render(specs, q1, m1, m1.rkey)
    p2 = _render(specs, q2, m2, m2.rkey)
    assert len(p1) == len(p2)
    for pkt, ce, src in p1:
        b1.receive(pkt, 5_000, ce, 1, src)
    out1 = [bytes(dg.data) for dg in b1.datagrams_to_send(5_000)]
    slots = np.zeros((len(p2), SLOT), dtype=np.uint8)
    lens = np.array([len(x[0]) for x in p2], dtype=np.int64)
    ecn = np.array([x[1] for x in p2], dtype=np.bool_)
    ports = np.ones(len(p2), dtype=np.int64)
    srcs = np.zeros((len(p2), 16), dtype=np.uint8)
    for j, (pkt, _ce, src) in enumerate(p2):
        slots[j, : len(pkt)] = np.frombuffer(pkt, dtype=np.uint8)
        srcs[j] = np.frombuffer(src, dtype=np.uint8)
    j = 0
    for c in cuts * (len(p2) // max(1, sum(cuts)) + 1):
        if j >= len(p2):
            break
        sl = slice(j, j + c)
        b2.receive_batch(slots[sl], lens[sl], ecn[sl], ports[sl], srcs[sl], 5_000)
        j += c
    out2 = [bytes(dg.data) for dg in b2.datagrams_to_send(5_000)]
    assert out1 == out2
    assert _state(q1, b1) == _state(q2, b2)
    assert np.array_equal(d1, d2)
    # what the batch left to acknowledge later (the delayed ACK's echo) is the same too
    for b in (b1, b2):
        b.handle_timer(50_000)
    assert [bytes(dg.data) for dg in b1.datagrams_to_send(50_000)] == [
        bytes(dg.data) for dg in b2.datagrams_to_send(50_000)]


@pytest.mark.parametrize("ackreq", [False, True])
def test_a_timestamp_with_bit_63_is_echoed_as_one_by_one(ackreq: bool) -> None:
    """The MXH timestamp is the sender's 64-bit clock: with its top bit set the kernel's int64 state row
    held it negative, and the SACK that echoes it (at once, or by the delayed ACK) raised struct.error
    out of receive_batch / handle_timer."""
    specs: list[tuple[int, str | None, int]] = [(0, None, 0), (0, "ackreq" if ackreq else None, 1),
                                                (0, None, 2)]
    outs = []
    for batched in (False, True):
        b, qb, _dst, mr = _responder()
        pkts = _render(specs, qb, mr, mr.rkey)
        k = 1 if ackreq else 2  # acknowledged at once, or the last packet: echoed by the delayed ACK
        pkts[k] = (_with_ts(pkts[k][0], qb, 1 << 63 | 77), False, GA)
        if batched:
            slots = np.zeros((3, SLOT), dtype=np.uint8)
            for j, (pkt, _ce, _src) in enumerate(pkts):
                slots[j, : len(pkt)] = np.frombuffer(pkt, dtype=np.uint8)
            b.receive_batch(slots, np.array([len(x[0]) for x in pkts], dtype=np.int64), np.zeros(3, np.bool_),
                            np.ones(3, dtype=np.int64), None, 5_000)
        else:
            for pkt, ce, src in pkts:
                b.receive(pkt, 5_000, ce, 1, src)
        sent = [bytes(dg.data) for dg in b.datagrams_to_send(5_000)]
        b.handle_timer(50_000)
        outs.append((sent, [bytes(dg.data) for dg in b.datagrams_to_send(50_000)], qb.rcv_cum))
    assert outs[0] == outs[1]
    assert sum(len(x) for x in outs[1][:2]) >= 1  # something acknowledged the three packets


def _with_ts(pkt: bytes, qb: QueuePair, ts: int) -> bytes:
    """`pkt` with its MXH timestamp (bytes 44..51) set to `ts`, the ICRC rewritten."""
    p = bytearray(pkt)
    p[44:52] = ts.to_bytes(8, "big")
    ev = int.from_bytes(p[30:32], "big") & 0x3FFF
    qb.rx_icrc.write(p, len(p) - 4, 0xC000 | ev)
    return bytes(p)


def test_the_c_kernels_refuse_arrays_they_cannot_take() -> None:
    """`_fastc.rx_run` and `rx_parse` read and write through the arrays they are given: a wrong item type,
    a shape that does not hold `k` packets, a row that is not contiguous or a read-only state row is a
    TypeError or ValueError, never a read or write outside the arrays."""
    from mrc.transport import fastpath

    c = fastpath._compiled()
    if c is None or not hasattr(c, "rx_run"):
        pytest.skip("mrc/transport/_fastc.c is not built here (make setup)")
    k = 4
    good: dict[str, Any] = {
        "data": np.zeros((k, 64), np.uint8), "lens": np.zeros(k, np.int64), "ecn": np.zeros(k, np.bool_),
        "ports": np.zeros(k, np.int64), "srcs": np.zeros((0, 16), np.uint8), "peer": np.zeros(16, np.uint8),
        "st": np.zeros(rxbatch.ST_LEN, np.int64), "words": np.zeros(4, np.uint64),
        "mr": np.zeros(0, np.uint8), "starts": np.full(0x4000, -1, np.int64),
    }
    order = ["data", "lens", "ecn", "ports", "srcs", "peer", "st", "words", "mr", "starts"]

    def call(j: int = 0, kk: int = k, **over: Any) -> Any:
        a = {**good, **over}
        return c.rx_run(*(a[n] for n in order[:6]), j, kk, *(a[n] for n in order[6:]))

    assert call() == (rxbatch.PURE, 0)  # zero-length packets: the one-by-one path's
    ro = np.zeros(rxbatch.ST_LEN, np.int64)
    ro.flags.writeable = False
    bad: list[dict[str, Any]] = [
        {"lens": np.zeros(k, np.int32)}, {"st": ro}, {"st": np.zeros(3, np.int64)},
        {"starts": np.zeros(16, np.int64)}, {"data": np.zeros((k, 128), np.uint8)[:, ::2]},
        {"data": np.zeros(64, np.uint8)}, {"srcs": np.zeros((k, 8), np.uint8)},
        {"peer": np.zeros(4, np.uint8)},
        {"words": np.zeros(4, np.float64)}, {"ecn": np.zeros(k, np.int64)}, {"lens": [0, 0, 0, 0]},
    ]
    for over in bad:
        with pytest.raises((TypeError, ValueError)):
            call(**over)
    with pytest.raises(ValueError):
        call(kk=k + 1)  # more packets than the arrays hold
    with pytest.raises(ValueError):
        call(j=-1)
    hdrs, ctl = np.zeros(k * 64, np.uint8), np.zeros(k * 64, np.uint8)
    table, lens, ports = np.zeros(4, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64)
    ecn = np.zeros(k, np.bool_)
    assert c.rx_parse(hdrs, ctl, k, 64, table, lens, ecn, ports) == 0
    with pytest.raises(ValueError):
        c.rx_parse(hdrs, ctl, k + 1, 64, table, lens, ecn, ports)
    with pytest.raises(TypeError):
        c.rx_parse(hdrs, ctl, k, 64, table, lens.astype(np.int32), ecn, ports)
