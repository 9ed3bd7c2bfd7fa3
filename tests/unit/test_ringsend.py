"""The socket driver's send ring (dataplane/ringsend.py, the default) against its list path
(``MRC_TX_RING=0``): the same datagrams on the wire, the same pacing decisions turn by turn, and every
datagram sent exactly once through partial sends, a full socket buffer and a send error."""

from __future__ import annotations

import ctypes
import errno
import random
import socket
import time
from types import SimpleNamespace
from typing import Any

import pytest
from _udp_parts import rx_socket as _rx

from mrc.dataplane import mmsg
from mrc.dataplane.driver import PACE_BURST, PACE_CATCHUP_NS, PACE_SLACK_NS, WIRE_OVERHEAD, SocketDriver
from mrc.dataplane.ringsend import RingSender
from mrc.transport import Datagram
from mrc.transport.txring import TxRing

pytestmark = pytest.mark.skipif(not mmsg.available() or not socket.has_ipv6, reason="needs Linux LP64, IPv6")
LO = socket.inet_pton(socket.AF_INET6, "::1")


def _drain(sk: socket.socket) -> list[bytes]:
    import select

    got: list[bytes] = []
    sk.setblocking(False)
    while select.select([sk], [], [], 0.5)[0]:
        try:
            while True:
                got.append(sk.recv(9216))
        except BlockingIOError:
            pass
    return got


class RingCtx:
    """What the driver calls on a Context, with `datagrams_into`: hands out `out` once."""

    def __init__(self, out: list[Datagram]) -> None:
        self.out = out

    def datagrams_to_send(self, now: int) -> list[Datagram]:
        out, self.out = self.out, []
        return out

    def datagrams_into(self, now: int, ring: TxRing) -> int:
        out = self.datagrams_to_send(now)
        for dg in out:
            ring.append(dg)
        return len(out)

    def receive(self, *a: Any) -> None:
        pass

    def next_deadline(self) -> int | None:
        return None

    def handle_timer(self, now: int) -> None:
        pass


def _tagged(n: int, ports: int, rng: random.Random | None = None) -> list[Datagram]:
    """n datagrams sprayed round robin over `ports`, each carrying its index (sizes random if `rng`)."""
    out = []
    for i in range(n):
        size = rng.randint(100, 8248) if rng else 8248
        out.append(Datagram(bytearray(i.to_bytes(4, "big") + bytes(size - 4)), i % ports, i, LO))
    return out


@pytest.mark.parametrize("rate", [None, [10**12, 10**12]])
def test_the_ring_puts_the_list_paths_bytes_on_the_wire(rate: list[int] | None) -> None:
    payloads = [bytes([i & 0xFF]) * (100 + 37 * i % 8000) + i.to_bytes(4, "big") for i in range(300)]
    wires = {}
    for ring in (False, True):
        with _rx() as drv_sock, _rx() as peer:
            out = [Datagram(bytearray(p), i % 2, i % 16, LO) for i, p in enumerate(payloads)]
            d = SocketDriver(RingCtx(out), drv_sock, batch_io=False, tx_ring=ring,  # type: ignore[arg-type]
                             port_rate_bps=rate)
            assert d.tx_ring is ring and d.stats()["tx_ring"] == int(ring)
            d.dst_port = peer.getsockname()[1]
            sent = 0
            deadline = time.monotonic() + 5
            while (sent < len(payloads) or d.queued) and time.monotonic() < deadline:
                sent += d.flush()
            assert sent == len(payloads) == d.tx_datagrams and d.queued == 0 and not d.want_write
            wires[ring] = _drain(peer)
    assert wires[True] == wires[False] == payloads


def _release_schedule(ring_mode: bool, seed: int) -> list[tuple[list[tuple[int, int]], int | None]]:
    """Turns of a driver paced at four port rates (one far slower), datagrams of random sizes arriving
    in random bursts: per turn, the datagrams released ((index, port), in order) and when the next may
    go."""
    rng = random.Random(seed)
    rates = [10**10, 10**9, 10**7, 10**10]
    clock = [10**9]
    turns: list[tuple[list[tuple[int, int]], int | None]] = []
    sent_ring: list[tuple[int, int]] = []
    with _rx() as sock:
        d = SocketDriver(RingCtx([]), sock, batch_io=False, tx_ring=False, port_rate_bps=rates,  # type: ignore[arg-type]
                         clock=lambda: clock[0])
        ring = TxRing(4)  # grows while the slow port holds entries
        rs = RingSender(ring, rates, clock[0], burst=PACE_BURST, slack_ns=PACE_SLACK_NS,
                        catchup_ns=PACE_CATCHUP_NS, overhead=WIRE_OVERHEAD)

        def fake_send(fd: int, go: Any) -> int:
            ports = ring.arrays()[2]
            for s in map(int, go):
                sent_ring.append((int.from_bytes(ring.data[s * 9216 : s * 9216 + 4], "big"), int(ports[s])))
            rs._state[go] = 2
            return len(go)

        rs._send = fake_send  # type: ignore[method-assign]
        n = 0
        for _ in range(60):
            clock[0] += rng.choice([1_000, 20_000, 300_000, 2_000_000])
            burst = rng.choice([0, 1, 5, 40])
            new = [Datagram(bytearray((n + i).to_bytes(4, "big") + bytes(rng.randint(100, 8248) - 4)),
                            (n + i) % 5 if rng.random() < 0.1 else (n + i) % 4, n + i, LO)
                   for i in range(burst)]
            n += burst
            if ring_mode:
                before = rs.before_fill()
                for dg in new:
                    ring.append(dg)
                rs.after_fill(before)
                k0 = len(sent_ring)
                rs.flush(-1, clock[0], 4791)
                turns.append((sent_ring[k0:], rs.pace_at))
            else:
                k0 = len(d._pending)
                d._pace(clock[0], new)
                turns.append(([(int.from_bytes(bytes(dg.data[:4]), "big"), dg.port)
                               for dg in list(d._pending)[k0:]], d._pace_at))
        assert ring_mode is False or ring.gen >= 2
    return turns


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_ring_paces_as_the_list_path_turn_by_turn(seed: int) -> None:
    """The same bursts at the same times (some to port 4, which has no rate): each turn releases the
    same datagrams, the paced ones in the same order, and names the same next release time. (The list
    path sends a turn's unpaced datagrams ahead of its paced ones, the ring in the engine's order.)"""
    a = _release_schedule(False, seed)
    b = _release_schedule(True, seed)
    assert len(a) == len(b)
    held_back = 0
    for i, ((ra, pa), (rb, pb)) in enumerate(zip(a, b, strict=True)):
        assert sorted(ra) == sorted(rb), i
        assert [x for x in ra if x[1] != 4] == [x for x in rb if x[1] != 4], i
        assert pa == pb, i
        held_back += pa is not None
    assert held_back > 10  # the slow port made later turns wait: the comparison covered pacing
    assert any(p == 4 for turn, _ in a for _, p in turn)


def _script_sendmmsg(rs: RingSender, script: list[int], monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """`rs`'s sendmmsg, the first calls scripted: n > 0 takes at most n datagrams, -errno fails with it;
    then the real call. Returns the header-array address of every call, in order (filled as they come)."""
    real = rs._sendmmsg
    script = list(script)
    vecs: list[int] = []

    def sendmmsg(fd: int, vec: int, k: int, flags: int) -> int:
        vecs.append(vec)
        step = script.pop(0) if script else None
        if step is None:
            return int(real(fd, vec, k, flags))
        if step < 0:
            ctypes.set_errno(-step)
            return -1
        return int(real(fd, vec, min(step, k), flags))

    monkeypatch.setattr(rs, "_sendmmsg", sendmmsg)
    return vecs


@pytest.mark.parametrize(("script", "first", "lost"), [
    ([3, -errno.EAGAIN, 5, -errno.ENOBUFS], 3, 8),  # the error on the path that gathers released entries
    ([-errno.ENOBUFS, 2, -errno.EAGAIN], 2, 0),  # on the path that sends runs in place
])
def test_every_datagram_goes_once_through_partial_sends_a_full_buffer_and_an_error(
    script: list[int], first: int, lost: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sendmmsg taking part of a batch, failing with EAGAIN (socket buffer full), and with ENOBUFS for
    one datagram: what it took is not sent again, what it refused goes later in order, the one lost
    to the error is counted and skipped, and the ring's head follows."""
    out = _tagged(50, 2)
    with _rx() as drv_sock, _rx() as peer:
        d = SocketDriver(RingCtx(out), drv_sock, batch_io=False, tx_ring=True)  # type: ignore[arg-type]
        d.dst_port = peer.getsockname()[1]
        rs = d._rs
        assert rs is not None
        _script_sendmmsg(rs, script, monkeypatch)
        assert d.flush() == first and d.send_blocked == 1 and d.want_write
        total = first
        while d.queued:
            total += d.flush()
        assert total == 49 and d.send_errors == 1 and d.tx_datagrams == 49 and not d.want_write
        got = [int.from_bytes(w[:4], "big") for w in _drain(peer)]
    assert got == [i for i in range(50) if i != lost]


def test_released_slots_that_are_not_one_run_go_gathered_once_each_through_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Paced, a slow port holds its datagrams while a fast one's go: the released slots have holes, so
    their headers are gathered; through a partial send, EAGAIN and ENOBUFS on that path every datagram
    still goes exactly once, but the one lost to the error, which is counted."""
    out = _tagged(50, 2)
    with _rx() as drv_sock, _rx() as peer:
        d = SocketDriver(RingCtx(out), drv_sock, batch_io=False, tx_ring=True,  # type: ignore[arg-type]
                         port_rate_bps=[10**12, 10**9])
        d.dst_port = peer.getsockname()[1]
        rs = d._rs
        assert rs is not None
        vecs = _script_sendmmsg(rs, [3, -errno.EAGAIN, 5, -errno.ENOBUFS], monkeypatch)
        total = 0
        deadline = time.monotonic() + 30  # port 1 earns a datagram's tokens in ~70 us
        while (d.queued or total == 0) and time.monotonic() < deadline:
            total += d.flush()
        assert vecs[:4] == [rs._gather_addr] * 4  # the scripted steps all met the gathering path
        assert total == 49 and d.send_errors == 1 and d.tx_datagrams == 49 and d.queued == 0
        got = [int.from_bytes(w[:4], "big") for w in _drain(peer)]
    assert len(got) == 49 and len(set(got)) == 49  # each once; one lost
    assert [x for x in got if x % 2 == 0] == sorted(x for x in got if x % 2 == 0)  # each port in order
    assert [x for x in got if x % 2] == sorted(x for x in got if x % 2)


def test_a_ring_that_grew_for_a_burst_gives_its_slots_back_when_idle() -> None:
    """A burst of 1000 datagrams grows the ring to 1024 slots (9 MiB); once its live entries have stayed
    at a quarter of that or fewer for RING_SHRINK_NS and it is empty, it shrinks back, and what comes
    after still goes out intact. A ring still in use at its size keeps it."""
    from mrc.dataplane.driver import RING_SHRINK_NS
    from mrc.transport.txring import DEFAULT_CAP

    now = [0]
    ctx = RingCtx(_tagged(1000, 2))
    with _rx() as drv_sock, _rx() as peer:
        d = SocketDriver(ctx, drv_sock, batch_io=False, tx_ring=True,  # type: ignore[arg-type]
                         clock=lambda: now[0])
        d.dst_port = peer.getsockname()[1]
        ring = d._ring
        assert ring is not None
        sent = 0
        while sent < 1000:
            sent += d.flush()
            got = _drain(peer)
        assert ring.cap == 1024 and len(ring) == 0
        now[0] += RING_SHRINK_NS  # the first check saw the burst: the ring keeps its slots
        d.flush()
        assert ring.cap == 1024
        ctx.out = _tagged(300, 2)  # in use at a third of its slots: kept
        now[0] += RING_SHRINK_NS
        d.flush()
        got = _drain(peer)
        assert ring.cap == 1024 and len(got) == 300
        now[0] += RING_SHRINK_NS  # a quiet period: back to the default size
        d.flush()
        assert ring.cap == DEFAULT_CAP
        ctx.out = _tagged(40, 2)
        assert d.flush() == 40
        got = _drain(peer)
    assert [int.from_bytes(w[:4], "big") for w in got] == list(range(40))
    assert all(len(w) == 8248 for w in got)


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default for a context that has `datagrams_into`; ``MRC_TX_RING=0`` (or off, no, false)
    turns it off."""
    from mrc.dataplane import driver

    for v in ("0", "off"):
        monkeypatch.setenv("MRC_TX_RING", v)
        assert not driver.tx_ring_default()
        with _rx() as s:
            assert not SocketDriver(RingCtx([]), s).tx_ring  # type: ignore[arg-type]
    monkeypatch.delenv("MRC_TX_RING")
    assert driver.tx_ring_default()
    monkeypatch.setenv("MRC_TX_RING", "1")
    assert driver.tx_ring_default()
    with _rx() as s:
        d = SocketDriver(RingCtx([]), s)  # type: ignore[arg-type]
        assert d.tx_ring and d.stats()["tx_ring"] == 1 and d.flush() == 0 and d.queued == 0
    list_only = SimpleNamespace(datagrams_to_send=lambda now: [], next_deadline=lambda: None)
    with _rx() as s:
        assert not SocketDriver(list_only, s).tx_ring  # type: ignore[arg-type]  # (no datagrams_into)
