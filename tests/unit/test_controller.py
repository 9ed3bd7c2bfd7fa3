"""mrcd's controller as a pure state machine (`mrc.ctl.controller`): EV events, probe results, peer
reports and passes in, effects out, on the path table of default.toml (h0's view toward h2: EV i on plane
i mod 4, spine (i div 4) mod 2). The test's `Host` plays mrcd: it carries the effects out on a real engine
(`Context`: its EV profiles and QPs), records path-map writes and peer notes, and holds the ports'
receive counters. Only the controller's public API is used. mrcd's asynchronous peer notes
(`PeerNotifier`) are tested on real AF_UNIX sockets."""

from __future__ import annotations

import selectors
import socket
from pathlib import Path

import pytest

from mrc import topology
from mrc.ctl.controller import (
    ACCESS_QUIET_NS,
    RESTORE_PROBE_NS,
    Allow,
    Controller,
    Deny,
    Effect,
    ModifyPort,
    QpSample,
    SetEvState,
    SetPath,
    TellPeer,
    link_name,
)
from mrc.ctl.peer_notes import PeerNotifier
from mrc.topology import Path as TopoPath
from mrc.transport import Context, EvEntry, EvEvent, EvMode, EvState, ProbeResult, QueuePair
from mrc.transport.paths import EvProfile

ROOT = Path(__file__).resolve().parents[2]
PEERS = ("h1", "h2", "h3")


class Host:
    """h0's mrcd without a kernel: the controller's effects carried out on a real engine, path-map writes
    recorded in `path_map`, peer notes in `told` (or handed to `notifier`), receive counters in `rx`."""

    def __init__(self, *, peers: tuple[str, ...] = PEERS, notifier: PeerNotifier | None = None,
                 peer_socks: dict[str, str] | None = None) -> None:
        self.topo = topology.load(ROOT / "deploy" / "topologies" / "default.toml")
        self.ctl = Controller(self.topo, "h0", 64)
        self.ctx = Context(self.topo.mrc_address("h0").packed, ports=self.topo.planes)
        self.profiles: dict[str, EvProfile] = {}
        self.path_map: dict[tuple[str, int], TopoPath] = {}
        self.told: list[tuple[str, str]] = []
        self.rx: list[int | None] = [0] * self.topo.planes  # packets received per plane port
        self.notifier = notifier
        self.peer_socks = peer_socks or {}
        for h in peers:
            self.add_peer(h)

    def add_peer(self, peer: str) -> list[Effect]:
        planes = self.topo.planes
        prof = EvProfile(self.ctx.next_ev_profile_id(), [EvEntry(i, i % planes) for i in range(64)],
                         mode=EvMode.EXP)
        self.ctx.create_ev_profile(prof)
        self.profiles[peer] = prof
        return self.apply(self.ctl.add_peer(peer))

    def apply(self, effects: list[Effect]) -> list[Effect]:
        for e in effects:
            if isinstance(e, Deny):
                self.profiles[e.peer].deny(list(e.evs), e.time_ns)
            elif isinstance(e, Allow):
                self.profiles[e.peer].allow(list(e.evs), e.time_ns)
            elif isinstance(e, SetPath):
                self.path_map[(e.peer, e.ev)] = e.path
            elif isinstance(e, SetEvState):
                self.ctx.qps[e.qpn].paths.set_state(e.ev, e.state, e.time_ns)
            elif isinstance(e, ModifyPort):
                self.ctx.modify_port(e.plane, e.enabled, e.time_ns)
            elif isinstance(e, TellPeer):
                self.told.append((link_name(e.link), e.state))
                if self.notifier is not None:
                    for peer, path in self.peer_socks.items():
                        self.notifier.send(path, f"{peer} {link_name(e.link)} {e.state}\n".encode(), 0)
        return effects

    def qp(self, peer: str, *, pinned: bool = False) -> QueuePair:
        qp: QueuePair = self.ctx.create_qp(self.ctx.create_cq(), ev_profile=self.profiles[peer])
        qp.connect(self.topo.mrc_address(peer).packed, 0x100)
        self.ctl.add_qp(qp.qpn, peer, pinned=pinned)
        return qp

    def events(self, evs: list[EvEvent]) -> list[Effect]:
        return self.apply(self.ctl.on_ev_events(evs))

    def tick(self, now: int) -> list[Effect]:
        qps = {q: QpSample(sum(qp.paths.tx_packets), qp.state.name == "RTS")
               for q, qp in self.ctx.qps.items()}
        return self.apply(self.ctl.tick(now, self.rx, qps))

    def report(self, lk: frozenset[str], state: str, reporter: str, now: int) -> str:
        res, effects = self.ctl.on_link_status(lk, state, reporter, now)
        self.apply(effects)
        return res

    def denied_links(self) -> set[str]:
        return {link_name(lk) for lk in self.ctl.denied}


def _probes_fail(h: Host, port: int, t0: int, t1: int) -> None:
    """The engine's probes sent on `port` time out, one every 2 ms from t0 to t1."""
    h.ctl.on_probe_results([ProbeResult(t, 0, port, port, False, -1) for t in range(t0, t1 + 1, 2_000_000)])


def _bad(qp: QueuePair, idx: list[int], t: int) -> list[EvEvent]:
    prof: EvProfile = qp.paths.profile
    return [EvEvent(t, prof.profile_id, qp.qpn, i, i, i % 4, EvState.ASSUMED_BAD, 1) for i in idx]


def _spine0_plane0() -> list[int]:
    return [i for i in range(64) if i % 4 == 0 and (i // 4) % 2 == 0]


def test_path_table_matches_the_default_map() -> None:
    h = Host()
    t = h.ctl.routes["h2"]
    for i, p in enumerate(t.paths):
        assert p.plane == i % 4 and p.spine == (i // 4) % 2
        assert h.path_map[("h2", i)] == p
    assert not t.denied and not h.profiles["h2"].denied


def test_a_peer_added_after_a_failure_starts_with_its_evs_denied() -> None:
    """A link denied before a peer's table exists: the new table's EVs through it are DENIED at once,
    after its paths are written (mrcd creates tables on first use too)."""
    h = Host(peers=("h1", "h3"))
    lk = frozenset(("p1l0", "p1s1"))
    assert h.report(lk, "down", "h3", 1000) == "denied"
    effects = h.add_peer("h2")
    through = [i for i in range(64) if i % 4 == 1 and (i // 4) % 2 == 1]
    assert all(isinstance(e, SetPath) for e in effects[:-1]) and len(effects) == 65
    assert effects[-1] == Deny("h2", tuple(through), 0)
    assert h.profiles["h2"].denied == set(through) == h.ctl.routes["h2"].denied
    assert h.ctl.denied[lk]["h2"] == through


def test_spine_link_failure_is_denied_replaced_probed_and_restored() -> None:
    h = Host()
    qp = h.qp("h2")
    ctl = h.ctl
    through = [i for i in range(64) if i % 4 == 0 and (i // 4) % 2 == 0]  # plane 0, spine 0: 8 EVs
    h.events(_bad(qp, through[:5], 1000))
    h.tick(2000)
    assert not ctl.denied  # 5 of 8 is below 75 %
    h.events(_bad(qp, through[5:7], 3000))
    h.tick(4000)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"p0l0-p0s0", "p0l1-p0s0"}
    assert ("p0l0-p0s0", "down") in h.told
    t = h.ctl.routes["h2"]
    # all but one probe EV moved to spine 1 of plane 0 and allowed again
    probe_evs = {i for per in ctl.denied.values() for i in per.get("h2", [])}
    assert len(probe_evs) == 1
    for i in through:
        if i in probe_evs:
            assert qp.paths.state[i] == EvState.DENIED and t.paths[i].spine == 0
        else:
            assert t.paths[i].spine == 1 and t.paths[i].plane == 0
            assert h.path_map[("h2", i)].spine == 1
            assert qp.paths.state[i] == EvState.GOOD
    # the probe: after RESTORE_PROBE_NS the probe EV is handed to the engine (ASSUMED_BAD -> probes)
    h.tick(4000 + RESTORE_PROBE_NS)
    (probe,) = probe_evs
    assert qp.paths.state[probe] == EvState.ASSUMED_BAD
    h.events([EvEvent(5000 + RESTORE_PROBE_NS, 1, qp.qpn, probe, probe, 0, EvState.GOOD, 0)])
    assert not ctl.denied
    assert ("p0l0-p0s0", "up") in h.told
    assert t.paths == t.orig
    assert all(h.path_map[("h2", i)] == t.orig[i] for i in range(64))
    assert all(s == EvState.GOOD for i, s in enumerate(qp.paths.state) if i != probe)
    kinds = [a.kind for a in ctl.log]
    assert kinds.count("deny") == 2 and "replace" in kinds and kinds.count("restore") == 2


def test_a_stalled_host_is_not_a_link_failure() -> None:
    h = Host()
    qp = h.qp("h2")
    h.events(_bad(qp, list(range(0, 64, 2)), 1000))  # half of every plane's EVs
    h.tick(2000)
    assert not h.ctl.denied


def test_access_link_is_the_smallest_explanation() -> None:
    h = Host()
    qps = [h.qp(p) for p in ("h1", "h2", "h3")]
    for qp in qps:  # every plane-0 EV toward every peer
        h.events(_bad(qp, [i for i in range(64) if i % 4 == 0], 1000))
    h.tick(2000)
    assert not h.ctl.denied  # held: the port must have received nothing for ACCESS_QUIET_NS
    h.tick(2000 + ACCESS_QUIET_NS // 2)
    assert not h.ctl.denied
    _probes_fail(h, 0, 3000, 2000 + ACCESS_QUIET_NS)
    h.tick(2000 + ACCESS_QUIET_NS)
    assert {"-".join(sorted(lk)) for lk in h.ctl.denied} == {"h0-p0l0"}
    assert h.ctl.ports_down == {0}
    assert h.ctx.port_enabled[0] is False


def test_peer_report_denies_and_restores() -> None:
    h = Host()
    h.qp("h2")
    lk = frozenset(("p2l1", "p2s1"))
    assert h.report(lk, "down", "h2", 1000) == "denied"
    assert lk in h.ctl.denied and h.ctl.remote[lk] == {"h2"}
    assert h.told == []  # a reported link is not re-broadcast
    assert h.report(lk, "up", "h2", 2000) == "restored"
    assert not h.ctl.denied


def test_a_report_of_a_link_none_of_our_paths_crosses_changes_nothing() -> None:
    """link_status from a peer (or anyone on the control socket) naming a link with two equal ends, or
    nodes this host's paths never cross, used to be stored as denied: a one-name link then broke every
    later deny (Path.crosses needs two ends: an internal error per genuine report, and Controller.tick
    raising) and any number of made-up links grew the denied set. Now such a report is answered
    not_on_our_paths and kept nowhere; a genuine one still denies."""
    h = Host()
    h.qp("h2")
    for lk in (frozenset(("x",)), frozenset(("x", "y")), frozenset(("p2l1", "nowhere"))):
        assert h.report(lk, "down", "h2", 1000) == "not_on_our_paths"
        assert h.report(lk, "up", "h2", 1100) == "not_on_our_paths"
    assert not h.ctl.denied and not h.ctl.remote
    lk = frozenset(("p2l1", "p2s1"))
    assert h.report(lk, "down", "h2", 2000) == "denied" and lk in h.ctl.denied


@pytest.mark.parametrize("state", ["GOOD", "ASSUMED_BAD"])
def test_events_of_restricted_qps_are_ignored(state: str) -> None:
    h = Host()
    qp = h.qp("h2", pinned=True)
    h.events([EvEvent(1, 1, qp.qpn, i, i, 0, EvState[state], 1) for i in range(0, 64, 4)])
    h.tick(2)
    assert not h.ctl.bad and not h.ctl.denied


def test_ring_load_denies_only_the_failed_fabric_link() -> None:
    """make demo's case: QPs toward every peer, scattered ASSUMED_BAD EVs on healthy planes from
    congestion (one peer's whole plane 2, both spines), an idle QP, and p0l0-p0s0 failed: only the EVs
    through the failed link are denied; no access link, no port down, no plane lost."""
    h = Host()
    ctl = h.ctl
    q1, q2, q3 = (h.qp(p) for p in ("h1", "h2", "h3"))
    for qp in (q1, q2):  # h1 and h2 carry traffic; h3's QP is idle (its EVs stay GOOD whatever happens)
        qp.paths.tx_packets[1] = 1000
    h.tick(1000)
    assert ctl.busy(q1.qpn, 1000) and not ctl.busy(q3.qpn, 1000)
    # congestion: 13 of the 16 plane-2 EVs toward h2 (both spines), two plane-1 EVs toward h1
    congested = [i for i in range(64) if i % 4 == 2][:13]
    h.events(_bad(q2, congested, 2000) + _bad(q1, [1, 5], 2000))
    h.tick(3000)
    assert not ctl.denied  # not p2l1-h2 (h2's access link: h2's port), not p2l0-p2s0 (spine 1 bad too)
    # p0l0-p0s0 fails: the 8 EVs toward h2 through it (plane 0, spine 0); h3's 8 through it are idle
    through = [i for i in range(64) if i % 4 == 0 and (i // 4) % 2 == 0]
    h.events(_bad(q2, through, 4000))
    h.tick(5000)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"p0l0-p0s0", "p0l1-p0s0"}
    assert not ctl.ports_down and all(h.ctx.port_enabled)
    assert {lk for lk, _ in h.told} == {"p0l0-p0s0", "p0l1-p0s0"}
    denied = {i for i in range(64) if q2.paths.state[i] == EvState.DENIED}
    assert denied and denied <= set(through)  # the probe EV; the rest replaced onto spine 1
    for i in range(64):
        if i % 4 in (1, 2, 3):  # planes 1-3 untouched
            assert h.ctl.routes["h2"].paths[i] == h.ctl.routes["h2"].orig[i]


@pytest.mark.parametrize("order", ["down-order", "reversed"])
def test_reported_link_pair_restored_one_at_a_time_puts_every_ev_back(order: str) -> None:
    """make demo's peers: h3 localises p0l0-p0s0 and p0s0-p0l1 (one EV set) and reports them one after
    the other, then reports them back one after the other. h0's EVs toward h2 cross both: after the
    second report every replaced EV is back on its own path (spine 0), none is denied, nothing left
    in the controller's books."""
    h = Host()
    qp = h.qp("h2")
    ctl = h.ctl
    a, b = frozenset(("p0l0", "p0s0")), frozenset(("p0s0", "p0l1"))
    assert h.report(a, "down", "h3", 1000) == "denied"
    assert h.report(b, "down", "h3", 1001) == "denied"
    t = h.ctl.routes["h2"]
    through = _spine0_plane0()
    assert sum(1 for i in through if t.paths[i].spine == 1) == len(through) - 1  # replaced, one kept
    ups = [a, b] if order == "down-order" else [b, a]
    assert h.report(ups[0], "up", "h3", 2000) == "restored"
    assert h.report(ups[1], "up", "h3", 2001) == "restored"
    assert not ctl.denied and not ctl.remote
    assert t.paths == t.orig
    assert all(h.path_map[("h2", i)] == t.orig[i] for i in range(64))
    assert not h.profiles["h2"].denied
    assert all(s == EvState.GOOD for s in qp.paths.state)
    assert sorted(t.by_link[a]) == through


def test_replaced_ev_stays_off_a_link_that_is_still_denied() -> None:
    """Restoring one of two denied links moves a replaced EV back only when its own path avoids every
    link still denied; the later restore of the other link moves it back."""
    h = Host()
    h.qp("h2")
    ctl = h.ctl
    a, b = frozenset(("p0l0", "p0s0")), frozenset(("p0s0", "p0l1"))
    h.report(a, "down", "h3", 1000)
    h.report(b, "down", "h3", 1001)
    h.report(a, "up", "h3", 2000)
    t = h.ctl.routes["h2"]
    through = _spine0_plane0()
    assert all(not t.paths[i].crosses("p0s0", "p0l1") for i in through if i not in h.profiles["h2"].denied)
    assert b in ctl.denied
    h.report(b, "up", "h3", 3000)
    assert t.paths == t.orig and not h.profiles["h2"].denied


def _plane_bad_everywhere(h: Host, plane: int, t: int) -> list[QueuePair]:
    """QPs toward h1, h2, h3, every one of their EVs of `plane` ASSUMED_BAD (a late port looks like this:
    the engine's per-port loss threshold retires a plane's EVs toward every peer at once)."""
    qps = [h.qp(p) for p in ("h1", "h2", "h3")]
    for qp in qps:
        h.events(_bad(qp, [i for i in range(64) if i % 4 == plane], t))
    return qps


def test_own_access_link_is_not_denied_while_its_port_receives() -> None:
    """make demo's false positive (h0-p1l0 denied, its port down, for 105 ms): every plane-1 EV toward
    all three peers bad at once, while packets keep arriving on the plane-1 port. The link is only
    suspected; nothing is denied, no port goes down; when the EVs come back the suspicion is cleared."""
    h = Host()
    ctl = h.ctl
    qps = _plane_bad_everywhere(h, 1, 1000)
    t = 2000
    for _ in range(40):  # 4 x ACCESS_QUIET_NS of passes, the port receiving all along
        h.tick(t)
        h.rx[1] = (h.rx[1] or 0) + 3
        t += ACCESS_QUIET_NS // 10
    assert not ctl.denied and not ctl.ports_down and all(h.ctx.port_enabled)
    assert h.told == []
    assert [a.kind for a in ctl.log] == ["suspect"] and ctl.log[0].link == "h0-p1l0"
    for qp in qps:  # the engine's probes bring the EVs back
        h.events([EvEvent(t, 1, qp.qpn, i, i, 1, EvState.GOOD, 0) for i in range(1, 64, 4)])
    h.tick(t + 1)
    assert not ctl.suspect and [a.kind for a in ctl.log] == ["suspect", "cleared"]
    h.tick(t + 2 * ACCESS_QUIET_NS)
    assert not ctl.denied


def test_own_access_link_is_not_denied_when_a_probe_through_it_is_answered() -> None:
    """Without receive counters (None), an answered engine probe sent on the port shows it alive."""
    h = Host()
    h.rx = [None] * 4
    ctl = h.ctl
    qps = _plane_bad_everywhere(h, 2, 1000)
    h.tick(2000)
    t = 2000
    for _ in range(30):
        t += ACCESS_QUIET_NS // 10
        ctl.on_probe_results([ProbeResult(t - 1, qps[0].qpn, 2, 2, True, 900_000)])
        h.tick(t)
    assert not ctl.denied and not ctl.ports_down
    # the probes stop being answered (and nothing arrives): after ACCESS_QUIET_NS it is failed
    _probes_fail(h, 2, t + 10, t + ACCESS_QUIET_NS)
    h.tick(t + ACCESS_QUIET_NS // 2)
    assert not ctl.denied
    h.tick(t + ACCESS_QUIET_NS + 1)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"h0-p2l0"} and ctl.ports_down == {2}


def test_own_access_link_is_denied_once_its_port_falls_silent() -> None:
    """A dead access link: packets still queued toward it arrive for a while (the leaf's queue drains),
    then nothing. It is denied ACCESS_QUIET_NS after the last arrival, with its port."""
    h = Host()
    ctl = h.ctl
    _plane_bad_everywhere(h, 3, 1000)
    h.tick(2000)
    _probes_fail(h, 3, 3000, 2000 + 2 * ACCESS_QUIET_NS)
    h.rx[3] = (h.rx[3] or 0) + 5
    h.tick(2000 + ACCESS_QUIET_NS)  # received since the last look: not silent yet
    assert not ctl.denied
    h.tick(2000 + ACCESS_QUIET_NS + ACCESS_QUIET_NS // 2)
    assert not ctl.denied
    h.tick(2000 + 2 * ACCESS_QUIET_NS)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"h0-p3l0"}
    assert ctl.ports_down == {3} and h.ctx.port_enabled[3] is False
    assert not ctl.suspect


def test_a_silent_port_we_did_not_probe_is_not_a_dead_access_link() -> None:
    """fix3 of the testbed check: h0's plane-0 EVs toward its one busy peer all bad and its port silent
    for a window, but a silent port alone can be our own stall (nothing sent, nothing answered). Only
    probes timing out across the window, with the port still silent, make it dead."""
    h = Host()
    ctl = h.ctl
    _plane_bad_everywhere(h, 0, 1000)
    h.tick(2000)
    h.tick(2000 + 3 * ACCESS_QUIET_NS)  # a stall: one pass long after, no probe result in between
    assert not ctl.denied and 0 in ctl.suspect
    _probes_fail(h, 0, 2000 + 3 * ACCESS_QUIET_NS, 2000 + 3 * ACCESS_QUIET_NS + 2_000_000)  # a burst
    h.tick(2000 + 4 * ACCESS_QUIET_NS)
    assert not ctl.denied  # the failures span 2 ms of the 20 ms window
    _probes_fail(h, 0, 2000 + 4 * ACCESS_QUIET_NS, 2000 + 5 * ACCESS_QUIET_NS)
    h.tick(2000 + 5 * ACCESS_QUIET_NS)
    assert {"-".join(sorted(lk)) for lk in ctl.denied} == {"h0-p0l0"} and ctl.ports_down == {0}


def test_the_tick_that_sees_a_failure_carries_the_local_deny_and_replace() -> None:
    """Whatever the peers do, the pass that localises a failed fabric link returns the local DENY and
    REPLACE itself; the peer notes come after every local effect (mrcd sends them later, outside the
    engine lock)."""
    h = Host()
    qp = h.qp("h2")
    through = _spine0_plane0()
    assert h.events(_bad(qp, through, 1000)) == []
    effects = h.tick(2000)
    tells = [i for i, e in enumerate(effects) if isinstance(e, TellPeer)]
    local = [i for i, e in enumerate(effects) if not isinstance(e, TellPeer)]
    assert tells and local and max(local) < min(tells)
    assert {(link_name(e.link), e.state) for e in effects if isinstance(e, TellPeer)} == {
        ("p0l0-p0s0", "down"), ("p0l1-p0s0", "down")}
    denies = [e for e in effects if isinstance(e, Deny)]
    assert denies[0] == Deny("h2", tuple(through), 2000)
    replaced = [e for e in effects if isinstance(e, SetPath)]
    assert {e.ev for e in replaced} == set(through[1:]) and all(e.path.spine == 1 for e in replaced)
    assert Allow("h2", tuple(through[1:]), 2000) in effects
    assert qp.paths.state[through[0]] == EvState.DENIED  # carried out: the probe EV held, the rest moved
    assert all(qp.paths.state[i] == EvState.GOOD for i in through[1:])


def _listener(path: Path, backlog: int) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(backlog)
    return s


def test_an_unreachable_peer_does_not_delay_the_local_deny(tmp_path: Path) -> None:
    """mrcd's peer notes on non-blocking sockets: h1's mrcd never accepts (its backlog full), h2's is not
    there, h3's reads. The pass that localises the failure and the notifier's pump return at once (the
    old blocking connect took up to 50 ms per peer), with the local DENY / REPLACE already carried out;
    h3 gets its line when its socket is writable; h2 is dropped at once, h1 once it stays unreachable
    past the notifier's patience; both counted."""
    full = _listener(tmp_path / "h1.sock", 0)
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filler.setblocking(False)
    filler.connect_ex(str(tmp_path / "h1.sock"))  # the one queued connection a backlog of 0 holds
    ok = _listener(tmp_path / "h3.sock", 4)
    sel = selectors.DefaultSelector()
    notifier = PeerNotifier(sel, patience_ns=1_000_000_000)
    socks = {p: str(tmp_path / f"{p}.sock") for p in PEERS}
    try:
        h = Host(notifier=notifier, peer_socks=socks)
        qp = h.qp("h2")
        through = _spine0_plane0()
        h.events(_bad(qp, through, 1000))
        effects = h.tick(2000)
        notifier.pump(0)
        assert any(isinstance(e, Deny) for e in effects) and any(isinstance(e, SetPath) for e in effects)
        assert qp.paths.state[through[0]] == EvState.DENIED
        assert h.denied_links() == {"p0l0-p0s0", "p0l1-p0s0"}
        assert notifier.tally == {"sent": 0, "dropped": 2}  # h2's socket does not exist: both lines
        assert len(notifier.pending) == 2 and notifier.busy()  # h1's: EAGAIN, retried later
        # nothing waited on a peer: every socket the notifier opened is non-blocking (time is not measured)
        assert all(n.sock is not None and n.sock.gettimeout() == 0.0 for n in notifier.pending)
        for key, _mask in sel.select(1.0):
            notifier.on_writable(key.data, 0)
        assert notifier.tally["sent"] == 2
        ok.settimeout(1.0)
        lines = []
        for _ in range(2):  # one connection per line
            conn, _ = ok.accept()
            conn.settimeout(1.0)
            lines.append(conn.recv(4096).decode())
            conn.close()
        assert sorted(lines) == ["h3 p0l0-p0s0 down\n", "h3 p0l1-p0s0 down\n"]
        notifier.pump(500_000_000)
        assert len(notifier.pending) == 2  # still within its patience
        notifier.pump(1_000_000_000)
        assert not notifier.pending and not notifier.busy()
        assert notifier.tally == {"sent": 2, "dropped": 4}
    finally:
        notifier.close()
        sel.close()
        for s in (filler, full, ok):
            s.close()


@pytest.mark.parametrize("arg", ["--probe-timeout-us=0", "--probe-timeout-us=-5", "--reorder-us=x",
                                 "--probe-timeout-us=20000000"])
def test_mrcd_rejects_bad_durations(arg: str, capsys: pytest.CaptureFixture[str]) -> None:
    """mrcd's microsecond options say what is wrong (argparse exit 2), before anything is set up."""
    from mrc.ctl import daemon

    with pytest.raises(SystemExit) as e:
        daemon.main(["--host", "h0", arg])
    assert e.value.code == 2
    assert "microseconds" in capsys.readouterr().err
