"""`mrcctl testbed`: the multi-plane SRv6 testbed in network namespaces (docs/design.md §6, docs/testbed.md).

    mrcctl testbed up [FILE] [--name N]         build FILE (default deploy/topologies/default.toml)
    mrcctl testbed down [--name N | --all]      remove it: processes, namespaces, links, state
    mrcctl testbed [show] [--name N]            nodes, links (state, rate), addresses, micro-SIDs
    mrcctl testbed list                         testbeds that are up
    mrcctl testbed ping [--src H] [--dst H]     one probe along every micro-SID path
    mrcctl testbed link down|up A B             fail / restore the link between nodes A and B
    mrcctl testbed link set A B --rate R        change a link's rate (both directions)
    mrcctl testbed routes NODE                  a node's IPv6 routes, SRv6 encaps decoded
    mrcctl testbed exec NODE -- CMD ...         run CMD inside NODE's namespace

``--name`` may be left out whenever exactly one testbed is up. ``ping`` exits 1 when a path that should
work (all its links up) does not answer.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from mrc import topology, units
from mrc.dataplane import netns
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.fabric import FabricDataplane, fail_link_now
from mrc.errors import MrcError, UsageError

from .output import Output, json_option, table

_F = TypeVar("_F", bound=Callable[..., Any])


def name_option(f: _F) -> _F:
    return click.option("-n", "--name", default=None, metavar="NAME",
                        help="Testbed name (namespace prefix); may be omitted when only one is up.")(f)


@click.group(invoke_without_command=True)
def testbed() -> None:
    """Multi-plane SRv6 testbed in network namespaces: up, down, start, show, ping, link, exec."""


# ------------------------------------------------------------------------------------------ up / down


@testbed.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-n", "--name", default=tbmod.DEFAULT_NAME, show_default=True, metavar="NAME",
              help="Testbed name: namespaces are NAME-<node>.")
@click.option("--with-daemons", is_flag=True,
              help="Also attach the eBPF dataplane and start one mrcd per host (waits until they serve).")
@click.option("--metrics-base", type=click.IntRange(1, 65535 - 256), default=9470, show_default=True,
              help="With --with-daemons: host i's mrcd serves /metrics on 127.0.0.1:BASE+i.")
@json_option
@click.pass_obj
def up(out: Output, file: Path | None, name: str, with_daemons: bool, metrics_base: int) -> None:
    """Build the testbed described by FILE (default: the default.toml shipped with mrc, which is
    deploy/topologies/default.toml in a checkout; a bare name that is not a file here, e.g. small.toml,
    is the shipped example of that name)."""
    path = topology.default_topology_dir() / "default.toml" if file is None else topology.example_path(file)
    topo = topology.load(path)
    out.progress(f"testbed {name}: {path} ({topo.planes} planes, {topo.leaves} leaves + {topo.spines} spines "
                 f"per plane, {len(topo.hosts)} hosts, {topology.format_rate(topo.link.rate_bps)} links)")
    tb = tbmod.up(topo, name=name, source=str(path), progress=lambda m: out.progress(f"  {m}"))
    doc: dict[str, Any] = {"name": tb.name, "source": tb.source, "namespaces": len(tb.namespaces()),
                           "links": len(topo.links()), "paths": len(topo.paths()),
                           "build_seconds": tb.build_seconds}
    if with_daemons:
        from . import daemons

        out.progress(f"  attaching the eBPF dataplane and starting {len(topo.hosts)} mrcd")
        try:
            rec = daemons.start(tb.name, metrics_base=metrics_base)
        except BaseException:
            tbmod.teardown(tb.name)
            raise
        doc["daemons"] = rec["daemons"]

    def render(d: dict[str, Any]) -> str:
        s = (f"testbed {d['name']} up in {d['build_seconds']:.2f} s: {d['namespaces']} "
             f"namespaces, {d['links']} links, {d['paths']} micro-SID paths")
        for h, r in d.get("daemons", {}).items():
            s += f"\n  mrcd {h}: pid {r['pid']}, {r['socket']}, metrics {r['metrics']}, log {r['log']}"
        return s

    out.emit(doc, render)


@testbed.command()
@name_option
@click.option("--all", "all_", is_flag=True, help="Remove every testbed that is up.")
@json_option
@click.pass_obj
def down(out: Output, name: str | None, all_: bool) -> None:
    """Remove a testbed: its processes, namespaces (links, routes, qdiscs) and state file."""
    targets = tbmod.names() if all_ else [tbmod.resolve_name(name)]
    if name is not None and not all_:
        tbmod.check_name(name)
    reports = []
    for n in targets:
        out.progress(f"removing testbed {n}")
        from . import daemons

        stopped: list[str] = []
        if daemons.record_path(n).exists():
            stopped = daemons.stop(n)["stopped"]
        rep = tbmod.teardown(n)
        # the mrcds are stopped before the namespaces go (by their recorded PIDs); what teardown finds
        # still running in the namespaces comes on top
        rep["mrcds_stopped"] = stopped
        rep["processes_killed"] += len(stopped)
        reports.append(rep)
    doc: dict[str, Any] = {"removed": reports}
    out.emit(doc, lambda d: "\n".join(
        f"testbed {r['name']} down: {r['namespaces_removed']} namespaces removed, "
        f"{r['processes_killed']} processes stopped"
        + (f" (mrcd {', '.join(r['mrcds_stopped'])})" if r["mrcds_stopped"] else "")
        for r in d["removed"]) or "no testbed was up")


@testbed.command()
@name_option
@click.option("--host", default=None, help="Only this host's mrcd.")
@json_option
@click.pass_obj
def start(out: Output, name: str | None, host: str | None) -> None:
    """Start the mrcds of the testbed's hosts that have none running (after one exited or was killed),
    as `up --with-daemons` did; running ones are left alone."""
    from . import daemons

    tb = tbmod.resolve_name(name)
    res = daemons.start_missing(tb, host)

    def render(d: dict[str, Any]) -> str:
        if not d["started"]:
            return f"testbed {d['testbed']}: every mrcd asked for runs already"
        return "\n".join(f"mrcd {h}: pid {r['pid']}, {r['socket']}, metrics {r['metrics']}"
                         for h, r in d["daemons"].items())

    out.emit(res, render)


@testbed.command(name="list")
@json_option
@click.pass_obj
def list_(out: Output) -> None:
    """Testbeds that are up (their state files)."""
    rows = []
    for n in tbmod.names():
        try:
            tb = tbmod.Testbed.load(n)
            rows.append({"name": n, "source": tb.source, "complete": tb.complete,
                         "hosts": len(tb.topo.hosts), "planes": tb.topo.planes})
        except MrcError as e:
            rows.append({"name": n, "source": str(e), "complete": False, "hosts": None, "planes": None})
    out.emit({"testbeds": rows}, lambda d: table(d["testbeds"], [
        ("name", "NAME"), ("source", "SOURCE"), ("hosts", "HOSTS"), ("planes", "PLANES"),
        ("complete", "COMPLETE"),
    ]))


# ------------------------------------------------------------------------------------------ show


def _render_show(d: dict[str, Any]) -> str:
    lines = [f"testbed {d['name']} ({d['source']}): {d['planes']} planes x ({d['leaves']} leaves + "
             f"{d['spines']} spines), mtu {d['mtu']}, buffer {d['buffer']} B, uSID block {d['usid_block']}"]
    if not d["complete"]:
        lines.append("  (incomplete: the build did not finish; 'mrcctl testbed down' removes it)")
    hosts = [n for n in d["nodes"] if n["kind"] == "host"]
    lines.append("")
    lines.append(table([
        {"name": h["name"], "ns": h["namespace"], "mrc": h["mrc_address"], "leaf": h["leaf"],
         "sids": " ".join(f"p{p['plane']}:{p['usid']}" for p in h["ports"]),
         "ports": " ".join(p["address"] for p in h["ports"])}
        for h in hosts
    ], [("name", "HOST"), ("ns", "NAMESPACE"), ("mrc", "MRC ADDRESS"), ("leaf", "LEAF"), ("sids", "uSIDs"),
        ("ports", "PLANE-PORT ADDRESSES")]))
    lines.append("")
    lines.append(table([n for n in d["nodes"] if n["kind"] != "host"], [
        ("name", "SWITCH"), ("kind", "ROLE"), ("plane", "PLANE"), ("usid", "uSID"),
        ("sid", "End (NEXT-C-SID)"),
        ("namespace", "NAMESPACE"),
    ]))
    lines.append("")
    def rate(lk: dict[str, Any]) -> str:
        kernel = {r for r in lk["rate_kernel"] if r is not None}
        if len(kernel) == 1:  # what the TBF qdiscs of both ends really hold
            return topology.format_rate(kernel.pop())
        return f"{topology.format_rate(lk['rate'])} (kernel: {lk['rate_kernel']})"

    def drops(lk: dict[str, Any]) -> str:  # packets a TBF dropped: none is expected (testbed.tbf_limit)
        return "/".join("-" if x is None else str(x) for x in lk.get("tbf_dropped", (None, None)))

    rows = [{**lk, "oper": "/".join(s.lower() for s in lk["oper"]), "rate": rate(lk), "drops": drops(lk),
             "addrs": f"{lk['a_address']} {lk['b_address']}"} for lk in d["links"]]
    lines.append(table(rows, [("a", "A"), ("b", "B"), ("plane", "PLANE"), ("state", "STATE"),
                              ("oper", "OPER A/B"), ("rate", "RATE"), ("drops", "TBF DROPS A/B"),
                              ("addrs", "ADDRESSES (A B)")]))
    daemons = d.get("daemons") or {}
    lines.append("")
    if daemons:
        lines.append(table([{"host": h, **r, "running": "yes" if r["running"] else "NO",
                             "metrics": r.get("metrics") or "-"} for h, r in daemons.items()],
                           [("host", "MRCD"), ("pid", "PID"), ("running", "RUNNING"), ("socket", "SOCKET"),
                            ("metrics", "METRICS"), ("log", "LOG")]))
    else:
        lines.append("no mrcd was started for this testbed ('mrcctl testbed start' starts them)")
    return "\n".join(lines)


@testbed.command()
@name_option
@json_option
@click.pass_obj
def show(out: Output, name: str | None) -> None:
    """Nodes, links with state and rate, addresses and micro-SIDs of a running testbed, and its mrcds
    (pid, whether it runs, control socket, metrics address, log)."""
    from . import daemons

    tb = tbmod.resolve_name(name)
    doc = tbmod.show(tb)
    doc["daemons"] = daemons.status(tb)
    out.emit(doc, _render_show)


@testbed.command()
@click.argument("node")
@name_option
@json_option
@click.pass_obj
def routes(out: Output, node: str, name: str | None) -> None:
    """NODE's IPv6 routes (main table), with seg6 / seg6local encaps and flavors decoded."""
    n = tbmod.resolve_name(name)
    tb = tbmod.Testbed.load(n)
    if node not in {x.name for x in tb.topo.nodes()}:
        raise UsageError(f"testbed {n}: no node {node!r}")
    rows = tbmod.routes(n, node)

    def render(d: dict[str, Any]) -> str:
        def enc(e: dict[str, Any] | None) -> str:
            if e is None:
                return ""
            if e["type"] == "seg6":
                return f"seg6 {e['mode']} segs {','.join(e['segs'])}"
            extra = f" table {e['table']}" if "table" in e else ""
            if "flavors" in e:
                f = e["flavors"]
                extra += f" flavors {','.join(f['operations'])} lblen {f.get('lblen')} nflen {f.get('nflen')}"
            return f"seg6local {e['action']}{extra}"

        return table([{**r, "encap": enc(r["encap"])} for r in d["routes"]],
                     [("dst", "DST"), ("from", "FROM"), ("gateway", "VIA"), ("encap", "ENCAP")])

    out.emit({"node": node, "routes": rows}, render)


# ------------------------------------------------------------------------------------------ ping


@testbed.command()
@click.option("--src", default=None, metavar="HOST", help="Only paths from HOST.")
@click.option("--dst", default=None, metavar="HOST", help="Only paths to HOST.")
@click.option("--timeout", default=1.0, show_default=True, type=click.FloatRange(0.05, 30.0),
              help="Seconds to wait for the replies.")
@name_option
@json_option
@click.pass_context
def ping(ctx: click.Context, src: str | None, dst: str | None, timeout: float, name: str | None) -> None:
    """One ICMPv6 echo along every micro-SID path; exit 1 if a path that should work does not."""
    out: Output = ctx.obj
    n = tbmod.resolve_name(name)
    results = tbmod.probe(n, src=src, dst=dst, timeout_s=timeout)
    paths = [r.to_dict() for r in results]
    ok = sum(r.reachable for r in results)
    failed = [r for r in results if r.expected and not r.reachable]
    doc = {"paths": paths, "reachable": ok, "unreachable": len(results) - ok,
           "failed_expected": len(failed)}

    def render(d: dict[str, Any]) -> str:
        rows = [{**p, "via": "-" if p["spine"] is None else f"s{p['spine']}",
                 "result": ("ok" if p["reachable"] else "UNREACHABLE")
                 + ("" if p["expected"] else " (link down)"),
                 "hops": " ".join(x for x, _ in p["links"]) + f" {p['dst']}"} for p in d["paths"]]
        body = table(rows, [("src", "SRC"), ("dst", "DST"), ("plane", "PLANE"), ("via", "SPINE"),
                            ("container", "CONTAINER"), ("result", "RESULT"), ("rtt_ms", "RTT ms"),
                            ("hops", "HOPS")])
        tail = f"\n{d['reachable']} reachable, {d['unreachable']} unreachable"
        if d["failed_expected"]:
            tail += f", {d['failed_expected']} should have answered"
        return body + tail

    out.emit(doc, render)
    if failed:
        ctx.exit(1)


# ------------------------------------------------------------------------------------------ link


@testbed.group()
def link() -> None:
    """Fail, restore or re-rate the link between two nodes of a running testbed."""


def _report_link(out: Output, tb: tbmod.Testbed, a: str, b: str) -> None:
    lk = tb.link(a, b)
    st = tb.link_state(lk)
    doc = {"a": lk.a, "b": lk.b, "plane": lk.plane, "state": "up" if st.up else "down", "rate": st.rate_bps}
    out.emit(doc, lambda d: f"link {d['a']} - {d['b']} (plane {d['plane']}): {d['state']}, "
                            f"{topology.format_rate(d['rate'])}")


@link.command(name="down")
@click.argument("node_a")
@click.argument("node_b")
@name_option
@json_option
@click.pass_obj
def link_down(out: Output, node_a: str, node_b: str, name: str | None) -> None:
    """Take the link NODE_A - NODE_B down (both directions stop at once)."""
    _report_link(out, fail_link_now(tbmod.resolve_name(name), node_a, node_b), node_a, node_b)


@link.command(name="up")
@click.argument("node_a")
@click.argument("node_b")
@name_option
@json_option
@click.pass_obj
def link_up(out: Output, node_a: str, node_b: str, name: str | None) -> None:
    """Bring the link NODE_A - NODE_B back up (its routes are re-installed)."""
    _report_link(out, tbmod.set_link(tbmod.resolve_name(name), node_a, node_b, up=True), node_a, node_b)


@link.command(name="set")
@click.argument("node_a")
@click.argument("node_b")
@click.option("--rate", default=None, metavar="RATE", help="New rate, tc units (100mbit, 1gbit).")
@click.option("--delay", default=None, metavar="DELAY",
              help="New one-way delay (needs netem or fq, which this kernel lacks: only 0 is accepted).")
@name_option
@json_option
@click.pass_obj
def link_set(
    out: Output, node_a: str, node_b: str, rate: str | None, delay: str | None, name: str | None,
) -> None:
    """Change the rate of the link NODE_A - NODE_B (both directions)."""
    if rate is None and delay is None:
        raise UsageError("nothing to set: give --rate and/or --delay")
    try:
        rate_bps = units.parse_rate(rate) if rate is not None else None
        delay_us = units.parse_delay_us(delay) if delay is not None else None
    except ValueError as e:
        raise UsageError(str(e)) from None
    tb = tbmod.set_link(tbmod.resolve_name(name), node_a, node_b, rate_bps=rate_bps, delay_us=delay_us)
    if rate_bps is not None:
        _follow_rate(tb.name, node_a, node_b, rate_bps)
    _report_link(out, tb, node_a, node_b)


def _follow_rate(name: str, a: str, b: str, rate_bps: int) -> None:
    """With the eBPF dataplane attached, the switch ports' virtual queues take the link's new rate too
    (else ECN and trimming would keep marking at the old rate, and a slowed link would only drop)."""
    try:
        fab = FabricDataplane.open(name)
    except MrcError:
        return  # no programs attached: the TBF alone sets the pace
    with fab:
        if fab.switch is not None:
            fab.set_link_rate(a, b, rate_bps)


# ------------------------------------------------------------------------------------------ exec


@testbed.command(name="exec",
                 context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@name_option
def exec_(node: str, command: tuple[str, ...], name: str | None) -> None:
    """Run COMMAND inside NODE's namespace (mrcctl testbed exec h0 -- ping fd00:0:0:1::1)."""
    n = tbmod.resolve_name(name)
    tb = tbmod.Testbed.load(n)
    if node not in {x.name for x in tb.topo.nodes()}:
        raise UsageError(f"testbed {n}: no node {node!r} (hosts: {', '.join(tb.topo.host_names())})")
    argv = list(command[1:] if command and command[0] == "--" else command)
    if not argv:
        raise UsageError("no command given: mrcctl testbed exec NODE -- CMD ...")
    netns.enter_for_exec(tb.ns(node))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        raise MrcError(f"{argv[0]}: command not found") from None
