"""Reading the host programs' per-CPU counters into plain dicts: one port's row (host_egress's transmit
counter, host_ingress's per-EV-bucket receive counters and drops by reason) and one host's transmit
drops. Shared by the testbed's `FabricDataplane` and a real host's `HostDataplane`, which only differ in
where the port and host ids come from."""

from __future__ import annotations

from typing import Any

from . import abi
from .bpf import Program


def _u32(v: int) -> Any:
    import ctypes

    return ctypes.c_uint32(v)


def port_row(ifname: str, egress: Program | None, egress_port: int | None, ingress: Program | None,
             ingress_port: int | None, ev_buckets: bool = False) -> dict[str, Any]:
    """A plane port's counters: tx (host_egress, by its port id) and rx / ECN-CE / trimmed / drops
    (host_ingress, by its port id); a missing program or id reads as nothing sent or received."""
    row: dict[str, Any] = {"port": ifname}
    if egress is not None:
        c = egress.maps["mrc_egress_tx"].total(_u32(egress_port)) if egress_port else abi.Counter()
        row["tx_packets"], row["tx_bytes"] = c.packets, c.bytes
    if ingress is not None:
        tot = abi.EvCounters()
        buckets = []
        drops: dict[str, int] = {}
        if ingress_port:
            for bkt in range(abi.EV_BUCKETS):
                c2 = ingress.maps["mrc_ingress_ev"].total(_u32(ingress_port * abi.EV_BUCKETS + bkt))
                for f in ("packets", "bytes", "ce", "trimmed"):
                    setattr(tot, f, getattr(tot, f) + getattr(c2, f))
                if ev_buckets and c2.packets:
                    buckets.append({"bucket": bkt, "packets": c2.packets, "bytes": c2.bytes,
                                    "ce": c2.ce, "trimmed": c2.trimmed})
            for r in abi.DropReason:
                d = ingress.maps["mrc_ingress_drops"].total(_u32(ingress_port * abi.DROP_MAX + r))
                if d.packets:
                    drops[r.label] = d.packets
        row.update(rx_packets=tot.packets, rx_bytes=tot.bytes, rx_ce=tot.ce, rx_trimmed=tot.trimmed,
                   rx_drops=drops)
        if ev_buckets:
            row["ev_buckets"] = buckets
    return row


def rx_packets(ingress: Program | None, ingress_port: int | None) -> int | None:
    """Packets host_ingress saw arrive on one port (its EV-bucket counters summed; None without the
    program or the port id): one read of EV_BUCKETS per-CPU entries."""
    if ingress is None or not ingress_port:
        return None
    m = ingress.maps["mrc_ingress_ev"]
    return sum(int(m.total(_u32(ingress_port * abi.EV_BUCKETS + b)).packets) for b in range(abi.EV_BUCKETS))


def tx_drops(egress: Program, host_id: int | None) -> dict[str, int]:
    """host_egress's drops of one host, by reason (only the reasons that happened)."""
    drops: dict[str, int] = {}
    if host_id:
        for r in abi.DropReason:
            d = egress.maps["mrc_egress_drops"].total(_u32(host_id * abi.DROP_MAX + r))
            if d.packets:
                drops[r.label] = d.packets
    return drops


def unknown_port_rx_drops(ingress: Program | None) -> dict[str, int]:
    """host_ingress's drops it could name no port for (port id 0), by reason (only the reasons that
    happened): frames too short for an Ethernet header (`truncated`) and MRC frames sent to a MAC that
    is no port's (`bad_ip`: broadcast, multicast, a stale or foreign unicast). One program serves one
    mrcd, so there they are the host's; a testbed's program serves all of its hosts."""
    drops: dict[str, int] = {}
    if ingress is not None:
        for r in abi.DropReason:
            d = ingress.maps["mrc_ingress_drops"].total(_u32(r))
            if d.packets:
                drops[r.label] = d.packets
    return drops
