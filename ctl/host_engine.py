"""The engine side of one mrcd, without I/O: the host's `Context`, its CQ and CC profiles, the controller,
the per-peer path tables (one EXP EV profile per peer, EV i on plane i mod planes), and the bookkeeping of
the QPs applications create. It carries the controller's effects out through two narrow doors: a
`PathWriter` (the host egress path map and the ingress allowed-QP map; the BPF maps in mrcd, a recorder in
tests) and a `tell` callable (peer notes, queued by mrcd, sent outside the engine turn).

Why a class of its own: everything here is driven by the loop thread only and needs no socket, so the
controller's and the exporter's tests build a real one (a real engine, a real controller, a fake path
map) instead of a half-built daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from mrc.errors import MrcError
from mrc.topology import Path as TopoPath
from mrc.topology import Topology
from mrc.transport import (
    CompletionQueue,
    Context,
    EvEntry,
    EvMode,
    EvProfile,
    NsccConfig,
    QpAttr,
    QpState,
    QueuePair,
)

from .controller import (
    Allow,
    Controller,
    Deny,
    Effect,
    FabricView,
    Link,
    ModifyPort,
    QpSample,
    Routes,
    SetEvState,
    SetPath,
    TellPeer,
    fabric_view,
)

DEFAULT_EVS: Final = 64
#: The QP data counters kept for destroyed QPs, so that exported totals never go down.
DATA_ATTRS: Final = ("serial", "rx_packets", "tx_bytes", "rx_bytes")


class PathWriter(Protocol):
    """Where the host's paths and allowed QPs live (mrcd: the host programs' BPF maps)."""

    def set_path(self, peer: str, ev: int, path: TopoPath) -> None: ...

    def delete_path(self, peer: str, ev: int) -> None: ...

    def allow_qp(self, qpn: int) -> None: ...

    def disallow_qp(self, qpn: int) -> None: ...


@dataclass
class PeerTable:
    """One peer: its address, its EXP EV profile, and the controller's path table toward it (`routes`,
    read here; only the controller's effects change it)."""

    peer: str
    gid: bytes
    profile: EvProfile
    routes: Routes

    @property
    def paths(self) -> list[TopoPath]:
        return self.routes.paths

    @property
    def by_link(self) -> dict[Link, list[int]]:
        return self.routes.by_link


class HostEngine:
    def __init__(self, fabric: Topology | FabricView, host: str, paths: PathWriter,
                 tell: Callable[[Link, str], None], *, evs: int = DEFAULT_EVS, seed: int = 1,
                 nscc: NsccConfig | None = None, null_cc_default: bool = False, qp_attr: QpAttr | None = None,
                 cq_depth: int = 1 << 20) -> None:
        self.fabric = fabric_view(fabric, host)
        if evs < self.fabric.planes:
            raise MrcError(f"--evs {evs}: need at least one EV per plane ({self.fabric.planes})")
        self.host = host
        self.planes = self.fabric.planes
        self.null_cc_default = null_cc_default  # the file's `cc = "none"`: every QP without NSCC
        self.evs = evs
        self.paths = paths
        self.tell = tell
        self.qp_attr = qp_attr or QpAttr()
        self.gid = self.fabric.address(host).packed
        self.ctx = Context(self.gid, ports=self.planes, seed=seed, name=host)
        self.cq: CompletionQueue = self.ctx.create_cq(cq_depth)
        self.cc_nscc: int = self.ctx.create_cc_profile(nscc or NsccConfig())
        self.cc_null: int = self.ctx.create_cc_profile(None)
        self.controller = Controller(self.fabric, host, evs)
        self.peers: dict[str, PeerTable] = {}
        self.qp_peer: dict[int, str] = {}
        self.pinned_qps: set[int] = set()  # QPs on a restricted profile of their own
        # counters of destroyed QPs, so that the exported totals never go down
        self.gone: dict[str, int] = {}
        self.gone_c: dict[str, int] = {}
        self.gone_port = [0] * self.planes

    def peer_names(self) -> list[str]:
        return self.fabric.peer_names()

    def peer_table(self, peer: str) -> PeerTable:
        """The path table toward `peer`, made on first use (its EV profile, the controller's paths, and
        the DENY of whatever the controller already holds failed)."""
        t = self.peers.get(peer)
        if t is not None:
            return t
        if peer not in self.peer_names():
            raise MrcError(f"no peer host {peer!r} (hosts: {', '.join(self.peer_names())})")
        entries = [EvEntry(i, i % self.planes) for i in range(self.evs)]
        prof = EvProfile(self.ctx.next_ev_profile_id(), entries, mode=EvMode.EXP)
        self.ctx.create_ev_profile(prof)
        effects = self.controller.add_peer(peer)
        t = PeerTable(peer, self.fabric.address(peer).packed, prof, self.controller.routes[peer])
        self.peers[peer] = t
        self.carry_out(effects)
        return t

    def carry_out(self, effects: list[Effect]) -> None:
        """The controller's effects, in order: engine changes and path-map writes now; `TellPeer` handed to
        `tell`, which only queues (mrcd sends peer notes on non-blocking sockets after the turn), so no
        peer delays a local DENY / REPLACE."""
        for e in effects:
            if isinstance(e, Deny):
                self.peers[e.peer].profile.deny(list(e.evs), e.time_ns)
            elif isinstance(e, Allow):
                self.peers[e.peer].profile.allow(list(e.evs), e.time_ns)
            elif isinstance(e, SetPath):
                self.paths.set_path(e.peer, e.ev, e.path)
            elif isinstance(e, SetEvState):
                qp = self.ctx.qps.get(e.qpn)
                if qp is not None:
                    qp.paths.set_state(e.ev, e.state, e.time_ns)
            elif isinstance(e, ModifyPort):
                self.ctx.modify_port(e.plane, e.enabled, e.time_ns)
            elif isinstance(e, TellPeer):
                self.tell(e.link, e.state)

    # -- QPs
    def create_qp(self, peer: str, *, evs: int | None = None, planes: list[int] | None = None,
                  null_cc: bool = False) -> QueuePair:
        """A QP toward `peer` on the peer's profile, or, restricted to some planes / the first `evs` EVs,
        on a profile of its own (the other EVs DENIED on it; destroyed with the QP)."""
        t = self.peer_table(peer)
        profile = t.profile
        pinned = False
        if evs is not None or planes is not None:
            keep = set(range(self.planes)) if planes is None else {int(p) for p in planes}
            bad = keep - set(range(self.planes))
            if bad:
                raise ValueError(f"no plane {min(bad)} (planes 0..{self.planes - 1})")
            chosen = [i for i in range(self.evs) if i % self.planes in keep]
            if evs is not None:
                chosen = chosen[: int(evs)]
            if not chosen:
                raise ValueError("the EV restriction leaves no EV")
            profile = EvProfile(self.ctx.next_ev_profile_id(), list(t.profile.entries), mode=EvMode.EXP,
                                ev_min_active=1)
            self.ctx.create_ev_profile(profile)
            keep_evs = set(chosen)
            profile.deny([i for i in range(self.evs) if i not in keep_evs])
            pinned = True
        cc = self.cc_null if null_cc or self.null_cc_default else self.cc_nscc
        qp = self.ctx.create_qp(self.cq, ev_profile=profile, cc_profile=cc, attr=self.qp_attr)
        self.qp_peer[qp.qpn] = peer
        self.controller.add_qp(qp.qpn, peer, pinned=pinned)
        if pinned:
            self.pinned_qps.add(qp.qpn)
        self.paths.allow_qp(qp.qpn)
        return qp

    def destroy_qp(self, qpn: int) -> None:
        """Destroy a QP (its counters added to the totals of the gone) and forget it everywhere."""
        qp = self.ctx.qps.get(qpn)
        if qp is not None:
            for k, v in qp.c.items():
                self.gone_c[k] = self.gone_c.get(k, 0) + int(v)
            for a in DATA_ATTRS:
                self.gone[a] = self.gone.get(a, 0) + int(getattr(qp, a))
            for p in range(self.planes):
                self.gone_port[p] += int(qp.paths.port_bytes[p])
            self.ctx.destroy_qp(qp)
            if qpn in self.pinned_qps:  # its own restricted profile: nobody else uses it
                self.ctx.destroy_ev_profile(qp.paths.profile)
        self.qp_peer.pop(qpn, None)
        self.pinned_qps.discard(qpn)
        self.controller.forget_qp(qpn)
        self.paths.disallow_qp(qpn)

    def qp_samples(self) -> dict[int, QpSample]:
        """The controller's per-pass view of the QPs: packets sent and whether each can carry a probe."""
        qps = self.ctx.qps
        return {q: QpSample(sum(qp.paths.tx_packets), qp.state is QpState.RTS)
                for q in self.qp_peer if (qp := qps.get(q)) is not None}

    def close(self) -> None:
        """Remove this host's entries from the path map and the allowed-QP map."""
        for peer in list(self.peers):
            for i in range(self.evs):
                self.paths.delete_path(peer, i)
        for q in list(self.qp_peer):
            self.paths.disallow_qp(q)
