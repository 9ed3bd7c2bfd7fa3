"""The eBPF dataplane of one real host, built from its host configuration file (docs/deploy.md): what a
testbed's builder and `mrcctl prog attach` do for a namespace host, done by mrcd itself in the namespace
it runs in (the host's own, or an `ip netns exec` machine of an emulation).

`HostDataplane.install()`:

* finds each plane's NIC port (interface name, PCI address or MAC) and its ifindex and MAC;
* adds what is missing of the host's addresses: the port addresses of the file and the MRC address
  (/128 on ``lo``);
* makes ``mrc0`` (a sink device), a policy rule (UDP port 4791 -> table 4791) and the route of the MRC
  prefix (or one /128 per peer) to it in that table, and attaches host_egress there; attaches
  host_ingress (XDP: native where the driver has it, else generic, as the file says; the mode is logged
  and recorded, `mrcctl prog show` lists it) on every plane port, which strips the outer header;
* resolves each plane's next hop (the gateway, or back to back the peer's port) to its MAC by neighbour
  discovery, and writes every peer's EV table into the path map (the EVs behind a hop that does not
  answer yet get theirs when it does: `poll`, from mrcd's loop).

Everything is recorded before it is made: the programs' attachments in their records (mrc.dataplane.bpf),
the addresses in ``$MRC_RUN_DIR/host/<name>.json``. `close()` removes exactly what this instance made.
A new instance first removes what a dead one left (a crash, a SIGKILL), so a restart never doubles an
attachment; it refuses to start while another live mrcd serves the same host.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from mrc.errors import MrcError
from mrc.hostconfig import HostConfig, HostConfigError, Plane, next_hop
from mrc.topology import Path as TopoPath
from mrc.topology import key_line
from mrc.wire.ip import mac6

from . import abi, bpf, counters, netns
from .bpf import Program, attached_here
from .fabric import add_sink_device

MRC_DEV: Final = "mrc0"
MRC_TABLE: Final = 4791
RULE_PRIORITY: Final = 1000
IFA_F_NODAD: Final = 0x02
#: How long install waits for the next hops to answer neighbour discovery (then mrcd starts anyway and
#: keeps asking: `HostDataplane.poll`).
NEIGH_WAIT_S: Final = 3.0
#: Neighbour states whose link-layer address can be used.
_NUD_USABLE: Final = 0x02 | 0x04 | 0x08 | 0x10 | 0x80  # REACHABLE STALE DELAY PROBE PERMANENT
#: Pacing rate when neither the file nor the interface gives one (veth reports no speed).
FALLBACK_RATE_BPS: Final = 10_000_000_000


def site_name(cfg: HostConfig) -> str:
    """The label of this host's attachments in the program records (`mrcctl prog show`), in the field
    where a testbed's name goes."""
    return f"host:{cfg.name}"


def run_dir() -> Path:
    return Path(os.environ.get("MRC_RUN_DIR", "/run/mrc")) / "host"


@dataclass
class Port:
    """One plane's NIC port as found on this host."""

    plane: int
    ifname: str
    ifindex: int
    mac: str
    address: ipaddress.IPv6Interface
    rate_bps: int
    xdp_mode: str = ""  # native / generic, once attached
    next_hop_mac: dict[str, str] = field(default_factory=dict)  # next hop address -> MAC (resolved ones)
    unresolved: set[str] = field(default_factory=set)  # next hops without a MAC yet


def _links(ipr: Any) -> list[tuple[int, str, str]]:
    return [(int(lk["index"]), str(lk.get_attr("IFLA_IFNAME")),
             str(lk.get_attr("IFLA_ADDRESS") or "").lower()) for lk in ipr.get_links()]


def _pci_ifname(pci: str) -> str | None:
    d = Path("/sys/bus/pci/devices") / pci / "net"
    with contextlib.suppress(OSError):
        names = sorted(p.name for p in d.iterdir())
        if names:
            return names[0]
    return None


def _speed_bps(ifname: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        mbps = int((Path("/sys/class/net") / ifname / "speed").read_text())
        if mbps > 0:
            return mbps * 1_000_000
    return None


def find_ports(cfg: HostConfig, ipr: Any, log: Callable[[str], None]) -> list[Port]:
    """Each plane's port: by interface name, PCI address or MAC (a clear error naming the file's key)."""
    links = _links(ipr)
    out = []
    for pl in cfg.planes:
        found: tuple[int, str, str] | None = None
        if pl.interface is not None:
            found = next((x for x in links if x[1] == pl.interface), None)
        elif pl.pci is not None:
            name = _pci_ifname(pl.pci)
            found = next((x for x in links if x[1] == name), None) if name else None
        else:
            found = next((x for x in links if x[2] == pl.mac), None)
        if found is None:
            have = ", ".join(sorted(x[1] for x in links if x[1] != "lo"))
            problem = f"{pl.selector}: no such network interface here (interfaces: {have or 'none'})"
            if not pl.selector_key:
                raise MrcError(f"{cfg.source}: plane {pl.index}: {problem}")
            raise HostConfigError(cfg.source, pl.selector_key, problem,
                                  key_line(cfg.source_lines, pl.selector_key))
        idx, ifname, mac = found
        rate = pl.rate_bps or _speed_bps(ifname)
        if rate is None:
            log(f"plane {pl.index}: {ifname} reports no speed and the file gives no rate: pacing at "
                f"{FALLBACK_RATE_BPS / 1e9:g} Gbit/s")
            rate = FALLBACK_RATE_BPS
        out.append(Port(pl.index, ifname, idx, mac, pl.address, rate))
    return out


class HostDataplane:
    """host_egress and host_ingress on this host's plane ports, owned by this process."""

    def __init__(self, cfg: HostConfig, *, log: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.site = site_name(cfg)
        self.log = log or (lambda _m: None)
        self.ns = netns.HERE
        self.egress: Program | None = None
        self.ingress: Program | None = None
        self.ports: list[Port] = []
        self.cookie = bpf.netns_cookie(self.ns)
        self.host_id = 0
        self.record_path = run_dir() / f"{cfg.name}.json"
        self.record: dict[str, Any] = {"pid": os.getpid(), "netns_inode": list(netns.own_inode()),
                                       "config": cfg.source, "addresses": []}
        self._egress_port: dict[int, int] = {}  # plane -> host_egress port id
        self._ingress_port: dict[int, int] = {}
        self._pending: dict[tuple[str, int], TopoPath] = {}  # path-map entries waiting for a next hop
        self._recorded = False  # whether the record file is this instance's (not a live one's it refused)
        self._poked: dict[tuple[int, str], float] = {}

    # -- record
    def _save(self) -> None:
        self._recorded = True
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=1) + "\n")
        tmp.replace(self.record_path)

    def _clear_leftovers(self) -> None:
        """Remove what a dead instance for this host left; refuse while a live one serves it."""
        me = os.getpid()
        pid = serving_pid(self.cfg)
        if pid is not None:
            raise MrcError(f"another mrcd (pid {pid}) serves host {self.cfg.name}: stop it first")
        gone = bpf.detach_everything(testbed=self.site)
        if gone["records_removed"]:
            self.log(f"removed what a previous mrcd left: {gone['attachments_removed']} attachments, "
                     f"{gone['pins_removed']} pins")
        try:
            old = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return
        if int(old.get("pid", 0)) == me:
            return
        if tuple(old.get("netns_inode", ())) == netns.own_inode():
            with contextlib.closing(netns.ipr(self.ns)) as ipr:
                for a in old.get("addresses", []):
                    _del_addr(ipr, a)
        with contextlib.suppress(FileNotFoundError):
            self.record_path.unlink()

    # -- install
    def install(self) -> None:
        if os.geteuid() != 0:
            raise MrcError("mrcd --config: needs root (CAP_NET_ADMIN, CAP_BPF)")
        self._clear_leftovers()
        self._save()
        try:
            with contextlib.closing(netns.ipr(self.ns)) as ipr:
                self.ports = find_ports(self.cfg, ipr, self.log)
                lo = int(ipr.link_lookup(ifname="lo")[0])
                self._ensure_addr(ipr, lo, "lo", ipaddress.IPv6Interface(f"{self.cfg.mrc_address}/128"))
                for port in self.ports:
                    self._ensure_addr(ipr, port.ifindex, port.ifname, port.address)
                    ipr.link("set", index=port.ifindex, state="up")
            self.ingress = bpf.program("host_ingress")
            self.egress = bpf.program("host_egress")
            self._attach_ingress()
            self._attach_egress()
            self._resolve_next_hops()
        except BaseException:
            self.close()
            raise

    def _ensure_addr(self, ipr: Any, idx: int, ifname: str, addr: ipaddress.IPv6Interface) -> None:
        have = {(str(a.get_attr("IFA_ADDRESS")), int(a["prefixlen"]))
                for a in ipr.get_addr(family=socket.AF_INET6, index=idx)}
        if (str(addr.ip), addr.network.prefixlen) in have:
            return
        item = {"ifname": ifname, "address": str(addr.ip), "prefixlen": addr.network.prefixlen}
        self.record["addresses"].append(item)
        self._save()
        ipr.addr("add", index=idx, address=str(addr.ip), prefixlen=addr.network.prefixlen, flags=IFA_F_NODAD)
        self.log(f"added {addr} on {ifname}")

    def _attach_ingress(self) -> None:
        assert self.ingress is not None
        m = self.ingress.maps["mrc_in_ports"]
        self.host_id = self.ingress.allocate_id("host", f"{self.site}/{self.cfg.name}")
        for port, pl in zip(self.ports, self.cfg.planes, strict=True):
            pid = self.ingress.allocate_id("port", f"{self.site}/{port.ifname}")
            self._ingress_port[port.plane] = pid
            m.set(abi.mac_key(port.mac), abi.InPort(port_id=pid, host_id=self.host_id, plane=port.plane,
                                                    flags=int(abi.PortFlag.XDP_DECAP)))
            port.xdp_mode = self._attach_xdp(port, pl)
            self.log(f"plane {port.plane}: host_ingress on {port.ifname} (XDP {port.xdp_mode})")

    def _attach_xdp(self, port: Port, pl: Plane) -> str:
        assert self.ingress is not None
        modes = ["native", "generic"] if pl.xdp == "auto" else [pl.xdp]
        err: Exception | None = None
        for mode in modes:
            try:
                self.ingress.attach(self.ns, port.ifname, testbed=self.site, node=self.cfg.name,
                                    plane=port.plane, port_id=self._ingress_port[port.plane],
                                    host_id=self.host_id, mac=port.mac, xdp_mode=mode)
                return mode
            except MrcError:
                raise
            except Exception as e:  # the driver has no native XDP: EOPNOTSUPP / EINVAL
                err = e
        raise MrcError(f"plane {port.plane}: cannot attach XDP ({' or '.join(modes)}) on {port.ifname}: "
                       f"{err}")

    def _attach_egress(self) -> None:
        assert self.egress is not None
        hid = self.egress.allocate_id("host", f"{self.site}/{self.cfg.name}")
        self.egress.maps["mrc_hosts"].set(_u64(self.cookie), _u32(hid))
        for port in self.ports:
            self._egress_port[port.plane] = self.egress.allocate_id("port", f"{self.site}/{port.ifname}")
        rule = {"table": MRC_TABLE, "priority": RULE_PRIORITY, "ip_proto": socket.IPPROTO_UDP,
                "dport_range": "4791:4791"}
        mtu = min(_mtu(p.ifname) for p in self.ports) - 40  # room for the outer IPv6 header
        with contextlib.closing(netns.ipr(self.ns)) as ipr:
            if ipr.link_lookup(ifname=MRC_DEV):
                raise MrcError(f"{MRC_DEV} exists on this host and no record says mrc made it: remove it "
                               f"(ip link del {MRC_DEV}) or find who uses it")
            add_sink_device(ipr, MRC_DEV, mtu)
            idx = int(ipr.link_lookup(ifname=MRC_DEV)[0])
            ipr.link("set", index=idx, state="up")
            ipr.rule("add", family=socket.AF_INET6, **rule)
            dsts = ([self.cfg.mrc_prefix] if self.cfg.mrc_prefix is not None else
                    [ipaddress.IPv6Network(f"{p.mrc_address}/128") for p in self.cfg.peers])
            for dst in dsts:
                ipr.route("add", family=socket.AF_INET6, dst=str(dst), oif=idx, table=MRC_TABLE,
                          prefsrc=str(self.cfg.mrc_address))
        self.egress.attach(self.ns, MRC_DEV, testbed=self.site, node=self.cfg.name, created_dev=True,
                           rule=rule)
        self.log(f"host_egress on {MRC_DEV}; MRC traffic to {', '.join(map(str, dsts))} goes through it")

    def _resolve_next_hops(self) -> None:
        """Each plane's next hops' MACs, by neighbour discovery (a datagram to the discard port starts it),
        waiting up to NEIGH_WAIT_S. A hop that does not answer (its machine still booting, a cable out)
        does not stop mrcd: its EVs have no path-map entry yet (host_egress drops their packets as
        no_path, the engine retires the EVs), and `poll` keeps asking; the entries are written when it
        answers."""
        for port in self.ports:
            port.unresolved = {str(next_hop(self.cfg, peer, port.plane)) for peer in self.cfg.peer_names()}
        deadline = time.monotonic() + NEIGH_WAIT_S
        with contextlib.closing(netns.ipr(self.ns)) as ipr:
            while any(p.unresolved for p in self.ports):
                self._ask(ipr)
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        for port in self.ports:
            for hop in sorted(port.unresolved):
                self.log(f"plane {port.plane}: next hop {hop} on {port.ifname} does not answer neighbour "
                         "discovery (yet): its EVs wait until it does (cabled? its address right?)")

    def _ask(self, ipr: Any) -> list[tuple[Port, str]]:
        """One round of neighbour lookups for the unresolved hops (poking those still missing, at most
        every 0.5 s); returns the hops resolved now."""
        now = time.monotonic()
        found = []
        for port in self.ports:
            if not port.unresolved:
                continue
            macs = _neighbours(ipr, port)
            for hop in sorted(port.unresolved):
                # the kernel's entries carry no scope: a link-local gateway written fe80::1%eth1 (as
                # docs/deploy.md allows) is found under fe80::1 (it never resolved before)
                mac = macs.get(str(ipaddress.IPv6Address(hop.partition("%")[0])))
                if mac is not None:
                    port.next_hop_mac[hop] = mac
                    port.unresolved.discard(hop)
                    found.append((port, hop))
                elif now - self._poked.get((port.plane, hop), 0.0) > 0.5:
                    self._poked[(port.plane, hop)] = now
                    _poke(port, hop)
        return found

    def poll(self) -> None:
        """Called by mrcd's loop about once a second: resolve what is still unresolved; write the path-map
        entries that waited for it."""
        if not any(p.unresolved for p in self.ports):
            return
        with contextlib.closing(netns.ipr(self.ns)) as ipr:
            found = self._ask(ipr)
        for port, hop in found:
            self.log(f"plane {port.plane}: next hop {hop} on {port.ifname} answered: its EVs get their paths")
            for (peer, ev), path in list(self._pending.items()):
                if path.plane == port.plane and str(next_hop(self.cfg, peer, path.plane)) == hop:
                    del self._pending[(peer, ev)]
                    self.set_path(peer, ev, path)

    # -- the PathWriter of HostEngine
    def _key(self, peer: str, ev: int) -> abi.PathKey:
        k = abi.PathKey(netns_cookie=self.cookie, ev_index=ev)
        k.dst[:] = list(self.cfg.peer(peer).mrc_address.packed)
        return k

    def set_path(self, peer: str, ev: int, path: TopoPath) -> None:
        assert self.egress is not None
        port = self.ports[path.plane]
        hop = str(next_hop(self.cfg, peer, path.plane))
        if hop not in port.next_hop_mac:  # written when the hop answers (`poll`)
            self._pending[(peer, ev)] = path
            return
        self._pending.pop((peer, ev), None)
        e = abi.PathEntry(ifindex=port.ifindex, port_id=self._egress_port[path.plane], plane=path.plane)
        e.smac[:] = list(mac6(port.mac))
        e.dmac[:] = list(mac6(port.next_hop_mac[hop]))
        e.src[:] = list(port.address.ip.packed)
        e.container[:] = list(path.container.packed)
        self.egress.maps["mrc_paths"].set(self._key(peer, ev), e)

    def delete_path(self, peer: str, ev: int) -> None:
        self._pending.pop((peer, ev), None)
        if self.egress is not None and not self.egress.closed:
            self.egress.maps["mrc_paths"].delete(self._key(peer, ev))

    def allow_qp(self, qpn: int) -> None:
        assert self.ingress is not None
        self.ingress.maps["mrc_allowed_qps"].set(abi.QpKey(self.host_id, qpn), _u32(1))

    def disallow_qp(self, qpn: int) -> None:
        if self.ingress is not None and not self.ingress.closed:
            self.ingress.maps["mrc_allowed_qps"].delete(abi.QpKey(self.host_id, qpn))

    # -- counters
    def port_mtus(self) -> dict[str, int]:
        """Each plane port's MTU (interface name -> bytes), read now: what the QPs' payload must fit."""
        return {p.ifname: _mtu(p.ifname) for p in self.ports}

    def host_stats(self, ev_buckets: bool = False) -> dict[str, Any]:
        planes = {p.plane: counters.port_row(p.ifname, self.egress, self._egress_port.get(p.plane),
                                             self.ingress, self._ingress_port.get(p.plane), ev_buckets)
                  for p in self.ports}
        out: dict[str, Any] = {"planes": planes}
        if self.egress is not None:
            out["tx_drops"] = counters.tx_drops(self.egress, self._find_host(self.egress))
        if self.ingress is not None:  # this mrcd's own program: what it could name no port for is ours
            out["rx_drops_unknown_port"] = counters.unknown_port_rx_drops(self.ingress)
        return out

    def _find_host(self, prog: Program) -> int | None:
        v = prog.record["ids"].get("host", {}).get(f"{self.site}/{self.cfg.name}")
        return None if v is None else int(v)

    def port_rx_packets(self, plane: int) -> int | None:
        return counters.rx_packets(self.ingress, self._ingress_port.get(plane))

    def attached(self) -> dict[str, bool]:
        """host_egress / host_ingress -> still attached here (its record lists this host)."""
        return {kind: prog is not None and attached_here(prog, self.site, self.cfg.name)
                for kind, prog in (("host_egress", self.egress), ("host_ingress", self.ingress))}

    # -- ending
    def close(self) -> None:
        """Remove exactly what this instance made: attachments, mrc0 and its rule and routes, pins and
        records (the programs' `close`), then the addresses it added."""
        for prog in (self.egress, self.ingress):
            if prog is not None:
                with contextlib.suppress(Exception):
                    prog.close()
        if self._recorded and self.record.get("pid") == os.getpid():
            with contextlib.suppress(Exception), contextlib.closing(netns.ipr(self.ns)) as ipr:
                for a in reversed(self.record["addresses"]):
                    _del_addr(ipr, a)
            with contextlib.suppress(FileNotFoundError):
                self.record_path.unlink()


def _u32(v: int) -> Any:
    return ctypes.c_uint32(v)


def _u64(v: int) -> Any:
    return ctypes.c_uint64(v)


def _mtu(ifname: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int((Path("/sys/class/net") / ifname / "mtu").read_text())
    return 1500


def _del_addr(ipr: Any, a: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        found = ipr.link_lookup(ifname=a["ifname"])
        if found:
            ipr.addr("del", index=int(found[0]), address=a["address"], prefixlen=int(a["prefixlen"]))


def serving_pid(cfg: HostConfig) -> int | None:
    """The PID of a live mrcd (not this process) that serves `cfg`'s host, by its records, else None."""
    me = os.getpid()
    site = site_name(cfg)
    pids = [int(rec.get("pid", 0)) for rec in bpf.records()
            if any(a.get("testbed") == site for a in rec.get("attachments", []))]
    with contextlib.suppress(OSError, ValueError):
        pids.append(int(json.loads((run_dir() / f"{cfg.name}.json").read_text()).get("pid", 0)))
    return next((p for p in pids if p != me and _mrcd_alive(p)), None)


def _mrcd_alive(pid: int) -> bool:
    """Whether `pid` is a running mrcd (not merely a live process: a dead mrcd's PID may have been reused)."""
    if pid <= 0 or not bpf.pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # alive but unreadable: assume the worst
    return b"mrcd" in cmdline or b"mrc.ctl.daemon" in cmdline


def _neighbours(ipr: Any, port: Port) -> dict[str, str]:
    """Usable neighbour entries of `port`: address -> MAC."""
    out = {}
    for n in ipr.get_neighbours(family=socket.AF_INET6, ifindex=port.ifindex):
        dst, mac = n.get_attr("NDA_DST"), n.get_attr("NDA_LLADDR")
        if dst and mac and n["state"] & _NUD_USABLE:
            out[str(ipaddress.IPv6Address(dst))] = str(mac)
    return out


def _poke(port: Port, hop: str) -> None:
    """Make the kernel ask for `hop`'s MAC: a datagram to its discard port, out of `port` where allowed
    (a link-local hop needs only its scope; a global one is on-link by the port's prefix route)."""
    addr = ipaddress.IPv6Address(hop)
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sk:
        with contextlib.suppress(OSError):
            sk.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, port.ifname.encode())
        with contextlib.suppress(OSError):
            sk.sendto(b"", (str(addr), 9, 0, port.ifindex if addr.is_link_local else 0))


__all__ = ["MRC_DEV", "HostDataplane", "Port", "find_ports", "serving_pid", "site_name"]
