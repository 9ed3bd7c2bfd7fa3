"""`mrcd`: the MRC controller of one host (docs/design.md §7, docs/daemon.md).

One per host (on a testbed: one per host namespace, started by ``mrcctl testbed up --with-daemons``).
It runs the host's engine (`mrc.transport.Context`) on the host's MRC socket (`SocketDriver`), and:

* computes the host's paths from the topology: EV index i toward peer P is plane ``i mod planes``,
  ``(i div planes)``-th path of that plane; fills one EXP EV profile per peer and the host egress path
  map with exactly that table;
* keeps the ingress allowed-QP map in step with its QPs;
* consumes the EV events of every QP, correlates ASSUMED_BAD EVs across QPs and peers to a failed link
  (`Controller`), DENYs every EV through it (a host access link: the port is disabled and peers get
  PORT_STATUS), probes the denied link through one EV and restores it when the probes answer;
* serves the control socket (``$MRC_RUN_DIR/<host>.sock``, mode 0600, root only: other users are
  refused with a clear error) for applications (client library `mrc.dataplane.client`) and `mrcctl`;
* exports Prometheus metrics (`mrc.ctl.metrics`) on ``--metrics ADDR:PORT``.

SIGTERM / SIGINT end it cleanly: its path-map and allowed-QP entries are removed, the socket unlinked.
A SIGKILLed mrcd leaves map entries only; ``mrcctl prog detach --all`` removes them with the programs.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ipaddress
import json
import mmap
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from mrc import __version__ as mrc_version
from mrc.dataplane import abi, netns
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import socket_path
from mrc.dataplane.driver import SocketDriver, wait
from mrc.dataplane.fabric import FabricDataplane, ct_u32
from mrc.dataplane.protocol import PROTOCOL_VERSION, ErrorKind, ProtocolError, check_version, validate_request
from mrc.dataplane.udp import mrc_socket
from mrc.errors import MrcError
from mrc.topology import Path as TopoPath
from mrc.transport import (
    Context,
    EvEntry,
    EvEvent,
    EvMode,
    EvProfile,
    EvState,
    MemoryRegion,
    NsccConfig,
    ProbeResult,
    QpAttr,
    QueuePair,
    WorkCompletion,
)

from .metrics import MetricsServer

DEFAULT_EVS: Final = 64
SO_PEERCRED_FMT: Final = "3i"
CTRL_PERIOD_NS: Final = 2_000_000  # controller pass at most every 2 ms
RESTORE_PROBE_NS: Final = 50_000_000  # probe a denied link every 50 ms
BUSY_NS: Final = 1_000_000_000  # a QP that sent nothing for this long says nothing about its EVs
ACCESS_QUIET_NS: Final = 20_000_000  # own access link: failed only once its port received nothing this long
MAX_LOG: Final = 100_000
#: The longest control-socket request line; a longer one is answered with an error and skipped.
MAX_REQUEST_BYTES: Final = 1 << 16


class RequestRejected(ProtocolError):
    """A control-socket line that is not a request at all (too long, not JSON, not an object, no string
    `op`): always `bad_request` to the client; `reason` keys the rejection counter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(ErrorKind.BAD_REQUEST, reason, message)


def _no_constants(name: str) -> Any:
    raise RequestRejected("bad_json", f"bad request: {name} is not a JSON number")


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line -> its object, or RequestRejected: JSON (no NaN/Infinity, nesting within the
    parser's limits), an object, with a string `op`."""
    if len(line) > MAX_REQUEST_BYTES:
        raise RequestRejected("too_long", f"bad request: longer than {MAX_REQUEST_BYTES} bytes")
    try:
        req = json.loads(line, parse_constant=_no_constants)
    except RecursionError:
        raise RequestRejected("bad_json", "bad request: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RequestRejected("bad_json", f"bad request: not JSON ({e})") from None
    if not isinstance(req, dict):
        raise RequestRejected("not_object", "bad request: a request is a JSON object")
    if not isinstance(req.get("op"), str):
        raise RequestRejected("bad_op", "bad request: 'op' must be a string")
    return req

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


@dataclass
class PeerTable:
    """EV index -> path toward one peer, and the EXP profile made from it."""

    peer: str
    gid: bytes
    paths: list[TopoPath]  # current: the controller replaces EVs through failed links
    profile: EvProfile
    orig: list[TopoPath] = field(default_factory=list)  # as computed from the topology
    by_link: dict[Link, list[int]] = field(default_factory=dict)

    def reindex(self) -> None:
        self.by_link = {}
        for i, p in enumerate(self.paths):
            for a, b in p.links:
                self.by_link.setdefault(frozenset((a, b)), []).append(i)


@dataclass
class Client:
    sock: socket.socket
    uid: int
    rbuf: bytearray = field(default_factory=bytearray)
    fds: deque[int] = field(default_factory=deque)
    qps: set[int] = field(default_factory=set)
    mrs: dict[int, tuple[MemoryRegion, mmap.mmap]] = field(default_factory=dict)
    wbuf: bytearray = field(default_factory=bytearray)
    skipping: bool = False  # discarding the rest of an over-long line


class Controller:
    """Failure localisation from EV events (docs/daemon.md, "Controller"): a link all (>= `share`) of
    whose EVs on QPs that carry traffic are ASSUMED_BAD, with at least `min_bad` of them, while at most
    `quiet` of the other EVs and of its siblings (same plane and peer, other spine) are, is failed (never
    a peer's access link: the peer finds its own); every EV
    through it is DENIED; one EV through it is probed every `RESTORE_PROBE_NS`; a probe that comes back
    GOOD restores the link."""

    def __init__(self, d: Daemon, *, share: float = 0.75, min_bad: int = 2, quiet: float = 0.2) -> None:
        self.d = d
        self.share = share
        self.quiet = quiet
        self.min_bad = min_bad
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
        self.event_counts: dict[str, int] = {}
        self._dirty = False

    def act(self, a: Action) -> None:
        ActionKind(a.kind)  # ValueError for a kind outside the closed set (it would never be exported)
        self.log.append(a)
        self.counts[a.kind] = self.counts.get(a.kind, 0) + 1

    def on_events(self, evs: list[EvEvent]) -> None:
        d = self.d
        for e in evs:
            qp = d.ctx.qps.get(e.qpn)
            peer = d.qp_peer.get(e.qpn)
            self.event_counts[e.state.name] = self.event_counts.get(e.state.name, 0) + 1
            self.events.append({"time_ns": e.time_ns, "qpn": e.qpn, "peer": peer, "ev_index": e.ev_index,
                                "port": e.port, "state": e.state.name, "lost": e.lost,
                                "drop_count": e.drop_count})
            if peer is None or qp is None or e.qpn in d.pinned_qps:
                continue
            key = (e.qpn, e.ev_index)
            if e.state == EvState.GOOD and key in self.probing:
                # the probed path works: so does every denied link on it
                del self.probing[key]
                on_path = {frozenset(x) for x in d.peers[peer].paths[e.ev_index].links}
                self.restore([lk for lk in self.denied if lk in on_path and lk not in self.remote], e.time_ns)
                continue
            if e.state == EvState.ASSUMED_BAD:
                self.bad[key] = e.time_ns
                self._dirty = True
            elif e.state == EvState.GOOD and self.bad.pop(key, None) is not None:
                self._dirty = True  # a verdict held back by siblings' or others' bad EVs may hold now

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

    def forget_qp(self, qpn: int) -> None:
        for key in [k for k in self.bad if k[0] == qpn]:
            del self.bad[key]
        for key in [k for k in self.probing if k[0] == qpn]:
            del self.probing[key]
        self.tx_seen.pop(qpn, None)

    def _note_tx(self, now: int) -> None:
        for q in self.d.qp_peer:
            qp = self.d.ctx.qps.get(q)
            if qp is None:
                continue
            n = sum(qp.paths.tx_packets)
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

    def tick(self, now: int) -> None:
        self._note_tx(now)
        if self._dirty or self.suspect:
            self._dirty = False
            self.localise(now)
        for lk in list(self.denied):
            if lk in self.remote:
                continue  # the reporting peer probes it and tells us when it is back
            if now >= self.next_probe.get(lk, 0):
                self.next_probe[lk] = now + RESTORE_PROBE_NS
                self.probe(lk, now)

    def localise(self, now: int) -> None:
        d = self.d
        # only QPs that carry traffic: an idle QP's EVs never go bad, and counting them made a failed
        # link's share (and the other EVs' share) depend on how many idle QPs the host holds
        active = {q: p for q, p in d.qp_peer.items() if q not in d.pinned_qps and self.busy(q, now)}
        hosts = set(d.topo.host_names()) - {d.host}
        candidates: set[Link] = set()
        for q, i in self.bad:
            peer = active.get(q)
            if peer is not None:
                # never a peer's access link from our losses alone: its EV set is one peer's share of
                # one plane, which congestion toward that peer (or a stall of it) also makes bad, and
                # denying it takes the peer's whole port down (PORT_STATUS to everyone). The peer
                # localises its own access link from its own traffic and tells us.
                candidates.update(lk for lk in (frozenset(x) for x in d.peers[peer].paths[i].links)
                                  if not lk & hosts)
        # all usable EVs of the active QPs: a link failure makes its EVs bad and leaves the others alone;
        # EVs bad everywhere at once are a stalled or congested host, not a link
        usable = [(q, i) for q, peer in active.items() for i in range(self.d.evs)
                  if i not in d.peers[peer].profile.denied]
        all_bad = sum(1 for k in usable if k in self.bad)
        per_plane: dict[int, tuple[list[int], list[int]]] = {}  # qpn -> (usable, bad) EVs per plane
        for q, i in usable:
            n_use, n_bad = per_plane.setdefault(q, ([0] * d.topo.planes, [0] * d.topo.planes))
            plane = d.peers[active[q]].paths[i].plane
            n_use[plane] += 1
            n_bad[plane] += (q, i) in self.bad
        failed = []
        for lk in candidates:
            if lk in self.denied:
                continue
            total = bad = sib_total = sib_bad = 0
            for q, peer in active.items():
                t = d.peers[peer]
                through = [i for i in t.by_link.get(lk, []) if i not in t.profile.denied]
                if not through:
                    continue
                b = sum(1 for i in through if (q, i) in self.bad)
                total += len(through)
                bad += b
                # siblings: the EVs of the same plane(s) toward the same peer that avoid the link (the
                # other spines). Losses at the plane's access ports (congestion, a late peer) hit them
                # as much as the link's own EVs; a failed fabric link leaves them alone
                n_use, n_bad = per_plane[q]
                planes = {t.paths[i].plane for i in through}
                sib_total += sum(n_use[p] for p in planes) - len(through)
                sib_bad += sum(n_bad[p] for p in planes) - b
            others = len(usable) - total
            other_share = (all_bad - bad) / others if others else 0.0
            if (total and bad >= self.min_bad and bad >= self.share * total and other_share <= self.quiet
                    and sib_bad <= self.quiet * sib_total):
                failed.append(lk)
        # the smallest explanation: a link whose EVs are all on another failed link is not failed itself
        # (a dead access link makes every fabric link of its plane look dead from this host); links with
        # the same EV set cannot be told apart and are all held failed
        sets = {lk: {(q, i) for q, peer in active.items() for i in d.peers[peer].by_link.get(lk, [])}
                for lk in failed}
        suspect: set[int] = set()
        for lk in failed:
            if any(sets[lk] < sets[o] for o in failed if o != lk):
                continue
            own = d.access_plane(lk)
            if own is not None:
                suspect.add(own)
                if not self.port_silent(lk, own, now):
                    continue  # the fabric links of its plane stay explained by it meanwhile
            self.deny(lk, now)
        for gone in [p for p in self.suspect if p not in suspect]:
            del self.suspect[gone]
            self.act(Action(now, "cleared", link_name(d.access_link(gone)), 0, "its EVs are not failed"))

    def port_silent(self, lk: Link, plane: int, now: int) -> bool:
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
            self.suspect[plane] = (self.d.port_rx_packets(plane), now)
            self.act(Action(now, "suspect", link_name(lk), 0, f"plane {plane}: held until its port is quiet"))
            return False
        if self.port_alive.get(plane, -1) >= held[1]:
            self.suspect[plane] = (held[0], now)  # a probe through it came back: alive; look again later
            return False
        if now - held[1] < ACCESS_QUIET_NS:
            return False
        rx = self.d.port_rx_packets(plane)
        fails = [t for t in self.port_probe_fail.get(plane, ()) if t >= held[1]]
        if rx != held[0] or not fails or fails[-1] - fails[0] < ACCESS_QUIET_NS // 2:
            self.suspect[plane] = (rx, now)  # it received, or we did not try: not proven dead; again
            return False
        del self.suspect[plane]
        return True

    def deny(self, lk: Link, now: int, reporter: str | None = None) -> None:
        d = self.d
        per_peer: dict[str, list[int]] = {}
        n = 0
        for peer, t in d.peers.items():
            idx = t.by_link.get(lk, [])
            if idx:
                t.profile.deny(idx, now)
                per_peer[peer] = idx
                n += len(idx)
                for q, p in d.qp_peer.items():
                    if p == peer:
                        for i in idx:
                            self.bad.pop((q, i), None)
        self.denied[lk] = per_peer
        self.denied_at[lk] = now
        self.next_probe[lk] = now + RESTORE_PROBE_NS
        self.act(Action(now, "deny", link_name(lk), n, "" if reporter is None else f"reported by {reporter}"))
        self.replace(lk, now)
        if reporter is not None:
            self.remote[lk] = {reporter}
        else:
            d.tell_peers(lk, "down")
        plane = d.access_plane(lk)  # our own access link (found by us or by a peer): PORT_STATUS
        if plane is not None and plane not in self.ports_down:
            self.ports_down.add(plane)
            d.ctx.modify_port(plane, False, now)
            self.act(Action(now, "port_down", link_name(lk), 0, f"plane {plane}: PORT_STATUS to peers"))

    def replace(self, lk: Link, now: int) -> None:
        """REPLACE_EV: every denied EV of `lk` but one (kept DENIED, to probe the link) moves to a path of
        the same plane that avoids every denied link, and is allowed again: the plane keeps its EVs, so
        its share of the spraying, while the link is down (an access link leaves no such path)."""
        d = self.d
        moved: dict[str, list[int]] = {}
        for peer, idx in self.denied[lk].items():
            t = d.peers[peer]
            keep = idx[:1]
            for n_alt, i in enumerate(idx[1:]):
                plane = t.paths[i].plane
                alts = [p for p in d.topo.paths(d.host, peer, plane=plane)
                        if not any(p.crosses(*tuple(x)) for x in self.denied)]
                if not alts:
                    keep.append(i)
                    continue
                alt = sorted(alts, key=lambda p: p.spine or 0)[n_alt % len(alts)]
                d.fd.set_path(d.host, peer, i, alt)
                t.paths[i] = alt
                moved.setdefault(peer, []).append(i)
                self.moved.setdefault(peer, set()).add(i)
            self.denied[lk][peer] = keep
            t.reindex()
            if peer in moved:
                t.profile.allow(moved[peer], now)
        if moved:
            self.act(Action(now, "replace", link_name(lk), sum(len(v) for v in moved.values())))

    def move_back(self) -> int:
        """Every replaced EV whose own path crosses no denied link goes back to it (after a restore).
        Per EV, not per link: a replaced EV is held off its path by every denied link on that path, and
        links restored one at a time (a peer reports p0l0-p0s0 and p0s0-p0l1 back in two messages) must
        leave no EV behind on the other spine. An EV that a still-denied link keeps DENIED (its probe EV)
        stays where it is until that link is restored."""
        d = self.d
        n = 0
        for peer, idx in list(self.moved.items()):
            t = d.peers[peer]
            held = {i for per in self.denied.values() for i in per.get(peer, [])}
            back = [i for i in sorted(idx) if i not in held
                    and not any(t.orig[i].crosses(*tuple(x)) for x in self.denied)]
            for i in back:
                d.fd.set_path(d.host, peer, i, t.orig[i])
                t.paths[i] = t.orig[i]
                idx.discard(i)
            if back:
                t.reindex()
                n += len(back)
            if not idx:
                del self.moved[peer]
        return n

    def probe(self, lk: Link, now: int) -> None:
        """Move one EV through the denied link to ASSUMED_BAD on one QP: the engine probes it."""
        d = self.d
        for key, other in list(self.probing.items()):
            if other == lk:  # the previous attempt did not come back: deny it again
                qp = d.ctx.qps.get(key[0])
                if qp is not None:
                    qp.paths.set_state(key[1], EvState.DENIED, now)
                del self.probing[key]
        for peer, idx in self.denied[lk].items():
            for qpn, p in d.qp_peer.items():
                qp = d.ctx.qps.get(qpn)
                if p == peer and qp is not None and qpn not in d.pinned_qps and qp.state.name == "RTS":
                    qp.paths.set_state(idx[0], EvState.ASSUMED_BAD, now)
                    self.probing[(qpn, idx[0])] = lk
                    self.counts["probe"] = self.counts.get("probe", 0) + 1
                    return

    def restore(self, links: list[Link], now: int) -> None:
        """Allow the EVs of `links` again, except those another still-denied link also covers."""
        d = self.d
        gone = {lk: self.denied.pop(lk, {}) for lk in links}
        for lk in links:
            self.next_probe.pop(lk, None)
            self.denied_at.pop(lk, None)
            for key in [k for k, v in self.probing.items() if v == lk]:
                del self.probing[key]
        self.move_back()  # replaced EVs go back to their own paths (unless those cross a denied link)
        for lk, per_peer in gone.items():
            n = 0
            for peer, idx in per_peer.items():
                still = {i for other in self.denied.values() for i in other.get(peer, [])}
                ok = [i for i in idx if i not in still]
                d.peers[peer].profile.allow(ok, now)
                n += len(ok)
            self.act(Action(now, "restore", link_name(lk), n))
            if self.remote.pop(lk, None) is None:
                d.tell_peers(lk, "up")
            plane = d.access_plane(lk)
            if plane is not None and plane in self.ports_down:
                self.ports_down.discard(plane)
                d.ctx.modify_port(plane, True, now)
                self.act(Action(now, "port_up", link_name(lk), 0, f"plane {plane}"))

    def peer_report(self, lk: Link, state: str, reporter: str, now: int) -> str:
        """A peer's mrcd localised a failed fabric link (or saw it return): our control packets toward
        it (SACKs, probe replies) must avoid it too."""
        if state == "down":
            if lk in self.denied:
                if lk in self.remote:
                    self.remote[lk].add(reporter)
                return "known"
            self.deny(lk, now, reporter)
            return "denied"
        if lk in self.remote:
            self.remote[lk].discard(reporter)
            if not self.remote[lk]:
                self.restore([lk], now)
                return "restored"
        return "ignored"

    # -- operator
    def deny_manual(self, peer: str, indices: list[int], now: int) -> int:
        self.d.peers[peer].profile.deny(indices, now)
        self.act(Action(now, "deny", f"manual:{peer}", len(indices)))
        return len(indices)

    def restore_manual(self, peer: str, indices: list[int], now: int) -> int:
        self.d.peers[peer].profile.allow(indices, now)
        self.act(Action(now, "restore", f"manual:{peer}", len(indices)))
        return len(indices)


class Daemon:
    def __init__(self, testbed: str, host: str, *, evs: int = DEFAULT_EVS, socket_file: Path | None = None,
                 metrics: MetricsServer | None = None, seed: int = 0, reorder_ns: int = 2_000_000,
                 probe_timeout_ns: int = 20_000_000) -> None:
        self.tb = tbmod.Testbed.load(testbed)
        self.topo = self.tb.topo
        if host not in self.topo.host_names():
            hosts = ", ".join(self.topo.host_names())
            raise MrcError(f"testbed {testbed}: no host {host!r} (hosts: {hosts})")
        if evs < self.topo.planes:
            raise MrcError(f"--evs {evs}: need at least one EV per plane ({self.topo.planes})")
        self.host = host
        self.ns = self.tb.ns(host)
        self.evs = evs
        self.reorder_ns = reorder_ns
        self.probe_timeout_ns = probe_timeout_ns
        self.socket_file = socket_file or socket_path(self.ns)
        self.metrics = metrics
        self.started = time.time()
        self.lock = threading.Lock()
        #: time.monotonic() at the end of the loop's last turn (0.0 before the first): mrc_up and
        #: mrc_engine_loop_age_seconds say how long ago the engine last ran (ctl/metrics.py)
        self.turned = 0.0
        self.stop = False
        self.fd = FabricDataplane.open(testbed)
        if self.fd.egress is None or self.fd.ingress is None:
            raise MrcError(f"testbed {testbed}: host_egress/host_ingress not attached (mrcctl prog attach)")
        self.gid = self.topo.mrc_address(host).packed
        self.ctx = Context(self.gid, ports=self.topo.planes, seed=seed or os.getpid(), name=host)
        leaf = self.topo.host_leaf(host)
        self.port_ifname = [self.topo.link_between(host, self.topo.leaf_name(p, leaf)).a_ifname
                            for p in range(self.topo.planes)]
        self.peers: dict[str, PeerTable] = {}
        self.qp_peer: dict[int, str] = {}
        self.pinned_qps: set[int] = set()
        self.qp_owner: dict[int, Client] = {}
        self.cq = self.ctx.create_cq(1 << 20)
        self.cc_nscc = self.ctx.create_cc_profile(self._nscc())
        self.cc_null = self.ctx.create_cc_profile(None)
        self.mrs: dict[int, MemoryRegion] = {}
        # counters of destroyed QPs, so that the exported totals never go down
        self.gone: dict[str, int] = {}
        self.gone_c: dict[str, int] = {}
        self.rejected: dict[str, int] = {}  # control-socket requests refused, by reason
        self.gone_port = [0] * self.topo.planes
        self._next_mr = 1
        self.controller = Controller(self)
        self.sock: socket.socket | None = None
        self.driver: SocketDriver | None = None
        self.server: socket.socket | None = None
        self.sel = selectors.DefaultSelector()
        self.clients: dict[int, Client] = {}
        self.hid = self.fd.ingress.allocate_id("host", f"{self.tb.name}/{host}")

    def qp_attr(self) -> QpAttr:
        """QP attributes for this testbed: an ACK timeout of 1.024 us x 2^15 = 33.6 ms, a reordering
        tolerance of `reorder_ns` and a probe timeout of `probe_timeout_ns` (the engines run in Python
        processes that share two CPUs: a SACK or a probe reply can be late by milliseconds without any
        loss; docs/daemon.md)."""
        return QpAttr(timeout=15, reorder_ns=self.reorder_ns, probe_timeout_ns=self.probe_timeout_ns)

    def _nscc(self) -> NsccConfig:
        # the testbed's fabric: per plane a link of link.rate; the host's window covers about half of the
        # plane queues' buffers together, so the queues ECN-mark but rarely drop (docs/daemon.md)
        buf = self.topo.link.buffer_bytes
        return NsccConfig.for_path(500_000, self.topo.planes * buf // 3)

    # -- paths
    def access_plane(self, lk: Link) -> int | None:
        if self.host not in lk:
            return None
        other = next(iter(lk - {self.host}))
        for p in range(self.topo.planes):
            if self.topo.leaf_name(p, self.topo.host_leaf(self.host)) == other:
                return p
        return None

    def access_link(self, plane: int) -> Link:
        return frozenset((self.host, self.topo.leaf_name(plane, self.topo.host_leaf(self.host))))

    def port_rx_packets(self, plane: int) -> int | None:
        """Packets that arrived on our plane port (host_ingress's per-port counters; None without them).
        Read only while an own access link is suspected (32 per-CPU map lookups)."""
        ing = self.fd.ingress
        if ing is None:
            return None
        pid = self.fd._find_id(ing, "port", self.host, self.port_ifname[plane])
        if not pid:
            return None
        m = ing.maps["mrc_ingress_ev"]
        return sum(int(m.total(ct_u32(pid * abi.EV_BUCKETS + b)).packets) for b in range(abi.EV_BUCKETS))

    def peer_table(self, peer: str) -> PeerTable:
        t = self.peers.get(peer)
        if t is not None:
            return t
        if peer not in self.topo.host_names() or peer == self.host:
            raise MrcError(f"no peer host {peer!r} (hosts: "
                           f"{', '.join(h for h in self.topo.host_names() if h != self.host)})")
        planes = self.topo.planes
        by_plane = [sorted(self.topo.paths(self.host, peer, plane=p), key=lambda x: x.spine or 0)
                    for p in range(planes)]
        paths = [by_plane[i % planes][(i // planes) % len(by_plane[i % planes])] for i in range(self.evs)]
        entries = [EvEntry(i, i % planes) for i in range(self.evs)]
        prof = EvProfile(self.ctx.next_ev_profile_id(), entries, mode=EvMode.EXP)
        self.ctx.create_ev_profile(prof)
        t = PeerTable(peer, self.topo.mrc_address(peer).packed, list(paths), prof, orig=list(paths))
        t.reindex()
        for i, p in enumerate(paths):
            self.fd.set_path(self.host, peer, i, p)
        for plane in self.controller.ports_down:
            prof.deny([i for i in range(self.evs) if i % planes == plane])
        for lk, per in self.controller.denied.items():
            idx = t.by_link.get(lk, [])
            if idx:
                prof.deny(idx)
                per[peer] = idx
        self.peers[peer] = t
        return t

    # -- lifecycle
    def start(self) -> None:
        for h in self.topo.host_names():
            if h != self.host:
                self.peer_table(h)
        self.sock = mrc_socket(self.ns, str(self.topo.mrc_address(self.host)), rcvbuf=32 << 20)
        pmap = {self.fd.ifindex(self.host, ifn): p for p, ifn in enumerate(self.port_ifname)}
        self.driver = SocketDriver(self.ctx, self.sock, pmap,
                                   port_rate_bps=[self.topo.link.rate_bps] * self.topo.planes)
        self.sel.register(self.sock, selectors.EVENT_READ, "udp")
        path = self.socket_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            srv.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        srv.listen(64)
        srv.setblocking(False)
        self.server = srv
        self.sel.register(srv, selectors.EVENT_READ, "listen")
        if self.metrics is not None:
            self.metrics.start(self)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.metrics is not None:
                self.metrics.shutdown()
        for c in list(self.clients.values()):
            self._drop_client(c)
        for peer in list(self.peers):
            for i in range(self.evs):
                with contextlib.suppress(Exception):
                    self.fd.delete_path(self.host, peer, i)
        for q in list(self.qp_peer):
            self._disallow(q)
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_file.unlink()
        if self.sock is not None:
            self.sock.close()
        self.fd.close()

    def tell_peers(self, lk: Link, state: str) -> None:
        """Tell the other hosts' mrcds that fabric link `lk` failed / returned (one line on each peer's
        control socket; on a real fabric this is the controllers' own channel). Access links go by
        PORT_STATUS instead."""
        if self.access_plane(lk) is not None:
            return
        msg = (json.dumps({"id": 0, "op": "link_status", "link": sorted(lk), "state": state,
                           "from": self.host}) + "\n").encode()
        for peer in self.topo.host_names():
            if peer == self.host:
                continue
            path = self.socket_file.parent / f"{self.tb.ns(peer)}.sock"
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.05)
                s.connect(str(path))
                s.sendall(msg)

    def _allow(self, qpn: int) -> None:
        self.fd.allow_qps(self.host, [qpn])

    def _disallow(self, qpn: int) -> None:
        assert self.fd.ingress is not None
        with contextlib.suppress(Exception):
            self.fd.ingress.maps["mrc_allowed_qps"].delete(abi.QpKey(self.hid, qpn))

    # -- main loop
    def run(self, ready: Any = None) -> None:
        drv = self.driver
        assert drv is not None
        ctx = self.ctx
        ctrl = self.controller
        next_ctrl = 0
        if ready is not None:
            ready()
        lock = self.lock
        while not self.stop:
            to = drv.timeout()
            if to is None or to > 0.05:
                to = 0.05
            if drv.want_write:
                to = min(to, 0.0005)
            events = wait(to, self.sel.select)
            with lock:
                udp = False
                for key, mask in events:  # type: ignore[attr-defined]
                    tag = key.data
                    if tag == "udp":
                        udp = True
                    elif tag == "listen":
                        self._accept()
                    else:
                        self._client_io(tag, mask)
                drv.turn(udp)
                self._deliver_wcs()
                now = time.monotonic_ns()
                evs = ctx.poll_ev_events()
                if evs:
                    ctrl.on_events(evs)
                probes = ctx.poll_probe_results()
                if probes:
                    ctrl.on_probe_results(probes)
                if now >= next_ctrl:
                    next_ctrl = now + CTRL_PERIOD_NS
                    ctrl.tick(now)
                    drv.flush(now)
                for c in list(self.clients.values()):
                    if c.wbuf:
                        self._flush_client(c)
                self.turned = time.monotonic()

    def _deliver_wcs(self) -> None:
        for wc in self.cq.poll(1 << 16):
            owner = self.qp_owner.get(wc.qp_num)
            if owner is not None:
                self._push(owner, _wc_doc(wc))

    # -- control socket
    def _accept(self) -> None:
        assert self.server is not None
        try:
            conn, _ = self.server.accept()
        except (BlockingIOError, InterruptedError):
            return
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(SO_PEERCRED_FMT))
        _pid, uid, _gid = struct.unpack(SO_PEERCRED_FMT, cred)
        if uid != 0:
            with contextlib.suppress(OSError):
                conn.sendall((json.dumps({"id": 0, "error": f"permission denied: the MRC control socket is "
                                          f"root-only (uid {uid})"}) + "\n").encode())
            conn.close()
            return
        conn.setblocking(False)
        c = Client(conn, uid)
        self.clients[conn.fileno()] = c
        self.sel.register(conn, selectors.EVENT_READ, c)
        self._push(c, {"id": 0, "ok": {"mrcd": mrc_version, "host": self.host, "protocol": PROTOCOL_VERSION}})

    def _client_io(self, c: Client, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                data, anc, _f, _a = c.sock.recvmsg(1 << 20, socket.CMSG_SPACE(16 * 4))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
                anc = []
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(value[: len(value) - len(value) % a.itemsize])
                    c.fds.extend(a)
            if not data:
                self._drop_client(c)
                return
            c.rbuf += data
            while True:
                i = c.rbuf.find(b"\n")
                if i < 0:
                    if len(c.rbuf) > MAX_REQUEST_BYTES and not c.skipping:
                        self._reject(c, None, RequestRejected(
                            "too_long", f"bad request: longer than {MAX_REQUEST_BYTES} bytes"))
                        c.skipping = True
                    if c.skipping:
                        c.rbuf.clear()
                    break
                line = bytes(c.rbuf[:i])
                del c.rbuf[: i + 1]
                if c.skipping:  # the tail of a line already refused
                    c.skipping = False
                    continue
                self._request(c, line)
                if c.sock.fileno() < 0:
                    return

    def _push(self, c: Client, doc: dict[str, Any]) -> None:
        c.wbuf += (json.dumps(doc, separators=(",", ":")) + "\n").encode()

    def _flush_client(self, c: Client) -> None:
        try:
            n = c.sock.send(c.wbuf)
            del c.wbuf[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            # the peer stopped reading (e.g. a one-line link_status sender): what it sent is still read
            # and handled; the read side sees its EOF and drops it
            c.wbuf.clear()

    def _drop_client(self, c: Client) -> None:
        if c.sock.fileno() >= 0:
            with contextlib.suppress(Exception):
                self.sel.unregister(c.sock)
            self.clients.pop(c.sock.fileno(), None)
            with contextlib.suppress(OSError):
                c.sock.setblocking(True)
                c.sock.settimeout(1.0)
                if c.wbuf:
                    c.sock.sendall(c.wbuf)
            c.sock.close()
        for q in list(c.qps):
            self._destroy_qp(q)
        for h, (mr, mm) in list(c.mrs.items()):
            self.ctx.dereg_mr(mr)
            self.mrs.pop(h, None)
            with contextlib.suppress(BufferError):
                mm.close()
        c.mrs.clear()
        while c.fds:
            with contextlib.suppress(OSError):
                os.close(c.fds.popleft())

    def _reject(self, c: Client, rid: Any, e: ProtocolError) -> None:
        self.rejected[e.reason] = self.rejected.get(e.reason, 0) + 1
        self._push(c, {"id": rid, "error": str(e), "kind": str(e.kind)})

    def _request(self, c: Client, line: bytes) -> None:
        """Answer one request line with exactly one reply; nothing a client sends ends the loop.

        The request is checked against the shared schema (`mrc.dataplane.protocol`) before dispatch, so
        that whatever the handler raises afterwards is either its refusal (MrcError / ValueError:
        `refused`) or a bug (anything else: `internal`, logged here) -- never the client's bad request."""
        try:
            req = parse_request(line)
        except RequestRejected as e:
            self._reject(c, None, e)
            return
        rid = req.get("id")
        if not isinstance(rid, (int, str)) or isinstance(rid, bool):
            rid = None
        op = req["op"]
        try:
            validate_request(req)
        except ProtocolError as e:
            self._reject(c, rid, e)
            return
        fn = getattr(self, f"op_{op}")
        try:
            res = fn(c, req)
        except ProtocolError as e:  # a handler's own protocol check (hello's version)
            self._reject(c, rid, e)
        except (MrcError, ValueError) as e:  # a valid request the operation declines
            self._reject(c, rid, ProtocolError(ErrorKind.REFUSED, "invalid", str(e)))
        except Exception as e:  # a handler bug: one error reply, logged, the loop goes on
            print(f"mrcd: internal error in op {op}: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                  file=sys.stderr, end="")
            self._reject(c, rid, ProtocolError(ErrorKind.INTERNAL, "internal",
                                               f"internal error in op {op} (mrcd logged it)"))
        else:
            self._push(c, {"id": rid, "ok": res})

    # -- operations: applications
    def op_hello(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        """mrcd's identity and protocol version; a client whose protocol major differs is refused here,
        with the versions in the message, rather than failing later on a field it reads differently."""
        if req.get("protocol") is not None:
            check_version(req["protocol"], side="client")
        return {"protocol": PROTOCOL_VERSION, "host": self.host, "testbed": self.tb.name,
                "gid": str(ipaddress.IPv6Address(self.gid)),
                "planes": self.topo.planes, "evs": self.evs, "pid": os.getpid(), "version": mrc_version,
                "peers": [h for h in self.topo.host_names() if h != self.host],
                "link_rate_bps": self.topo.link.rate_bps}

    def op_reg_mr(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        if not c.fds:
            raise MrcError("reg_mr: no file descriptor came with the request")
        fd = c.fds.popleft()
        try:
            length = int(req["length"])
            mm = mmap.mmap(fd, length)
        finally:
            os.close(fd)
        mr = self.ctx.reg_mr(mm)
        h = self._next_mr
        self._next_mr += 1
        self.mrs[h] = mr
        c.mrs[h] = (mr, mm)
        return {"handle": h, "rkey": mr.rkey, "addr": mr.addr, "length": length}

    def op_create_qp(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        peer = str(req["peer"])
        t = self.peer_table(peer)
        evs = req.get("evs")
        planes = req.get("planes")
        profile = t.profile
        pinned = False
        if evs is not None or planes is not None:
            keep_planes = set(range(self.topo.planes)) if planes is None else {int(p) for p in planes}
            bad = keep_planes - set(range(self.topo.planes))
            if bad:
                raise MrcError(f"no plane {min(bad)} (planes 0..{self.topo.planes - 1})")
            chosen = [i for i in range(self.evs) if i % self.topo.planes in keep_planes]
            if evs is not None:
                chosen = chosen[: int(evs)]
            if not chosen:
                raise MrcError("the EV restriction leaves no EV")
            profile = EvProfile(self.ctx.next_ev_profile_id(), list(t.profile.entries), mode=EvMode.EXP,
                                ev_min_active=1)
            self.ctx.create_ev_profile(profile)
            profile.deny([i for i in range(self.evs) if i not in set(chosen)])
            pinned = True
        cc = self.cc_null if req.get("cc") == "null" else self.cc_nscc
        qp = self.ctx.create_qp(self.cq, ev_profile=profile, cc_profile=cc, attr=self.qp_attr())
        self.qp_peer[qp.qpn] = peer
        self.qp_owner[qp.qpn] = c
        if pinned:
            self.pinned_qps.add(qp.qpn)
        c.qps.add(qp.qpn)
        self._allow(qp.qpn)
        return {"qpn": qp.qpn, "peer_gid": str(ipaddress.IPv6Address(t.gid))}

    def _qp(self, c: Client | None, req: dict[str, Any]) -> QueuePair:
        qpn = int(req["qpn"])
        qp = self.ctx.qps.get(qpn)
        if qp is None or (c is not None and qpn not in c.qps):
            raise MrcError(f"no QP {qpn} of this client")
        return qp

    def op_connect(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        qp.connect(self.peers[self.qp_peer[qp.qpn]].gid, int(req["peer_qpn"]))

    def op_destroy_qp(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        c.qps.discard(qp.qpn)
        self._destroy_qp(qp.qpn)

    def _destroy_qp(self, qpn: int) -> None:
        qp = self.ctx.qps.get(qpn)
        if qp is not None:
            for k, v in qp.c.items():
                self.gone_c[k] = self.gone_c.get(k, 0) + int(v)
            for a in ("serial", "rx_packets", "tx_bytes", "rx_bytes"):
                self.gone[a] = self.gone.get(a, 0) + int(getattr(qp, a))
            for p in range(self.topo.planes):
                self.gone_port[p] += int(qp.paths.port_bytes[p])
            self.ctx.destroy_qp(qp)
            if qpn in self.pinned_qps:  # its own restricted profile (op_create_qp): nobody else uses it
                self.ctx.destroy_ev_profile(qp.paths.profile)
        self.qp_peer.pop(qpn, None)
        self.qp_owner.pop(qpn, None)
        self.pinned_qps.discard(qpn)
        self.controller.forget_qp(qpn)
        self._disallow(qpn)

    def op_post_send(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        h = int(req["mr"])
        if h not in c.mrs:
            raise MrcError(f"no memory region {h} of this client")
        imm = req.get("imm")
        qp.post_send(int(req["wr_id"]), c.mrs[h][0], int(req["offset"]), int(req["length"]),
                     int(req["remote_addr"]), int(req["rkey"]), imm=None if imm is None else int(imm))

    def op_post_recv(self, c: Client, req: dict[str, Any]) -> None:
        self._qp(c, req).post_recv(int(req["wr_id"]))

    # -- operations: operator
    def op_qp_stats(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        qp = self._qp(None, req)
        return {"qpn": qp.qpn, "peer": self.qp_peer.get(qp.qpn), "time_ns": time.monotonic_ns(), **qp.stats()}

    def op_qp_show(self, c: Client, req: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for qpn, qp in sorted(self.ctx.qps.items()):
            st = qp.paths.state
            out.append({"host": self.host, "qpn": qpn, "peer": self.qp_peer.get(qpn), "state": qp.state.name,
                        "peer_qpn": getattr(qp, "peer_qpn", None), "cwnd": qp.cc.cwnd, "srtt_ns": qp.srtt,
                        "inflight": qp.inflight, "data_tx": qp.serial, "data_rx": qp.rx_packets,
                        "evs": {s.name.lower(): sum(1 for x in st if x == int(s)) for s in EvState},
                        "restricted": qpn in self.pinned_qps})
        return out

    def op_ev_show(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        want = req.get("state")
        peers = {}
        for peer, t in sorted(self.peers.items()):
            qps = [q for q, p in self.qp_peer.items() if p == peer and q not in self.pinned_qps]
            rows = []
            for i, path in enumerate(t.paths):
                if i in t.profile.denied:
                    state = "DENIED"
                else:
                    states = {EvState(self.ctx.qps[q].paths.state[i]).name for q in qps if q in self.ctx.qps}
                    state = "ASSUMED_BAD" if "ASSUMED_BAD" in states else ("GOOD" if states or not qps else
                                                                            "UNKNOWN")
                    if "DENIED" in states and "ASSUMED_BAD" not in states:
                        state = "DENIED"
                if want and state.lower() != str(want).lower():
                    continue
                rows.append({"ev_index": i, "port": i % self.topo.planes, "plane": path.plane,
                             "spine": path.spine, "via": "-".join(path.hops[1:-1]), "state": state})
            peers[peer] = rows
        return {"host": self.host, "peers": peers,
                "denied_links": sorted(link_name(lk) for lk in self.controller.denied)}

    def _indices(self, req: dict[str, Any]) -> tuple[str, list[int]]:
        peer = str(req["peer"])
        t = self.peer_table(peer)
        idx: list[int] = []
        if req.get("evs"):
            idx = [int(i) for i in req["evs"]]
        if req.get("plane") is not None:
            idx += [i for i, p in enumerate(t.paths) if p.plane == int(req["plane"])]
        if req.get("link"):
            a, b = str(req["link"]).split("-", 1) if "-" in str(req["link"]) else (req["link"], "")
            idx += t.by_link.get(frozenset((a, b)), [])
        if not idx:
            raise MrcError("nothing selected: give EV indices, a plane or a link A-B")
        for i in idx:
            if not 0 <= i < self.evs:
                raise MrcError(f"EV index {i} out of range 0..{self.evs - 1}")
        return peer, sorted(set(idx))

    def op_ev_deny(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        peer, idx = self._indices(req)
        return {"host": self.host, "peer": peer, "denied": self.controller.deny_manual(peer, idx,
                                                                                        time.monotonic_ns())}

    def op_ev_restore(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        peer, idx = self._indices(req)
        return {"host": self.host, "peer": peer, "restored": self.controller.restore_manual(peer, idx,
                                                                                           time.monotonic_ns())}

    def op_port_show(self, c: Client, req: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"host": self.host, "port": p, "ifname": self.port_ifname[p],
                 "enabled": self.ctx.port_enabled[p],
                 "failed": p in self.controller.ports_down} for p in range(self.topo.planes)]

    def op_port_set(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        p = int(req["port"])
        if not 0 <= p < self.topo.planes:
            raise MrcError(f"no port {p} (ports 0..{self.topo.planes - 1})")
        enabled = bool(req["enabled"])
        self.ctx.modify_port(p, enabled, time.monotonic_ns())
        self.controller.act(Action(time.monotonic_ns(), "port_up" if enabled else "port_down",
                                   self.port_ifname[p], 0, "operator"))
        return {"host": self.host, "port": p, "enabled": enabled}

    def op_link_status(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        a, b = (str(x) for x in req["link"])
        state = str(req["state"])
        if state not in ("down", "up"):
            raise MrcError(f"link_status: state must be down or up, got {state!r}")
        res = self.controller.peer_report(frozenset((a, b)), state, str(req.get("from", "?")),
                                          time.monotonic_ns())
        return {"host": self.host, "result": res}

    def op_actions(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        since = int(req.get("since_ns", 0))
        return {"actions": [a.to_dict() for a in self.controller.log if a.time_ns >= since],
                "events": [e for e in self.controller.events if e["time_ns"] >= since]}

    def op_stats(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        assert self.driver is not None
        return {"host": self.host, "engine_drops": dict(self.ctx.drops), "driver": self.driver.stats(),
                "qps": len(self.ctx.qps), "controller": dict(self.controller.counts),
                "ev_events": dict(self.controller.event_counts),
                "probe_results": dict(self.controller.probe_stats),
                "denied_links": sorted(link_name(lk) for lk in self.controller.denied),
                "dataplane": self.fd._host_stats(self.host, False)}


def _wc_doc(wc: WorkCompletion) -> dict[str, Any]:
    return {"push": "wc", "qpn": wc.qp_num, "wr_id": wc.wr_id, "status": wc.status.name,
            "opcode": wc.opcode.name, "byte_len": wc.byte_len, "imm": wc.imm_data,
            "time_ns": time.monotonic_ns()}


def _addr(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected ADDRESS:PORT")
    return host.strip("[]"), int(port)


def _positive_us(value: str) -> int:
    """A duration in microseconds, 1 .. 10 s."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a whole number of microseconds") from None
    if not 1 <= n <= 10_000_000:
        raise argparse.ArgumentTypeError(f"{value}: expected 1 .. 10000000 microseconds")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mrcd",
                                 description="MRC controller daemon for one host (docs/daemon.md).")
    ap.add_argument("-V", "--version", action="version", version=f"mrcd {mrc_version}")
    ap.add_argument("--testbed", default=None, help="testbed name (default: the only one up)")
    ap.add_argument("--host", required=True, help="the host this mrcd serves (e.g. h0)")
    ap.add_argument("--evs", type=int, default=DEFAULT_EVS, help="EVs per peer (split over the planes)")
    ap.add_argument("--reorder-us", type=_positive_us, default=2000,
                    help="QP reordering tolerance (microseconds)")
    ap.add_argument("--probe-timeout-us", type=_positive_us, default=20000,
                    help="a path probe without reply after this long failed (microseconds)")
    ap.add_argument("--metrics", type=_addr, default=None, metavar="ADDR:PORT", help="serve /metrics here")
    ap.add_argument("--socket", type=Path, default=None, help="control socket (default /run/mrc/<host>.sock)")
    ap.add_argument("--ready-fd", type=int, default=None, help="write 'ready\\n' to this fd when serving")
    ap.add_argument("--no-netns", action="store_true",
                    help="stay in the current network namespace (default: move into the host's after "
                         "binding the metrics address here, so 'testbed down' ends mrcd with its namespace)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("mrcd: error: needs root (CAP_NET_ADMIN, CAP_BPF)", file=sys.stderr)
        return 1
    d: Daemon | None = None

    def _stop(signum: int, _frame: Any) -> None:
        if d is not None:
            d.stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGHUP, _stop)
    metrics: MetricsServer | None = None
    try:
        name = tbmod.resolve_name(args.testbed)
        if args.metrics is not None:
            metrics = MetricsServer(*args.metrics)
        if not args.no_netns:
            netns.enter_for_exec(tbmod.Testbed.load(name).ns(args.host))
        d = Daemon(name, args.host, evs=args.evs, socket_file=args.socket, metrics=metrics,
                   reorder_ns=args.reorder_us * 1000, probe_timeout_ns=args.probe_timeout_us * 1000)
        d.start()
    except (MrcError, OSError) as e:
        print(f"mrcd: error: {e}", file=sys.stderr)
        if d is not None:
            d.close()
        elif metrics is not None:
            metrics.srv.server_close()
        return 1

    def ready() -> None:
        print(f"mrcd: {d.host} serving {d.socket_file}"
              + (f", metrics on {args.metrics[0]}:{args.metrics[1]}" if args.metrics else ""),
              file=sys.stderr)
        if args.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(args.ready_fd, b"ready\n")
                os.close(args.ready_fd)

    try:
        d.run(ready)
    finally:
        d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
