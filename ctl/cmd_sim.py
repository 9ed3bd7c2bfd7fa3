"""`mrcctl sim`: run the MRC engine in simulation.

    mrcctl sim run permutation [--hosts 64] [--planes 8] [--spines 8] [--duration 200us] ...
    mrcctl sim run failover [--planes 4] [--spines 4] [--link p0l0-p0s3] [--fail-at 500us] [--flap T] ...
    mrcctl sim run incast [--senders 16] [--size 256K] ...
    mrcctl sim run allreduce [--ranks 4] [--size 16M] [--bits 2] [--scheme S] [--partial-sums naive|aware] ...

`run` drives the unmodified engines on a simulated multi-plane Clos (`mrc.sim.fabric`) against the ECMP
single-path baseline and the MRC variants (docs/sim.md); each experiment prints a table, or one JSON
document with -j, and writes a PNG with --plot FILE (needs the `plot` extra).

    mrcctl sim loopback [--size 64M] [--planes 4] [--evs 128] [--loss P] [--trim P] [--ecn-plane N]
                        [--blackhole-plane N@T[-T2]] [--jitter T] [--cc nscc|null] [--seed S]
                        [--settle T] [--profile] [-j]

`loopback` WRITEs a seeded random buffer from engine A to engine B over the in-memory multi-plane fabric
of `mrc.sim.loopback` (virtual clock) and reports whether the transfer completed and is bit-exact, the
virtual time, retransmits by cause, trims, EV state counts per plane, EV events, and the engine speed:
`engine_pps` = data packets (first transmissions and retransmissions) per wall-clock second, both engines
and the fabric on one core. Times take ns/us/ms/s suffixes (bare numbers are ns); sizes K/M/G (binary).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

from mrc import topology, units
from mrc.collective import COMPRESSIONS, PARTIAL_SUMS, Config
from mrc.errors import UsageError
from mrc.sim import experiments as exps
from mrc.sim import limits
from mrc.sim.hosts import VARIANTS
from mrc.sim.loopback import NEVER, Blackhole, FabricConfig, LoopbackConfig, loopback
from mrc.transport import QpAttr

from .output import PLOT_SUFFIXES, Output, json_option, output_file, table
from .workers import ForkMap, default_jobs

_TIME_UNITS: Final = {"": 1, "ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
MAX_SIZE: Final = 4 << 30  # what a size option parses at all; each option has its own range below

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")
MAX_JOBS: Final = 256  # worker processes: each forks the simulator


def parse_size(text: str) -> int:
    try:
        n = units.parse_size(text)
    except (ValueError, OverflowError) as e:  # a thousand digits overflow a float
        raise UsageError(str(e) if isinstance(e, ValueError) else f"not a size: {text!r}") from None
    if n > MAX_SIZE:
        raise UsageError(f"size must be 1 byte .. 4G, got {text!r}")
    return n


def parse_time(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s)?\s*", text)
    value = float(m.group(1)) * _TIME_UNITS[m.group(2) or ""] if m else math.nan
    if not math.isfinite(value):
        raise UsageError(f"bad time {text!r} (examples: 500us, 2ms, 1500)")
    return int(value)


# -------------------------------------------------------------------------------- option ranges
# Every option is checked against its range (mrc.sim.limits; docs/sim.md, "Options and their ranges")
# by a click callback, so a bad value is a usage error naming the option before anything is built. The
# callbacks return the value as given: the commands parse times and sizes themselves.

_Callback = Callable[[click.Context, click.Parameter, Any], Any]


def _ranged(check: Callable[[str, Any], Any]) -> _Callback:
    """A callback running `check(name, value)` (a mrc.sim.limits check) on a given value (None: the
    option was left out and has no default)."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return value
        name = param.name or "value"
        try:
            check(name, value)
        except (ValueError, UsageError) as e:
            raise click.BadParameter(str(e).removeprefix(f"{name} ")) from None
        return value

    return callback


def _int_in(lo: int, hi: int) -> _Callback:
    return _ranged(lambda n, v: limits.integer(n, v, lo, hi))


def _num_in(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False,
            unit: str = "") -> _Callback:
    return _ranged(lambda n, v: limits.number(n, v, lo, hi, lo_open=lo_open, hi_open=hi_open, unit=unit))


def _time_in(lo: int, hi: int) -> _Callback:
    """A time option (ns/us/ms/s suffixes) in lo..hi ns."""
    return _ranged(lambda n, v: limits.integer(n, parse_time(v), lo, hi, " ns"))


def _size_in(lo: int, hi: int) -> _Callback:
    """A size option (K/M/G suffixes) in lo..hi bytes."""
    return _ranged(lambda n, v: limits.integer(n, parse_size(v), lo, hi, " bytes"))


def _library(what: Callable[[], _T]) -> _T:
    """A library call whose ValueError (a range mrc.sim checks across options) is a usage error."""
    try:
        return what()
    except ValueError as e:
        raise UsageError(str(e)) from None


_SEED = _int_in(0, limits.MAX_SEED)
_RATE = _num_in(limits.MIN_RATE_GBPS, limits.MAX_RATE_GBPS, unit=" Gb/s")
_DELAY = _time_in(0, limits.MAX_DELAY_NS)
_SIM_TIME = _time_in(1, limits.MAX_SIM_NS)
_AT_TIME = _time_in(0, limits.MAX_SIM_NS)
_PROB = _num_in(0.0, 1.0, hi_open=True)
_EVS = _int_in(1, limits.MAX_EVS)


def parse_blackhole(text: str, planes: int) -> Blackhole:
    """`N@T` (from T on) or `N@T-T2` (heals at T2)."""
    m = re.fullmatch(r"\s*(\d+)@([^-]+)(?:-(.+))?", text)
    if not m:
        raise UsageError(f"bad blackhole {text!r} (examples: 1@200us, 2@100us-2ms)")
    plane = int(m.group(1))
    if plane >= planes:
        raise UsageError(f"blackhole plane {plane} does not exist (planes 0..{planes - 1})")
    start = parse_time(m.group(2))
    end = parse_time(m.group(3)) if m.group(3) else NEVER
    for t in (start, end):
        if t != NEVER and t > limits.MAX_SIM_NS:
            raise UsageError(f"Invalid value for '--blackhole-plane': {text!r}: its times must be "
                             f"0..{limits.MAX_SIM_NS / 1e9:g}s (the run's time limit)")
    if end <= start:
        raise UsageError(f"blackhole {text!r} heals before it starts")
    return Blackhole(plane, start, end)




@click.group()
def sim() -> None:
    """Run the MRC transport engine in simulation."""


def _prob(name: str, p: float) -> float:
    if not 0.0 <= p < 1.0:
        raise UsageError(f"{name} must be a probability in [0, 1), got {p}")
    return p


@sim.command("loopback")
@click.option("--size", default="64M", show_default=True, callback=_size_in(1, limits.MAX_LOOPBACK_BYTES),
              help="Bytes to WRITE (K/M/G suffixes), 1..1G.")
@click.option("--planes", default=4, show_default=True, type=int,
              callback=_int_in(1, limits.MAX_LOOPBACK_PLANES), help="Planes (ports per host), 1..64.")
@click.option("--evs", default=128, show_default=True, type=int, callback=_EVS,
              help="EVs in the QP's profile, planes..16384.")
@click.option("--loss", default=0.0, show_default=True, type=float, callback=_PROB,
              help="Random loss probability, [0, 1).")
@click.option("--trim", default=0.0, show_default=True, type=float, callback=_PROB,
              help="Trim probability (data), [0, 1).")
@click.option("--ecn-plane", type=int, default=None, callback=_int_in(0, limits.MAX_LOOPBACK_PLANES - 1),
              help="CE-mark data packets on this plane.")
@click.option("--ecn-prob", default=1.0, show_default=True, type=float,
              callback=_num_in(0.0, 1.0, lo_open=True), help="CE probability there, (0, 1].")
@click.option("--blackhole-plane", "blackholes", multiple=True,
              callback=_ranged(lambda n, v: limits.integer(f"the number of {n}", len(v), 0,
                                                           limits.MAX_BLACKHOLES)),
              help="N@T or N@T-T2 (heals at T2); up to 64.")
@click.option("--jitter", default="0", show_default=True, callback=_DELAY,
              help="Uniform per-packet extra delay, 0..1s.")
@click.option("--delay", default="2us", show_default=True, callback=_DELAY, help="One-way link delay, 0..1s.")
@click.option("--rate", default=100.0, show_default=True, type=float,
              callback=_ranged(lambda n, v: limits.rate_gbps(n, v, zero_is_infinite=True)),
              help="Port rate, Gb/s: 0.000001..1600, or 0 (infinite).")
@click.option("--cc", type=click.Choice(["nscc", "null"]), default="nscc", show_default=True)
@click.option("--mpr", default=8, show_default=True, type=int, callback=_int_in(1, 8),
              help="PSN window, units of 128, 1..8.")
@click.option("--seed", default=1, show_default=True, type=int, callback=_SEED, help="0..2^32-1.")
@click.option("--settle", default="0", show_default=True, callback=_AT_TIME,
              help="Keep running after completion, 0..10s.")
@click.option("--profile", is_flag=True, help="cProfile the run; add the top functions.")
@json_option
@click.pass_obj
def loopback_cmd(
    out: Output, size: str, planes: int, evs: int, loss: float, trim: float, ecn_plane: int | None,
    ecn_prob: float, blackholes: tuple[str, ...], jitter: str, delay: str, rate: float, cc: str, mpr: int,
    seed: int, settle: str, profile: bool,
) -> None:
    """WRITE a random buffer between two engines over an impaired multi-plane loopback fabric."""
    nbytes = parse_size(size)
    if evs < planes or evs > 1 << 14:
        raise UsageError(f"evs must be {planes}..16384 (at least one per plane)")
    ecn: dict[int, float] = {}
    if ecn_plane is not None:
        if not 0 <= ecn_plane < planes:
            raise UsageError(f"ecn plane {ecn_plane} does not exist (planes 0..{planes - 1})")
        if not 0.0 < ecn_prob <= 1.0:
            raise UsageError("ecn-prob must be in (0, 1]")
        ecn[ecn_plane] = ecn_prob
    fabric = FabricConfig(
        planes=planes, delay_ns=parse_time(delay), jitter_ns=parse_time(jitter), rate_gbps=rate,
        loss=_prob("loss", loss), trim=_prob("trim", trim), ecn=ecn,
        blackholes=[parse_blackhole(b, planes) for b in blackholes],
    )
    cfg = LoopbackConfig(
        size=nbytes, evs=evs, cc=cc, seed=seed, settle_ns=parse_time(settle), attr=QpAttr(mpr=mpr),
        fabric=fabric, profile=profile,
    )
    _library(cfg.check)
    out.progress(f"loopback: {nbytes} bytes over {planes} planes x {evs // planes} EVs ...")
    doc = loopback(cfg)
    out.emit(doc, _render)
    if not (doc["completed"] and doc["bit_exact"]):  # the document says why; the status says that it failed
        raise click.exceptions.Exit(1)


def _render(doc: dict[str, Any]) -> str:
    r = doc["retransmits"]
    yes = {True: "yes", False: "NO"}
    lines = [
        f"completed      {yes[doc['completed']]}   bit-exact {yes[doc['bit_exact']]}"
        f"   status {','.join(doc['status']) or '-'}",
        f"virtual time   {doc['sim_time_s'] * 1e3:.3f} ms   goodput {doc['goodput_gbps']} Gb/s",
        f"wall time      {doc['wall_s']:.3f} s   engine {doc['engine_pps']} data packets/s",
        f"data packets   {doc['data_packets']}   sacks {doc['sacks']}   nacks {doc['nacks']}"
        f"   trims {doc['trims']}   ecn marks {doc['ecn_marked']}",
        "retransmits    " + "  ".join(f"{k} {v}" for k, v in r.items()),
        f"window         cwnd {doc['cwnd_bytes']} B   srtt {doc['srtt_ns']} ns"
        f"   max outstanding {doc['max_outstanding_psns']} PSNs",
        "",
    ]
    rows = [
        {"plane": p, "share": doc["plane_share"][i], **doc["ev_states"][p]}
        for i, p in enumerate(doc["ev_states"])
    ]
    lines.append(
        table(rows, [("plane", "PLANE"), ("share", "BYTE SHARE"), ("GOOD", "GOOD"),
                     ("ASSUMED_BAD", "ASSUMED_BAD"), ("DENIED", "DENIED")])
    )
    ev = doc["events"]
    if ev:
        lines.append("")
        lines.append(f"EV events: {len(ev)} (first 10)")
        lines.append(
            table(ev[:10], [("t_ns", "T_NS"), ("ev_index", "EV"), ("port", "PORT"), ("state", "STATE"),
                            ("lost", "LOST")])
        )
    if "profile" in doc:
        lines.append("")
        lines.append(table(doc["profile"], [("function", "FUNCTION"), ("calls", "CALLS"),
                                            ("tottime_s", "SELF S"), ("cumtime_s", "CUM S")]))
    return "\n".join(lines)


# ====================================================================================== sim run


@sim.group("run")
def run_group() -> None:
    """Experiments on a simulated multi-plane Clos: MRC against ECMP single-path (docs/sim.md)."""


def _fabric_options(
    planes: int, spines: int, hosts_per_leaf: int | None, leaves: int | None
) -> Callable[[_F], _F]:
    def deco(f: _F) -> _F:
        for opt in reversed([
            click.option("--planes", default=planes, show_default=True, type=int,
                         callback=_int_in(1, topology.MAX_PLANES), help="Planes (NIC ports), 1..16."),
            click.option("--spines", default=spines, show_default=True, type=int,
                         callback=_int_in(1, topology.MAX_INDEX), help="Spines per plane, 1..256."),
            click.option("--hosts-per-leaf", default=hosts_per_leaf, type=int,
                         callback=_int_in(1, topology.MAX_HOSTS),
                         help="Hosts per leaf [default: spines, full bisection]; hosts 2..2048 in all."),
            click.option("--leaves", default=leaves, type=int, callback=_int_in(1, topology.MAX_INDEX),
                         help="Leaves per plane, 1..256."),
            click.option("--rate", default=100.0, show_default=True, type=float, callback=_RATE,
                         help="Link rate, Gb/s, 0.000001..1600."),
            click.option("--delay", default="500ns", show_default=True, callback=_DELAY,
                         help="Propagation delay per link, 0..1s."),
            click.option("--buffer", "buffer_", default="512K", show_default=True,
                         callback=_size_in(1, limits.MAX_BUFFER_BYTES),
                         help="Switch port buffer (drop above), one packet..1G."),
            click.option("--ecn", default=None, callback=_size_in(1, limits.MAX_BUFFER_BYTES),
                         help="ECN-CE marking threshold, at most the buffer [default: buffer / 4]."),
            click.option("--trim-at", default=None, callback=_size_in(1, limits.MAX_BUFFER_BYTES),
                         help="Trimming threshold, at most the buffer [default: buffer / 2]."),
            click.option("--topology", "topo_file", default=None, type=click.Path(dir_okay=False),
                         help="A topology TOML file (shape, rate, delay, buffer) instead of the options."),
            click.option("--variants", default=None, help=f"Comma-separated, of: {', '.join(VARIANTS)}."),
            click.option("--evs", default=128, show_default=True, type=int, callback=_EVS,
                         help="EVs per QP profile, planes..16384."),
            click.option("--timeout", default=8, show_default=True, type=int,
                         callback=_int_in(0, limits.MAX_TIMEOUT_EXP),
                         help="ACK timeout exponent (1.024 us x 2^t), 0..24."),
            click.option("--seed", default=1, show_default=True, type=int, callback=_SEED,
                         help="0..2^32-1."),
            click.option("--plot", "plot_path", default=None, callback=output_file("plot", PLOT_SUFFIXES),
                         help="Write a PNG plot here (plot extra; .png, .pdf or .svg)."),
            click.option("--jobs", default=None, type=int, callback=_int_in(1, MAX_JOBS),
                         help="Variants simulated at once (1..256), each in its own process [default: "
                              "the CPUs available]; 1 runs them one after another in this process."),
            json_option,
        ]):
            f = opt(f)
        return f

    return deco


def _spec(
    planes: int, spines: int, hosts_per_leaf: int | None, leaves: int, rate: float, delay: str, buffer_: str,
    ecn: str | None, trim_at: str | None, variants: str | None, default_variants: tuple[str, ...], evs: int,
    timeout: int, seed: int, topo_file: str | None, reconverge_ns: int = 1_000_000,
) -> exps.RunSpec:
    vs = tuple(v.strip() for v in variants.split(",")) if variants else default_variants
    bad = [v for v in vs if v not in VARIANTS]
    if bad or not vs:
        raise UsageError(f"unknown variant {', '.join(bad) or '(none)'}: choose from {', '.join(VARIANTS)}")
    if not 0 <= timeout <= 24:
        raise UsageError("timeout must be 0..24")
    k = parse_size(ecn) if ecn is not None else None
    trim = parse_size(trim_at) if trim_at is not None else None
    if topo_file is not None:
        try:
            fs = exps.FabricSpec.from_file(str(topology.example_path(topo_file)), k, trim)
        except ValueError as e:
            raise UsageError(str(e)) from None
        planes = fs.planes
    else:
        if not 1 <= planes <= 16:
            raise UsageError("planes must be 1..16")
        if not 1 <= spines <= 256:
            raise UsageError("spines must be 1..256")
        hpl = spines if hosts_per_leaf is None else hosts_per_leaf
        if hpl < 1:
            raise UsageError("hosts per leaf must be at least 1")
        if not 1 <= leaves <= 256 or leaves * hpl > 2048:
            raise UsageError(f"{leaves} leaves x {hpl} hosts: the model holds 2..2048 hosts and 1..256 "
                             "leaves")
        if rate <= 0:
            raise UsageError("rate must be positive")
        buf = parse_size(buffer_)
        if (k is not None and k > buf) or (trim is not None and trim > buf):
            raise UsageError("the ECN and trimming thresholds must not exceed the buffer")
        fs = _library(lambda: exps.FabricSpec(
            planes=planes, leaves=leaves, spines=spines, hosts_per_leaf=hpl, rate_gbps=rate,
            delay_ns=parse_time(delay), buffer_bytes=buf, ecn_bytes=buf // 4 if k is None else k,
            trim_bytes=buf // 2 if trim is None else trim,
        ))
    if not fs.ecn_bytes <= fs.buffer_bytes or not fs.trim_bytes <= fs.buffer_bytes:
        raise UsageError("the ECN and trimming thresholds must not exceed the buffer")
    if evs < planes or evs > 1 << 14:
        raise UsageError(f"evs must be {planes}..16384 (at least one per plane)")
    return _library(lambda: exps.RunSpec(fabric=fs, variants=vs, seed=seed, evs=evs, timeout=timeout,
                                         reconverge_ns=reconverge_ns))


def _finish(out: Output, doc: dict[str, Any], plot_path: str | None, render: Callable[[Any], str]) -> None:
    if plot_path:
        from mrc.sim.plot import plot

        doc["plot"] = plot(doc, plot_path)
    out.emit(doc, render)


def _runner(jobs: int | None) -> exps.VariantMap:
    """The variants' runs in worker processes, `jobs` at a time."""
    n = default_jobs() if jobs is None else jobs
    if n < 1:
        raise UsageError("jobs must be at least 1")
    return ForkMap(n)


def _speed_line(doc: dict[str, Any]) -> str:
    return (f"speed: {doc['packet_hops']:,} packet-hops in {doc['sim_wall_s']:.1f} s = "
            f"{doc['hops_per_s']:,} hops/s ({doc['events_per_s']:,} events/s, {doc['workers']} worker"
            f"{'s' if doc['workers'] != 1 else ''}); one event loop: {doc['hops_per_loop_s']:,} hops/s, "
            f"{doc['hops_per_cpu_s']:,} per CPU second")


@run_group.command("permutation")
@click.option("--hosts", default=64, show_default=True, type=int, callback=_int_in(2, topology.MAX_HOSTS),
              help="Hosts (leaves = hosts / per leaf), 2..2048.")
@click.option("--duration", default="200us", show_default=True, callback=_SIM_TIME,
              help="Simulated time, 1ns..10s.")
@click.option("--warmup", default="50us", show_default=True, callback=_AT_TIME,
              help="Excluded from the throughput, shorter than the duration.")
@_fabric_options(planes=8, spines=8, hosts_per_leaf=None, leaves=None)
@click.pass_obj
def permutation_cmd(
    out: Output, hosts: int, duration: str, warmup: str, planes: int, spines: int,
    hosts_per_leaf: int | None, leaves: int | None, rate: float, delay: str, buffer_: str, ecn: str | None,
    trim_at: str | None, topo_file: str | None, variants: str | None, evs: int, timeout: int, seed: int,
    plot_path: str | None, jobs: int | None,
) -> None:
    """Every host sends to another (random permutation): per-host throughput as a fraction of capacity."""
    hpl = spines if hosts_per_leaf is None else hosts_per_leaf
    lv = 1
    if topo_file is None:
        if hpl < 1 or hosts % hpl:
            raise UsageError(f"hosts ({hosts}) must be a multiple of hosts per leaf ({hpl})")
        lv = hosts // hpl if leaves is None else leaves
        if lv * hpl != hosts:
            raise UsageError(f"{lv} leaves x {hpl} hosts per leaf is not {hosts} hosts")
    spec = _spec(planes, spines, hpl, lv, rate, delay, buffer_, ecn, trim_at, variants, ("ecmp", "mrc"),
                 evs, timeout, seed, topo_file)
    dur, wu = parse_time(duration), parse_time(warmup)
    if not 0 <= wu < dur:
        raise UsageError("warmup must be shorter than the duration")
    _library(lambda: exps.check_run(spec, dur, spec.fabric.hosts))
    doc = exps.permutation(spec, dur, wu, progress=out.progress, run_all=_runner(jobs))
    _finish(out, doc, plot_path, _render_permutation)


@run_group.command("degraded")
@click.option("--hosts", default=64, show_default=True, type=int, callback=_int_in(2, topology.MAX_HOSTS),
              help="Hosts (leaves = hosts / per leaf), 2..2048.")
@click.option("--link", "link_", default=None, help="Leaf-spine link to slow down, A-B [default: p0l0-p0s0].")
@click.option("--factor", default=0.1, show_default=True, type=float,
              callback=_num_in(0.0, 1.0, lo_open=True),
              help="Its rate, as a fraction of the others', (0, 1].")
@click.option("--duration", default="200us", show_default=True, callback=_SIM_TIME,
              help="Simulated time, 1ns..10s.")
@click.option("--warmup", default="50us", show_default=True, callback=_AT_TIME,
              help="Excluded from the throughput, shorter than the duration.")
@_fabric_options(planes=8, spines=8, hosts_per_leaf=None, leaves=None)
@click.pass_obj
def degraded_cmd(
    out: Output, hosts: int, link_: str | None, factor: float, duration: str, warmup: str, planes: int,
    spines: int, hosts_per_leaf: int | None, leaves: int | None, rate: float, delay: str, buffer_: str,
    ecn: str | None, trim_at: str | None, topo_file: str | None, variants: str | None, evs: int, timeout: int,
    seed: int, plot_path: str | None, jobs: int | None,
) -> None:
    """The permutation with one leaf-spine link slowed to FACTOR of its rate, routing unchanged."""
    hpl = spines if hosts_per_leaf is None else hosts_per_leaf
    if hpl < 1 or hosts % hpl:
        raise UsageError(f"hosts ({hosts}) must be a multiple of hosts per leaf ({hpl})")
    lv = hosts // hpl if leaves is None else leaves
    spec = _spec(planes, spines, hpl, lv, rate, delay, buffer_, ecn, trim_at, variants, ("ecmp", "mrc"),
                 evs, timeout, seed, topo_file)
    if not 0 < factor <= 1:
        raise UsageError("factor must be in (0, 1]")
    link = None
    if link_:
        parts = link_.split("-")
        if len(parts) != 2:
            raise UsageError(f"bad link {link_!r} (example: p0l0-p0s0)")
        try:
            lk = spec.fabric.topology().link_between(parts[0], parts[1])
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
        if lk.kind != "leaf-spine":
            raise UsageError("slow down a leaf-spine link")
        link = (lk.a, lk.b)
    dur, wu = parse_time(duration), parse_time(warmup)
    if not 0 <= wu < dur:
        raise UsageError("warmup must be shorter than the duration")
    _library(lambda: exps.check_run(spec, dur, spec.fabric.hosts))
    _library(lambda: exps.degraded_link(spec, link, factor))
    doc = exps.degraded(spec, link, factor, dur, wu, progress=out.progress, run_all=_runner(jobs))
    _finish(out, doc, None, _render_degraded)


def _us(seconds: float | None) -> str:
    """A time in microseconds, or "not recovered" (a connection still stalled when the run ended)."""
    return "not recovered" if seconds is None else f"{seconds * 1e6:.1f}"


def _render_degraded(doc: dict[str, Any]) -> str:
    c = doc["config"]
    def f3(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    rows = [{"variant": v, "cap": f"{r['capacity_fraction']:.1%}", "min": f3(r["flow_fraction_min"]),
             "fair": f3(r["worst_flow_of_fair_share"]), "below": r["flows_below_half_fair_share"],
             "through": f"{r['flows_through_slow_link']} / {f3(r['worst_flow_through_slow_link'])}",
             "load": f3(r["slow_link_load"])} for v, r in doc["results"].items()]
    ref = doc["reference"]
    return "\n".join([
        f"degraded: link {'-'.join(c['link'])} at {c['factor']:g} of its rate; smallest fair share "
        f"{c['fair_share_min']:.3f} of a host",
        "",
        table(rows, [("variant", "VARIANT"), ("cap", "CAPACITY"), ("min", "WORST FLOW"),
                     ("fair", "WORST / FAIR SHARE"), ("below", "FLOWS < 1/2 FAIR"),
                     ("through", "FLOWS VIA SLOW LINK / WORST"), ("load", "SLOW LINK LOAD")]),
        "(slow link load: its bytes over the other leaf-spine links' mean; a full-rate link ~1)",
        "",
        f"htsim (Broadcom/csg-htsim), same shape: ECMP worst flow {ref['htsim_ecmp_worst_flow'][0]}-"
        f"{ref['htsim_ecmp_worst_flow'][1]}, spraying worst {ref['htsim_spraying_worst_flow']}",
        _speed_line(doc),
    ])


def _render_permutation(doc: dict[str, Any]) -> str:
    c = doc["config"]
    f = c["fabric"]
    rows = []
    for v, r in doc["results"].items():
        rows.append({"variant": v, "cap": f"{r['capacity_fraction']:.1%}",
                     "min": f"{r['flow_fraction_min']:.1%}",
                     "p50": f"{r['flow_fraction_p50']:.1%}", "max": f"{r['flow_fraction_max']:.1%}",
                     "retx": r["retx_packets"], "drops": sum(r["drops"].values()), "trims": r["trims"],
                     "wall": r["wall_s"]})
    lines = [
        f"permutation: {f['leaves'] * f['hosts_per_leaf']} hosts, {f['planes']} planes x {f['leaves']}"
        f" leaves x {f['spines']} spines, {f['rate_gbps']:g} Gb/s links, host capacity"
        f" {c['host_capacity_gbps']} Gb/s of payload,"
        f" measured over {(c['duration_ns'] - c['warmup_ns']) / 1e3:g} us",
        "",
        table(rows, [("variant", "VARIANT"), ("cap", "OF CAPACITY"), ("min", "HOST MIN"), ("p50", "HOST P50"),
                     ("max", "HOST MAX"), ("retx", "RETX"), ("drops", "DROPS"), ("trims", "TRIMS"),
                     ("wall", "WALL S")]),
    ]
    e = doc["results"].get("ecmp")
    if e and "derived_expected" in e:
        lines += ["", f"ECMP derived (max-min fair, random hashing): expected {e['derived_expected']:.1%}, "
                      f"for this run's hash draw {e['derived_this_draw']:.1%}, uplink-only bound "
                      f"{e['uplink_only_bound']:.1%}; measured {e['capacity_fraction']:.1%}"]
    lines += ["", _speed_line(doc)]
    if "plot" in doc:
        lines.append(f"plot: {doc['plot']}")
    return "\n".join(lines)


@run_group.command("failover")
@click.option("--duration", default="2ms", show_default=True, callback=_SIM_TIME,
              help="Simulated time, 1ns..10s.")
@click.option("--link", "link_", default=None,
              help="Link to fail, A-B [default: p0l0-p0s<last>]; all-of-LEAF (all-of-p0l0; all-of-leaf0 "
                   "is p0l0): each leaf-spine link of that leaf in turn, with the worst case.")
@click.option("--fail-at", default="500us", show_default=True, callback=_AT_TIME,
              help="When the link goes down: at least two bins in, and a bin before the end.")
@click.option("--heal-at", default=None, callback=_AT_TIME,
              help="When it comes back, a bin or more after fail-at [default: never].")
@click.option("--flap", default="0", show_default=True, callback=_AT_TIME,
              help="Toggle the link every T from fail-at on (0: no flapping; at most 10000 changes).")
@click.option("--bin", "bin_", default="10us", show_default=True, callback=_SIM_TIME,
              help="Goodput timeline resolution: at most a quarter of the run, at most 100000 bins.")
@click.option("--reconverge", default="1ms", show_default=True, callback=_DELAY,
              help="ECMP routing convergence after a link change (baseline), 0..1s.")
@_fabric_options(planes=4, spines=4, hosts_per_leaf=None, leaves=2)
@click.pass_obj
def failover_cmd(
    out: Output, duration: str, link_: str | None, fail_at: str, heal_at: str | None, flap: str, bin_: str,
    reconverge: str, planes: int, spines: int, hosts_per_leaf: int | None, leaves: int | None, rate: float,
    delay: str, buffer_: str, ecn: str | None, trim_at: str | None, topo_file: str | None,
    variants: str | None, evs: int, timeout: int, seed: int, plot_path: str | None, jobs: int | None,
) -> None:
    """A bulk transfer leaf 0 -> leaf 1 across a leaf-spine link failure (or a flapping link)."""
    spec = _spec(planes, spines, hosts_per_leaf, leaves or 2, rate, delay, buffer_, ecn, trim_at, variants,
                 ("ecmp", "mrc"), evs, timeout, seed, topo_file, parse_time(reconverge))
    if spec.fabric.leaves < 2:
        raise UsageError("failover needs at least two leaves")
    dur, t_fail = parse_time(duration), parse_time(fail_at)
    t_heal = parse_time(heal_at) if heal_at else NEVER
    bin_ns, flap_ns = parse_time(bin_), parse_time(flap)
    if not 0 < t_fail < dur:
        raise UsageError("fail-at must lie inside the run")
    if t_heal <= t_fail:
        raise UsageError("heal-at must come after fail-at")
    if not 0 < bin_ns <= dur // 4:
        raise UsageError("bin must be positive and at most a quarter of the duration")
    if t_fail < 2 * bin_ns:
        raise UsageError(f"fail-at must leave two bins (2 x --bin = {2 * bin_ns} ns) before the failure: "
                         "the goodput before it is measured over them")
    _library(lambda: exps.check_failover_times(dur, t_fail, t_heal, flap_ns, bin_ns))
    _library(lambda: exps.check_run(spec, dur, spec.fabric.hosts_per_leaf))
    link = None
    if link_ and link_.startswith("all-of-"):
        leaf = link_.removeprefix("all-of-")
        leaf = {"leaf0": "p0l0"}.get(leaf, leaf)
        topo = spec.fabric.topology()
        links = sorted(((lk.a, lk.b) for lk in topo.links()
                        if lk.kind == "leaf-spine" and leaf in (lk.a, lk.b)),
                       key=lambda ab: topo.node(ab[1]).index)
        if not links:
            raise UsageError(f"no leaf-spine link touches {leaf!r} (example: all-of-p0l0)")
        if heal_at or flap_ns:
            raise UsageError("--link all-of-... fails each link for good: no --heal-at or --flap")
        sweep = exps.failover_sweep(spec, links, dur, t_fail, bin_ns, progress=out.progress,
                                    run_all=_runner(jobs))
        out.emit(sweep, _render_failover_sweep)
        return
    if link_:
        parts = link_.split("-")
        topo = spec.fabric.topology()
        if len(parts) != 2:
            raise UsageError(f"bad link {link_!r} (example: p0l0-p0s1)")
        try:
            lk = topo.link_between(parts[0], parts[1])
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
        if lk.kind != "leaf-spine":
            raise UsageError("fail a leaf-spine link (host links take a whole port: use more planes)")
        link = (parts[0], parts[1])
    doc = exps.failover(spec, dur, t_fail, t_heal, link, flap_ns, bin_ns, progress=out.progress,
                        run_all=_runner(jobs))
    _finish(out, doc, plot_path, _render_failover)


def _render_failover(doc: dict[str, Any]) -> str:
    c = doc["config"]
    rows = []
    for v, r in doc["results"].items():
        rows.append({"variant": v, "before": f"{r['goodput_fraction_before']:.1%}",
                     "during": f"{r['goodput_fraction_during_failure']:.1%}",
                     "min": f"{r['goodput_fraction_min_bin']:.1%}",
                     "reroute": _us(r['reroute_s']), "stall": f"{r['max_stall_s'] * 1e6:.0f}",
                     # a connection still stalled at the end: its REROUTE figure is no recovery
                     "unrec": r.get("connections_not_recovered", 0),
                     "retx": r["retx_bytes"], "rto": r["rto_count"]})
    req = next(iter(doc["results"].values()))["required_fraction"]
    lines = [
        f"failover: link {'-'.join(c['link'])} down at {c['fail_ns'] / 1e3:g} us"
        + (f", flapping every {c['flap_ns'] / 1e3:g} us" if c["flap_ns"] else "")
        + (f", up at {c['heal_ns'] / 1e3:g} us" if c["heal_ns"] else "")
        + f"; failed share of paths {c['failed_share_of_paths']:.2%}; capacity {c['capacity_gbps']} Gb/s",
        "",
        table(rows, [("variant", "VARIANT"), ("before", "BEFORE"), ("during", "DURING FAILURE"),
                     ("min", f"MIN {c['bin_ns'] / 1e3:g}us BIN"), ("reroute", "REROUTE US"),
                     ("stall", "MAX STALL US"), ("unrec", "NOT RECOVERED"), ("retx", "RETX BYTES"),
                     ("rto", "RTOS")]),
        "",
        f"required during failure: (1 - failed share) x 90% = {req:.1%}",
        _speed_line(doc),
    ]
    if "plot" in doc:
        lines.append(f"plot: {doc['plot']}")
    return "\n".join(lines)


def _render_failover_sweep(doc: dict[str, Any]) -> str:
    rows = []
    for run in doc["runs"]:
        for v, r in run["results"].items():
            rows.append({"link": "-".join(run["link"]), "variant": v,
                         "during": f"{r['goodput_fraction_during_failure']:.1%}",
                         "required": f"{r['required_fraction']:.1%}",
                         "min": f"{r['goodput_fraction_min_bin']:.1%}", "zero": run["zero_bins"][v],
                         "reroute": _us(r['reroute_s']), "stall": f"{r['max_stall_s'] * 1e6:.0f}"})
    cols = [("link", "LINK"), ("variant", "VARIANT"), ("during", "DURING FAILURE"), ("required", "REQUIRED"),
            ("min", "MIN BIN"), ("zero", "ZERO BINS"), ("reroute", "REROUTE US"), ("stall", "MAX STALL US")]
    worst = []
    for v, w in doc["worst"].items():
        worst.append({"link": "worst", "variant": v,
                      "during": f"{w['goodput_fraction_during_failure']['value']:.1%} "
                                f"({w['goodput_fraction_during_failure']['link']})",
                      "required": "all met" if w["all_meet_required"] else "NOT MET",
                      "min": f"{w['goodput_fraction_min_bin']['value']:.1%}", "zero": w["zero_bins"],
                      "reroute": f"{_us(w['reroute_s']['value'])} ({w['reroute_s']['link']})",
                      "stall": f"{w['max_stall_s']['value'] * 1e6:.0f}"})
    return "\n".join([f"failover on each of {len(doc['runs'])} links, one run each", "",
                      table(rows + worst, cols),
                      f"speed: {doc['packet_hops']:,} packet-hops in {doc['sim_wall_s']:.1f} s"])


@run_group.command("incast")
@click.option("--senders", default=16, show_default=True, type=int, callback=_int_in(1, 255),
              help="Senders (N-to-1), 1..255.")
@click.option("--size", default="256K", show_default=True, callback=_size_in(1, limits.MAX_BUFFERS_BYTES),
              help="Bytes each sender WRITEs; senders x size at most 1G.")
@click.option("--time-limit", default="50ms", show_default=True, callback=_SIM_TIME,
              help="Simulated time limit, 1ns..10s.")
@_fabric_options(planes=4, spines=4, hosts_per_leaf=8, leaves=None)
@click.pass_obj
def incast_cmd(
    out: Output, senders: int, size: str, time_limit: str, planes: int, spines: int,
    hosts_per_leaf: int | None, leaves: int | None, rate: float, delay: str, buffer_: str, ecn: str | None,
    trim_at: str | None, topo_file: str | None, variants: str | None, evs: int, timeout: int, seed: int,
    plot_path: str | None, jobs: int | None,
) -> None:
    """N senders on other leaves WRITE to one host at once: completion times, RTOs, queues."""
    if not 1 <= senders <= 255:
        raise UsageError("senders must be 1..255")
    hpl = hosts_per_leaf or spines
    lv = leaves if leaves is not None else 1 + -(-senders // hpl)
    spec = _spec(planes, spines, hpl, lv, rate, delay, buffer_, ecn, trim_at, variants,
                 ("mrc", "mrc-notrim", "ecmp"), evs, timeout, seed, topo_file)
    try:
        doc = exps.incast(spec, senders, parse_size(size), parse_time(time_limit), progress=out.progress,
                         run_all=_runner(jobs))
    except ValueError as e:
        raise UsageError(str(e)) from None
    _finish(out, doc, plot_path, _render_incast)


def _render_incast(doc: dict[str, Any]) -> str:
    c = doc["config"]
    rows = []

    def us(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e6:.1f}"

    for v, r in doc["results"].items():
        rows.append({"variant": v, "done": f"{r['completed']}/{c['senders']}", "p50": us(r["p50_s"]),
                     "p99": us(r["p99_s"]), "max": us(r["max_s"]), "rto": r["rto_count"],
                     "retx": r["retx_packets"], "trims": r["trims"], "drops": sum(r["drops"].values()),
                     "qmax": r["queue_max_bytes"]})
    ideal = next(iter(doc["results"].values()))["ideal_s"]
    lines = [
        f"incast: {c['senders']} senders x {c['size_bytes']} bytes -> h0; the receiver's NIC drains it all"
        f" in {ideal * 1e6:.1f} us at best",
        "",
        table(rows, [("variant", "VARIANT"), ("done", "DONE"), ("p50", "P50 US"), ("p99", "P99 US"),
                     ("max", "MAX US"), ("rto", "RTOS"), ("retx", "RETX PKTS"), ("trims", "TRIMS"),
                     ("drops", "DROPS"), ("qmax", "MAX QUEUE B")]),
    ]
    r = doc["results"]
    if "mrc" in r and "mrc-notrim" in r and r["mrc"]["p99_s"] and r["mrc-notrim"]["p99_s"]:
        lines += ["", f"p99 with trimming / without: {r['mrc']['p99_s'] / r['mrc-notrim']['p99_s']:.2f}"]
    lines.append(_speed_line(doc))
    if "plot" in doc:
        lines.append(f"plot: {doc['plot']}")
    return "\n".join(lines)


@run_group.command("allreduce")
@click.option("--ranks", default=4, show_default=True, type=int, callback=_int_in(2, topology.MAX_HOSTS),
              help="Ranks (one per host, spread over the leaves), 2..hosts.")
@click.option("--size", default="16M", show_default=True, callback=_size_in(4, limits.MAX_BUFFERS_BYTES),
              help="float32 buffer bytes per rank; ranks x size at most 1G.")
@click.option("--bits", default=2.0, show_default=True, type=float, callback=_num_in(0.0, 8.0, lo_open=True),
              help="Bit budget per coordinate, 1/16..8 (a collective's smallest budget).")
@click.option("--scheme", type=click.Choice(COMPRESSIONS), default="eden-unbiased", show_default=True)
@click.option("--partial-sums", type=click.Choice(PARTIAL_SUMS), default="aware", show_default=True)
@click.option("--time-limit", default="1s", show_default=True, callback=_SIM_TIME,
              help="Simulated time limit, 1ns..10s.")
@_fabric_options(planes=4, spines=4, hosts_per_leaf=4, leaves=4)
@click.pass_obj
def allreduce_cmd(
    out: Output, ranks: int, size: str, bits: float, scheme: str, partial_sums: str, time_limit: str,
    planes: int, spines: int, hosts_per_leaf: int | None, leaves: int, rate: float, delay: str, buffer_: str,
    ecn: str | None, trim_at: str | None, topo_file: str | None, variants: str | None, evs: int, timeout: int,
    seed: int, plot_path: str | None, jobs: int | None,
) -> None:
    """Ring all-reduce time over the fabric: the collective's real message sizes, compressed and not."""
    from mrc.sim import collective as scoll

    if plot_path:
        raise UsageError("sim run allreduce has no plot")
    spec = _spec(planes, spines, hosts_per_leaf, leaves, rate, delay, buffer_, ecn, trim_at, variants,
                 ("mrc", "ecmp"), evs, timeout, seed, topo_file)
    nbytes = parse_size(size)
    if nbytes % 4:
        raise UsageError(f"--size {size} is not a whole number of float32 elements")
    cfg = Config(scheme, bits, partial_sums, seed=seed)
    try:
        doc = scoll.run(spec, ranks, nbytes, cfg, parse_time(time_limit), progress=out.progress,
                        run_all=_runner(jobs))
    except ValueError as e:
        raise UsageError(str(e)) from None
    out.emit(doc, _render_allreduce)


def _render_allreduce(doc: dict[str, Any]) -> str:
    c = doc["config"]
    rows = []

    def us(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e6:.1f}"

    for v, r in doc["results"].items():
        for case in ("compressed", "uncompressed"):
            x = r[case]
            rows.append({"variant": v, "case": case, "time": us(x["time_s"]),
                         "algbw": "-" if x["algbw_gbps"] is None else f"{x['algbw_gbps']:.2f}",
                         "busbw": "-" if x["busbw_gbps"] is None else f"{x['busbw_gbps']:.2f}",
                         "wire": x["wire_bytes"], "retx": x["retx_packets"],
                         "speedup": f"{r['speedup']:.2f}" if case == "compressed" and r["speedup"] else ""})
    lines = [
        f"allreduce: {c['ranks']} ranks (hosts {', '.join(f'h{h}' for h in c['hosts'])})"
        f" x {c['size_bytes']} bytes,"
        f" {c['scheme']} {c['bits']:g} bits, partial sums {c['partial_sums']}; ring, message sizes from the"
        " collective, compute time not simulated",
        "",
        table(rows, [("variant", "VARIANT"), ("case", "CASE"), ("time", "TIME US"), ("algbw", "ALGBW GB/s"),
                     ("busbw", "BUSBW GB/s"), ("wire", "WIRE B"), ("retx", "RETX PKTS"),
                     ("speedup", "SPEEDUP")]),
        _speed_line(doc),
    ]
    return "\n".join(lines)


from .sim_fluid import fluid_cmd  # noqa: E402  (mrcctl sim fluid: the flow-level model; not a cmd_* OBJECT module)

sim.add_command(fluid_cmd)
