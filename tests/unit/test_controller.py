"""mrcd's controller without a kernel: EV events in, DENY / REPLACE / probe / restore out, on the path table
of default.toml (h0's view toward h2: EV i on plane i mod 4, spine (i div 4) mod 2). The dataplane is a
recorder of path-map writes; the peers' control sockets a list."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from mrc import topology
from mrc.ctl.daemon import ACCESS_QUIET_NS, RESTORE_PROBE_NS, Controller, Daemon
from mrc.transport import Context, EvEvent, EvState, ProbeResult, QueuePair
from mrc.transport.paths import EvProfile

ROOT = Path(__file__).resolve().parents[2]


class FakeFabric:
    def __init__(self) -> None:
        self.paths: dict[tuple[str, str, int], Any] = {}

    def set_path(self, src: str, dst: str, ev: int, path: Any) -> None:
        self.paths[(src, dst, ev)] = path


def _daemon() -> Any:
    topo = topology.load(ROOT / "deploy" / "topologies" / "default.toml")
    d: Any = Daemon.__new__(Daemon)
    d.topo, d.host, d.evs = topo, "h0", 64
    d.ctx = Context(topo.mrc_address("h0").packed, ports=topo.planes)
    d.fd = FakeFabric()
    d.peers, d.qp_peer, d.pinned_qps = {}, {}, set()
    d.lock = threading.Lock()
    d.told = []
    d.tell_peers = lambda lk, state: d.told.append(("-".join(sorted(lk)), state))
    d.rx = [0] * topo.planes  # packets received per plane port (host_ingress's counters on a testbed)
    d.port_rx_packets = lambda plane: d.rx[plane]
    d.controller = Controller(d)
    for h in ("h1", "h2", "h3"):
        d.peer_table(h)
    return d


def _qp(d: Any, peer: str) -> QueuePair:
    cq = d.ctx.create_cq()
    qp: QueuePair = d.ctx.create_qp(cq, ev_profile=d.peers[peer].profile)
    qp.connect(d.peers[peer].gid, 0x100)
    d.qp_peer[qp.qpn] = peer
    return qp


def _probes_fail(ctl: Controller, port: int, t0: int, t1: int) -> None:
    """The engine's probes sent on `port` time out, one every 2 ms from t0 to t1."""
    ctl.on_probe_results([ProbeResult(t, 0, port, port, False, -1) for t in range(t0, t1 + 1, 2_000_000)])


def _bad(qp: QueuePair, idx: list[int], t: int) -> list[EvEvent]:
    prof: EvProfile = qp.paths.profile
    return [EvEvent(t, prof.profile_id, qp.qpn, i, i, i % 4, EvState.ASSUMED_BAD, 1) for i in idx]


def test_path_table_matches_the_default_map() -> None:
    d = _daemon()
    t = d.peers["h2"]
    for i, p in enumerate(t.paths):
        assert p.plane == i % 4 and p.spine == (i // 4) % 2
        assert d.fd.paths[("h0", "h2", i)] == p


def test_spine_link_failure_is_denied_replaced_probed_and_restored() -> None:
    d = _daemon()
    qp = _qp(d, "h2")
    ctl: Controller = d.controller
    through = [i for i in range(64) if i % 4 == 0 and (i // 4) % 2 == 0]  # plane 0, spine 0: 8 EVs
    ctl.on_events(_bad(qp, through[:5], 1000))
    ctl.tick(2000)
    assert not ctl.denied  # 5 of 8 is below 75 %
    ctl.on_events(_bad(qp, through[5:7], 3000))
    ctl.tick(4000)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"p0l0-p0s0", "p0l1-p0s0"}
    assert ("p0l0-p0s0", "down") in d.told
    t = d.peers["h2"]
    # all but one probe EV moved to spine 1 of plane 0 and allowed again
    probe_evs = {i for per in ctl.denied.values() for i in per.get("h2", [])}
    assert len(probe_evs) == 1
    for i in through:
        if i in probe_evs:
            assert qp.paths.state[i] == EvState.DENIED and t.paths[i].spine == 0
        else:
            assert t.paths[i].spine == 1 and t.paths[i].plane == 0
            assert d.fd.paths[("h0", "h2", i)].spine == 1
            assert qp.paths.state[i] == EvState.GOOD
    # the probe: after RESTORE_PROBE_NS the probe EV is handed to the engine (ASSUMED_BAD -> probes)
    ctl.tick(4000 + RESTORE_PROBE_NS)
    (probe,) = probe_evs
    assert qp.paths.state[probe] == EvState.ASSUMED_BAD
    ctl.on_events([EvEvent(5000 + RESTORE_PROBE_NS, 1, qp.qpn, probe, probe, 0, EvState.GOOD, 0)])
    assert not ctl.denied
    assert ("p0l0-p0s0", "up") in d.told
    assert t.paths == t.orig
    assert all(d.fd.paths[("h0", "h2", i)] == t.orig[i] for i in range(64))
    assert all(s == EvState.GOOD for i, s in enumerate(qp.paths.state) if i != probe)
    kinds = [a.kind for a in ctl.log]
    assert kinds.count("deny") == 2 and "replace" in kinds and kinds.count("restore") == 2


def test_a_stalled_host_is_not_a_link_failure() -> None:
    d = _daemon()
    qp = _qp(d, "h2")
    d.controller.on_events(_bad(qp, list(range(0, 64, 2)), 1000))  # half of every plane's EVs
    d.controller.tick(2000)
    assert not d.controller.denied


def test_access_link_is_the_smallest_explanation() -> None:
    d = _daemon()
    qps = [_qp(d, p) for p in ("h1", "h2", "h3")]
    for qp in qps:  # every plane-0 EV toward every peer
        d.controller.on_events(_bad(qp, [i for i in range(64) if i % 4 == 0], 1000))
    d.controller.tick(2000)
    assert not d.controller.denied  # held: the port must have received nothing for ACCESS_QUIET_NS
    d.controller.tick(2000 + ACCESS_QUIET_NS // 2)
    assert not d.controller.denied
    _probes_fail(d.controller, 0, 3000, 2000 + ACCESS_QUIET_NS)
    d.controller.tick(2000 + ACCESS_QUIET_NS)
    assert {"-".join(sorted(lk)) for lk in d.controller.denied} == {"h0-p0l0"}
    assert d.controller.ports_down == {0}
    assert d.ctx.port_enabled[0] is False


def test_peer_report_denies_and_restores() -> None:
    d = _daemon()
    _qp(d, "h2")
    lk = frozenset(("p2l1", "p2s1"))
    assert d.controller.peer_report(lk, "down", "h2", 1000) == "denied"
    assert lk in d.controller.denied and d.controller.remote[lk] == {"h2"}
    assert d.told == []  # a reported link is not re-broadcast
    assert d.controller.peer_report(lk, "up", "h2", 2000) == "restored"
    assert not d.controller.denied


@pytest.mark.parametrize("state", ["GOOD", "ASSUMED_BAD"])
def test_events_of_restricted_qps_are_ignored(state: str) -> None:
    d = _daemon()
    qp = _qp(d, "h2")
    d.pinned_qps.add(qp.qpn)
    d.controller.on_events([EvEvent(1, 1, qp.qpn, i, i, 0, EvState[state], 1) for i in range(0, 64, 4)])
    d.controller.tick(2)
    assert not d.controller.bad and not d.controller.denied


def test_ring_load_denies_only_the_failed_fabric_link() -> None:
    """make demo's case: QPs toward every peer, scattered ASSUMED_BAD EVs on healthy planes from
    congestion (one peer's whole plane 2, both spines), an idle QP, and p0l0-p0s0 failed: only the EVs
    through the failed link are denied; no access link, no port down, no plane lost."""
    d = _daemon()
    ctl: Controller = d.controller
    q1, q2, q3 = (_qp(d, p) for p in ("h1", "h2", "h3"))
    for qp in (q1, q2):  # h1 and h2 carry traffic; h3's QP is idle (its EVs stay GOOD whatever happens)
        qp.paths.tx_packets[1] = 1000
    ctl.tick(1000)
    assert ctl.busy(q1.qpn, 1000) and not ctl.busy(q3.qpn, 1000)
    # congestion: 13 of the 16 plane-2 EVs toward h2 (both spines), two plane-1 EVs toward h1
    congested = [i for i in range(64) if i % 4 == 2][:13]
    ctl.on_events(_bad(q2, congested, 2000) + _bad(q1, [1, 5], 2000))
    ctl.tick(3000)
    assert not ctl.denied  # not p2l1-h2 (h2's access link: h2's port), not p2l0-p2s0 (spine 1 bad too)
    # p0l0-p0s0 fails: the 8 EVs toward h2 through it (plane 0, spine 0); h3's 8 through it are idle
    through = [i for i in range(64) if i % 4 == 0 and (i // 4) % 2 == 0]
    ctl.on_events(_bad(q2, through, 4000))
    ctl.tick(5000)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"p0l0-p0s0", "p0l1-p0s0"}
    assert not ctl.ports_down and all(d.ctx.port_enabled)
    assert {lk for lk, _ in d.told} == {"p0l0-p0s0", "p0l1-p0s0"}
    denied = {i for i in range(64) if q2.paths.state[i] == EvState.DENIED}
    assert denied and denied <= set(through)  # the probe EV; the rest replaced onto spine 1
    for i in range(64):
        if i % 4 in (1, 2, 3):  # planes 1-3 untouched
            assert d.peers["h2"].paths[i] == d.peers["h2"].orig[i]


def _spine0_plane0() -> list[int]:
    return [i for i in range(64) if i % 4 == 0 and (i // 4) % 2 == 0]


@pytest.mark.parametrize("order", ["down-order", "reversed"])
def test_reported_link_pair_restored_one_at_a_time_puts_every_ev_back(order: str) -> None:
    """make demo's peers: h3 localises p0l0-p0s0 and p0s0-p0l1 (one EV set) and reports them one after
    the other, then reports them back one after the other. h0's EVs toward h2 cross both: after the
    second report every replaced EV is back on its own path (spine 0), none is denied, nothing left
    in the controller's books."""
    d = _daemon()
    qp = _qp(d, "h2")
    ctl: Controller = d.controller
    a, b = frozenset(("p0l0", "p0s0")), frozenset(("p0s0", "p0l1"))
    assert ctl.peer_report(a, "down", "h3", 1000) == "denied"
    assert ctl.peer_report(b, "down", "h3", 1001) == "denied"
    t = d.peers["h2"]
    through = _spine0_plane0()
    assert sum(1 for i in through if t.paths[i].spine == 1) == len(through) - 1  # replaced, one kept
    ups = [a, b] if order == "down-order" else [b, a]
    assert ctl.peer_report(ups[0], "up", "h3", 2000) == "restored"
    assert ctl.peer_report(ups[1], "up", "h3", 2001) == "restored"
    assert not ctl.denied and not ctl.remote
    assert t.paths == t.orig
    assert all(d.fd.paths[("h0", "h2", i)] == t.orig[i] for i in range(64))
    assert not t.profile.denied
    assert all(s == EvState.GOOD for s in qp.paths.state)
    assert sorted(t.by_link[a]) == through


def test_replaced_ev_stays_off_a_link_that_is_still_denied() -> None:
    """Restoring one of two denied links moves a replaced EV back only when its own path avoids every
    link still denied; the later restore of the other link moves it back."""
    d = _daemon()
    _qp(d, "h2")
    ctl: Controller = d.controller
    a, b = frozenset(("p0l0", "p0s0")), frozenset(("p0s0", "p0l1"))
    ctl.peer_report(a, "down", "h3", 1000)
    ctl.peer_report(b, "down", "h3", 1001)
    ctl.peer_report(a, "up", "h3", 2000)
    t = d.peers["h2"]
    through = _spine0_plane0()
    assert all(not t.paths[i].crosses("p0s0", "p0l1") for i in through if i not in t.profile.denied)
    assert b in ctl.denied
    ctl.peer_report(b, "up", "h3", 3000)
    assert t.paths == t.orig and not t.profile.denied


def _plane_bad_everywhere(d: Any, plane: int, t: int) -> list[QueuePair]:
    """QPs toward h1, h2, h3, every one of their EVs of `plane` ASSUMED_BAD (a late port looks like this:
    the engine's per-port loss threshold retires a plane's EVs toward every peer at once)."""
    qps = [_qp(d, p) for p in ("h1", "h2", "h3")]
    for qp in qps:
        d.controller.on_events(_bad(qp, [i for i in range(64) if i % 4 == plane], t))
    return qps


def test_own_access_link_is_not_denied_while_its_port_receives() -> None:
    """make demo's false positive (h0-p1l0 denied, its port down, for 105 ms): every plane-1 EV toward
    all three peers bad at once, while packets keep arriving on the plane-1 port. The link is only
    suspected; nothing is denied, no port goes down; when the EVs come back the suspicion is cleared."""
    d = _daemon()
    ctl: Controller = d.controller
    qps = _plane_bad_everywhere(d, 1, 1000)
    t = 2000
    for _ in range(40):  # 4 x ACCESS_QUIET_NS of passes, the port receiving all along
        ctl.tick(t)
        d.rx[1] += 3
        t += ACCESS_QUIET_NS // 10
    assert not ctl.denied and not ctl.ports_down and all(d.ctx.port_enabled)
    assert d.told == []
    assert [a.kind for a in ctl.log] == ["suspect"] and ctl.log[0].link == "h0-p1l0"
    for qp in qps:  # the engine's probes bring the EVs back
        ctl.on_events([EvEvent(t, 1, qp.qpn, i, i, 1, EvState.GOOD, 0) for i in range(1, 64, 4)])
    ctl.tick(t + 1)
    assert not ctl.suspect and [a.kind for a in ctl.log] == ["suspect", "cleared"]
    ctl.tick(t + 2 * ACCESS_QUIET_NS)
    assert not ctl.denied


def test_own_access_link_is_not_denied_when_a_probe_through_it_is_answered() -> None:
    """Without receive counters (None), an answered engine probe sent on the port shows it alive."""
    d = _daemon()
    d.port_rx_packets = lambda plane: None
    ctl: Controller = d.controller
    qps = _plane_bad_everywhere(d, 2, 1000)
    ctl.tick(2000)
    t = 2000
    for _ in range(30):
        t += ACCESS_QUIET_NS // 10
        ctl.on_probe_results([ProbeResult(t - 1, qps[0].qpn, 2, 2, True, 900_000)])
        ctl.tick(t)
    assert not ctl.denied and not ctl.ports_down
    # the probes stop being answered (and nothing arrives): after ACCESS_QUIET_NS it is failed
    _probes_fail(ctl, 2, t + 10, t + ACCESS_QUIET_NS)
    ctl.tick(t + ACCESS_QUIET_NS // 2)
    assert not ctl.denied
    ctl.tick(t + ACCESS_QUIET_NS + 1)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"h0-p2l0"} and ctl.ports_down == {2}


def test_own_access_link_is_denied_once_its_port_falls_silent() -> None:
    """A dead access link: packets still queued toward it arrive for a while (the leaf's queue drains),
    then nothing. It is denied ACCESS_QUIET_NS after the last arrival, with its port."""
    d = _daemon()
    ctl: Controller = d.controller
    _plane_bad_everywhere(d, 3, 1000)
    ctl.tick(2000)
    _probes_fail(ctl, 3, 3000, 2000 + 2 * ACCESS_QUIET_NS)
    d.rx[3] += 5
    ctl.tick(2000 + ACCESS_QUIET_NS)  # received since the last look: not silent yet
    assert not ctl.denied
    ctl.tick(2000 + ACCESS_QUIET_NS + ACCESS_QUIET_NS // 2)
    assert not ctl.denied
    ctl.tick(2000 + 2 * ACCESS_QUIET_NS)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"h0-p3l0"}
    assert ctl.ports_down == {3} and d.ctx.port_enabled[3] is False
    assert not ctl.suspect


def test_a_silent_port_we_did_not_probe_is_not_a_dead_access_link() -> None:
    """fix3 of the testbed check: h0's plane-0 EVs toward its one busy peer all bad and its port silent
    for a window, but a silent port alone can be our own stall (nothing sent, nothing answered). Only
    probes timing out across the window, with the port still silent, make it dead."""
    d = _daemon()
    ctl: Controller = d.controller
    _plane_bad_everywhere(d, 0, 1000)
    ctl.tick(2000)
    ctl.tick(2000 + 3 * ACCESS_QUIET_NS)  # a stall: one pass long after, no probe result in between
    assert not ctl.denied and 0 in ctl.suspect
    _probes_fail(ctl, 0, 2000 + 3 * ACCESS_QUIET_NS, 2000 + 3 * ACCESS_QUIET_NS + 2_000_000)  # a burst
    ctl.tick(2000 + 4 * ACCESS_QUIET_NS)
    assert not ctl.denied  # the failures span 2 ms of the 20 ms window
    _probes_fail(ctl, 0, 2000 + 4 * ACCESS_QUIET_NS, 2000 + 5 * ACCESS_QUIET_NS)
    ctl.tick(2000 + 5 * ACCESS_QUIET_NS)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"h0-p0l0"} and ctl.ports_down == {0}


@pytest.mark.parametrize("arg", ["--probe-timeout-us=0", "--probe-timeout-us=-5", "--reorder-us=x",
                                 "--probe-timeout-us=20000000"])
def test_mrcd_rejects_bad_durations(arg: str, capsys: pytest.CaptureFixture[str]) -> None:
    """mrcd's microsecond options say what is wrong (argparse exit 2), before anything is set up."""
    from mrc.ctl import daemon

    with pytest.raises(SystemExit) as e:
        daemon.main(["--host", "h0", arg])
    assert e.value.code == 2
    assert "microseconds" in capsys.readouterr().err
