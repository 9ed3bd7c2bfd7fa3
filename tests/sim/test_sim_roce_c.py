"""The RoCE baseline's hosts in C (mrc/sim/_roce.c, used with the fabric's C loop) against the Python
classes they transcribe (mrc/sim/roce.py), call by call: a requester and a responder of each kind talk
over a lossy, reordering, ECN-marking channel that also injects forged and stray packets (any kind, an
unknown connection, a PSN behind or far ahead), whose every decision comes from one seeded stream, and after
every call the packets out and every field of the connection (the DCTCP floats `cwnd` and `alpha` bit for
bit) must be the same. The experiment documents compared in test_sim_fast_loop.py would not show a small
change in the congestion arithmetic; this does."""

from __future__ import annotations

import random
from typing import Any

import pytest

from mrc.sim import fabric as fabric_mod
from mrc.sim import roce

SIMC = fabric_mod._SIMC
pytestmark = pytest.mark.skipif(SIMC is None, reason="mrc/sim/_simc.c is not built here (make setup)")

FIELDS = ("cid", "dst", "plane", "sport", "mtu", "npkts", "total", "una", "nxt", "high", "cwnd",
          "max_cwnd", "alpha", "g", "win_end", "win_acked", "win_marked", "cut_until", "rto_base",
          "linear_cnt", "retries", "rto_at", "done_at", "tx_packets", "retx_packets", "retx_bytes",
          "timeouts", "naks", "acked_bytes", "active")
NAMES = (*FIELDS, "deadline", "delivered")


def _pkt(dg: tuple[Any, ...]) -> tuple[Any, ...]:
    p, plane, sport, dst = dg
    return (p.kind, p.cid, p.psn, p.size, bool(p.ecn), plane, sport, dst, len(p))


class _Side:
    """One implementation's requester host 0 and responder host 1, connection 7 between them."""

    def __init__(self, c: bool, params: roce.RoceParams, total: int | None) -> None:
        mk = (lambda h: roce.new_host(h, params, SIMC)) if c else (lambda h: roce.RoceHost(h, params))
        self.req, self.rsp = mk(0), mk(1)
        assert (type(self.req).__module__ == "mrc.sim._simc") == c
        self.pkt_type = SIMC.RocePacket if c else roce.RocePacket
        self.conn = self.req.connect(7, 1, 2, 4242, total)
        self.rsp.accept(7, 0, 2, 4242)

    def state(self) -> tuple[Any, ...]:
        st = tuple(getattr(self.conn, f) for f in FIELDS)
        return (*st, self.req.next_deadline(), self.rsp.delivered(7))

    def deliver(self, host: Any, p: tuple[Any, ...], now: int, ecn: bool) -> None:
        kind, cid, psn, size, pecn = p[:5]
        host.receive(self.pkt_type(kind, cid, psn, size, pecn), now, ecn)


def _drive(seed: int, steps: int = 400) -> int:
    """Both implementations through the same `steps` calls; returns how many ECN-marked ACKs the
    requester saw (so the caller can check that the congestion arithmetic ran)."""
    rng = random.Random(seed)
    params = roce.RoceParams(mtu=rng.choice([1024, 4096]), timeout=rng.randint(0, 3),
                             linear_cnt=rng.choice([-1, 0, 2, 7]),
                             max_cwnd=rng.choice([8192, 65536, 1 << 20]), g=rng.choice([1 / 16, 1 / 8, 0.3]))
    total = rng.choice([None, rng.randint(1, 200_000)])
    sides = [_Side(False, params, total), _Side(True, params, total)]
    loss, mark, reorder = rng.uniform(0, 0.3), rng.uniform(0, 0.8), rng.uniform(0, 0.3)
    now = 0
    marked = 0
    to_rsp: list[tuple[Any, ...]] = []  # in flight, as plain tuples: the same for both sides
    to_req: list[tuple[Any, ...]] = []
    for _ in range(steps):
        now += rng.randint(1, 3000)
        action = rng.random()
        if action < 0.35:
            outs = [[_pkt(d) for d in s.req.datagrams_to_send(now)] for s in sides]
            assert outs[0] == outs[1]
            to_rsp += outs[0]
        elif action < 0.65 and to_rsp:
            i = rng.randrange(len(to_rsp)) if rng.random() < reorder else 0
            p = to_rsp.pop(i)
            if rng.random() >= loss:
                ecn = rng.random() < mark
                for s in sides:
                    s.deliver(s.rsp, p, now, ecn)
                outs = [[_pkt(d) for d in s.rsp.datagrams_to_send(now)] for s in sides]
                assert outs[0] == outs[1]
                to_req += outs[0]
        elif action < 0.9 and to_req:
            p = to_req.pop(0)
            if rng.random() >= loss / 2:
                marked += bool(p[4])
                for s in sides:
                    s.deliver(s.req, p, now, False)
        elif action < 0.93:
            # forged or stray: any kind, an unknown connection, a PSN anywhere (behind, far ahead)
            kind = rng.choice([roce.DATA, roce.ACK, roce.NAK])
            cid = rng.choice([7, 7, 8])
            psn = rng.randint(-3, sides[0].conn.nxt + 50)
            p = (kind, cid, psn, rng.choice([roce.CTRL_SIZE, roce.DATA_HDR + 1, 4096 + roce.DATA_HDR]),
                 rng.random() < 0.5)
            ecn = rng.random() < 0.5
            for s in sides:
                s.deliver(s.rsp if kind == roce.DATA else s.req, p, now, ecn)
            outs = [[_pkt(d) for d in s.rsp.datagrams_to_send(now)] for s in sides]
            assert outs[0] == outs[1]
            to_req += outs[0]
        elif action < 0.97:
            deadline = sides[0].req.next_deadline()
            if deadline is not None:
                now = max(now, deadline)
            for s in sides:
                s.req.handle_timer(now)
        else:
            flag = rng.random() < 0.7
            for s in sides:
                s.conn.active = flag
        a, b = sides[0].state(), sides[1].state()
        assert a == b, [(f, x, y) for f, x, y in zip(NAMES, a, b, strict=True) if x != y]
    return marked


@pytest.mark.parametrize("seed", range(40))
def test_c_hosts_match_python_call_by_call(seed: int) -> None:
    _drive(seed)


def test_the_comparison_covers_marks_cuts_naks_and_timeouts() -> None:
    """The seeds above reach what the comparison is for: marked ACKs (alpha moves), NAK rewinds, timeouts
    and a finished connection."""
    assert sum(_drive(seed) for seed in range(40)) > 0
    # and a long lossy run (half of what is in flight delivered each step, shuffled) reaches them all
    params = roce.RoceParams(mtu=1024, timeout=0, linear_cnt=0, max_cwnd=65536)
    s = _Side(True, params, 50_000)
    s2 = _Side(False, params, 50_000)
    rng = random.Random(1)
    now = 0
    pending: list[tuple[Any, ...]] = []
    for _ in range(3000):
        now += 500
        for side in (s, s2):
            side.req.handle_timer(now)
        outs = [[_pkt(d) for d in side.req.datagrams_to_send(now)] for side in (s, s2)]
        assert outs[0] == outs[1]
        pending += outs[0]
        rng.shuffle(pending)
        keep = pending[: len(pending) // 2]
        pending = pending[len(pending) // 2:]
        for p in keep:
            if rng.random() < 0.2:
                continue
            ecn = rng.random() < 0.5
            for side in (s, s2):
                side.deliver(side.rsp, p, now, ecn)
            acks = [[_pkt(d) for d in side.rsp.datagrams_to_send(now)] for side in (s, s2)]
            assert acks[0] == acks[1]
            for a in acks[0]:
                for side in (s, s2):
                    side.deliver(side.req, a, now, False)
        assert s.state() == s2.state()
    seen = {"alpha": s.conn.alpha > 0, "naks": s.conn.naks > 0, "timeouts": s.conn.timeouts > 0,
            "done": s.conn.done_at >= 0}
    assert all(seen.values()), seen


def test_c_reads_ints_of_every_width() -> None:
    """The C hosts read their parameters as C long longs: every width, sign, 30-bit digit boundary and
    int-like type reads as its value, and what a long long cannot hold is an OverflowError, not a wrong
    number."""
    import enum

    import numpy as np

    class Small(enum.IntEnum):
        FIVE = 5

    values: list[Any] = [0, 1, -1, 2**30 - 1, 2**30, -(2**30), 2**30 + 7, 2**60 - 1, -(2**60 - 1), 2**60,
                         -(2**60), 2**62, 2**63 - 1, -(2**63), Small.FIVE, np.int64(-7), True]
    for v in values:
        host = SIMC.RoceHost(0, roce.RoceParams(linear_cnt=v), 1000)
        assert host.connect(1, 1, 0, 1, None).linear_cnt == int(v), v
    for v in (2**63, -(2**63) - 1):
        with pytest.raises(OverflowError):
            SIMC.RoceHost(0, roce.RoceParams(linear_cnt=v), 1000)
