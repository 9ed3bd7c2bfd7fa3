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


def _run(cfg: Any, fast: bool, bufs: tuple[np.ndarray, np.ndarray] | None,
         monkeypatch: pytest.MonkeyPatch, with_src: bool = False, mode: str = "py",
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
    doc = L.run_transfer(run)
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
