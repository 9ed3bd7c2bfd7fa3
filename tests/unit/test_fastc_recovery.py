"""The C path's loss detection walk (`_fastc.loss_scan`) and RTT estimators (`_fastc.rtt_sample`) against
`Recovery._detect_losses` and `_rtt_sample` / `_rack_sample` in Python, on random QP states: the same PSNs
declared lost, by the same rule, in the same order, the same loss pointer and timer, the same estimator
state. The transfers in test_fastpath.py compare whole runs (wire bytes and state); these reach the
corners a run seldom does (lookahead exhausted, thresholds at NEVER, penalised EVs, items the C code does
not read, which hand the walk back to Python)."""

from __future__ import annotations

import importlib
import random
from array import array
from collections import deque
from typing import Any

import pytest

from mrc.transport import fastpath
from mrc.transport.qpcore import _ACKED, _INFLIGHT, _LOST, NEVER
from mrc.transport.recovery import RACK_CALM, Recovery

L = importlib.import_module("mrc.sim.loopback")
C = fastpath._compiled()

pytestmark = pytest.mark.skipif(C is None, reason="mrc/transport/_fastc.c is not built here (make setup)")


def _qp() -> Any:
    run = L.build(L.LoopbackConfig(size=1 << 20, seed=1))
    return run.qa


def _random_state(qp: Any, rng: random.Random) -> dict[str, Any]:
    """A random requester state for the walk: W slots around [snd_una, snd_nxt), their states, serials,
    send times and EVs, per-port thresholds (some NEVER), penalised EVs, queued retransmissions."""
    W = qp.W
    nports = len(qp.port_thr)
    nev = len(qp.paths.ev_port)
    una = rng.randrange(0, 5 * W)
    out = rng.randrange(0, W + 1)
    now = rng.randrange(1_000_000, 2_000_000)
    st: dict[str, Any] = {
        "snd_una": una, "snd_nxt": una + out, "rack_next": una + rng.randrange(-3, max(out, 1)),
        "latest_acked_serial": rng.randrange(0, 3 * W),
        "same_port_rack": rng.random() < 0.8,
        "tx_state": [rng.choice((_INFLIGHT, _INFLIGHT, _LOST, _ACKED)) for _ in range(W)],
        "tx_retx": [rng.random() < 0.1 for _ in range(W)],
        "tx_serial": [rng.randrange(0, 3 * W) for _ in range(W)],
        "tx_time": [now - rng.randrange(0, 400_000) for _ in range(W)],
        "tx_ev": [rng.randrange(nev) for _ in range(W)],
        "port_thr": [rng.choice((NEVER, rng.randrange(10_000, 300_000))) for _ in range(nports)],
        "rack_ser": [rng.randrange(0, 3 * W) for _ in range(nports)],
        "rack_thr": [rng.choice((NEVER, rng.randrange(5_000, 200_000))) for _ in range(nports)],
        "pen": [rng.choice((0, 0, 0, 1, 3)) for _ in range(nev)],
        "rtxq": deque((p, rng.randrange(0, 3 * W)) for p in sorted(rng.sample(range(una, una + out + 1),
                                                                            min(out, rng.randrange(0, 6))))),
        "now": now,
    }
    return st


def _apply(qp: Any, st: dict[str, Any]) -> None:
    for k, v in st.items():
        if k == "pen":
            qp.paths.pen = list(v)
        elif k == "rtxq":
            qp.rtxq = deque(v)
        elif k in ("tx_serial", "tx_time", "tx_ev"):
            getattr(qp, k)[:] = array("q", v)  # the QP's int64 slot arrays (qpcore._i64)
        elif k != "now":
            setattr(qp, k, list(v) if isinstance(v, list) else v)
    qp.rack_lost = {}


def _walk(qp: Any, st: dict[str, Any], fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """`_detect_losses(now)` on state `st`, with `_lost` and `_rack_declared` recorded instead of run
    (the walk never reads back what they change)."""
    _apply(qp, st)
    qp.fast_losses = C.loss_scan if fast else None
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(Recovery, "_lost", lambda self, psn, slot, now, b: calls.append(("lost", psn, slot)))
    monkeypatch.setattr(Recovery, "_rack_declared", lambda self, psn, p, now: calls.append(("rack", psn, p)))
    c0 = (qp.c["retx_sack"], qp.c["retx_same_port"])
    qp._detect_losses(st["now"])
    monkeypatch.undo()
    return (calls, qp.rack_next, qp.loss_deadline, list(qp.rtxq),
            (qp.c["retx_sack"] - c0[0], qp.c["retx_same_port"] - c0[1]))


def test_loss_scan_declares_what_the_python_walk_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    qp = _qp()
    rng = random.Random(7)
    declared = same_port = 0
    for _ in range(400):
        st = _random_state(qp, rng)
        py = _walk(qp, st, False, monkeypatch)
        c = _walk(qp, st, True, monkeypatch)
        assert c == py, st
        declared += len([x for x in py[0] if x[0] == "lost"])
        same_port += py[4][1]
    assert declared > 100 and same_port > 20  # both rules were reached


def test_loss_scan_hands_state_it_does_not_read_back_to_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """Penalties that are bools, send times whose deadline passes 64 bits: the walk goes on in Python
    from the first it meets, with the same result as all in Python."""
    qp = _qp()
    rng = random.Random(11)
    handed = 0
    for i in range(200):
        st = _random_state(qp, rng)
        if i % 2:
            st["pen"] = [bool(x) for x in st["pen"]]
        else:
            st["tx_time"] = [(1 << 63) - 1 - rng.randrange(1000) if rng.random() < 0.5 else t
                             for t in st["tx_time"]]
        py = _walk(qp, st, False, monkeypatch)
        codes: list[int] = []

        def spy(*a: Any, scan: Any = C.loss_scan, codes: list[int] = codes) -> Any:
            r = scan(*a)
            codes.append(r[4])
            return r

        monkeypatch.setattr(C, "loss_scan", spy)
        c = _walk(qp, st, True, monkeypatch)
        assert c == py, st
        handed += -1 in codes
    assert handed > 10


def _estimators(qp: Any) -> tuple[Any, ...]:
    return (qp.min_rtt, qp.srtt, qp.rttvar, list(qp.port_srtt), list(qp.port_rttvar), list(qp.port_thr),
            list(qp.rack_calm), list(qp.rack_reo), list(qp.rack_rtt), list(qp.rack_thr))


def test_rtt_sample_is_the_python_estimators() -> None:
    qp = _qp()
    rng = random.Random(3)
    nports = len(qp.port_thr)
    seen_calm = False
    for _ in range(300):
        st: dict[str, Any] = {
            "min_rtt": rng.choice((NEVER, rng.randrange(1_000, 50_000))),
            "srtt": rng.choice((0, rng.randrange(1_000, 90_000))),
            "rttvar": rng.randrange(0, 20_000),
            "port_srtt": [rng.choice((0, rng.randrange(1_000, 90_000))) for _ in range(nports)],
            "port_rttvar": [rng.randrange(0, 20_000) for _ in range(nports)],
            "port_thr": [rng.randrange(0, 200_000) for _ in range(nports)],
            "rack_calm": [rng.choice((0, RACK_CALM - 1, rng.randrange(RACK_CALM))) for _ in range(nports)],
            "rack_reo": [rng.randrange(0, 90_000) for _ in range(nports)],
            "rack_rtt": [rng.randrange(0, 90_000) for _ in range(nports)],
            "rack_thr": [rng.choice((NEVER, rng.randrange(0, 200_000))) for _ in range(nports)],
            "port_min_rtt": [rng.choice((NEVER, rng.randrange(1_000, 40_000))) for _ in range(nports)],
        }
        rtt = rng.randrange(0, 100_000)
        port = rng.randrange(-1, nports)
        rack = port >= 0 and rng.random() < 0.7
        if rack:
            st["port_min_rtt"][port] = min(st["port_min_rtt"][port], rtt)  # as on_sack leaves it
            seen_calm |= st["rack_calm"][port] == RACK_CALM - 1
        _apply(qp, st)
        qp._rtt_sample(rtt, port)
        if rack:
            qp._rack_sample(rtt, port)
        py = _estimators(qp)
        _apply(qp, st)
        assert C.rtt_sample(qp, rtt, port, rack) is True
        assert _estimators(qp) == py, (st, rtt, port, rack)
    assert seen_calm
    # an item it does not read: nothing changed, and False (the caller runs the Python methods)
    _apply(qp, st)
    qp.rack_reo[0] = 1.5
    before = _estimators(qp)
    assert C.rtt_sample(qp, 1000, 0, True) is False
    assert _estimators(qp) == before
