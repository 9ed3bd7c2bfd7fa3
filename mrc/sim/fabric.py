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
  to (plane port, container) from the path table the controller would install.
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from mrc.topology import ROLE_HOST, ROLE_LEAF, ROLE_SPINE, Topology
from mrc.transport.qp import NEVER
from mrc.wire.packet import trim_in_place

#: Bytes on the wire around the UDP payload the engine produces: outer IPv6 (40) + inner IPv6 (40) +
#: UDP (8) + Ethernet header and FCS (18) + preamble and inter-frame gap (20).
WIRE_OVERHEAD: Final = 40 + 40 + 8 + 18 + 20
_M96: Final = (1 << 96) - 1
_HOST_PORT_BUFFER: Final = 1 << 62
#: Packets with at most this many UDP payload bytes (control packets: SACK, NACK, probes, port status;
#: trimmed headers) use every port's priority queue: they leave after the packet in service, ahead of
#: the data backlog, as an ACK/trim class does in a real fabric.
PRIO_BYTES: Final = 255
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

    def __init__(self, topo: Topology, params: FabricParams | None = None) -> None:
        self.topo = topo
        self.p = p = params or FabricParams()
        self.rate_Bpns = p.rate_bps / 8e9
        self.ovh = p.wire_overhead
        self._ser: dict[int, int] = {}
        #: serialization time by wire size for every packet an MTU allows (a list index per hop)
        self._ser_l: list[int] = [p.ser_ns(w) for w in range(_SER_LIST)]
        # ---- nodes: hosts 0..H-1, then switches
        self.nhosts = len(topo.hosts)
        self.node_names: list[str] = [n for n, _ in topo.hosts]
        self.node_index: dict[str, int] = {n: i for i, n in enumerate(self.node_names)}
        for sw in topo.switches():
            self.node_index[sw.name] = len(self.node_names)
            self.node_names.append(sw.name)
        nn = len(self.node_names)
        self.fib: list[dict[int, int]] = [{} for _ in range(nn)]  # switch: next uSID -> egress port
        # ---- ports (egress side of each link direction) and links
        self.port_node: list[int] = []  # the node the port sends TO
        self.port_from: list[int] = []
        self.port_link: list[int] = []
        self.port_plane: list[int] = []
        self.port_buffer: list[int] = []
        self.busy: list[int] = []
        self.port_tx_bytes: list[int] = []
        self.port_max_backlog: list[int] = []
        self.port_up: list[bool] = []  # link_up / link_epoch of each port's link (one index less per hop)
        self.port_epoch: list[int] = []
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
        # ---- event loop
        # the event queue: (time, kind, a, container, data, size, ecn) tuples; events at the same time run in
        # push order (each bucket is kept in it: see run)
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
        return k

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
        for k in self.link_ports[li]:
            self.port_up[k] = up
            self.port_epoch[k] = self.link_epoch[li]
            if not up:
                self.busy[k] = now  # the queue is gone with the link

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
        send_from_host = self.send_from_host
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
                trim = x >= trim_1 and type(data) is bytearray and data[0] < 0x10
                if trim or n <= PRIO_BYTES:
                    if trim:
                        # trimmed: headers only, served from the priority queue ahead of the backlog
                        n = trim_in_place(data, n)
                        del data[n:]
                        w = n + ovh
                        self.trims += 1
                    # control packets and trimmed headers: the priority queue
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
