"""The engine's fast path (mrc.transport.fastpath, in Python and in C: mrc/transport/_fastc.c) against the
pure path (MRC_FASTPATH=0): the same loopback scenarios on each must put the same datagrams on the wire,
byte for byte and in the same order, and end with the same counters, states and report.

Memory-region addresses travel in every data packet (RETH VA), so both runs use the same source and
destination buffers: their addresses, and the R_Keys drawn from the same seeds, are then the same."""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from mrc.transport import fastpath
from mrc.transport.engine import Context
from mrc.transport.txring import TxRing
from mrc.transport.verbs import QpAttr

L = importlib.import_module("mrc.sim.loopback")

_TIMING = ("wall_s", "engine_pps", "wire_floor_pps", "engine_vs_wire_floor")

SCENARIOS: dict[str, Callable[[], Any]] = {
    "clean": lambda: L.LoopbackConfig(size=4 << 20, seed=1),
    "loss1pct": lambda: L.LoopbackConfig(
        size=4 << 20, seed=2, imm=None, fabric=L.FabricConfig(loss=0.01, jitter_ns=3000)
    ),
    "trim_ecn": lambda: L.LoopbackConfig(
        size=4 << 20, seed=3, fabric=L.FabricConfig(trim=0.02, ecn={1: 0.1})
    ),
    "blackhole": lambda: L.LoopbackConfig(
        size=4 << 20, seed=4, settle_ns=20_000_000,
        fabric=L.FabricConfig(blackholes=[L.Blackhole(2, 100_000, 1_500_000)], loss=0.002),
    ),
    "null_cc_loss": lambda: L.LoopbackConfig(size=2 << 20, seed=5, cc="null",
                                             fabric=L.FabricConfig(loss=0.05, planes=2)),
    # a padded payload (1,001 bytes), the smallest PSN window (its slots wrap within one send call) and
    # a message that is not a multiple of the MTU: the header, pad and slot arithmetic of every path
    "padded_small_window": lambda: L.LoopbackConfig(
        size=(1 << 20) + 333, seed=6, attr=QpAttr(mtu=1001, mpr=1),
        fabric=L.FabricConfig(jitter_ns=2000),
    ),
}


#: the fast path's two implementations; "c" is skipped where the C module was not built
MODES = ("py", "c")
_C_BUILT = fastpath._compiled() is not None


def _mode(monkeypatch: pytest.MonkeyPatch, fast: bool, mode: str = "py") -> None:
    """Contexts built next take the pure path (not `fast`), or the fast path in `mode`."""
    if fast and mode == "c" and not _C_BUILT:
        pytest.skip("mrc/transport/_fastc.c is not built here (gcc and python3-dev: make setup)")
    monkeypatch.setattr(fastpath, "ENABLED", fast)
    monkeypatch.setattr(fastpath, "C_ENABLED", mode == "c")


def _via_ring(ctx: Context, cap: int) -> TxRing:
    """`ctx.datagrams_to_send` replaced by `datagrams_into` a TxRing of `cap` slots, taken whole: every
    datagram the run sends went through the ring (a small one: it wraps and grows)."""
    ring = TxRing(cap)
    into = ctx.datagrams_into

    def send(now: int) -> list[Any]:
        k = into(now, ring)
        assert k == len(ring)
        return ring.take()

    ctx.datagrams_to_send = send  # type: ignore[method-assign]
    return ring


def _run(cfg: Any, fast: bool, bufs: tuple[np.ndarray, np.ndarray] | None,
         monkeypatch: pytest.MonkeyPatch, with_src: bool = False, mode: str = "py", ring: int = 0,
         ) -> tuple[list[tuple[Any, ...]], dict[str, Any], Any]:
    wire: list[tuple[Any, ...]] = []
    orig = L.LoopbackFabric.transmit

    def transmit(self: Any, src: int, dg: Any, now: int) -> None:
        wire.append((src, bytes(dg.data), dg.port, dg.ev_index, dg.dst, now))
        orig(self, src, dg, now)

    monkeypatch.setattr(L.LoopbackFabric, "transmit", transmit)
    _mode(monkeypatch, fast, mode)
    run = L.build(cfg)
    if bufs is not None:
        src, dst = bufs
        assert np.array_equal(src, run.src)
        dst.fill(0)
        run.src, run.dst = src, dst
    assert run.a.fastpath is fast and (run.qa.fast is not None) is fast
    if fast:
        want = fastpath._compiled().send_new if mode == "c" else fastpath.send_new
        assert run.qa.fast is want
    if with_src:  # as the socket driver calls it: the source address of every datagram checked
        for ctx, peer in ((run.a, L.GID_B), (run.b, L.GID_A)):
            ctx.receive = functools.partial(ctx.receive, src=peer)
    rings = [_via_ring(ctx, ring) for ctx in (run.a, run.b)] if ring else []
    doc = L.run_transfer(run)
    run.rings = rings
    for k in _TIMING:
        doc.pop(k)
    state = {
        "report": doc,
        "qa": run.qa.stats(), "qb": run.qb.stats(),
        "drops": (dict(run.a.drops), dict(run.b.drops)),
        "wc": ([(w.wr_id, w.status, w.byte_len, w.imm_data) for w in run.send_wc],
               [(w.wr_id, w.status, w.byte_len, w.imm_data) for w in run.recv_wc]),
        "msgs": (dict(run.qb.msgs), run.qb.rcv_cum, run.qb.rbits),
        "ev_events": [(e.time_ns, e.ev_index, e.state) for e in run.a.poll_ev_events()],
    }
    monkeypatch.undo()
    return wire, state, run


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_src", [False, True], ids=["no_src", "src"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_wire_bytes_and_state(
    name: str, with_src: bool, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = SCENARIOS[name]
    wire0, state0, run0 = _run(cfg(), False, None, monkeypatch, with_src)
    assert state0["report"]["bit_exact"], name
    wire1, state1, _ = _run(cfg(), True, (run0.src, run0.dst), monkeypatch, with_src, mode)
    assert len(wire1) == len(wire0)
    for i, (a, b) in enumerate(zip(wire0, wire1, strict=True)):
        assert a == b, f"{name}: datagram {i} differs"
    assert state1 == state0


@pytest.mark.parametrize(("fast", "mode"), [(False, "py"), (True, "py"), (True, "c")])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_send_ring_carries_the_same_datagrams(
    name: str, fast: bool, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`datagrams_into` a TxRing (the engine's C path writes data packets in their slots; the Python paths
    append copies) against the pure path's lists: the same datagrams on the wire, byte for byte and in
    the same order (port, EV and destination too), and the same end state. A ring of 8 slots wraps on
    every path and grows where one call sends more than it holds."""
    cfg = SCENARIOS[name]
    wire0, state0, run0 = _run(cfg(), False, None, monkeypatch)
    wire1, state1, run1 = _run(cfg(), fast, (run0.src, run0.dst), monkeypatch, mode=mode, ring=8)
    assert len(wire1) == len(wire0)
    for i, (a, b) in enumerate(zip(wire0, wire1, strict=True)):
        assert a == b, f"{name}: datagram {i} differs"
    assert state1 == state0
    ra, _ = run1.rings
    assert ra.head == ra.tail > ra.cap and ra.oversize == 0  # wrapped many times, all taken
    assert ra.gen >= 1  # a call emitted more than 8 datagrams: the ring grew, in order


@pytest.mark.parametrize(("fast", "mode"), [(False, "py"), (True, "py"), (True, "c")])
def test_foreign_source_dropped(fast: bool, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Data packets from an address that is not the QP's peer: dropped as foreign_src by every path,
    nothing placed, nothing acknowledged; from the peer, placed."""
    _mode(monkeypatch, fast, mode)
    run = L.build(L.LoopbackConfig(size=1 << 20, seed=7))
    smr, dmr = run.a.reg_mr(run.src), run.b.reg_mr(run.dst)
    run.qa.post_send(1, smr, 0, 1 << 20, dmr.addr, dmr.rkey)
    data = [dg.data for dg in run.a.datagrams_to_send(0)]
    assert len(data) > 2
    stranger = bytes.fromhex("fd00000000000000000000000000000c")
    for d in data[1:3]:  # mid-message packets: the fast path's own case
        run.b.receive(d, 1000, False, 0, stranger)
    assert run.b.drops == {"foreign_src": 2}
    assert run.qb.rx_packets == 0 and not run.b.datagrams_to_send(1000)
    run.b.receive(data[1], 1000, False, 0, L.GID_A)
    assert run.qb.rx_packets == 1


def test_fast_path_handles_the_bulk() -> None:
    """Both halves are on in a default context: the fused receive is the context's own, and the QP
    sends through `fastpath.send_new` (a check that the comparison above compares something)."""
    ctx = Context(bytes(16), ports=1)
    if fastpath.ENABLED:
        assert ctx.fastpath and "receive" in vars(ctx)
    else:
        assert not ctx.fastpath and "receive" not in vars(ctx)


def test_switch_read_at_import() -> None:
    code = (
        "import mrc.transport.fastpath as f, mrc.transport as t; c = t.Context(bytes(16));"
        " print(f.ENABLED, c.fastpath)"
    )
    for value, want in (("0", "False False"), ("1", "True True"), ("", "True True")):
        env = {**os.environ, "MRC_FASTPATH": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == want, value


@pytest.mark.parametrize("cfg", [
    lambda: L.LoopbackConfig(size=4 << 20, seed=1),
    lambda: L.LoopbackConfig(size=(1 << 20) + 333, seed=6, imm=None, attr=QpAttr(mtu=1001, mpr=1),
                             fabric=L.FabricConfig(planes=2, ev_spread_ns=5000)),
    lambda: L.LoopbackConfig(size=2 << 20, seed=8, cc="null", settle_ns=3_000_000),
], ids=["clean", "padded_small_window", "null_cc_settle"])
def test_compiled_harness_same_run(cfg: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The loopback's event loop in C (`_fastc.loopback_run`, taken for an unimpaired fabric) against
    the same loop in Python, both with the C engine: the same report (times, packets, SACKs), the same
    QP counters and timers, the same bytes placed, and the same events left in the heap, in the same
    order (the C loop keeps them in its own array during the run)."""
    _mode(monkeypatch, True, "c")
    docs = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(L.LoopbackFabric, "_compiled_loop", lambda self: None)
        run = L.build(cfg())
        assert (run.fabric._compiled_loop() is not None) is compiled
        doc = L.run_transfer(run)
        for k in _TIMING:
            doc.pop(k)
        assert doc["bit_exact"]
        docs.append((doc, run.qa.stats(), run.qb.stats(), run.fabric.seq, run.fabric.now, run.fabric.last_t,
                     run.fabric.timer_at, run.fabric.port_free, run.fabric.plane_data_bytes,
                     run.qa.rto_deadline, run.qb.ack_deadline,
                     [(*e[:3], None if e[3] is None else bytes(e[3]), *e[4:]) for e in run.fabric.heap]))
    assert docs[0] == docs[1]


def test_replaced_transmit_keeps_the_python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `transmit` replaced on the fabric (as tests impair one path) is what the loop must call: the C
    loop, which does `transmit`'s unimpaired branch itself, is not taken then."""
    _mode(monkeypatch, True, "c")
    run = L.build(L.LoopbackConfig(size=1 << 20, seed=1))
    seen: list[int] = []
    plain = run.fabric.transmit

    def transmit(src: int, dg: Any, now: int) -> None:
        seen.append(src)
        plain(src, dg, now)

    run.fabric.transmit = transmit
    assert run.fabric._compiled_loop() is None
    doc = L.run_transfer(run)
    assert doc["bit_exact"] and seen.count(0) >= doc["data_packets"] and 1 in seen


@pytest.mark.skipif(not _C_BUILT, reason="mrc/transport/_fastc.c is not built here (make setup)")
def test_ack_bits_stops_at_a_lost_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_fastc.ack_bits`, on_sack's loop in C: the bits below the first LOST slot are acknowledged as the
    Python loop does (slot ACKED, in-flight bytes down, serial and per-port RACK serial up), and the
    bits from the LOST one on are handed back for the Python loop's recovery code."""
    from mrc.transport.qpcore import _ACKED, _INFLIGHT, _LOST

    _mode(monkeypatch, True, "c")
    run = L.build(L.LoopbackConfig(size=1 << 20, seed=1))
    qp, W, una = run.qa, run.qa.W, run.qa.W - 2  # slots una % W .. wrap past the end
    for i in range(6):
        s = (una + i) % W
        qp.tx_state[s], qp.tx_len[s], qp.tx_serial[s], qp.tx_ev[s] = _INFLIGHT, 100 + i, 50 + i, i
    qp.tx_state[(una + 4) % W] = _LOST
    rack = [0] * len(qp.rack_ser)
    newly = 0b110111  # PSNs una+0..2, una+4 (LOST), una+5
    left, inflight, acked, las = qp.fast_acks(qp, newly, una, 1000, 0, 0, rack, qp.paths.ev_port)
    assert left == 0b110000
    assert (inflight, acked, las) == (1000 - 303, 303, 52)
    assert [qp.tx_state[(una + i) % W] for i in range(6)] == [_ACKED] * 3 + [_INFLIGHT, _LOST, _INFLIGHT]
    ports = [qp.paths.ev_port[i] for i in range(3)]
    assert all(rack[p] == max(50 + i for i in range(3) if ports[i] == p) for p in set(ports))
    assert qp.fast_acks(qp, 0, una, 5, 6, 7, None, qp.paths.ev_port) == (0, 5, 6, 7)


def _mutant(b: bytearray, qa: Any, rng: Any) -> bytes:
    """`b` changed: bytes flipped in the headers or anywhere, cut short, lengthened, or a 32-bit field set
    to an edge value; most of those whose headers changed given a right ICRC again (as the sender's
    context computes it), so that they pass the integrity check and reach the checks behind it."""
    import struct

    kind = rng.randrange(6)
    if kind == 0:  # header bytes flipped
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(min(len(b), 56))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # any byte
        b[rng.randrange(len(b))] ^= rng.randrange(1, 256)
    elif kind == 2:  # cut short
        del b[rng.randrange(1, len(b)):]
    elif kind == 3:  # lengthened
        b += bytes(rng.randrange(1, 16))
    elif kind == 4 and len(b) >= 56:  # a field at an edge: VA, R_Key, DMA length, MSN, message length, offset
        off = rng.choice((12, 16, 20, 24, 32, 36, 40))
        struct.pack_into("!I", b, off, rng.choice((0, 1, 3, 4, 0x7F, 0x80, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF)))
    if kind != 1 and len(b) >= 16 and rng.random() < 0.8:  # (a changed payload keeps its wrong ICRC)
        ev = int.from_bytes(b[30:32], "big") if len(b) >= 32 else 0
        qa.tx_icrc.write(b, len(b) - 4, 0xC000 | (ev & 0x3FFF))
    return bytes(b)


def _fuzz_sequence(corpus: list[bytes], qa: Any, per_packet: int, seed: int) -> list[bytes]:
    """Each packet of `corpus` in order, each after `per_packet` changed copies of it or of packets after
    it: the copies come while their PSNs are still new (mostly), so that they reach every check of the
    common case, not only the duplicate check."""
    import random

    rng = random.Random(seed)
    out: list[bytes] = []
    for i, p in enumerate(corpus):
        # (kind 2 twice: the second finds the ICRC start value of its length cached by the first)
        out += [_crafted(bytearray(corpus[min(i + 1, len(corpus) - 1)]), qa, k) for k in (0, 1, 2, 2, 3)]
        out += [_mutant(bytearray(rng.choice(corpus[i:])), qa, rng) for _ in range(per_packet)]
        out.append(p)
    return out


def _crafted(b: bytearray, qa: Any, kind: int) -> bytes:
    """A well-formed packet with a right ICRC and one field a check must refuse: the P_Key of another
    partition, a transport version (BTH byte 1's low nibble) other than 0, a DMA length above MAX_PAYLOAD
    with as much payload, a message offset past the message's end."""
    import struct

    if kind == 0:
        struct.pack_into("!H", b, 2, 0x8001)
    elif kind == 1:
        b[1] |= 0x01
    elif kind == 2:
        n = 8196
        struct.pack_into("!I", b, 24, n)
        b[52:-4] = bytes(range(256)) * 32 + bytes(4)
        assert len(b) == 52 + n + 4
    else:
        struct.pack_into("!I", b, 40, int.from_bytes(b[36:40], "big") - 1)
    ev = int.from_bytes(b[30:32], "big")
    qa.tx_icrc.write(b, len(b) - 4, 0xC000 | (ev & 0x3FFF))
    return bytes(b)


def _fuzz_run(fast: bool, mode: str, bufs: tuple[np.ndarray, np.ndarray], mutants: list[bytes] | None,
              monkeypatch: pytest.MonkeyPatch) -> tuple[list[bytes], dict[str, Any]]:
    _mode(monkeypatch, fast, mode)
    run = L.build(L.LoopbackConfig(size=1 << 20, seed=11))
    src, dst = bufs
    dst.fill(0)
    smr, dmr = run.a.reg_mr(src), run.b.reg_mr(dst)
    run.qa.post_send(1, smr, 0, 1 << 20, dmr.addr, dmr.rkey)
    corpus = [bytes(dg.data) for dg in run.a.datagrams_to_send(0)]
    packets = mutants if mutants is not None else _fuzz_sequence(corpus, run.qa, 40, 5)
    wire = corpus[:]
    t = 1000
    for i, p in enumerate(packets):
        t += 50
        run.b.receive(p, t, False, i % 4)
        wire += [bytes(dg.data) for dg in run.b.datagrams_to_send(t)]
        if i % 97 == 0:
            run.b.handle_timer(t + 10**9)
    state = {"drops": dict(run.b.drops), "qb": run.qb.stats(), "rcv_cum": run.qb.rcv_cum,
             "rbits": run.qb.rbits, "msgs": dict(run.qb.msgs), "state": run.qb.state, "dst": dst.tobytes(),
             "packets": packets}
    monkeypatch.undo()
    return wire, state


@pytest.mark.parametrize("mode", MODES)
def test_malformed_packets_same_on_every_path(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A differential fuzz: 40 changed copies (headers, lengths, edge values, most with a right ICRC
    again) before each good packet of a WRITE, to a responder on the pure path and to one on the fast path:
    the same drops by reason, SACKs and NACKs, bytes placed, bitmap, messages and QP state. The C path
    parses what a hostile peer sends; nothing may crash it or make it act otherwise."""
    rng = np.random.default_rng(3)
    bufs = (rng.integers(0, 256, 1 << 20, dtype=np.uint8), np.zeros(1 << 20, dtype=np.uint8))
    wire0, state0 = _fuzz_run(False, "py", bufs, None, monkeypatch)
    # it reached both sides: many drops, and data placed
    assert sum(state0["drops"].values()) > 1000 and state0["rbits"] + state0["rcv_cum"] > 0
    wire1, state1 = _fuzz_run(True, mode, bufs, state0["packets"], monkeypatch)
    assert wire1 == wire0
    assert state1 == state0


def test_stale_build_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `_fastc` built from another version of its source (an in-place build older than the checkout)
    is refused, and contexts run the Python fast path, rather than calling it with a wrong contract."""
    import types

    stale = types.SimpleNamespace(ABI=0, consts=lambda: fastpath._expected_consts())
    monkeypatch.setitem(sys.modules, "mrc.transport._fastc", stale)
    monkeypatch.setattr(importlib.import_module("mrc.transport"), "_fastc", stale, raising=False)
    monkeypatch.setattr(fastpath, "_C", None)
    assert fastpath._compiled() is None
    monkeypatch.setattr(fastpath, "ENABLED", True)
    ctx = Context(bytes(16), ports=1)
    assert vars(ctx)["fast_send"] is fastpath.send_new


_REBINDING_CTL_EV = """
import importlib
from mrc.transport import fastpath
from mrc.transport.paths import PathSet
assert fastpath._compiled() is not None
fastpath.ENABLED = fastpath.C_ENABLED = True
L = importlib.import_module("mrc.sim.loopback")
run = L.build(L.LoopbackConfig(size=1 << 20, seed=1))
plain = PathSet.ctl_ev
calls = [0]
def ctl_ev(self, *a):
    calls[0] += 1
    for qp in (run.qa, run.qb):
        qp.c = dict(qp.c)  # the dict the C SACK read from this slot is now referenced by nothing else
    return plain(self, *a)
PathSet.ctl_ev = ctl_ev
doc = L.run_transfer(run)
print(calls[0], doc["bit_exact"])
"""


@pytest.mark.skipif(not _C_BUILT, reason="mrc/transport/_fastc.c is not built here (make setup)")
def test_a_call_into_python_that_rebinds_a_slot_frees_nothing_the_c_path_uses() -> None:
    """The C SACK calls `paths.ctl_ev`, Python that may rebind the QP's slots; the objects it read from
    them are held for the call. Before, the counters dict it went on to update was freed under it: this
    run crashed (SIGSEGV, with or without the debug allocator, which poisons freed memory)."""
    env = {**os.environ, "PYTHONMALLOC": "debug"}
    r = subprocess.run([sys.executable, "-c", _REBINDING_CTL_EV], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    calls, exact = r.stdout.split()
    assert int(calls) > 0 and exact == "True"


def test_the_c_path_computes_icrc_start_values_and_bounds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ICRC start value the C path has not cached yet (the first packet of each length on each EV) is
    computed there as `IcrcContext.start` computes it, without a call into Python (whose `start` also
    fills `_prefix`), and cached under icrc.py's key and bound: a full cache starts over."""
    if not _C_BUILT:
        pytest.skip("mrc/transport/_fastc.c is not built here (gcc and python3-dev: make setup)")
    from mrc.wire.icrc import _PREFIX_CACHE_MAX, IcrcContext

    _mode(monkeypatch, True, "c")
    run = L.build(SCENARIOS["padded_small_window"]())
    full = run.qa.tx_icrc
    full._start.update({k: 0 for k in range(_PREFIX_CACHE_MAX)})  # keys no packet has (sport 0)
    doc = L.run_transfer(run)
    assert doc["bit_exact"]
    assert 0 < len(full._start) < _PREFIX_CACHE_MAX and min(full._start) >> 32 != 0  # started over
    asked: list[tuple[int, int, int]] = []
    start = IcrcContext.start

    def counted(self: IcrcContext, end: int, sport: int) -> int:
        asked.append((id(self), end, sport))
        return start(self, end, sport)

    monkeypatch.setattr(IcrcContext, "start", counted)
    run = L.build(SCENARIOS["clean"]())  # (no retransmission: every data packet is the C path's)
    assert L.run_transfer(run)["bit_exact"]
    monkeypatch.undo()
    # the sender's context: every data packet is built by the C path (the receiver may take a packet
    # through the Python path, which asks its context as it always did)
    assert len(asked) > 0 and not [a for a in asked if a[0] == id(run.qa.tx_icrc)], "C asked Python"
    for ic in (run.qa.tx_icrc, run.qb.rx_icrc):
        assert len(ic._start) >= 3
        fresh = IcrcContext(ic.src, ic.dst, ic.dport)
        for key, v in ic._start.items():
            assert v == fresh.start(key & 0xFFFF_FFFF, key >> 32)


def test_the_c_path_takes_sacks_without_the_python_receive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A well-formed SACK goes from the C receive to `Requester.sack_rx` directly: the Python receive
    (which hands SACKs to `fastpath._sack_rx`) sees none of a clean transfer's; a SACK the C path does not
    take still arrives through it (test_malformed_packets_same_on_every_path)."""
    if not _C_BUILT:
        pytest.skip("mrc/transport/_fastc.c is not built here (gcc and python3-dev: make setup)")
    seen: list[int] = []
    sack_rx = fastpath._sack_rx

    def counted(*a: Any) -> None:
        seen.append(1)
        sack_rx(*a)

    monkeypatch.setattr(fastpath, "_sack_rx", counted)
    _mode(monkeypatch, True, "c")
    run = L.build(SCENARIOS["clean"]())
    doc = L.run_transfer(run)
    assert doc["bit_exact"] and run.qa.c["sack_rx"] > 50
    assert not seen


def test_the_c_path_sends_a_busy_qps_message_without_the_python_send(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_fastc.datagrams_to_send` takes `Requester.send`'s common call (a message under way: the window
    check, then send_new) itself: the Python method runs only to start a message, where the Python fast
    path calls it on every event of the busy QP."""
    if not _C_BUILT:
        pytest.skip("mrc/transport/_fastc.c is not built here (gcc and python3-dev: make setup)")
    from mrc.transport.qp import QueuePair

    calls = {"py": 0, "c": 0}
    send = QueuePair.send
    for mode in ("py", "c"):
        def counted(self: Any, now: int, out: list[Any], mode: str = mode) -> None:
            calls[mode] += 1
            send(self, now, out)

        monkeypatch.setattr(QueuePair, "send", counted)
        _mode(monkeypatch, True, mode)
        run = L.build(SCENARIOS["clean"]())
        assert L.run_transfer(run)["bit_exact"]
        monkeypatch.undo()
    assert calls["py"] > 50 and calls["c"] <= 2  # (one message)
