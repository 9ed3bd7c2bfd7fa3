"""`mrcctl sim`: run the MRC engine in simulation.

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

import re
from collections.abc import Callable
from typing import Any, Final, TypeVar

import click

from mrc.errors import UsageError
from mrc.sim.loopback import NEVER, Blackhole, FabricConfig, LoopbackConfig, loopback
from mrc.transport import QpAttr

from .output import Output, table

_SIZE_UNITS: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_TIME_UNITS: Final = {"": 1, "ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
MAX_SIZE: Final = 4 << 30

_F = TypeVar("_F", bound=Callable[..., Any])


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise UsageError(f"bad size {text!r} (examples: 4096, 64K, 64M, 1G)")
    n = int(m.group(1)) * _SIZE_UNITS[m.group(2).upper()]
    if not 0 < n <= MAX_SIZE:
        raise UsageError(f"size must be 1 byte .. 4G, got {text!r}")
    return n


def parse_time(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s)?\s*", text)
    if not m:
        raise UsageError(f"bad time {text!r} (examples: 500us, 2ms, 1500)")
    return int(float(m.group(1)) * _TIME_UNITS[m.group(2) or ""])


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
    if end <= start:
        raise UsageError(f"blackhole {text!r} heals before it starts")
    return Blackhole(plane, start, end)


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    out = ctx.find_object(Output)
    if value and out is not None:
        out.json = True


def json_option(f: _F) -> _F:
    """`-j` after the verb as well (`mrcctl sim loopback -j`)."""
    return click.option(
        "-j", "--json", is_flag=True, expose_value=False, is_eager=True, callback=_set_json,
        help="Output one JSON document (same as mrcctl -j).",
    )(f)


@click.group()
def sim() -> None:
    """Run the MRC transport engine in simulation."""


def _prob(name: str, p: float) -> float:
    if not 0.0 <= p < 1.0:
        raise UsageError(f"{name} must be a probability in [0, 1), got {p}")
    return p


@sim.command("loopback")
@click.option("--size", default="64M", show_default=True, help="Bytes to WRITE (K/M/G suffixes).")
@click.option("--planes", default=4, show_default=True, type=int, help="Planes (ports per host).")
@click.option("--evs", default=128, show_default=True, type=int, help="EVs in the QP's profile.")
@click.option("--loss", default=0.0, show_default=True, type=float, help="Random loss probability.")
@click.option("--trim", default=0.0, show_default=True, type=float, help="Trim probability (data).")
@click.option("--ecn-plane", type=int, default=None, help="CE-mark data packets on this plane.")
@click.option("--ecn-prob", default=1.0, show_default=True, type=float, help="CE probability there.")
@click.option("--blackhole-plane", "blackholes", multiple=True, help="N@T or N@T-T2 (heals at T2).")
@click.option("--jitter", default="0", show_default=True, help="Uniform per-packet extra delay.")
@click.option("--delay", default="2us", show_default=True, help="One-way link delay.")
@click.option("--rate", default=100.0, show_default=True, type=float, help="Port rate, Gb/s.")
@click.option("--cc", type=click.Choice(["nscc", "null"]), default="nscc", show_default=True)
@click.option("--mpr", default=8, show_default=True, type=int, help="PSN window, units of 128.")
@click.option("--seed", default=1, show_default=True, type=int)
@click.option("--settle", default="0", show_default=True, help="Keep running after completion.")
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
    if not 1 <= planes <= 64:
        raise UsageError("planes must be 1..64")
    if evs < planes or evs > 1 << 14:
        raise UsageError(f"evs must be {planes}..16384 (at least one per plane)")
    if not 1 <= mpr <= 8:
        raise UsageError("mpr must be 1..8")
    if rate < 0:
        raise UsageError("rate must be >= 0 (0 = infinite)")
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
    out.progress(f"loopback: {nbytes} bytes over {planes} planes x {evs // planes} EVs ...")
    doc = loopback(cfg)
    out.emit(doc, _render)


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
                            ("drop_count", "DROPS")])
        )
    if "profile" in doc:
        lines.append("")
        lines.append(table(doc["profile"], [("function", "FUNCTION"), ("calls", "CALLS"),
                                            ("tottime_s", "SELF S"), ("cumtime_s", "CUM S")]))
    return "\n".join(lines)
