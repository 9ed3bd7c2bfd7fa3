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

from mrc.wire.consts import Opcode, pkey_matches
from mrc.wire.errors import WireError
from mrc.wire.icrc import IcrcContext
from mrc.wire.packet import parse, parse_write

from . import fastpath
from .cc import NsccConfig
from .drops import EngineDrop
from .paths import EvEvent, EvEventCq, EvProfile, ProbeResult
from .qp import NEVER, Datagram, QueuePair
from .txring import TxRing
from .verbs import (
    Access,
    AsyncEventKind,
    CompletionChannel,
    CompletionQueue,
    MemoryRegion,
    QpAttr,
    QpHint,
    QpState,
)

#: MRC_API_VER(major, minor, subminor) of mrc_api_ver.h / mrc_ctl_api_ver.h
API_VER_MAJOR_OFFSET: Final = 24
API_VER_MINOR_OFFSET: Final = 16


def api_ver(major: int, minor: int, subminor: int) -> int:
    """`MRC_API_VER(major, minor, subminor)`: the encoding both API version headers use."""
    return (major << API_VER_MAJOR_OFFSET) | (minor << API_VER_MINOR_OFFSET) | subminor


#: the application API version this engine implements (MRC_API_CURRENT_VERSION of mrc_api_ver.h) and
#: the oldest it accepts from an application (MRC_API_LAST_SUPPORTED_VERSION); no vendor API exists,
#: the vendor versions are the header's
API_CURRENT_VERSION: Final = api_ver(1, 0, 1)
API_LAST_SUPPORTED_VERSION: Final = api_ver(0, 0, 0)
VENDOR_API_CURRENT_VERSION: Final = api_ver(1, 0, 0)
VENDOR_API_LAST_SUPPORTED_VERSION: Final = api_ver(0, 0, 0)
#: this engine's limits (what query_device reports and create_* enforce)
MAX_QPN: Final = 0xFFFFFF  # 24-bit QPNs
#: The first QPN handed out (0-0xFF left to well-known QPs, as InfiniBand's QP0/QP1). Numbers go up to
#: MAX_QPN and then wrap to here, skipping those in use: a destroyed QP's number comes back only after
#: every other one was handed out, so a late packet for it does not reach a new QP of the same number.
FIRST_QPN: Final = 0x100
MAX_CQE: Final = 1 << 22
MAX_QP_HINTS: Final = 1 << 16

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


def raise_negative_time(now: int) -> None:
    """The driver's clock went below 0: the engine's times (MXH timestamps, an unsigned 64-bit field on
    the wire) are nanoseconds since any origin at or before the driver's start, never negative."""
    raise ValueError(f"time {now} ns is negative: the engine's clock is nanoseconds since any origin at or "
                     "before the driver's start (docs/transport.md, 'Time')")


class Context:
    """One host's MRC engine (see the module docstring for the driver interface)."""

    fastpath: bool  # set by fastpath.install: this context runs the fast path (MRC_FASTPATH)

    def __init__(
        self, gid: bytes, *, ports: int = 1, seed: int = 0, name: str = "", api_version: int = 0,
        vendor_api_version: int = 0,
    ) -> None:
        """`mrc_create_context`: `api_version` / `vendor_api_version` are mrc_context_attr's versions
        used (0: not said, the current one is assumed); one outside [last supported, current] is
        refused, as the headers refuse it at compile time."""
        if len(gid) != 16:
            raise ValueError("gid must be a 16-byte IPv6 address")
        if api_version and not API_LAST_SUPPORTED_VERSION <= api_version <= API_CURRENT_VERSION:
            raise ValueError(f"API version {api_version:#x} outside the supported range")
        if vendor_api_version and not (
            VENDOR_API_LAST_SUPPORTED_VERSION <= vendor_api_version <= VENDOR_API_CURRENT_VERSION
        ):
            raise ValueError(f"vendor API version {vendor_api_version:#x} outside the supported range")
        self.api_version = api_version or API_CURRENT_VERSION
        self.vendor_api_version = vendor_api_version or VENDOR_API_CURRENT_VERSION
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
        self._next_qpn = FIRST_QPN
        self._port_epoch = 0
        self._active: list[QueuePair] = []
        self.ev_cqs: list[EvEventCq] = []  # EV event CQs: every QP's EV events go to each of them
        self.channels: list[CompletionChannel] = []
        self.qp_hints: dict[int, QpHint] = {}
        # controller objects of mrc_ctl.h kept by mrc.transport.ctl: EV format profiles, the state of
        # EV / CC profiles being configured (INIT / OFFLINE) or ONLINE
        self.ev_fmt_profiles: dict[int, Any] = {}
        self.ctl_ev_profiles: dict[int, Any] = {}
        self.ctl_cc_profiles: dict[int, Any] = {}
        self._async_got: dict[int, int] = {}  # qpn -> async events got and not acked
        self.destroyed = False
        fastpath.install(self)  # self.fastpath: MRC_FASTPATH as read at import, fixed for this context
        self._batch_rx: Any = None  # rxbatch.BatchReceiver, made by the first receive_batch

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

    def create_comp_channel(self) -> CompletionChannel:
        """`mrc_create_comp_channel` (the channel of this context; a driver wanting an fd makes a
        `mrc.dataplane.channel.FdCompletionChannel` and passes it to `create_cq` instead)."""
        ch = CompletionChannel()
        self.channels.append(ch)
        return ch

    def destroy_comp_channel(self, ch: CompletionChannel) -> None:
        """`mrc_destroy_comp_channel`: refused (ValueError, as EBUSY) while a CQ reports to it."""
        users = [c.cqn for c in self.cqs.values() if c.channel is ch]
        if users:
            raise ValueError(f"completion channel is used by CQ {', '.join(map(str, sorted(users)))}")
        if ch in self.channels:
            self.channels.remove(ch)

    def create_cq(
        self, depth: int = 1 << 16, channel: CompletionChannel | None = None, cq_context: Any = None
    ) -> CompletionQueue:
        """`mrc_create_cq`: at most `depth` completions wait (one more overruns it: see
        `CompletionQueue`); with `channel`, `cq.req_notify()` arms completion events; `cq_context` is
        the application's, kept on the CQ (`cq.cq_context`) for whoever gets its events."""
        cq = CompletionQueue(self._next_cqn, depth, channel)
        cq.cq_context = cq_context
        self._next_cqn += 1
        self.cqs[cq.cqn] = cq
        return cq

    def create_ev_event_cq(self, depth: int, cq_context: Any = None) -> EvEventCq:
        """`mrc_ctl_create_ev_event_cq` (without a completion channel: a controller polls it): from
        now on every QP's EV events go to this bounded queue (and to every other EV event CQ of the
        context) instead of `poll_ev_events`' lists."""
        cq = EvEventCq(self._next_cqn, depth, cq_context)
        self._next_cqn += 1
        self.ev_cqs.append(cq)
        return cq

    def destroy_cq(self, cq: CompletionQueue | EvEventCq) -> None:
        """`mrc_destroy_cq` (also of an EV event CQ): refused (ValueError, as EBUSY) while a QP still
        completes into it, or while completion events got from its channel are not acknowledged
        (ibv_destroy_cq waits for those acks; a sans-I/O engine cannot wait, so it refuses)."""
        if isinstance(cq, EvEventCq):
            if cq not in self.ev_cqs:
                raise ValueError(f"CQ {cq.cqn} is not an EV event CQ of this context")
            self.ev_cqs.remove(cq)
            return
        unacked = cq.channel.unacked.get(cq.cqn, 0) if cq.channel is not None else 0
        if unacked:
            raise ValueError(f"CQ {cq.cqn} has {unacked} completion events not acknowledged")
        users = sorted(q.qpn for q in self.qps.values() if cq in (q.send_cq, q.recv_cq))
        if users:
            raise ValueError(f"CQ {cq.cqn} is used by QP {', '.join(hex(q) for q in users)}")
        if self.cqs.get(cq.cqn) is not cq:
            raise ValueError(f"CQ {cq.cqn} is not a CQ of this context")
        del self.cqs[cq.cqn]

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
        hint: QpHint | None = None,
        protocol_version: int = 0,
    ) -> QueuePair:
        """`mrc_create_qp` (in INIT). `protocol_version` is mrc_qp_init_attr's: 0 (the provider's
        default) or MRC_PROTOCOL_VERSION_1, the one wire version this engine speaks (docs/wire.md)."""
        if protocol_version not in (0, 1):
            raise ValueError(f"protocol version {protocol_version:#x}: this engine speaks version 1 only")
        if hint is not None and self.qp_hints.get(hint.hint_id) is not hint:
            raise ValueError(f"QP hint {hint.hint_id} is not a hint of this context")
        cc = self.cc_profiles[cc_profile] if cc_profile is not None else None
        qps = self.qps
        if len(qps) > MAX_QPN - FIRST_QPN:
            raise ValueError(f"every QP number is in use ({len(qps)} QPs)")
        qpn = self._next_qpn
        while qpn > MAX_QPN or qpn in qps:
            qpn = FIRST_QPN if qpn >= MAX_QPN else qpn + 1
        self._next_qpn = qpn + 1
        qp = QueuePair(self, qpn, send_cq, recv_cq or send_cq, ev_profile, cc, attr or QpAttr(), hint)
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
        as ibv_destroy_qp); packets for it are then dropped as unknown_qpn, and its QPN comes back only after
        the other 16.7 million (FIRST_QPN)."""
        if self.qps.get(qp.qpn) is not qp:
            raise ValueError(f"QP {qp.qpn:#x} is not a QP of this context")
        if self._async_got.get(qp.qpn):
            # ibv_destroy_qp waits until its async events are acknowledged; this engine cannot wait
            raise ValueError(f"QP {qp.qpn:#x} has async events not acknowledged (ack_async_event)")
        del self.qps[qp.qpn]
        self._async_got.pop(qp.qpn, None)  # acknowledged (checked above): nothing left of it
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
        """Every queued async event at once, needing no acknowledgement (mrcd's loop)."""
        out, self._async = self._async, []
        return out

    def get_async_event(self) -> AsyncEvent | None:
        """`mrc_get_async_event`: the oldest async event (None when none is queued: a sans-I/O engine
        does not block). It must be acknowledged with `ack_async_event`: until then its QP cannot be
        destroyed, as with ibv_get_async_event."""
        if not self._async:
            return None
        ev = self._async.pop(0)
        self._async_got[ev.qpn] = self._async_got.get(ev.qpn, 0) + 1
        return ev

    def ack_async_event(self, ev: AsyncEvent) -> None:
        """`mrc_ack_async_event`: one event got from `get_async_event` is done with."""
        got = self._async_got.get(ev.qpn, 0)
        if not got:
            raise ValueError(f"async event of QP {ev.qpn:#x} acknowledged but not got")
        if got == 1:
            del self._async_got[ev.qpn]
        else:
            self._async_got[ev.qpn] = got - 1

    def get_qpn(self, qp: QueuePair) -> int:
        """`mrc_get_qpn`: the QP's number; ValueError (EINVAL) for a QP not of this context (destroyed)."""
        if self.qps.get(qp.qpn) is not qp:
            raise ValueError(f"QP {qp.qpn:#x} is not a QP of this context")
        return qp.qpn

    def create_qp_hint(
        self, num_qps_per_peer: int = 1, num_send_peers: int = 1, num_remote_recv_peers: int = 1
    ) -> QpHint:
        """`mrc_create_qp_hint` (what a hint means here: `QpHint`)."""
        if len(self.qp_hints) >= MAX_QP_HINTS:
            raise ValueError(f"at most {MAX_QP_HINTS} QP hints")
        hint = QpHint(self._free_id(self.qp_hints), num_qps_per_peer, num_send_peers, num_remote_recv_peers)
        hint.check()
        self.qp_hints[hint.hint_id] = hint
        return hint

    def destroy_qp_hint(self, hint: QpHint) -> None:
        """`mrc_destroy_qp_hint`: refused (ValueError, as EBUSY) while a QP holds it."""
        if self.qp_hints.get(hint.hint_id) is not hint:
            raise ValueError(f"QP hint {hint.hint_id} is not a hint of this context")
        users = sorted(q.qpn for q in self.qps.values() if q.hint is hint)
        if users:
            raise ValueError(f"QP hint {hint.hint_id} is used by QP {', '.join(hex(q) for q in users)}")
        del self.qp_hints[hint.hint_id]

    def destroy(self) -> None:
        """`mrc_destroy_context`: every object of the context goes (QPs first, without completions, then
        CQs, channels, hints, profiles, memory regions); refused while async events are not
        acknowledged. The context cannot be used afterwards."""
        if self._async_got:
            raise ValueError("async events not acknowledged")
        for qp in list(self.qps.values()):
            self.destroy_qp(qp)
        for ecq in list(self.ev_cqs):
            self.destroy_cq(ecq)
        for cq in list(self.cqs.values()):
            if cq.channel is not None:
                cq.channel.unacked.pop(cq.cqn, None)
            self.destroy_cq(cq)
        self.channels.clear()
        self.qp_hints.clear()
        self.ev_profiles.clear()
        self.cc_profiles.clear()
        for mr in list(self.mrs.values()):
            self.dereg_mr(mr)
        self._out.clear()
        self._async.clear()
        self.destroyed = True

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
        `drops` by reason and never raise (a negative `now` is the driver's error: ValueError)."""
        if now < 0:
            raise_negative_time(now)
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
        if not pkey_matches(pkt.pkey):  # every QP holds the default key (parse_write passes no other)
            self.drop(EngineDrop.BAD_PKEY)
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

    def receive_batch(self, data: Any, lens: Any, ecn: Any, ports: Any, srcs: Any, now: int) -> None:
        """`receive` of each datagram of a batch, in order: row j of the uint8 array `data` holds
        `lens[j]` bytes that arrived on plane `ports[j]` (ECN-CE when `ecn[j]`) from `srcs[j]` (a row of
        16 bytes; `srcs` None: not known). The same results as the calls one by one; the common data
        packet is taken by a compiled kernel without a Python object per packet (rxbatch.py)."""
        if now < 0:
            raise_negative_time(now)
        rx = self._batch_rx
        if rx is None:
            from .rxbatch import BatchReceiver  # numba: imported by the drivers that batch, only

            rx = self._batch_rx = BatchReceiver(self)
        rx.receive_batch(data, lens, ecn, ports, srcs, now)

    def handle_timer(self, now: int) -> None:
        """Run every expired timer (ACK, loss, retransmission, probe). Safe to call early."""
        if now < 0:
            raise_negative_time(now)
        out = self._out
        for qp in self._active:
            if qp.deadline <= now:
                qp.on_timer(now, out)

    def datagrams_to_send(self, now: int) -> list[Datagram]:
        """Everything to transmit now: control packets produced by `receive`/`handle_timer`, then as
        many data packets as the windows allow. Each Datagram owns its buffer."""
        if now < 0:
            raise_negative_time(now)
        out = self._out
        self._send(now, out)
        self._out = []
        return out

    def datagrams_into(self, now: int, ring: TxRing) -> int:
        """`datagrams_to_send` written into `ring` (txring.py): the same datagrams, bytes and order,
        without a Python object per data packet where the compiled send path builds them in their
        slots. Returns how many entries the ring gained."""
        if now < 0:
            raise_negative_time(now)
        t0 = ring.tail
        out = self._out
        self._out = []
        for dg in out:
            ring.append(dg)
        self._send(now, ring)
        return ring.tail - t0

    def _send(self, now: int, out: list[Datagram] | TxRing) -> None:
        for qp in self._active:
            if qp.parked:  # still window-full since its last send: what send would find (and count)
                qp.c["cwnd_limited"] += 1
            elif qp.state == _RTS and (qp.retx_q or qp.cur is not None or qp.send_q or qp.oow_q):
                qp.send(now, out)  # type: ignore[arg-type]  # (a TxRing takes `append` as a list does)

    def next_deadline(self) -> int | None:
        """The earliest armed timer (ns on the driver's clock), or None."""
        d = NEVER
        for qp in self._active:  # QueuePair.deadline, inlined: this runs after every event
            t = qp.ack_deadline
            if t < d:
                d = t
            t = qp.aux_deadline
            if t < d:
                d = t
            if qp.state is not _RTS:  # the requester's timers wait for RTS (QueuePair.deadline)
                continue
            t = qp.rto_deadline
            if t < d:
                d = t
            t = qp.loss_deadline
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
