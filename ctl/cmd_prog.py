"""`mrcctl prog`: the eBPF programs of the dataplane (docs/design.md §5, docs/dataplane.md).

    mrcctl prog [show]                              what is loaded, attached where, in which namespace
    mrcctl prog attach [--name TB] [--decap M]      load the three programs onto testbed TB and leave them
    mrcctl prog detach [--all | --name TB]          detach, unpin, forget (also what a crash left behind)

``show`` reads the pinned-state records (/run/mrc/dataplane) and asks the kernel what is really attached
at each hook. Programs attached by ``attach`` stay after the command ends; ``port`` and ``fault`` use
their pinned maps.
"""

from __future__ import annotations

import time
from typing import Any

import click

from mrc.dataplane import bpf
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.fabric import DECAP_MODES, FabricDataplane

from .cmd_testbed import name_option
from .output import Output, json_option, table


@click.group(invoke_without_command=True)
def prog() -> None:
    """eBPF programs: show, attach to a testbed, detach."""


def _doc() -> dict[str, Any]:
    progs = []
    for rec in bpf.records():
        atts = []
        for a in rec.get("attachments", []):
            k = bpf.kernel_view(a)
            atts.append({"testbed": a.get("testbed"), "node": a.get("node"), "netns": a["netns"],
                         "ifname": a["ifname"], "hook": a["hook"], "xdp_mode": a.get("xdp_mode"),
                         "attached": k["present"],
                         "kernel_prog_id": k["prog_id"], "kernel_prog_name": k["prog_name"]})
        progs.append({"name": rec["name"], "kind": rec["kind"], "prog_id": rec.get("prog_id"),
                      "pid": rec.get("pid"),
                      "loader_alive": bpf.pid_alive(int(rec.get("pid", 0))) if rec.get("pid") else False,
                      "persistent": bool(rec.get("persistent")), "pin_dir": rec.get("pin_dir"),
                      "maps": sorted(rec.get("maps", {})), "attachments": atts})
    return {"programs": progs}


def _render(doc: dict[str, Any]) -> str:
    if not doc["programs"]:
        return "no mrc eBPF programs loaded"
    lines = []
    for p in doc["programs"]:
        state = "persistent" if p["persistent"] else ("loader alive" if p["loader_alive"] else
                                                      "loader gone: mrcctl prog detach --all")
        lines.append(f"{p['name']}  id {p['prog_id']}  pid {p['pid']}  ({state})  pins {p['pin_dir']}")
        rows = [{**a, "attached": "yes" if a["attached"] else "MISSING",
                 "netns": a["netns"] or f"(host {a['node']})",
                 "hook": f"{a['hook']} ({a['xdp_mode']})" if a.get("xdp_mode") else a["hook"],
                 "seen": a["kernel_prog_id"] or a["kernel_prog_name"]} for a in p["attachments"]]
        if rows:
            cols = [("netns", "  NETNS"), ("ifname", "IFNAME"), ("hook", "HOOK"), ("attached", "ATTACHED"),
                    ("seen", "KERNEL HAS")]
            lines.append(table(rows, cols).replace("\n", "\n  "))
    return "\n".join(lines)


@prog.command()
@json_option
@click.pass_obj
def show(out: Output) -> None:
    """Loaded programs, their pins and where each is attached (as the kernel has it now)."""
    out.emit(_doc(), _render)


@prog.command()
@name_option
@click.option("--decap", type=click.Choice(DECAP_MODES), default="xdp", show_default=True,
              help="Who strips the outer IPv6 at the host: the kernel's End.DT6 or host_ingress (XDP).")
@click.option("--evs", type=click.IntRange(1, 1 << 14), default=16, show_default=True,
              help="EV indices 0..N-1 get a path (default map: planes alternate, then spines).")
@click.option("--qp-filter/--no-qp-filter", default=False, help="Drop packets for QPNs not allowed.")
@click.option("--egress/--no-egress", default=True, help="host_egress on every host's mrc0.")
@click.option("--ingress/--no-ingress", default=True, help="host_ingress (XDP) on every host plane port.")
@click.option("--switch/--no-switch", default=True, help="switch_port on every fabric port.")
@json_option
@click.pass_obj
def attach(out: Output, name: str | None, decap: str, evs: int, qp_filter: bool, egress: bool, ingress: bool,
           switch: bool) -> None:
    """Load the programs (one BCC compile each) and attach them to testbed NAME; they stay attached."""
    tb = tbmod.resolve_name(name)
    t0 = time.monotonic()
    out.progress(f"testbed {tb}: compiling and attaching host_egress, host_ingress, switch_port")
    fd = FabricDataplane.attach(tb, egress=egress, ingress=ingress, switch=switch, decap=decap,
                                qp_filter=qp_filter, evs=evs)
    progs = [p for p in (fd.egress, fd.ingress, fd.switch) if p is not None]
    for p in progs:
        p.persist()
    doc = {"testbed": tb, "seconds": round(time.monotonic() - t0, 2), "decap": decap,
           "programs": [{"name": p.name, "kind": p.kind, "attachments": len(p.attachments(testbed=tb))}
                        for p in progs]}
    out.emit(doc, lambda d: "\n".join(
        [f"testbed {d['testbed']}: attached in {d['seconds']} s (decap: {d['decap']})"]
        + [f"  {p['kind']:<13} {p['attachments']:>3} hooks  {p['name']}" for p in d["programs"]]))


@prog.command()
@click.option("--all", "all_", is_flag=True, help="Every mrc program, also those a crashed process left.")
@name_option
@json_option
@click.pass_obj
def detach(out: Output, all_: bool, name: str | None) -> None:
    """Detach programs, delete what was made for them (mrc0, rules), unpin maps, remove records: of the
    testbed named (or the only one up), or with --all of every testbed and real host."""
    if all_ and name is not None:
        raise click.UsageError("give --all or --name TESTBED, not both")
    doc = bpf.detach_everything(None if all_ else tbmod.resolve_name(name))
    out.emit(doc, lambda d: f"removed {d['attachments_removed']} attachments, "
             f"{d['pins_removed']} pinned maps, {d['records_removed']} records")
