"""The experiments of `mrcctl sim run`: permutation, failover, incast. Each returns a JSON-ready document:
``experiment``, ``config``, ``results`` keyed by variant (``ecmp``, ``mrc``, ``mrc-notrim``,
``mrc-1plane``), and the run's speed (``events_per_s``, ``hops_per_s``). docs/sim.md explains the
set-ups, the derivations and the measured figures."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from mrc import topology
from mrc.transport import QpAttr
from mrc.transport.qp import NEVER
from mrc.wire.consts import MAX_PAYLOAD

from . import limits
from .derive import derangement, ecmp_plane_share, expected_share, uplink_bound
from .fabric import WIRE_OVERHEAD, Fabric, FabricParams
from .hosts import VARIANTS, Flow, HostParams, Traffic, base_rtt_ns
from .roce import DATA_HDR

Progress = Callable[[str], None]


@dataclass
class FabricSpec:
    planes: int = 8
    leaves: int = 8
    spines: int = 8
    hosts_per_leaf: int = 8
    rate_gbps: float = 100.0
    delay_ns: int = 500
    buffer_bytes: int = 512 * 1024
    ecn_bytes: int = 128 * 1024
    trim_bytes: int = 256 * 1024

    file: str | None = None  # a topology TOML file instead of the generated shape

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """ValueError naming the first field out of its range (`mrc.sim.limits`; the shape as the
        topology model bounds it). The experiments check again: the object is mutable."""
        L = limits
        L.integer("planes", self.planes, 1, topology.MAX_PLANES)
        L.integer("leaves", self.leaves, 1, topology.MAX_INDEX)
        L.integer("spines", self.spines, 1, topology.MAX_INDEX)
        L.integer("hosts_per_leaf", self.hosts_per_leaf, 1, topology.MAX_HOSTS)
        if not 2 <= self.hosts <= topology.MAX_HOSTS:
            raise ValueError(f"{self.leaves} leaves x {self.hosts_per_leaf} hosts: the model holds "
                             f"2..{topology.MAX_HOSTS} hosts")
        L.rate_gbps("rate_gbps", self.rate_gbps)
        L.nanoseconds("delay_ns", self.delay_ns, L.MAX_DELAY_NS)
        L.integer("buffer_bytes", self.buffer_bytes, 1, L.MAX_BUFFER_BYTES, " bytes")
        L.integer("ecn_bytes", self.ecn_bytes, 1, self.buffer_bytes, " bytes")  # at most the buffer
        L.integer("trim_bytes", self.trim_bytes, 1, self.buffer_bytes, " bytes")

    def topology(self) -> topology.Topology:
        if self.file is not None:
            return topology.load(self.file)
        return topology.generate(self.planes, self.leaves, self.spines, self.hosts_per_leaf)

    @classmethod
    def from_file(cls, path: str, ecn_bytes: int | None = None, trim_bytes: int | None = None) -> FabricSpec:
        """Shape, rate, delay and buffer from a topology file (the testbed's TOML). The experiments
        need the same number of hosts on every leaf, listed leaf by leaf (host i on leaf i // H).
        ECN and trimming thresholds default to 1/4 and 1/2 of the file's buffer."""
        topo = topology.load(path)
        if topo.spines < 1:  # the testbed takes leaf-only fabrics; the simulator's Clos needs a spine
            lines = topology.key_lines(topology.read_text(Path(path)))
            raise topology.TopologyError(path, "topology.spines", "the simulator needs at least one spine "
                                         f"(1..256), got {topo.spines}",
                                         topology.key_line(lines, "topology.spines"))
        n = len(topo.hosts)
        if n % topo.leaves:
            raise ValueError(f"{path}: {n} hosts on {topo.leaves} leaves: the experiments need the same "
                             "number of hosts on every leaf")
        h = n // topo.leaves
        if any(leaf != i // h for i, (_, leaf) in enumerate(topo.hosts)):
            raise ValueError(f"{path}: the experiments need the hosts listed leaf by leaf, {h} per leaf")
        buf = topo.link.buffer_bytes
        try:
            return cls(
                planes=topo.planes, leaves=topo.leaves, spines=topo.spines, hosts_per_leaf=h,
                rate_gbps=topo.link.rate_bps / 1e9, delay_ns=topo.link.delay_us * 1000, buffer_bytes=buf,
                ecn_bytes=buf // 4 if ecn_bytes is None else ecn_bytes,
                trim_bytes=buf // 2 if trim_bytes is None else trim_bytes, file=path,
            )
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def params(self, trimming: bool) -> FabricParams:
        return FabricParams(
            rate_bps=int(self.rate_gbps * 1e9), delay_ns=self.delay_ns, buffer_bytes=self.buffer_bytes,
            ecn_bytes=self.ecn_bytes, trim_bytes=self.trim_bytes if trimming else None,
        )

    @property
    def hosts(self) -> int:
        return self.leaves * self.hosts_per_leaf


@dataclass
class RunSpec:
    fabric: FabricSpec = field(default_factory=FabricSpec)
    variants: tuple[str, ...] = ("ecmp", "mrc")
    seed: int = 1
    evs: int = 128
    mtu: int = 4096
    timeout: int = 8
    reconverge_ns: int = 1_000_000

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """ValueError naming the first field out of its range; the fabric's too."""
        L = limits
        self.fabric.check()
        if not self.variants:
            raise ValueError(f"variants: name at least one of {', '.join(VARIANTS)}")
        for v in self.variants:
            if v not in VARIANTS:
                raise ValueError(f"unknown variant {v!r}: choose from {', '.join(VARIANTS)}")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"variants: each at most once, got {', '.join(self.variants)}")
        L.seed("seed", self.seed)
        L.integer("evs", self.evs, self.fabric.planes, L.MAX_EVS)
        L.integer("timeout", self.timeout, 0, L.MAX_TIMEOUT_EXP)
        L.integer("mtu", self.mtu, 64, MAX_PAYLOAD, " bytes")
        packet = self.mtu + DATA_HDR + WIRE_OVERHEAD
        if self.fabric.buffer_bytes < packet:
            why = (f"buffer_bytes {self.fabric.buffer_bytes} cannot hold one {packet}-byte data packet of "
                   f"the simulator's {self.mtu}-byte payload")
            f = self.fabric.file
            if f is not None:  # the file's buffer: named where it is written, as every file error is
                lines = topology.key_lines(topology.read_text(Path(f)))
                raise topology.TopologyError(f, "link.buffer", why, topology.key_line(lines, "link.buffer"))
            raise ValueError(why)
        L.nanoseconds("reconverge_ns", self.reconverge_ns, L.MAX_DELAY_NS)


def check_run(spec: RunSpec, duration_ns: int, long_flows: int = 0) -> None:
    """An experiment's spec and simulated time. Long-lived flows queue enough 1 MiB WRITEs to keep
    their NICs busy for the whole run, so `long_flows` x NIC rate x duration is bounded too (it was
    the allocation storm of a 1e12 Gb/s rate)."""
    spec.check()
    limits.nanoseconds("duration_ns", duration_ns, lo=1)
    fs = spec.fabric
    offered = long_flows * fs.planes * fs.rate_gbps / 8 * duration_ns
    if offered > limits.MAX_OFFERED_BYTES:
        raise ValueError(
            f"{long_flows} flows x {fs.planes} planes x {fs.rate_gbps:g} Gb/s for {duration_ns} ns offer "
            f"{offered / 2**30:.0f} GiB: at most {limits.MAX_OFFERED_BYTES >> 30} GiB of simulated "
            "traffic per run (shorten the run, or use fewer hosts or a lower rate)")


def _check_warmup(warmup_ns: int, duration_ns: int) -> None:
    limits.nanoseconds("warmup_ns", warmup_ns)
    if warmup_ns >= duration_ns:
        raise ValueError(f"warmup_ns ({warmup_ns}) must be shorter than the duration ({duration_ns} ns)")


def check_failover_times(duration_ns: int, fail_ns: int, heal_ns: int, flap_ns: int, bin_ns: int) -> None:
    """The failover's schedule: the goodput before the failure is the mean of the bins before it (the
    first bin, the start-up, excluded), and the goodput during it the mean of the bins it covers, so it
    needs two bins before the failure and one inside it (`fail_ns` in the first bin had no "before"
    and failed formatting None). Bins and flaps are bounded: one timeline row per bin, one scheduled
    event per flap."""
    L = limits
    L.nanoseconds("duration_ns", duration_ns, lo=1)
    L.nanoseconds("bin_ns", bin_ns, max(1, duration_ns // 4), lo=1)
    if duration_ns // bin_ns > L.MAX_BINS:
        raise ValueError(f"bin_ns {bin_ns}: {duration_ns // bin_ns} bins, at most {L.MAX_BINS} per run "
                         f"(a bin of at least {-(-duration_ns // L.MAX_BINS)} ns)")
    if not 2 * bin_ns <= fail_ns < duration_ns:
        raise ValueError(f"fail_ns ({fail_ns}) must lie inside the run and leave two bins before the "
                         f"failure: {2 * bin_ns}..{duration_ns - 1} ns")
    if heal_ns <= fail_ns:
        raise ValueError(f"heal_ns ({heal_ns}) must come after fail_ns ({fail_ns})")
    if min(heal_ns, duration_ns) // bin_ns <= fail_ns // bin_ns:
        raise ValueError(f"the failure ({fail_ns}..{min(heal_ns, duration_ns)} ns) must cover at least one "
                         f"whole bin of {bin_ns} ns")
    L.nanoseconds("flap_ns", flap_ns)
    if flap_ns and (min(heal_ns, duration_ns) - fail_ns) // flap_ns > L.MAX_LINK_CHANGES:
        raise ValueError(f"flap_ns {flap_ns}: at most {L.MAX_LINK_CHANGES} link changes per run (flap at "
                         f"least every {-(-(min(heal_ns, duration_ns) - fail_ns) // L.MAX_LINK_CHANGES)} ns)")


def efficiency(mtu: int) -> float:
    """Payload share of a full data packet on the wire (capacity is counted in payload bytes)."""
    return mtu / (mtu + DATA_HDR + WIRE_OVERHEAD)


def _host_params(spec: RunSpec) -> HostParams:
    return HostParams(evs=spec.evs, attr=QpAttr(mtu=spec.mtu, timeout=spec.timeout), seed=spec.seed,
                      reconverge_ns=spec.reconverge_ns)


class VariantMap(Protocol):
    """Runs an experiment's per-variant jobs: ``run_all(job, items)`` is ``[job(x) for x in items]``, in
    this process (`in_process`) or over worker processes (`mrc.ctl.workers.ForkMap`). The variants share
    nothing and a run is a pure function of its configuration and seed, so the results are the same."""

    workers: int  # runs at once, at most

    def __call__(
        self, job: Callable[[Any], dict[str, Any]], items: Sequence[Any]
    ) -> list[dict[str, Any]]: ...


class _InProcess:
    workers = 1

    def __call__(self, job: Callable[[Any], dict[str, Any]], items: Sequence[Any]) -> list[dict[str, Any]]:
        return [job(x) for x in items]


in_process: VariantMap = _InProcess()


def _loop_speed(fab: Fabric) -> dict[str, Any]:
    """One run's event-loop figures (summed over the runs by `_speed_doc`)."""
    return {"events": fab.events, "packet_hops": fab.hops, "loop_wall_s": fab.wall_s, "cpu_s": fab.cpu_s}


#: the figures of an experiment's document that measure the machine (`_speed_doc`'s, wherever they
#: stand): everything else is a function of the configuration and the seed
MACHINE_KEYS: Final = frozenset({"wall_s", "hops_per_s", "hops_per_cpu_s", "sim_wall_s", "loop_wall_s",
                                 "sim_cpu_s", "events_per_s", "hops_per_loop_s", "workers"})


def without_machine_figures(doc: Any) -> Any:
    """`doc` without MACHINE_KEYS at every depth: what two runs of one configuration and seed must share
    (the simulator's loops, the engine's paths, processes or not)."""
    if isinstance(doc, dict):
        return {k: without_machine_figures(v) for k, v in doc.items() if k not in MACHINE_KEYS}
    if isinstance(doc, list):
        return [without_machine_figures(v) for v in doc]
    return doc


def _speed_doc(parts: list[dict[str, Any]], wall_s: float, workers: int) -> dict[str, Any]:
    """The experiment's speed. `wall_s` is the wall time of all its runs together, fabric construction
    included (with worker processes the runs overlap); `loop_wall_s` and `sim_cpu_s` sum the event loops
    of the runs, so `hops_per_loop_s` is the speed of one event loop on one core."""
    events = sum(p["events"] for p in parts)
    hops = sum(p["packet_hops"] for p in parts)
    loop = sum(p["loop_wall_s"] for p in parts)
    cpu = sum(p["cpu_s"] for p in parts)
    w = wall_s or 1e-9
    return {"events": events, "packet_hops": hops, "workers": workers, "sim_wall_s": round(wall_s, 3),
            "loop_wall_s": round(loop, 3), "sim_cpu_s": round(cpu, 3), "events_per_s": round(events / w),
            "hops_per_s": round(hops / w), "hops_per_loop_s": round(hops / (loop or 1e-9)),
            "hops_per_cpu_s": round(hops / (cpu or 1e-9))}


def _run_jobs(run_all: VariantMap, job: Callable[[Any], dict[str, Any]],
              items: Sequence[Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the jobs; each returns a dict with its run's "speed". (outputs, the experiment's speed doc)."""
    t0 = time.perf_counter()
    outs = run_all(job, items)
    wall = time.perf_counter() - t0
    return outs, _speed_doc([o["speed"] for o in outs], wall, min(run_all.workers, len(items)))


def _reporter(progress: Progress | None, label: str, until: int) -> Callable[[Fabric], None] | None:
    if progress is None:
        return None

    def rep(fab: Fabric) -> None:
        rate = fab.hops / fab.wall_s if fab.wall_s else 0
        progress(f"  {label}: {fab.now / 1e3:.0f}/{until / 1e3:.0f} us simulated, {fab.hops} hops, "
                 f"{rate:,.0f} hops/s")

    return rep


def _sampler(fab: Fabric, tr: Traffic, every_ns: int, until: int) -> list[list[int]]:
    """Per-flow delivered bytes every `every_ns` (first row at t = 0)."""
    rows: list[list[int]] = []

    def sample(t: int) -> None:
        rows.append(tr.conn_delivered())
        tr.poll(t)
        if t + every_ns <= until:
            fab.at(t + every_ns, sample)

    fab.at(0, sample)
    return rows


# ============================================================================================ permutation


def _mark(fab: Fabric, tr: Traffic, t: int, marks: dict[int, list[int]]) -> None:
    fab.at(t, lambda now: marks.__setitem__(0, tr.delivered()))


def _long_flows(fab: Fabric, spec: RunSpec, variant: str, flows: list[Flow], duration_ns: int, warmup_ns: int,
                label: str, progress: Progress | None) -> tuple[Traffic, list[float], float]:
    """Run long-lived `flows` on `fab` for `duration_ns`: (traffic, per-flow goodput in bytes/s over
    [warmup, duration], wall seconds of the loop)."""
    tr = Traffic(fab, variant, flows, _host_params(spec), duration_ns)
    marks: dict[int, list[int]] = {}
    _mark(fab, tr, warmup_ns, marks)
    if progress:
        progress(label)
    t0 = time.perf_counter()
    fab.run(until_ns=duration_ns, progress=_reporter(progress, variant, duration_ns))
    wall = time.perf_counter() - t0
    window_s = (duration_ns - warmup_ns) / 1e9
    return tr, [(b - a) / window_s for a, b in zip(marks[0], tr.delivered(), strict=True)], wall


def permutation(spec: RunSpec, duration_ns: int = 200_000, warmup_ns: int = 50_000,
                progress: Progress | None = None, run_all: VariantMap = in_process) -> dict[str, Any]:
    """Every host sends to another (a random derangement), long-lived, for `duration_ns`; throughput is
    measured over [warmup, duration]. Capacity = hosts × planes × port rate × payload efficiency."""
    check_run(spec, duration_ns, spec.fabric.hosts)
    _check_warmup(warmup_ns, duration_ns)
    fs = spec.fabric
    rng = random.Random(spec.seed)
    n = fs.hosts
    perm = derangement(n, rng)
    flows = [Flow(i, perm[i], None) for i in range(n)]
    eff = efficiency(spec.mtu)
    host_cap = fs.planes * fs.rate_gbps * 1e9 / 8 * eff  # payload bytes/s per host

    def one(variant: str) -> dict[str, Any]:
        topo = fs.topology()
        fab = Fabric(topo, fs.params(trimming=variant != "mrc-notrim"))
        label = f"permutation {variant}: {n} hosts x {fs.planes} planes, {duration_ns / 1e3:.0f} us ..."
        tr, rates, wall = _long_flows(fab, spec, variant, flows, duration_ns, warmup_ns, label, progress)
        fr = sorted(r / host_cap for r in rates)
        res: dict[str, Any] = {
            "capacity_fraction": round(sum(rates) / (n * host_cap), 4),
            "flow_fraction_min": round(fr[0], 4),
            "flow_fraction_p50": round(fr[len(fr) // 2], 4),
            "flow_fraction_max": round(fr[-1], 4),
            "flow_fractions": [round(x, 4) for x in fr],
            "wall_s": round(wall, 2),
            "packet_hops": fab.hops,
            "hops_per_s": round(fab.hops / fab.wall_s) if fab.wall_s else None,
            "hops_per_cpu_s": round(fab.hops / fab.cpu_s) if fab.cpu_s else None,
            "drops": dict(fab.drops),
            "trims": fab.trims,
            "ecn_marks": fab.ecn_marks,
            **tr.counters(),
        }
        if variant == "ecmp":
            # what max-min fairness gives for this very hash draw, plane by plane
            shares = []
            for p in range(fs.planes):
                spine_of = []
                for f, cs in zip(flows, tr.conns, strict=True):
                    c = next(c for c in cs if c.plane == p)
                    spine_of.append(tr.routing.spine(f.src, f.dst, c.sport, p))
                shares.append(ecmp_plane_share(fs.leaves, fs.hosts_per_leaf, perm, spine_of))
            res["derived_this_draw"] = round(sum(shares) / len(shares), 4)
            res["derived_expected"] = round(expected_share(fs.leaves, fs.hosts_per_leaf, fs.spines), 4)
            res["uplink_only_bound"] = round(uplink_bound(fs.hosts_per_leaf, fs.spines), 4)
        if variant == "mrc-1plane":
            res["note"] = "sprays over plane 0 only: at most 1/planes of the host's capacity"
        return {"result": res, "speed": _loop_speed(fab)}

    outs, speed = _run_jobs(run_all, one, spec.variants)
    return {
        "experiment": "permutation",
        "config": {**asdict(spec), "duration_ns": duration_ns, "warmup_ns": warmup_ns,
                   "host_capacity_gbps": round(host_cap * 8 / 1e9, 2), "payload_efficiency": round(eff, 4)},
        "results": {v: o["result"] for v, o in zip(spec.variants, outs, strict=True)},
        **speed,
    }


# ============================================================================================ degraded


def degraded_link(spec: RunSpec, link: tuple[str, str] | None,
                  factor: float) -> tuple[str, str, int, int | None]:
    """The leaf-spine link `degraded` slows (default: the first of leaf 0 in plane 0) and what it becomes:
    the link as the topology has it (a file's `[[link_override]]` included) at `factor` of its rate, its
    own delay kept. ValueError for a factor outside (0, 1], another kind of link, or less than 1 bit/s."""
    limits.number("factor", factor, 0.0, 1.0, lo_open=True)
    fs = spec.fabric
    topo = fs.topology()
    a, b = link or (topo.leaf_name(0, 0), topo.spine_name(0, 0))
    lk = topo.link_between(a, b)
    if lk.kind != "leaf-spine":
        raise ValueError("degrade a leaf-spine link")
    own = next((o for o in topo.link_overrides if {o.a, o.b} == {a, b}), None)
    base_bps = own.rate_bps if own is not None and own.rate_bps is not None else fs.rate_gbps * 1e9
    slow_bps = int(base_bps * factor)
    if slow_bps < 1:
        raise ValueError(f"factor {factor:g} of link {a}-{b}'s {base_bps:g} bit/s leaves it "
                         f"{base_bps * factor:g} bit/s: at least 1 bit/s")
    slow_delay = own.delay_us * 1000 if own is not None and own.delay_us is not None else None
    return a, b, slow_bps, slow_delay


def degraded(spec: RunSpec, link: tuple[str, str] | None = None, factor: float = 0.1,
             duration_ns: int = 200_000, warmup_ns: int = 50_000, progress: Progress | None = None,
             run_all: VariantMap = in_process) -> dict[str, Any]:
    """The permutation of `permutation` with one leaf-spine link (default: the first of leaf 0 in plane
    0) serializing at `factor` of its rate, both directions, routing unchanged (a flaky optic, a link
    renegotiated to a lower speed). Per flow the goodput as a fraction of the host's capacity and of its
    fair share: what ideal multipath routing could give it with that link slow, min over the flow's
    two leaves of (their uplink or downlink capacity left) / (the flows that share it), at most 1.
    Per variant: capacity, worst flow, worst flow over its fair share, the flows whose data can cross
    the slow link and the worst of them, and the slow link's load (its bytes over the mean of the other
    leaf-spine links')."""
    check_run(spec, duration_ns, spec.fabric.hosts)
    _check_warmup(warmup_ns, duration_ns)
    fs = spec.fabric
    topo = fs.topology()
    a, b, slow_bps, slow_delay = degraded_link(spec, link, factor)
    rng = random.Random(spec.seed)
    n = fs.hosts
    perm = derangement(n, rng)
    flows = [Flow(i, perm[i], None) for i in range(n)]
    eff = efficiency(spec.mtu)
    host_cap = fs.planes * fs.rate_gbps * 1e9 / 8 * eff
    # fair shares: per leaf, uplink (= downlink) capacity in host units, the slow link counting `factor`
    H = fs.hosts_per_leaf
    slow_leaf = topo.node(a if topo.node(a).kind == "leaf" else b).index
    units = [float(fs.planes * fs.spines) for _ in range(fs.leaves)]
    units[slow_leaf] -= 1 - factor
    out_n = [0] * fs.leaves
    in_n = [0] * fs.leaves
    for f in flows:
        if f.src // H != f.dst // H:
            out_n[f.src // H] += 1
            in_n[f.dst // H] += 1

    def fair(f: Flow) -> float:
        ls, ld = f.src // H, f.dst // H
        if ls == ld:
            return 1.0
        # a leaf's uplinks (= downlinks) in units of one host's capacity, shared by its flows
        return min(1.0, units[ls] / fs.planes / out_n[ls], units[ld] / fs.planes / in_n[ld])

    fairs = [fair(f) for f in flows]
    slow = {a, b}

    def slow_flows(variant: str, fab: Fabric, tr: Traffic) -> list[int]:
        """Flows whose data can cross the slow link: for ECMP those hashed onto it in its plane; for the
        sprayers every flow between the slow leaf and another leaf."""
        out = []
        for i, f in enumerate(flows):
            ls, ld = f.src // H, f.dst // H
            if ls == ld or slow_leaf not in (ls, ld):
                continue
            if variant != "ecmp":
                out.append(i)
                continue
            for c in tr.conns[i]:
                sp = tr.routing.spine(f.src, f.dst, c.sport, c.plane)
                hops = {topo.leaf_name(c.plane, ls), topo.leaf_name(c.plane, ld)}
                if sp is not None and slow <= hops | {topo.spine_name(c.plane, sp)}:
                    out.append(i)
                    break
        return out

    def one(variant: str) -> dict[str, Any]:
        fab = Fabric(topo, fs.params(trimming=variant != "mrc-notrim"))
        li = fab.link(a, b)
        fab.set_link_rate(li, slow_bps, slow_delay)
        tr, goodput, wall = _long_flows(
            fab, spec, variant, flows, duration_ns, warmup_ns,
            f"degraded {variant}: {n} hosts, link {a}-{b} at {factor:g} of its rate ...", progress)
        rates = [r / host_cap for r in goodput]
        rel = [r / fr for r, fr in zip(rates, fairs, strict=True)]
        def link_bytes(i: int) -> int:
            return sum(fab.port_tx_bytes[k] for k in fab.link_ports[i])

        spine_links = [fab.link(x.a, x.b) for x in topo.links() if x.kind == "leaf-spine"]
        others = [link_bytes(i) for i in spine_links if i != li]
        through = slow_flows(variant, fab, tr)
        res: dict[str, Any] = {
            "capacity_fraction": round(sum(rates) / n, 4),
            "flow_fraction_min": round(min(rates), 4),
            "worst_flow_of_fair_share": round(min(rel), 4),
            "flows_below_half_fair_share": sum(1 for x in rel if x < 0.5),
            # the slow link's bytes over the mean of the other leaf-spine links' (full rate ~1, ideal ~factor)
            "slow_link_load": round(link_bytes(li) / (sum(others) / len(others) or 1), 4),
            "flows_through_slow_link": len(through),
            "worst_flow_through_slow_link": round(min(rates[i] for i in through), 4) if through else None,
            "wall_s": round(wall, 2),
            "drops": dict(fab.drops),
            "trims": fab.trims,
            "ecn_marks": fab.ecn_marks,
            **tr.counters(),
        }
        return {"result": res, "speed": _loop_speed(fab)}

    outs, speed = _run_jobs(run_all, one, spec.variants)
    return {
        "experiment": "degraded",
        "config": {**asdict(spec), "duration_ns": duration_ns, "warmup_ns": warmup_ns, "link": [a, b],
                   "factor": factor, "fair_share_min": round(min(fairs), 4),
                   "host_capacity_gbps": round(host_cap * 8 / 1e9, 2)},
        "results": {v: o["result"] for v, o in zip(spec.variants, outs, strict=True)},
        "reference": {"htsim_ecmp_worst_flow": [0.03, 0.09], "htsim_spraying_worst_flow": 0.63},
        **speed,
    }


# ============================================================================================ failover


def _link_changes(fail_ns: int, heal_ns: int, flap_ns: int, until_ns: int) -> list[tuple[int, bool]]:
    """(time, up) changes: down at fail_ns; with flap_ns, up and down again every flap_ns; up at heal_ns."""
    out = [(fail_ns, False)]
    if flap_ns:
        t, up = fail_ns + flap_ns, True
        while t < min(until_ns, heal_ns):
            out.append((t, up))
            t += flap_ns
            up = not up
    if heal_ns < NEVER:
        out.append((heal_ns, True))
    return out


def _schedule_link(fab: Fabric, li: int, changes: list[tuple[int, bool]]) -> None:
    def change(up: bool) -> Callable[[int], None]:
        return lambda now: fab.set_link(li, up, now)

    for t, up in changes:
        fab.at(t, change(up))


def failover(spec: RunSpec, duration_ns: int = 2_000_000, fail_ns: int = 500_000, heal_ns: int = NEVER,
             link: tuple[str, str] | None = None, flap_ns: int = 0, bin_ns: int = 10_000,
             progress: Progress | None = None, run_all: VariantMap = in_process) -> dict[str, Any]:
    """Hosts of leaf 0 send to hosts of leaf 1 (one long-lived flow each) while a leaf–spine link fails
    at `fail_ns` (heals at `heal_ns`; with `flap_ns`, toggles every flap_ns from fail_ns on)."""
    check_run(spec, duration_ns, spec.fabric.hosts_per_leaf)
    check_failover_times(duration_ns, fail_ns, heal_ns, flap_ns, bin_ns)
    fs = spec.fabric
    topo = fs.topology()
    H = fs.hosts_per_leaf
    if fs.leaves < 2:
        raise ValueError("failover needs at least two leaves")
    a, b = link or (topo.leaf_name(0, 0), topo.spine_name(0, fs.spines - 1))
    flows = [Flow(i, H + i, None) for i in range(H)]
    eff = efficiency(spec.mtu)
    # the demand (H hosts at full NIC rate) equals the core's capacity when H = spines
    cap = min(H * fs.planes, fs.planes * fs.spines) * fs.rate_gbps * 1e9 / 8 * eff
    # the share of the flows' leaf-spine paths the link carries: one of planes x spines when it is an
    # uplink of leaf 0 or of leaf 1 (the flows' leaves), none otherwise (a link elsewhere in the fabric
    # was charged as one of theirs, lowering the required fraction for a failure they never see)
    lk = topo.link_between(a, b)
    leaf = topo.node(a if topo.node(a).kind == "leaf" else b).index
    failed_share = 1 / (fs.planes * fs.spines) if lk.kind == "leaf-spine" and leaf in (0, 1) else 0.0

    def one(variant: str) -> dict[str, Any]:
        topo = fs.topology()
        fab = Fabric(topo, fs.params(trimming=variant != "mrc-notrim"))
        tr = Traffic(fab, variant, flows, _host_params(spec), duration_ns)
        li = fab.link(a, b)
        _schedule_link(fab, li, _link_changes(fail_ns, heal_ns, flap_ns, duration_ns))
        rows = _sampler(fab, tr, bin_ns, duration_ns)
        affected = 0
        if variant == "ecmp":  # connections whose data or ACK path crosses the link before it fails
            for f, cs in zip(flows, tr.conns, strict=True):
                for c in cs:
                    ls, ld = fab.topo.leaf_name(c.plane, 0), fab.topo.leaf_name(c.plane, 1)
                    for x, y in ((f.src, f.dst), (f.dst, f.src)):
                        sp = tr.routing.spine(x, y, c.sport, c.plane)
                        if sp is None:
                            continue
                        hops = {ls, ld, fab.topo.spine_name(c.plane, sp)}
                        if a in hops and b in hops:
                            affected += 1
                            break
        if progress:
            progress(f"failover {variant}: {H} flows, link {a}-{b} down at {fail_ns / 1e3:.0f} us ...")
        t0 = time.perf_counter()
        fab.run(until_ns=duration_ns, progress=_reporter(progress, variant, duration_ns))
        wall = time.perf_counter() - t0
        # aggregate goodput per bin, as a fraction of capacity
        tot = [sum(r) for r in rows]
        series = [(tot[i + 1] - tot[i]) / (bin_ns / 1e9) / cap for i in range(len(tot) - 1)]
        i0 = fail_ns // bin_ns
        i1 = min(len(series), (heal_ns if heal_ns < NEVER else duration_ns) // bin_ns)
        pre = series[max(1, i0 - 20):i0]
        during = series[i0:i1]
        # the longest time any connection delivered nothing after the failure
        nconns = len(rows[0]) if rows else 0
        stall = 0
        resumed = i0  # the bin in which the last connection that had stalled delivered again
        unrecovered = 0  # connections still stalled when the run ended
        for k in range(nconns):
            run_ = best = 0
            for i in range(i0, len(rows) - 1):
                if rows[i + 1][k] == rows[i][k]:
                    run_ += 1
                    best = max(best, run_)
                else:
                    if run_:
                        resumed = max(resumed, i)
                    run_ = 0
            stall = max(stall, best)
            unrecovered += run_ > 0
        last = fab.last_down_drop.get(li)
        into_dead = (last - fail_ns) / 1e9 if last is not None else 0.0
        # None while a connection is still stalled at the end: it did not recover within the run (this
        # was the time another connection resumed, or 0.0: the best value for the worst case)
        recovered = (resumed - i0) * bin_ns / 1e9 if not unrecovered else None
        res: dict[str, Any] = {
            "goodput_fraction_before": round(sum(pre) / len(pre), 4) if pre else None,
            "goodput_fraction_during_failure": round(sum(during) / len(during), 4) if during else None,
            "goodput_fraction_min_bin": round(min(during), 4) if during else None,
            "required_fraction": round((1 - failed_share) * 0.9, 4),
            # senders that spray move off the link themselves: rerouted once nothing enters it any
            # more; ECMP is rerouted by its routing: once its stalled connections deliver again
            "reroute_s": recovered if variant == "ecmp" else into_dead,
            "last_into_dead_link_s": into_dead,
            "recovered_s": recovered,
            "connections_not_recovered": unrecovered,
            "max_stall_s": stall * bin_ns / 1e9,
            "lost_on_failed_link": fab.lost_on_link[li],
            "dropped_at_failed_link": fab.down_data_drops.get(li, 0),
            "wall_s": round(wall, 2),
            "drops": dict(fab.drops),
            **tr.counters(),
        }
        if variant != "ecmp":
            rtt = base_rtt_ns(fab, spec.mtu)
            res["base_rtt_s"] = rtt / 1e9
            res["reroute_rtts"] = round((last - fail_ns) / rtt, 1) if last is not None else 0.0
            ctx_events = sum(len(q.paths.events) + q.paths.events_dropped for q, _ in tr.qps)
            res["ev_events"] = ctx_events
        else:
            res["connections_on_failed_link"] = affected
        return {"result": res, "series": series, "speed": _loop_speed(fab)}

    outs, speed = _run_jobs(run_all, one, spec.variants)
    results = {v: o["result"] for v, o in zip(spec.variants, outs, strict=True)}
    timelines: dict[str, list[float]] = {v: o["series"] for v, o in zip(spec.variants, outs, strict=True)}
    return {
        "experiment": "failover",
        "config": {**asdict(spec), "duration_ns": duration_ns, "fail_ns": fail_ns,
                   "heal_ns": None if heal_ns >= NEVER else heal_ns, "flap_ns": flap_ns, "link": [a, b],
                   "bin_ns": bin_ns, "failed_share_of_paths": round(failed_share, 4),
                   "capacity_gbps": round(cap * 8 / 1e9, 2)},
        "results": results,
        "timeline": {"bin_s": bin_ns / 1e9, "goodput_fraction": {k: [round(x, 4) for x in v]
                                                                 for k, v in timelines.items()}},
        **speed,
    }


def failover_sweep(spec: RunSpec, links: list[tuple[str, str]], duration_ns: int = 2_000_000,
                   fail_ns: int = 500_000, bin_ns: int = 10_000, progress: Progress | None = None,
                   run_all: VariantMap = in_process) -> dict[str, Any]:
    """`failover` once per link of `links` (e.g. every leaf-spine link of one leaf), and per variant the
    worst case over them: lowest goodput during the failure and lowest bin, longest reroute and stall,
    each with the link it came from, and whether every run met its requirement."""
    check_run(spec, duration_ns, spec.fabric.hosts_per_leaf)
    check_failover_times(duration_ns, fail_ns, NEVER, 0, bin_ns)
    if not links:
        raise ValueError("links: name at least one link to fail")
    runs = []
    for a, b in links:
        doc = failover(spec, duration_ns, fail_ns, NEVER, (a, b), 0, bin_ns, progress, run_all)
        runs.append({"link": [a, b], "results": doc["results"],
                     "zero_bins": {v: sum(1 for x in tl[fail_ns // bin_ns:] if x <= 0)
                                   for v, tl in doc["timeline"]["goodput_fraction"].items()},
                     "speed": {k: doc[k] for k in ("packet_hops", "sim_wall_s")}})
    worst: dict[str, dict[str, Any]] = {}
    for v in spec.variants:
        rs = [(r["link"], r["results"][v], r["zero_bins"][v]) for r in runs]

        def pick(key: str, low: bool, rs: list[Any] = rs) -> dict[str, Any]:
            # None is the worst: no goodput measured (low), or not recovered within the run (high)
            worst_none = 0.0 if low else math.inf
            lk, r, _ = (min if low else max)(
                rs, key=lambda x: x[1][key] if x[1][key] is not None else worst_none)
            return {"value": r[key], "link": "-".join(lk)}

        worst[v] = {
            "goodput_fraction_during_failure": pick("goodput_fraction_during_failure", True),
            "goodput_fraction_min_bin": pick("goodput_fraction_min_bin", True),
            "reroute_s": pick("reroute_s", False),
            "max_stall_s": pick("max_stall_s", False),
            "zero_bins": max(z for _, _, z in rs),
            "all_meet_required": all(
                (r["goodput_fraction_during_failure"] or 0) >= r["required_fraction"] for _, r, _ in rs),
        }
    return {
        "experiment": "failover-sweep",
        "config": {**asdict(spec), "duration_ns": duration_ns, "fail_ns": fail_ns, "bin_ns": bin_ns,
                   "links": [list(lk) for lk in links]},
        "runs": runs,
        "worst": worst,
        "packet_hops": sum(r["speed"]["packet_hops"] for r in runs),
        "sim_wall_s": round(sum(r["speed"]["sim_wall_s"] for r in runs), 3),
    }


# ============================================================================================ incast


def incast(spec: RunSpec, senders: int = 16, size: int = 1 << 20, time_limit_ns: int = 50_000_000,
           progress: Progress | None = None, run_all: VariantMap = in_process) -> dict[str, Any]:
    """`senders` hosts on other leaves each WRITE `size` bytes to host 0 at t = 0; message completion
    times (at the requester), retransmission timeouts and the receiver's downlink queues."""
    check_run(spec, time_limit_ns)
    limits.integer("senders", senders, 1, topology.MAX_HOSTS - 1)
    limits.integer("size", size, 1, limits.MAX_BUFFERS_BYTES, " bytes")
    if senders * size > limits.MAX_BUFFERS_BYTES:  # a source buffer and a landing region per sender
        raise ValueError(f"{senders} senders x {size} bytes: at most 1 GiB "
                         f"({limits.MAX_BUFFERS_BYTES} bytes) in all")
    fs = spec.fabric
    if fs.hosts - fs.hosts_per_leaf < senders:
        raise ValueError(f"{senders} senders need {senders} hosts off the receiver's leaf; the fabric has "
                         f"{fs.hosts - fs.hosts_per_leaf}")
    srcs = list(range(fs.hosts_per_leaf, fs.hosts_per_leaf + senders))
    flows = [Flow(s, 0, size) for s in srcs]

    def one(variant: str) -> dict[str, Any]:
        topo = fs.topology()
        fab = Fabric(topo, fs.params(trimming=variant != "mrc-notrim"))
        tr = Traffic(fab, variant, flows, _host_params(spec), time_limit_ns)
        down_ports = [fab.port_of(topo.leaf_name(p, 0), topo.hosts[0][0]) for p in range(fs.planes)]
        occ: list[int] = []

        def sample_q(t: int, fab: Fabric = fab, tr: Traffic = tr, occ: list[int] = occ,
                     ports: list[int] = down_ports) -> None:
            # mean backlog of the receiver's downlink ports (one per plane), every microsecond
            occ.append(sum(max(0, int((fab.busy[k] - t) * fab.rate_Bpns)) for k in ports) // len(ports))
            tr.poll(t)
            if not tr.all_done():
                fab.at(t + 1_000, lambda t2: sample_q(t2))

        fab.at(0, sample_q)
        if progress:
            progress(f"incast {variant}: {senders} x {size} bytes -> {topo.hosts[0][0]} ...")
        t0 = time.perf_counter()
        fab.run(until_ns=time_limit_ns, stop=tr.all_done, check_every=1024,
                progress=_reporter(progress, variant, time_limit_ns))
        tr.poll(fab.now)
        wall = time.perf_counter() - t0
        done = sorted(d / 1e9 for d in tr.done_ns if d >= 0)
        ok = sum(1 for s in tr.status if s == "SUCCESS")

        def pct(q: float, done: list[float] = done) -> float | None:
            if not done:
                return None
            return done[min(len(done) - 1, max(0, round(q * len(done) + 0.5) - 1))]

        ideal = senders * size / (fs.planes * fs.rate_gbps * 1e9 / 8 * efficiency(spec.mtu))
        res = {
            "completed": ok,
            "p50_s": pct(0.50),
            "p99_s": pct(0.99),
            "max_s": done[-1] if done else None,
            "ideal_s": round(ideal, 9),
            "queue_max_bytes": max(fab.port_max_backlog[k] for k in down_ports),
            "queue_mean_bytes": round(sum(occ) / len(occ)) if occ else 0,
            "trims": fab.trims,
            "drops": dict(fab.drops),
            "wall_s": round(wall, 2),
            **tr.counters(),
        }
        return {"result": res, "done": done, "speed": _loop_speed(fab)}

    outs, speed = _run_jobs(run_all, one, spec.variants)
    results = {v: o["result"] for v, o in zip(spec.variants, outs, strict=True)}
    cdfs: dict[str, list[float]] = {v: o["done"] for v, o in zip(spec.variants, outs, strict=True)}
    return {
        "experiment": "incast",
        "config": {**asdict(spec), "senders": senders, "size_bytes": size, "receiver": "h0"},
        "results": results,
        "completion_s": cdfs,
        **speed,
    }
