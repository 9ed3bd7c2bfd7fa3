"""The socket driver (`SocketDriver`) both ways (per-datagram calls and sendmmsg/recvmmsg batches) and
the ctypes batch calls themselves (`dataplane/mmsg.py`), on ::1: the bytes, the traffic class (ECN-CE),
the arrival interface (IPV6_PKTINFO) and the source the engine gets are identical."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from _udp_parts import rx_socket as _rx

from mrc.dataplane import mmsg
from mrc.dataplane.driver import (
    IPV6_PKTINFO,
    PACE_BURST,
    PACE_CATCHUP_NS,
    PACE_SLACK_NS,
    STUCK_TIMER_WAIT_NS,
    WIRE_OVERHEAD,
    SocketDriver,
)
from mrc.dataplane.udp import ECN_CE, ECN_ECT0
from mrc.transport import Datagram

pytestmark = pytest.mark.skipif(not mmsg.available() or not socket.has_ipv6, reason="needs Linux LP64, IPv6")
LO = socket.inet_pton(socket.AF_INET6, "::1")


def _send(tx: socket.socket, dst: Any, payloads: list[bytes], tclasses: list[int]) -> None:
    for p, tc in zip(payloads, tclasses, strict=True):
        tx.sendmsg([p], [(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tc.to_bytes(4, "little"))], 0, dst)


def _wait(sk: socket.socket) -> None:
    import select

    select.select([sk], [], [], 2)
    time.sleep(0.05)


def _payloads(n: int) -> list[bytes]:
    return [bytes([i & 0xFF]) * (100 + 37 * i % 8000) + i.to_bytes(4, "big") for i in range(n)]


def test_recv_batch_matches_recvmsg() -> None:
    payloads = _payloads(150)
    tcs = [(ECN_CE if i % 3 == 0 else ECN_ECT0) | (i % 8) << 2 for i in range(len(payloads))]
    lo_index = socket.if_nametoindex("lo")
    got: dict[str, list[tuple[bytes, int, int, bytes]]] = {}
    with _rx() as rx, socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as tx:
        tx.bind(("::1", 0))
        src_port = tx.getsockname()[1]
        for way in ("recvmsg", "recvmmsg"):
            _send(tx, rx.getsockname(), payloads, tcs)
            _wait(rx)
            rx.setblocking(False)
            out: list[tuple[bytes, int, int, bytes]] = []
            if way == "recvmsg":
                while True:
                    try:
                        data, anc, _f, addr = rx.recvmsg(9216, mmsg.CTL)
                    except BlockingIOError:
                        break
                    tc, ifx = -1, 0
                    for level, kind, value in anc:
                        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_TCLASS:
                            tc = int.from_bytes(value[:4], "little")
                        elif level == socket.IPPROTO_IPV6 and kind == IPV6_PKTINFO:
                            ifx = int.from_bytes(value[16:20], "little")
                    assert addr[1] == src_port
                    out.append((data, tc, ifx, socket.inet_pton(socket.AF_INET6, addr[0])))
            else:
                rb = mmsg.RecvBatch(32)
                while k := rb.recv(rx.fileno()):
                    for j in range(k):
                        tc, ifx = rb.control(j)
                        out.append((rb.payload(j), tc, ifx, rb.source(j)))
            got[way] = out
    assert len(got["recvmsg"]) == len(payloads)
    assert got["recvmmsg"] == got["recvmsg"]
    assert [g[0] for g in got["recvmmsg"]] == payloads
    assert [g[1] for g in got["recvmmsg"]] == tcs
    assert {g[2] for g in got["recvmmsg"]} == {lo_index}
    assert {g[3] for g in got["recvmmsg"]} == {LO}


def test_send_batch_bytes_and_destinations() -> None:
    payloads = _payloads(100)
    with _rx() as r1, _rx() as r2, socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as tx:
        sb = mmsg.SendBatch(16)
        names = [sb.name(LO, r.getsockname()[1]) for r in (r1, r2)]
        sent = 0
        while sent < len(payloads):
            k = min(16, len(payloads) - sent)
            for j in range(k):
                sb.load(j, payloads[sent + j], names[(sent + j) % 2])
            done = 0
            while done < k:
                done += sb.send(tx.fileno(), done, k - done)
            sent += k
        _wait(r2)
        for i, r in enumerate((r1, r2)):
            r.setblocking(False)
            got = []
            with pytest.raises(BlockingIOError):
                while True:
                    got.append(r.recv(9216))
            assert got == payloads[i::2]
        with pytest.raises(ValueError):
            sb.load(0, bytes(sb.bufsize + 1), names[0])


class FakeCtx:
    """What the driver calls on `mrc.transport.Context`."""

    def __init__(self, out: list[Datagram]) -> None:
        self.got: list[tuple[bytes, bool, int, bytes]] = []
        self.out = out

    def receive(self, data: bytes, now: int, ecn: bool, port: int, src: bytes) -> None:
        self.got.append((bytes(data), ecn, port, src))

    def datagrams_to_send(self, now: int) -> list[Datagram]:
        out, self.out = self.out, []
        return out

    def next_deadline(self) -> int | None:
        return None

    def handle_timer(self, now: int) -> None:
        pass


class FakeBatchCtx(FakeCtx):
    """A context with `receive_batch` (the driver then hands it whole batches), recording per datagram
    what the one-by-one calls would have been given."""

    fastpath = True

    def receive_batch(self, data: Any, lens: Any, ecn: Any, ports: Any, srcs: Any, now: int) -> None:
        for j in range(len(lens)):
            self.got.append((data[j, : int(lens[j])].tobytes(), bool(ecn[j]), int(ports[j]),
                             srcs[j].tobytes()))


@pytest.mark.parametrize("kernel", ["c", "numba"])
@pytest.mark.parametrize("rate", [None, [10**12, 10**12]])
@pytest.mark.parametrize("kind", [FakeCtx, FakeBatchCtx])
def test_driver_both_ways_identical(rate: list[int] | None, kind: type[FakeCtx], kernel: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-datagram calls and sendmmsg/recvmmsg batches give the engine and the wire the same; with a
    context that takes batches (FakeBatchCtx) the batch's lengths, ECN marks, ports and sources come
    from `mmsg.parse_controls`, in C (`_fastc.rx_parse`) or numba."""
    from mrc.transport import fastpath, rxbatch

    if kernel == "c" and not rxbatch._c_kernel_ok():
        pytest.skip("mrc/transport/_fastc.c is not built here (make setup)")
    if kernel == "numba" and not rxbatch.NUMBA_OK:
        pytest.skip("python-isal without crc32_gzip_refl")
    monkeypatch.setattr(rxbatch, "KERNEL", kernel)
    if kernel == "c":
        assert mmsg.parse_controls() is fastpath._compiled().rx_parse
    payloads = _payloads(300)
    tcs = [ECN_CE if i % 5 == 0 else ECN_ECT0 for i in range(len(payloads))]
    lo_index = socket.if_nametoindex("lo")
    results = {}
    for batch_io in (False, True):
        with _rx() as drv_sock, _rx() as peer, socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as tx:
            out = [Datagram(bytearray(p), i % 2, i % 16, LO) for i, p in enumerate(payloads)]
            ctx = kind(out) if batch_io else FakeCtx(out)
            d = SocketDriver(ctx, drv_sock, {lo_index: 7}, batch_io=batch_io,  # type: ignore[arg-type]
                             port_rate_bps=rate)
            assert d.batch_io is batch_io
            d.dst_port = peer.getsockname()[1]
            # receive: what the engine is handed
            _send(tx, drv_sock.getsockname(), payloads, tcs)
            _wait(drv_sock)
            while d.receive():
                pass
            assert d.rx_datagrams == len(payloads)
            assert d.rx_ce == sum(1 for t in tcs if t == ECN_CE)
            # send: what the peer gets, in order
            sent = 0
            deadline = time.monotonic() + 5
            while (sent < len(payloads) or d.queued) and time.monotonic() < deadline:
                sent += d.flush()
            assert sent == len(payloads) == d.tx_datagrams
            _wait(peer)
            peer.setblocking(False)
            wire = []
            with pytest.raises(BlockingIOError):
                while True:
                    wire.append(peer.recv(9216))
            results[batch_io] = (ctx.got, wire, d.stats()["send_errors"])
    rx_plain, wire_plain, _ = results[False]
    assert rx_plain == [(p, t == ECN_CE, 7, LO) for p, t in zip(payloads, tcs, strict=True)]
    if rate is None:
        assert wire_plain == payloads
    else:  # paced: each port's queue in order (the ports' queues are drained one after the other)
        for port in (0, 1):
            assert [w for w in wire_plain if int.from_bytes(w[-4:], "big") % 2 == port] == payloads[port::2]
    assert results[True] == results[False]
    if kind is FakeBatchCtx:
        assert d._kernel is True


def test_batch_io_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from mrc.dataplane import driver
    from mrc.transport import rxbatch

    monkeypatch.delenv("MRC_BATCH_IO", raising=False)
    for kernel in ("c", "numba", ""):  # on by default only where the batch receive is compiled C
        monkeypatch.setattr(rxbatch, "KERNEL", kernel)
        assert driver.batch_io_default() is (kernel == "c")
        monkeypatch.setenv("MRC_BATCH_IO", "0")
        assert not driver.batch_io_default()
        monkeypatch.setenv("MRC_BATCH_IO", "no")
        assert not driver.batch_io_default()
        monkeypatch.setenv("MRC_BATCH_IO", "1")
        assert driver.batch_io_default()
        monkeypatch.delenv("MRC_BATCH_IO")
    monkeypatch.setenv("MRC_BATCH_IO", "1")
    with _rx() as s:
        d = SocketDriver(FakeCtx([]), s, batch_io=None)  # type: ignore[arg-type]
        assert d.batch_io and d.stats()["batch_io"] == 1
    monkeypatch.setenv("MRC_BATCH_IO", "0")
    with _rx() as s:
        d = SocketDriver(FakeCtx([]), s)  # type: ignore[arg-type]
        assert not d.batch_io and d.receive() == 0 and d.flush() == 0


def _paced_driver(sock: socket.socket, rate_bps: int, clock: list[int]) -> SocketDriver:
    return SocketDriver(FakeCtx([]), sock, batch_io=False, port_rate_bps=[rate_bps],  # type: ignore[arg-type]
                        clock=lambda: clock[0])


def test_pacing_holds_the_port_rate_and_bounds_the_burst() -> None:
    # 200 datagrams of an 8 KiB payload handed at once to a 1 Gbit/s port: released no faster than the
    # rate allows after one bucket (PACE_BURST) plus one datagram, and in the time the rate gives them
    size = 8192 + 56
    need = size + WIRE_OVERHEAD
    rate = 1e9 / 8e9  # bytes per ns
    clock = [10**9]
    with _rx() as sock:
        d = _paced_driver(sock, 10**9, clock)
        t0 = clock[0]
        d._pace(t0, [Datagram(bytearray(size), 0, 0, LO) for _ in range(200)])
        released = len(d._pending) * need
        assert released <= PACE_BURST + need
        wakes = 0
        while d._pace_at is not None:
            clock[0] = d._pace_at
            d._pace(clock[0], [])
            wakes += 1
            released = len(d._pending) * need
            assert released <= PACE_BURST + need + rate * (clock[0] - t0), wakes
        assert len(d._pending) == 200 and wakes <= 200
        assert clock[0] - t0 == pytest.approx((200 * need - PACE_BURST) / rate, rel=0.01)


def test_a_sender_below_the_port_rate_is_not_held() -> None:
    # bursts of two 8 KiB datagrams at half a 10 Gbit/s port's rate (mrcd's sender: a SACK frees a few
    # packets per port): each burst fits the bucket's credit, so none waits, where a bucket that wanted
    # a whole datagram's worth held the second of every burst for a fraction of a microsecond
    size = 8192 + 56
    need = size + WIRE_OVERHEAD
    clock = [10**9]
    with _rx() as sock:
        d = _paced_driver(sock, 10**10, clock)
        period = int(4 * need / (10**10 / 8e9))  # two datagrams per four datagram-times: half the rate
        for k in range(100):
            clock[0] = 10**9 + k * period
            d._pace(clock[0], [Datagram(bytearray(size), 0, 0, LO) for _ in range(2)])
            assert d._pace_at is None, k
        assert len(d._pending) == 200 and d.paced == 0
        old = _paced_driver(sock, 10**10, clock)
        old.pace_debt = False  # MRC_PACE_DEBT=0: the rule before, which held the second of each burst
        for k in range(100):
            clock[0] = 10**9 + k * period
            old._pace(clock[0], [Datagram(bytearray(size), 0, 0, LO) for _ in range(2)])
        assert old.paced >= 99


def test_the_slack_is_time_of_the_port_rate() -> None:
    # 20 us of slack is 25 KB at 10 Gbit/s (four 8 KiB datagrams leave a full 16 KiB bucket at once,
    # 27 us of the port) but 250 B at 100 Mbit/s (one does: a burst grows by 20 us of the port, not by
    # a datagram)
    size = 8192 + 56
    for rate, burst in ((10**10, 4), (10**8, 1)):
        clock = [10**9]
        with _rx() as sock:
            d = _paced_driver(sock, rate, clock)
            d._pace(clock[0], [Datagram(bytearray(size), 0, 0, LO) for _ in range(6)])
            assert len(d._pending) == burst, rate
            assert len(d._pending) * (size + WIRE_OVERHEAD) <= PACE_BURST + rate / 8e9 * PACE_SLACK_NS + size


def _tagged(n: int, size: int, ports: int) -> list[Datagram]:
    """n datagrams of `size` bytes sprayed round robin over `ports`, each carrying its index."""
    return [Datagram(bytearray(i.to_bytes(4, "big") + bytes(size - 4)), i % ports, i, LO) for i in range(n)]


def _index(dg: Datagram) -> int:
    return int.from_bytes(dg.data[:4], "big")


@pytest.mark.parametrize("catchup", [True, False])
def test_a_backlogged_port_keeps_its_rate_across_long_turns(catchup: bool) -> None:
    # 200 datagrams of an 8 KiB payload at once to a 10 Gbit/s port, then one driver turn per
    # millisecond (a busy mrcd): the port has had a backlog throughout, so by each turn it has sent what
    # the rate gives in the time since the first (within a datagram), no more than that plus the
    # burst. With a backlogged port's credit capped at PACE_BURST (MRC_PACE_CATCHUP=0) each turn let
    # only ~5 datagrams go: 40 KB per millisecond, a thirtieth of the rate
    size = 8192 + 56
    need = size + WIRE_OVERHEAD
    rate = 10**10 / 8e9
    clock = [10**9]
    with _rx() as sock:
        d = _paced_driver(sock, 10**10, clock)
        d.pace_catchup = catchup
        t0 = clock[0]
        d._pace(t0, [Datagram(bytearray(size), 0, 0, LO) for _ in range(200)])
        for k in range(1, 3):
            clock[0] = t0 + k * 1_000_000
            d._pace(clock[0], [])
            released = len(d._pending) * need
            slack = rate * PACE_SLACK_NS
            assert released <= PACE_BURST + slack + need + rate * (clock[0] - t0)
            if catchup:
                assert released >= min(200 * need, rate * (clock[0] - t0)) - need, k
            else:
                assert released <= (k + 1) * (PACE_BURST + slack + need)
        assert (len(d._pending) == 200) is catchup


def test_catching_up_is_bounded_and_an_idle_port_keeps_only_the_burst() -> None:
    # a backlogged port whose driver stalled 50 ms catches up at most PACE_CATCHUP_NS of its rate at
    # once; once its queue is empty its credit is an idle port's, PACE_BURST, however long it idles
    size = 8192 + 56
    need = size + WIRE_OVERHEAD
    rate = 10**10 / 8e9
    slack = rate * PACE_SLACK_NS
    clock = [10**9]
    with _rx() as sock:
        d = _paced_driver(sock, 10**10, clock)
        d._pace(clock[0], [Datagram(bytearray(size), 0, 0, LO) for _ in range(1000)])
        first = len(d._pending)
        clock[0] += 50_000_000
        d._pace(clock[0], [])
        caught = len(d._pending) - first
        assert caught * need <= rate * PACE_CATCHUP_NS + slack + need
        assert caught * need >= rate * PACE_CATCHUP_NS - need
        while d._pace_at is not None:  # drain at the rate
            clock[0] = d._pace_at + 2_000_000
            d._pace(clock[0], [])
        assert len(d._pending) == 1000 and d.queued == 1000
        d._pending.clear()
        clock[0] += 50_000_000  # idle
        d._pace(clock[0], [Datagram(bytearray(size), 0, 0, LO) for _ in range(100)])
        assert len(d._pending) * need <= PACE_BURST + slack + need


@pytest.mark.parametrize("catchup", [True, False])
def test_paced_datagrams_leave_in_the_engines_order(catchup: bool) -> None:
    # 400 datagrams sprayed over four 1 Gbit/s ports: what the buckets let go, turn after turn, leaves
    # in the order the engine gave it (as unpaced), not port by port (the older rule,
    # MRC_PACE_CATCHUP=0: the last port's datagrams left a whole turn after the first port's)
    clock = [10**9]
    with _rx() as sock:
        d = SocketDriver(FakeCtx([]), sock, batch_io=False, port_rate_bps=[10**9] * 4,  # type: ignore[arg-type]
                         clock=lambda: clock[0])
        d.pace_catchup = catchup
        d._pace(clock[0], _tagged(400, 8192 + 56, 4))
        while d._pace_at is not None:
            clock[0] = d._pace_at + 300_000
            d._pace(clock[0], [])
        order = [_index(dg) for dg in d._pending]
        assert sorted(order) == list(range(400))
        assert (order == list(range(400))) is catchup


def test_a_port_that_must_wait_holds_back_only_its_own_datagrams() -> None:
    # port 0 at 10 Mbit/s, port 1 at 10 Gbit/s, sprayed alternately: 300 us later every one of port 1's
    # datagrams has left, in order, while port 0's wait for their tokens
    clock = [10**9]
    with _rx() as sock:
        d = SocketDriver(FakeCtx([]), sock, batch_io=False, port_rate_bps=[10**7, 10**10],  # type: ignore[arg-type]
                         clock=lambda: clock[0])
        d._pace(clock[0], _tagged(40, 8192 + 56, 2))
        clock[0] += 300_000
        d._pace(clock[0], [])
        odd = [_index(dg) for dg in d._pending if dg.port == 1]
        assert odd == list(range(1, 40, 2))
        assert d.queued - len(d._pending) >= 18 and d._pace_at is not None


class _StuckTimers:
    """An engine whose timer stays due after `handle_timer` (the bug class tests/unit/
    test_timer_progress.py pins in the real engine)."""

    def __init__(self, due: int) -> None:
        self.due = due
        self.calls = 0

    def next_deadline(self) -> int:
        return self.due

    def handle_timer(self, now: int) -> None:
        self.calls += 1

    def datagrams_to_send(self, now: int) -> list[Datagram]:
        return []


def test_a_deadline_that_stays_due_does_not_spin_the_loop() -> None:
    """The timers ran and the deadline is still due: counted once, and the loop waits
    STUCK_TIMER_WAIT_NS before it runs the timers again (not a turn per epoll call)."""
    clock = [10**9]
    eng = _StuckTimers(10**9 - 5)
    with _rx() as sock:
        d = SocketDriver(eng, sock, clock=lambda: clock[0])  # type: ignore[arg-type]
        d.turn(readable=False)
        assert eng.calls == 1 and d.timer_stuck == 1
        to = d.timeout()
        assert to is not None and to * 1e9 == pytest.approx(STUCK_TIMER_WAIT_NS, abs=1)
        for _ in range(100):  # turns within the wait (other events): the timers are not run again
            clock[0] += 1_000
            d.turn(readable=False)
        assert eng.calls == 1
        clock[0] = 10**9 + STUCK_TIMER_WAIT_NS
        d.turn(readable=False)
        assert eng.calls == 2 and d.timer_stuck == 2 and d.stats()["timer_stuck"] == 2
