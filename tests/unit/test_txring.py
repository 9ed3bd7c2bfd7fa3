"""The send ring (mrc/transport/txring.py): its own bookkeeping, and what writing into it saves.
(That the engine puts the same datagrams into a ring as into a list, on every path and scenario:
tests/unit/test_fastpath.py, test_the_send_ring_carries_the_same_datagrams.)"""

from __future__ import annotations

import importlib
import tracemalloc
from typing import Any

import numpy as np
import pytest

from mrc.transport import fastpath, txring
from mrc.transport.qpcore import Datagram
from mrc.transport.txring import SLOT, TxRing

L = importlib.import_module("mrc.sim.loopback")
_NO_C = "mrc/transport/_fastc.c is not built here (make setup)"


def _dg(i: int, n: int = 100) -> Datagram:
    return Datagram(bytearray(bytes([i & 0xFF]) * n), i % 4, i % 128, bytes([i & 0xFF]) * 16)


def test_entries_come_out_in_order_across_wraps_and_growth() -> None:
    ring = TxRing(4)
    sent: list[Datagram] = []
    got: list[Datagram] = []
    i = 0
    for burst in (3, 3, 1, 6, 2, 9, 4):  # wraps at 4, grows to 8 in the middle of a wrap, then to 16
        for _ in range(burst):
            d = _dg(i, 50 + i)
            ring.append(d)
            sent.append(d)
            i += 1
        got.extend(ring.take(burst - 1))  # one left behind each time: head and tail apart
    got.extend(ring.take())
    assert got == sent
    assert ring.cap == 16 and ring.gen == 2 and len(ring) == 0


def test_runs_and_arrays_describe_the_live_slots() -> None:
    ring = TxRing(4)
    for i in range(3):
        ring.append(_dg(i))
    ring.release(2)
    for i in range(3, 6):
        ring.append(_dg(i, 200))
    assert ring.runs() == [(2, 2), (0, 2)]  # entries 2..5 sit in slots 2, 3, 0, 1
    assert ring.runs(1) == [(2, 1)]
    data, lens, ports, evs, dst = ring.arrays()
    assert data.shape == (4, SLOT) and dst.shape == (4, 16)
    for entry in range(2, 6):
        s = entry % 4
        d = ring.datagram(entry)
        assert bytes(data[s, : lens[s]]) == bytes(d.data) and ports[s] == d.port and evs[s] == d.ev_index
        assert bytes(dst[s]) == d.dst
    ring.append(_dg(6))  # full: grows, the views are taken again
    assert ring.arrays()[0].shape == (8, SLOT) and ring.runs() == [(0, 5)]


def test_bad_use_is_refused_and_an_oversize_datagram_counted() -> None:
    with pytest.raises(ValueError, match="power of two"):
        TxRing(6)
    ring = TxRing(2)
    ring.append(Datagram(bytearray(SLOT + 1), 0, 0, b"\0" * 16))  # no driver could send it
    assert len(ring) == 0 and ring.oversize == 1
    ring.append(_dg(1))
    with pytest.raises(ValueError, match="release of 2 entries, 1 live"):
        ring.release(2)
    with pytest.raises(IndexError):
        ring.datagram(1)


def test_a_ring_at_its_bound_drops_and_counts_what_is_appended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txring, "MAX_SLOTS", 4)
    ring = TxRing(2)
    for i in range(6):
        ring.append(_dg(i))
    assert ring.cap == 4 and len(ring) == 4 and ring.overflow == 2
    assert [d.ev_index for d in ring.take()] == [0, 1, 2, 3]


@pytest.mark.parametrize(("fast", "mode"), [(False, "py"), (True, "py"), (True, "c")])
def test_a_transfer_through_a_ring_at_its_bound_completes(fast: bool, mode: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring bounded at 8 slots, taken whole after each call (a driver that sends everything): the C
    send stops at the bound and goes on at the next call, losing nothing; the Python paths' appends
    past it are dropped, counted, and recovered by the engine. The WRITE arrives bit-exact either way."""
    if mode == "c" and fastpath._compiled() is None:
        pytest.skip(_NO_C)
    monkeypatch.setattr(fastpath, "ENABLED", fast)
    monkeypatch.setattr(fastpath, "C_ENABLED", mode == "c")
    monkeypatch.setattr(txring, "MAX_SLOTS", 8)
    run = L.build(L.LoopbackConfig(size=1 << 20, seed=1))
    rings = []
    for ctx in (run.a, run.b):
        ring = TxRing(4)
        into = ctx.datagrams_into

        def send(now: int, ring: TxRing = ring, into: Any = into) -> list[Datagram]:
            into(now, ring)
            assert len(ring) <= 8
            return ring.take()

        ctx.datagrams_to_send = send
        rings.append(ring)
    doc = L.run_transfer(run)
    assert doc["bit_exact"]
    assert rings[0].cap == 8
    if mode == "c":
        assert rings[0].overflow == 0  # the data packets waited for the next call
    else:
        assert rings[0].overflow > 0


def _posted() -> Any:
    """A loopback run with a 16 MiB WRITE posted, nothing sent yet."""
    run = L.build(L.LoopbackConfig(size=16 << 20, seed=1))
    smr = run.a.reg_mr(run.src)
    dmr = run.b.reg_mr(run.dst)
    run.qa.post_send(1, smr, 0, run.cfg.size, dmr.addr, dmr.rkey)
    return run


def _first_send(into_ring: bool) -> tuple[int, int]:
    """Datagrams of a fresh 16 MiB WRITE's first send call, and the bytes of Python memory that call
    left allocated (what the datagrams hold while the driver has them). Into the ring, none of them
    went through `TxRing.append` (a Datagram built, then copied).

    The ICRC context caches one start value per (EV, length) it meets (bounded, `icrc.py`): a first
    send meets a new EV with nearly every packet, a QP in its steady state none. The cache is filled
    first with what an identical twin run's first send put in it, so that what is measured is what a
    send leaves per packet."""
    twin = _posted()
    twin.a.datagrams_into(0, TxRing(4096))
    run = _posted()
    for key in twin.qa.tx_icrc._start:
        run.qa.tx_icrc.start(key & 0xFFFFFFFF, key >> 32)
    assert run.qa.tx_icrc._start == twin.qa.tx_icrc._start
    ring = TxRing(4096)
    appended: list[Datagram] = []
    append = TxRing.append

    def spy(self: TxRing, dg: Datagram) -> None:
        appended.append(dg)
        append(self, dg)

    TxRing.append = spy  # type: ignore[method-assign]
    tracemalloc.start()
    try:
        c0 = tracemalloc.get_traced_memory()[0]
        if into_ring:
            k = run.a.datagrams_into(0, ring)
        else:
            held = run.a.datagrams_to_send(0)
            k = len(held)
        grew = tracemalloc.get_traced_memory()[0] - c0
    finally:
        tracemalloc.stop()
        TxRing.append = append  # type: ignore[method-assign]
    assert k > 32 and len(ring) == (k if into_ring else 0)
    assert appended == []
    return k, grew


@pytest.mark.skipif(fastpath._compiled() is None, reason=_NO_C)
def test_the_compiled_send_path_builds_data_packets_in_the_ring_without_python_objects() -> None:
    """A list of Datagrams holds a bytearray and a tuple per packet (4 KiB and more each at the default
    MTU); the ring's slots were allocated before, and so were the engine's per-PSN int64 arrays
    (`QpCore._reset_tx`; as lists they held three int objects per packet, about 70 bytes). What the
    call leaves is per call (counters, the QP's new sequence numbers), under 16 bytes a packet."""
    k, grew_list = _first_send(False)
    k2, grew_ring = _first_send(True)
    assert k2 == k
    assert grew_list > k * 4096
    assert grew_ring < k * 16, (grew_ring, k)


def test_ring_arrays_are_what_the_batch_receive_takes() -> None:
    """The ring's views have the shapes and types `Context.receive_batch` reads (a peer in the same
    process, or a test, can hand a run of slots over without a copy per datagram)."""
    ring = TxRing(8)
    for i in range(5):
        ring.append(_dg(i, 64 + i))
    data, lens, *_ = ring.arrays()
    (s, k), = ring.runs()
    assert data[s : s + k].dtype == np.uint8 and lens[s : s + k].dtype == np.int64
    assert [int(x) for x in lens[s : s + k]] == [64, 65, 66, 67, 68]


def test_shrink_only_when_empty_and_smaller() -> None:
    ring = TxRing(8)
    for i in range(12):  # grows to 16
        ring.append(_dg(i, 100))
    gen = ring.gen
    with pytest.raises(ValueError, match="live entries"):
        ring.shrink(8)
    ring.release(12)
    with pytest.raises(ValueError, match="cannot shrink to 32"):
        ring.shrink(32)
    ring.shrink(8)
    assert ring.cap == 8 and ring.gen == gen + 1 and len(ring) == 0 and len(ring.data) == 8 * SLOT
    ring.append(_dg(99, 64))
    assert ring.take()[0].data == _dg(99, 64).data
