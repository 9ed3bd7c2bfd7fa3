"""mrcd's controller as a pure state machine (docs/daemon.md, "Controller").

It is fed EV events, probe results, peer reports, operator requests and, once per pass, `tick` with the
QPs' send counters and a view of the ports' receive counters; each call returns the *effects* it decided
(`Deny`, `Allow`, `SetPath`, `SetEvState`, `ModifyPort`, `TellPeer`) and records its decisions in `log`.
It holds no socket, no BPF map, no engine object and no lock: mrcd (`ctl/daemon.py`) carries the engine
effects out under its engine lock, writes the path map, and sends `TellPeer` asynchronously on
non-blocking sockets, so a slow or dead peer mrcd can never hold up the local DENY / REPLACE. The
controller keeps its own copy of each peer's path table and denied EV set, which the effects it returns
keep equal to the engine's (it is the only writer of both)."""

from __future__ import annotations

import ipaddress
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Protocol

from mrc.topology import Path as TopoPath
from mrc.topology import Topology
from mrc.transport import EvEvent, EvState, ProbeResult

RESTORE_PROBE_NS: Final = 50_000_000  # probe a denied link every 50 ms
BUSY_NS: Final = 1_000_000_000  # a QP that sent nothing for this long says nothing about its EVs
ACCESS_QUIET_NS: Final = 20_000_000  # own access link: failed only once its port received nothing this long
MAX_LOG: Final = 100_000
#: Peers whose reports of one denied link are kept (the link is restored once all of them report it up).
#: A fabric has at most mrc.topology.MAX_HOSTS hosts, but the reporter is whatever a `link_status`
#: request says: without a bound, forged reports with distinct `from` strings grew mrcd by a string
#: each, for as long as the link stayed down. One more reporter is refused and counted
#: (`reporters_refused`, in mrcd's `stats`); the link then waits for the ones kept.
MAX_REPORTERS_PER_LINK: Final = 64
#: The longest `Action.detail` kept (longer ones are cut, marked with "..."): the log holds MAX_LOG
#: actions and `actions` answers them, so each must be small whatever a detail was built from.
MAX_DETAIL: Final = 200

Link = frozenset[str]


def link_name(lk: Link) -> str:
    return "-".join(sorted(lk))


@dataclass
class Action:
    time_ns: int
    kind: str  # an ActionKind value (Controller.act checks)
    link: str
    evs: int
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"time_ns": self.time_ns, "kind": self.kind, "link": self.link, "evs": self.evs,
                "detail": self.detail}


class ActionKind(StrEnum):
    """What the controller does: the closed set behind `Action.kind`, `Controller.counts` and the exporter's
    `action` label (every value is exported from the first scrape, at 0 until it happens). `Controller.act`
    refuses any other kind, so a new action cannot go unexported."""

    DENY = "deny"  # EVs through a failed link DENIED (or an operator's `mrcctl ev deny`)
    REPLACE = "replace"  # REPLACE_EV: EVs of a denied link moved to paths that avoid it
    RESTORE = "restore"  # a denied link's EVs allowed again (probe answered, peer report, operator)
    PORT_DOWN = "port_down"  # own plane port disabled (PORT_STATUS to peers)
    PORT_UP = "port_up"  # own plane port enabled again
    SUSPECT = "suspect"  # own access link looks failed: held until its port is quiet
    CLEARED = "cleared"  # a suspicion dropped: its EVs are no longer failed
    PROBE = "probe"  # one EV of a denied link set ASSUMED_BAD so that the engine probes it


# -- effects: what the caller carries out, in the order returned


@dataclass(frozen=True)
class Deny:
    """DENY EVs `evs` of the EV profile toward `peer` (every QP on it)."""

    peer: str
    evs: tuple[int, ...]
    time_ns: int


@dataclass(frozen=True)
class Allow:
    """Allow EVs `evs` of the profile toward `peer` again."""

    peer: str
    evs: tuple[int, ...]
    time_ns: int


@dataclass(frozen=True)
class SetPath:
    """EV `ev` toward `peer` now takes `path` (the host egress path map; REPLACE_EV and its undoing)."""

    peer: str
    ev: int
    path: TopoPath


@dataclass(frozen=True)
class SetEvState:
    """One QP's EV to `state`: ASSUMED_BAD hands a denied link's EV to the engine's prober; DENIED takes
    back a probe that did not come back."""

    qpn: int
    ev: int
    state: EvState
    time_ns: int


@dataclass(frozen=True)
class ModifyPort:
    """Enable / disable our plane port (PORT_STATUS to the peers' engines)."""

    plane: int
    enabled: bool
    time_ns: int


@dataclass(frozen=True)
class TellPeer:
    """Tell every other host's mrcd that fabric link `link` went `state` ("down" / "up"). Never for an
    access link (those go by PORT_STATUS); asynchronous in mrcd: nothing waits for it."""

    link: Link
    state: str


Effect = Deny | Allow | SetPath | SetEvState | ModifyPort | TellPeer


def _local_first(out: list[Effect]) -> list[Effect]:
    """The call's effects with every `TellPeer` after every local one (their order kept otherwise): a
    pass that denies two links tells the peers after both are denied and replaced here."""
    return [e for e in out if not isinstance(e, TellPeer)] + [e for e in out if isinstance(e, TellPeer)]


class PortRx(Protocol):
    """`port_rx[plane]`: the packets our plane port has received (None without counters). Indexed only
    while an own access link is suspected: in mrcd each index is 32 per-CPU map lookups."""

    def __getitem__(self, plane: int, /) -> int | None: ...


@dataclass(frozen=True)
class QpSample:
    """What `tick` needs of one QP: its packets sent (all EVs) and whether it can carry a probe (RTS)."""

    tx_packets: int
    ready: bool


@dataclass
class Routes:
    """EV index -> path toward one peer: current (the controller replaces EVs through failed links) and
    as computed from the topology, with the EVs each link carries and the EVs DENIED on the profile."""

    peer: str
    paths: list[TopoPath]
    orig: list[TopoPath]
    denied: set[int] = field(default_factory=set)
    by_link: dict[Link, list[int]] = field(default_factory=dict)

    def reindex(self) -> None:
        self.by_link = {}
        for i, p in enumerate(self.paths):
            for a, b in p.links:
                self.by_link.setdefault(frozenset((a, b)), []).append(i)


@dataclass(frozen=True)
class _Qp:
    peer: str
    pinned: bool  # a restricted QP (its own profile): left alone


class FabricView(Protocol):
    """What the controller (and mrcd's `HostEngine`) know of the fabric from one host: a testbed's
    topology (`TopologyView`) or a host configuration file's peers and paths (ctl/site.py)."""

    host: str
    planes: int

    def peer_names(self) -> list[str]:
        """Every other host this one has paths to."""

    def plane_paths(self, peer: str, plane: int) -> list[TopoPath]:
        """The paths toward `peer` on `plane`, in EV order (the first is EV `plane`'s)."""

    def access_link(self, plane: int) -> Link:
        """This host's own link on `plane` (to its leaf, or back to back the wire)."""

    def address(self, host: str) -> ipaddress.IPv6Address:
        """The MRC address of `host` (this one or a peer)."""


class TopologyView:
    """A testbed topology seen from `host`."""

    def __init__(self, topo: Topology, host: str) -> None:
        self.topo = topo
        self.host = host
        self.planes = topo.planes

    def peer_names(self) -> list[str]:
        return [h for h in self.topo.host_names() if h != self.host]

    def plane_paths(self, peer: str, plane: int) -> list[TopoPath]:
        return sorted(self.topo.paths(self.host, peer, plane=plane), key=lambda x: x.spine or 0)

    def access_link(self, plane: int) -> Link:
        return frozenset((self.host, self.topo.leaf_name(plane, self.topo.host_leaf(self.host))))

    def address(self, host: str) -> ipaddress.IPv6Address:
        return self.topo.mrc_address(host)


def fabric_view(fabric: Topology | FabricView, host: str) -> FabricView:
    return TopologyView(fabric, host) if isinstance(fabric, Topology) else fabric


class Controller:
    """Failure localisation from EV events (docs/daemon.md, "Controller"): a link all (>= `share`) of
    whose EVs on QPs that carry traffic are ASSUMED_BAD, with at least `min_bad` of them, while at most
    `quiet` of the other EVs and of its siblings (same plane and peer, other spine) are, is failed (never
    a peer's access link: the peer finds its own); every EV
    through it is DENIED; one EV through it is probed every `RESTORE_PROBE_NS`; a probe that comes back
    GOOD restores the link."""

    def __init__(self, fabric: Topology | FabricView, host: str, evs: int, *, share: float = 0.75,
                 min_bad: int = 2, quiet: float = 0.2) -> None:
        self.fabric = fabric_view(fabric, host)
        self.planes = self.fabric.planes
        self.host = host
        self.evs = evs
        self.share = share
        self.quiet = quiet
        self.min_bad = min_bad
        self.routes: dict[str, Routes] = {}
        self.qps: dict[int, _Qp] = {}
        self.ready: dict[int, bool] = {}  # qpn -> RTS at the last tick
        self.bad: dict[tuple[int, int], int] = {}  # (qpn, ev index) -> time it went bad
        self.denied: dict[Link, dict[str, list[int]]] = {}
        self.moved: dict[str, set[int]] = {}  # peer -> EVs off their own path (REPLACE_EV)
        self.denied_at: dict[Link, int] = {}
        self.remote: dict[Link, set[str]] = {}  # links denied because these peers' mrcds reported them
        self.probing: dict[tuple[int, int], Link] = {}  # (qpn, ev index) -> link under test
        self.next_probe: dict[Link, int] = {}
        self.ports_down: set[int] = set()
        # our own access links whose EVs look failed, held back until the port has been silent for
        # ACCESS_QUIET_NS: plane -> (the port's receive count, since when it has not changed)
        self.suspect: dict[int, tuple[int | None, int]] = {}
        self.port_alive: dict[int, int] = {}  # plane -> last time a probe sent through it was answered
        self.port_probe_fail: dict[int, deque[int]] = {}  # plane -> recent times its probes timed out
        self.probe_stats: dict[str, int] = {"answered": 0, "timed_out": 0, "rtt_ns_sum": 0, "rtt_ns_max": 0}
        self.tx_seen: dict[int, tuple[int, int]] = {}  # qpn -> (packets sent, when that last changed)
        self.log: deque[Action] = deque(maxlen=MAX_LOG)
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_LOG)
        self.counts: dict[str, int] = {}
        self.reporters_refused = 0  # link_status reporters beyond MAX_REPORTERS_PER_LINK, not kept
        self.event_counts: dict[str, int] = {}
        self._dirty = False

    def act(self, a: Action) -> None:
        """Record a decision (also the operator's `port_set`, which mrcd carries out itself)."""
        ActionKind(a.kind)  # ValueError for a kind outside the closed set (it would never be exported)
        if len(a.detail) > MAX_DETAIL:
            a.detail = a.detail[: MAX_DETAIL - 3] + "..."
        self.log.append(a)
        self.counts[a.kind] = self.counts.get(a.kind, 0) + 1

    # -- topology
    def access_plane(self, lk: Link) -> int | None:
        """The plane of `lk` when it is one of our own access links, else None."""
        if self.host not in lk:
            return None
        for p in range(self.planes):
            if self.fabric.access_link(p) == lk:
                return p
        return None

    def access_link(self, plane: int) -> Link:
        return self.fabric.access_link(plane)

    def add_peer(self, peer: str) -> list[Effect]:
        """The path table toward `peer`: EV index i is plane ``i mod planes``, ``(i div planes)``-th path
        of that plane (by spine). Effects: every EV's path, then the DENY of the EVs that a port already
        down or a link already denied covers."""
        planes = self.planes
        by_plane = [self.fabric.plane_paths(peer, p) for p in range(planes)]
        paths = [by_plane[i % planes][(i // planes) % len(by_plane[i % planes])] for i in range(self.evs)]
        r = Routes(peer, list(paths), list(paths))
        r.reindex()
        self.routes[peer] = r
        out: list[Effect] = [SetPath(peer, i, p) for i, p in enumerate(paths)]
        for plane in self.ports_down:
            self._deny_evs(peer, [i for i in range(self.evs) if i % planes == plane], 0, out)
        for lk, per in self.denied.items():
            idx = r.by_link.get(lk, [])
            if idx:
                self._deny_evs(peer, idx, 0, out)
                per[peer] = idx
        return out

    def add_qp(self, qpn: int, peer: str, *, pinned: bool = False) -> None:
        """A QP toward `peer`; a `pinned` one (restricted EVs, its own profile) is never correlated."""
        self.qps[qpn] = _Qp(peer, pinned)

    def forget_qp(self, qpn: int) -> None:
        self.qps.pop(qpn, None)
        self.ready.pop(qpn, None)
        for key in [k for k in self.bad if k[0] == qpn]:
            del self.bad[key]
        for key in [k for k in self.probing if k[0] == qpn]:
            del self.probing[key]
        self.tx_seen.pop(qpn, None)

    def _deny_evs(self, peer: str, idx: list[int], now: int, out: list[Effect]) -> None:
        self.routes[peer].denied.update(idx)
        out.append(Deny(peer, tuple(idx), now))

    def _allow_evs(self, peer: str, idx: list[int], now: int, out: list[Effect]) -> None:
        self.routes[peer].denied.difference_update(idx)
        out.append(Allow(peer, tuple(idx), now))

    def _set_path(self, peer: str, i: int, p: TopoPath, out: list[Effect]) -> None:
        self.routes[peer].paths[i] = p
        out.append(SetPath(peer, i, p))

    # -- inputs
    def on_ev_events(self, evs: list[EvEvent]) -> list[Effect]:
        out: list[Effect] = []
        for e in evs:
            qp = self.qps.get(e.qpn)
            peer = qp.peer if qp is not None else None
            self.event_counts[e.state.name] = self.event_counts.get(e.state.name, 0) + 1
            self.events.append({"time_ns": e.time_ns, "qpn": e.qpn, "peer": peer, "ev_index": e.ev_index,
                                "port": e.port, "state": e.state.name, "lost": e.lost,
                                "drop_count": e.drop_count})
            if qp is None or qp.pinned:
                continue
            key = (e.qpn, e.ev_index)
            if e.state == EvState.GOOD and key in self.probing:
                # the probed path works: so does every denied link on it
                del self.probing[key]
                on_path = {frozenset(x) for x in self.routes[qp.peer].paths[e.ev_index].links}
                self._restore([lk for lk in self.denied if lk in on_path and lk not in self.remote],
                              e.time_ns, out)
                continue
            if e.state == EvState.ASSUMED_BAD:
                self.bad[key] = e.time_ns
                self._dirty = True
            elif e.state == EvState.GOOD and self.bad.pop(key, None) is not None:
                self._dirty = True  # a verdict held back by siblings' or others' bad EVs may hold now
        return _local_first(out)

    def on_probe_results(self, results: list[ProbeResult]) -> None:
        """The engine's probe outcomes: an answered probe sent on port p shows that our plane-p access
        link carries packets (whatever the EV states say)."""
        st = self.probe_stats
        for r in results:
            if r.ok:
                self.port_alive[r.port] = max(self.port_alive.get(r.port, 0), r.time_ns)
                st["answered"] += 1
                st["rtt_ns_sum"] += r.rtt_ns
                st["rtt_ns_max"] = max(st["rtt_ns_max"], r.rtt_ns)
            else:
                st["timed_out"] += 1
                self.port_probe_fail.setdefault(r.port, deque(maxlen=256)).append(r.time_ns)

    def _note_tx(self, now: int, qps: Mapping[int, QpSample]) -> None:
        for q in self.qps:
            s = qps.get(q)
            if s is None:
                continue
            self.ready[q] = s.ready
            n = s.tx_packets
            seen = self.tx_seen.get(q)
            if seen is None or seen[0] != n:
                self.tx_seen[q] = (n, now if n else -BUSY_NS)

    def busy(self, q: int, now: int) -> bool:
        """A QP whose EVs tell something: it sent a packet within `BUSY_NS`, or holds an ASSUMED_BAD EV.
        An idle QP's EVs stay GOOD whatever the fabric does (nothing is sent on them)."""
        seen = self.tx_seen.get(q)
        if seen is not None and seen[0] and now - seen[1] < BUSY_NS:
            return True
        return any(k[0] == q for k in self.bad)

    def tick(self, now: int, port_rx: PortRx,
             qps: Mapping[int, QpSample]) -> list[Effect]:
        """One controller pass. `qps`: every QP's sample (the QPs not in it are not sampled this pass);
        `port_rx[plane]`: the packets our plane port received (None without counters), indexed only
        while an own access link is suspected (mrcd's view reads the BPF counters lazily)."""
        out: list[Effect] = []
        self._note_tx(now, qps)
        if self._dirty or self.suspect:
            self._dirty = False
            self._localise(now, port_rx, out)
        for lk in list(self.denied):
            if lk in self.remote:
                continue  # the reporting peer probes it and tells us when it is back
            if now >= self.next_probe.get(lk, 0):
                self.next_probe[lk] = now + RESTORE_PROBE_NS
                self._probe(lk, now, out)
        return _local_first(out)

    def _localise(self, now: int, port_rx: PortRx,
                  out: list[Effect]) -> None:
        routes = self.routes
        # only QPs that carry traffic: an idle QP's EVs never go bad, and counting them made a failed
        # link's share (and the other EVs' share) depend on how many idle QPs the host holds
        active = {q: x.peer for q, x in self.qps.items() if not x.pinned and self.busy(q, now)}
        hosts = set(self.fabric.peer_names())
        planes = self.planes
        candidates: set[Link] = set()
        for q, i in self.bad:
            peer = active.get(q)
            if peer is not None:
                # never a peer's access link from our losses alone: its EV set is one peer's share of
                # one plane, which congestion toward that peer (or a stall of it) also makes bad, and
                # denying it takes the peer's whole port down (PORT_STATUS to everyone). The peer
                # localises its own access link from its own traffic and tells us.
                candidates.update(lk for lk in (frozenset(x) for x in routes[peer].paths[i].links)
                                  if not lk & hosts)
        # all usable EVs of the active QPs: a link failure makes its EVs bad and leaves the others alone;
        # EVs bad everywhere at once are a stalled or congested host, not a link
        usable = [(q, i) for q, peer in active.items() for i in range(self.evs)
                  if i not in routes[peer].denied]
        all_bad = sum(1 for k in usable if k in self.bad)
        per_plane: dict[int, tuple[list[int], list[int]]] = {}  # qpn -> (usable, bad) EVs per plane
        for q, i in usable:
            n_use, n_bad = per_plane.setdefault(q, ([0] * planes, [0] * planes))
            plane = routes[active[q]].paths[i].plane
            n_use[plane] += 1
            n_bad[plane] += (q, i) in self.bad
        failed = []
        for lk in candidates:
            if lk in self.denied:
                continue
            total = bad = sib_total = sib_bad = 0
            for q, peer in active.items():
                t = routes[peer]
                through = [i for i in t.by_link.get(lk, []) if i not in t.denied]
                if not through:
                    continue
                b = sum(1 for i in through if (q, i) in self.bad)
                total += len(through)
                bad += b
                # siblings: the EVs of the same plane(s) toward the same peer that avoid the link (the
                # other spines). Losses at the plane's access ports (congestion, a late peer) hit them
                # as much as the link's own EVs; a failed fabric link leaves them alone
                n_use, n_bad = per_plane[q]
                on = {t.paths[i].plane for i in through}
                sib_total += sum(n_use[p] for p in on) - len(through)
                sib_bad += sum(n_bad[p] for p in on) - b
            others = len(usable) - total
            other_share = (all_bad - bad) / others if others else 0.0
            if (total and bad >= self.min_bad and bad >= self.share * total and other_share <= self.quiet
                    and sib_bad <= self.quiet * sib_total):
                failed.append(lk)
        # the smallest explanation: a link whose EVs are all on another failed link is not failed itself
        # (a dead access link makes every fabric link of its plane look dead from this host); links with
        # the same EV set cannot be told apart and are all held failed
        sets = {lk: {(q, i) for q, peer in active.items() for i in routes[peer].by_link.get(lk, [])}
                for lk in failed}
        suspect: set[int] = set()
        for lk in failed:
            if any(sets[lk] < sets[o] for o in failed if o != lk):
                continue
            own = self.access_plane(lk)
            if own is not None:
                suspect.add(own)
                if not self._port_silent(lk, own, now, port_rx):
                    continue  # the fabric links of its plane stay explained by it meanwhile
            self._deny(lk, now, None, out)
        for gone in [p for p in self.suspect if p not in suspect]:
            del self.suspect[gone]
            self.act(Action(now, "cleared", link_name(self.access_link(gone)), 0, "its EVs are not failed"))

    def _port_silent(self, lk: Link, plane: int, now: int,
                     port_rx: PortRx) -> bool:
        """Is our own access link `lk` (plane `plane`) dead? Its EVs all look failed, but so do they when
        the port is merely late: a plane's queue of this host (or a stall) delays every packet on it, and
        the engine's per-port loss threshold then retires the plane's EVs toward every peer at once
        (under make demo's ring load: h1-p1l0, h2-p3l1, h3-p2l1, h0-p3l0, h0-p0l0 in one run, each denied
        with its port for 60 ms to 4 s). A dead link also stops the port from receiving; a late one does
        not (data, SACKs, probe replies keep arriving). So the verdict is held until the port has
        received nothing, and no probe through it has been answered, for `ACCESS_QUIET_NS`, while the
        engine kept probing it: its probes through the port timed out across at least half the window.
        (A silent port alone is no proof: when our own mrcd stalls, or sends nothing on the plane, and the
        peers have nothing for us on it, nothing arrives either.) The receive count is read when the
        suspicion starts and at the end of each window (32 per-CPU map lookups; every pass would cost
        the engine's loop most of its time under a long suspicion)."""
        held = self.suspect.get(plane)
        if held is None:
            self.suspect[plane] = (port_rx[plane], now)
            self.act(Action(now, "suspect", link_name(lk), 0, f"plane {plane}: held until its port is quiet"))
            return False
        if self.port_alive.get(plane, -1) >= held[1]:
            self.suspect[plane] = (held[0], now)  # a probe through it came back: alive; look again later
            return False
        if now - held[1] < ACCESS_QUIET_NS:
            return False
        rx = port_rx[plane]
        fails = [t for t in self.port_probe_fail.get(plane, ()) if t >= held[1]]
        if rx != held[0] or not fails or fails[-1] - fails[0] < ACCESS_QUIET_NS // 2:
            self.suspect[plane] = (rx, now)  # it received, or we did not try: not proven dead; again
            return False
        del self.suspect[plane]
        return True

    def _deny(self, lk: Link, now: int, reporter: str | None, out: list[Effect]) -> None:
        """DENY every EV through `lk`, REPLACE them, tell the peers (when we found it), and take our
        port down when it is our own access link. The local effects come first: `TellPeer` is
        carried out after them, asynchronously."""
        per_peer: dict[str, list[int]] = {}
        n = 0
        for peer, t in self.routes.items():
            idx = t.by_link.get(lk, [])
            if idx:
                self._deny_evs(peer, idx, now, out)
                per_peer[peer] = idx
                n += len(idx)
                for q, x in self.qps.items():
                    if x.peer == peer:
                        for i in idx:
                            self.bad.pop((q, i), None)
        self.denied[lk] = per_peer
        self.denied_at[lk] = now
        self.next_probe[lk] = now + RESTORE_PROBE_NS
        self.act(Action(now, "deny", link_name(lk), n, "" if reporter is None else f"reported by {reporter}"))
        self._replace(lk, now, out)
        plane = self.access_plane(lk)  # our own access link (found by us or by a peer): PORT_STATUS
        if reporter is not None:
            self.remote[lk] = {reporter}
        elif plane is None:
            out.append(TellPeer(lk, "down"))
        if plane is not None and plane not in self.ports_down:
            self.ports_down.add(plane)
            out.append(ModifyPort(plane, False, now))
            self.act(Action(now, "port_down", link_name(lk), 0, f"plane {plane}: PORT_STATUS to peers"))

    def _replace(self, lk: Link, now: int, out: list[Effect]) -> None:
        """REPLACE_EV: every denied EV of `lk` but one (kept DENIED, to probe the link) moves to a path of
        the same plane that avoids every denied link, and is allowed again: the plane keeps its EVs, so
        its share of the spraying, while the link is down (an access link leaves no such path)."""
        moved: dict[str, list[int]] = {}
        for peer, idx in self.denied[lk].items():
            t = self.routes[peer]
            keep = idx[:1]
            for n_alt, i in enumerate(idx[1:]):
                plane = t.paths[i].plane
                alts = [p for p in self.fabric.plane_paths(peer, plane)
                        if not any(p.crosses(*tuple(x)) for x in self.denied)]
                if not alts:
                    keep.append(i)
                    continue
                alt = sorted(alts, key=lambda p: p.spine or 0)[n_alt % len(alts)]
                self._set_path(peer, i, alt, out)
                moved.setdefault(peer, []).append(i)
                self.moved.setdefault(peer, set()).add(i)
            self.denied[lk][peer] = keep
            t.reindex()
            if peer in moved:
                self._allow_evs(peer, moved[peer], now, out)
        if moved:
            self.act(Action(now, "replace", link_name(lk), sum(len(v) for v in moved.values())))

    def _move_back(self, out: list[Effect]) -> int:
        """Every replaced EV whose own path crosses no denied link goes back to it (after a restore).
        Per EV, not per link: a replaced EV is held off its path by every denied link on that path, and
        links restored one at a time (a peer reports p0l0-p0s0 and p0s0-p0l1 back in two messages) must
        leave no EV behind on the other spine. An EV that a still-denied link keeps DENIED (its probe EV)
        stays where it is until that link is restored."""
        n = 0
        for peer, idx in list(self.moved.items()):
            t = self.routes[peer]
            held = {i for per in self.denied.values() for i in per.get(peer, [])}
            back = [i for i in sorted(idx) if i not in held
                    and not any(t.orig[i].crosses(*tuple(x)) for x in self.denied)]
            for i in back:
                self._set_path(peer, i, t.orig[i], out)
                idx.discard(i)
            if back:
                t.reindex()
                n += len(back)
            if not idx:
                del self.moved[peer]
        return n

    def _probe(self, lk: Link, now: int, out: list[Effect]) -> None:
        """Move one EV through the denied link to ASSUMED_BAD on one QP: the engine probes it."""
        for key, other in list(self.probing.items()):
            if other == lk:  # the previous attempt did not come back: deny it again
                if key[0] in self.qps:
                    out.append(SetEvState(key[0], key[1], EvState.DENIED, now))
                del self.probing[key]
        for peer, idx in self.denied[lk].items():
            for qpn, x in self.qps.items():
                if x.peer == peer and not x.pinned and self.ready.get(qpn, False):
                    out.append(SetEvState(qpn, idx[0], EvState.ASSUMED_BAD, now))
                    self.probing[(qpn, idx[0])] = lk
                    self.counts["probe"] = self.counts.get("probe", 0) + 1
                    return

    def _restore(self, links: list[Link], now: int, out: list[Effect]) -> None:
        """Allow the EVs of `links` again, except those another still-denied link also covers."""
        gone = {lk: self.denied.pop(lk, {}) for lk in links}
        for lk in links:
            self.next_probe.pop(lk, None)
            self.denied_at.pop(lk, None)
            for key in [k for k, v in self.probing.items() if v == lk]:
                del self.probing[key]
        self._move_back(out)  # replaced EVs go back to their own paths (unless those cross a denied link)
        for lk, per_peer in gone.items():
            n = 0
            for peer, idx in per_peer.items():
                still = {i for other in self.denied.values() for i in other.get(peer, [])}
                ok = [i for i in idx if i not in still]
                self._allow_evs(peer, ok, now, out)
                n += len(ok)
            self.act(Action(now, "restore", link_name(lk), n))
            plane = self.access_plane(lk)
            if self.remote.pop(lk, None) is None and plane is None:
                out.append(TellPeer(lk, "up"))
            if plane is not None and plane in self.ports_down:
                self.ports_down.discard(plane)
                out.append(ModifyPort(plane, True, now))
                self.act(Action(now, "port_up", link_name(lk), 0, f"plane {plane}"))

    def fabric_links(self) -> set[Link]:
        """Every link a path of this host's toward any peer crosses, on any plane."""
        return {frozenset(ab) for peer in self.fabric.peer_names() for plane in range(self.planes)
                for p in self.fabric.plane_paths(peer, plane) for ab in p.links}

    def on_link_status(self, lk: Link, state: str, reporter: str, now: int) -> tuple[str, list[Effect]]:
        """A peer's mrcd localised a failed fabric link (or saw it return): our control packets toward
        it (SACKs, probe replies) must avoid it too. Returns the result mrcd answers with and the
        effects."""
        out: list[Effect] = []
        if len(lk) != 2 or lk not in self.fabric_links():
            # not a link any of our paths crosses (two equal ends, a name from another fabric, a
            # forged report): nothing to avoid, and nothing kept (the denied set stays the fabric's)
            return "not_on_our_paths", out
        if state == "down":
            if lk in self.denied:
                who = self.remote.get(lk)
                if who is not None and reporter not in who:
                    if len(who) >= MAX_REPORTERS_PER_LINK:
                        self.reporters_refused += 1
                    else:
                        who.add(reporter)
                return "known", out
            self._deny(lk, now, reporter, out)
            return "denied", out
        if lk in self.remote:
            self.remote[lk].discard(reporter)
            if not self.remote[lk]:
                self._restore([lk], now, out)
                return "restored", out
        return "ignored", out

    # -- operator
    def deny_manual(self, peer: str, indices: list[int], now: int) -> list[Effect]:
        out: list[Effect] = []
        self._deny_evs(peer, indices, now, out)
        self.act(Action(now, "deny", f"manual:{peer}", len(indices)))
        return out

    def restore_manual(self, peer: str, indices: list[int], now: int) -> list[Effect]:
        out: list[Effect] = []
        self._allow_evs(peer, indices, now, out)
        self.act(Action(now, "restore", f"manual:{peer}", len(indices)))
        return out
