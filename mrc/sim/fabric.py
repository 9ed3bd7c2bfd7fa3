"""Discrete-event fabric simulator: a multi-plane two-tier Clos from `mrc.topology`, forwarding by the
SRv6 micro-SID container exactly as the testbed's switches do, with hosts that run the unmodified
`mrc.transport` engines (or the single-path baseline of `mrc.sim.roce`) through the sans-I/O interface.

Model (docs/sim.md has the details and the reasons):

* Every link is two **egress ports** (one per direction) with the topology's rate, a propagation delay and
  an output FIFO. A port is work-conserving and FIFO, so a packet's departure time is known when it is
  enqueued: ``start = max(now, busy_until)``, ``busy_until = start + serialization``; its arrival at the
  next node is one event. The backlog a packet finds is ``(busy_until - now) × rate``: ECN-CE above
  ``ecn_bytes``, trimming above ``trim_bytes`` (data packets keep their headers up to MXH, TRIMMED set, and
  jump the queue as the priority queue of trimmed headers does), drop above ``buffer_bytes``.
* **Forwarding** is static: a switch holds one route per neighbour's micro-SID, and on arrival it shifts
  the container left by 16 bits (``End`` with NEXT-C-SID) and sends the packet to the port of the new
  active micro-SID; the destination host decapsulates (``End.DT6``). A host maps (destination, EV index)
  to (plane port, container) from the path table the controller would install. (The fast event loop,
  the default, does each container's lookups once, when a host first sends it over a port, and the
  packet carries the resulting route chain: the same ports, hop by hop; ``MRC_SIM_FAST=0`` runs the
  reference loop, which looks up at every hop. Both give the same events in the same order.)
* **Failures**: a link goes down (both directions) and up on a schedule. Every packet queued on or
  travelling over the link when it fails is lost (a per-link epoch stamped on each packet), and packets
  that reach a down link later are dropped (the kernel removed the static route; nothing falls back).
* **Hosts**: a NIC egress port per plane (serialization at the port rate, unbounded queue: the
  transport's windows bound it), an engine driven exactly like the loopback harness: deliver, collect
  ``datagrams_to_send``, re-arm one timer from ``next_deadline``.

Everything random (ECMP hash keys, permutations) comes from seeded generators: a run is a pure function
of its configuration and seed.
"""

from __future__ import annotations

import bisect
import heapq
import operator
import os
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from mrc.topology import ROLE_HOST, ROLE_LEAF, ROLE_SPINE, Topology
from mrc.transport.qp import NEVER
from mrc.wire.packet import header_len, trim_in_place

#: Bytes on the wire around the UDP payload the engine produces: outer IPv6 (40) + inner IPv6 (40) +
#: UDP (8) + Ethernet header and FCS (18) + preamble and inter-frame gap (20).
WIRE_OVERHEAD: Final = 40 + 40 + 8 + 18 + 20
_M96: Final = (1 << 96) - 1
_HOST_PORT_BUFFER: Final = 1 << 62
#: Packets with at most this many UDP payload bytes (control packets: SACK, NACK, probes, port status;
#: trimmed headers) use every port's priority queue: they leave after the packet in service, ahead of
#: the data backlog, as an ACK/trim class does in a real fabric.
PRIO_BYTES: Final = 255
#: The priority queue's own buffer, as a share of the port's (data) buffer: a control packet or a trimmed
#: header that finds the port's backlog beyond buffer x (1 + this) is dropped ("prio_buffer"). Without a
#: bound an incast of 128 senders onto one spine kept trimming every retransmission while the headers
#: alone filled the line: a queue of 12x the buffer and no transfer completing in 1 ms.
PRIO_BUFFER_SHARE: Final = 1
_SER_LIST: Final = 16384

#: Calendar queue: events fall into buckets of 2^_SHIFT ns, plain lists; when a bucket's time comes it is
#: sorted once, latest first, and popped from the end (an insertion into the current bucket, rare since
#: packets land a link delay ahead, is placed by a binary search).
_SHIFT: Final = 5
_time: Final = operator.itemgetter(0)  # an event's time


def _neg_time(ev: tuple[Any, ...]) -> int:
    """The key of a bucket sorted latest first, for `bisect` (which wants ascending keys)."""
    return -int(ev[0])


# event kinds (second field of an event tuple; >= 0 is "arrival over egress port k")
_EV_TIMER: Final = -1
_EV_CALL: Final = -2

#: The event loop's fast path (`Fabric._run_fast`), on unless ``MRC_SIM_FAST=0`` was set when this module
#: was imported; each `Fabric` takes the value when it is constructed (tests flip `FAST` to build both
#: kinds in one process). Both loops give the same results event for event: the reference loop
#: (`Fabric._run_ref`) forwards by the container at every switch, the fast loop by a route chain computed
#: from it once per (port, container) (`Fabric._chain`), and handles the common hop (link up, the
#: fabric's rate and delay, a backlog below every threshold) without the marking, trimming and drop tests.
FAST_ENV: Final = "MRC_SIM_FAST"
FAST: bool = os.environ.get(FAST_ENV, "1").strip() != "0"
#: The fast loop in C (mrc/sim/_simc.c, built by `make setup`) where it is built; ``MRC_SIM_FAST=py``
#: keeps the fast loop in Python (the side-by-side measurement, bench/sim_loop_ab.py). Like `FAST`, each
#: `Fabric` takes the value when it is constructed.
LOOP_C: bool = os.environ.get(FAST_ENV, "1").strip().lower() != "py"
#: `_simc.ABI` of the _simc.c this file works with (a stale in-place build is not used)
_SIMC_ABI: Final = 2
#: the route chain's end at a switch with no route for the packet's next micro-SID (unpacking it fails)
_NO_ROUTE: Final[tuple[()]] = ()
#: the most switches a route chain may cross (a valid container names at most 6)
_MAX_CHAIN: Final = 64


def _load_simc() -> Any:
    """`mrc.sim._simc`, or None: not built, or built from another version of its source, or written
    against other values of this module's constants."""
    try:
        from . import _simc  # type: ignore[attr-defined]
    except ImportError:
        return None
    want = {"_SHIFT": _SHIFT, "_SER_LIST": _SER_LIST, "PRIO_BYTES": PRIO_BYTES, "_EV_TIMER": _EV_TIMER,
            "_EV_CALL": _EV_CALL, "NEVER": NEVER}
    if getattr(_simc, "ABI", None) != _SIMC_ABI or _simc.consts() != want:
        return None
    return _simc


_SIMC: Any = _load_simc()


class Endpoint(Protocol):
    """What a simulated host runs: the sans-I/O driver interface of `mrc.transport.Context`."""

    def receive(
        self, data: Any, now: int, ecn: bool = False, port: int = 0, src: bytes | None = None
    ) -> None: ...

    def handle_timer(self, now: int) -> None: ...

    def datagrams_to_send(self, now: int) -> list[Any]: ...

    def next_deadline(self) -> int | None: ...


@dataclass
class FabricParams:
    """Switch port behaviour (every fabric port alike) and link timing."""

    rate_bps: int = 100_000_000_000
    delay_ns: int = 500  # propagation delay of every link
    buffer_bytes: int = 512 * 1024  # drop above this backlog
    ecn_bytes: int = 64 * 1024  # CE-mark above this backlog
    trim_bytes: int | None = 256 * 1024  # trim data packets above this backlog; None: no trimming
    wire_overhead: int = WIRE_OVERHEAD

    def ser_ns(self, wire_bytes: int) -> int:
        return (wire_bytes * 8_000_000_000 + self.rate_bps - 1) // self.rate_bps


class Router(Protocol):
    def __call__(self, dg: Any) -> tuple[int, int]: ...


#: A host's path table: destination address -> EV index -> (NIC egress port, container).
PathTable = dict[Any, list[tuple[int, int]]]


class Fabric:
    """The network and the event loop. Build it from a topology, attach an endpoint per host with its
    path table (destination -> EV index -> (NIC egress port, container)) or a router (a callable from a
    datagram to the same pair), then `run`. A datagram is (payload, port, EV index, destination); the
    payload's len() is its UDP payload size."""

    def __init__(self, topo: Topology, params: FabricParams | None = None, fast: bool | None = None) -> None:
        self.topo = topo
        #: which event loop `run` uses (`FAST`, MRC_SIM_FAST); fixed before the first packet is sent, as
        #: the two loops' packet events differ (a container or a route chain)
        self.fast = FAST if fast is None else fast
        #: the fast loop's C module (`_simc.run`), or None: the loop in Python
        self._loop_c: Any = _SIMC if self.fast and LOOP_C else None
        self.p = p = params or FabricParams()
        self.rate_Bpns = p.rate_bps / 8e9
        self.ovh = p.wire_overhead
        self._ser: dict[int, int] = {}
        #: serialization time by wire size for every packet an MTU allows (a list index per hop)
        self._ser_l: array[int] = array("q", [p.ser_ns(w) for w in range(_SER_LIST)])
        # ---- nodes: hosts 0..H-1, then switches
        self.nhosts = len(topo.hosts)
        self.node_names: list[str] = [n for n, _ in topo.hosts]
        self.node_index: dict[str, int] = {n: i for i, n in enumerate(self.node_names)}
        for sw in topo.switches():
            self.node_index[sw.name] = len(self.node_names)
            self.node_names.append(sw.name)
        nn = len(self.node_names)
        self.fib: list[dict[int, int]] = [{} for _ in range(nn)]  # switch: next uSID -> egress port
        # ---- ports (egress side of each link direction) and links. The tables a hop reads or writes are
        # arrays of 8-byte cells ('q': int64, 'd': double), which the C loop (mrc/sim/_simc.c) shares
        # through the buffer protocol; they index and assign like lists.
        self.port_node: array[int] = array("q")  # the node the port sends TO
        self.port_from: list[int] = []
        self.port_link: array[int] = array("q")
        self.port_plane: array[int] = array("q")
        self.port_buffer: list[int] = []
        self.busy: array[int] = array("q")
        self.port_tx_bytes: array[int] = array("q")
        self.port_max_backlog: array[int] = array("q")
        self.port_up: list[bool] = []  # link_up / link_epoch of each port's link (one index less per hop)
        self.port_epoch: array[int] = array("q")
        self.link_names: list[tuple[str, str]] = []
        self.link_index: dict[frozenset[str], int] = {}
        self.link_up: list[bool] = []
        self.link_epoch: list[int] = []
        self.link_ports: list[tuple[int, int]] = []
        #: host index -> plane -> NIC egress port
        self.host_port: list[list[int]] = [[-1] * topo.planes for _ in range(self.nhosts)]
        self.port_index: dict[tuple[str, str], int] = {}
        #: per port (slowdown, extra delay ns) where the link's rate or delay differs from the fabric's
        #: (topology `[[link_override]]`, `set_link_rate`), else None: one list index per hop
        self.port_mods: list[tuple[float, int] | None] = []
        # ---- the fast loop's tables (`_run_fast`)
        #: per port: container -> route chain from the node the port leads to (`_chain`)
        self._chains: list[dict[int, Any]] = []
        #: per port: backlog (bytes, as a float) below which a hop needs no ECN, trim or drop test; 0.0
        #: where the port's link is down or has its own rate or delay (those hops take the general code)
        self._safe: array[float] = array("d")
        #: port_max_backlog + 1 as floats, made by each `_run_fast`
        self._mb1: array[float] = array("d")
        #: a link changed state once: packet events may carry an old epoch (until then every epoch is 0
        #: and the fast loop skips the comparison)
        self._epochs_moved = False
        for lk in topo.links():
            a, b = self.node_index[lk.a], self.node_index[lk.b]
            li = len(self.link_names)
            self.link_names.append((lk.a, lk.b))
            self.link_index[frozenset((lk.a, lk.b))] = li
            self.link_up.append(True)
            self.link_epoch.append(0)
            up = self._add_port(a, b, li, lk.plane, lk.kind == "host-leaf")
            down = self._add_port(b, a, li, lk.plane, False)
            self.link_ports.append((up, down))
            self.port_index[(lk.a, lk.b)] = up
            self.port_index[(lk.b, lk.a)] = down
            ua = self._usid(lk.a, lk.plane)
            ub = self._usid(lk.b, lk.plane)
            if a >= self.nhosts:
                self.fib[a][ub] = up
            else:
                self.host_port[a][lk.plane] = up
            self.fib[b][ua] = down
        for o in topo.link_overrides:  # degraded or longer links of the topology file
            delay = None if o.delay_us is None else o.delay_us * 1000
            self.set_link_rate(self.link(o.a, o.b), o.rate_bps, delay)
        # ---- hosts
        self.endpoints: list[Endpoint | None] = [None] * self.nhosts
        self.routers: list[Router | None] = [None] * self.nhosts
        self.tables: list[PathTable | None] = [None] * self.nhosts
        self.timer_at = [NEVER] * self.nhosts
        self._refresh_safe()
        # ---- event loop
        # the event queue: (time, kind, a, container, data, size, ecn) tuples (the fast loop carries the
        # route chain where the reference loop carries the container); events at the same time run in
        # push order (each bucket is kept in it: see _run_ref)
        self.cb = -1  # current bucket
        self.cur: list[tuple[Any, ...]] = []  # the current bucket's events, sorted latest first
        self.future: dict[int, list[tuple[Any, ...]]] = {}  # bucket -> events in push order (unsorted)
        self.bidx: list[int] = []  # heap of the buckets in `future`
        self.now = 0
        self.events = 0
        self.hops = 0
        self.wall_s = 0.0
        self.cpu_s = 0.0  # process CPU time of the loop: the speed measure that other jobs disturb least
        self.drops: dict[str, int] = {}
        self.trims = 0
        self.ecn_marks = 0
        self.lost_on_link: list[int] = [0] * len(self.link_names)
        self.down_data_drops: dict[int, int] = {}
        self.last_down_drop: dict[int, int] = {}
        #: optional hook per packet delivered to a host: (host, plane, data, now)
        self.on_deliver: Callable[[int, int, Any, int], None] | None = None

    # ------------------------------------------------------------------ construction helpers

    def _usid(self, name: str, plane: int) -> int:
        return self.topo.node_usid(name, plane)

    def _add_port(self, frm: int, to: int, link: int, plane: int, host_nic: bool) -> int:
        k = len(self.port_node)
        self.port_node.append(to)
        self.port_from.append(frm)
        self.port_link.append(link)
        self.port_plane.append(plane)
        self.port_buffer.append(_HOST_PORT_BUFFER if host_nic else self.p.buffer_bytes)
        self.busy.append(0)
        self.port_tx_bytes.append(0)
        self.port_max_backlog.append(0)
        self.port_up.append(True)
        self.port_epoch.append(0)
        self.port_mods.append(None)
        self._chains.append({})
        self._safe.append(0.0)
        return k

    def _refresh_safe(self, ports: Any = None) -> None:
        """Recompute `_safe` (of `ports`, default all): the backlog x below which a hop of the port passes
        every test of the general code, that is x < ECN threshold + 1, x < trim threshold + 1 and
        x < buffer - wire size + 1 for any wire size below _SER_LIST (the fast hop checks that bound)."""
        p = self.p
        ecn_1 = p.ecn_bytes + 1
        trim_1 = NEVER + 1 if p.trim_bytes is None else p.trim_bytes + 1
        for k in range(len(self.port_node)) if ports is None else ports:
            if not self.port_up[k] or self.port_mods[k] is not None:
                self._safe[k] = 0.0
            else:
                lim = min(ecn_1, trim_1, self.port_buffer[k] - _SER_LIST + 2, 1 << 52)  # exact as a float
                self._safe[k] = float(lim) if lim > 0 else 0.0

    def ser(self, wire_bytes: int) -> int:
        s = self._ser.get(wire_bytes)
        if s is None:
            s = self._ser[wire_bytes] = self.p.ser_ns(wire_bytes)
        return s

    def container(self, usids: tuple[int, ...] | list[int]) -> int:
        """The 96 bits of a micro-SID container after the 32-bit block (first uSID in the top 16)."""
        v = 0
        for i, u in enumerate(usids):
            v |= (u & 0xFFFF) << (80 - 16 * i)
        return v

    def path_container(self, src: int, dst: int, plane: int, spine: int | None) -> tuple[int, int]:
        """(NIC egress port, container) of the path src -> dst in `plane` via `spine` (None: same leaf),
        the same micro-SID list as `Topology.path` ([leaf, spine, leaf, host port])."""
        topo = self.topo
        ls, ld = topo.hosts[src][1], topo.hosts[dst][1]
        dport = topo.usid(plane, ROLE_HOST, dst)
        if ls == ld:
            usids: tuple[int, ...] = (topo.usid(plane, ROLE_LEAF, ls), dport)
        else:
            assert spine is not None
            usids = (topo.usid(plane, ROLE_LEAF, ls), topo.usid(plane, ROLE_SPINE, spine),
                      topo.usid(plane, ROLE_LEAF, ld), dport)
        return self.host_port[src][plane], self.container(usids)

    def attach(self, host: int, endpoint: Endpoint, router: Router | PathTable) -> None:
        self.endpoints[host] = endpoint
        if isinstance(router, dict):
            self.tables[host] = router
        else:
            self.routers[host] = router

    # ------------------------------------------------------------------ schedule

    def at(self, t: int, fn: Callable[[int], None]) -> None:
        """Call fn(t) at virtual time t (failures, samplers, traffic starts)."""
        self._sched((t, _EV_CALL, fn, 0, None, 0, False))

    def _sched(self, ev: tuple[Any, ...]) -> None:
        b = ev[0] >> _SHIFT
        if b <= self.cb:
            # rare: events land at least one link delay ahead. The current bucket runs from its end: the
            # event goes before every one at its time or earlier (they were pushed before it), after the rest
            cur = self.cur
            cur.insert(bisect.bisect_left(cur, -ev[0], key=_neg_time), ev)
            return
        lst = self.future.get(b)
        if lst is None:
            self.future[b] = [ev]
            heapq.heappush(self.bidx, b)
        else:
            lst.append(ev)

    def pending(self) -> int:
        """Events queued."""
        return len(self.cur) + sum(len(v) for v in self.future.values())

    def link(self, a: str, b: str) -> int:
        try:
            return self.link_index[frozenset((a, b))]
        except KeyError:
            raise KeyError(f"no link between {a} and {b}") from None

    def set_link(self, li: int, up: bool, now: int) -> None:
        """Take a link down (both directions; what is queued or on the wire is lost) or up."""
        if self.link_up[li] == up:
            return
        self.link_up[li] = up
        self.link_epoch[li] += 1
        self._epochs_moved = True
        for k in self.link_ports[li]:
            self.port_up[k] = up
            self.port_epoch[k] = self.link_epoch[li]
            if not up:
                self.busy[k] = now  # the queue is gone with the link
        self._refresh_safe(self.link_ports[li])

    def set_link_rate(self, li: int, rate_bps: int | None = None, delay_ns: int | None = None) -> None:
        """A degraded (or restored) link: both directions serialize at `rate_bps` (None: the fabric's
        rate) and add `delay_ns` of propagation delay (None: the fabric's); routing is unchanged."""
        if rate_bps is not None and rate_bps <= 0:
            raise ValueError("a link rate must be positive")
        slow = 1.0 if rate_bps is None else self.p.rate_bps / rate_bps
        extra = 0 if delay_ns is None else delay_ns - self.p.delay_ns
        if extra < 0 and self.p.delay_ns + extra < 0:
            raise ValueError("a link delay must not be negative")
        mods = self.port_mods
        for k in self.link_ports[li]:
            mods[k] = None if slow == 1.0 and extra == 0 else (slow, extra)
        self._refresh_safe(self.link_ports[li])

    def fail_link(self, a: str, b: str, start_ns: int, end_ns: int = NEVER) -> None:
        li = self.link(a, b)
        self.at(start_ns, lambda t: self.set_link(li, False, t))
        if end_ns < NEVER:
            self.at(end_ns, lambda t: self.set_link(li, True, t))

    def _down_drop(self, li: int, data: Any, t: int) -> None:
        """A packet reached a link that is down: dropped (no route). Per link, data packets are counted
        and every packet but a probe is timed: the last one tells when the endpoints stopped sending
        into the dead link (data, and ACKs whose path crosses it)."""
        self._drop("link_down")
        if is_data(data):
            self.down_data_drops[li] = self.down_data_drops.get(li, 0) + 1
        if not is_probe(data):
            self.last_down_drop[li] = t

    def _drop(self, reason: str) -> None:
        d = self.drops
        d[reason] = d.get(reason, 0) + 1

    # ------------------------------------------------------------------ sending

    def send_from_host(self, h: int, out: list[Any], t: int) -> None:
        """Put a host's datagrams on its NIC ports (FIFO at the port rate) toward the first leaf."""
        if self.fast:
            self._send_fast(h, out, t)
        else:
            self._send_ref(h, out, t)

    def _send_ref(self, h: int, out: list[Any], t: int) -> None:
        """`send_from_host` of the reference loop: packet events carry the container."""
        table = self.tables[h]
        route = self.routers[h]
        busy = self.busy
        ser_l = self._ser_l
        ovh = self.ovh
        delay = self.p.delay_ns
        port_up = self.port_up
        port_epoch = self.port_epoch
        tx = self.port_tx_bytes
        future = self.future
        cb = self.cb
        mods = self.port_mods
        last_dst: Any = None
        row: Any = None
        for dg in out:
            data = dg[0]
            if table is not None:
                dst = dg[3]
                if dst is not last_dst:  # an engine emits runs of datagrams to one peer
                    row = table[dst]
                    last_dst = dst
                port, cont = row[dg[2]]
            else:
                assert route is not None
                port, cont = route(dg)
            n = len(data)
            if not port_up[port]:
                self._down_drop(self.port_link[port], data, t)
                continue
            w = n + ovh
            s = ser_l[w] if w < _SER_LIST else self.ser(w)
            m = mods[port]
            if m is not None:
                s = int(s * m[0])
            b = busy[port]
            if b < t:
                b = t
            if n <= PRIO_BYTES:
                end = t + s
                busy[port] = b + s
            else:
                end = b + s
                busy[port] = end
            tx[port] += w
            end += delay if m is None else delay + m[1]
            ev = (end, port, port_epoch[port], cont, data, n, False)
            bk = end >> _SHIFT
            if bk <= cb:
                self._sched(ev)
            else:
                lst = future.get(bk)
                if lst is None:
                    future[bk] = [ev]
                    heapq.heappush(self.bidx, bk)
                else:
                    lst.append(ev)

    # ------------------------------------------------------------------ the event loop

    def run(
        self,
        until_ns: int = NEVER,
        stop: Callable[[], bool] | None = None,
        check_every: int = 4096,
        progress: Callable[[Fabric], None] | None = None,
        progress_every_s: float = 2.0,
    ) -> int:
        """Process events until none is left, `until_ns` passes or `stop()` is true (checked every
        `check_every` events). `progress(self)` is called about every `progress_every_s` wall seconds."""
        loop = self._run_fast if self.fast else self._run_ref
        return loop(until_ns, stop, check_every, progress, progress_every_s)

    def _run_ref(
        self,
        until_ns: int,
        stop: Callable[[], bool] | None,
        check_every: int,
        progress: Callable[[Fabric], None] | None,
        progress_every_s: float,
    ) -> int:
        """The reference event loop (MRC_SIM_FAST=0): every switch hop shifts the container and looks up
        the route, and tests the backlog against every threshold."""
        pop = heapq.heappop
        push = heapq.heappush
        sched = self._sched
        future = self.future
        bidx = self.bidx
        cur = self.cur
        cur_pop = cur.pop
        cb = self.cb
        endpoints = self.endpoints
        timer_at = self.timer_at
        nhosts = self.nhosts
        port_node = self.port_node
        port_plane = self.port_plane
        port_buffer = self.port_buffer
        port_up = self.port_up
        port_epoch = self.port_epoch
        max_backlog = self.port_max_backlog
        tx = self.port_tx_bytes
        busy = self.busy
        fib = self.fib
        rate = self.rate_Bpns
        ovh = self.ovh
        delay = self.p.delay_ns
        ecn_k = self.p.ecn_bytes
        trim_t = self.p.trim_bytes
        trimming = trim_t is not None
        if trim_t is None:
            trim_t = NEVER
        ecn_1 = ecn_k + 1
        trim_1 = trim_t + 1
        ser_l = self._ser_l
        serf = self.ser
        mods = self.port_mods
        send_from_host = self._send_ref
        on_deliver = self.on_deliver
        events = 0
        hops = 0
        t0 = time.perf_counter()
        c0 = time.process_time()
        next_progress = t0 + progress_every_s
        while True:
            if not cur:
                if not bidx:
                    if until_ns < NEVER:
                        self.now = max(self.now, until_ns)
                    break
                cb = pop(bidx)
                self.cb = cb
                cur = future.pop(cb)
                # A future bucket is in push order, so a stable sort by time, reversed, then popping from
                # the end runs its events in (time, push) order: exactly the order of a heap of (time,
                # sequence number) tuples, at a fraction of the cost (one C sort of plain ints per bucket)
                cur.sort(key=_time)
                cur.reverse()
                cur_pop = cur.pop
                self.cur = cur
            ev = cur_pop()
            t, kind, a, cont, data, n, ecn = ev
            if t > until_ns:
                cur.append(ev)
                self.now = until_ns
                break
            events += 1
            if kind >= 0:
                hops += 1
                if a != port_epoch[kind]:  # the link failed while the packet was queued or on it
                    self.lost_on_link[self.port_link[kind]] += 1
                    self._drop("link_failed")
                    continue
                node = port_node[kind]
                if node < nhosts:
                    eng = endpoints[node]
                    if eng is None:
                        self._drop("no_endpoint")
                        continue
                    self.now = t
                    if on_deliver is not None:
                        on_deliver(node, port_plane[kind], data, t)
                    eng.receive(data, t, ecn, port_plane[kind])
                    out = eng.datagrams_to_send(t)
                    if out:
                        send_from_host(node, out, t)
                    dl = eng.next_deadline()
                    if dl is not None and dl < timer_at[node]:
                        timer_at[node] = dl
                        sched((dl if dl > t else t, _EV_TIMER, node, 0, None, 0, False))
                    continue
                # a switch: End with NEXT-C-SID (shift the container), then the static route
                cont = (cont << 16) & _M96
                try:
                    port = fib[node][cont >> 80]
                except KeyError:
                    self._drop("no_route")
                    continue
                if not port_up[port]:
                    self._down_drop(self.port_link[port], data, t)
                    continue
                # The backlog found is q = int((b - t) * rate) bytes; q > K <=> (b - t) * rate >= K + 1
                # for an integer K, so the thresholds are compared with the float x, without int().
                m = mods[port]
                b = busy[port]
                if b > t:
                    x = (b - t) * rate if m is None else (b - t) * rate / m[0]
                    if x >= max_backlog[port] + 1:
                        max_backlog[port] = int(x)
                else:
                    x = 0.0
                    b = t
                if x >= ecn_1:
                    ecn = True
                    self.ecn_marks += 1
                w = n + ovh
                trim = x >= trim_1 and type(data) is bytearray and data[0] < 0x10 and n > header_len(data[0])
                if trim or n <= PRIO_BYTES:
                    if trim:
                        # trimmed: headers only, served from the priority queue ahead of the backlog
                        n = trim_in_place(data, n)
                        del data[n:]
                        w = n + ovh
                        self.trims += 1
                    # control packets and trimmed headers: the priority queue, with a buffer of its own
                    # (PRIO_BUFFER_SHARE)
                    if x >= (1 + PRIO_BUFFER_SHARE) * port_buffer[port] - w + 1:
                        self._drop("prio_buffer")
                        continue
                    s = ser_l[w] if w < _SER_LIST else serf(w)
                    if m is not None:
                        s = int(s * m[0])
                    busy[port] = b + s
                    tx[port] += w
                    ta = t + s + (delay if m is None else delay + m[1])
                    ev = (ta, port, port_epoch[port], cont, data, n, ecn)
                    bk = ta >> _SHIFT
                    if bk <= cb:
                        sched(ev)
                    else:
                        lst = future.get(bk)
                        if lst is None:
                            future[bk] = [ev]
                            push(bidx, bk)
                        else:
                            lst.append(ev)
                    continue  # (as before: the stop/progress check below runs after data hops only)
                if x >= port_buffer[port] - w + 1:
                    self._drop("buffer" if trimming else "buffer_no_trim")
                    continue
                s = ser_l[w] if w < _SER_LIST else serf(w)
                if m is not None:
                    s = int(s * m[0])
                b += s
                busy[port] = b
                tx[port] += w
                ta = b + (delay if m is None else delay + m[1])
                ev = (ta, port, port_epoch[port], cont, data, n, ecn)
                bk = ta >> _SHIFT
                if bk <= cb:
                    sched(ev)
                else:
                    lst = future.get(bk)
                    if lst is None:
                        future[bk] = [ev]
                        push(bidx, bk)
                    else:
                        lst.append(ev)
            elif kind == _EV_TIMER:
                if timer_at[a] != t:
                    continue
                timer_at[a] = NEVER
                eng = endpoints[a]
                assert eng is not None
                self.now = t
                eng.handle_timer(t)
                out = eng.datagrams_to_send(t)
                if out:
                    send_from_host(a, out, t)
                dl = eng.next_deadline()
                if dl is not None and dl < timer_at[a]:
                    timer_at[a] = dl
                    sched((dl if dl > t else t, _EV_TIMER, a, 0, None, 0, False))
            else:
                self.now = t
                a(t)
            if not events & 1023:
                if stop is not None and not events % check_every and stop():
                    break
                if progress is not None:
                    now_w = time.perf_counter()
                    if now_w >= next_progress:
                        self.events += events
                        self.hops += hops
                        self.wall_s += now_w - t0
                        events = hops = 0
                        t0 = now_w
                        next_progress = now_w + progress_every_s
                        progress(self)
        self.events += events
        self.hops += hops
        self.wall_s += time.perf_counter() - t0
        self.cpu_s += time.process_time() - c0
        return events

    # ------------------------------------------------------------------ the fast loop (MRC_SIM_FAST)

    def _chain(self, port: int, cont: int) -> Any:
        """The route chain of a packet sent over `port` with container `cont`, kept per (port, container):
        at each switch it reaches, the pair (egress port, the chain from the next node); None at a host;
        `_NO_ROUTE` at a switch without a route for the next micro-SID. It is the reference loop's hop by
        hop lookup (shift the container, look up the new active micro-SID) done once: the routes never
        change (a down link drops at its port, as in the reference loop)."""
        steps: list[int] = []
        node = self.port_node[port]
        c = cont
        end: Any = None
        while node >= self.nhosts:
            if len(steps) >= _MAX_CHAIN:  # a routing loop (impossible with unique micro-SIDs): a packet
                end = _NO_ROUTE           # that would circle until the run ends is dropped as unroutable
                break
            c = (c << 16) & _M96
            nxt = self.fib[node].get(c >> 80)
            if nxt is None:
                end = _NO_ROUTE
                break
            steps.append(nxt)
            node = self.port_node[nxt]
        ch = end
        for k in reversed(steps):
            ch = (k, ch)
        self._chains[port][cont] = ch
        return ch

    def _send_fast(self, h: int, out: list[Any], t: int) -> None:
        """`send_from_host` of the fast loop: packet events carry the route chain (the loop inlines this
        for deliveries; timers and `kick` call it)."""
        table = self.tables[h]
        route = self.routers[h]
        busy = self.busy
        ser_l = self._ser_l
        ovh = self.ovh
        delay = self.p.delay_ns
        port_epoch = self.port_epoch
        safe = self._safe
        chains = self._chains
        tx = self.port_tx_bytes
        future = self.future
        cb = self.cb
        last_dst: Any = None
        row: Any = None
        for dg in out:
            data = dg[0]
            if table is not None:
                dst = dg[3]
                if dst is not last_dst:  # an engine emits runs of datagrams to one peer
                    row = table[dst]
                    last_dst = dst
                port, cont = row[dg[2]]
            else:
                assert route is not None
                port, cont = route(dg)
            try:
                ch = chains[port][cont]
            except KeyError:
                ch = self._chain(port, cont)
            n = len(data)
            if not safe[port]:
                self._send_slow(port, ch, data, n, t)
                continue
            w = n + ovh
            s = ser_l[w] if w < _SER_LIST else self.ser(w)
            b = busy[port]
            if b < t:
                b = t
            if n <= PRIO_BYTES:
                busy[port] = b + s
                end = t + s + delay
            else:
                b += s
                busy[port] = b
                end = b + delay
            tx[port] += w
            ev = (end, port, port_epoch[port], ch, data, n, False)
            bk = end >> _SHIFT
            if bk <= cb:
                self._sched(ev)
            else:
                lst = future.get(bk)
                if lst is None:
                    future[bk] = [ev]
                    heapq.heappush(self.bidx, bk)
                else:
                    lst.append(ev)

    def _send_slow(self, port: int, ch: Any, data: Any, n: int, t: int) -> None:
        """One datagram onto a NIC port that is down or has its own rate or delay (`_send_ref`'s code)."""
        if not self.port_up[port]:
            self._down_drop(self.port_link[port], data, t)
            return
        w = n + self.ovh
        s = self.ser(w)
        m = self.port_mods[port]
        if m is not None:
            s = int(s * m[0])
        busy = self.busy
        b = busy[port]
        if b < t:
            b = t
        if n <= PRIO_BYTES:
            end = t + s
            busy[port] = b + s
        else:
            end = b + s
            busy[port] = end
        self.port_tx_bytes[port] += w
        end += self.p.delay_ns if m is None else self.p.delay_ns + m[1]
        self._sched((end, port, self.port_epoch[port], ch, data, n, False))

    def _hop_slow(self, port: int, ch: Any, data: Any, n: int, ecn: bool, t: int) -> bool:
        """A switch hop onto `port` that the fast loop does not take inline (the link is down or has its
        own rate or delay, the backlog reaches a threshold, a huge packet): the reference loop's code.
        True when a data packet was forwarded (the loop then runs its stop/progress check, as the
        reference loop does after exactly those hops)."""
        if not self.port_up[port]:
            self._down_drop(self.port_link[port], data, t)
            return False
        p = self.p
        rate = self.rate_Bpns
        busy = self.busy
        max_backlog = self.port_max_backlog
        m = self.port_mods[port]
        b = busy[port]
        if b > t:
            x = (b - t) * rate if m is None else (b - t) * rate / m[0]
            if x >= max_backlog[port] + 1:
                max_backlog[port] = q = int(x)
                self._mb1[port] = q + 1.0
        else:
            x = 0.0
            b = t
        if x >= p.ecn_bytes + 1:
            ecn = True
            self.ecn_marks += 1
        w = n + self.ovh
        # a data packet not trimmed yet (a header trimmed at an earlier hop is served as a control packet)
        trim = (p.trim_bytes is not None and x >= p.trim_bytes + 1 and type(data) is bytearray
                and data[0] < 0x10 and n > header_len(data[0]))
        delay = p.delay_ns if m is None else p.delay_ns + m[1]
        if trim or n <= PRIO_BYTES:
            if trim:
                n = trim_in_place(data, n)
                del data[n:]
                w = n + self.ovh
                self.trims += 1
            if x >= (1 + PRIO_BUFFER_SHARE) * self.port_buffer[port] - w + 1:  # (the reference loop's)
                self._drop("prio_buffer")
                return False
            s = self.ser(w)
            if m is not None:
                s = int(s * m[0])
            busy[port] = b + s
            self.port_tx_bytes[port] += w
            self._sched((t + s + delay, port, self.port_epoch[port], ch, data, n, ecn))
            return False
        if x >= self.port_buffer[port] - w + 1:
            self._drop("buffer" if p.trim_bytes is not None else "buffer_no_trim")
            return False
        s = self.ser(w)
        if m is not None:
            s = int(s * m[0])
        b += s
        busy[port] = b
        self.port_tx_bytes[port] += w
        self._sched((b + delay, port, self.port_epoch[port], ch, data, n, ecn))
        return True

    def _run_fast(
        self,
        until_ns: int,
        stop: Callable[[], bool] | None,
        check_every: int,
        progress: Callable[[Fabric], None] | None,
        progress_every_s: float,
    ) -> int:
        """The fast event loop (the default; MRC_SIM_FAST=0 runs `_run_ref`): the same events in the same
        order with the same effects. A packet event carries its route chain instead of its container (the
        switch takes the next port from it: no shift, no route lookup); a hop onto a port whose link is
        up at the fabric's rate and delay, with a backlog below `_safe` (no ECN mark, trim or drop
        possible), is forwarded inline, every other hop by `_hop_slow`; the datagrams a delivery makes
        are put on the NIC ports inline."""
        self._refresh_safe()  # (the thresholds, buffers or links may have been changed since)
        pop = heapq.heappop
        push = heapq.heappush
        sched = self._sched
        future = self.future
        bidx = self.bidx
        cur = self.cur
        cur_pop = cur.pop
        cb = self.cb
        endpoints = self.endpoints
        tables = self.tables
        routers = self.routers
        timer_at = self.timer_at
        port_node = self.port_node
        port_plane = self.port_plane
        port_epoch = self.port_epoch
        max_backlog = self.port_max_backlog
        mb1 = array("d", [q + 1.0 for q in max_backlog])  # max_backlog + 1 as floats (exact: small ints)
        self._mb1 = mb1
        if self._loop_c is not None:  # this loop in C, on the same objects
            t0 = time.perf_counter()
            c0 = time.process_time()
            events, other, t0 = self._loop_c.run(self, until_ns, stop, check_every, progress,
                                                 progress_every_s, t0)
            self.events += events
            self.hops += events - other
            self.wall_s += time.perf_counter() - t0
            self.cpu_s += time.process_time() - c0
            return int(events)
        tx = self.port_tx_bytes
        busy = self.busy
        safe = self._safe
        chains = self._chains
        chain = self._chain
        rate = self.rate_Bpns
        ovh = self.ovh
        delay = self.p.delay_ns
        ser_l = self._ser_l
        serf = self.ser
        hop_slow = self._hop_slow
        send_slow = self._send_slow
        send_fast = self._send_fast
        on_deliver = self.on_deliver
        # whether to compare epochs: read again after anything that may run code of others (endpoints,
        # routers, calls, hooks), which may take a link down
        moved = self._epochs_moved
        events = 0
        other = 0  # events that are not packet hops: timers and calls
        t0 = time.perf_counter()
        c0 = time.process_time()
        next_progress = t0 + progress_every_s
        while True:
            if not cur:
                if not bidx:
                    if until_ns < NEVER:
                        self.now = max(self.now, until_ns)
                    break
                cb = pop(bidx)
                self.cb = cb
                cur = future.pop(cb)
                cur.sort(key=_time)  # (see _run_ref)
                cur.reverse()
                cur_pop = cur.pop
                self.cur = cur
            ev = cur_pop()
            t, kind, a, ch, data, n, ecn = ev
            if t > until_ns:
                cur.append(ev)
                self.now = until_ns
                break
            events += 1
            if kind >= 0:
                if moved and a != port_epoch[kind]:  # the link failed while the packet was queued or on it
                    self.lost_on_link[self.port_link[kind]] += 1
                    self._drop("link_failed")
                    continue
                if ch is None:  # the end of the chain: a host
                    node = port_node[kind]
                    eng = endpoints[node]
                    if eng is None:
                        self._drop("no_endpoint")
                        continue
                    self.now = t
                    if on_deliver is not None:
                        on_deliver(node, port_plane[kind], data, t)
                    eng.receive(data, t, ecn, port_plane[kind])
                    out = eng.datagrams_to_send(t)
                    if out:
                        # _send_fast, inline
                        table = tables[node]
                        last_dst: Any = None
                        row: Any = None
                        for dg in out:
                            data = dg[0]
                            if table is not None:
                                dst = dg[3]
                                if dst is not last_dst:
                                    row = table[dst]
                                    last_dst = dst
                                port, cont = row[dg[2]]
                            else:
                                route = routers[node]
                                assert route is not None
                                port, cont = route(dg)
                            try:
                                ch = chains[port][cont]
                            except KeyError:
                                ch = chain(port, cont)
                            n = len(data)
                            if not safe[port]:
                                send_slow(port, ch, data, n, t)
                                continue
                            w = n + ovh
                            s = ser_l[w] if w < _SER_LIST else serf(w)
                            b = busy[port]
                            if b < t:
                                b = t
                            if n <= PRIO_BYTES:
                                busy[port] = b + s
                                ta = t + s + delay
                            else:
                                b += s
                                busy[port] = b
                                ta = b + delay
                            tx[port] += w
                            ev = (ta, port, port_epoch[port], ch, data, n, False)
                            bk = ta >> _SHIFT
                            if bk <= cb:
                                sched(ev)
                            else:
                                lst = future.get(bk)
                                if lst is None:
                                    future[bk] = [ev]
                                    push(bidx, bk)
                                else:
                                    lst.append(ev)
                    dl = eng.next_deadline()
                    if dl is not None and dl < timer_at[node]:
                        timer_at[node] = dl
                        sched((dl if dl > t else t, _EV_TIMER, node, 0, None, 0, False))
                    moved = self._epochs_moved
                    continue
                # a switch: the next port of the chain (End with NEXT-C-SID and the static route, done once)
                try:
                    port, ch = ch
                except ValueError:  # _NO_ROUTE
                    self._drop("no_route")
                    continue
                sx = safe[port]
                if not sx:  # the link is down or has its own rate or delay
                    if not hop_slow(port, ch, data, n, ecn, t):
                        continue
                else:
                    b = busy[port]
                    if b > t:
                        x = (b - t) * rate
                        if x >= mb1[port]:  # x >= max_backlog + 1 (floats: the fast compare)
                            max_backlog[port] = q = int(x)
                            mb1[port] = q + 1.0
                    else:
                        x = 0.0
                        b = t
                    w = n + ovh
                    if x >= sx or w >= _SER_LIST:  # a threshold may be reached: every test
                        if not hop_slow(port, ch, data, n, ecn, t):
                            continue
                    elif n <= PRIO_BYTES:  # control packets: the priority queue
                        s = ser_l[w]
                        busy[port] = b + s
                        tx[port] += w
                        ta = t + s + delay
                        ev = (ta, port, port_epoch[port], ch, data, n, ecn)
                        bk = ta >> _SHIFT
                        if bk <= cb:
                            sched(ev)
                        else:
                            lst = future.get(bk)
                            if lst is None:
                                future[bk] = [ev]
                                push(bidx, bk)
                            else:
                                lst.append(ev)
                        continue
                    else:
                        b += ser_l[w]
                        busy[port] = b
                        tx[port] += w
                        ta = b + delay
                        ev = (ta, port, port_epoch[port], ch, data, n, ecn)
                        bk = ta >> _SHIFT
                        if bk <= cb:
                            sched(ev)
                        else:
                            lst = future.get(bk)
                            if lst is None:
                                future[bk] = [ev]
                                push(bidx, bk)
                            else:
                                lst.append(ev)
            elif kind == _EV_TIMER:
                other += 1
                if timer_at[a] != t:
                    continue
                timer_at[a] = NEVER
                eng = endpoints[a]
                assert eng is not None
                self.now = t
                eng.handle_timer(t)
                out = eng.datagrams_to_send(t)
                if out:
                    send_fast(a, out, t)
                dl = eng.next_deadline()
                if dl is not None and dl < timer_at[a]:
                    timer_at[a] = dl
                    sched((dl if dl > t else t, _EV_TIMER, a, 0, None, 0, False))
                moved = self._epochs_moved
            else:
                other += 1
                self.now = t
                a(t)
                moved = self._epochs_moved
            if not events & 1023:
                if stop is not None and not events % check_every and stop():
                    break
                if progress is not None:
                    now_w = time.perf_counter()
                    if now_w >= next_progress:
                        self.events += events
                        self.hops += events - other
                        self.wall_s += now_w - t0
                        events = other = 0
                        t0 = now_w
                        next_progress = now_w + progress_every_s
                        progress(self)
                moved = self._epochs_moved
        self.events += events
        self.hops += events - other
        self.wall_s += time.perf_counter() - t0
        self.cpu_s += time.process_time() - c0
        return events

    def kick(self, h: int, now: int) -> None:
        """Let host h send what its endpoint has (after posting work) and arm its timer."""
        eng = self.endpoints[h]
        assert eng is not None
        out = eng.datagrams_to_send(now)
        if out:
            self.send_from_host(h, out, now)
        dl = eng.next_deadline()
        if dl is not None and dl < self.timer_at[h]:
            self.timer_at[h] = dl
            self._sched((max(dl, now), _EV_TIMER, h, 0, None, 0, False))

    # ------------------------------------------------------------------ introspection

    def hops_per_s(self) -> float:
        return self.hops / self.wall_s if self.wall_s > 0 else 0.0

    def port_of(self, a: str, b: str) -> int:
        """The egress port of node a toward node b."""
        return self.port_index[(a, b)]


def is_data(data: Any) -> bool:
    """An MRC data packet (WRITE opcodes) or a baseline data packet."""
    if isinstance(data, bytearray | bytes | memoryview):
        return len(data) > 0 and data[0] < 0x10
    return getattr(data, "kind", -1) == 0


def is_probe(data: Any) -> bool:
    """An MRC probe or probe reply (they test dead paths on purpose)."""
    return isinstance(data, bytearray | bytes | memoryview) and len(data) > 0 and data[0] in (0xC2, 0xC3)


def spine_of_ev(ev: int, planes: int, spines: int) -> int:
    """The spine an EV value selects in its plane (the controller's path table): EV v on plane v % P
    goes through spine (v // P) % S, so every plane's EVs cover its spines evenly."""
    return (ev // planes) % spines if spines else 0


__all__ = ["WIRE_OVERHEAD", "Endpoint", "Fabric", "FabricParams", "is_data", "is_probe", "spine_of_ev"]
