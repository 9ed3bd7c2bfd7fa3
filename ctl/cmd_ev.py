"""`mrcctl ev`: entropy values (paths) as each host's mrcd sees them (docs/daemon.md).

    mrcctl ev [show] [--host H] [--peer P] [--state good|assumed_bad|denied]
    mrcctl ev deny --host H --peer P (--ev N ... | --plane P | --link A-B)
    mrcctl ev restore --host H --peer P (--ev N ... | --plane P | --link A-B)

An EV index is a path toward one peer: plane = index mod planes, then the plane's paths by spine. The
state shown is the worst over the host's QPs toward that peer (DENIED by the controller or an operator;
ASSUMED_BAD when any QP's engine retired it).
"""

from __future__ import annotations

from typing import Any

import click

from . import api
from .cmd_testbed import name_option
from .output import Output, json_option, table

STATES = ("good", "assumed_bad", "denied", "unknown")


def _link_arg(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """--link A-B: two node names joined by '-' (a usage error otherwise, e.g. bench's A:B)."""
    if value is not None:
        a, sep, b = value.partition("-")
        if not sep or not a or not b:
            raise click.BadParameter(f"{value!r}: a link is two nodes joined by '-', e.g. p0l0-p0s0")
    return value


@click.group(invoke_without_command=True)
def ev() -> None:
    """EVs per host and peer: state, plane, path; deny and restore."""


def _render(doc: dict[str, Any]) -> str:
    rows = [{"host": h, "peer": p, **r} for h, d in doc["hosts"].items() for p, rs in d["peers"].items()
            for r in rs]
    if not rows:
        return "no EVs match"
    lines = [table(rows, [("host", "HOST"), ("peer", "PEER"), ("ev_index", "EV"), ("plane", "PLANE"),
                          ("spine", "SPINE"), ("via", "VIA"), ("state", "STATE")])]
    for h, d in doc["hosts"].items():
        if d["denied_links"]:
            lines.append(f"{h}: links denied by the controller: {', '.join(d['denied_links'])}")
    return "\n".join(lines)


@ev.command()
@click.option("--host", default=None, help="Only this host's mrcd.")
@click.option("--peer", default=None, help="Only EVs toward this peer.")
@click.option("--state", type=click.Choice(STATES, case_sensitive=False), default=None)
@name_option
@json_option
@click.pass_obj
def show(out: Output, host: str | None, peer: str | None, state: str | None, name: str | None) -> None:
    """EV index -> plane, spine, switches on the path, state."""
    res = api.ask_all(name, host, "ev_show", state=state)
    if peer is not None:
        for d in res.answers.values():
            d["peers"] = {p: r for p, r in d["peers"].items() if p == peer}
    res.emit(out, {"hosts": res.answers}, _render)


def _select(f: Any) -> Any:
    f = click.option("--link", default=None, metavar="A-B", callback=_link_arg,
                     help="Every EV whose path crosses link A-B.")(f)
    f = click.option("--plane", type=int, default=None, help="Every EV of this plane.")(f)
    f = click.option("--ev", "evs", type=int, multiple=True, help="EV index (repeatable).")(f)
    f = click.option("--peer", required=True, help="Toward this peer.")(f)
    f = click.option("--host", required=True, help="On this host's mrcd.")(f)
    return f


@ev.command()
@_select
@name_option
@json_option
@click.pass_obj
def deny(out: Output, host: str, peer: str, evs: tuple[int, ...], plane: int | None, link: str | None,
         name: str | None) -> None:
    """DENY EVs (for every QP toward PEER): they are neither used nor probed until restored."""
    tb, _ = api.hosts(name, host)
    with api.client(tb, host) as c:
        doc = c.call("ev_deny", peer=peer, evs=list(evs), plane=plane, link=link)
    out.emit(doc, lambda d: f"{d['host']} -> {d['peer']}: {d['denied']} EVs denied")


@ev.command()
@_select
@name_option
@json_option
@click.pass_obj
def restore(out: Output, host: str, peer: str, evs: tuple[int, ...], plane: int | None, link: str | None,
            name: str | None) -> None:
    """Allow denied EVs again (they return GOOD)."""
    tb, _ = api.hosts(name, host)
    with api.client(tb, host) as c:
        doc = c.call("ev_restore", peer=peer, evs=list(evs), plane=plane, link=link)
    out.emit(doc, lambda d: f"{d['host']} -> {d['peer']}: {d['restored']} EVs restored")
