"""`mrcctl port`: counters and switch-port settings of the eBPF dataplane (docs/dataplane.md).

    mrcctl port [stats] [NODE] [--name TB] [--ev-buckets]   per plane / reason / action counters
    mrcctl port show [--host H]                             hosts' plane ports as their mrcd has them
    mrcctl port set SWITCH PORT [--ecn-k B] [--trim-t B] [--buffer B] [--rate R]
    mrcctl port set HOST PORT --admin up|down               port admin through the host's mrcd

Ports are named as inside the node's namespace: after the node they face (`mrcctl port set p0l1 h1`).
"""

from __future__ import annotations

from typing import Any

import click

from mrc import topology, units
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.fabric import FabricDataplane
from mrc.errors import MrcError

from .cmd_testbed import name_option
from .output import Output, json_option, table


@click.group(invoke_without_command=True)
def port() -> None:
    """Dataplane port counters (hosts and switch ports) and switch-port queue settings."""


def _render_stats(doc: dict[str, Any]) -> str:
    parts = []
    hrows = []
    for h, hs in doc["hosts"].items():
        for plane, r in hs["planes"].items():
            hrows.append({"host": h, "plane": plane, "port": r["port"], "tx": r.get("tx_packets"),
                          "rx": r.get("rx_packets"), "ce": r.get("rx_ce"), "trimmed": r.get("rx_trimmed"),
                          "rx_drops": " ".join(f"{k}={v}" for k, v in r.get("rx_drops", {}).items()) or "-"})
        if hs.get("tx_drops"):
            hrows.append({"host": h, "plane": "all", "port": "mrc0",
                          "rx_drops": "tx " + " ".join(f"{k}={v}" for k, v in hs["tx_drops"].items())})
    if hrows:
        parts.append(table(hrows, [("host", "HOST"), ("plane", "PLANE"), ("port", "PORT"), ("tx", "TX PKTS"),
                                   ("rx", "RX PKTS"), ("ce", "RX CE"), ("trimmed", "RX TRIMMED"),
                                   ("rx_drops", "DROPS")]))
    prows = []
    for node, ports in doc["ports"].items():
        for ifname, st in ports.items():
            a = st["actions"]
            cfg = st["config"] or {}
            prows.append({"node": node, "port": ifname, "plane": st["plane"],
                          **{k: v["packets"] for k, v in a.items()},
                          "queue": _queue(cfg)})
    if prows:
        parts.append(table(prows, [("node", "NODE"), ("port", "PORT"), ("plane", "PLANE"),
                                   ("forward", "FORWARD"), ("ecn_mark", "ECN"), ("trim", "TRIM"),
                                   ("drop_buffer", "DROP BUF"), ("drop_fault", "DROP FAULT"),
                                   ("drop_blackhole", "BLACKHOLE"), ("queue", "QUEUE")]))
    return "\n\n".join(parts) or "no counters"


def _queue(cfg: dict[str, int]) -> str:
    if not cfg.get("rate_bps"):
        return "off"
    return f"{topology.format_rate(cfg['rate_bps'])} K={cfg['ecn_k']} T={cfg['trim_t']} B={cfg['buffer']}"


@port.command()
@click.argument("node", required=False)
@name_option
@click.option("--ev-buckets", is_flag=True, help="Also host ingress counters per EV bucket.")
@json_option
@click.pass_obj
def stats(out: Output, node: str | None, name: str | None, ev_buckets: bool) -> None:
    """Counters of every host (per plane, drops per reason) and switch port (per action), or of NODE."""
    from . import api

    if name is None and not tbmod.names() and api.local_socket() is not None:
        # a real host: its dataplane's counters are the local mrcd's (it said "no testbed is up")
        raise MrcError("port stats reads a testbed's dataplane; on this host ask its mrcd: 'mrcctl port "
                       "show' (its ports) or 'mrcctl stats' (per-plane counters and drops)")
    with FabricDataplane.open(tbmod.resolve_name(name)) as fd:
        out.emit(fd.stats(node, ev_buckets=ev_buckets), _render_stats)


def _size(value: str | None, what: str) -> int | None:
    if value is None:
        return None
    try:
        return units.parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=what) from None


@port.command()
@click.option("--host", default=None, help="Only this host's mrcd.")
@name_option
@json_option
@click.pass_obj
def show(out: Output, host: str | None, name: str | None) -> None:
    """Hosts' plane ports as their mrcd has them: admin state, failed (access link localised)."""
    from . import api

    res = api.ask_all(name, host, "port_show")
    rows = [r for rs in res.answers.values() for r in rs]
    cols = [("host", "HOST"), ("port", "PORT"), ("ifname", "IFNAME"), ("enabled", "ENABLED"),
            ("failed", "FAILED")]
    res.emit(out, {"ports": rows}, lambda d: table(d["ports"], cols))


@port.command("set")
@click.argument("switch")
@click.argument("port_name", metavar="PORT")
@click.option("--ecn-k", metavar="BYTES", help="Mark ECN-CE above this many queued bytes.")
@click.option("--trim-t", metavar="BYTES", help="Trim MRC data packets above this many queued bytes.")
@click.option("--buffer", metavar="BYTES", help="Drop above this many queued bytes (e.g. 128KiB).")
@click.option("--rate", metavar="RATE",
              help="Virtual queue drain rate (100mbit, ...; 0 turns the queue off).")
@click.option("--admin", type=click.Choice(["up", "down"]), default=None,
              help="A host's plane port: enable/disable it through the host's mrcd (PORT_STATUS to peers).")
@name_option
@json_option
@click.pass_obj
def set_(out: Output, switch: str, port_name: str, ecn_k: str | None, trim_t: str | None, buffer: str | None,
         rate: str | None, admin: str | None, name: str | None) -> None:
    """Set the virtual queue of SWITCH's port PORT (named after the node it faces), or a host port's
    admin state (--admin)."""
    if admin is not None:
        _set_admin(out, switch, port_name, admin == "up", name)
        return
    if all(v is None for v in (ecn_k, trim_t, buffer, rate)):
        raise click.UsageError("nothing to set: give --ecn-k, --trim-t, --buffer and/or --rate")
    rate_bps = None
    if rate is not None:
        try:
            rate_bps = 0 if rate.strip() == "0" else units.parse_rate(rate)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--rate") from None
    sizes = {"ecn_k": _size(ecn_k, "--ecn-k"), "trim_t": _size(trim_t, "--trim-t"),
             "buffer": _size(buffer, "--buffer")}
    with FabricDataplane.open(tbmod.resolve_name(name)) as fd:
        if switch in fd.topo.host_names() and rate_bps:
            raise MrcError(f"{switch} is a host: its ports take faults only, no queue")
        cfg = fd.set_port(switch, port_name, rate_bps=rate_bps, **sizes)
    doc = {"node": switch, "port": port_name, **cfg}
    out.emit(doc, lambda d: f"{d['node']} port {d['port']}: rate {topology.format_rate(d['rate_bps'])} "
             f"ecn-k {d['ecn_k']} trim-t {d['trim_t']} buffer {d['buffer']}" if d["rate_bps"]
             else f"{d['node']} port {d['port']}: queue off")


def _set_admin(out: Output, host: str, port_name: str, enabled: bool, name: str | None) -> None:
    from . import api

    tb, _ = api.hosts(name, host)
    topo = tbmod.Testbed.load(tb).topo
    planes = {topo.link_between(host, topo.leaf_name(p, topo.host_leaf(host))).a_ifname: p
              for p in range(topo.planes)}
    if port_name not in planes and port_name.isascii() and port_name.isdigit() \
            and int(port_name) < topo.planes:
        # the PORT column of `port show` (the plane): the same port as its interface name ('²' is a
        # digit to isdigit, not to int: isascii first)
        port_name = next(n for n, p in planes.items() if p == int(port_name))
    if port_name not in planes:
        raise MrcError(f"{host} has no plane port {port_name!r} (ports: {', '.join(planes)}, or their "
                       f"planes 0..{topo.planes - 1})")
    with api.client(tb, host) as c:
        doc = c.call("port_set", port=planes[port_name], enabled=enabled)
    out.emit({**doc, "ifname": port_name},
             lambda d: f"{d['host']} port {d['ifname']} (plane {d['port']}): "
                       f"{'up' if d['enabled'] else 'down'}")
