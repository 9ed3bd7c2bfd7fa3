"""`mrcctl fault`: fault injection on testbed links by the switch_port programs (docs/dataplane.md).

    mrcctl fault [show] [--name TB]
    mrcctl fault set A B (--drop P | --blackhole) [--ev N]     both directions of the link A-B
    mrcctl fault set --plane N (--drop P | --blackhole) [--ev N]   every port of plane N
    mrcctl fault clear [A B | --plane N]                       one link, one plane, or every fault

``--ev N`` limits the fault to packets sprayed on EV index N (the outer flow label).
"""

from __future__ import annotations

from typing import Any

import click

from mrc.dataplane import testbed as tbmod
from mrc.dataplane.fabric import FabricDataplane

from .cmd_testbed import name_option
from .output import Output, json_option, table


@click.group(invoke_without_command=True)
def fault() -> None:
    """Faults on testbed links: random drops, blackholes, per-EV drops."""


def _render(doc: dict[str, Any]) -> str:
    if not doc["faults"]:
        return "no faults"
    return table(doc["faults"], [("node", "NODE"), ("port", "PORT"), ("peer", "TOWARDS"), ("plane", "PLANE"),
                                 ("drop", "DROP P"), ("blackhole", "BLACKHOLE"), ("ev", "EV")])


@fault.command()
@name_option
@json_option
@click.pass_obj
def show(out: Output, name: str | None) -> None:
    """Faults in place (one row per link end: each direction of a link)."""
    with FabricDataplane.open(tbmod.resolve_name(name)) as fd:
        out.emit({"testbed": fd.name, "faults": fd.faults()}, _render)


def _scope(a: str | None, b: str | None, plane: int | None) -> None:
    if (a is None) != (b is None):
        raise click.UsageError("name both ends of the link (A B)")
    if a is not None and plane is not None:
        raise click.UsageError("give a link (A B) or --plane N, not both")


@fault.command("set")
@click.argument("a", required=False)
@click.argument("b", required=False)
@click.option("--plane", type=click.IntRange(0, 15), help="Every port of this plane instead of one link.")
@click.option("--drop", type=click.FloatRange(0.0, 1.0, min_open=True), help="Drop probability.")
@click.option("--blackhole", is_flag=True, help="Drop everything.")
@click.option("--ev", type=click.IntRange(0, (1 << 14) - 1), help="Only packets on this EV index.")
@name_option
@json_option
@click.pass_obj
def set_(out: Output, a: str | None, b: str | None, plane: int | None, drop: float | None, blackhole: bool,
         ev: int | None, name: str | None) -> None:
    """Inject a fault on the link between nodes A and B (both directions), or on a whole plane."""
    _scope(a, b, plane)
    if a is None and plane is None:
        raise click.UsageError("name a link (A B) or a plane (--plane N)")
    if (drop is None) == (not blackhole):
        raise click.UsageError("give exactly one of --drop P or --blackhole")
    with FabricDataplane.open(tbmod.resolve_name(name)) as fd:
        fd.set_fault(a, b, plane=plane, drop=drop or 0.0, blackhole=blackhole, ev=ev)
        doc = {"testbed": fd.name, "faults": fd.faults()}
    out.emit(doc, _render)


@fault.command()
@click.argument("a", required=False)
@click.argument("b", required=False)
@click.option("--plane", type=click.IntRange(0, 15), help="Every port of this plane.")
@name_option
@json_option
@click.pass_obj
def clear(out: Output, a: str | None, b: str | None, plane: int | None, name: str | None) -> None:
    """Remove the fault on link A-B, on a plane, or every fault."""
    _scope(a, b, plane)
    with FabricDataplane.open(tbmod.resolve_name(name)) as fd:
        n = fd.clear_faults(a, b, plane)
    out.emit({"cleared": n}, lambda d: f"cleared {d['cleared']} fault(s)")
