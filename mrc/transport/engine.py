"""The sans-I/O engine: one `Context` per host (the `mrc_context`), holding memory regions, CQs, EV and
CC profiles and QPs, driven from outside (aioquic style)::

    ctx.receive(datagram, now, ecn=False, port=0)   # a UDP payload that arrived on plane `port`
    ctx.handle_timer(now)                           # when now >= ctx.next_deadline()
    for dg in ctx.datagrams_to_send(now): ...       # Datagram(data, port, ev_index, dst)
    ctx.next_deadline()                             # ns, or None when no timer is armed
    ctx.poll_ev_events(); ctx.poll_async_events()   # controller / application events

Time is an integer number of nanoseconds on the driver's clock, always passed in, never read. Nothing
here opens sockets, starts threads or sleeps; the socket driver and the simulator are two drivers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

from mrc.wire.consts import Opcode
from mrc.wire.errors import WireError
from mrc.wire.icrc import IcrcContext
from mrc.wire.packet import parse, parse_write

from .cc import NsccConfig
from .drops import EngineDrop
from .paths import EvEvent, EvProfile, ProbeResult
from .qp import NEVER, Datagram, QueuePair
from .verbs import (
    Access,
    AsyncEventKind,
    CompletionChannel,
    CompletionQueue,
    MemoryRegion,
    QpAttr,
    QpState,
)

_SACK: Final = int(Opcode.SACK)
_NACK: Final = int(Opcode.NACK)
_PROBE: Final = int(Opcode.PROBE)
_PROBE_REPLY: Final = int(Opcode.PROBE_REPLY)
_PORT_STATUS: Final = int(Opcode.PORT_STATUS)
_RTS: Final = QpState.RTS
_RTR: Final = QpState.RTR


@dataclass(slots=True, frozen=True)
class AsyncEvent:
    time_ns: int
    qpn: int
    kind: AsyncEventKind
    detail: str


class Context:
    """One host's MRC engine (see the module docstring for the driver interface)."""

    def __init__(self, gid: bytes, *, ports: int = 1, seed: int = 0, name: str = "") -> None:
        if len(gid) != 16:
            raise ValueError("gid must be a 16-byte IPv6 address")
        self.gid = bytes(gid)
        self.ports = ports
        self.name = name
        self.rng = random.Random(seed)
        self.mrs: dict[int, MemoryRegion] = {}
        self.qps: dict[int, QueuePair] = {}
        self.cqs: dict[int, CompletionQueue] = {}
        self._next_cqn = 0
        self.ev_profiles: dict[int, EvProfile] = {}
        self.cc_profiles: dict[int, NsccConfig | None] = {}
        self.drops: dict[str, int] = {}  # EngineDrop -> count (only reasons that occurred)
        self.port_enabled = [True] * ports
        self._icrc: dict[tuple[bytes, bytes], IcrcContext] = {}
        self._out: list[Datagram] = []
        self._async: list[AsyncEvent] = []
        self._next_qpn = 0x100
        self._port_epoch = 0
        self._active: list[QueuePair] = []

    # ------------------------------------------------------------------ objects (mrc.h / mrc_ctl.h)

    def reg_mr(self, buf: Any, access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE) -> MemoryRegion:
        """Register a writable buffer (bytearray, mmap, numpy array ...) and give it an R_Key."""
        while True:
            rkey = self.rng.getrandbits(32)
            if rkey and rkey not in self.mrs:
                break
        mr = MemoryRegion(buf, rkey, access)
        self.mrs[rkey] = mr
        return mr

    def dereg_mr(self, mr: MemoryRegion) -> None:
        self.mrs.pop(mr.rkey, None)
        mr.deregister()

    def create_cq(self, depth: int = 1 << 16, channel: CompletionChannel | None = None) -> CompletionQueue:
        """`mrc_create_cq`: at most `depth` completions wait (one more overruns it: see
        `CompletionQueue`); with `channel`, `cq.req_notify()` arms completion events."""
        cq = CompletionQueue(self._next_cqn, depth, channel)
        self._next_cqn += 1
        self.cqs[cq.cqn] = cq
        return cq

    def destroy_cq(self, cq: CompletionQueue) -> None:
        """`mrc_destroy_cq`: refused (ValueError, as EBUSY) while a QP still completes into it."""
        users = sorted(q.qpn for q in self.qps.values() if cq in (q.send_cq, q.recv_cq))
        if users:
            raise ValueError(f"CQ {cq.cqn} is used by QP {', '.join(hex(q) for q in users)}")
        if self.cqs.pop(cq.cqn, None) is None:
            raise ValueError(f"CQ {cq.cqn} is not a CQ of this context")

    @staticmethod
    def _free_id(used: Any) -> int:
        """The lowest positive id not in `used`: ids are never reused while their object exists, and
        a profile created with an explicit id cannot be shadowed by a generated one."""
        pid = 1
        while pid in used:
            pid += 1
        return pid

    def next_ev_profile_id(self) -> int:
        """A profile id no EV profile of this context has (for `EvProfile(...)` built by the caller)."""
        return self._free_id(self.ev_profiles)

    def create_ev_profile(self, profile: EvProfile | None = None, *, count: int = 128) -> EvProfile:
        """Add an EV profile (default: `count` EVs split evenly over this context's ports, with a free
        id). A profile whose id is already taken is refused: replacing it silently would leave the
        QPs of the old one out of every later `modify_port`."""
        if profile is None:
            profile = EvProfile.even(self._free_id(self.ev_profiles), count, self.ports)
        elif profile.profile_id in self.ev_profiles:
            raise ValueError(f"EV profile id {profile.profile_id} exists already")
        if profile.ports > self.ports:
            raise ValueError(f"profile uses port {profile.ports - 1}, the context has {self.ports}")
        self.ev_profiles[profile.profile_id] = profile
        return profile

    def destroy_ev_profile(self, profile: EvProfile) -> None:
        """Remove an EV profile no QP uses any more (ValueError, as EBUSY, while one does)."""
        if self.ev_profiles.get(profile.profile_id) is not profile:
            raise ValueError(f"EV profile {profile.profile_id} is not a profile of this context")
        users = sorted(q.qpn for q in self.qps.values() if q.paths.profile is profile)
        if users:
            used = ", ".join(hex(q) for q in users)
            raise ValueError(f"EV profile {profile.profile_id} is used by QP {used}")
        del self.ev_profiles[profile.profile_id]

    def create_cc_profile(self, cfg: NsccConfig | None) -> int:
        """A CC profile: an NSCC configuration, or None for the null algorithm. Returns its id."""
        pid = self._free_id(self.cc_profiles)
        self.cc_profiles[pid] = cfg
        return pid

    def create_qp(
        self,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue | None = None,
        *,
        ev_profile: EvProfile,
        cc_profile: int | None = None,
        attr: QpAttr | None = None,
    ) -> QueuePair:
        cc = self.cc_profiles[cc_profile] if cc_profile is not None else None
        qpn = self._next_qpn
        self._next_qpn += 1
        qp = QueuePair(self, qpn, send_cq, recv_cq or send_cq, ev_profile, cc, attr or QpAttr())
        self.qps[qpn] = qp
        self._active.append(qp)
        return qp

    def modify_qp(
        self, qp: QueuePair, state: QpState, now: int = 0, *, remote_gid: bytes | None = None,
        remote_qpn: int | None = None, rq_psn: int | None = None,
    ) -> None:
        """`mrc_modify_qp` to `state` (RESET, INIT, RTR, RTS, ERROR): see `QueuePair.modify`."""
        qp.modify(state, now, remote_gid=remote_gid, remote_qpn=remote_qpn, rq_psn=rq_psn)

    def destroy_qp(self, qp: QueuePair) -> None:
        """`mrc_destroy_qp`: the QP leaves the engine at once (no completions for what it still held,
        as ibv_destroy_qp); its QPN is not reused; packets for it are then dropped as unknown_qpn."""
        if self.qps.get(qp.qpn) is not qp:
            raise ValueError(f"QP {qp.qpn:#x} is not a QP of this context")
        del self.qps[qp.qpn]
        if qp in self._active:
            self._active.remove(qp)
        qp.paths.detach()

    def icrc(self, src: bytes, dst: bytes) -> IcrcContext:
        key = (src, dst)
        c = self._icrc.get(key)
        if c is None:
            c = self._icrc[key] = IcrcContext(src, dst)
        return c

    # ------------------------------------------------------------------ controller operations

    def modify_port(self, port: int, enabled: bool, now: int = 0, *, notify_peers: bool = True) -> None:
        """Administratively enable/disable a plane port: its EVs are DENIED for every QP while down, and
        (with `notify_peers`) every connected QP's peer gets a PORT_STATUS so that it stops spraying
        toward this port too (a sender cannot see a failure on the far side's access link)."""
        self.port_enabled[port] = enabled
        for prof in self.ev_profiles.values():
            idx = [i for i, e in enumerate(prof.entries) if e.port == port]
            if enabled:
                prof.allow(idx, now)
            else:
                prof.deny(idx, now)
        if notify_peers:
            self._port_epoch += 1
            for qp in self.qps.values():
                if qp.state == _RTS:
                    qp.push_port_status(port, enabled, self._port_epoch, now, self._out)

    def poll_ev_events(self) -> list[EvEvent]:
        """EV state changes (GOOD <-> ASSUMED_BAD) of every QP, oldest first, with drop counts."""
        out: list[EvEvent] = []
        for qp in self.qps.values():
            if qp.paths.events:
                out.extend(qp.paths.events)
                qp.paths.events.clear()
        out.sort(key=lambda e: e.time_ns)
        return out

    def poll_probe_results(self) -> list[ProbeResult]:
        out: list[ProbeResult] = []
        for qp in self.qps.values():
            out.extend(qp.paths.probe_results)
            qp.paths.probe_results.clear()
        return out

    def poll_async_events(self) -> list[AsyncEvent]:
        out, self._async = self._async, []
        return out

    def async_event(self, now: int, qpn: int, kind: AsyncEventKind, detail: str) -> None:
        self._async.append(AsyncEvent(now, qpn, kind, detail))

    def drop(self, reason: EngineDrop) -> None:
        d = self.drops
        d[reason] = d.get(reason, 0) + 1

    # ------------------------------------------------------------------ sans-I/O driver interface

    def receive(
        self, data: bytes | bytearray | memoryview, now: int, ecn: bool = False, port: int = 0,
        src: bytes | None = None,
    ) -> None:
        """Process one UDP payload that arrived on plane `port` (with ECN-CE when `ecn`). `src`, when the
        driver knows it, is checked against the QP's peer. Malformed or foreign packets are counted in
        `drops` by reason and never raise."""
        if len(data) < 12:
            self.drop(EngineDrop.TRUNCATED)
            return
        qp = self.qps.get((data[5] << 16) | (data[6] << 8) | data[7])
        if qp is None:
            self.drop(EngineDrop.UNKNOWN_QPN)
            return
        if (qp.state != _RTS and qp.state != _RTR) or (src is not None and src != qp.peer_gid):
            # RTR: a responder, receiving before it may send (as RoCE RC)
            bad_state = qp.state != _RTS and qp.state != _RTR
            self.drop(EngineDrop.QP_STATE if bad_state else EngineDrop.FOREIGN_SRC)
            return
        if data[0] < 0x10 and type(data) is not memoryview:
            # the hot path: a well-formed WRITE with a good ICRC, straight to the responder (anything
            # else, and every rejection, goes through `parse` below)
            f = parse_write(data, qp.rx_icrc)
            if f is not None:
                qp.on_write(f, now, ecn, port, self._out)
                return
        try:
            pkt = parse(data, qp.rx_icrc)
        except WireError as e:
            self.drop(EngineDrop(e.reason))
            return
        op = pkt.opcode
        if op < 0x10:  # RDMA WRITE Only (0x0A) / with Immediate (0x0B): parse admits no other below 0xC0
            qp.on_data(pkt, now, ecn, port, self._out)
        elif op == _SACK:
            qp.on_sack(pkt, now)
        elif op == _NACK:
            qp.on_nack(pkt, now)
        elif op == _PROBE:
            qp.on_probe(pkt, now, port, self._out)
        elif op == _PROBE_REPLY:
            qp.on_probe_reply(pkt, now)
        else:
            qp.on_port_status(pkt, now)

    def handle_timer(self, now: int) -> None:
        """Run every expired timer (ACK, loss, retransmission, probe). Safe to call early."""
        out = self._out
        for qp in self._active:
            if qp.deadline <= now:
                qp.on_timer(now, out)

    def datagrams_to_send(self, now: int) -> list[Datagram]:
        """Everything to transmit now: control packets produced by `receive`/`handle_timer`, then as
        many data packets as the windows allow. Each Datagram owns its buffer."""
        out = self._out
        for qp in self._active:
            if qp.parked:  # still window-full since its last send: what send would find (and count)
                qp.c["cwnd_limited"] += 1
            elif qp.state == _RTS and (qp.retx_q or qp.cur is not None or qp.send_q):
                qp.send(now, out)
        self._out = []
        return out

    def next_deadline(self) -> int | None:
        """The earliest armed timer (ns on the driver's clock), or None."""
        d = NEVER
        for qp in self._active:  # QueuePair.deadline, inlined: this runs after every event
            t = qp.rto_deadline
            if t < d:
                d = t
            t = qp.loss_deadline
            if t < d:
                d = t
            t = qp.ack_deadline
            if t < d:
                d = t
            t = qp.aux_deadline
            if t < d:
                d = t
            t = qp.paths.next_probe_deadline
            if t < d:
                d = t
        return None if d >= NEVER else d

    # ------------------------------------------------------------------ introspection

    def stats(self) -> dict[str, Any]:
        return {
            "drops": dict(sorted(self.drops.items())),
            "qps": {qp.qpn: qp.stats() for qp in self.qps.values()},
        }
