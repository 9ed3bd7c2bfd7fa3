"""Hosts on the fabric: MRC engines (the unmodified `mrc.transport.Context`) with the controller's path
table, and the single-path baseline with ECMP routing. `Traffic` builds either from a list of flows and
reads per-flow progress the same way for both."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from mrc.transport import Context, EvEntry, EvMode, EvProfile, NsccConfig, QpAttr, QueuePair, WcStatus

from .fabric import Fabric, spine_of_ev
from .payload import seeded_bytes
from .roce import DATA_HDR, RoceConn, RoceHost, RoceParams, new_host

VARIANTS: Final = ("ecmp", "mrc", "mrc-notrim", "mrc-1plane")


@dataclass
class Flow:
    src: int
    dst: int
    size: int | None  # bytes; None: as much as the run allows (long-lived)
    start_ns: int = 0


@dataclass
class HostParams:
    evs: int = 128  # EVs per QP profile
    cc: str = "nscc"
    attr: QpAttr = field(default_factory=QpAttr)
    chunk: int = 1 << 20  # WRITE size for long-lived flows (posted back to back)
    seed: int = 1
    reconverge_ns: int = 1_000_000  # ECMP routing convergence after a link change (baseline only)


def base_rtt_ns(fabric: Fabric, mtu: int, spine_hops: bool = True) -> int:
    """Unloaded RTT of a cross-leaf path: 4 links out with a full data packet, 4 back with a SACK."""
    links = 4 if spine_hops else 2
    d = fabric.p.delay_ns
    data = fabric.ser(mtu + 56 + fabric.ovh)
    ack = fabric.ser(64 + 8 + fabric.ovh)
    return links * (2 * d + data + ack)


def mrc_profile(variant: str, evs: int, planes: int, profile_id: int = 1) -> EvProfile:
    """`mrc`/`mrc-notrim`: `evs` EVs split evenly over the planes (EV v on plane v % P); `mrc-1plane`:
    `evs / P` EVs, all on plane 0 (EV values P·i, so they still cover every spine of plane 0)."""
    if variant == "mrc-1plane":
        n = max(1, evs // planes)
        return EvProfile(profile_id, [EvEntry(planes * i, 0) for i in range(n)], mode=EvMode.EXP)
    return EvProfile.even(profile_id, evs, planes)


class Traffic:
    """Flows of one variant on one fabric: endpoints attached, work posted, progress readable."""

    def __init__(
        self, fabric: Fabric, variant: str, flows: list[Flow], hp: HostParams, until_ns: int
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
        self.fabric = fabric
        self.variant = variant
        self.flows = flows
        self.hp = hp
        self.until_ns = until_ns
        self.topo = topo = fabric.topo
        self.mtu = hp.attr.mtu
        self.done_ns: list[int] = [-1] * len(flows)
        self.status: list[str] = [""] * len(flows)
        self._starters: list[Any] = []  # per flow: start(t); a flow with start_ns < 0 waits for start_flow
        if variant == "ecmp":
            self._build_ecmp()
        else:
            self._build_mrc()
        self.planes = topo.planes

    # ------------------------------------------------------------------ MRC

    def _build_mrc(self) -> None:
        fab, topo, hp = self.fabric, self.topo, self.hp
        P, S = topo.planes, topo.spines
        gids = [topo.mrc_address(n).packed for n, _ in topo.hosts]
        self.gid_host = {g: i for i, g in enumerate(gids)}
        rtt = base_rtt_ns(fab, self.mtu)
        nic_bps = fab.p.rate_bps * (1 if self.variant == "mrc-1plane" else P)
        nscc = NsccConfig.for_path(rtt, int(nic_bps * rtt / 8e9), self.mtu)
        ctxs: dict[int, Context] = {}
        tables: dict[int, dict[bytes, list[tuple[int, int]]]] = {}
        used = {f.src for f in self.flows} | {f.dst for f in self.flows}
        for h in sorted(used):
            ctx = Context(gids[h], ports=P, seed=hp.seed * 1000 + h, name=topo.hosts[h][0])
            ctxs[h] = ctx
            tables[h] = {}
            fab.attach(h, ctx, tables[h])
        self.ctxs = ctxs
        self.qps: list[tuple[QueuePair, QueuePair]] = []
        self.bufs: list[Any] = []
        src_bufs: dict[int, Any] = {}
        dst_bufs: dict[int, Any] = {}
        for f in self.flows:
            a, b = ctxs[f.src], ctxs[f.dst]
            qs = []
            for ctx in (a, b):
                prof = ctx.create_ev_profile(mrc_profile(self.variant, hp.evs, P, ctx.next_ev_profile_id()))
                ccp = ctx.create_cc_profile(nscc if hp.cc == "nscc" else None)
                cq = ctx.create_cq()
                attr = QpAttr(**{k: getattr(hp.attr, k) for k in QpAttr.__dataclass_fields__})
                qs.append(ctx.create_qp(cq, ev_profile=prof, cc_profile=ccp, attr=attr))
            qa, qb = qs
            qa.connect(gids[f.dst], qb.qpn)
            qb.connect(gids[f.src], qa.qpn)
            for s, d, prof in ((f.src, f.dst, qa.paths.profile), (f.dst, f.src, qb.paths.profile)):
                if gids[d] not in tables[s]:
                    tables[s][gids[d]] = [
                        fab.path_container(s, d, e.port, spine_of_ev(e.ev, P, S)) for e in prof.entries
                    ]
            self.qps.append((qa, qb))
            # Finite flows: a seeded buffer per source host and a landing region per flow (checkable
            # bit for bit). Long-lived flows (throughput runs) all send the same seeded chunk over and
            # over and land in one region that every destination host registers (what lands there is
            # never read): the engines copy every byte all the same, but the simulator's memory stays
            # small enough for the caches (one region per destination at 256 hosts was 256 MiB of
            # landing writes, each a cache miss).
            size = f.size if f.size is not None else hp.chunk
            key = f.src if f.size is not None else -1
            sb = src_bufs.get(key)
            if sb is None or len(sb) < size:
                sb = src_bufs[key] = seeded_bytes(size, hp.seed + max(key, 0))
            db: Any = np.zeros(size, dtype=np.uint8) if f.size is not None else dst_bufs.get(-1)
            if db is None:
                db = dst_bufs[-1] = np.zeros(size, dtype=np.uint8)
            smr, dmr = a.reg_mr(sb), b.reg_mr(db)
            self.bufs.append((sb, db))
            if f.size is not None:
                posts = [f.size]
            else:
                # long-lived: enough back-to-back WRITEs to keep the NIC busy until the end of the run
                nic = fab.p.rate_bps * P / 8e9
                posts = [hp.chunk] * (int(nic * max(0, self.until_ns - f.start_ns) / hp.chunk) + 2)

            def start(t: int, qa: QueuePair = qa, posts: list[int] = posts, smr: Any = smr, dmr: Any = dmr,
                      h: int = f.src) -> None:
                for i, n in enumerate(posts):
                    qa.post_send(i + 1, smr, 0, n, dmr.addr, dmr.rkey)
                fab.kick(h, t)

            self._starters.append(start)
            if f.start_ns >= 0:
                fab.at(f.start_ns, start)

    # ------------------------------------------------------------------ baseline

    def _build_ecmp(self) -> None:
        fab, topo, hp = self.fabric, self.topo, self.hp
        P = topo.planes
        rtt = base_rtt_ns(fab, self.mtu)
        rp = RoceParams(mtu=self.mtu, timeout=hp.attr.timeout, linear_cnt=hp.attr.linear_cnt,
                        max_cwnd=max(2 * self.mtu, int(fab.p.rate_bps * rtt / 8e9) * 3 // 2))
        self.routing = EcmpRouting(fab, hp.seed, hp.reconverge_ns)
        hosts: dict[int, RoceHost] = {}
        used = {f.src for f in self.flows} | {f.dst for f in self.flows}
        for h in sorted(used):
            hosts[h] = new_host(h, rp, fab._loop_c)  # in C with the fabric's C loop
            fab.attach(h, hosts[h], self.routing.router(h))
        self.roce = hosts
        self.conns: list[list[RoceConn]] = []
        cid = 0
        for f in self.flows:
            conns = []
            per_plane = None if f.size is None else -(-f.size // P)
            for p in range(P):
                cid += 1
                sport = 0xC000 | (cid & 0x3FFF)
                size = per_plane
                if f.size is not None and per_plane is not None:
                    size = max(0, min(per_plane, f.size - p * per_plane))
                    if size == 0:
                        continue
                conns.append(hosts[f.src].connect(cid, f.dst, p, sport, size))
                hosts[f.dst].accept(cid, f.src, p, sport)
            self.conns.append(conns)

            for c in conns:
                c.active = False  # the host may be kicked before (as a responder): hold until start

            def start(t: int, h: int = f.src, conns: list[RoceConn] = conns) -> None:
                for c in conns:
                    c.active = True
                fab.kick(h, t)

            self._starters.append(start)
            if f.start_ns >= 0:
                fab.at(f.start_ns, start)

    def start_flow(self, i: int, now: int) -> None:
        """Start flow i now (a flow built with start_ns < 0 is deferred until then: dependent transfers,
        as the steps of a ring all-reduce)."""
        self._starters[i](now)

    # ------------------------------------------------------------------ progress

    def delivered(self) -> list[int]:
        """Unique payload bytes placed at each flow's destination so far."""
        if self.variant == "ecmp":
            out = []
            for f, conns in zip(self.flows, self.conns, strict=True):
                out.append(sum(self.roce[f.dst].delivered(c.cid) for c in conns))
            return out
        return [qb.rx_bytes for _, qb in self.qps]

    def conn_delivered(self) -> list[int]:
        """Per connection (baseline: one per plane per flow; MRC: one QP per flow)."""
        if self.variant == "ecmp":
            return [self.roce[f.dst].delivered(c.cid) for f, cs in zip(self.flows, self.conns, strict=True)
                    for c in cs]
        return self.delivered()

    def poll(self, now: int) -> None:
        """Record completions (finite flows)."""
        for i, f in enumerate(self.flows):
            if f.size is None or self.done_ns[i] >= 0:
                continue
            if self.variant == "ecmp":
                cs = self.conns[i]
                if all(c.done_at >= 0 for c in cs):
                    self.done_ns[i] = max(c.done_at for c in cs)
                    self.status[i] = "SUCCESS"
            else:
                qa, _ = self.qps[i]
                wcs = qa.send_cq.poll()
                if wcs:
                    self.done_ns[i] = now
                    self.status[i] = wcs[0].status.name
                elif qa.state.name == "ERROR":
                    self.done_ns[i] = now
                    self.status[i] = WcStatus.RETRY_EXC_ERR.name

    def all_done(self) -> bool:
        return all(d >= 0 for d in self.done_ns)

    def counters(self) -> dict[str, int]:
        """Retransmissions (packets and bytes), timeouts, trims seen, EVs retired."""
        if self.variant == "ecmp":
            cs = [c for conns in self.conns for c in conns]
            retx = sum(c.retx_packets for c in cs)
            return {"retx_packets": retx, "retx_bytes": sum(c.retx_bytes for c in cs),
                    "rto_count": sum(c.timeouts for c in cs), "naks": sum(c.naks for c in cs)}
        tot: dict[str, int] = {}
        for qa, _ in self.qps:
            st = qa.c
            for k in ("retx_sack", "retx_trim", "retx_timeout", "retx_nack", "retx_spurious", "rto",
                      "nack_trim_rx", "ecn_echo_rx"):
                tot[k] = tot.get(k, 0) + st[k]
            tot["evs_marked_bad"] = tot.get("evs_marked_bad", 0) + qa.paths.marked_bad
        retx = sum(tot[k] for k in ("retx_sack", "retx_trim", "retx_timeout", "retx_nack"))
        return {"retx_packets": retx, "retx_bytes": sum(qa.retx_bytes for qa, _ in self.qps),
                "rto_count": tot["rto"], **tot}


class EcmpRouting:
    """Per-flow ECMP of the baseline: the source leaf hashes the 5-tuple (keyed by the seed) over its
    ECMP group toward the destination leaf, the spines whose uplink and downlink are up *in the routing
    view*. The view follows link changes `reconverge_ns` late (routing protocol convergence); until then
    the group still holds the dead link and the flows hashed onto it are lost there."""

    def __init__(self, fabric: Fabric, seed: int, reconverge_ns: int) -> None:
        self.fabric = fabric
        self.key = struct.pack("<Q", seed & 0xFFFFFFFFFFFFFFFF)
        self.reconverge_ns = reconverge_ns
        self.view_up = list(fabric.link_up)
        self.groups: dict[tuple[int, int, int], list[int]] = {}
        self._invalidators: list[Any] = []
        self._orig_set = fabric.set_link
        fabric.set_link = self._set_link  # type: ignore[method-assign]

    def _set_link(self, li: int, up: bool, now: int) -> None:
        self._orig_set(li, up, now)

        def converge(t: int) -> None:
            self.view_up[li] = up
            self.groups.clear()
            for inv in self._invalidators:
                inv()

        self.fabric.at(now + self.reconverge_ns, converge)

    def group(self, plane: int, ls: int, ld: int) -> list[int]:
        g = self.groups.get((plane, ls, ld))
        if g is None:
            topo, fab = self.fabric.topo, self.fabric
            g = []
            for s in range(topo.spines):
                sp = topo.spine_name(plane, s)
                if (self.view_up[fab.link(topo.leaf_name(plane, ls), sp)]
                        and self.view_up[fab.link(topo.leaf_name(plane, ld), sp)]):
                    g.append(s)
            self.groups[(plane, ls, ld)] = g
        return g

    def hash(self, src: int, dst: int, sport: int, plane: int) -> int:
        # a keyed cryptographic hash: random-looking for every key (CRC32, linear in its input, maps
        # neighbouring 5-tuples onto neighbouring buckets and collides far less than random hashing)
        h = hashlib.blake2b(struct.pack("<HHHHH", src, dst, sport, 4791, plane), digest_size=8, key=self.key)
        return int.from_bytes(h.digest(), "little")

    def spine(self, src: int, dst: int, sport: int, plane: int) -> int | None:
        topo = self.fabric.topo
        ls, ld = topo.hosts[src][1], topo.hosts[dst][1]
        if ls == ld:
            return None
        g = self.group(plane, ls, ld)
        if not g:
            return 0  # nothing left: the packet follows the dead route and is dropped
        return g[self.hash(src, dst, sport, plane) % len(g)]

    def router(self, h: int) -> Any:
        fab = self.fabric
        cache: dict[tuple[Any, ...], tuple[int, int]] = {}
        spine = self.spine

        def route(dg: Any) -> tuple[int, int]:
            k = dg[1:]  # (plane, sport, dst)
            pc = cache.get(k)
            if pc is None:
                _, plane, sport, dst = dg
                pc = cache[k] = fab.path_container(h, dst, plane, spine(h, dst, sport, plane))
            return pc

        def invalidate() -> None:
            cache.clear()

        self._invalidators.append(invalidate)
        return route


__all__ = [
    "DATA_HDR", "VARIANTS", "EcmpRouting", "Flow", "HostParams", "Traffic", "base_rtt_ns", "mrc_profile",
]
