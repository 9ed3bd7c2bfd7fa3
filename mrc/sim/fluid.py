"""A flow-level (fluid) model of the simulator's fabrics, for the papers' scale (docs/sim.md, "Fluid model").

The packet simulator (`mrc.sim.fabric`) runs the real engine on every packet: ~7 µs of CPU per packet-hop,
hours per simulated millisecond at 8k hosts. The questions of the MRC papers (capacity under ECMP
collisions, random link failures, the tail of synchronous steps at 100k hosts) only need the *rates*
flows settle at, so this model replaces packets by rates:

* **Fabric** (`FluidFabric`): the same multi-plane two-tier Clos as `mrc.topology.generate` — planes ×
  (leaves, spines), ``hosts_per_leaf`` hosts per leaf, host i on leaf i // H, one NIC port per plane —
  described by its four numbers only (no names, no micro-SIDs: `mrc.topology` caps fabrics at 2,048 hosts
  and 256 leaves because of its 16-bit node IDs; the fluid model needs only the graph). Every link is two
  directed links with a capacity in units of one port's rate (`LinkState`): 1, less when degraded, 0 when
  failed; a failed leaf-spine link fails both directions, as `Fabric.set_link` does.
* **Rates** are the max-min fair allocation (`maxmin`): raise every flow's rate together, freeze the
  flows of a link when it fills (progressive filling). A flow may spread over several paths with fixed
  fractions (weighted incidence: flow f puts ``w[f, l] · r_f`` on link l). The incidence is a sparse
  flows × links CSR matrix; each round costs the links still live plus the rows frozen in it, so a run is
  near-linear in links × levels and nnz (derive.py's set-based water-filling grew ~n^1.9).
* **ECMP** (`ecmp_connections`): one connection per (flow, plane), as `Traffic._build_ecmp` makes them,
  hashed at the source leaf onto one spine of the group of spines whose uplink and downlink are up in the
  routing view, exactly `EcmpRouting.spine` (same keyed blake2b of the same 5-tuple, same source ports) up
  to 65,535 hosts; a vectorised 64-bit mixer (`hash_mode="mix"`) at scale, where the packet sim's 16-bit
  host fields cannot go. Before reconvergence a connection hashed onto a failed link carries nothing;
  after it, it is rehashed over the survivors. A flow's rate is the sum of its connections'.
* **MRC** (`mrc_flows`): one QP per flow, its EVs split evenly over the planes (EV v on plane v % P) and
  within a plane over spines (EV v on spine ``(v // P + offset) % S``: the packet sim's path table has
  offset 0; with fewer EVs per plane than spines a fixed table would put every QP on the same spines, so
  at scale the offset is a per-flow hash, ``spine_offset="hash"``). Each GOOD EV carries an equal share
  of the flow (the spraying cycle); EVs whose path crosses a failed link are DENIED (the controller's
  deny) and carry nothing, the flow's rate spread over the rest. Steering (``steer_rounds``): the
  engine penalises EVs that see ECN or trims (a queue above threshold, i.e. a saturated link in the
  fluid view) and relieves them on clean acknowledgements; the model repeats the max-min solve with the
  weights of EVs through saturated fabric links scaled down and the others restored, until it settles.
  With no degraded link nothing saturates inside the fabric and steering changes nothing.

What it cannot represent, and says so in its results rather than guessing: queues, ECN and trimming
(incast is a queueing question), reroute time (an ECMP reconvergence time is an *input*; MRC's ~5 RTTs
of retirement are not modelled and the deny is instant), retransmissions, congestion-control dynamics
(DCTCP and NSCC are close to, not exactly, max-min fair: docs/sim.md measures 1-2 points), ACK paths.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
BoolA = NDArray[np.bool_]

#: Per-plane node-ID space of the scale uSID plan (`address_plan`): 12 bits below the plane nibble, the
#: top bit telling spines from leaves, so up to 2,048 leaves and 2,048 spines per plane.
MAX_SCALE_INDEX: Final = 0x800
MAX_SCALE_HOSTS_PER_LEAF: Final = 0x800
_RTOL: Final = 1e-9  # links whose fill levels agree this closely saturate in one round
_M64: Final = (1 << 64) - 1


# ============================================================================================ fabric


@dataclass(frozen=True)
class FluidFabric:
    """The shape of a multi-plane two-tier Clos (the graph of `mrc.topology.generate`). Directed link ids:
    host uplinks (host h, plane p → its leaf) ``p·N + h``; host downlinks ``P·N + p·N + h``; leaf uplinks
    (leaf a → spine s, plane p) ``2PN + (p·L + a)·S + s``; spine downlinks (spine s → leaf b)
    ``2PN + PLS + (p·L + b)·S + s``."""

    planes: int
    leaves: int
    spines: int
    hosts_per_leaf: int
    rate_bps: float = 100e9

    def __post_init__(self) -> None:
        for name, v, hi in (
            ("planes", self.planes, 16),
            ("leaves", self.leaves, MAX_SCALE_INDEX),
            ("spines", self.spines, MAX_SCALE_INDEX),
            ("hosts_per_leaf", self.hosts_per_leaf, MAX_SCALE_HOSTS_PER_LEAF),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise ValueError(f"{name} must be an integer 1..{hi}, got {v!r}")
        if self.hosts < 2:
            raise ValueError("a fabric needs at least two hosts")
        if not self.rate_bps > 0:
            raise ValueError(f"rate_bps must be positive, got {self.rate_bps!r}")

    @property
    def hosts(self) -> int:
        return self.leaves * self.hosts_per_leaf

    @property
    def links(self) -> int:
        P, N, L, S = self.planes, self.hosts, self.leaves, self.spines
        return 2 * P * N + 2 * P * L * S

    def leaf_of(self, h: Any) -> Any:
        return h // self.hosts_per_leaf

    def host_up(self, p: Any, h: Any) -> Any:
        return p * self.hosts + h

    def host_down(self, p: Any, h: Any) -> Any:
        return self.planes * self.hosts + p * self.hosts + h

    def leaf_up(self, p: Any, a: Any, s: Any) -> Any:
        return 2 * self.planes * self.hosts + (p * self.leaves + a) * self.spines + s

    def spine_down(self, p: Any, s: Any, b: Any) -> Any:
        P, L, S = self.planes, self.leaves, self.spines
        return 2 * P * self.hosts + P * L * S + (p * L + b) * S + s

    def link_name(self, li: int) -> str:
        """Human name of a directed link (``p0l3->p0s1``, ``h5->p2l0``), as mrc.topology names nodes."""
        P, N, L, S = self.planes, self.hosts, self.leaves, self.spines
        if li < P * N:
            p, h = divmod(li, N)
            return f"h{h}->p{p}l{h // self.hosts_per_leaf}"
        if li < 2 * P * N:
            p, h = divmod(li - P * N, N)
            return f"p{p}l{h // self.hosts_per_leaf}->h{h}"
        k = li - 2 * P * N
        up = k < P * L * S
        pa, s = divmod(k if up else k - P * L * S, S)
        p, a = divmod(pa, L)
        return f"p{p}l{a}->p{p}s{s}" if up else f"p{p}s{s}->p{p}l{a}"

    @classmethod
    def from_topology(cls, topo: Any) -> FluidFabric:
        """The fluid shape of a `mrc.topology.Topology` whose leaves hold the same number of hosts,
        listed leaf by leaf (what the packet experiments need too: `FabricSpec.from_file`)."""
        n = len(topo.hosts)
        if n % topo.leaves:
            raise ValueError(
                f"{n} hosts on {topo.leaves} leaves: the fluid model needs the same number "
                "of hosts on every leaf"
            )
        h = n // topo.leaves
        if any(leaf != i // h for i, (_, leaf) in enumerate(topo.hosts)):
            raise ValueError(f"the fluid model needs the hosts listed leaf by leaf, {h} per leaf")
        return cls(topo.planes, topo.leaves, topo.spines, h, float(topo.link.rate_bps))


class LinkState:
    """Per directed link: capacity in port units (1 healthy, the factor when degraded, 0 failed) and
    whether it is up."""

    def __init__(self, fabric: FluidFabric) -> None:
        self.fabric = fabric
        self.cap: F64 = np.ones(fabric.links)
        self.up: BoolA = np.ones(fabric.links, dtype=bool)

    def copy(self) -> LinkState:
        out = LinkState.__new__(LinkState)
        out.fabric, out.cap, out.up = self.fabric, self.cap.copy(), self.up.copy()
        return out

    def _pair(self, p: Any, a: Any, s: Any) -> tuple[Any, Any]:
        f = self.fabric
        return f.leaf_up(p, a, s), f.spine_down(p, s, a)

    def fail_leaf_spine(self, p: Any, a: Any, s: Any) -> None:
        """Leaf a – spine s of plane p down, both directions (arrays allowed)."""
        for li in self._pair(p, a, s):
            self.up[li] = False
            self.cap[li] = 0.0

    def degrade_leaf_spine(self, p: int, a: int, s: int, factor: float) -> None:
        """Both directions serialize at `factor` of the port rate, routing unchanged (`set_link_rate`)."""
        if not 0 < factor <= 1:
            raise ValueError(f"factor must be in (0, 1], got {factor}")
        for li in self._pair(p, a, s):
            self.cap[li] = factor

    def fail_spine(self, p: int, s: int) -> None:
        """Spine s of plane p down: all its leaf links."""
        self.fail_leaf_spine(p, np.arange(self.fabric.leaves), s)

    def fail_plane(self, p: int) -> None:
        """Plane p down: every link in it, the hosts' ports of that plane too."""
        f = self.fabric
        h = np.arange(f.hosts)
        for li in (f.host_up(p, h), f.host_down(p, h)):
            self.up[li] = False
            self.cap[li] = 0.0
        a, s = np.meshgrid(np.arange(f.leaves), np.arange(f.spines), indexing="ij")
        self.fail_leaf_spine(p, a.ravel(), s.ravel())

    def fail_random(self, fraction: float, rng: np.random.Generator) -> int:
        """Fail round(fraction × leaf-spine links) distinct leaf-spine links, uniformly; the count."""
        f = self.fabric
        total = f.planes * f.leaves * f.spines
        k = round(fraction * total)
        if k:
            pick = rng.choice(total, size=k, replace=False)
            pa, s = np.divmod(pick, f.spines)
            p, a = np.divmod(pa, f.leaves)
            self.fail_leaf_spine(p, a, s)
        return k

    def pair_up(self) -> BoolA:
        """[plane, leaf, spine]: the leaf-spine link is up (both directions fail together)."""
        f = self.fabric
        n = f.planes * f.leaves * f.spines
        base = 2 * f.planes * f.hosts
        return (self.up[base : base + n] & self.up[base + n : base + 2 * n]).reshape(
            f.planes, f.leaves, f.spines
        )


# ============================================================================================ max-min


@dataclass
class Incidence:
    """Entities (connections or QPs) × links, CSR: entity e puts ``weight · rate_e`` on each of its links.
    ``group`` maps entities to the flows they belong to (a flow's rate is the sum of its entities')."""

    indptr: I64
    indices: I64
    weights: F64
    group: I64
    flows: int

    @property
    def entities(self) -> int:
        return len(self.indptr) - 1


def maxmin(inc: Incidence, cap: F64, rtol: float = _RTOL) -> F64:
    """Max-min fair rate of every entity by progressive filling. Each round: the fill level at which each
    live link fills, ``t_l = (cap_l − frozen load_l) / (active weight_l)``; the lowest, t*; every active
    entity on a link that fills within `rtol` of t* is frozen at t*, and its rows leave the live sums.
    An entity with no links gets rate 0 (it has no path: a dead connection). Links of capacity 0 that an
    entity crosses freeze it at 0 in the first round."""
    E = inc.entities
    L = len(cap)
    rate = np.zeros(E)
    if E == 0:
        return rate
    nnz_row = np.diff(inc.indptr)
    rows = np.repeat(np.arange(E, dtype=np.int64), nnz_row)
    # CSC: the entities of each link, for finding who a filled link freezes
    order = np.argsort(inc.indices, kind="stable")
    csc_rows = rows[order]
    csc_ptr = np.zeros(L + 1, dtype=np.int64)
    np.cumsum(np.bincount(inc.indices, minlength=L), out=csc_ptr[1:])
    aw = np.bincount(inc.indices, inc.weights, minlength=L)  # active weight per link
    load = np.zeros(L)  # frozen load per link
    active = nnz_row > 0
    live = np.flatnonzero(aw > 0)
    tiny = 1e-12
    # Fill levels only rise as entities freeze (a link's level (cap − load)/aw moves from t to
    # (cap − load − w·t*)/(aw − w) ≥ t), so only the links below a band can fill next: scan the band's
    # candidates each round and rescan every live link only when the band is used up.
    band = 1 << 16
    cand = live[:0]
    top = -1.0
    while True:
        if cand.size:
            cand = cand[aw[cand] > tiny]
        tc = np.maximum(cap[cand] - load[cand], 0.0) / aw[cand] if cand.size else cand.astype(float)
        if not cand.size or float(tc.min()) > top:
            live = live[aw[live] > tiny]
            if not live.size:
                break
            t_all = np.maximum(cap[live] - load[live], 0.0) / aw[live]
            if live.size > band:
                top = float(np.partition(t_all, band)[band])
                sel = t_all <= top
                cand, tc = live[sel], t_all[sel]
            else:
                top, cand, tc = float("inf"), live, t_all
        tstar = float(tc.min())
        filled = cand[tc <= tstar * (1 + rtol) + tiny]
        # entities on the filled links (gather the CSC slices)
        starts, ends = csc_ptr[filled], csc_ptr[filled + 1]
        cnt = ends - starts
        idx = np.repeat(starts - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))
        ents = np.unique(csc_rows[idx])
        ents = ents[active[ents]]
        aw[filled] = 0.0  # a filled link admits no more (its remaining entities are frozen now)
        if not ents.size:  # numerically empty links
            continue
        active[ents] = False
        rate[ents] = tstar
        # remove their rows from the live sums
        s, e = inc.indptr[ents], inc.indptr[ents + 1]
        c = e - s
        ridx = np.repeat(s - np.cumsum(c) + c, c) + np.arange(int(c.sum()))
        li = inc.indices[ridx]
        w = inc.weights[ridx]
        if li.size * 8 < L:
            np.add.at(aw, li, -w)
            np.add.at(load, li, w * tstar)
        else:
            aw -= np.bincount(li, w, minlength=L)
            load += np.bincount(li, w * tstar, minlength=L)
        aw[filled] = 0.0
    return rate


def link_load(inc: Incidence, rate: F64, links: int) -> F64:
    """Load per link (port units) of entities at `rate`."""
    rows = np.repeat(rate, np.diff(inc.indptr))
    out: F64 = np.bincount(inc.indices, inc.weights * rows, minlength=links).astype(np.float64)
    return out


def flow_rates(inc: Incidence, rate: F64) -> F64:
    """Per flow: the sum of its entities' rates."""
    out: F64 = np.bincount(inc.group, rate, minlength=inc.flows).astype(np.float64)
    return out


def from_lists(
    paths: list[list[int]], weights: list[list[float]] | None = None, group: list[int] | None = None
) -> Incidence:
    """An incidence from per-entity link lists (small fabrics, tests)."""
    indptr = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in paths], out=indptr[1:])
    idx = np.array([x for p in paths for x in p], dtype=np.int64)
    w = (
        np.ones(len(idx))
        if weights is None
        else np.array([x for ws in weights for x in ws], dtype=np.float64)
    )
    g = np.arange(len(paths), dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
    return Incidence(indptr, idx, w, g, int(g.max()) + 1 if len(g) else 0)


# ============================================================================================ hashing


def _splitmix(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def mix_hash(seed: int, *keys: Any) -> NDArray[np.uint64]:
    """A keyed 64-bit hash of integer arrays (splitmix64 chained): random-looking, vectorised."""
    h = _splitmix(np.full(np.broadcast(*keys).shape, seed & _M64, dtype=np.uint64))
    for k in keys:
        with np.errstate(over="ignore"):
            h = _splitmix(h ^ np.asarray(k).astype(np.uint64))
    return h


def sim_hash(seed: int, src: I64, dst: I64, sport: I64, plane: I64) -> NDArray[np.uint64]:
    """`EcmpRouting.hash`, bit for bit: blake2b keyed by the seed over (src, dst, sport, 4791, plane)."""
    key = struct.pack("<Q", seed & _M64)
    out = np.empty(len(src), dtype=np.uint64)
    for i, (s, d, sp, p) in enumerate(
        zip(src.tolist(), dst.tolist(), sport.tolist(), plane.tolist(), strict=True)
    ):
        h = hashlib.blake2b(struct.pack("<HHHHH", s, d, sp, 4791, p), digest_size=8, key=key)
        out[i] = int.from_bytes(h.digest(), "little")
    return out


def _kth_true(mask: BoolA, k: I64) -> I64:
    """Per row of `mask`, the column of its k-th True (0-based); -1 where the row has none."""
    cs = np.cumsum(mask, axis=1)
    out: I64 = np.argmax(cs > k[:, None], axis=1).astype(np.int64)
    out[cs[:, -1] == 0] = -1
    return out


# ============================================================================================ ECMP


def _ecmp_spines(
    fabric: FluidFabric, view: LinkState, p: I64, ls: I64, ld: I64, h: NDArray[np.uint64]
) -> tuple[I64, BoolA]:
    """`EcmpRouting.spine` vectorised: per connection the spine ``g[h % len(g)]`` of the group g of
    spines whose leaf links to both leaves are up in `view`, and whether the group was empty."""
    S = fabric.spines
    spine = np.zeros(len(p), dtype=np.int64)
    pu = view.pair_up()
    full: BoolA = np.asarray(pu.all(axis=2))  # [plane, leaf]: every spine reachable
    cross = ls != ld
    easy = cross & full[p, ls] & full[p, ld]
    spine[easy] = (h[easy] % np.uint64(S)).astype(np.int64)
    hard = np.flatnonzero(cross & ~easy)
    dead = np.zeros(len(p), dtype=bool)
    for c0 in range(0, len(hard), 1 << 15):
        sel = hard[c0 : c0 + (1 << 15)]
        g = pu[p[sel], ls[sel], :] & pu[p[sel], ld[sel], :]
        n = g.sum(axis=1)
        k = np.where(n > 0, h[sel] % np.maximum(n, 1).astype(np.uint64), 0).astype(np.int64)
        sp = _kth_true(g, k)
        dead[sel[sp < 0]] = True  # empty group: the packet sim sends to spine 0 and the link drops it
        spine[sel] = np.maximum(sp, 0)
    return spine, dead


def ecmp_connections(
    fabric: FluidFabric,
    state: LinkState,
    src: I64,
    dst: I64,
    seed: int,
    view: LinkState | None = None,
    hash_mode: str = "auto",
    acks: bool = True,
) -> Incidence:
    """The baseline's connections: flow i gets one per plane (cid ``i·P + p + 1``, UDP source port
    ``0xC000 | (cid & 0x3FFF)``, as `Traffic._build_ecmp`), hashed over the ECMP group of the routing
    `view` (default: the actual state, i.e. after reconvergence). A connection whose path crosses a
    link that is down in `state` (hashed there before reconvergence, or no route at all) has no links
    and rate 0; with `acks`, before reconvergence (a `view` other than `state`), also one whose ACK path
    does (the reverse 5-tuple hashed at the destination's leaf, as the responder's ACKs are)."""
    f = fabric
    P = f.planes
    view = view or state
    F = len(src)
    fi = np.repeat(np.arange(F, dtype=np.int64), P)
    p = np.tile(np.arange(P, dtype=np.int64), F)
    s_h, d_h = src[fi], dst[fi]
    ls, ld = f.leaf_of(s_h), f.leaf_of(d_h)
    if hash_mode == "auto":
        hash_mode = "sim" if f.hosts <= 4096 else "mix"
    if hash_mode == "sim":
        cid = fi * P + p + 1
        h = sim_hash(seed, s_h, d_h, 0xC000 | (cid & 0x3FFF), p)
    elif hash_mode == "mix":
        h = mix_hash(seed, s_h, d_h, p)
    else:
        raise ValueError(f"hash_mode must be auto, sim or mix, got {hash_mode!r}")
    cross = ls != ld
    spine, dead = _ecmp_spines(f, view, p, ls, ld, h)
    up_l = f.leaf_up(p, ls, spine)
    dn_l = f.spine_down(p, spine, ld)
    hu, hd = f.host_up(p, s_h), f.host_down(p, d_h)
    ok = state.up[hu] & state.up[hd] & ~dead
    ok[cross] &= state.up[up_l[cross]] & state.up[dn_l[cross]]
    if acks and view is not state:
        # the ACKs of a connection are hashed at the destination's leaf (reverse 5-tuple): a connection
        # whose ACK path crosses a dead link stalls as well until reconvergence (go-back-N, no ACKs)
        if hash_mode == "sim":
            hr = sim_hash(seed, d_h, s_h, 0xC000 | ((fi * P + p + 1) & 0x3FFF), p)
        else:
            hr = mix_hash(seed, d_h, s_h, p)
        rsp, rdead = _ecmp_spines(f, view, p, ld, ls, hr)
        rok = ~rdead
        rok[cross] &= state.up[f.leaf_up(p, ld, rsp)[cross]] & state.up[f.spine_down(p, rsp, ls)[cross]]
        ok &= rok
    n_links = np.where(ok, np.where(cross, 4, 2), 0)
    indptr = np.zeros(len(fi) + 1, dtype=np.int64)
    np.cumsum(n_links, out=indptr[1:])
    cols = np.stack([hu, up_l, dn_l, hd], axis=1)
    use = np.zeros((len(fi), 4), dtype=bool)
    use[:, 0] = use[:, 3] = ok
    use[:, 1] = use[:, 2] = ok & cross
    idx = cols[use].astype(np.int64)
    return Incidence(indptr, idx, np.ones(len(idx)), fi, F)


# ============================================================================================ MRC


@dataclass
class MrcPaths:
    """Per flow, its EV paths aggregated by (plane, spine): m columns, ``count`` EVs each."""

    plane: I64  # [m]
    spine: I64  # [F, m]
    count: F64  # [m]
    evs: int


def mrc_paths(
    fabric: FluidFabric, src: I64, dst: I64, evs: int, seed: int, spine_offset: str = "auto"
) -> MrcPaths:
    """EV v of a QP on plane v % P, spine (v // P + offset) % S (`spine_of_ev` with offset 0). With at
    least P·S EVs the offset changes nothing (every spine is covered evenly); `auto` uses 0 then, and a
    per-flow hash otherwise."""
    f = fabric
    P, S = f.planes, f.spines
    if evs < P:
        raise ValueError(f"evs ({evs}) must be at least one per plane ({P})")
    v = np.arange(evs)
    key = (v % P) * S + (v // P) % S
    uniq, cnt = np.unique(key, return_counts=True)
    plane, srel = np.divmod(uniq, S)
    if spine_offset == "auto":
        spine_offset = "zero" if evs >= P * S else "hash"
    if spine_offset == "zero":
        off = np.zeros(len(src), dtype=np.int64)
    elif spine_offset == "hash":
        off = (mix_hash(seed ^ 0x5EED, src, dst) % np.uint64(S)).astype(np.int64)
    else:
        raise ValueError(f"spine_offset must be auto, zero or hash, got {spine_offset!r}")
    spine = (srel[None, :] + off[:, None]) % S
    return MrcPaths(plane.astype(np.int64), spine.astype(np.int64), cnt.astype(np.float64), evs)


def mrc_incidence(
    fabric: FluidFabric, state: LinkState, src: I64, dst: I64, paths: MrcPaths, steer: F64 | None = None
) -> tuple[Incidence, F64]:
    """QP incidence with an equal share per GOOD EV (× `steer`, per [flow, path], when given); EVs whose
    path crosses a link that is down are DENIED (weight 0). Returns (incidence, the EV weights [F, m]
    normalised per flow). Same-leaf flows use only the host links of each plane."""
    f = fabric
    F, m = paths.spine.shape
    P = f.planes
    pl = np.broadcast_to(paths.plane[None, :], (F, m))
    ls, ld = f.leaf_of(src), f.leaf_of(dst)
    cross = (ls != ld)[:, None]
    up_l = f.leaf_up(pl, ls[:, None], paths.spine)
    dn_l = f.spine_down(pl, paths.spine, ld[:, None])
    hu = f.host_up(pl, src[:, None])
    hd = f.host_down(pl, dst[:, None])
    good = state.up[hu] & state.up[hd]
    good &= ~cross | (state.up[up_l] & state.up[dn_l])
    w = np.where(good, paths.count[None, :], 0.0)
    if steer is not None:
        w = w * steer
    tot = w.sum(axis=1, keepdims=True)
    w = np.divide(w, tot, out=np.zeros_like(w), where=tot > 0)
    # per plane: host link weights (the sum of the plane's EVs)
    onehot = np.zeros((m, P))
    onehot[np.arange(m), paths.plane] = 1.0
    wp = w @ onehot  # [F, P]
    hu_p = f.host_up(np.arange(P)[None, :], src[:, None])
    hd_p = f.host_down(np.arange(P)[None, :], dst[:, None])
    crossm = np.broadcast_to(cross, (F, m))
    blocks_i = [hu_p, hd_p, up_l, dn_l]
    blocks_w = [wp, wp, np.where(crossm, w, 0.0), np.where(crossm, w, 0.0)]
    I = np.concatenate(blocks_i, axis=1)
    W = np.concatenate(blocks_w, axis=1)
    keep = W > 0
    counts = keep.sum(axis=1)
    indptr = np.zeros(F + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Incidence(indptr, I[keep].astype(np.int64), W[keep], np.arange(F, dtype=np.int64), F), w


def mrc_rates(
    fabric: FluidFabric,
    state: LinkState,
    src: I64,
    dst: I64,
    paths: MrcPaths,
    steer_rounds: int = 0,
    steer_step: float = 0.5,
) -> tuple[F64, dict[str, Any]]:
    """MRC flow rates (port units). With `steer_rounds`, the engine's steering: after each solve the
    EVs whose path crosses a saturated leaf-spine link are scaled by (1 − steer_step) and the others
    move back toward 1 by the same step (penalties decay on clean acknowledgements); the best solve (by
    its worst flow, then its total) is kept. Info: rounds run, and the last change of the worst flow."""
    f = fabric
    F, m = paths.spine.shape
    steer = np.ones((F, m))
    inc, _ = mrc_incidence(f, state, src, dst, paths)
    rate = maxmin(inc, state.cap)
    best = rate
    rounds = 0
    if steer_rounds:
        fab_lo = 2 * f.planes * f.hosts
        pl = np.broadcast_to(paths.plane[None, :], (F, m))
        ls, ld = f.leaf_of(src), f.leaf_of(dst)
        up_l = f.leaf_up(pl, ls[:, None], paths.spine)
        dn_l = f.spine_down(pl, paths.spine, ld[:, None])
        cross = (ls != ld)[:, None]
        for rounds in range(1, steer_rounds + 1):  # noqa: B007 (reported)
            load = link_load(inc, rate, f.links)
            sat = np.zeros(f.links, dtype=bool)
            with np.errstate(divide="ignore", invalid="ignore"):
                sat[fab_lo:] = load[fab_lo:] >= state.cap[fab_lo:] * (1 - 1e-6)
            sat &= state.up
            hot = cross & (sat[up_l] | sat[dn_l])
            if not hot.any():
                break
            steer = np.where(hot, steer * (1 - steer_step), np.minimum(1.0, steer * (1 + steer_step)))
            inc, _ = mrc_incidence(f, state, src, dst, paths, steer)
            rate = maxmin(inc, state.cap)
            if (rate.min(), rate.sum()) > (best.min(), best.sum()):
                best = rate
    return best, {"steer_rounds": rounds}


# ============================================================================================ traffic


def derangement(n: int, rng: np.random.Generator) -> I64:
    """A random permutation without fixed points (vectorised: a random cyclic shift of a random order
    would not be uniform, so draw and repair fixed points by swapping with a random other position).
    Two hosts have one derangement, which the repair never reaches (it swaps both fixed points, then
    swaps them back): it is returned as such; fewer have none (ValueError)."""
    if n < 2:
        raise ValueError(f"a permutation without fixed points needs at least 2 hosts, got {n}")
    if n == 2:
        return np.array([1, 0], np.int64)
    p = rng.permutation(n).astype(np.int64)
    while True:
        fixed = np.flatnonzero(p == np.arange(n))
        if not fixed.size:
            return p
        for i in fixed.tolist():
            j = int(rng.integers(n - 1))
            j += j >= i
            p[i], p[j] = p[j], p[i]


def sim_derangement(n: int, seed: int) -> I64:
    """The packet experiments' permutation (`mrc.sim.derive.derangement` with `random.Random(seed)`),
    so both models route the same flows."""
    import random

    from .derive import derangement as d

    return np.array(d(n, random.Random(seed)), dtype=np.int64)


__all__ = [
    "FluidFabric",
    "Incidence",
    "LinkState",
    "MrcPaths",
    "derangement",
    "ecmp_connections",
    "flow_rates",
    "from_lists",
    "link_load",
    "maxmin",
    "mix_hash",
    "mrc_incidence",
    "mrc_paths",
    "mrc_rates",
    "sim_derangement",
    "sim_hash",
]
