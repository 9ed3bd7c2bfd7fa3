"""The eBPF dataplane on a testbed (docs/dataplane.md): one loaded program of each kind serves all nodes.

* ``host_egress`` on ``mrc0`` in every host: a dummy device (ifb where the kernel has no dummy) that
  carries no address. A policy rule (priority 1000: UDP, destination port 4791 -> table 4791) routes the
  MRC prefix to it, so MRC datagrams from the engine's socket reach the program as plain IPv6/UDP, while
  everything else (ping, iperf3, `testbed ping`) keeps the testbed's seg6 routes. The program
  encapsulates by EV and redirects to the plane port; with no program attached mrc0 swallows MRC
  traffic, so nothing leaves unencapsulated.
* ``host_ingress`` (XDP, native) on every host plane port; by default it also strips the outer header
  (measured a few percent cheaper than the kernel's End.DT6: docs/dataplane.md), ``decap="kernel"``
  leaves that to End.DT6.
* ``switch_port`` (TC egress, before TBF) on every fabric port: switches' ports with a virtual queue at
  the link's rate, hosts' plane ports with faults only.

`FabricDataplane.attach(name)` builds it (the loading process owns it: closing detaches everything);
`FabricDataplane.open(name)` finds it from the pinned-state records (mrcctl in another process).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from mrc.errors import MrcError
from mrc.topology import Path as TopoPath
from mrc.topology import Topology
from mrc.wire.ip import mac6

from . import abi, counters, netns
from . import testbed as tbmod
from .bpf import Program, netns_cookie, open_programs, program, records
from .testbed import Testbed

MRC_DEV: Final = "mrc0"
MRC_TABLE: Final = 4791
RULE_PRIORITY: Final = 1000
DEFAULT_EVS: Final = 16
DECAP_MODES: Final = ("kernel", "xdp")


@dataclass(frozen=True)
class Port:
    node: str
    ifname: str
    peer: str
    plane: int
    mac: str
    is_host: bool


def ports(topo: Topology) -> list[Port]:
    out = []
    for lk in topo.links():
        out.append(Port(lk.a, lk.a_ifname, lk.b, lk.plane, lk.a_mac, topo.node(lk.a).is_host))
        out.append(Port(lk.b, lk.b_ifname, lk.a, lk.plane, lk.b_mac, False))
    return out


def default_path(topo: Topology, src: str, dst: str, ev: int) -> TopoPath:
    """The path EV index `ev` takes by default: consecutive EVs alternate planes, then spines."""
    paths = sorted(topo.paths(src, dst), key=lambda p: (p.spine or 0, p.plane))
    return paths[ev % len(paths)]


def switch_defaults(topo: Topology, node: str | None = None, peer: str | None = None) -> dict[str, int]:
    """Virtual queue of a switch port unless the operator sets it: the link's rate (that of the link
    node-peer when given: a `[[link_override]]` may set it) and buffer, ECN above a quarter of the buffer,
    trimming above half."""
    b = topo.link.buffer_bytes
    rate = topo.link.rate_bps if node is None or peer is None else topo.link_rate_bps(node, peer)
    return {"rate_bps": rate, "ecn_k": b // 4, "trim_t": b // 2, "buffer": b}


class FabricDataplane:
    """host_egress / host_ingress / switch_port on one testbed, with typed operations on their maps."""

    def __init__(self, tb: Testbed, egress: Program | None, ingress: Program | None,
                 switch: Program | None) -> None:
        self.tb = tb
        self.topo = tb.topo
        self.egress = egress
        self.ingress = ingress
        self.switch = switch
        self._ifindex: dict[tuple[str, str], int] = {}
        self._cookie: dict[str, int] = {}

    # -- names, ids
    @property
    def name(self) -> str:
        return self.tb.name

    def _key(self, *parts: str) -> str:
        return "/".join((self.name, *parts))

    def cookie(self, node: str) -> int:
        if node not in self._cookie:
            self._cookie[node] = netns_cookie(self.tb.ns(node))
        return self._cookie[node]

    def ifindex(self, node: str, ifname: str) -> int:
        k = (node, ifname)
        if k not in self._ifindex:
            with contextlib.closing(netns.ipr(self.tb.ns(node))) as ipr:
                found = ipr.link_lookup(ifname=ifname)
            if not found:
                raise MrcError(f"testbed {self.name}: no interface {ifname} in {self.tb.ns(node)}")
            self._ifindex[k] = int(found[0])
        return self._ifindex[k]

    def _id(self, prog: Program, space: str, *parts: str) -> int:
        return prog.allocate_id(space, self._key(*parts))

    def _find_id(self, prog: Program, space: str, *parts: str) -> int | None:
        v = prog.record["ids"].get(space, {}).get(self._key(*parts))
        return None if v is None else int(v)

    # -- building
    @classmethod
    def attach(cls, name: str, *, egress: bool = True, ingress: bool = True, switch: bool = True,
               decap: str = "xdp", qp_filter: bool = False, evs: int = DEFAULT_EVS) -> FabricDataplane:
        if decap not in DECAP_MODES:
            raise MrcError(f"decap must be one of {', '.join(DECAP_MODES)}, got {decap!r}")
        tb = Testbed.load(name)
        if any(a.get("testbed") == name for r in records() for a in r.get("attachments", [])):
            raise MrcError(f"testbed {name} already has mrc programs attached (mrcctl prog show; "
                           f"mrcctl prog detach --name {name})")
        fd = cls(tb, program("host_egress") if egress else None, program("host_ingress") if ingress else None,
                 program("switch_port") if switch else None)
        try:
            if fd.switch is not None:
                fd._attach_switch()
            if fd.ingress is not None:
                fd._attach_ingress(decap, qp_filter)
            if fd.egress is not None:
                fd._attach_egress()
                fd.install_paths(evs)
        except BaseException:
            fd.detach()
            raise
        return fd

    @classmethod
    def open(cls, name: str) -> FabricDataplane:
        tb = Testbed.load(name)
        progs: dict[str, Program] = {}
        for p in open_programs(testbed=name):
            if p.kind in progs:
                p.close()
                continue
            progs[p.kind] = p
        if not progs:
            raise MrcError(f"testbed {name}: no eBPF programs attached (mrcctl prog attach --testbed {name})")
        return cls(tb, progs.get("host_egress"), progs.get("host_ingress"), progs.get("switch_port"))

    def _attach_switch(self) -> None:
        assert self.switch is not None
        cfg = self.switch.maps["mrc_sw_ports"]
        vq = self.switch.maps["mrc_sw_vq"]
        for port in ports(self.topo):
            pid = self._id(self.switch, "port", port.node, port.ifname)
            key = abi.mac_key(port.mac)
            sw = abi.SwPort(port_id=pid)
            if not port.is_host:
                for k, v in switch_defaults(self.topo, port.node, port.peer).items():
                    setattr(sw, k, v)
            vq.set(ct_u32(pid), abi.Vq())
            cfg.set(key, sw)
            self.switch.attach(self.tb.ns(port.node), port.ifname, testbed=self.name, node=port.node,
                               plane=port.plane, port_id=pid, peer=port.peer)

    def _attach_ingress(self, decap: str, qp_filter: bool) -> None:
        assert self.ingress is not None
        m = self.ingress.maps["mrc_in_ports"]
        for port in ports(self.topo):
            if not port.is_host:
                continue
            pid = self._id(self.ingress, "port", port.node, port.ifname)
            hid = self._id(self.ingress, "host", port.node)
            flags = (abi.PortFlag.XDP_DECAP if decap == "xdp" else 0) | (
                abi.PortFlag.QP_FILTER if qp_filter else 0)
            m.set(abi.mac_key(port.mac),
                  abi.InPort(port_id=pid, host_id=hid, plane=port.plane, flags=int(flags)))
            self.ingress.attach(self.tb.ns(port.node), port.ifname, testbed=self.name, node=port.node,
                                plane=port.plane, port_id=pid, host_id=hid, mac=port.mac)

    def _attach_egress(self) -> None:
        assert self.egress is not None
        hosts = self.egress.maps["mrc_hosts"]
        rule = {"table": MRC_TABLE, "priority": RULE_PRIORITY, "ip_proto": socket.IPPROTO_UDP,
                "dport_range": "4791:4791"}
        for h in self.topo.host_names():
            ns = self.tb.ns(h)
            hid = self._id(self.egress, "host", h)
            hosts.set(ct_u64(self.cookie(h)), ct_u32(hid))
            with contextlib.closing(netns.ipr(ns)) as ipr:
                add_sink_device(ipr, MRC_DEV, self.topo.link.mtu - 40)
                idx = int(ipr.link_lookup(ifname=MRC_DEV)[0])
                ipr.link("set", index=idx, state="up")
                ipr.rule("add", family=socket.AF_INET6, **rule)
                ipr.route("add", family=socket.AF_INET6, dst=str(self.topo.mrc_prefix), oif=idx,
                          table=MRC_TABLE, prefsrc=str(self.topo.mrc_address(h)))
            for p in range(self.topo.planes):
                leaf = self.topo.leaf_name(p, self.topo.host_leaf(h))
                self._id(self.egress, "port", h, self.topo.link_between(h, leaf).a_ifname)
            self.egress.attach(ns, MRC_DEV, testbed=self.name, node=h, created_dev=True, rule=rule)

    # -- paths (host egress)
    def path_entry(self, path: TopoPath) -> abi.PathEntry:
        assert self.egress is not None
        leaf = self.topo.leaf_name(path.plane, self.topo.host_leaf(path.src))
        lk = self.topo.link_between(path.src, leaf)
        pid = self._find_id(self.egress, "port", path.src, lk.a_ifname) or 0
        e = abi.PathEntry(ifindex=self.ifindex(path.src, lk.a_ifname), port_id=pid, plane=path.plane)
        e.smac[:] = list(mac6(lk.a_mac))
        e.dmac[:] = list(mac6(lk.b_mac))
        e.src[:] = list(lk.a_addr.packed)
        e.container[:] = list(path.container.packed)
        return e

    def path_key(self, src: str, dst: str, ev: int) -> abi.PathKey:
        k = abi.PathKey(netns_cookie=self.cookie(src), ev_index=ev)
        k.dst[:] = list(self.topo.mrc_address(dst).packed)
        return k

    def set_path(self, src: str, dst: str, ev: int, path: TopoPath) -> None:
        if self.egress is None:
            raise MrcError(f"testbed {self.name}: host_egress is not attached")
        if (path.src, path.dst) != (src, dst):
            raise MrcError(f"path {path.src}->{path.dst} does not join {src}->{dst}")
        self.egress.maps["mrc_paths"].set(self.path_key(src, dst, ev), self.path_entry(path))

    def delete_path(self, src: str, dst: str, ev: int) -> bool:
        assert self.egress is not None
        return self.egress.maps["mrc_paths"].delete(self.path_key(src, dst, ev))

    def lookup_path(self, src: str, dst: str, ev: int) -> TopoPath | None:
        assert self.egress is not None
        e = self.egress.maps["mrc_paths"].get(self.path_key(src, dst, ev))
        if e is None:
            return None
        container = ipaddress.IPv6Address(bytes(e.container))
        return next((p for p in self.topo.paths(src, dst) if p.container == container), None)

    def install_paths(self, evs: int = DEFAULT_EVS) -> int:
        """EV indices 0..evs-1 of every host pair, on their default paths."""
        n = 0
        for src in self.topo.host_names():
            for dst in self.topo.host_names():
                if src != dst:
                    for ev in range(evs):
                        self.set_path(src, dst, ev, default_path(self.topo, src, dst, ev))
                        n += 1
        return n

    # -- ingress controls
    def set_decap(self, mode: str) -> None:
        if mode not in DECAP_MODES:
            raise MrcError(f"decap must be one of {', '.join(DECAP_MODES)}, got {mode!r}")
        self._update_in_ports(lambda f: (f | abi.PortFlag.XDP_DECAP) if mode == "xdp"
                              else (f & ~abi.PortFlag.XDP_DECAP))

    def set_qp_filter(self, on: bool) -> None:
        self._update_in_ports(lambda f: (f | abi.PortFlag.QP_FILTER) if on else (f & ~abi.PortFlag.QP_FILTER))

    def _update_in_ports(self, change: Any) -> None:
        if self.ingress is None:
            raise MrcError(f"testbed {self.name}: host_ingress is not attached")
        m = self.ingress.maps["mrc_in_ports"]
        for port in ports(self.topo):
            if port.is_host:
                v = m.get(abi.mac_key(port.mac))
                if v is not None:
                    v.flags = int(change(abi.PortFlag(v.flags)))
                    m.set(abi.mac_key(port.mac), v)

    def allow_qps(self, host: str, qpns: Iterable[int]) -> None:
        if self.ingress is None:
            raise MrcError(f"testbed {self.name}: host_ingress is not attached")
        hid = self._id(self.ingress, "host", host)
        for q in qpns:
            self.ingress.maps["mrc_allowed_qps"].set(abi.QpKey(hid, q), ct_u32(1))

    def disallow_qp(self, host: str, qpn: int) -> None:
        """Remove one QP of `host` from the ingress allowed-QP map (nothing when it is not there)."""
        if self.ingress is None:
            return
        hid = self._find_id(self.ingress, "host", host)
        if hid:
            self.ingress.maps["mrc_allowed_qps"].delete(abi.QpKey(hid, qpn))

    def port_rx_packets(self, host: str, ifname: str) -> int | None:
        """Packets host_ingress saw arrive on `host`'s port `ifname` (None without the program or port)."""
        if self.ingress is None:
            return None
        return counters.rx_packets(self.ingress, self._find_id(self.ingress, "port", host, ifname))

    # -- switch ports
    def _port(self, node: str, ifname: str) -> Port:
        for p in ports(self.topo):
            if (p.node, p.ifname) == (node, ifname):
                return p
        names = sorted(p.ifname for p in ports(self.topo) if p.node == node)
        if not names:
            raise MrcError(f"testbed {self.name}: no node {node!r}")
        raise MrcError(f"testbed {self.name}: {node} has no port {ifname!r} (ports: {', '.join(names)})")

    def _sw_port(self, node: str, ifname: str) -> tuple[Any, abi.SwPort]:
        if self.switch is None:
            raise MrcError(f"testbed {self.name}: switch_port is not attached")
        key = abi.mac_key(self._port(node, ifname).mac)
        cfg = self.switch.maps["mrc_sw_ports"].get(key)
        if cfg is None:
            raise MrcError(f"testbed {self.name}: no switch_port program on {node} port {ifname}")
        return key, cfg

    def set_port(self, node: str, ifname: str, *, ecn_k: int | None = None, trim_t: int | None = None,
                 buffer: int | None = None, rate_bps: int | None = None) -> dict[str, int]:
        key, cfg = self._sw_port(node, ifname)
        for k, v in (("ecn_k", ecn_k), ("trim_t", trim_t), ("buffer", buffer), ("rate_bps", rate_bps)):
            if v is not None:
                if v < 0 or (k != "rate_bps" and v > 0xFFFFFFFF):
                    raise MrcError(f"{k.replace('_', '-')}: {v} is out of range")
                setattr(cfg, k, v)
        if cfg.rate_bps and not cfg.ecn_k <= cfg.trim_t <= cfg.buffer:
            raise MrcError(f"need ecn-k <= trim-t <= buffer, got {cfg.ecn_k}, {cfg.trim_t}, {cfg.buffer}")
        assert self.switch is not None
        self.switch.maps["mrc_sw_ports"].set(key, cfg)
        self.switch.maps["mrc_sw_vq"].set(ct_u32(cfg.port_id), abi.Vq())
        return _sw_cfg_dict(cfg)

    def set_link_rate(self, a: str, b: str, rate_bps: int) -> list[dict[str, int]]:
        """The virtual queues of the switch ends of link a-b drain at `rate_bps` (what `mrcctl testbed
        link set --rate` gives the link's TBF): ECN and trimming then track the slower link, as a
        switch's would, instead of the rate the programs were attached with."""
        return [self.set_port(node, ifname, rate_bps=rate_bps) for node, ifname in self.link_ports(a, b)
                if not self.topo.node(node).is_host]

    def link_ports(self, a: str, b: str) -> list[tuple[str, str]]:
        try:
            lk = self.topo.link_between(a, b)
        except KeyError:
            raise MrcError(f"testbed {self.name}: no link between {a} and {b}") from None
        return [(lk.a, lk.a_ifname), (lk.b, lk.b_ifname)]

    def plane_ports(self, plane: int) -> list[tuple[str, str]]:
        if not 0 <= plane < self.topo.planes:
            raise MrcError(f"testbed {self.name}: no plane {plane} (planes are 0..{self.topo.planes - 1})")
        return [(p.node, p.ifname) for p in ports(self.topo) if p.plane == plane]

    def set_fault(self, a: str | None = None, b: str | None = None, *, plane: int | None = None,
                  drop: float = 0.0, blackhole: bool = False, ev: int | None = None) -> None:
        """A fault on the link a-b, both directions (the egress of both ends), or on every port of
        `plane` (the whole plane fails, or loses a fraction, or loses one EV)."""
        if (plane is None) == (a is None or b is None):
            raise MrcError("a fault is on one link (A B) or on one plane (--plane P)")
        if not blackhole and drop <= 0.0:
            raise MrcError("a fault needs --drop P (0 < P <= 1) or --blackhole")
        try:
            f = abi.Fault(drop_prob=abi.drop_prob_fixed(drop), blackhole=int(blackhole),
                          ev_index=abi.FAULT_ANY_EV if ev is None else ev)
        except ValueError as e:
            raise MrcError(str(e)) from None
        targets = self.plane_ports(plane) if plane is not None else self.link_ports(str(a), str(b))
        for node, ifname in targets:
            _key, cfg = self._sw_port(node, ifname)
            assert self.switch is not None
            self.switch.maps["mrc_sw_faults"].set(ct_u32(cfg.port_id), f)

    def cut_link(self, a: str, b: str) -> bool:
        """Blackhole both ends of link a-b now (two map updates), unless a fault is already there (the
        operator's): True when this call placed it, for the caller to lift once the link is down."""
        if self.switch is None:
            return False
        faults = self.switch.maps["mrc_sw_faults"]
        ids = [self._sw_port(node, ifname)[1].port_id for node, ifname in self.link_ports(a, b)]
        if any(faults.get(ct_u32(pid)) is not None for pid in ids):
            return False
        f = abi.Fault(drop_prob=0, blackhole=1, ev_index=abi.FAULT_ANY_EV)
        for pid in ids:
            faults.set(ct_u32(pid), f)
        return True

    def clear_faults(self, a: str | None = None, b: str | None = None, plane: int | None = None) -> int:
        if self.switch is None:
            raise MrcError(f"testbed {self.name}: switch_port is not attached")
        if plane is not None:
            targets = self.plane_ports(plane)
        elif a is not None and b is not None:
            targets = self.link_ports(a, b)
        else:
            targets = [(p.node, p.ifname) for p in ports(self.topo)]
        n = 0
        for node, ifname in targets:
            pid = self._find_id(self.switch, "port", node, ifname)
            if pid is not None and self.switch.maps["mrc_sw_faults"].delete(ct_u32(pid)):
                n += 1
        return n

    def faults(self) -> list[dict[str, Any]]:
        if self.switch is None:
            return []
        out = []
        for p in ports(self.topo):
            pid = self._find_id(self.switch, "port", p.node, p.ifname)
            f = None if pid is None else self.switch.maps["mrc_sw_faults"].get(ct_u32(pid))
            if f is not None:
                out.append({"node": p.node, "port": p.ifname, "peer": p.peer, "plane": p.plane,
                            "drop": round(f.drop_prob / 0xFFFFFFFF, 6), "blackhole": bool(f.blackhole),
                            "ev": None if f.ev_index == abi.FAULT_ANY_EV else f.ev_index})
        return out

    # -- counters
    def stats(self, node: str | None = None, ev_buckets: bool = False) -> dict[str, Any]:
        """Counters per host (egress per plane port + drops by reason; ingress per plane + drops by
        reason) and per switch port (packets and bytes by action, configuration)."""
        if node is not None and node not in {n.name for n in self.topo.nodes()}:
            raise MrcError(f"testbed {self.name}: no node {node!r}")
        hosts = {}
        switches: dict[str, Any] = {}
        for h in self.topo.host_names():
            if node not in (None, h):
                continue
            hosts[h] = self.host_stats(h, ev_buckets)
        if self.switch is not None:
            for p in ports(self.topo):
                if node not in (None, p.node):
                    continue
                pid = self._find_id(self.switch, "port", p.node, p.ifname)
                if pid is None:
                    continue
                acts = {}
                for a in abi.SwitchAction:
                    c = self.switch.maps["mrc_sw_actions"].total(ct_u32(pid * abi.SW_ACT_MAX + a))
                    acts[a.label] = {"packets": c.packets, "bytes": c.bytes}
                cfg = self.switch.maps["mrc_sw_ports"].get(abi.mac_key(p.mac))
                switches.setdefault(p.node, {})[p.ifname] = {
                    "peer": p.peer, "plane": p.plane, "actions": acts,
                    "config": None if cfg is None else _sw_cfg_dict(cfg)}
        return {"testbed": self.name, "hosts": hosts, "ports": switches}

    def host_stats(self, h: str, ev_buckets: bool = False) -> dict[str, Any]:
        planes: dict[int, dict[str, Any]] = {}
        out: dict[str, Any] = {"planes": planes}
        for p in range(self.topo.planes):
            ifname = self.topo.link_between(h, self.topo.leaf_name(p, self.topo.host_leaf(h))).a_ifname
            epid = self._find_id(self.egress, "port", h, ifname) if self.egress is not None else None
            ipid = self._find_id(self.ingress, "port", h, ifname) if self.ingress is not None else None
            planes[p] = counters.port_row(ifname, self.egress, epid, self.ingress, ipid, ev_buckets)
        if self.egress is not None:
            out["tx_drops"] = counters.tx_drops(self.egress, self._find_id(self.egress, "host", h))
        return out

    def ingress_drops(self, host: str) -> dict[str, int]:
        """Drops by reason summed over the host's plane ports."""
        out: dict[str, int] = {}
        for row in self.host_stats(host, False)["planes"].values():
            for k, v in row.get("rx_drops", {}).items():
                out[k] = out.get(k, 0) + v
        return out

    # -- ending
    def detach(self) -> None:
        """Detach this testbed's attachments and remove its map entries; the programs stay loaded (the
        process reuses them) unless they were opened from pins and have nothing else attached."""
        for prog in (self.egress, self.ingress, self.switch):
            if prog is None:
                continue
            for att in prog.attachments(testbed=self.name):
                with contextlib.suppress(Exception):
                    prog.detach(att)
            with contextlib.suppress(Exception):
                self._forget(prog)

    def _forget(self, prog: Program) -> None:
        cookies = {self._cookie[n] for n in self._cookie}
        if prog.kind == "host_egress":
            m = prog.maps["mrc_paths"]
            for k in list(m.keys()):
                if k.netns_cookie in cookies:
                    m.delete(k)
            for c in cookies:
                prog.maps["mrc_hosts"].delete(ct_u64(c))
        elif prog.kind == "host_ingress":
            for p in ports(self.topo):
                if p.is_host:
                    prog.maps["mrc_in_ports"].delete(abi.mac_key(p.mac))
        else:
            m = prog.maps["mrc_sw_ports"]
            for p in ports(self.topo):
                v = m.get(abi.mac_key(p.mac))
                if v is not None:
                    prog.maps["mrc_sw_faults"].delete(ct_u32(v.port_id))
                    m.delete(abi.mac_key(p.mac))

    def close(self) -> None:
        """Release fds of programs opened from pins (nothing is detached)."""
        for prog in (self.egress, self.ingress, self.switch):
            if prog is not None and not prog.owned:
                prog.close()

    def __enter__(self) -> FabricDataplane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def add_sink_device(ipr: Any, ifname: str, mtu: int) -> None:
    """A device that swallows what its egress program does not redirect: `dummy`, or where this kernel
    lacks it, `ifb` (which drops every packet that mirred did not redirect to it). Both are NOARP, so no
    neighbour discovery delays the first packet."""
    try:
        ipr.link("add", ifname=ifname, kind="dummy", mtu=mtu)
    except Exception as e:
        if getattr(e, "code", None) != errno.EOPNOTSUPP:
            raise
        ipr.link("add", ifname=ifname, kind="ifb", mtu=mtu)


def ct_u32(v: int) -> Any:
    import ctypes

    return ctypes.c_uint32(v)


def ct_u64(v: int) -> Any:
    import ctypes

    return ctypes.c_uint64(v)


def _sw_cfg_dict(cfg: abi.SwPort) -> dict[str, int]:
    return {"rate_bps": int(cfg.rate_bps), "ecn_k": int(cfg.ecn_k), "trim_t": int(cfg.trim_t),
            "buffer": int(cfg.buffer)}


def fail_link_now(name: str, a: str, b: str) -> Testbed:
    """Take link a-b of testbed `name` down as a failure does, at once: with the eBPF programs attached
    both ends drop everything from the first map update on, while the kernel takes the link down
    (setting a veth down waits for RCU grace periods: 10-13 ms here, longer on a busy machine); then
    that blackhole is lifted and the link stays down. Without the programs, the link-down alone."""
    try:
        fab = FabricDataplane.open(name)
    except MrcError:
        return tbmod.set_link(name, a, b, up=False)
    with fab:
        placed = fab.cut_link(a, b)
        try:
            return tbmod.set_link(name, a, b, up=False)
        finally:
            if placed:
                fab.clear_faults(a, b)
