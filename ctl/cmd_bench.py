"""`mrcctl bench`: perftest-style measurements over the testbed's mrcds (docs/daemon.md).

    mrcctl bench write --src H --dst H [--size S | -b MIN -e MAX -f FACTOR] [--iters N] [--planes LIST]
                       [--evs N] [--fail-link A:B@SECONDS] [--heal-after SECONDS]
                       [--baseline single-path|tcp|udp] [-j | --jsonl]
    mrcctl bench incast --dst H [--src H,H,H] [--size S] [--ecn-k B] [--trim-t B] [--buffer B]

The table has one row per size (bytes, iterations, BW peak / average / min in Gb/s, message rate, Gb/s
per plane, retransmits, trims); ``-j`` gives one JSON document (``config``, ``capacity_gbps``,
``bit_exact``, ``goodput_gbps``, ``goodput_fraction``, ``rows``, ``failure``, ``baseline``), ``--jsonl``
one row per line.
"""

from __future__ import annotations

import json
from typing import Any

import click

from mrc import units
from mrc.dataplane import testbed as tbmod
from mrc.errors import MrcError

from . import api, bench_remote
from .bench import BenchConfig, WriteBench, incast, parse_fail_link
from .cmd_testbed import name_option
from .output import Output, json_option, table


@click.group()
def bench() -> None:
    """Benchmarks over mrcds: write, incast (a testbed), serve (real hosts)."""


def _size(v: str, what: str) -> int:
    try:
        n = units.parse_size(v)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=what) from None
    if n <= 0:
        raise click.BadParameter("must be > 0", param_hint=what)
    return n



def failure_notes(f: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """Why a failure row has no figure ("-"), so an empty row is not read as a failure the transport
    missed: the transfer ended before the link failed, no EV of the QP crossed the link (the hosts share
    a leaf, or the link is on a plane not used), or the link was healed after the transfer ended."""
    notes = []
    if f.get("completed_before_failure"):
        notes.append("the transfer completed before the link failed: use a larger --size or an earlier time")
    elif f.get("evs_through_link") == 0:
        notes.append(f"no path of the QP {cfg['src']} -> {cfg['dst']} crosses {f['link']}: the hosts share "
                     "a leaf, or its plane is not used; nothing to detect")
    elif cfg.get("heal_after_s") is not None and not f.get("healed_during_transfer"):
        notes.append("the link was healed after the transfer ended: no restore to measure")
    return notes

def _render(doc: dict[str, Any]) -> str:
    rows = []
    planes = sorted({p for r in doc["rows"] for p in r["plane_gbps"]}, key=int)
    for r in doc["rows"]:
        rows.append({**r, **{f"p{p}": r["plane_gbps"].get(p) for p in planes}})
    cols = [("bytes", "#bytes"), ("iters", "#iterations"), ("bw_peak_gbps", "BW peak[Gb/s]"),
            ("bw_avg_gbps", "BW average[Gb/s]"), ("bw_min_gbps", "BW min[Gb/s]"), ("msg_rate", "MsgRate[/s]")]
    cols += [(f"p{p}", f"plane{p}[Gb/s]") for p in planes]
    cols += [("retransmits", "retx"), ("trims", "trims"), ("rto", "rto")]
    lines = [table(rows, cols), "",
             f"capacity {doc['capacity_gbps']:.3f} Gb/s  goodput {doc['goodput_gbps']:.4f} Gb/s "
             f"({doc['goodput_fraction'] * 100:.1f} %)  bit-exact: {'yes' if doc['bit_exact'] else 'NO'}"]
    f = doc.get("failure")
    if f:
        def ms(v: Any) -> str:
            return "-" if v is None else f"{v} ms"

        def pct(v: Any) -> str:
            return "-" if v is None else f"{v * 100:.1f} %"

        lines.append(f"failure {f['link']}: detect {ms(f['detect_ms'])}, deny {ms(f['deny_ms'])}, "
                     f"goodput while down {pct(f['goodput_fraction_during'])}, "
                     f"restore {ms(f['restore_ms'])}, "
                     f"goodput after {pct(f.get('goodput_fraction_after'))}")
        lines += [f"  ({why})" for why in failure_notes(f, doc["config"])]
    b = doc.get("baseline")
    if b:
        extra = ""
        if b["kind"] == "udp":
            extra = (f" ({b['rx_kpps']} kpps of {b['payload']} B over {b['evs']} EVs, "
                     f"delivered {b['delivered'] * 100:.1f} %)")
        lines.append(f"baseline {b['kind']}: {b['goodput_gbps']:.4f} Gb/s{extra}; "
                     f"MRC = {b.get('ratio', '-')} x")
    return "\n".join(lines)


def _render_remote(doc: dict[str, Any]) -> str:
    planes = sorted({p for r in doc["rows"] for p in r["plane_gbps"]}, key=int)
    rows = [{**r, **{f"p{p}": r["plane_gbps"].get(p) for p in planes}} for r in doc["rows"]]
    cols = [("bytes", "#bytes"), ("iters", "#iterations"), ("bw_peak_gbps", "BW peak[Gb/s]"),
            ("bw_avg_gbps", "BW average[Gb/s]"), ("msg_rate", "MsgRate[/s]")]
    cols += [(f"p{p}", f"plane{p}[Gb/s]") for p in planes]
    return "\n".join([table(rows, cols), "",
                      f"{doc['src']} -> {doc['dst']} (server {doc['server']}): bit-exact: "
                      f"{'yes' if doc['bit_exact'] else 'NO'}"])


@bench.command()
@click.option("--listen", default=f"[::]:{bench_remote.DEFAULT_PORT}", show_default=True,
              metavar="ADDR:PORT|PATH", help="Where `bench write --server` clients connect.")
@click.option("--once", is_flag=True, help="Serve one client, then exit.")
@click.option("--max-size", default="4G", show_default=True, metavar="BYTES",
              help="The largest buffer a client may ask for.")
@click.pass_obj
def serve(out: Output, listen: str, once: bool, max_size: str) -> None:
    """Serve WRITE benchmarks of other machines through this host's mrcd (perftest's server side).

    The destination of `mrcctl bench write --server ADDR:PORT` on a real host: each client gets a QP and
    a memory region here, and the digest of what landed in it."""
    n = bench_remote.serve(listen, once=once, max_size=_size(max_size, "--max-size"), log=out.progress)
    out.progress(f"bench serve: {n} client(s) served")


@bench.command()
@click.option("--src", default=None, help="Source host (runs the requester QP; testbed).")
@click.option("--dst", default=None, help="Destination host (testbed; on a real host: the machine whose "
              "`mrcctl bench serve` to use, HOST or HOST:PORT).")
@click.option("--server", default=None, metavar="ADDR:PORT|PATH",
              help="Real hosts: the destination's `mrcctl bench serve` (the source is this host's mrcd).")
@click.option("--size", "-s", default=None, metavar="BYTES", help="One message size (e.g. 256M).")
@click.option("-b", "min_size", default=None, metavar="BYTES", help="Smallest size of a sweep.")
@click.option("-e", "max_size", default=None, metavar="BYTES", help="Largest size of a sweep.")
@click.option("-f", "factor", type=click.IntRange(2, 1024), default=2, show_default=True,
              help="Sweep factor.")
@click.option("--iters", type=click.IntRange(1, 100000), default=1, show_default=True)
@click.option("--planes", default=None, metavar="LIST", help="Restrict the QP to these planes (0,2).")
@click.option("--evs", type=click.IntRange(1, 1 << 14), default=None, help="Restrict the QP to N EVs.")
@click.option("--fail-link", default=None, metavar="A:B@SECONDS", help="Take link A-B down SECONDS in.")
@click.option("--fail-mode", type=click.Choice(["down", "blackhole"]), default="down", show_default=True,
              help="down: set the link down (carrier lost); blackhole: its switch ports drop everything.")
@click.option("--heal-after", type=float, default=None, metavar="SECONDS", help="Bring it back after this.")
@click.option("--baseline", type=click.Choice(["single-path", "tcp", "udp"]), default=None)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--jsonl", is_flag=True, help="One JSON row per size, one per line.")
@name_option
@json_option
@click.pass_obj
def write(out: Output, src: str | None, dst: str | None, server: str | None, size: str | None,
          min_size: str | None, max_size: str | None,
          factor: int, iters: int, planes: str | None, evs: int | None, fail_link: str | None,
          fail_mode: str, heal_after: float | None, baseline: str | None, seed: int, jsonl: bool,
          name: str | None) -> None:
    """RDMA WRITE from SRC to DST through their mrcds: bandwidth, message rate, per-plane spread."""
    if size is not None and (min_size or max_size):
        raise click.UsageError("give --size or -b/-e, not both")
    if size is not None:
        sizes = [_size(size, "--size")]
    elif min_size or max_size:
        lo = _size(min_size or "4K", "-b")
        hi = _size(max_size or min_size or "4K", "-e")
        if hi < lo:
            raise click.UsageError("-e must be >= -b")
        sizes = []
        s = lo
        while s <= hi:
            sizes.append(s)
            s *= factor
    else:
        sizes = [64 << 20]
    plane_list = None
    if planes is not None:
        try:
            plane_list = sorted({int(p) for p in planes.split(",") if p.strip()})
        except ValueError:
            raise click.BadParameter(f"{planes!r}: expected a list like 0,2", param_hint="--planes") from None
    if heal_after is not None and fail_link is None:
        raise click.UsageError("--heal-after needs --fail-link")
    if server is None and src is None and dst is not None and name is None and api.local_socket() is not None:
        server = bench_remote.server_for(dst)  # a real host: DST's `mrcctl bench serve`
    if server is not None:
        if fail_link or baseline:
            raise click.UsageError("--fail-link and --baseline need a testbed (not --server)")
        out.progress(f"bench write -> {server}: sizes {sizes}, {iters} iteration(s)")
        doc = bench_remote.write(server, sizes, iters=iters, evs=evs, planes=plane_list, seed=seed)
        out.emit(doc, _render_remote)
        if not doc["bit_exact"]:
            raise MrcError("the destination buffer differs from the source (not bit-exact)")
        return
    if src is None or dst is None:
        raise click.UsageError("give --src and --dst (a testbed), or --server (real hosts)")
    cfg = BenchConfig(tbmod.resolve_name(name), src, dst, sizes, iters=iters, planes=plane_list, evs=evs,
                      fail_link=parse_fail_link(fail_link) if fail_link else None, heal_after=heal_after,
                      baseline=baseline, fail_mode=fail_mode, seed=seed)
    out.progress(f"bench write {src} -> {dst} on testbed {cfg.testbed}: sizes {sizes}, {iters} iteration(s)")
    doc = WriteBench(cfg, out.progress).run()
    if jsonl:
        for r in doc["rows"]:
            out.out.write(json.dumps(r) + "\n")
        out.out.flush()
    else:
        out.emit(doc, _render)
    if not doc["bit_exact"]:
        raise MrcError("the destination buffer differs from the source (not bit-exact)")


@bench.command(name="incast")
@click.option("--dst", required=True, help="The host every sender writes to.")
@click.option("--src", "srcs", default=None, metavar="LIST", help="Senders (default: every other host).")
@click.option("--size", "-s", default="8M", show_default=True, metavar="BYTES", help="Bytes per sender.")
@click.option("--ecn-k", default="8KiB", show_default=True, help="Switch ports toward DST: ECN threshold.")
@click.option("--trim-t", default="16KiB", show_default=True, help="... trimming threshold.")
@click.option("--buffer", default="256KiB", show_default=True, help="... buffer (drop above).")
@name_option
@json_option
@click.pass_obj
def incast_(out: Output, dst: str, srcs: str | None, size: str, ecn_k: str, trim_t: str, buffer: str,
            name: str | None) -> None:
    """N senders to one host at once through trimming switch ports: trims, NACK retransmits, timeouts."""
    tb = tbmod.resolve_name(name)
    hosts = tbmod.Testbed.load(tb).topo.host_names()
    senders = ([h for h in hosts if h != dst] if srcs is None
               else [h.strip() for h in srcs.split(",") if h.strip()])
    doc = incast(tb, dst, senders, _size(size, "--size"), ecn_k=_size(ecn_k, "--ecn-k"),
                 trim_t=_size(trim_t, "--trim-t"), buffer=_size(buffer, "--buffer"), progress=out.progress)

    def render(d: dict[str, Any]) -> str:
        t = table(d["senders"], [("src", "SRC"), ("bit_exact", "BIT-EXACT"), ("seconds", "SECONDS"),
                                 ("trim_nacks", "TRIM NACKS"), ("retx_trim", "RETX TRIM"),
                                 ("retx_sack", "RETX SACK"), ("retx_timeout", "RETX TIMEOUT"), ("rto", "RTO"),
                                 ("ecn_echoes", "ECN ECHOES")])
        return (t + f"\n\n{len(d['srcs'])} -> {d['dst']}: {d['goodput_gbps']:.4f} Gb/s of "
                f"{d['capacity_gbps']:.3f}; switch trims {d['switch_trims_total']}, buffer drops "
                f"{d['switch_buffer_drops_total']}, RTOs {d['rto']}")

    out.emit(doc, render)
    if not doc["bit_exact"]:
        raise MrcError("a destination buffer differs from its source (not bit-exact)")
