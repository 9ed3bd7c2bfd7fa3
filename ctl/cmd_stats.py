"""`mrcctl stats`: per-host counters from each mrcd (engine, driver, controller, eBPF dataplane).

    mrcctl stats [show] [--host H]

The same numbers Prometheus scrapes from /metrics (docs/daemon.md), as one document.
"""

from __future__ import annotations

from typing import Any

import click

from . import api
from .cli import PrefixChoice
from .cmd_testbed import name_option
from .output import Output, json_option, table


def _render(doc: dict[str, Any]) -> str:
    rows = []
    lines = []
    for h, s in doc["hosts"].items():
        for plane, r in s["dataplane"]["planes"].items():
            rows.append({"host": h, "plane": plane, **{k: r.get(k) for k in (
                "tx_packets", "tx_bytes", "rx_packets", "rx_bytes", "rx_ce", "rx_trimmed")},
                "drops": " ".join(f"{k}={v}" for k, v in r.get("rx_drops", {}).items()) or "-"})
        ctl = " ".join(f"{k}={v}" for k, v in sorted(s["controller"].items())) or "-"
        drops = " ".join(f"{k}={v}" for k, v in sorted(s["engine_drops"].items())) or "-"
        control = s.get("control")  # absent from an mrcd before protocol 1.2
        cs = "" if control is None else (
            f"; control: {control['clients']} clients, rejected "
            f"{' '.join(f'{k}={v}' for k, v in sorted(control['rejected'].items())) or '-'}, "
            f"paused {control['paused']}")
        lines.append(f"{h}: {s['qps']} QPs; engine drops {drops}; controller {ctl}; denied links "
                     f"{', '.join(s['denied_links']) or '-'}{cs}")
    return table(rows, [("host", "HOST"), ("plane", "PLANE"), ("tx_packets", "TX PKTS"),
                        ("tx_bytes", "TX BYTES"),
                        ("rx_packets", "RX PKTS"), ("rx_bytes", "RX BYTES"), ("rx_ce", "RX CE"),
                        ("rx_trimmed", "RX TRIMMED"), ("drops", "XDP DROPS")]) + "\n\n" + "\n".join(lines)


@click.command()
@click.argument("verb", required=False, type=PrefixChoice(["show"]))
@click.option("--host", default=None, help="Only this host's mrcd.")
@name_option
@json_option
@click.pass_obj
def stats(out: Output, verb: str | None, host: str | None, name: str | None) -> None:
    """Counters of every host's mrcd: packets per plane, drops, retransmits, controller actions."""
    res = api.ask_all(name, host, "stats")
    res.emit(out, {"hosts": res.answers}, _render)
