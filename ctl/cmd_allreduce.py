"""`mrcctl allreduce`: compressed all-reduce between ranks (docs/design.md §9, docs/collective.md).

    mrcctl allreduce --ranks N --size S [--bits B] [--scheme SCHEME] [--partial-sums naive|aware]
                     [--algorithm ring|oneshot] [--iters K] [--dist iid|correlated]
                     [--correlation RHO] [--seed S]
                     [--transport inproc|mrc] [--ranks-per-host K] [-n TESTBED] [--fail-link A:B@SECONDS]
                     [--heal-after SECONDS] [--sample-ms MS] [--rendezvous auto|tcpstore|file]
                     [--layout auto|flat|hier] [--intra SCHEME] [--hosts H] [--report FILE] [-j]

Prints one row per iteration — time, algbw and busbw (nccl-tests definitions), bytes on the wire (all
ranks), vNMSE against the exact float64 mean — and a summary row. `--transport inproc` runs the ranks as
threads of this process; `--transport mrc` runs rank processes on the hosts of a testbed that is up with
its daemons (`mrcctl testbed up --with-daemons`; one per host, or K per host host-major when the ranks
outnumber the hosts), exchanging chunks by WRITE-with-immediate through the hosts' mrcds and through
shared memory between ranks of one host (ctl/allreduce_mrc.py), with the same output (plus the bytes
that crossed MRC); `--fail-link` takes a leaf-spine link down
SECONDS after the first measured iteration started (and `--heal-after` brings it back). With several
ranks per host `--layout hier` runs the hierarchical all-reduce (the host's ranks reduce to its first
over shared memory, those leaders run the ring over MRC, the result comes back the same way) instead
of one flat ring over all ranks (`flat`); `--hosts H` is the same hierarchy in process.
"""

from __future__ import annotations

import os
import signal
import statistics
from typing import Any

import click

from mrc import units
from mrc.collective import ALGORITHMS, COMPRESSIONS, PARTIAL_SUMS, Config
from mrc.collective import bench as cbench
from mrc.collective.hier import LAYOUTS, intra_bits_for
from mrc.errors import UsageError

from .output import Output, json_option, output_file, table

TRANSPORTS = ("inproc", "mrc")


def parse_size(text: str) -> int:
    """Bytes (1048576, 4K, 64M, 1G, 64MiB: binary units); a whole number of float32 elements."""
    try:
        n = units.parse_size(text)
    except ValueError as e:
        raise UsageError(f"--size: {e}") from None
    if n % 4:
        raise UsageError(f"--size: {text} is not a whole number of float32 elements (multiple of 4 bytes)")
    if n > 1 << 34:
        raise UsageError(f"--size: {text} outside 4 B .. 16 GiB")
    return n


def _g(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render(doc: dict[str, Any]) -> str:
    c = doc["config"]
    head = (
        f"allreduce ranks={c['ranks']} size={c['size_bytes']} B scheme={c['scheme']}"
        + (f" bits={c['bits']:g} partial-sums={c['partial_sums']}" if c["scheme"] != "none" else "")
        + f" algorithm={c['algorithm']} transport={c['transport']} dist={c['dist']}"
    )
    if c.get("ranks_per_host", 1) > 1:
        head += f"\nranks per host: {c['ranks_per_host']} on {', '.join(c['hosts'])}"
    if c.get("hier_hosts"):
        per = c["ranks"] // c["hier_hosts"]
        head += (f"\nhierarchical: {c['hier_hosts']} hosts x {per} ranks; WIRE_B = bytes between hosts (the "
                 "leaders' ring), INTRA_B = within them")
    if c.get("bits_per_hop"):
        head += "\nbits per hop: " + " ".join(f"{b:g}" for b in c["bits_per_hop"])
    rows = []
    for r in doc["iterations"]:
        rows.append({
            "iter": r["iter"],
            "time": _g(r["time_s"] and r["time_s"] * 1e3, ".2f"),
            "algbw": _g(r["algbw_gbps"], ".4g"),
            "busbw": _g(r["busbw_gbps"], ".4g"),
            "wire": r["wire_bytes"] if r["wire_bytes"] is not None else "-",
            "mrc": r.get("wire_bytes_mrc", "-"),
            "intra": r.get("intra_host_bytes", "-"),
            "vnmse": _g(r["vnmse"], ".4g"),
            "down": r["failed_link_down"],
            "error": r.get("error", ""),
        })
    s = doc["summary"]
    if "failure" in doc:
        f = doc["failure"]
        downs = ", ".join(f"{d:.2f}" for d in f["down_s"]) or "never (the run ended first)"
        ups = ", ".join("-" if u is None else f"{u:.2f}" for u in f["up_s"])
        head += f"\nfailure: link {f['link']} down at {downs} s" + (f", up at {ups} s" if ups else "")
    rows.append({
        "iter": "median", "time": _g(s["median_time_s"] and s["median_time_s"] * 1e3, ".2f"),
        "algbw": "", "busbw": _g(s["median_busbw_gbps"], ".4g"),
        "wire": _g(s["mean_wire_bytes"], ".0f"), "mrc": _g(s.get("mean_wire_bytes_mrc"), ".0f"),
        "vnmse": _g(s["mean_vnmse"], ".4g") + " (mean)",
        "down": "", "error": f"errors={s['errors']}",
    })
    cols = [("iter", "ITER"), ("time", "TIME_ms"), ("algbw", "ALGBW_GB/s"), ("busbw", "BUSBW_GB/s"),
            ("wire", "WIRE_B"), ("vnmse", "vNMSE"), ("down", "LINK_DOWN"), ("error", "")]
    if c.get("ranks_per_host", 1) > 1:  # some hops stay within a host: show what crossed MRC
        cols.insert(5, ("mrc", "MRC_B"))
    if c.get("hier_hosts"):
        cols.insert(5, ("intra", "INTRA_B"))
    return head + "\n" + table(rows, cols)


@click.command("allreduce")
@click.option("--ranks", type=click.IntRange(1, 1024), default=4, show_default=True)
@click.option("--size", "size_text", default="4M", show_default=True, help="Buffer bytes per rank (float32).")
@click.option("--bits", type=click.FloatRange(0, 8, min_open=True), default=2.0, show_default=True)
@click.option("--scheme", type=click.Choice(COMPRESSIONS), default="eden-unbiased", show_default=True)
@click.option("--partial-sums", type=click.Choice(PARTIAL_SUMS), default="aware", show_default=True)
@click.option("--algorithm", type=click.Choice(ALGORITHMS), default="ring", show_default=True,
              help="ring: reduce-scatter + all-gather; oneshot: all-gather of compressed buffers.")
@click.option("--iters", type=click.IntRange(1, 100_000), default=5, show_default=True)
@click.option("--dist", type=click.Choice(cbench.DISTS), default="iid", show_default=True,
              help="Per-rank input buffers: independent, or half of the energy shared.")
@click.option("--correlation", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="aware: assumed pairwise correlation of the ranks' buffers (sizes the per-hop budgets).")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=0, show_default=True)
@click.option("--transport", type=click.Choice(TRANSPORTS), default="inproc", show_default=True,
              help="inproc: threads of this process; mrc: rank processes on the testbed hosts, over mrcd.")
@click.option("--ranks-per-host", type=click.IntRange(1, 1024), default=None, metavar="K",
              help="mrc: K rank processes per host, host-major (default: 1 when --ranks fits the hosts, "
              "else --ranks / hosts); co-located ranks exchange chunks through shared memory.")
@click.option("-n", "--name", default=None, metavar="NAME", help="mrc: the testbed (may be omitted when only "
              "one is up).")
@click.option("--fail-link", default=None, metavar="A:B@SECONDS",
              help="mrc: take link A-B down SECONDS after the first measured iteration started.")
@click.option("--heal-after", type=click.FloatRange(0, min_open=True), default=None, metavar="SECONDS",
              help="mrc: bring the failed link back after this.")
@click.option("--sample-ms", type=click.IntRange(0, 60_000), default=0, show_default=True,
              help="mrc: sample per-plane bytes sent every MS ms (adds 'timeline' to the report).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 3600), default=120.0, show_default=True,
              help="mrc: a rank gives up waiting for a chunk after this many seconds.")
@click.option("--rendezvous", type=click.Choice(["auto", "tcpstore", "file"]), default="auto",
              show_default=True, help="mrc: torch.distributed TCPStore (auto: when torch is importable) or "
              "JSON files in the run directory.")
@click.option("--hosts", "hier_hosts", type=click.IntRange(1, 1024), default=None, metavar="H",
              help="inproc: the ranks as H hosts (host-major) running the hierarchical all-reduce: reduce to "
              "each host's leader, compressed ring between the leaders, broadcast (docs/collective.md).")
@click.option("--intra", type=click.Choice(("none", *COMPRESSIONS[1:])), default="none", show_default=True,
              help="--hosts, or --layout hier: how ranks send to their leader (none: raw float32; or a "
              "scheme at 8 bits).")
@click.option("--layout", type=click.Choice(LAYOUTS), default="auto", show_default=True,
              help="mrc with several ranks per host: hier (reduce within each host first, ring between the "
              "hosts) or flat (one ring over every rank); auto: hier there, flat with one rank per host.")
@click.option("--report", "report_path", default=None, metavar="FILE", callback=output_file("report"),
              help="Also write the JSON document to FILE (the table still goes to stdout).")
@json_option
@click.pass_obj
def allreduce(
    out: Output, ranks: int, size_text: str, bits: float, scheme: str, partial_sums: str, algorithm: str,
    iters: int, dist: str, correlation: float, seed: int, transport: str, ranks_per_host: int | None,
    name: str | None, fail_link: str | None, heal_after: float | None, sample_ms: int, timeout_s: float,
    rendezvous: str, hier_hosts: int | None, intra: str, layout: str, report_path: str | None,
) -> None:
    """All-reduce of a float32 buffer across ranks with compressed chunks: time, bandwidth, wire bytes,
    error against the exact mean."""
    size = parse_size(size_text)
    cfg = Config(scheme, float(bits), partial_sums, algorithm, seed=seed, correlation=correlation)
    if transport == "inproc":
        if (fail_link or heal_after or sample_ms or rendezvous != "auto" or ranks_per_host is not None
                or layout != "auto"):
            raise UsageError("--fail-link, --heal-after, --sample-ms, --rendezvous, --ranks-per-host and "
                             "--layout need --transport mrc (in process: --hosts H for the hierarchy)")
        runner: cbench.Runner = cbench.InProcRunner()
        if hier_hosts is None and intra != "none":
            raise UsageError("--intra is how ranks send to their host's leader: with --hosts H in process")
        if hier_hosts is not None:
            if ranks % hier_hosts or algorithm != "ring":
                raise UsageError(f"--hosts {hier_hosts} needs --ranks a multiple of it and --algorithm ring")
            runner = cbench.HierInProcRunner(hier_hosts, intra, intra_bits_for(intra))
        out.progress(f"allreduce: {ranks} ranks, {size} B, {scheme}, {iters} iterations ({runner.name})")
        doc = cbench.run(runner, ranks, size, cfg, iters, dist=dist, seed=seed, progress=out.progress)
    else:
        if hier_hosts is not None:
            raise UsageError("--hosts H runs the hierarchy in this process (--transport inproc); over MRC "
                             "the hosts are the testbed's: --layout hier")
        if layout == "flat" and intra != "none":
            raise UsageError("--intra is how ranks send to their host's leader: --layout hier")
        doc = _run_mrc(out, ranks, size, cfg, iters, dist, seed, name, fail_link, heal_after, sample_ms,
                       timeout_s, rendezvous, ranks_per_host, layout, intra)
    if report_path is not None:
        import json
        from pathlib import Path

        tmp = Path(report_path + ".tmp")
        tmp.write_text(json.dumps(doc) + "\n")
        tmp.replace(report_path)
    out.emit(doc, render)
    if doc["summary"]["errors"]:
        raise click.exceptions.Exit(1)


def _run_mrc(out: Output, ranks: int, size: int, cfg: Config, iters: int, dist: str, seed: int,
             name: str | None, fail_link: str | None, heal_after: float | None, sample_ms: int,
             timeout_s: float, rendezvous: str = "auto", ranks_per_host: int | None = None,
             layout: str = "auto", intra: str = "none") -> dict[str, Any]:
    from mrc.dataplane import testbed as tbmod

    from .allreduce_mrc import MrcRunner
    from .bench import parse_fail_link

    if heal_after is not None and fail_link is None:
        raise UsageError("--heal-after needs --fail-link")
    testbed = tbmod.resolve_name(name)
    fl = parse_fail_link(fail_link) if fail_link else None
    out.progress(f"allreduce: {ranks} ranks on testbed {testbed}, {size} B, {cfg.scheme}, {iters} iterations "
                 "(mrc)")
    # SIGTERM (e.g. a script's trap) ends the run like Ctrl-C: the rank processes are ended by PID and a
    # failed link comes back up
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    old = signal.signal(signal.SIGTERM, _on_term)
    try:
        with MrcRunner(testbed, ranks, size, cfg.algorithm, fail_link=fl, heal_after=heal_after,
                       sample_s=sample_ms / 1e3, timeout_s=timeout_s, rendezvous=rendezvous,
                       ranks_per_host=ranks_per_host, layout=layout, intra=intra,
                       intra_bits=intra_bits_for(intra), progress=out.progress) as runner:
            doc = cbench.run(runner, ranks, size, cfg, iters, dist=dist, seed=seed, progress=out.progress)
            extra = runner.extra()
    finally:
        signal.signal(signal.SIGTERM, old)
    doc["config"].update({k: extra[k] for k in ("testbed", "hosts", "ranks_per_host", "rendezvous",
                                                "slot_bytes", "layout", "intra")})
    add_per_iteration(doc, extra["split_bytes"], ("wire_bytes_mrc", "wire_bytes_local"))
    add_per_iteration(doc, extra["rank_cpu"], ("rank_cpu_s", "rank_page_faults"))
    for k in ("failure", "timeline"):
        if k in extra:
            doc[k] = extra[k]
    return doc


def add_per_iteration(doc: dict[str, Any], per_step: dict[int, tuple[float, ...]],
                      fields: tuple[str, ...]) -> None:
    """Per iteration that completed, the runner's values for its step under `fields`; the summary gets
    their means as `mean_<field>`. The MRC runner's are `wire_bytes_mrc` and `wire_bytes_local`
    (message bytes that went through MRC / to co-located ranks by shared memory: `wire_bytes` is their
    sum), and `rank_cpu_s` and `rank_page_faults` (user + system seconds and minor page faults of all
    rank processes during the all-reduce; the mrcds' CPU is in `mrcctl stats`)."""
    ok = []
    for row in doc["iterations"]:
        if row.get("time_s") is not None and row["iter"] in per_step:
            row.update(zip(fields, per_step[row["iter"]], strict=True))
            ok.append(row)
    if ok:
        for f in fields:
            doc["summary"][f"mean_{f}"] = statistics.fmean(r[f] for r in ok)


_MAIN_PID = 0


def _on_term(_sig: int, _frame: object) -> None:
    if os.getpid() != _MAIN_PID:  # a forked helper (pyroute2's netns socket child) ends as by default
        os._exit(128 + signal.SIGTERM)
    raise KeyboardInterrupt
